//! The engine's bookkeeping with no kernel backend (every slot
//! unavailable, the exec tracer's gate a fake): what it reports, when it
//! re-evaluates, what it skips.
use super::*;
use kyverno_runtime_api::runtimepolicy::{RuntimePolicy, RuntimePolicySpec};
use std::time::{Duration, Instant};

fn engine() -> (Engine, Reports, tempfile::TempDir) {
    engine_with(None)
}

fn engine_with(tracer: Option<Arc<dyn ExecGate>>) -> (Engine, Reports, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let reports = Reports::new();
    let resolver =
        CgroupResolver::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let engine = Engine::new(Parts {
        node: "n1".into(),
        backends: Vec::new(),
        openexec: Slot::Unavailable("no LSM here".into()),
        egress: Slot::Unavailable("no cgroup v2 here".into()),
        protocol: Slot::Unavailable("no classifier here".into()),
        dns: Slot::Unavailable("no observer here".into()),
        resolver,
        reports: reports.clone(),
        metrics: Arc::new(Metrics::new()),
        plane: Plane {
            index: Arc::new(kyverno_runtime_plane::Index::new(None, "/proc", None)),
            monitor: Arc::new(kyverno_runtime_plane::Monitor::new(Vec::new(), None)),
            tracer,
            sources: kyverno_runtime_plane::SourceStates::default(),
        },
    });
    (engine, reports, dir)
}

fn policy(name: &str, generation: i64, spec: serde_json::Value) -> RuntimePolicy {
    let spec: RuntimePolicySpec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
    let mut rp = RuntimePolicy::new(name, spec);
    rp.metadata.uid = Some(format!("uid-{name}"));
    rp.metadata.generation = Some(generation);
    rp
}

fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                     "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "status": {"phase": "Running"}
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name,
                     "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()}
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

fn report(reports: &Reports, name: &str) -> NodeReport {
    reports
        .snapshot()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("no report for {name}"))
}

#[test]
fn an_unavailable_backend_is_reported_with_its_reason() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "enforce", "podSelector": {},
        "behaviors": [{"exec": {"deny": {"values": ["/bin/sh"]}}}]}),
    ));
    let r = report(&reports, "p");
    assert_eq!(r.shard.enforcement_available, Some(false));
    assert_eq!(r.shard.message.as_deref(), Some("exec: no LSM here"));
    assert_eq!(r.shard.pods_matched, Some(false));
    assert_eq!(r.active_behaviors, ["exec"]);
}

#[test]
fn a_compile_failure_is_reported_and_programs_nothing() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "bad",
        1,
        serde_json::json!({"mode": "monitor",
        "behaviors": [{"open": {"deny": {"expression": "1 + 2"}}}]}),
    ));
    let r = report(&reports, "bad");
    let message = r.compile_error.unwrap_or_default();
    assert!(
        message.contains("spec.behaviors[0].open.deny.expression"),
        "{message}"
    );
}

#[test]
fn pods_matched_follows_pods_and_namespace_relabels() {
    let (mut e, reports, _dir) = engine();
    e.apply_namespace(&namespace("a", &[]));
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "monitor",
        "namespaceSelector": {"matchLabels": {"team": "x"}},
        "behaviors": [{"network": {"deny": {"values": ["10.0.0.0/8"]}}}]}),
    ));
    e.apply_pod(&pod("a", "web", &[("app", "web")]));
    assert_eq!(report(&reports, "p").shard.pods_matched, Some(false));
    e.apply_namespace(&namespace("a", &[("team", "x")]));
    assert_eq!(report(&reports, "p").shard.pods_matched, Some(true));
    let mut finished = pod("a", "web", &[("app", "web")]);
    finished.status = serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).ok();
    e.apply_pod(&finished);
    assert_eq!(report(&reports, "p").shard.pods_matched, Some(false));
}

#[test]
fn an_enforce_policy_selecting_protected_pods_says_it_does_not_enforce_them() {
    let (mut e, reports, _dir) = engine();
    e.set_protected_namespaces(["kube-system".to_owned(), "krt".to_owned()].into());
    let everywhere = |mode: &str| {
        serde_json::json!({"mode": mode, "podSelector": {},
        "behaviors": [{"exec": {"deny": {"values": ["/bin/sh"]}}}]})
    };
    e.apply_policy(&policy("enf", 1, everywhere("enforce")));
    e.apply_policy(&policy("mon", 1, everywhere("monitor")));
    // No namespace object delivered: the name label still protects it.
    e.apply_pod(&pod("kube-system", "coredns-1", &[("k8s-app", "kube-dns")]));
    e.apply_pod(&pod("shop", "web", &[("app", "web")]));
    let message = report(&reports, "enf").shard.message.unwrap_or_default();
    assert!(
        message.contains(
            "1 selected pod(s) in protected namespaces are not enforced (first: \
             kube-system/coredns-1; protected: krt, kube-system"
        ),
        "{message}"
    );
    assert!(
        !report(&reports, "mon")
            .shard
            .message
            .unwrap_or_default()
            .contains("protected"),
        "monitor policies observe protected pods as any other"
    );
    // The operator opted in: nothing is said.
    e.set_protected_namespaces(BTreeSet::new());
    let message = report(&reports, "enf").shard.message.unwrap_or_default();
    assert!(!message.contains("protected"), "{message}");
}

