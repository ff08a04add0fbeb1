//! The monitor: both finding shapes, the dns advisory finding, the
//! unexplained kernel deny, selection by pod and namespace labels,
//! monitorFilter (short-circuit, errors reported anyway), and a policy
//! staged while the kernel is (re)programmed from it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_api::runtimepolicy::{RuntimePolicy, RuntimePolicyMode};
use kyverno_runtime_metrics::Metrics;
use kyverno_runtime_plane::collector::Sink;
use kyverno_runtime_plane::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use kyverno_runtime_plane::monitor::{FindingSink, Monitor, MonitorPolicy};
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_report::{Behavior, Decision, Finding};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Findings(Mutex<Vec<Finding>>);

impl FindingSink for Findings {
    fn submit(&self, finding: Finding) {
        self.0.lock().unwrap().push(finding);
    }
}

impl Findings {
    fn take(&self) -> Vec<Finding> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A policy compiled and evaluated from a spec, as the engine does.
fn policy(name: &str, spec: serde_json::Value) -> MonitorPolicy {
    let rp: RuntimePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1",
        "kind": "RuntimePolicy",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .unwrap();
    let compiled = CompiledPolicy::compile(&rp.spec).unwrap();
    let evaluated = compiled.evaluate().unwrap();
    MonitorPolicy::new(
        name,
        format!("uid-{name}"),
        compiled.mode,
        compiled.target.clone(),
        &evaluated,
        compiled.monitor_filter.clone(),
    )
}

fn pod(labels: &[(&str, &str)]) -> Arc<PodRef> {
    Arc::new(PodRef {
        namespace: "shop".into(),
        name: "web-0".into(),
        uid: "uid-web-0".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        containers: BTreeMap::from([(42, "app".into())]),
        version: 1,
        ..PodRef::default()
    })
}

fn event(facts: Facts, pod: &Arc<PodRef>) -> Event {
    let mut e = Event::new("test", facts);
    e.cgroup = Some(42);
    e.pod = Some(pod.clone());
    e
}

fn exec(path: &str, argv: &[&str], pod: &Arc<PodRef>) -> Event {
    let mut e = event(
        Facts::Exec {
            filename: path.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
        },
        pod,
    );
    e.process = Some(ProcessInfo {
        pid: 4242,
        comm: "sh".into(),
    });
    e
}

fn monitor() -> (Monitor, Arc<Findings>, Arc<Metrics>) {
    let findings = Arc::new(Findings::default());
    let metrics = Arc::new(Metrics::new());
    let m = Monitor::new(vec![findings.clone()], Some(metrics.clone()));
    m.set_namespace("shop", BTreeMap::from([("team".into(), "a".into())]));
    (m, findings, metrics)
}

#[test]
fn a_monitor_policy_reports_what_it_would_deny_with_the_process() {
    let (m, findings, _) = monitor();
    m.set_policy(policy(
        "watch-exec",
        serde_json::json!({"mode": "monitor", "podSelector": {"matchLabels": {"app": "web"}},
            "behaviors": [{"exec": {"allow": {"values": ["/bin/sh"]}, "deny": {"values": ["*"]}}}]}),
    ));
    let web = pod(&[("app", "web")]);
    m.handle(&exec("/bin/sh", &["sh"], &web));
    assert!(findings.take().is_empty(), "an allowed exec is no finding");
    m.handle(&exec("/usr/bin/curl", &["curl", "-sS", "http://x"], &web));
    let got = findings.take();
    assert_eq!(got.len(), 1);
    let f = &got[0];
    assert_eq!(f.policy, "watch-exec");
    assert_eq!(f.behavior, Behavior::Exec);
    assert_eq!(f.target, "/usr/bin/curl");
    assert!(!f.enforced, "a counterfactual");
    assert_eq!(f.decision, Some(Decision::DefaultDenied));
    assert_eq!(f.pod.container.as_deref(), Some("app"));
    let p = f.process.as_ref().unwrap();
    assert_eq!((p.pid, p.comm.as_str()), (4242, "sh"));
    assert_eq!(p.argv, ["curl", "-sS", "http://x"]);

    // Another pod's labels: not selected.
    let mut db = (*pod(&[("app", "db")])).clone();
    db.uid = "uid-db-0".into();
    m.handle(&exec("/usr/bin/curl", &[], &Arc::new(db)));
    // The same pod relabeled (the index gives it a new version).
    let mut relabeled = (*web).clone();
    relabeled.labels.insert("app".into(), "other".into());
    relabeled.version += 1;
    m.handle(&exec("/usr/bin/curl", &[], &Arc::new(relabeled)));
    assert!(findings.take().is_empty());
}

#[test]
fn an_enforce_policy_reports_only_what_the_kernel_refused_and_names_itself() {
    let (m, findings, metrics) = monitor();
    m.set_policy(policy(
        "deny-curl",
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["/usr/bin/curl"]}}}]}),
    ));
    m.set_policy(policy(
        "deny-wget",
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["/usr/bin/wget"]}}}]}),
    ));
    let web = pod(&[]);
    // Allowed by the kernel: an enforce policy has nothing to say.
    m.handle(&exec("/usr/bin/curl", &[], &web));
    assert!(findings.take().is_empty());
    let mut refused = exec("/usr/bin/curl", &[], &web);
    refused.kernel = Some(KernelVerdict::Denied);
    m.handle(&refused);
    let got = findings.take();
    assert_eq!(got.len(), 1, "only the policy whose lists deny it");
    assert_eq!(got[0].policy, "deny-curl");
    assert!(got[0].enforced);
    assert_eq!(got[0].decision, Some(Decision::Denied));

    // A refusal no policy explains (deleted since): counted, not lost.
    let mut stray = exec("/usr/bin/nc", &[], &web);
    stray.kernel = Some(KernelVerdict::Denied);
    stray.count = 3;
    m.handle(&stray);
    assert!(findings.take().is_empty());
    let text = metrics.encode();
    assert!(
        text.contains(r#"nirmata_runtime_events_dropped_total{source="monitor",reason="unattributed_kernel_deny"} 3"#),
        "{text}"
    );
}

