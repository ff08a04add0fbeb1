//! Merging one pod's buffered findings into its stored Report.
//!
//! Pure: given what the API server holds (or nothing) and the findings of
//! this flush, [`desired_report`] says what the Report should be. The
//! writer then skips the write when that equals what is stored, so a flush
//! with nothing new is no write at all.

use crate::finding::{Finding, Fingerprint};
use crate::name::report_name;
use crate::result::{
    floor_second, last_seen, object_reference, report_result, stored_stats, SOURCE,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kyverno_runtime_api::openreports::{
    Limits, Report, ReportConfiguration, ReportFields, ReportResult, ReportSummary,
};
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

/// The label every Report this crate writes carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "kyverno-runtime";
/// How many results have been dropped from a Report to keep it within
/// `max_results`, over its lifetime (absent while none has been).
pub const TRUNCATED_ANNOTATION: &str = "runtime.nirmata.io/truncated-results";

/// The pod a Report is about: the part of a finding's identity that
/// addresses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub(crate) fn of(finding: &Finding) -> PodKey {
        PodKey {
            namespace: finding.pod.namespace.clone(),
            name: finding.pod.name.clone(),
            uid: finding.pod.uid.clone(),
        }
    }
}

/// What a merge produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Merged {
    /// The Report to write (or to leave alone, if it equals what is stored).
    pub report: Report,
    /// Results this merge dropped to stay within `max_results`.
    pub dropped: u64,
}

/// One result in the merged list, with what it is ordered by.
struct Row {
    last: SystemTime,
    fingerprint: Option<Fingerprint>,
    result: ReportResult,
}

/// The Report for `pod` after merging `findings` (already redacted, keyed by
/// fingerprint) into `stored`.
///
/// - A result is matched by the `fingerprint` property: counts add,
///   `firstTimestamp` is the earlier and `lastTimestamp` the later; the
///   rest of the result (message, enforced, decision) comes from the new
///   finding, the newest word on it.
/// - Stored results this flush has nothing for are kept verbatim, and so
///   are results without a fingerprint (not written by us): nothing is
///   lost because it was not understood.
/// - Results are ordered most recent first; beyond `max_results` the
///   oldest go, and [`TRUNCATED_ANNOTATION`] adds up how many.
/// - The summary is recomputed from the results.
/// - A stored Report whose scope is another uid was about an earlier pod
///   of the same name (a StatefulSet's pod recreated): its results are not
///   about this pod, so they are replaced rather than merged, and its
///   owner reference moves to this pod.
/// - Metadata this crate does not own (other labels, annotations, owner
///   references to anything but a Pod) is kept.
pub(crate) fn desired_report(
    stored: Option<&Report>,
    pod: &PodKey,
    findings: &BTreeMap<Fingerprint, Finding>,
    max_results: usize,
) -> Merged {
    let stale = stored
        .and_then(|r| r.spec.scope.as_ref())
        .and_then(|s| s.uid.as_deref())
        .is_some_and(|uid| uid != pod.uid);
    let stored_results: &[ReportResult] = match stored {
        Some(r) if !stale => r.spec.results.as_deref().unwrap_or_default(),
        _ => &[],
    };

    let mut rows: Vec<Row> = Vec::with_capacity(stored_results.len() + findings.len());
    let mut index: HashMap<Fingerprint, usize> = HashMap::new();
    for result in stored_results {
        let fingerprint = stored_stats(result).map(|s| s.fingerprint);
        if let Some(fp) = fingerprint {
            // A duplicate (which we never write) stays a row of its own.
            index.entry(fp).or_insert(rows.len());
        }
        rows.push(Row {
            last: last_seen(result),
            fingerprint,
            result: result.clone(),
        });
    }
    for (fp, finding) in findings {
        let mut merged = finding.clone();
        let slot = index.get(fp).copied();
        if let Some(i) = slot {
            if let Some(s) = rows.get(i).and_then(|row| stored_stats(&row.result)) {
                merged.count = merged.count.saturating_add(s.count);
                if let Some(first) = s.first {
                    merged.first_observed = merged.first_observed.min(first);
                }
                if let Some(last) = s.last {
                    merged.last_observed = merged.last_observed.max(last);
                }
            }
        }
        let row = Row {
            last: floor_second(merged.last_observed),
            fingerprint: Some(*fp),
            result: report_result(&merged),
        };
        match slot.and_then(|i| rows.get_mut(i)) {
            Some(existing) => *existing = row,
            None => rows.push(row),
        }
    }

    // Most recent first; a stable sort keeps the stored order of ties, and
    // the fingerprint orders new ties, so the same inputs give the same
    // bytes and an unchanged merge compares equal.
    rows.sort_by(|a, b| {
        b.last
            .cmp(&a.last)
            .then_with(|| a.fingerprint.is_none().cmp(&b.fingerprint.is_none()))
            .then_with(|| a.fingerprint.cmp(&b.fingerprint))
    });
    let max_results = max_results.max(1);
    let dropped = rows.len().saturating_sub(max_results);
    rows.truncate(max_results);
    let results: Vec<ReportResult> = rows.into_iter().map(|r| r.result).collect();

    let mut summary = ReportSummary::default();
    for result in results.iter().filter_map(|r| r.result) {
        summary.count(result);
    }

    let name = report_name(&pod.name);
    let mut report = match stored {
        Some(r) => r.clone(),
        None => Report::new(&name, ReportFields::default()),
    };
    let meta = &mut report.metadata;
    meta.name = Some(name);
    meta.namespace = Some(pod.namespace.clone());
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());

    let prior_dropped: u64 = if stale {
        0
    } else {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(TRUNCATED_ANNOTATION))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let total_dropped = prior_dropped.saturating_add(dropped as u64);
    if total_dropped > 0 {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(TRUNCATED_ANNOTATION.into(), total_dropped.to_string());
    } else if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(TRUNCATED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }

    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    refs.retain(|r| !(r.api_version == "v1" && r.kind == "Pod"));
    refs.push(owner_reference(pod));

    report.spec = ReportFields {
        source: Some(SOURCE.into()),
        scope: Some(object_reference(&pod.namespace, &pod.name, &pod.uid)),
        configuration: Some(ReportConfiguration {
            limits: Limits {
                max_results: Some(i64::try_from(max_results).unwrap_or(i64::MAX)),
                status_filter: None,
            },
        }),
        summary: Some(summary),
        results: Some(results),
        ..report.spec
    };
    Merged {
        report,
        dropped: dropped as u64,
    }
}

