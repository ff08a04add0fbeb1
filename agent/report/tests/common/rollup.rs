//! What the roll-up tiers share: findings at fixed times, a reporter for a
//! node, and readers of Report results.

use kyverno_runtime_api::openreports::{Report, ReportResult};
use kyverno_runtime_report::{
    property, Behavior, Decision, Finding, PodIdentity, Reporter, ReporterOptions,
};
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A fixed time `secs` after a fixed epoch.
pub fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

pub fn rfc3339(secs: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs as i64)
        .unwrap()
        .to_string()
}

/// A monitor-mode exec finding of `policy` (name, uid) on `pod`.
pub fn finding(
    policy: (&str, &str),
    pod: &PodIdentity,
    target: &str,
    count: u64,
    first: u64,
    last: u64,
) -> Finding {
    Finding {
        policy: policy.0.into(),
        policy_uid: policy.1.into(),
        behavior: Behavior::Exec,
        pod: pod.clone(),
        target: target.into(),
        enforced: false,
        decision: Some(Decision::Denied),
        count,
        first_observed: at(first),
        last_observed: at(last),
        process: None,
        matched: Vec::new(),
    }
}

/// The reporter of the daemon on `node`, cleaning up without delay.
pub fn reporter(client: kube::Client, node: &str, options: ReporterOptions) -> Reporter {
    Reporter::new(
        client,
        ReporterOptions {
            node: node.into(),
            cleanup_spread: Duration::ZERO,
            ..options
        },
    )
}

pub fn prop<'a>(r: &'a ReportResult, key: &str) -> &'a str {
    r.properties
        .as_ref()
        .unwrap()
        .get(key)
        .map_or("<absent>", String::as_str)
}

pub fn results(report: &Report) -> &[ReportResult] {
    report.spec.results.as_deref().unwrap_or_default()
}

pub fn result_of<'a>(report: &'a Report, policy: &str, target: &str) -> &'a ReportResult {
    results(report)
        .iter()
        .find(|r| r.policy == policy && prop(r, property::TARGET) == target)
        .unwrap_or_else(|| {
            panic!(
                "{}: no result of {policy} for {target}",
                report.metadata.name.as_deref().unwrap_or("?")
            )
        })
}

pub fn named<'a>(reports: &'a [Report], name: &str) -> &'a Report {
    reports
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Report {name} among {:?}", names(reports)))
}

pub fn names(reports: &[Report]) -> BTreeSet<String> {
    reports
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}

pub fn policies_of(report: &Report) -> BTreeSet<String> {
    results(report).iter().map(|r| r.policy.clone()).collect()
}