#[test]
fn a_policy_reading_data_with_nothing_to_fetch_it_says_it_needs_live_data() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "monitor", "evaluationInterval": "30s",
        "behaviors": [{"network": {"deny": {"expression":
            "resource.get('v1', 'configmaps', 'd', 'c').data.hosts.split(',')"}}}]}),
    ));
    let r = report(&reports, "p");
    let message = r.shard.message.unwrap_or_default();
    assert!(
        message.contains("evaluation failed: spec.behaviors[0].network.deny.expression: needs live data: resource.get(\"v1\", \"configmaps\", \"d\", \"c\")"),
        "{message}"
    );
    assert_eq!(r.shard.observation_available, Some(false));
    // Never evaluated successfully: no lastEvaluatedTime (issue 38: it
    // moved forward on every failed evaluation).
    assert_eq!(r.shard.last_evaluated_time, None);
}

#[test]
fn only_a_spec_change_recompiles_and_the_interval_schedules_reevaluation() {
    let (mut e, reports, _dir) = engine();
    let spec = serde_json::json!({"mode": "monitor", "evaluationInterval": "90s",
        "behaviors": [{"network": {"deny": {"values": ["10.0.0.0/8"]}}}]});
    e.apply_policy(&policy("p", 1, spec.clone()));
    let first = report(&reports, "p").shard.last_evaluated_time;
    let due = e
        .next_due()
        .unwrap_or_else(|| panic!("no re-evaluation scheduled"));
    let wait = due.saturating_duration_since(Instant::now());
    assert!(
        wait > Duration::from_secs(80) && wait <= Duration::from_secs(90),
        "{wait:?}"
    );
    // A status write bumps resourceVersion, not generation: no recompile.
    e.apply_policy(&policy("p", 1, spec.clone()));
    assert_eq!(e.next_due(), Some(due));
    // Not due yet: nothing happens.
    e.evaluate_due(Instant::now());
    assert_eq!(e.next_due(), Some(due));
    // Due: evaluated again and rescheduled.
    e.evaluate_due(due);
    assert!(e.next_due().is_some_and(|d| d > due));
    assert!(report(&reports, "p").shard.last_evaluated_time >= first);
    // A new generation recompiles (and a dropped interval unschedules).
    e.apply_policy(&policy(
        "p",
        2,
        serde_json::json!({"mode": "monitor",
        "behaviors": [{"network": {"deny": {"values": ["10.0.0.0/8"]}}}]}),
    ));
    assert_eq!(e.next_due(), None);
    e.delete_policy("p");
    assert!(reports.snapshot().is_empty());
}

/// An exec tracer gate that holds what it admitted and refuses the
/// cgroups it is told to.
#[derive(Default)]
struct FakeGate {
    held: std::sync::Mutex<BTreeSet<u64>>,
    refuse: std::sync::Mutex<BTreeSet<u64>>,
}

impl FakeGate {
    fn held(&self) -> BTreeSet<u64> {
        self.held.lock().unwrap_or_else(|e| panic!("{e}")).clone()
    }

    fn refuse(&self, ids: &[u64]) {
        *self.refuse.lock().unwrap_or_else(|e| panic!("{e}")) = ids.iter().copied().collect();
    }

    fn refused(&self, id: u64) -> Result<(), kyverno_runtime_bpf::exectrace::ExecTraceError> {
        if self
            .refuse
            .lock()
            .unwrap_or_else(|e| panic!("{e}"))
            .contains(&id)
        {
            // What a full gate map answers.
            return Err(kyverno_runtime_bpf::exectrace::ExecTraceError::InvalidCgroupId);
        }
        Ok(())
    }
}

impl ExecGate for FakeGate {
    fn admit(&self, cgroup: u64) -> Result<(), kyverno_runtime_bpf::exectrace::ExecTraceError> {
        self.refused(cgroup)?;
        self.held
            .lock()
            .unwrap_or_else(|e| panic!("{e}"))
            .insert(cgroup);
        Ok(())
    }

    fn revoke(&self, cgroup: u64) -> Result<bool, kyverno_runtime_bpf::exectrace::ExecTraceError> {
        self.refused(cgroup)?;
        Ok(self
            .held
            .lock()
            .unwrap_or_else(|e| panic!("{e}"))
            .remove(&cgroup))
    }
}

