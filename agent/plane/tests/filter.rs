//! monitorFilter over the Go original's `event` fields, on the plane's own
//! types: an attributed [`Event`] and its [`PodRef`] through the
//! [`Monitor`], as the daemon runs it. Each field is checked for the value
//! the Go original gives it where the filter runs (`pkg/compiler`
//! `NewFilterActivation`, `pkg/monitor` `handleEvent`), and for its empty
//! value where the event does not know it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_metrics::Metrics;
use kyverno_runtime_plane::collector::Sink;
use kyverno_runtime_plane::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use kyverno_runtime_plane::monitor::{FindingSink, Monitor, MonitorPolicy};
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_report::Finding;
use rstest::rstest;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

#[derive(Default)]
struct Findings(Mutex<Vec<Finding>>);

impl FindingSink for Findings {
    fn submit(&self, finding: Finding) {
        self.0.lock().unwrap().push(finding);
    }
}

/// 2024-03-01T12:00:00Z, the Go test's event time.
const TIME: u64 = 1_709_294_400;

/// The Go test's pod (`fullEvent`), as the index holds it.
fn pod() -> PodRef {
    PodRef {
        namespace: "team-a".into(),
        name: "agent-0".into(),
        uid: "uid-1".into(),
        labels: BTreeMap::from([("app".into(), "ai".into())]),
        owner_kind: Some("Deployment".into()),
        owner_name: Some("agent".into()),
        containers: BTreeMap::from([(42, "agent".into())]),
        container_ids: BTreeMap::from([("agent".into(), "containerd://abc".into())]),
        node_name: "node-1".into(),
        service_account: "agent-sa".into(),
        version: 1,
    }
}

/// An exec by `curl` (pid 17) in the pod's container, three occurrences.
fn exec(pod: PodRef) -> Event {
    let mut e = Event::new(
        "test",
        Facts::Exec {
            filename: "/usr/bin/curl".into(),
            argv: vec!["curl".into(), "-s".into()],
        },
    );
    e.time = UNIX_EPOCH + Duration::from_secs(TIME);
    e.cgroup = Some(42);
    e.process = Some(ProcessInfo {
        pid: 17,
        comm: "curl".into(),
    });
    e.count = 3;
    e.pod = Some(Arc::new(pod));
    e
}

/// A monitor policy over every exec and dns question, filtered by `expr`.
fn policy(expr: &str) -> MonitorPolicy {
    let rp: RuntimePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1",
        "kind": "RuntimePolicy",
        "metadata": {"name": "f", "uid": "uid-f"},
        "spec": {"mode": "monitor", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["*"]}}},
                          {"dns": {"deny": {"values": ["*"]}}},
                          {"network": {"deny": {"values": ["0.0.0.0/0"]}}},
                          {"protocol": {"deny": {"values": ["*"]}}}],
            "monitorFilter": {"expressions": [{"name": "under-test", "expression": expr}]}},
    }))
    .unwrap();
    let compiled = CompiledPolicy::compile(&rp.spec).unwrap_or_else(|e| panic!("{expr}: {e:?}"));
    let evaluated = compiled.evaluate().unwrap();
    MonitorPolicy::new(
        "f",
        "uid-f",
        compiled.mode,
        compiled.target.clone(),
        &evaluated,
        compiled.monitor_filter.clone(),
    )
}

/// Whether `event` makes a finding under a filter of `expr`; an
/// evaluation error (which reports anyway) fails the test, since every
/// field must evaluate.
fn reported(expr: &str, event: &Event) -> bool {
    let findings = Arc::new(Findings::default());
    let metrics = Arc::new(Metrics::new());
    let m = Monitor::new(vec![findings.clone()], Some(metrics.clone()));
    m.set_policy(policy(expr));
    m.handle(event);
    let text = metrics.encode();
    assert!(
        !text.contains("monitor_filter_eval_errors_total{"),
        "{expr}: the filter failed to evaluate: {text}"
    );
    let n = findings.0.lock().unwrap().len();
    assert!(n <= 1, "{expr}: {n} findings");
    n == 1
}

