//! Tier 3: the Events recorder against a real kube-apiserver and etcd.
//!
//! An enforced finding becomes a `PolicyViolation` Event regarding its pod,
//! a monitor-mode one `PolicyWouldViolate`, and `Applied` going `False` a
//! `PolicyError` regarding the policy in `default`; other condition changes
//! become nothing. A repeat of the same finding, or one of the same policy
//! on the same pod with another target, adds to its Event's series instead
//! of creating another object (one Event per object and reason), while
//! another reason gets its own; the same holds for a repeated policy error
//! and a changed one. A password and a bearer token in a target, or a token
//! in a condition message, never reach the stored Event, and a policy's
//! Event in `default` names no pod of another namespace.
//!
//! Each test recreates its pod (a new uid) and tells its Events apart by the
//! uid they regard, so Events left by earlier runs (they live an hour) do
//! not count. There is no kube-controller-manager here, so the namespace's
//! `default` ServiceAccount, which pod admission requires, is created by
//! hand.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kyverno_runtime_events::{
    condition_event_name, finding_event_name, is_valid_event_name, Budget, DropReason, Recorder,
    RecorderHandle, RecorderOptions, WriteFailure, WriteResult, REASON_ERROR, REASON_VIOLATION,
    REASON_WOULD_VIOLATE, REPORTING_CONTROLLER,
};
use kyverno_runtime_metrics::Metrics;
use kyverno_runtime_report::{Behavior, Decision, Finding, PodIdentity};
use kyverno_runtime_status::PolicyRef;
use kyverno_runtime_testkube::LocalCluster;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::oneshot;

const NS: &str = "kyverno-runtime-events-test";
const NODE: &str = "events-test-node";

async fn config() -> kube::Config {
    let cluster = LocalCluster::get().expect("local control plane (ci/kube-up)");
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

async fn client() -> kube::Client {
    kube::Client::try_from(config().await).unwrap()
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) {
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("{e}"),
    }
}

fn ignore_conflict<T>(r: Result<T, kube::Error>) {
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
}

/// A fresh Pod object (new uid) in [`NS`].
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
        "metadata": {"name": name},
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

fn finding(pod: &PodIdentity, policy: &str, target: &str, enforced: bool) -> Finding {
    let now = SystemTime::now();
    Finding {
        policy: policy.into(),
        policy_uid: "11111111-2222-3333-4444-555555555555".into(),
        behavior: Behavior::Exec,
        pod: pod.clone(),
        target: target.into(),
        enforced,
        decision: enforced.then_some(Decision::Denied),
        count: 1,
        first_observed: now - Duration::from_secs(5),
        last_observed: now,
        process: None,
        matched: Vec::new(),
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }
}

/// A recorder running in the background, and what it wrote.
struct Running {
    handle: RecorderHandle,
    writes: Arc<Mutex<Vec<WriteResult>>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    async fn start() -> Running {
        Self::start_with(client().await, RecorderOptions::new(NODE)).await
    }