/// A running pod of this node whose containers have cgroups `ids`.
fn pod_with_cgroups(e: &mut Engine, ns: &str, name: &str, labels: &[(&str, &str)], ids: &[u64]) {
    let uid = format!("uid-{name}");
    let containers: Vec<kyverno_runtime_enforce::egress::ContainerCgroup> = ids
        .iter()
        .map(|id| kyverno_runtime_enforce::egress::ContainerCgroup {
            id: *id,
            path: format!("/sys/fs/cgroup/{id}").into(),
        })
        .collect();
    e.pods.insert(
        uid.clone(),
        PodState {
            namespace: ns.into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            owner: None,
            node_name: String::new(),
            service_account: String::new(),
            container_ids: BTreeMap::new(),
            cgroups: PodCgroups {
                names: ids.iter().map(|id| (*id, format!("c{id}"))).collect(),
                containers,
                ..PodCgroups::default()
            },
        },
    );
    e.observe_pod(&uid);
}

fn gate_failures(e: &Engine, operation: &str) -> u64 {
    let text = e.metrics.encode();
    text.lines()
        .find(|l| {
            l.starts_with("nirmata_runtime_exec_trace_gate_failures_total")
                && l.contains(&format!("operation=\"{operation}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The exec tracer available and a monitor exec policy selecting
/// `app: web` in namespace `a`: a pod's cgroups programmed for it are the
/// ones the (fake) gate holds.
fn watch_exec_of_web(e: &mut Engine) {
    e.plane
        .parts
        .sources
        .set(EXEC_TRACE_SOURCE, SourceState::Available);
    e.apply_namespace(&namespace("a", &[]));
    e.apply_policy(&policy(
        "watch-exec",
        1,
        serde_json::json!({"mode": "monitor", "podSelector": {"matchLabels": {"app": "web"}},
        "behaviors": [{"exec": {"deny": {"values": ["/bin/sh"]}}}]}),
    ));
}

#[test]
fn a_cgroup_is_traced_only_once_its_admit_succeeded_and_a_failure_is_retried() {
    let gate = Arc::new(FakeGate::default());
    let (mut e, _reports, _dir) = engine_with(Some(gate.clone()));
    watch_exec_of_web(&mut e);
    // The gate refuses one of the pod's two cgroups (a full map).
    gate.refuse(&[12]);
    pod_with_cgroups(&mut e, "a", "web", &[("app", "web")], &[11, 12]);
    assert_eq!(gate.held(), BTreeSet::from([11]));
    assert!(e.traced(11));
    assert!(
        !e.traced(12),
        "a cgroup the gate refused is not traced: its execs must come from the counters"
    );
    assert_eq!(gate_failures(&e, "admit"), 1);
    let retry = e
        .next_due()
        .unwrap_or_else(|| panic!("no retry scheduled for the refused admit"));

    // Still refused at the retry: counted again, the wait doubles.
    e.evaluate_due(retry);
    assert_eq!(gate_failures(&e, "admit"), 2);
    let again = e.next_due().unwrap_or_else(|| panic!("no second retry"));
    let wait = again.saturating_duration_since(Instant::now());
    assert!(
        wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2),
        "{wait:?}"
    );

    // The gate has room again: the retry admits it, and nothing is due.
    gate.refuse(&[]);
    e.evaluate_due(again);
    assert_eq!(gate.held(), BTreeSet::from([11, 12]));
    assert!(e.traced(12));
    assert_eq!(e.next_due(), None);
    assert_eq!(gate_failures(&e, "admit"), 2);

    // A revoke that fails leaves the cgroup traced (the kernel still
    // reports it) and is retried too.
    gate.refuse(&[11]);
    e.delete_policy("watch-exec");
    assert_eq!(gate.held(), BTreeSet::from([11]));
    assert!(e.traced(11));
    assert!(!e.traced(12));
    assert_eq!(gate_failures(&e, "revoke"), 1);
    let retry = e
        .next_due()
        .unwrap_or_else(|| panic!("no retry of the revoke"));
    gate.refuse(&[]);
    e.evaluate_due(retry);
    assert!(gate.held().is_empty());
    assert!(!e.traced(11));
    assert_eq!(e.next_due(), None);
}

fn spec_condition(r: &NodeReport, type_: &str) -> Option<(String, String, String)> {
    r.spec_conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// TargetsValid, ExecRulesValid and OpenRulesValid: each present only
/// for a policy with that behavior, False naming the values no backend
/// can program, True once every value is; and on a node that cannot
/// serve the behavior (every backend unavailable here) the same answer
/// as on one that can, since every node writes them verbatim.
#[test]
fn the_spec_conditions_name_the_values_that_cannot_be_programmed() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "enforce", "podSelector": {},
        "behaviors": [
            {"network": {"deny": {"expression": "['10.0.0.300', '10.0.0.1']"}}},
            {"exec": {"deny": {"expression": "['bin/sh', '/bin/sh']"}}},
            {"open": {"deny": {"values": ["/etc/shadow"]}}}
        ]}),
    ));
    let r = report(&reports, "p");
    let (status, reason, message) = spec_condition(&r, types::TARGETS_VALID)
        .unwrap_or_else(|| panic!("no TargetsValid: {:?}", r.spec_conditions));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ValuesRejected")
    );
    assert!(
        message.starts_with("1 value(s) not programmed: spec.behaviors[0].network.deny")
            && message.contains("10.0.0.300"),
        "{message}"
    );
    let (status, _, message) = spec_condition(&r, types::EXEC_RULES_VALID)
        .unwrap_or_else(|| panic!("no ExecRulesValid: {:?}", r.spec_conditions));
    assert_eq!(status, "False");
    assert!(
        message.contains("spec.behaviors[1].exec.deny") && message.contains("bin/sh"),
        "{message}"
    );
    let (status, reason, message) = spec_condition(&r, types::OPEN_RULES_VALID)
        .unwrap_or_else(|| panic!("no OpenRulesValid: {:?}", r.spec_conditions));
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        ("True", "Valid", "every open value is programmed")
    );

    // Fixed, and without an open behavior: the other two True, no
    // OpenRulesValid at all.
    e.apply_policy(&policy(
        "p",
        2,
        serde_json::json!({"mode": "enforce", "podSelector": {},
        "behaviors": [
            {"network": {"deny": {"expression": "['10.0.0.1']"}}},
            {"exec": {"deny": {"expression": "['/bin/sh']"}}}
        ]}),
    ));
    let r = report(&reports, "p");
    assert_eq!(
        spec_condition(&r, types::TARGETS_VALID),
        Some((
            "True".into(),
            "Valid".into(),
            "every target value is programmed".into()
        ))
    );
    assert_eq!(
        spec_condition(&r, types::EXEC_RULES_VALID).map(|c| c.0),
        Some("True".into())
    );
    assert_eq!(spec_condition(&r, types::OPEN_RULES_VALID), None);
    // TargetsValid covers protocol and dns values too.
    e.apply_policy(&policy(
        "q",
        1,
        serde_json::json!({"mode": "monitor", "podSelector": {},
        "behaviors": [{"dns": {"deny": {"expression": "['bad..name']"}}}]}),
    ));
    let r = report(&reports, "q");
    let (status, _, message) = spec_condition(&r, types::TARGETS_VALID)
        .unwrap_or_else(|| panic!("no TargetsValid: {:?}", r.spec_conditions));
    assert_eq!(status, "False", "{message}");
    assert!(message.contains("bad..name"), "{message}");
    assert_eq!(spec_condition(&r, types::EXEC_RULES_VALID), None);
}