#[test]
fn a_monitor_policy_judges_a_refused_operation_too() {
    let (m, findings, _) = monitor();
    m.set_policy(policy(
        "watch",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"open": {"deny": {"values": ["/etc/shadow"]}}}]}),
    ));
    let mut e = event(
        Facts::Open {
            path: "/etc/shadow".into(),
        },
        &pod(&[]),
    );
    e.kernel = Some(KernelVerdict::Denied);
    m.handle(&e);
    let got = findings.take();
    assert_eq!(got.len(), 1);
    assert!(
        !got[0].enforced,
        "monitor findings are counterfactual whatever the kernel did"
    );
}

#[test]
fn namespace_selectors_follow_the_namespace_labels() {
    let (m, findings, _) = monitor();
    m.set_policy(policy(
        "team-a",
        serde_json::json!({"mode": "monitor", "namespaceSelector": {"matchLabels": {"team": "a"}},
            "behaviors": [{"network": {"deny": {"values": ["10.0.0.0/8"]}}}]}),
    ));
    let web = pod(&[]);
    let net = || {
        event(
            Facts::Net {
                dest: "10.1.2.3".parse().unwrap(),
                port: None,
                names: Vec::new(),
            },
            &web,
        )
    };
    m.handle(&net());
    assert_eq!(findings.take().len(), 1);
    m.set_namespace("shop", BTreeMap::from([("team".into(), "b".into())]));
    m.handle(&net());
    assert!(
        findings.take().is_empty(),
        "a relabeled namespace drops out of the cached selection"
    );
}

#[test]
fn a_dns_question_is_an_advisory_finding() {
    let (m, findings, _) = monitor();
    m.set_policy(policy(
        "dns",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"dns": {"allow": {"values": ["*.example.com"]}, "deny": {"values": ["evil.example.com"]}}}]}),
    ));
    let web = pod(&[]);
    let q = |name: &str| event(Facts::Dns { qname: name.into() }, &web);
    m.handle(&q("www.example.com"));
    assert!(findings.take().is_empty(), "expected");
    m.handle(&q("example.com"));
    let got = findings.take();
    assert_eq!(got.len(), 1, "the apex is not a subdomain: unexpected");
    assert_eq!((got[0].behavior, got[0].decision), (Behavior::Dns, None));
    m.handle(&q("evil.example.com"));
    let got = findings.take();
    assert_eq!(got[0].decision, Some(Decision::Denied));
    assert!(!got[0].enforced && got[0].process.is_none());
}