    /// A recorder writing through `client` with `options` (its `on_write`
    /// replaced by the one collecting [`Running::next_writes`]).
    async fn start_with(client: kube::Client, options: RecorderOptions) -> Running {
        let writes: Arc<Mutex<Vec<WriteResult>>> = Arc::default();
        let seen = Arc::clone(&writes);
        let options = RecorderOptions {
            on_write: Some(Arc::new(move |r| seen.lock().unwrap().push(r))),
            ..options
        };
        let recorder = Recorder::new(client, options);
        let handle = recorder.handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(recorder.run(async {
            let _ = stopped.await;
        }));
        Running {
            handle,
            writes,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits for the next `n` write outcomes and returns them.
    async fn next_writes(&self, n: usize) -> Vec<WriteResult> {
        for _ in 0..300 {
            {
                let mut writes = self.writes.lock().unwrap();
                if writes.len() >= n {
                    return writes.drain(..n).collect();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{n} writes expected, saw {:?}", self.writes.lock().unwrap());
    }

    async fn stop(self) {
        self.stop_dropping(0).await;
    }

    /// Stops, expecting `dropped` causes to have been dropped.
    async fn stop_dropping(mut self, dropped: u64) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.task.take().unwrap())
            .await
            .expect("run returns within its deadline")
            .unwrap();
        assert!(
            self.writes.lock().unwrap().is_empty(),
            "no write beyond those awaited"
        );
        assert_eq!(self.handle.dropped(), dropped);
    }
}

/// The Events in `namespace` regarding the object with `uid`.
async fn events_regarding(client: &kube::Client, namespace: &str, uid: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut events: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
        .collect();
    events.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    events
}

fn series_count(e: &Event) -> i32 {
    e.series.as_ref().map_or(1, |s| s.count)
}

/// The stored Event as the API server returns it, as text.
async fn raw_event(client: &kube::Client, namespace: &str, name: &str) -> String {
    let path = format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}");
    client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn reasons_follow_enforcement_and_policy_errors() {
    let client = client().await;
    let pod = fresh_pod(&client, "reasons-web").await;
    let running = Running::start().await;

    let enforced = finding(&pod, "no-shell", "/bin/sh", true);
    let monitored = finding(&pod, "watch-shell", "/bin/sh", false);
    running.handle.finding_flushed(&enforced, 1);
    running.handle.finding_flushed(&monitored, 2);
    // The policy's uid is fresh per run: the pod's.
    let policy = PolicyRef {
        name: "events-test-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    let failed = condition("Applied", "False", "CompileFailed", "undeclared reference");
    running.handle.condition_changed(&policy, &failed);
    // Not policy errors: nothing is written for them.
    for c in [
        condition("Applied", "True", "Applied", "in force"),
        condition("PodsMatched", "False", "NoPods", "no pod matches"),
        condition("TargetsValid", "Unknown", "Pending", ""),
    ] {
        running.handle.condition_changed(&policy, &c);
    }
    assert_eq!(running.next_writes(3).await, [WriteResult::Created; 3]);

    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    for (f, reason, action) in [
        (&enforced, REASON_VIOLATION, "Enforce"),
        (&monitored, REASON_WOULD_VIOLATE, "Observe"),
    ] {
        let name = finding_event_name(f).unwrap();
        assert!(is_valid_event_name(&name), "{name}");
        let e = events
            .iter()
            .find(|e| e.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no Event {name}"));
        assert_eq!(e.reason.as_deref(), Some(reason));
        assert_eq!(e.action.as_deref(), Some(action));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some(REPORTING_CONTROLLER)
        );
        assert_eq!(e.reporting_instance.as_deref(), Some(NODE));
        let regarding = e.regarding.as_ref().unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.name.as_deref(), Some("reasons-web"));
        assert_eq!(
            regarding.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        let related = e.related.as_ref().unwrap();
        assert_eq!(related.kind.as_deref(), Some("RuntimePolicy"));
        assert_eq!(related.name.as_deref(), Some(f.policy.as_str()));
        assert!(e.note.as_ref().unwrap().contains("/bin/sh"));
    }
    let monitored_event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON_WOULD_VIOLATE))
        .unwrap();
    assert_eq!(series_count(monitored_event), 2, "created with its count");

    let errors = events_regarding(&client, "default", &pod.uid).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!(
        e.metadata.name,
        condition_event_name(&policy, &failed),
        "the name is the cause's"
    );
    assert_eq!(e.reason.as_deref(), Some(REASON_ERROR));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    let regarding = e.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("RuntimePolicy"));
    assert_eq!(regarding.name.as_deref(), Some("events-test-policy"));
    assert_eq!(
        e.note.as_deref(),
        Some("Applied is False: CompileFailed: undeclared reference")
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repeat_or_another_target_adds_to_the_series_and_another_reason_is_another_event() {
    let client = client().await;
    let pod = fresh_pod(&client, "series-web").await;
    let running = Running::start().await;

    let sh = finding(&pod, "no-shell", "/bin/sh", true);
    running.handle.finding_flushed(&sh, 1);
    assert_eq!(running.next_writes(1).await, [WriteResult::Created]);
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 1);
    assert_eq!(series_count(&events[0]), 1);
    assert!(events[0].series.is_none());

    // The same finding on the next flushes: the same object, counting.
    let mut later = sh.clone();
    later.last_observed = SystemTime::now() + Duration::from_secs(10);
    running.handle.finding_flushed(&later, 3);
    assert_eq!(running.next_writes(1).await, [WriteResult::Patched]);
    running.handle.finding_flushed(&later, 1);
    assert_eq!(running.next_writes(1).await, [WriteResult::Patched]);
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let series = events[0].series.as_ref().unwrap();
    assert_eq!(series.count, 5, "1 + 3 + 1 occurrences");
    // Stored to the microsecond: compare seconds.
    let want = Timestamp::try_from(later.last_observed).unwrap();
    assert!(series.last_observed_time.0.as_second() >= want.as_second());

    // A finding that differs only in its target: the same object and
    // reason, so the same Event; monitor mode is another reason.
    let bash = finding(&pod, "no-shell", "/bin/bash", true);
    running.handle.finding_flushed(&bash, 1);
    assert_eq!(running.next_writes(1).await, [WriteResult::Patched]);
    let watched = finding(&pod, "no-shell", "/bin/bash", false);
    running.handle.finding_flushed(&watched, 1);
    assert_eq!(running.next_writes(1).await, [WriteResult::Created]);
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let names: Vec<_> = events.iter().map(|e| e.metadata.name.clone()).collect();
    assert_eq!(finding_event_name(&sh), finding_event_name(&bash));
    assert!(names.contains(&finding_event_name(&sh)));
    assert!(names.contains(&finding_event_name(&watched)));
    let sh_event = events
        .iter()
        .find(|e| e.metadata.name == finding_event_name(&sh))
        .unwrap();
    assert_eq!(series_count(sh_event), 6);

    // A policy error that fires again adds to its series, and so does a
    // changed message.
    let policy = PolicyRef {
        name: "events-series-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    let rejected = condition("TargetsValid", "False", "RejectedTarget", "::1: IPv6");
    running.handle.condition_changed(&policy, &rejected);
    running.handle.condition_changed(&policy, &rejected);
    assert_eq!(
        running.next_writes(2).await,
        [WriteResult::Created, WriteResult::Patched]
    );
    let errors = events_regarding(&client, "default", &pod.uid).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(series_count(&errors[0]), 2);
    let changed = condition(
        "TargetsValid",
        "False",
        "RejectedTarget",
        "10.0.0.0/8: too wide",
    );
    running.handle.condition_changed(&policy, &changed);
    assert_eq!(running.next_writes(1).await, [WriteResult::Patched]);
    let errors = events_regarding(&client, "default", &pod.uid).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(series_count(&errors[0]), 3);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_never_reach_an_event() {
    let client = client().await;
    let pod = fresh_pod(&client, "secret-web").await;
    let running = Running::start().await;

    let f = finding(
        &pod,
        "no-mysql",
        "/usr/bin/mysql --password=hunter2 -e 'Authorization: Bearer abc.def.ghi'",
        false,
    );
    running.handle.finding_flushed(&f, 1);
    let policy = PolicyRef {
        name: "events-secret-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    let leaky = condition(
        "Applied",
        "False",
        "CompileFailed",
        "expression 'token=s3cr3tvalue' failed: Authorization: Bearer abc.def.ghi",
    );
    running.handle.condition_changed(&policy, &leaky);
    assert_eq!(running.next_writes(2).await, [WriteResult::Created; 2]);

    let name = finding_event_name(&f).unwrap();
    let text = raw_event(&client, NS, &name).await;
    assert!(text.contains("/usr/bin/mysql"), "{text}");
    assert!(text.contains("--password=***"), "{text}");
    assert!(text.contains("Bearer ***"), "{text}");
    let name = condition_event_name(&policy, &leaky).unwrap();
    let error_text = raw_event(&client, "default", &name).await;
    assert!(error_text.contains("CompileFailed"), "{error_text}");
    for text in [&text, &error_text] {
        for secret in [
            "hunter2",
            "abc.def.ghi",
            "abc.def",
            "def.ghi",
            "s3cr3tvalue",
        ] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_event_is_counted_and_the_recorder_goes_on() {
    let client = client().await;
    let pod = fresh_pod(&client, "refused-web").await;
    let running = Running::start().await;
    // A namespace that does not exist: the create is refused (404), and
    // retrying cannot change that.
    let mut ghost = pod.clone();
    ghost.namespace = "kyverno-runtime-events-no-such-namespace".into();
    running
        .handle
        .finding_flushed(&finding(&ghost, "no-shell", "/bin/sh", true), 1);
    running
        .handle
        .finding_flushed(&finding(&pod, "no-shell", "/bin/sh", true), 1);
    assert_eq!(
        running.next_writes(2).await,
        [
            WriteResult::Failed(WriteFailure::NotFound),
            WriteResult::Created
        ]
    );
    assert_eq!(events_regarding(&client, NS, &pod.uid).await.len(), 1);
    running.stop().await;
}

/// Every row of the redaction table, as the argv of an exec finding handed
/// to the recorder through the hook the reporter's flush calls: the
/// Events stored on the real API server hold none of the secrets.
#[tokio::test(flavor = "multi_thread")]
async fn no_secret_of_the_redaction_table_reaches_an_event() {
    use kyverno_runtime_report::redaction_cases::{all_secrets, CASES};
    use kyverno_runtime_report::Process;
    let client = client().await;
    let pod = fresh_pod(&client, "redaction-table-web").await;
    // Every case must be stored: a pod budget above the table's size.
    let options = RecorderOptions {
        pod_budget: Budget {
            burst: 1000,
            ..Budget::POD
        },
        ..RecorderOptions::new(NODE)
    };
    let running = Running::start_with(client.clone(), options).await;
    let hook = running.handle.flush_sink();
    for (i, case) in CASES.iter().enumerate() {
        // One policy per case: one Event per (pod, policy, reason), so
        // each case is stored as an Event of its own.
        let policy = format!("watch-exec-{i:03}");
        let mut f = finding(&pod, &policy, &format!("/usr/bin/tool-{i:03}"), false);
        f.process = Some(Process {
            pid: 7,
            comm: "tool".into(),
            argv: case.argv(),
        });
        hook(&f, 1);
    }
    assert_eq!(
        running.next_writes(CASES.len()).await,
        vec![WriteResult::Created; CASES.len()]
    );
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), CASES.len());
    let mut bytes = 0;
    for e in &events {
        let text = raw_event(&client, NS, e.metadata.name.as_deref().unwrap()).await;
        bytes += text.len();
        for secret in all_secrets() {
            assert!(!text.contains(secret), "{secret} reached an Event: {text}");
        }
    }
    println!("{} Events, {bytes} bytes stored, no secret", events.len());
    running.stop().await;
}

/// Issue 38 (11): what lands in the API server is one Event per (object,
/// reason), whatever each note says: a pod violating one policy on a new
/// target each time, and a policy error whose message changes, each add to
/// one Event's series.
#[tokio::test(flavor = "multi_thread")]
async fn changing_notes_add_to_one_event_per_object_and_reason() {
    let client = client().await;
    let pod = fresh_pod(&client, "churn-web").await;
    let running = Running::start().await;

    for (i, target) in ["/tmp/a-1", "/tmp/b-2", "/tmp/c-3"].into_iter().enumerate() {
        let mut f = finding(&pod, "no-tmp-exec", target, true);
        f.last_observed = SystemTime::now() + Duration::from_secs(10 * i as u64);
        running.handle.finding_flushed(&f, 2);
    }
    assert_eq!(
        running.next_writes(3).await,
        [
            WriteResult::Created,
            WriteResult::Patched,
            WriteResult::Patched
        ]
    );
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let series = events[0].series.as_ref().expect("a series");
    assert_eq!(series.count, 6, "2 + 2 + 2 occurrences");
    let latest = SystemTime::now() + Duration::from_secs(20);
    let latest = Timestamp::try_from(latest).unwrap().as_second();
    assert!(series.last_observed_time.0.as_second() >= latest - 5);
    // The note is immutable in events.k8s.io/v1: the first one stays.
    assert!(events[0].note.as_ref().unwrap().contains("/tmp/a-1"));

    let policy = PolicyRef {
        name: "events-churn-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    for message in ["bad 1", "bad 2", "bad 3"] {
        let c = condition("Applied", "False", "CompileFailed", message);
        running.handle.condition_changed(&policy, &c);
    }
    assert_eq!(
        running.next_writes(3).await,
        [
            WriteResult::Created,
            WriteResult::Patched,
            WriteResult::Patched
        ]
    );
    let errors = events_regarding(&client, "default", &pod.uid).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(series_count(&errors[0]), 3);
    running.stop().await;
}

/// Issue 38 (11): a RuntimePolicy's Event is in `default`; the pods (of
/// other namespaces) a node's status names never reach it.
#[tokio::test(flavor = "multi_thread")]
async fn a_default_namespace_event_names_no_pod_of_another_namespace() {
    let client = client().await;
    let pod = fresh_pod(&client, "leaky-web").await;
    let running = Running::start().await;
    let policy = PolicyRef {
        name: "events-leak-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    let gate = condition(
        "Applied",
        "False",
        "EnforcementAvailable",
        &format!(
            "unavailable on node-a (1 matching pod(s) with containers whose cgroup \
             was not found (first: {NS}/leaky-web app: no cgroup))"
        ),
    );
    running.handle.condition_changed(&policy, &gate);
    assert_eq!(running.next_writes(1).await, [WriteResult::Created]);
    let errors = events_regarding(&client, "default", &pod.uid).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let name = errors[0].metadata.name.as_deref().unwrap();
    let text = raw_event(&client, "default", name).await;
    assert!(text.contains("EnforcementAvailable"), "{text}");
    for leak in ["leaky-web", NS] {
        assert!(!text.contains(leak), "{leak} in a default Event: {text}");
    }
    running.stop().await;
}

/// The metric lines of `metrics` that start with `prefix`, sorted (a
/// family's series come in no set order).
fn metric_lines(metrics: &Metrics, prefix: &str) -> Vec<String> {
    let mut lines: Vec<String> = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Issue 38 (11): a write RBAC refuses (the daemon's role lost `create` on
/// Events in `default`) is counted by reason, and the recorder goes on.
/// The client impersonates a user whose only grant is a Role on Events in
/// the test namespace.
#[tokio::test(flavor = "multi_thread")]
async fn an_rbac_refused_write_is_counted_by_reason() {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    const USER: &str = "kyverno-runtime-events-writer";
    let admin = client().await;
    let pod = fresh_pod(&admin, "rbac-web").await;
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": USER},
        "rules": [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                   "verbs": ["create", "get", "patch"]}]
    }))
    .unwrap();
    ignore_conflict(
        Api::<Role>::namespaced(admin.clone(), NS)
            .create(&PostParams::default(), &role)
            .await,
    );
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    }))
    .unwrap();
    ignore_conflict(
        Api::<RoleBinding>::namespaced(admin.clone(), NS)
            .create(&PostParams::default(), &binding)
            .await,
    );
    // The authorizer sees a new binding through its informer: wait for it.
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let allowed = |namespace: &str| {
        serde_json::from_value::<SubjectAccessReview>(serde_json::json!({
            "spec": {"user": USER, "resourceAttributes": {
                "namespace": namespace, "group": "events.k8s.io",
                "resource": "events", "verb": "create"}}
        }))
        .unwrap()
    };
    let mut granted = false;
    for _ in 0..100 {
        let review = reviews
            .create(&PostParams::default(), &allowed(NS))
            .await
            .unwrap();
        if review.status.is_some_and(|s| s.allowed) {
            granted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(granted, "the RoleBinding never took effect");
    let review = reviews
        .create(&PostParams::default(), &allowed("default"))
        .await
        .unwrap();
    assert!(
        !review.status.unwrap().allowed,
        "{USER} may not write default"
    );

    let mut config = config().await;
    config.auth_info.impersonate = Some(USER.into());
    let writer = kube::Client::try_from(config).unwrap();
    let metrics = Arc::new(Metrics::new());
    let options = RecorderOptions {
        metrics: Some(metrics.clone()),
        ..RecorderOptions::new(NODE)
    };
    let running = Running::start_with(writer, options).await;
    let policy = PolicyRef {
        name: "events-rbac-policy".into(),
        uid: Some(pod.uid.clone()),
    };
    let failed = condition("Applied", "False", "CompileFailed", "bad");
    running.handle.condition_changed(&policy, &failed);
    let f = finding(&pod, "no-shell", "/bin/sh", true);
    running.handle.finding_flushed(&f, 1);
    running.handle.finding_flushed(&f, 1);
    assert_eq!(
        running.next_writes(3).await,
        [
            WriteResult::Failed(WriteFailure::Forbidden),
            WriteResult::Created,
            WriteResult::Patched
        ]
    );
    assert!(events_regarding(&admin, "default", &pod.uid)
        .await
        .is_empty());
    assert_eq!(events_regarding(&admin, NS, &pod.uid).await.len(), 1);
    assert_eq!(
        metric_lines(&metrics, "nirmata_runtime_event_writes"),
        [
            "nirmata_runtime_event_writes_failed_total{reason=\"forbidden\"} 1",
            "nirmata_runtime_event_writes_total{result=\"created\"} 1",
            "nirmata_runtime_event_writes_total{result=\"patched\"} 1",
        ]
    );
    running.stop().await;
}

/// Issue 38 (11): a pod over its Event budget gets no more writes; what
/// the budget left out is counted, and the stored Event's series holds
/// exactly what was admitted.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_over_its_budget_is_counted_not_written() {
    let client = client().await;
    let pod = fresh_pod(&client, "budget-web").await;
    let metrics = Arc::new(Metrics::new());
    let drops: Arc<Mutex<Vec<(DropReason, u64)>>> = Arc::default();
    let seen = Arc::clone(&drops);
    let options = RecorderOptions {
        pod_budget: Budget {
            burst: 3,
            refill: Duration::from_secs(3600),
        },
        metrics: Some(metrics.clone()),
        on_drop: Some(Arc::new(move |r, n| seen.lock().unwrap().push((r, n)))),
        ..RecorderOptions::new(NODE)
    };
    let running = Running::start_with(client.clone(), options).await;
    for i in 0..10 {
        let f = finding(&pod, "no-tmp-exec", &format!("/tmp/x-{i}"), true);
        running.handle.finding_flushed(&f, 1);
    }
    assert_eq!(
        running.next_writes(3).await,
        [
            WriteResult::Created,
            WriteResult::Patched,
            WriteResult::Patched
        ]
    );
    let events = events_regarding(&client, NS, &pod.uid).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(series_count(&events[0]), 3);
    assert_eq!(*drops.lock().unwrap(), vec![(DropReason::PodBudget, 1); 7]);
    assert_eq!(
        metric_lines(&metrics, "nirmata_runtime_events_dropped_total"),
        ["nirmata_runtime_events_dropped_total{source=\"events\",reason=\"pod_budget\"} 7"]
    );
    running.stop_dropping(7).await;
}