/// Issue 38, point 3: the spec-level conditions are written cluster-wide,
/// so what only this node's managers refuse (a domain where the DNS answer
/// snooper failed to load) is not in them: it is this node's failure, in
/// its shard. A value refused everywhere stays in the condition alone.
#[test]
fn what_only_this_node_refuses_is_the_nodes_to_say() {
    let everywhere = Rejections {
        network: vec!["spec.behaviors[0].network.deny: \"10.0.0.300\": not an address".into()],
        ..Rejections::default()
    };
    let here = Rejections {
        network: vec![
            "spec.behaviors[0].network.deny: \"10.0.0.300\": not an address".into(),
            "spec.behaviors[0].network.deny: \"example.com\": domains cannot be served here: the DNS answer snooper did not load".into(),
        ],
        ..Rejections::default()
    };
    assert_eq!(
        policies::refused_only_here(&here, &everywhere),
        ["not programmable on this node: spec.behaviors[0].network.deny: \"example.com\": domains cannot be served here: the DNS answer snooper did not load"]
    );

    // A domain is a valid target: on a node with no egress backend at all,
    // TargetsValid says so (it is the same on every node), and the node's
    // own gap is in its shard.
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "d",
        1,
        serde_json::json!({"mode": "enforce", "podSelector": {},
        "behaviors": [{"network": {"deny": {"values": ["example.com", "10.0.0.1"]}}}]}),
    ));
    let r = report(&reports, "d");
    assert_eq!(
        spec_condition(&r, types::TARGETS_VALID),
        Some((
            "True".into(),
            "Valid".into(),
            "every target value is programmed".into()
        ))
    );
    assert_eq!(r.shard.enforcement_available, Some(false));
    assert_eq!(r.shard.observed_generation, Some(1));
    assert_eq!(r.uid.as_deref(), Some("uid-d"));
}