#[test]
fn monitor_filter_expressions_short_circuit_and_an_error_reports_anyway() {
    let (m, findings, metrics) = monitor();
    m.set_policy(policy(
        "filtered",
        serde_json::json!({"mode": "monitor", "podSelector": {},
        "behaviors": [{"exec": {"deny": {"values": ["*"]}}}, {"open": {"deny": {"values": ["*"]}}}],
        "monitorFilter": {"expressions": [
            {"name": "only-exec", "expression": "has(event.exec)"},
            {"name": "not-health", "expression": "!event.exec.argv.exists(a, a == '--health')"},
            {"name": "argv0", "expression": "event.exec.argv[0] != ''"}
        ]}}),
    ));
    let web = pod(&[]);
    // Opens fail the first expression; the second (which would fail on an
    // open event, having no exec) is never evaluated.
    m.handle(&event(
        Facts::Open {
            path: "/etc/hosts".into(),
        },
        &web,
    ));
    assert!(findings.take().is_empty());
    // A health check is filtered out.
    m.handle(&exec("/bin/probe", &["probe", "--health"], &web));
    assert!(findings.take().is_empty());
    m.handle(&exec("/bin/sh", &["sh", "-c", "id"], &web));
    assert_eq!(findings.take().len(), 1);
    // A counter event has no argv: `event.exec.argv[0]` fails to evaluate,
    // and the finding is reported anyway and the error counted.
    let mut counted = exec("/bin/ls", &[], &web);
    counted.process = None;
    counted.count = 5;
    m.handle(&counted);
    let got = findings.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].count, 5);
    let text = metrics.encode();
    assert!(
        text.contains(r#"nirmata_runtime_monitor_filter_eval_errors_total{policy="filtered",expression="argv0"} 1"#),
        "{text}"
    );
}

/// No monitorFilter expression text reaches /metrics (#24 §7): the
/// counter of failed evaluations is labelled with the expression's name,
/// as the specification says, and neither the expression (which may hold
/// anything a user wrote, a token included) nor its evaluation error
/// appears in any label or value.
#[test]
fn no_monitor_filter_expression_text_reaches_a_metric() {
    let (m, findings, metrics) = monitor();
    // Each type-checks and fails at run time, on one event or the other.
    let texts = [
        "event.exec.argv[size(event.exec.argv)] == 'ghp_zz1SecretInTheFilter'",
        "event.exec.argv[7] == 'zz2_argv_marker'",
        "1 / (size(event.exec.argv) - size(event.exec.argv)) == size('zz3_div_marker')",
        "int('zz4-not-a-number') > 0",
    ];
    let expressions: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"name": format!("expr-{i}"), "expression": t}))
        .collect();
    m.set_policy(policy(
        "leaky",
        serde_json::json!({"mode": "monitor", "podSelector": {},
        "behaviors": [{"exec": {"deny": {"values": ["*"]}}}],
        "monitorFilter": {"expressions": expressions}}),
    ));
    let web = pod(&[]);
    let mut counted = exec("/bin/ls", &["ls"], &web);
    counted.process = None;
    m.handle(&counted);
    m.handle(&exec("/bin/sh", &["sh", "-c", "id"], &web));
    assert_eq!(findings.take().len(), 2, "errors report the finding anyway");
    let text = metrics.encode();
    for i in 0..texts.len() {
        assert!(
            text.contains(&format!(
                r#"nirmata_runtime_monitor_filter_eval_errors_total{{policy="leaky",expression="expr-{i}"}}"#
            )),
            "expr-{i} is not counted by its name:\n{text}"
        );
    }
    for fragment in [
        "zz1", "zz2", "zz3", "zz4", "ghp_", "argv[7]", "size(", "int(",
    ] {
        assert!(
            !text.contains(fragment),
            "{fragment:?} of an expression's text is in /metrics:\n{text}"
        );
    }
}