/// The Report's owner reference to its pod, so the garbage collector
/// deletes the Report with the pod.
///
/// `controller: false`: the pod does not manage the Report (no controller
/// reconciles it from the pod), and a controller reference is exclusive,
/// so claiming it would be both untrue and in the way of a real one.
/// `blockOwnerDeletion: false`: deleting a pod must never wait on its
/// findings, and setting it to true needs permission to update the pod's
/// finalizers, which the daemon is not granted.
fn owner_reference(pod: &PodKey) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::finding::{Behavior, PodIdentity};
    use crate::result::property;
    use kyverno_runtime_api::openreports::PolicyResult;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn pod() -> PodKey {
        PodKey {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
        }
    }

    fn finding(target: &str, count: u64, first: u64, last: u64) -> Finding {
        let p = pod();
        Finding {
            policy: "no-curl".into(),
            policy_uid: "11111111-2222-3333-4444-555555555555".into(),
            behavior: Behavior::Exec,
            pod: PodIdentity {
                namespace: p.namespace,
                name: p.name,
                uid: p.uid,
                container: None,
                owner_kind: None,
                owner_name: None,
            },
            target: target.into(),
            enforced: true,
            decision: None,
            count,
            first_observed: at(first),
            last_observed: at(last),
            process: None,
        }
    }

    fn batch(findings: &[Finding]) -> BTreeMap<Fingerprint, Finding> {
        findings
            .iter()
            .map(|f| (f.fingerprint(), f.clone()))
            .collect()
    }

    fn prop<'a>(r: &'a ReportResult, key: &str) -> &'a str {
        r.properties.as_ref().unwrap()[key].as_str()
    }

    fn results(r: &Report) -> &[ReportResult] {
        r.spec.results.as_deref().unwrap()
    }

    #[test]
    fn a_fresh_report_for_a_pod() {
        let m = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 2, 10, 20)]), 500);
        let r = &m.report;
        assert_eq!(m.dropped, 0);
        assert_eq!(r.metadata.name.as_deref(), Some("kyverno-runtime-web-0"));
        assert_eq!(r.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            r.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGED_BY
        );
        assert!(r.metadata.annotations.is_none());
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "web-0", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        );
        assert_eq!(owner.controller, Some(false));
        assert_eq!(owner.block_owner_deletion, Some(false));
        let scope = r.spec.scope.as_ref().unwrap();
        assert_eq!(scope.kind.as_deref(), Some("Pod"));
        assert_eq!(scope.uid.as_deref(), Some(pod().uid.as_str()));
        assert_eq!(r.spec.source.as_deref(), Some("kyverno-runtime"));
        assert_eq!(r.spec.summary.unwrap().fail, 1);
        assert_eq!(prop(&results(r)[0], property::COUNT), "2");
    }

    #[test]
    fn merging_sums_counts_and_widens_the_window() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 2, 10, 20)]), 500);
        let m = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 3, 5, 15)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "5");
        assert_eq!(
            prop(&rs[0], property::FIRST_TIMESTAMP),
            "1970-01-01T00:00:05Z"
        );
        assert_eq!(
            prop(&rs[0], property::LAST_TIMESTAMP),
            "1970-01-01T00:00:20Z"
        );
        assert_eq!(rs[0].timestamp.unwrap().seconds, 20);

        let later = desired_report(
            Some(&m.report),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 30, 40)]),
            500,
        );
        let rs = results(&later.report);
        assert_eq!(prop(&rs[0], property::COUNT), "6");
        assert_eq!(
            prop(&rs[0], property::FIRST_TIMESTAMP),
            "1970-01-01T00:00:05Z"
        );
        assert_eq!(
            prop(&rs[0], property::LAST_TIMESTAMP),
            "1970-01-01T00:00:40Z"
        );
    }

    #[test]
    fn new_details_replace_old_ones() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 10, 10)]), 500);
        let mut monitor = finding("/bin/sh", 1, 20, 20);
        monitor.enforced = false;
        let m = desired_report(Some(&first.report), &pod(), &batch(&[monitor]), 500);
        let r = &results(&m.report)[0];
        assert_eq!(prop(r, property::ENFORCED), "false");
        assert!(r
            .message
            .as_deref()
            .unwrap()
            .contains("would have been denied"));
    }

    #[test]
    fn unrelated_and_foreign_results_are_kept() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 10, 10)]), 500);
        let mut stored = first.report.clone();
        let foreign = ReportResult {
            policy: "someone-else".into(),
            result: Some(PolicyResult::Pass),
            ..ReportResult::default()
        };
        stored.spec.results.as_mut().unwrap().push(foreign.clone());
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/bash", 1, 30, 30)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 3);
        assert_eq!(
            prop(&rs[0], property::TARGET),
            "/bin/bash",
            "most recent first"
        );
        assert_eq!(prop(&rs[1], property::TARGET), "/bin/sh");
        assert_eq!(rs[2], foreign);
        let s = m.report.spec.summary.unwrap();
        assert_eq!((s.fail, s.pass), (2, 1));
    }

    #[test]
    fn results_are_capped_keeping_the_most_recent() {
        let many: Vec<Finding> = (0..5)
            .map(|i| finding(&format!("/bin/t{i}"), 1, 100 + i, 100 + i))
            .collect();
        let m = desired_report(None, &pod(), &batch(&many), 3);
        assert_eq!(m.dropped, 2);
        let rs = results(&m.report);
        let targets: Vec<&str> = rs.iter().map(|r| prop(r, property::TARGET)).collect();
        assert_eq!(targets, ["/bin/t4", "/bin/t3", "/bin/t2"]);
        assert_eq!(
            m.report.metadata.annotations.as_ref().unwrap()[TRUNCATED_ANNOTATION],
            "2"
        );
        assert_eq!(m.report.spec.summary.unwrap().fail, 3);
        assert_eq!(
            m.report
                .spec
                .configuration
                .as_ref()
                .unwrap()
                .limits
                .max_results,
            Some(3)
        );

        // One newer and one older than everything kept: the older one is
        // the one dropped, and the annotation adds up.
        let more = [
            finding("/bin/new", 1, 200, 200),
            finding("/bin/old", 1, 1, 1),
        ];
        let m = desired_report(Some(&m.report), &pod(), &batch(&more), 3);
        let targets: Vec<&str> = results(&m.report)
            .iter()
            .map(|r| prop(r, property::TARGET))
            .collect();
        assert_eq!(targets, ["/bin/new", "/bin/t4", "/bin/t3"]);
        assert_eq!(m.dropped, 2);
        assert_eq!(
            m.report.metadata.annotations.as_ref().unwrap()[TRUNCATED_ANNOTATION],
            "4"
        );
    }

    #[test]
    fn nothing_new_merges_to_what_is_stored() {
        let first = desired_report(
            None,
            &pod(),
            &batch(&[finding("/bin/sh", 2, 10, 20), finding("/bin/ls", 1, 5, 5)]),
            500,
        );
        let again = desired_report(Some(&first.report), &pod(), &BTreeMap::new(), 500);
        assert_eq!(again.report, first.report);
        // A zero-count observation of a known finding changes nothing either.
        let zero = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 0, 10, 20)]),
            500,
        );
        assert_eq!(zero.report, first.report);
        // One more occurrence does.
        let one = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 10, 20)]),
            500,
        );
        assert_ne!(one.report, first.report);
    }

    #[test]
    fn foreign_metadata_is_kept() {
        let mut stored =
            desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 1, 1)]), 500).report;
        stored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "shop".into());
        stored.metadata.annotations = Some(BTreeMap::from([("note".into(), "x".into())]));
        stored.metadata.resource_version = Some("42".into());
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 2, 2)]),
            500,
        );
        let meta = &m.report.metadata;
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "shop");
        assert_eq!(meta.annotations.as_ref().unwrap()["note"], "x");
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert_eq!(meta.owner_references.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_report_about_an_earlier_pod_of_the_same_name_is_replaced() {
        let mut stored =
            desired_report(None, &pod(), &batch(&[finding("/bin/sh", 9, 1, 1)]), 1).report;
        let mut old = pod();
        old.uid = "00000000-0000-0000-0000-000000000000".into();
        stored.spec.scope = Some(object_reference(&old.namespace, &old.name, &old.uid));
        stored.metadata.owner_references = Some(vec![owner_reference(&old)]);
        stored.metadata.annotations =
            Some(BTreeMap::from([(TRUNCATED_ANNOTATION.into(), "7".into())]));
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 2, 2)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "1");
        let refs = m.report.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, pod().uid);
        assert!(m.report.metadata.annotations.is_none());
    }
}