#[test]
fn a_deployments_pod_is_attributed_to_the_deployment() {
    let (mut e, _reports, _dir) = engine();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-5d9c8-x", "namespace": "a", "uid": "uid-web",
                     "labels": {"app": "web", "pod-template-hash": "5d9c8"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                         "name": "web-5d9c8", "uid": "rs", "controller": true}]},
        "spec": {"nodeName": "node-1", "serviceAccountName": "web-sa",
                 "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": "x",
            "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://4f1c"}]}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    e.apply_pod(&pod);
    let indexed = e
        .plane
        .parts
        .index
        .by_uid("uid-web")
        .unwrap_or_else(|| panic!("the pod is not indexed"));
    assert_eq!(
        (indexed.owner_kind.as_deref(), indexed.owner_name.as_deref()),
        (Some("Deployment"), Some("web"))
    );
    // What a monitorFilter's `event.pod` reads besides (the Go original's
    // fields), from the pod watch alone.
    assert_eq!(
        (indexed.node_name.as_str(), indexed.service_account.as_str()),
        ("node-1", "web-sa")
    );
    assert_eq!(
        indexed.container_ids.get("app").map(String::as_str),
        Some("containerd://4f1c")
    );
}

/// A value accepted but unable to match as written is named in the
/// spec condition of its behavior (status stays True: it is programmed).
#[test]
fn a_value_that_cannot_match_is_a_warning_in_its_condition() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "monitor",
        "behaviors": [
            {"exec": {"deny": {"values": ["/bin/sh", "/proc/self/exe"]}}},
            {"network": {"deny": {"values": ["10.0.0.1/8"]}}},
            {"open": {"deny": {"values": ["/etc/shadow"]}}}]}),
    ));
    let r = report(&reports, "p");
    let condition = |t: &str| {
        r.spec_conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
            .unwrap_or_else(|| panic!("no {t}: {:?}", r.spec_conditions))
    };
    assert_eq!(
        condition(types::EXEC_RULES_VALID),
        (
            "True".into(),
            "ValidWithWarnings".into(),
            "every exec value is programmed; 1 warning(s): spec.behaviors[0].exec.deny: \"/proc/self/exe\" goes through /proc/self, a link the kernel resolves before the exec or open hook sees the path (the hook compares the file's resolved path), so it never matches: name the file it leads to".into()
        )
    );
    let (status, reason, message) = condition(types::TARGETS_VALID);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ValidWithWarnings")
    );
    assert!(
        message.contains("\"10.0.0.1/8\" has host bits set: it is the network 10.0.0.0/8"),
        "{message}"
    );
    assert_eq!(
        condition(types::OPEN_RULES_VALID),
        (
            "True".into(),
            "Valid".into(),
            "every open value is programmed".into()
        )
    );
}

/// The network and exec lists in force, with their generations.
fn in_force(e: &Engine, name: &str) -> Vec<(String, Vec<String>, Option<i64>)> {
    let f = e.policies[name]
        .in_force
        .as_ref()
        .unwrap_or_else(|| panic!("nothing in force for {name}"));
    f.result
        .behaviors
        .iter()
        .zip(&f.generations)
        .map(|(b, g)| (b.kind.to_string(), b.deny.clone(), *g))
        .collect()
}

fn selects(e: &Engine, name: &str, app: &str) -> bool {
    e.policies[name]
        .target()
        .is_some_and(|t| t.matches(&BTreeMap::new(), &[("app".into(), app.into())].into()))
}