#[test]
fn a_policy_update_replaces_and_a_delete_removes() {
    let (m, findings, _) = monitor();
    let spec = |deny: &str| {
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"protocol": {"deny": {"values": [deny]}}}]})
    };
    m.set_policy(policy("p", spec("ssh")));
    let web = pod(&[]);
    let ssh = || {
        event(
            Facts::Protocol {
                protocol: "ssh",
                alpn: None,
            },
            &web,
        )
    };
    m.handle(&ssh());
    assert_eq!(findings.take()[0].target, "ssh");
    m.set_policy(policy("p", spec("quic")));
    assert_eq!(m.policy_count(), 1);
    m.handle(&ssh());
    assert!(findings.take().is_empty());
    m.remove_policy("p");
    assert_eq!(m.policy_count(), 0);
}

fn refused_exec(path: &str, pod: &Arc<PodRef>) -> Event {
    let mut e = exec(path, &[], pod);
    e.kernel = Some(KernelVerdict::Denied);
    e
}

/// The monitor's `events_dropped_total` line for `reason`, or "".
fn dropped(metrics: &Metrics, reason: &str) -> String {
    metrics
        .encode()
        .lines()
        .find(|l| l.contains(&format!(r#"source="monitor",reason="{reason}""#)))
        .unwrap_or_default()
        .to_string()
}

fn unattributed(metrics: &Metrics) -> String {
    dropped(metrics, "unattributed_kernel_deny")
}

/// The engine stages a policy before programming the kernel: the first
/// refusal a new policy causes (the kernel acts within microseconds, the
/// other backends may still be programmed) already names it.
#[test]
fn a_staged_policy_explains_the_refusals_its_programming_causes() {
    let (m, findings, metrics) = monitor();
    m.stage_policy(policy(
        "deny-curl",
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["/usr/bin/curl"]}}}]}),
    ));
    let web = pod(&[]);
    m.handle(&refused_exec("/usr/bin/curl", &web));
    let got = findings.take();
    assert_eq!(got.len(), 1, "explained while staged");
    assert_eq!(
        (got[0].policy.as_str(), got[0].enforced),
        ("deny-curl", true)
    );
    assert_eq!(unattributed(&metrics), "", "nothing went unexplained");
}

/// While a policy is reprogrammed, the kernel may refuse by either form:
/// each refusal is the policy's, judged by the form that denies it; once
/// settled, only the new form explains.
#[test]
fn while_a_policy_is_reprogrammed_either_form_explains_a_refusal() {
    let (m, findings, metrics) = monitor();
    let spec = |mode: &str, deny: &str| {
        serde_json::json!({"mode": mode, "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": [deny]}}}]})
    };
    m.set_policy(policy("p", spec("enforce", "/usr/bin/curl")));
    m.stage_policy(policy("p", spec("enforce", "/usr/bin/wget")));
    assert_eq!(m.policy_count(), 1, "one policy, two forms");
    let web = pod(&[]);
    for path in ["/usr/bin/curl", "/usr/bin/wget"] {
        m.handle(&refused_exec(path, &web));
        let got = findings.take();
        assert_eq!(got.len(), 1, "{path}: one finding");
        assert_eq!(got[0].target, path);
        assert!(got[0].enforced, "{path}");
    }

    // Staged again before it settled: the form before is what the kernel
    // may still hold, the one before that is not.
    m.stage_policy(policy("p", spec("enforce", "/usr/bin/nc")));
    m.handle(&refused_exec("/usr/bin/wget", &web));
    assert_eq!(findings.take().len(), 1, "the staged form before");
    m.handle(&refused_exec("/usr/bin/curl", &web));
    assert!(findings.take().is_empty(), "two forms back");

    // Settled: the old lists explain nothing any more.
    m.set_policy(policy("p", spec("enforce", "/usr/bin/nc")));
    m.handle(&refused_exec("/usr/bin/wget", &web));
    assert!(findings.take().is_empty());
    assert!(
        unattributed(&metrics).ends_with(" 2"),
        "{}",
        unattributed(&metrics)
    );
}

