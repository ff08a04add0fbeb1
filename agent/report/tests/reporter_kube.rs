//! Tier 3: the reporter against a real kube-apiserver and etcd.
//!
//! Counts add up across flushes; a flush with nothing new writes nothing;
//! a writer that changes the Report between our read and our write makes us
//! retry from a fresh read, and both contributions survive; a failed write
//! keeps its findings for the next flush, a refused one drops and counts
//! them; the final flush on shutdown writes what was submitted just before.
//! 600 findings for one pod leave the newest 500 results and an annotation
//! counting the rest; an 80-character pod name still gets a valid Report;
//! a password and a bearer token in a target never reach the stored
//! Report.
//!
//! The Report CRD is generated from the Rust types (not read from the
//! chart). There is no kube-controller-manager here, so nothing
//! garbage-collects a Report when its pod goes: each test deletes its own
//! Report and recreates its pod (a new uid) before it starts.
//!
//! The concurrent writer is made deterministic with a tower layer on the
//! reporter's client: it holds back the next Report write until another
//! reporter's flush has completed, so the held-back write carries a stale
//! resourceVersion (or loses the create) for certain, not by timing.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kyverno_runtime_api::openreports::{Report, ReportResult};
use kyverno_runtime_report::{
    property, Behavior, Decision, Finding, PodIdentity, Reporter, ReporterOptions, WriteResult,
    MANAGED_BY, MANAGED_BY_LABEL, TRUNCATED_ANNOTATION,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NS: &str = "kyverno-runtime-report-test";

/// A fresh Pod object (new uid) with no Report yet, in [`NS`].
async fn fresh_pod(client: &kube::Client, name: &str) -> PodIdentity {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    ignore_conflict(namespaces.create(&PostParams::default(), &ns).await);
    // The pod's service account: there is no controller-manager here to
    // create a namespace's `default` one, and admission requires it.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).unwrap();
    ignore_conflict(accounts.create(&PostParams::default(), &account).await);
    let reports: Api<Report> = Api::namespaced(client.clone(), NS);
    ignore_not_found(
        reports
            .delete(
                &kyverno_runtime_report::report_name(name),
                &DeleteParams::default(),
            )
            .await,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // Never scheduled, so deleted at once (no kubelet to wait for).
    ignore_not_found(
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await,
    );
    for _ in 0..100 {
        if pods.get_opt(name).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "web", "secret-label": "do-not-emit"}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    PodIdentity {
        namespace: NS.into(),
        name: name.into(),
        uid: pod.metadata.uid.unwrap(),
        container: Some("app".into()),
        owner_kind: None,
        owner_name: None,
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn rfc3339(secs: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs as i64)
        .unwrap()
        .to_string()
}

fn finding(pod: &PodIdentity, target: &str, count: u64, first: u64, last: u64) -> Finding {
    Finding {
        policy: "no-shell".into(),
        policy_uid: "11111111-2222-3333-4444-555555555555".into(),
        behavior: Behavior::Exec,
        pod: pod.clone(),
        target: target.into(),
        enforced: true,
        decision: Some(Decision::Denied),
        count,
        first_observed: at(first),
        last_observed: at(last),
        process: None,
        matched: Vec::new(),
    }
}

async fn stored(client: &kube::Client, pod: &PodIdentity) -> Report {
    let reports: Api<Report> = Api::namespaced(client.clone(), NS);
    reports
        .get(&kyverno_runtime_report::report_name(&pod.name))
        .await
        .unwrap()
}

fn by_target<'a>(report: &'a Report, target: &str) -> &'a ReportResult {
    report
        .spec
        .results
        .as_ref()
        .unwrap()
        .iter()
        .find(|r| r.properties.as_ref().unwrap()[property::TARGET] == target)
        .unwrap_or_else(|| panic!("no result for {target}"))
}

fn prop<'a>(r: &'a ReportResult, key: &str) -> &'a str {
    r.properties.as_ref().unwrap()[key].as_str()
}