#[test]
fn a_failed_edit_takes_its_mode_and_selector_and_keeps_the_last_good_lists() {
    let (mut e, reports, _dir) = engine();
    let monitor = e.plane.parts.monitor.clone();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "enforce", "podSelector": {"matchLabels": {"app": "a"}},
        "behaviors": [{"network": {"deny": {"values": ["10.0.0.9"]}}},
                      {"exec": {"deny": {"values": ["/bin/sh"]}}}]}),
    ));
    let v = |s: &str| vec![s.to_string()];
    assert_eq!(
        in_force(&e, "p"),
        [
            ("network".into(), v("10.0.0.9"), Some(1)),
            ("exec".into(), v("/bin/sh"), Some(1))
        ]
    );

    // The operator's lever: monitor, another selector, and a network deny
    // that fails at run time; the exec list changes and evaluates.
    e.apply_policy(&policy(
        "p",
        2,
        serde_json::json!({"mode": "monitor", "podSelector": {"matchLabels": {"app": "b"}},
        "behaviors": [{"network": {"deny": {"expression": "[string(int('x'))]"}}},
                      {"exec": {"deny": {"values": ["/bin/bash"]}}}]}),
    ));
    assert_eq!(e.policies["p"].mode, Some(RuntimePolicyMode::Monitor));
    assert!(selects(&e, "p", "b") && !selects(&e, "p", "a"));
    assert_eq!(
        in_force(&e, "p"),
        [
            ("network".into(), v("10.0.0.9"), Some(1)),
            ("exec".into(), v("/bin/bash"), Some(2))
        ]
    );
    assert_eq!(monitor.policy_count(), 1, "the monitor keeps judging by it");
    let r = report(&reports, "p");
    let message = r.shard.message.unwrap_or_default();
    assert!(
        message.contains("evaluation failed: spec.behaviors[0].network.deny.expression")
            && message.contains(
                "the last good lists stay in force for spec.behaviors[0].network (generation 1)"
            )
            && !message.contains("exec (generation"),
        "{message}"
    );
    assert_eq!(r.shard.observation_available, Some(false));

    // A spec that does not compile: its mode and selector still apply.
    e.apply_policy(&policy(
        "p",
        3,
        serde_json::json!({"mode": "enforce", "podSelector": {"matchLabels": {"app": "c"}},
        "behaviors": [{"network": {"deny": {"expression": "1 + 2"}}}]}),
    ));
    assert_eq!(e.policies["p"].mode, Some(RuntimePolicyMode::Enforce));
    assert!(selects(&e, "p", "c") && !selects(&e, "p", "b"));
    assert_eq!(
        in_force(&e, "p"),
        [
            ("network".into(), v("10.0.0.9"), Some(1)),
            ("exec".into(), v("/bin/bash"), Some(2))
        ]
    );
    let r = report(&reports, "p");
    assert!(r.compile_error.is_some());
    assert_eq!(
        r.shard.message.as_deref(),
        Some("the spec did not compile; the last good lists stay in force for spec.behaviors[0].network (generation 1); spec.behaviors[1].exec (generation 2)")
    );
    assert_eq!(monitor.policy_count(), 1);

    // A good edit replaces everything; behaviors it dropped go.
    e.apply_policy(&policy(
        "p",
        4,
        serde_json::json!({"mode": "enforce", "podSelector": {"matchLabels": {"app": "c"}},
        "behaviors": [{"network": {"deny": {"values": ["10.0.0.10"]}}}]}),
    ));
    assert_eq!(
        in_force(&e, "p"),
        [("network".into(), v("10.0.0.10"), Some(4))]
    );
    let r = report(&reports, "p");
    assert!(r.compile_error.is_none());
    assert!(
        !r.shard.message.unwrap_or_default().contains("in force"),
        "nothing stale"
    );

    // An edit whose data cannot be had (no fetcher here: the expression
    // needs live data), to monitor: generation 4's list stays, under the
    // new mode.
    e.apply_policy(&policy(
        "p",
        5,
        serde_json::json!({"mode": "monitor", "podSelector": {"matchLabels": {"app": "c"}},
        "behaviors": [{"network": {"deny": {"expression":
            "resource.get('v1', 'configmaps', 'd', 'c').data.hosts.split(',')"}}}]}),
    ));
    assert_eq!(e.policies["p"].mode, Some(RuntimePolicyMode::Monitor));
    assert_eq!(
        in_force(&e, "p"),
        [("network".into(), v("10.0.0.10"), Some(4))]
    );
    let message = report(&reports, "p").shard.message.unwrap_or_default();
    assert!(
        message.contains("needs live data")
            && message.contains(
                "the last good lists stay in force for spec.behaviors[0].network (generation 4)"
            ),
        "{message}"
    );
}

#[test]
fn a_policy_that_never_evaluated_in_full_puts_nothing_in_force() {
    let (mut e, reports, _dir) = engine();
    e.apply_policy(&policy(
        "p",
        1,
        serde_json::json!({"mode": "enforce",
        "behaviors": [{"network": {"deny": {"expression": "[string(int('x'))]"}}},
                      {"exec": {"deny": {"values": ["/bin/sh"]}}}]}),
    ));
    // Half of a policy can allow what its other half denies: nothing of
    // it is programmed, and it is pending (a restart keeps its pins).
    assert!(e.policies["p"].in_force.is_none());
    assert_eq!(e.pending_policies().len(), 1);
    let message = report(&reports, "p").shard.message.unwrap_or_default();
    assert!(
        message.contains("evaluation failed: spec.behaviors[0].network.deny.expression")
            && !message.contains("in force"),
        "{message}"
    );
}