/// Counters are drained at an interval: a refusal the old lists made just
/// before the kernel was reprogrammed can arrive after the policy settled.
/// With a grace the old form explains it that long, and not after.
#[test]
fn a_settled_policys_old_form_explains_refusals_for_the_grace_only() {
    let web = pod(&[]);
    let spec = |deny: &str| {
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": [deny]}}}]})
    };
    let reprogram = |m: &Monitor| {
        m.set_policy(policy("p", spec("/usr/bin/curl")));
        m.stage_policy(policy("p", spec("/usr/bin/wget")));
        m.set_policy(policy("p", spec("/usr/bin/wget")));
    };
    let findings = Arc::new(Findings::default());
    let m = Monitor::new(vec![findings.clone()], None)
        .with_previous_grace(std::time::Duration::from_secs(3600));
    reprogram(&m);
    m.handle(&refused_exec("/usr/bin/curl", &web));
    assert_eq!(findings.take().len(), 1, "within the grace");

    let m = Monitor::new(vec![findings.clone()], None)
        .with_previous_grace(std::time::Duration::from_millis(1));
    reprogram(&m);
    std::thread::sleep(std::time::Duration::from_millis(20));
    m.handle(&refused_exec("/usr/bin/curl", &web));
    assert!(findings.take().is_empty(), "after the grace");
    m.handle(&refused_exec("/usr/bin/wget", &web));
    assert_eq!(findings.take().len(), 1, "the settled form");
}

/// A refusal drained after its enforce policy was deleted: within the grace
/// it is the deleted policy's (no finding, counted as policy_deleted), after
/// it nothing explains it.
#[test]
fn a_deleted_policys_late_refusals_are_counted_as_its_own_for_the_grace() {
    let web = pod(&[]);
    let spec = serde_json::json!({"mode": "enforce", "podSelector": {},
        "behaviors": [{"exec": {"deny": {"values": ["/usr/bin/curl"]}}}]});
    for (grace, reason) in [
        (std::time::Duration::from_secs(3600), "policy_deleted"),
        (
            std::time::Duration::from_millis(1),
            "unattributed_kernel_deny",
        ),
    ] {
        let findings = Arc::new(Findings::default());
        let metrics = Arc::new(Metrics::new());
        let m =
            Monitor::new(vec![findings.clone()], Some(metrics.clone())).with_previous_grace(grace);
        m.set_policy(policy("p", spec.clone()));
        m.retire_policy("p");
        assert_eq!(m.policy_count(), 0, "gone for everything else");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut late = refused_exec("/usr/bin/curl", &web);
        late.count = 3;
        m.handle(&late);
        assert!(findings.take().is_empty(), "no finding of a deleted policy");
        assert!(
            dropped(&metrics, reason).ends_with(" 3"),
            "grace {grace:?}: {}",
            metrics.encode()
        );
        // A refusal the deleted policy never made is not its.
        m.handle(&refused_exec("/usr/bin/wget", &web));
        assert!(
            unattributed(&metrics).ends_with(if reason == "policy_deleted" {
                " 1"
            } else {
                " 4"
            }),
            "{}",
            metrics.encode()
        );
    }
}