#[rstest]
#[case(r#"event.time == timestamp("2024-03-01T12:00:00Z")"#, true)]
#[case(r#"event.time > timestamp("2024-03-01T12:00:00Z")"#, false)]
#[case("event.time.getHours() == 12", true)]
#[case("event.count == 3", true)]
#[case("event.count > 3", false)]
#[case("event.count >= 3u", true)]
#[case("event.wouldDeny", true)]
#[case("event.kernelDenied", false)]
#[case(r#"event.pod.container == "agent""#, true)]
#[case(r#"event.pod.containerID == "containerd://abc""#, true)]
#[case(r#"event.pod.ownerKind == "Deployment""#, true)]
#[case(r#"event.pod.ownerName == "agent""#, true)]
#[case(r#"event.pod.ownerName == "agent-5d9c8""#, false)]
#[case(r#"event.pod.nodeName == "node-1""#, true)]
#[case(r#"event.pod.nodeName == "node-2""#, false)]
#[case(r#"event.pod.serviceAccount == "agent-sa""#, true)]
#[case(r#"event.pod.serviceAccount == "default""#, false)]
#[case(r#"event.comm == "curl" && event.pid == 17"#, true)]
fn each_go_field_has_the_events_value(#[case] expr: &str, #[case] want: bool) {
    assert_eq!(reported(expr, &exec(pod())), want, "{expr}");
}

#[test]
fn kernel_denied_is_the_kernels_refusal_and_would_deny_stays_set() {
    // A monitor policy's counterfactual on an operation another, enforcing
    // policy had the kernel refuse: both flags, as in the Go original.
    let mut e = exec(pod());
    e.kernel = Some(KernelVerdict::Denied);
    assert!(reported("event.kernelDenied && event.wouldDeny", &e));
    e.kernel = Some(KernelVerdict::DefaultDenied);
    assert!(reported("event.kernelDenied", &e));
    e.kernel = Some(KernelVerdict::Allowed);
    assert!(!reported("event.kernelDenied", &e));
}

#[rstest]
#[case(r#"event.pod.container == """#)]
#[case(r#"event.pod.containerID == """#)]
#[case(r#"event.comm == "" && event.pid == 0"#)]
fn what_the_event_does_not_know_is_the_empty_value(#[case] expr: &str) {
    // A counter event of a cgroup the pod's containers do not list: no
    // container, no process.
    let mut e = exec(pod());
    e.cgroup = Some(99);
    e.process = None;
    assert!(reported(expr, &e), "{expr}");
}

#[rstest]
#[case(r#"event.pod.ownerKind == "" && event.pod.ownerName == """#)]
#[case(r#"event.pod.nodeName == "" && event.pod.serviceAccount == """#)]
#[case(r#"event.pod.containerID == "" && event.pod.container == "agent""#)]
fn a_pod_the_index_knows_less_of_reads_empty(#[case] expr: &str) {
    let bare = PodRef {
        owner_kind: None,
        owner_name: None,
        container_ids: BTreeMap::new(),
        node_name: String::new(),
        service_account: String::new(),
        ..pod()
    };
    assert!(reported(expr, &exec(bare)), "{expr}");
}

#[test]
fn a_dns_finding_is_filtered_and_never_would_deny() {
    // The Go original's TestHandleEvent_DNSFindingIsFilterable: a dns
    // finding is advisory, so it has no counterfactual.
    let mut q = exec(pod());
    q.facts = Facts::Dns {
        qname: "api.openai.com".into(),
    };
    q.process = None;
    assert!(reported("has(event.dns)", &q));
    assert!(!reported("event.wouldDeny", &q));
    assert!(reported(
        r#"!event.wouldDeny && !event.kernelDenied && event.dns.qname == "api.openai.com""#,
        &q
    ));
    assert!(!reported(r#"event.dns.qname.endsWith(".internal")"#, &q));
}

#[test]
fn net_domain_and_protocol_alpn_are_empty_when_unknown() {
    let mut n = exec(pod());
    n.facts = Facts::Net {
        dest: "10.0.0.5".parse().unwrap(),
        port: None,
        names: Vec::new(),
    };
    assert!(reported(
        r#"event.net.destIP == "10.0.0.5" && event.net.domain == """#,
        &n
    ));
    let mut p = exec(pod());
    p.facts = Facts::Protocol {
        protocol: "ssh",
        alpn: None,
    };
    assert!(reported(
        r#"event.protocol.protocol == "ssh" && event.protocol.alpn == """#,
        &p
    ));
}