#[test]
fn a_batch_defers_the_reports_to_its_end_and_ends_in_the_same_state() {
    // Batched: a relist of many pods rebuilds every policy's report once,
    // at the end, and what it says is what the same events unbatched say.
    let events = |e: &mut Engine| {
        e.apply_namespace(&namespace("a", &[("team", "x")]));
        e.apply_policy(&policy(
            "p",
            1,
            serde_json::json!({"mode": "monitor", "podSelector": {"matchLabels": {"app": "web"}},
            "behaviors": [{"network": {"deny": {"values": ["10.0.0.0/8"]}}}]}),
        ));
        e.apply_pod(&pod("a", "web", &[("app", "web")]));
        e.apply_pod(&pod("a", "db", &[("app", "db")]));
        e.delete_pod("uid-db");
    };
    let (mut plain, plain_reports, _d1) = engine();
    events(&mut plain);
    let (mut batched, batched_reports, _d2) = engine();
    batched.begin_batch();
    events(&mut batched);
    // Nothing rebuilt inside the batch.
    assert!(batched_reports.snapshot().is_empty());
    batched.end_batch();
    let (mut a, mut b) = (report(&plain_reports, "p"), report(&batched_reports, "p"));
    // The two engines evaluated at different instants.
    assert!(a.shard.last_evaluated_time.is_some() && b.shard.last_evaluated_time.is_some());
    (a.shard.last_evaluated_time, b.shard.last_evaluated_time) = (None, None);
    assert_eq!(b.shard.pods_matched, Some(true));
    assert_eq!(a.shard, b.shard);
    assert_eq!(a.active_behaviors, b.active_behaviors);
    // And outside a batch, every event rebuilds at once again.
    batched.apply_pod(&pod("a", "web", &[("app", "other")]));
    assert_eq!(
        report(&batched_reports, "p").shard.pods_matched,
        Some(false)
    );
}

/// The NRI plugin's start: a Pending pod's container, which its status
/// does not name yet, is resolved (the real resolver, over a scratch
/// hierarchy) and programmed (here: admitted to the exec tracer's gate)
/// when the runtime announces it; a status still without it keeps it, the
/// status naming it takes over, and the runtime's stop ends it.
#[test]
fn a_container_the_runtime_starts_is_programmed_before_its_status_names_it() {
    let gate = Arc::new(FakeGate::default());
    let (mut e, _reports, dir) = engine_with(Some(gate.clone()));
    e.resolver = CgroupResolver::v2_at(dir.path().to_path_buf());
    e.enable_runtime_hook();
    watch_exec_of_web(&mut e);
    let uid = "0b5c7d7e-1f1a-4f4e-9a55-2d7f1c0a9e11";
    let id = "ab".repeat(32);
    let mut pending = pod("a", "web", &[("app", "web")]);
    pending.metadata.uid = Some(uid.to_string());
    if let Some(status) = pending.status.as_mut() {
        status.phase = Some("Pending".to_string());
    }
    e.apply_pod(&pending);
    assert!(
        !e.pod_known(uid),
        "a Pending pod is not handed to the managers"
    );

    // The runtime created the container (its cgroup exists) and announces it.
    let cgroup = dir
        .path()
        .join(format!("kubepods/besteffort/pod{uid}/{id}"));
    std::fs::create_dir_all(&cgroup).unwrap_or_else(|e| panic!("{e}"));
    let ino = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(&cgroup).unwrap_or_else(|e| panic!("{e}")),
    );
    let container = kyverno_runtime_nri::Container {
        runtime: "containerd".into(),
        pod_uid: uid.into(),
        pod_namespace: "a".into(),
        pod_name: "web".into(),
        name: "main".into(),
        id: id.clone(),
    };
    assert!(e.container_started(&container));
    assert!(e.pod_known(uid));
    assert_eq!(
        gate.held(),
        BTreeSet::from([ino]),
        "programmed at the start"
    );

    // The kubelet's next status, still without the container: kept.
    e.apply_pod(&pending);
    assert_eq!(gate.held(), BTreeSet::from([ino]));

    // The status naming it: the same cgroup, nothing changes.
    let mut running: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "a", "uid": uid, "labels": {"app": "web"}},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "containerID": format!("containerd://{id}"), "image": "", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {}}}]}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    e.apply_pod(&running);
    assert_eq!(gate.held(), BTreeSet::from([ino]));

    // The runtime's stop of a container the status names running changes
    // nothing (the status speaks for it); once the status says so too, the
    // pod is no longer running.
    e.container_stopped(&container);
    assert_eq!(gate.held(), BTreeSet::from([ino]));
    if let Some(status) = running.status.as_mut() {
        status.phase = Some("Succeeded".to_string());
    }
    e.apply_pod(&running);
    assert!(gate.held().is_empty());
    assert!(!e.pod_known(uid));
}

fn with_phase(mut p: Pod, phase: &str) -> Pod {
    if let Some(status) = p.status.as_mut() {
        status.phase = Some(phase.to_string());
    }
    p
}