/// Enforce switched to monitor: until the kernel stops refusing, a refusal
/// is an enforced finding of the old form, not a counterfactual one.
#[test]
fn a_refusal_while_switching_to_monitor_is_reported_as_enforced() {
    let (m, findings, _) = monitor();
    let spec = |mode: &str| {
        serde_json::json!({"mode": mode, "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["/usr/bin/curl"]}}}]})
    };
    m.set_policy(policy("p", spec("enforce")));
    m.stage_policy(policy("p", spec("monitor")));
    let web = pod(&[]);
    m.handle(&refused_exec("/usr/bin/curl", &web));
    let got = findings.take();
    assert_eq!(got.len(), 1);
    assert!(got[0].enforced, "the kernel refused by the enforce form");
    // Allowed by the kernel: the monitor form's counterfactual.
    m.handle(&exec("/usr/bin/curl", &[], &web));
    let got = findings.take();
    assert_eq!(got.len(), 1);
    assert!(!got[0].enforced);
}

#[test]
fn the_mode_of_a_policy_is_taken_from_the_spec() {
    let p = policy(
        "m",
        serde_json::json!({"podSelector": {}, "behaviors": [{"open": {"deny": {"values": ["/x"]}}}]}),
    );
    assert_eq!(
        p.mode,
        RuntimePolicyMode::Monitor,
        "omitted mode reads as monitor"
    );
}

/// What this thread logs, at every level, from the moment it asks.
///
/// One process-wide subscriber, interested in everything, writes each line
/// to the buffer of the thread that logged it (and drops the lines of
/// threads that did not ask). A scoped subscriber (`with_default`) is not
/// enough here: the callsites' interest is cached process-wide, and
/// another test thread that reached a callsite while no subscriber wanted
/// it could leave it disabled for this one (seen under load, also after
/// `rebuild_interest_cache`).
fn capture_this_threads_logs() -> Arc<Mutex<Vec<u8>>> {
    use std::cell::RefCell;
    use std::io::Write;
    thread_local! {
        static CAPTURE: RefCell<Option<Arc<Mutex<Vec<u8>>>>> = const { RefCell::new(None) };
    }
    struct ThisThread;
    impl Write for ThisThread {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            CAPTURE.with(|c| {
                if let Some(buffer) = &*c.borrow() {
                    buffer.lock().unwrap().extend_from_slice(b);
                }
            });
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThisThread)
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .unwrap_or_else(|e| panic!("the test binary's one subscriber: {e}"));
    });
    let buffer = Arc::new(Mutex::new(Vec::new()));
    CAPTURE.with(|c| *c.borrow_mut() = Some(buffer.clone()));
    buffer
}

/// A log line is one of the four ways out of the daemon: a refused target
/// carrying secrets is logged only through the chokepoint.
#[test]
fn a_refusal_is_logged_redacted() {
    let (m, _findings, _) = monitor();
    let secret = "/opt/run --password=hunter2 Authorization: Bearer abc.def.ghi";
    let mut e = exec(secret, &[], &pod(&[]));
    e.kernel = Some(KernelVerdict::Denied);
    e.process = Some(ProcessInfo {
        pid: 7,
        comm: "x token=hunter3".into(),
    });
    let buffer = capture_this_threads_logs();
    m.handle(&e);
    let logged = String::from_utf8_lossy(&buffer.lock().unwrap()).into_owned();
    assert!(logged.contains("kernel refused"), "{logged}");
    for secret in ["hunter2", "abc.def.ghi", "hunter3"] {
        assert!(!logged.contains(secret), "{secret}: {logged}");
    }
}

#[test]
fn the_example_exec_filter_leaves_out_health_checks() {
    let (m, findings, metrics) = monitor();
    m.set_policy(policy(
        "example",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"exec": {"allow": {"values": ["/bin/busybox"]}, "deny": {"values": ["*"]}}}],
            "monitorFilter": {"expressions": [
                {"name": "not-a-health-check", "expression": "!has(event.exec) || !event.exec.argv.exists(a, a == '--health')"}
            ]}}),
    ));
    let web = pod(&[]);
    m.handle(&exec("/usr/local/bin/tool", &["true", "--health"], &web));
    assert!(findings.take().is_empty(), "{}", metrics.encode());
    m.handle(&exec(
        "/usr/local/bin/tool",
        &["true", "--token=x", "-v"],
        &web,
    ));
    assert_eq!(findings.take().len(), 1);
}

/// Every row of the redaction table, as the argv of an exec the kernel
/// refused and a monitor policy reports: no secret reaches a log line, at
/// any level, though a monitorFilter's errors quote every argument
/// (`No such key: <argv[i]>`) and the findings are logged as `Debug`
/// prints them.
#[test]
fn no_secret_of_the_redaction_table_reaches_a_log_line() {
    use kyverno_runtime_report::redaction_cases::{all_secrets, CASES};
    let (m, findings, _) = monitor();
    // One expression per argument position, each failing with the
    // argument in its message.
    let expressions: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            serde_json::json!({"name": format!("quote-{i}"),
                "expression": format!("{{'a': true}}[event.exec.argv[{i}]]")})
        })
        .collect();
    m.set_policy(policy(
        "watch-exec",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"exec": {"deny": {"values": ["*"]}}}],
            "monitorFilter": {"expressions": expressions}}),
    ));
    let web = pod(&[]);
    let buffer = capture_this_threads_logs();
    for case in CASES {
        let mut e = exec("/usr/bin/tool", case.argv, &web);
        e.kernel = Some(KernelVerdict::Denied);
        m.handle(&e);
    }
    for f in findings.take() {
        tracing::info!(finding = ?f, "a finding");
    }
    let logged = String::from_utf8_lossy(&buffer.lock().unwrap()).into_owned();
    let lines = logged.lines().count();
    assert!(
        logged.matches("No such key").count() >= CASES.len(),
        "every row's arguments are quoted by an error: {logged}"
    );
    assert_eq!(logged.matches("a finding").count(), CASES.len(), "{logged}");
    for secret in all_secrets() {
        assert!(!logged.contains(secret), "{secret} reached the log");
    }
    println!("{lines} log lines for {} rows, no secret", CASES.len());
}