fn only_outcome(flushed: &kyverno_runtime_report::Flushed) -> &WriteResult {
    assert_eq!(flushed.outcomes.len(), 1, "{flushed:?}");
    flushed.outcomes[0].result.as_ref().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn counts_add_up_across_flushes_and_nothing_new_writes_nothing() {
    let client = client().await;
    let pod = fresh_pod(&client, "count-web").await;
    let writes = Writes::default();
    let reporter = Reporter::new(client.clone(), writes.options());
    let handle = reporter.handle();

    handle.submit(finding(&pod, "/bin/sh", 2, 10, 20));
    handle.submit(finding(&pod, "/bin/sh", 1, 15, 25)); // deduplicated
    let mut open = finding(&pod, "/etc/shadow", 1, 12, 12);
    open.behavior = Behavior::Open;
    open.enforced = false;
    open.decision = None;
    handle.submit(open);
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);
    assert_eq!(writes.take(), [WriteResult::Created]);

    let report = stored(&client, &pod).await;
    let meta = &report.metadata;
    assert_eq!(meta.labels.as_ref().unwrap()[MANAGED_BY_LABEL], MANAGED_BY);
    assert!(
        !meta.labels.as_ref().unwrap().contains_key("secret-label"),
        "pod labels are never emitted"
    );
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", pod.uid.as_str())
    );
    let scope = report.spec.scope.as_ref().unwrap();
    assert_eq!(scope.name.as_deref(), Some("count-web"));
    assert_eq!(scope.uid.as_deref(), Some(pod.uid.as_str()));
    assert_eq!(report.spec.summary.unwrap().fail, 2);
    let sh = by_target(&report, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), "3");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(10));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(25));
    assert_eq!(prop(sh, property::ENFORCED), "true");
    assert_eq!(prop(sh, property::CONTAINER), "app");
    assert_eq!(sh.rule.as_deref(), Some("exec"));
    let shadow = by_target(&report, "/etc/shadow");
    assert_eq!(prop(shadow, property::ENFORCED), "false");
    assert_eq!(prop(shadow, property::COUNT), "1");

    // More of the same fingerprint: the count adds up across flushes and
    // the window widens on both ends.
    handle.submit(finding(&pod, "/bin/sh", 4, 5, 40));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Updated);
    assert_eq!(writes.take(), [WriteResult::Updated]);
    let report = stored(&client, &pod).await;
    let sh = by_target(&report, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), "7");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(5));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(40));
    assert_eq!(
        prop(by_target(&report, "/etc/shadow"), property::COUNT),
        "1"
    );
    let version = report.metadata.resource_version.clone();

    // Nothing new: no write at all.
    let flushed = reporter.flush().await;
    assert!(flushed.outcomes.is_empty(), "{flushed:?}");
    assert!(writes.take().is_empty());

    // A finding that changes nothing (no new occurrence): read, compared,
    // not written.
    handle.submit(finding(&pod, "/bin/sh", 0, 5, 40));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Unchanged);
    assert_eq!(writes.take(), [WriteResult::Unchanged]);
    let report = stored(&client, &pod).await;
    assert_eq!(report.metadata.resource_version, version);
    assert_eq!(handle.dropped(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_concurrent_writer_is_retried_and_both_contributions_survive() {
    let plain = client().await;
    let pod = fresh_pod(&plain, "conflict-web").await;
    let interfere = Interfere::default();
    let writes = Writes::default();
    let ours = Reporter::new(client_with(&interfere).await, writes.options());
    // The other writer: another daemon on the same node during a rollout.
    let theirs = Arc::new(Reporter::new(plain.clone(), ReporterOptions::default()));

    let race = |theirs: &Arc<Reporter>| {
        let theirs = Arc::clone(theirs);
        Action::Before(Box::pin(async move {
            let flushed = theirs.flush().await;
            assert_eq!(flushed.outcomes.len(), 1);
            flushed.outcomes[0].result.as_ref().unwrap();
        }))
    };

    // Round 1: both create. Theirs lands first; ours loses the create,
    // re-reads and merges.
    ours.handle().submit(finding(&pod, "/bin/sh", 2, 10, 20));
    theirs.handle().submit(finding(&pod, "/bin/sh", 3, 5, 15));
    theirs
        .handle()
        .submit(finding(&pod, "/bin/bash", 1, 30, 30));
    interfere.arm(race(&theirs));
    let flushed = ours.flush().await;
    assert!(!interfere.is_armed(), "the write went through the layer");
    assert_eq!(only_outcome(&flushed), &WriteResult::Updated);
    assert_eq!(writes.take(), [WriteResult::Conflict, WriteResult::Updated]);
    let report = stored(&plain, &pod).await;
    let sh = by_target(&report, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), "5");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(5));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(20));
    assert_eq!(prop(by_target(&report, "/bin/bash"), property::COUNT), "1");

    // Round 2: both replace. Ours read the Report before theirs wrote, so
    // its replace carries a stale resourceVersion.
    ours.handle().submit(finding(&pod, "/bin/sh", 10, 50, 60));
    theirs
        .handle()
        .submit(finding(&pod, "/bin/sh", 100, 40, 70));
    theirs
        .handle()
        .submit(finding(&pod, "/bin/bash", 2, 31, 31));
    interfere.arm(race(&theirs));
    let flushed = ours.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Updated);
    assert_eq!(writes.take(), [WriteResult::Conflict, WriteResult::Updated]);
    let report = stored(&plain, &pod).await;
    let sh = by_target(&report, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), "115");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(5));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(70));
    assert_eq!(prop(by_target(&report, "/bin/bash"), property::COUNT), "3");
    assert_eq!(report.spec.results.as_ref().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_write_keeps_its_findings_for_the_next_flush() {
    let plain = client().await;
    let pod = fresh_pod(&plain, "retry-web").await;
    let interfere = Interfere::default();
    let writes = Writes::default();
    // How each failed write failed, as the daemon's API health hears it.
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    let options = ReporterOptions {
        on_write_error: Some(Arc::new(move |e: &kube::Error| {
            sink.lock().unwrap().push(e.to_string())
        })),
        ..writes.options()
    };
    let reporter = Reporter::new(client_with(&interfere).await, options);
    let handle = reporter.handle();

    handle.submit(finding(&pod, "/bin/sh", 2, 10, 20));
    interfere.arm(Action::Fail);
    let flushed = reporter.flush().await;
    let error = flushed.outcomes[0].result.as_ref().unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert_eq!(writes.take(), [WriteResult::Error]);
    let told = std::mem::take(&mut *errors.lock().unwrap());
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("injected connection failure"), "{told:?}");
    assert_eq!(handle.buffered(), 1, "kept for the next flush");
    assert_eq!(handle.dropped(), 0);

    // Findings that arrive meanwhile fold into the kept ones.
    handle.submit(finding(&pod, "/bin/sh", 3, 30, 30));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);
    let report = stored(&plain, &pod).await;
    let sh = by_target(&report, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), "5");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(10));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(30));
    assert_eq!(handle.buffered(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_write_drops_and_counts_its_findings() {
    let client = client().await;
    let drops = Arc::new(Mutex::new(Vec::new()));
    let seen = drops.clone();
    let reporter = Reporter::new(
        client,
        ReporterOptions {
            on_drop: Some(Arc::new(move |reason, n| {
                seen.lock().unwrap().push((reason, n))
            })),
            ..ReporterOptions::default()
        },
    );
    let handle = reporter.handle();
    // A namespace that does not exist: the create is refused (404), and
    // retrying cannot change that.
    let ghost = PodIdentity {
        namespace: "kyverno-runtime-report-no-such-namespace".into(),
        name: "ghost".into(),
        uid: "00000000-0000-0000-0000-000000000001".into(),
        container: None,
        owner_kind: None,
        owner_name: None,
    };
    handle.submit(finding(&ghost, "/bin/sh", 1, 1, 1));
    handle.submit(finding(&ghost, "/bin/ls", 1, 1, 1));
    let flushed = reporter.flush().await;
    let error = flushed.outcomes[0].result.as_ref().unwrap_err();
    assert!(!error.is_retryable(), "{error}");
    assert_eq!(handle.dropped(), 2);
    assert_eq!(handle.buffered(), 0);
    assert_eq!(
        *drops.lock().unwrap(),
        [(kyverno_runtime_report::DropReason::WriteFailed, 2)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_pod_name_gets_a_shortened_report_name() {
    let client = client().await;
    let name = "a-pod-with-a-name-long-enough-to-push-the-report-name-past-63-characters";
    let pod = fresh_pod(&client, name).await;
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    reporter.handle().submit(finding(&pod, "/bin/sh", 1, 1, 1));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);
    let report_name = &flushed.outcomes[0].report;
    assert!(report_name.len() <= 63, "{report_name}");
    assert_eq!(report_name, &kyverno_runtime_report::report_name(name));
    assert!(report_name.starts_with("kyverno-runtime-a-pod-with-a-name-long"));
    let report = stored(&client, &pod).await;
    assert_eq!(report.metadata.name.as_ref(), Some(report_name));
    assert_eq!(report.spec.scope.unwrap().name.as_deref(), Some(name));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_final_flush_on_shutdown_writes_the_last_window() {
    let client = client().await;
    let pod = fresh_pod(&client, "shutdown-web").await;
    let writes = Writes::default();
    let reporter = Reporter::new(
        client.clone(),
        ReporterOptions {
            // No periodic flush within the test: only the final one writes.
            interval: Duration::from_secs(3600),
            shutdown_deadline: Duration::from_secs(20),
            ..writes.options()
        },
    );
    let handle = reporter.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(reporter.run(async {
        let _ = stopped.await;
    }));

    handle.submit(finding(&pod, "/bin/sh", 6, 10, 20));
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("run returns within its deadline")
        .unwrap();

    assert_eq!(writes.take(), [WriteResult::Created]);
    let report = stored(&client, &pod).await;
    assert_eq!(prop(by_target(&report, "/bin/sh"), property::COUNT), "6");
    assert_eq!(handle.dropped(), 0);
    // After shutdown, nothing is buffered that nobody will write: a late
    // submission is counted as dropped.
    handle.submit(finding(&pod, "/bin/sh", 1, 30, 30));
    assert_eq!(handle.dropped(), 1);
    assert_eq!(handle.buffered(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn six_hundred_findings_keep_the_newest_five_hundred_and_say_so() {
    let client = client().await;
    let pod = fresh_pod(&client, "cap-web").await;
    let writes = Writes::default();
    let reporter = Reporter::new(client.clone(), writes.options());
    let handle = reporter.handle();
    for i in 0..600u64 {
        handle.submit(finding(&pod, &format!("/bin/tool-{i}"), 1, i, i));
    }
    assert_eq!(handle.buffered(), 600);
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);
    assert_eq!(flushed.outcomes[0].findings, 600);

    let report = stored(&client, &pod).await;
    let results = report.spec.results.as_ref().unwrap();
    assert_eq!(results.len(), 500);
    assert_eq!(
        report.metadata.annotations.as_ref().unwrap()[TRUNCATED_ANNOTATION],
        "100"
    );
    // The oldest went: the kept ones are exactly the 500 most recent.
    let mut targets: Vec<&str> = results.iter().map(|r| prop(r, property::TARGET)).collect();
    targets.sort_unstable();
    let mut want: Vec<String> = (100..600).map(|i| format!("/bin/tool-{i}")).collect();
    want.sort_unstable();
    assert_eq!(targets, want);
    assert_eq!(report.spec.summary.unwrap().fail, 500);
    assert_eq!(handle.dropped(), 0, "truncation is annotated, not a drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_eighty_character_pod_name_gets_a_valid_report_name() {
    let client = client().await;
    let name = format!("web-{}", "x".repeat(74) + "-0");
    assert_eq!(name.len(), 80);
    let pod = fresh_pod(&client, &name).await;
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    reporter.handle().submit(finding(&pod, "/bin/sh", 1, 1, 1));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);
    let report_name = &flushed.outcomes[0].report;
    assert!(report_name.len() <= 63, "{report_name}");
    let b = report_name.as_bytes();
    assert!(
        b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric(),
        "a DNS-1123 label: {report_name}"
    );
    let report = stored(&client, &pod).await;
    assert_eq!(report.metadata.name.as_ref(), Some(report_name));
    assert_eq!(
        report.spec.scope.as_ref().unwrap().name.as_deref(),
        Some(name.as_str())
    );
    assert_eq!(report.spec.results.as_ref().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_in_a_target_never_reach_the_stored_report() {
    let client = client().await;
    let pod = fresh_pod(&client, "secret-web").await;
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    let target = "/usr/bin/mysql --password=hunter2 -e 'Authorization: Bearer abc.def.ghi'";
    reporter.handle().submit(finding(&pod, target, 1, 1, 1));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);

    // The stored object as the API server returns it, as text: whatever
    // field a secret could have landed in, it would be in here.
    let path = format!(
        "/apis/openreports.io/v1alpha1/namespaces/{NS}/reports/{}",
        kyverno_runtime_report::report_name(&pod.name)
    );
    let text = client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert!(text.contains("/usr/bin/mysql"), "{text}");
    assert!(text.contains("--password=***"), "{text}");
    assert!(text.contains("Bearer ***"), "{text}");
    for secret in ["hunter2", "abc.def.ghi", "abc.def", "def.ghi"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

/// Every row of the redaction table, as the argv of an exec finding,
/// written by the reporter into a Report on the real API server: the
/// stored object holds none of the secrets, and each result's argv
/// property is the row's redaction.
#[tokio::test(flavor = "multi_thread")]
async fn no_secret_of_the_redaction_table_reaches_a_stored_report() {
    use kyverno_runtime_report::redaction_cases::{all_secrets, CASES};
    use kyverno_runtime_report::Process;
    let client = client().await;
    let pod = fresh_pod(&client, "redaction-table-web").await;
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    for (i, case) in CASES.iter().enumerate() {
        let mut f = finding(&pod, &format!("/usr/bin/tool-{i:03}"), 1, 1, 1);
        f.process = Some(Process {
            pid: 7,
            comm: "tool".into(),
            argv: case.argv(),
        });
        reporter.handle().submit(f);
    }
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Created);

    let path = format!(
        "/apis/openreports.io/v1alpha1/namespaces/{NS}/reports/{}",
        kyverno_runtime_report::report_name(&pod.name)
    );
    let text = client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap();
    for secret in all_secrets() {
        assert!(!text.contains(secret), "{secret} reached the stored Report");
    }
    let report = stored(&client, &pod).await;
    for (i, case) in CASES.iter().enumerate() {
        let result = by_target(&report, &format!("/usr/bin/tool-{i:03}"));
        assert_eq!(
            prop(result, property::ARGV),
            kyverno_runtime_report::sanitize(&case.redacted.join(" ")),
            "{}",
            case.rule
        );
    }
    println!(
        "{} results, {} bytes stored, no secret",
        CASES.len(),
        text.len()
    );
}

/// Every result of the pod's Report for `target`.
fn all_by_target<'a>(report: &'a Report, target: &str) -> Vec<&'a ReportResult> {
    report
        .spec
        .results
        .iter()
        .flatten()
        .filter(|r| r.properties.as_ref().unwrap()[property::TARGET] == target)
        .collect()
}

/// Issue 38, point 9: a policy switched from monitor to enforce, and a
/// policy deleted and recreated under the same name, start results of
/// their own; a result says what its count counts.
#[tokio::test(flavor = "multi_thread")]
async fn enforced_would_deny_and_a_recreated_policy_are_counted_apart() {
    let client = client().await;
    let pod = fresh_pod(&client, "modes-web").await;
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    let handle = reporter.handle();

    // Monitor days: 3 would-deny execs between 10 and 20.
    let mut monitor = finding(&pod, "/bin/sh", 3, 10, 20);
    monitor.enforced = false;
    handle.submit(monitor);
    reporter.flush().await;
    // The policy switched to enforce: 2 refusals between 30 and 40.
    handle.submit(finding(&pod, "/bin/sh", 2, 30, 40));
    reporter.flush().await;
    // The policy deleted and recreated under its name (a new uid).
    let mut recreated = finding(&pod, "/bin/sh", 1, 50, 50);
    recreated.policy_uid = "99999999-8888-7777-6666-555555555555".into();
    handle.submit(recreated);
    // Packets to an address.
    let mut net = finding(&pod, "10.0.0.1", 7, 60, 60);
    net.behavior = Behavior::Network;
    handle.submit(net);
    reporter.flush().await;

    let report = stored(&client, &pod).await;
    let sh = all_by_target(&report, "/bin/sh");
    let summary: Vec<(&str, &str, &str, &str)> = sh
        .iter()
        .map(|r| {
            (
                prop(r, property::POLICY_UID),
                prop(r, property::ENFORCED),
                prop(r, property::COUNT),
                prop(r, property::FIRST_TIMESTAMP),
            )
        })
        .collect();
    let (r10, r30, r50) = (rfc3339(10), rfc3339(30), rfc3339(50));
    assert_eq!(
        summary,
        [
            (
                "99999999-8888-7777-6666-555555555555",
                "true",
                "1",
                r50.as_str()
            ),
            (
                "11111111-2222-3333-4444-555555555555",
                "true",
                "2",
                r30.as_str()
            ),
            (
                "11111111-2222-3333-4444-555555555555",
                "false",
                "3",
                r10.as_str()
            ),
        ],
        "one result per (policy uid, enforced), most recent first"
    );
    assert!(sh[1]
        .message
        .as_deref()
        .unwrap()
        .contains("denied by the kernel"));
    assert!(sh[2]
        .message
        .as_deref()
        .unwrap()
        .contains("would have been denied"));

    let net = by_target(&report, "10.0.0.1");
    let props = net.properties.as_ref().unwrap();
    assert_eq!(
        props.get(property::COUNT_UNIT).map(String::as_str),
        Some("packets"),
        "what a network count counts: {props:?}"
    );
    let message = net.message.as_deref().unwrap();
    assert!(
        !message.contains("connection"),
        "a count of packets is not a connection: {message}"
    );
    assert_eq!(
        sh[0]
            .properties
            .as_ref()
            .unwrap()
            .get(property::COUNT_UNIT)
            .map(String::as_str),
        Some("execs")
    );
    assert_eq!(handle.dropped(), 0);
}

/// Issue 38, point 8: a late write for a pod's earlier incarnation (a
/// StatefulSet's pod recreated under its name) never replaces the live
/// pod's Report; its findings are dropped and counted instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_write_for_a_replaced_pod_never_takes_the_live_pods_report() {
    let client = client().await;
    let old = fresh_pod(&client, "db-0").await;
    let drops = Arc::new(Mutex::new(Vec::new()));
    let seen = drops.clone();
    let reporter = Reporter::new(
        client.clone(),
        ReporterOptions {
            on_drop: Some(Arc::new(move |reason, n| {
                seen.lock().unwrap().push((reason, n))
            })),
            ..ReporterOptions::default()
        },
    );
    let handle = reporter.handle();
    handle.submit(finding(&old, "/bin/old", 1, 10, 10));
    reporter.flush().await;

    // The pod is deleted and recreated under its name (a new uid), and
    // the new pod's findings are written: its Report now.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("db-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    for _ in 0..100 {
        if pods.get_opt("db-0").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let created: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db-0"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &created).await.unwrap();
    let new = PodIdentity {
        uid: created.metadata.uid.unwrap(),
        ..old.clone()
    };
    handle.submit(finding(&new, "/bin/new", 2, 20, 20));
    let flushed = reporter.flush().await;
    assert_eq!(only_outcome(&flushed), &WriteResult::Updated);
    let report = stored(&client, &new).await;
    assert_eq!(
        report.spec.scope.as_ref().unwrap().uid.as_deref(),
        Some(new.uid.as_str()),
        "the live pod takes over its predecessor's Report"
    );

    // A late finding of the old pod.
    handle.submit(finding(&old, "/bin/old", 5, 30, 30));
    reporter.flush().await;

    let report = stored(&client, &new).await;
    assert_eq!(
        report.spec.scope.as_ref().unwrap().uid.as_deref(),
        Some(new.uid.as_str()),
        "the Report stays the live pod's"
    );
    let owners: Vec<&str> = report
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
        .collect();
    assert_eq!(owners, [new.uid.as_str()]);
    let targets: Vec<&str> = report
        .spec
        .results
        .iter()
        .flatten()
        .map(|r| prop(r, property::TARGET))
        .collect();
    assert_eq!(targets, ["/bin/new"], "the live pod's results stay");
    assert_eq!(prop(by_target(&report, "/bin/new"), property::COUNT), "2");
    assert_eq!(
        *drops.lock().unwrap(),
        [(kyverno_runtime_report::DropReason::Unattributed, 1)],
        "the old pod's finding has no Report to go to: dropped and counted"
    );
    assert_eq!(handle.buffered(), 0);
}