fn openexec_cgroups(e: &Engine, uid: &str) -> Option<Vec<u64>> {
    e.manager_pods(uid).map(|p| p.openexec.cgroups)
}

#[test]
fn a_pod_directory_binds_its_pod_to_open_exec_while_no_runtime_hook_announces_containers() {
    let (mut e, _reports, _dir) = engine();
    e.enable_pod_cgroup_fallback();
    assert!(e.pod_cgroup_fallback_active());
    let pending = with_phase(pod("a", "web", &[("app", "web")]), "Pending");
    e.apply_pod(&pending);
    assert!(
        !e.pod_known("uid-web"),
        "a Pending pod without its directory is not on the node yet"
    );

    // The kubelet creates the pod's directory: nothing yet, until the
    // sandbox's directory (the first in it) is known and exempt; then the
    // pod is taken, its directory bound to open/exec, and named in
    // attribution; the network backends (attached per container) are not
    // given it.
    e.pod_cgroup_appeared("uid-web", 4242);
    assert!(!e.pod_known("uid-web"));
    e.pod_dir_child_appeared("uid-web", 5000);
    assert!(e.pod_known("uid-web"));
    // A container's directory after it: no change.
    e.pod_dir_child_appeared("uid-web", 5001);
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![4242]));
    assert_eq!(
        e.manager_pods("uid-web").map(|p| p.egress.cgroups.len()),
        Some(0)
    );

    // A runtime hook registers: it announces containers itself, so
    // directories are not bound and a Pending pod is not on the node.
    e.runtime_synchronized(&[]);
    assert!(!e.pod_cgroup_fallback_active());
    assert!(!e.pod_known("uid-web"));
    // ... and lost again: bound again.
    e.runtime_disconnected();
    assert!(e.pod_known("uid-web"));
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![4242]));

    // Running (its containers not resolvable in this tree): still bound
    // through the directory; the directory gone: no longer.
    e.apply_pod(&pod("a", "web", &[("app", "web")]));
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![4242]));
    // The sandbox gone: unbound, and a directory appearing beside the
    // remaining container's is not taken for a sandbox.
    e.pod_dir_child_removed("uid-web", 5000);
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![]));
    e.pod_dir_child_appeared("uid-web", 5002);
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![]));
    // Emptied, a new sandbox binds it again; the directory gone, unbound.
    e.pod_dir_child_removed("uid-web", 5001);
    e.pod_dir_child_removed("uid-web", 5002);
    e.pod_dir_child_appeared("uid-web", 5003);
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![4242]));
    e.pod_cgroup_removed("uid-web");
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![]));

    // A finished pod whose directory is still there is not on the node.
    e.pod_cgroup_appeared("uid-done", 7);
    e.pod_dir_child_appeared("uid-done", 8);
    e.apply_pod(&with_phase(pod("a", "done", &[]), "Succeeded"));
    assert!(!e.pod_known("uid-done"));

    // The watcher's full read replaces what was known; a deleted Pending
    // pod is forgotten.
    let other = with_phase(pod("a", "next", &[]), "Pending");
    e.apply_pod(&other);
    let scanned = |id, children: &[u64]| ScannedPodDir {
        id,
        children: children.to_vec(),
    };
    e.pod_cgroups_scanned(BTreeMap::from([(
        "uid-next".to_string(),
        scanned(9, &[11, 12]),
    )]));
    assert_eq!(openexec_cgroups(&e, "uid-next"), Some(vec![9]));
    // Read again without its sandbox's directory (an empty one): unbound.
    e.pod_cgroups_scanned(BTreeMap::from([("uid-next".to_string(), scanned(9, &[]))]));
    assert!(!e.pod_known("uid-next"));
    e.pod_cgroups_scanned(BTreeMap::from([(
        "uid-next".to_string(),
        scanned(9, &[11]),
    )]));
    e.delete_pod("uid-next");
    assert!(!e.pod_known("uid-next"));
    e.pod_cgroup_appeared("uid-next", 10);
    e.pod_dir_child_appeared("uid-next", 13);
    assert!(!e.pod_known("uid-next"), "a deleted pod is not taken again");
}

#[test]
fn without_the_fallback_a_pod_directory_binds_nothing() {
    let (mut e, _reports, _dir) = engine();
    assert!(!e.pod_cgroup_fallback_active());
    e.apply_pod(&with_phase(pod("a", "web", &[]), "Pending"));
    e.pod_cgroup_appeared("uid-web", 4242);
    e.pod_dir_child_appeared("uid-web", 5000);
    assert!(!e.pod_known("uid-web"));
    e.apply_pod(&pod("a", "web", &[]));
    assert_eq!(openexec_cgroups(&e, "uid-web"), Some(vec![]));
}