/// The policies each finding names, with its decision, sorted.
fn named(findings: &[Finding]) -> Vec<(String, bool, Option<Decision>)> {
    let mut out: Vec<_> = findings
        .iter()
        .map(|f| (f.policy.clone(), f.enforced, f.decision))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Issue 33, point 5: A denies `["*"]`, B allows curl, C denies curl. The
/// kernel refuses curl because of C (A's default deny was lifted by B), so
/// the finding names C only; an exec nobody allows is A's.
#[test]
fn a_refusal_names_only_the_policies_that_refused_it() {
    let (m, findings, metrics) = monitor();
    let exec_rule = |allow: &[&str], deny: &[&str]| {
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"exec": {"allow": {"values": allow}, "deny": {"values": deny}}}]})
    };
    m.set_policy(policy("a-default-deny", exec_rule(&[], &["*"])));
    m.set_policy(policy("b-allow-curl", exec_rule(&["/usr/bin/curl"], &[])));
    m.set_policy(policy("c-deny-curl", exec_rule(&[], &["/usr/bin/curl"])));
    let web = pod(&[]);
    m.handle(&refused_exec("/usr/bin/curl", &web));
    assert_eq!(
        named(&findings.take()),
        [("c-deny-curl".to_string(), true, Some(Decision::Denied))]
    );
    m.handle(&refused_exec("/usr/bin/nc", &web));
    assert_eq!(
        named(&findings.take()),
        [(
            "a-default-deny".to_string(),
            true,
            Some(Decision::DefaultDenied)
        )]
    );
    // Two explicit denies of one target: both refused it.
    m.set_policy(policy("d-deny-curl", exec_rule(&[], &["/usr/bin/curl"])));
    m.handle(&refused_exec("/usr/bin/curl", &web));
    assert_eq!(
        named(&findings.take()),
        [
            ("c-deny-curl".to_string(), true, Some(Decision::Denied)),
            ("d-deny-curl".to_string(), true, Some(Decision::Denied)),
        ]
    );
    assert_eq!(unattributed(&metrics), "");
}

/// Issue 33, points 1 and 3: an explicit deny in one behavior beside a
/// default deny in another behavior of the same kind and policy is kept by
/// the monitor (it used to be dropped by the merge): the deny of an address
/// inside an allowed /16 is a finding, for monitor and enforce alike.
#[test]
fn an_explicit_deny_beside_a_default_deny_is_judged_in_every_shape() {
    let net = |dest: &str, web: &Arc<PodRef>| {
        event(
            Facts::Net {
                dest: dest.parse().unwrap(),
                port: Some(443),
                names: Vec::new(),
            },
            web,
        )
    };
    let shapes = [
        (
            "two-behaviors",
            serde_json::json!([
                {"network": {"allow": {"values": ["10.50.0.0/16", "fd00:50::/64"]}, "deny": {"values": ["*"]}}},
                {"network": {"deny": {"values": ["10.50.0.9", "fd00:50::9"]}}}
            ]),
        ),
        (
            "one-behavior",
            serde_json::json!([
                {"network": {"allow": {"values": ["10.50.0.0/16", "fd00:50::/64"]},
                             "deny": {"values": ["*", "10.50.0.9", "fd00:50::9"]}}}
            ]),
        ),
    ];
    for (name, behaviors) in shapes {
        for mode in ["monitor", "enforce"] {
            let (m, findings, _) = monitor();
            m.set_policy(policy(
                name,
                serde_json::json!({"mode": mode, "podSelector": {}, "behaviors": behaviors}),
            ));
            let web = pod(&[]);
            for (dest, want) in [
                ("10.50.0.9", Some(Decision::Denied)),
                ("10.50.0.8", None),
                ("10.51.0.1", Some(Decision::DefaultDenied)),
                ("fd00:50::9", Some(Decision::Denied)),
                ("fd00:50::8", None),
                ("fd00:51::1", Some(Decision::DefaultDenied)),
            ] {
                let mut e = net(dest, &web);
                if mode == "enforce" && want.is_some() {
                    e.kernel = Some(KernelVerdict::Denied);
                }
                m.handle(&e);
                let got = findings.take();
                assert_eq!(
                    got.iter().map(|f| f.decision).collect::<Vec<_>>(),
                    want.into_iter().map(Some).collect::<Vec<_>>(),
                    "{name} {mode} {dest}"
                );
            }
        }
    }
}