/// A loopback port that forwards to the API server only once `open` is
/// set: before that, a connection is accepted and closed at once, as a
/// server that went away leaves its clients.
struct Relay {
    port: u16,
    open: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = Arc::clone(&open);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !gate.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Relay { port, open, task }
    }
}

/// Issue 34: an Event whose write fails because the API server does not
/// answer is held and written once it answers, in order, not dropped
/// after its retries; the outage is counted in the API health, not as a
/// failed Event write.
#[tokio::test(flavor = "multi_thread")]
async fn an_event_is_held_while_the_api_server_is_away_and_written_when_it_returns() {
    let direct = client().await;
    let pod = fresh_pod(&direct, "held-web").await;
    let mut config = config().await;
    let upstream = config.cluster_url.authority().unwrap().to_string();
    let upstream = upstream.replace("localhost", "127.0.0.1");
    let relay = Relay::start(upstream).await;
    config.cluster_url = format!("https://127.0.0.1:{}", relay.port).parse().unwrap();
    let metrics = Arc::new(Metrics::new());
    let running = Running::start_with(
        kube::Client::try_from(config).unwrap(),
        RecorderOptions {
            metrics: Some(Arc::clone(&metrics)),
            ..RecorderOptions::new(NODE)
        },
    )
    .await;
    let first = finding(&pod, "held-first", "/bin/sh", true);
    let second = finding(&pod, "held-second", "/bin/sh", true);
    running.handle.finding_flushed(&first, 1);
    // Past the write's own retries (a refused connection fails at once).
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.handle.finding_flushed(&second, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        running.writes.lock().unwrap().is_empty(),
        "nothing is written, and nothing counted as failed, while the server is away"
    );
    assert!(events_regarding(&direct, NS, &pod.uid).await.is_empty());
    let failures = metric_lines(&metrics, "nirmata_runtime_api_failures_total");
    println!("while away: {failures:?}");
    assert!(
        failures
            .iter()
            .any(|l| l.contains("resource=\"events\"") && l.contains("reason=\"unreachable\"")),
        "{failures:?}"
    );

    relay.open.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = running.next_writes(2).await;
    println!("after the server answers again: {writes:?}");
    assert_eq!(writes, [WriteResult::Created; 2]);
    let events = events_regarding(&direct, NS, &pod.uid).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(
        metric_lines(&metrics, "nirmata_runtime_event_writes_failed_total").is_empty(),
        "no Event write counted as failed"
    );
    running.stop().await;
    relay.task.abort();
}