/// Issue 33, point 4: the monitor judges Service and domain values by the
/// names the destination is known under (the engine fills them from the
/// Services' addresses and the pod's learned DNS answers): a monitor policy
/// allowing `api.prod.svc` under `deny: ["*"]` is silent for the Service's
/// own addresses, and a monitor deny of a domain reports its address.
#[test]
fn service_and_domain_values_are_judged_by_the_names_of_the_destination() {
    let (m, findings, _) = monitor();
    m.set_policy(policy(
        "allow-api",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"network": {"allow": {"values": ["api.prod.svc.cluster.local"]},
                                       "deny": {"values": ["*"]}}}]}),
    ));
    m.set_policy(policy(
        "deny-domain",
        serde_json::json!({"mode": "monitor", "podSelector": {},
            "behaviors": [{"network": {"deny": {"values": ["Evil.Example."]}}}]}),
    ));
    let web = pod(&[]);
    let net = |dest: &str, names: &[&str]| {
        event(
            Facts::Net {
                dest: dest.parse().unwrap(),
                port: Some(443),
                names: names.iter().map(|s| s.to_string()).collect(),
            },
            &web,
        )
    };
    m.handle(&net("10.96.0.10", &["api.prod.svc"]));
    assert!(findings.take().is_empty(), "the Service's own address");
    m.handle(&net("203.0.113.7", &["evil.example"]));
    let got = findings.take();
    assert_eq!(
        named(&got),
        [
            (
                "allow-api".to_string(),
                false,
                Some(Decision::DefaultDenied)
            ),
            ("deny-domain".to_string(), false, Some(Decision::Denied)),
        ]
    );
    // The finding says which value the destination matched as; a default
    // deny names none (no value of the policy named it).
    let matched = |policy: &str| {
        got.iter()
            .find(|f| f.policy == policy)
            .map(|f| f.matched.clone())
            .unwrap_or_default()
    };
    assert_eq!(matched("deny-domain"), ["evil.example"]);
    assert!(matched("allow-api").is_empty());
    // An enforce refusal of a Service's address names the Service.
    m.set_policy(policy(
        "deny-db",
        serde_json::json!({"mode": "enforce", "podSelector": {},
            "behaviors": [{"network": {"deny": {"values": ["db.prod.svc"]}}}]}),
    ));
    let mut refused = net("10.96.0.20", &["db.prod.svc"]);
    refused.kernel = Some(KernelVerdict::Denied);
    m.handle(&refused);
    let got = findings.take();
    let db = got.iter().find(|f| f.policy == "deny-db");
    assert_eq!(
        db.map(|f| (f.enforced, f.matched.clone())),
        Some((true, vec!["db.prod.svc".to_string()])),
        "{got:?}"
    );
    m.remove_policy("deny-db");
    // The same address unnamed (a Service's endpoint no longer, an
    // expired answer): judged by its address alone.
    m.handle(&net("10.96.0.10", &[]));
    assert_eq!(
        named(&findings.take()),
        [(
            "allow-api".to_string(),
            false,
            Some(Decision::DefaultDenied)
        )]
    );
}
