//! Tier 3: the daemon with exactly the chart's RBAC, through a
//! ServiceAccount token, against the real local API server with RBAC on.
//!
//! The API server's audit log (ci/kube-up records every ServiceAccount
//! request) is the witness: the daemon makes requests of every kind it
//! needs and none is refused; with one verb removed from the ClusterRole it
//! is refused (and says so in its log); and the role cannot read Secrets.
//! The reporter's controller roll-up (owner verification, the policy's
//! roll-up setting, the sweep for deleted policies' results) needs findings
//! from pods with controllers, which the daemon has none of here (no
//! kernel): the daemon's own reporter, with the same token, is run on such
//! findings and held to the same standard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use kyverno_runtime_testkube::LocalCluster;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NS: &str = "krt-rbac";
const RELEASE: &str = "rbac";
const NODE: &str = "rbac-node";
const SA: &str = "rbac-kyverno-runtime";

fn helm() -> PathBuf {
    let out = Command::new(root().join("ci/helm")).output().unwrap();
    assert!(
        out.status.success(),
        "ci/helm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The chart's RBAC objects (ServiceAccount, ClusterRole, Role and their
/// bindings) rendered with the default values.
fn rendered_rbac() -> String {
    rendered_rbac_with(&[])
}

/// The same, with `sets` (`KEY=VALUE`, helm's `--set`).
fn rendered_rbac_with(sets: &[&str]) -> String {
    let mut args = vec![
        "template".to_string(),
        RELEASE.into(),
        root()
            .join("charts/kyverno-runtime")
            .to_string_lossy()
            .into_owned(),
        "--namespace".into(),
        NS.into(),
    ];
    for t in [
        "serviceaccount",
        "clusterrole",
        "clusterrolebinding",
        "role",
        "rolebinding",
    ] {
        args.push("--show-only".into());
        args.push(format!("templates/{t}.yaml"));
    }
    for set in sets {
        args.push("--set".into());
        args.push((*set).into());
    }
    let out = Command::new(helm()).args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A kubeconfig that authenticates as the chart's ServiceAccount.
fn token_kubeconfig(cluster: &LocalCluster, dir: &Path) -> (PathBuf, String) {
    let token = cluster
        .kubectl_ok(&["create", "token", SA, "-n", NS, "--duration=1h"])
        .unwrap()
        .trim()
        .to_string();
    let admin: serde_json::Value = serde_json::from_str(
        &cluster
            .kubectl_ok(&["config", "view", "--raw", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    let c = &admin["clusters"][0]["cluster"];
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": c["server"], "certificate-authority-data": c["certificate-authority-data"]}}],
        "users": [{"name": "daemon", "user": {"token": token}}],
        "contexts": [{"name": "daemon", "context": {"cluster": "local", "user": "daemon"}}],
        "current-context": "daemon",
    });
    (write(dir, "kubeconfig", &config.to_string()), token)
}

/// The audit log entries of the daemon's ServiceAccount after `from` lines.
fn audit_since(from: usize) -> Vec<serde_json::Value> {
    let path = std::env::var("KRT_KUBE_AUDIT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cluster().kubeconfig.parent().unwrap().join("audit.log"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let user = format!("system:serviceaccount:{NS}:{SA}");
    text.lines()
        .skip(from)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["user"]["username"] == user.as_str())
        .collect()
}

fn audit_lines() -> usize {
    let path = std::env::var("KRT_KUBE_AUDIT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cluster().kubeconfig.parent().unwrap().join("audit.log"));
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// (verb, resource[/subresource]) -> (requests, refused).
fn tally(entries: &[serde_json::Value]) -> BTreeMap<(String, String), (u32, u32)> {
    let mut t = BTreeMap::new();
    for e in entries {
        let r = &e["objectRef"];
        let resource = match r["subresource"].as_str() {
            Some(sub) => format!("{}/{sub}", r["resource"].as_str().unwrap_or("")),
            None => r["resource"].as_str().unwrap_or("").to_string(),
        };
        let key = (e["verb"].as_str().unwrap_or("").to_string(), resource);
        let v = t.entry(key).or_insert((0, 0));
        v.0 += 1;
        if e["responseStatus"]["code"] == 403 {
            v.1 += 1;
        }
    }
    t
}

/// The requests of the daemon's node-scoped pod watch (its LIST and WATCH
/// with the `spec.nodeName` field selector): when the API server received
/// each.
fn pod_watch_requests(entries: &[serde_json::Value]) -> Vec<k8s_openapi::jiff::Timestamp> {
    entries
        .iter()
        .filter(|e| {
            (e["verb"] == "list" || e["verb"] == "watch")
                && e["objectRef"]["resource"] == "pods"
                && e["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains("spec.nodeName"))
        })
        .map(|e| timestamp(e, "requestReceivedTimestamp"))
        .collect()
}

/// When the first LIST of RuntimePolicies the API server allowed was
/// answered in full.
fn policies_first_listed(entries: &[serde_json::Value]) -> Option<k8s_openapi::jiff::Timestamp> {
    entries
        .iter()
        .filter(|e| {
            e["verb"] == "list"
                && e["stage"] == "ResponseComplete"
                && e["objectRef"]["resource"] == "runtimepolicies"
                && e["responseStatus"]["code"] == 200
        })
        .map(|e| timestamp(e, "stageTimestamp"))
        .min()
}

fn timestamp(e: &serde_json::Value, field: &str) -> k8s_openapi::jiff::Timestamp {
    e[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {e}"))
}

fn setup(cluster: &LocalCluster) {
    namespace(cluster, NS, "team: rbac");
    apply(cluster, &rendered_rbac());
    // The daemon's DaemonSet and its pod on NODE, as the controllers would
    // have written them, so the placement watch has something to read.
    apply(
        cluster,
        &format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: {SA}, namespace: {NS}}}\nspec:\n  selector: {{matchLabels: {{app: krt}}}}\n  template:\n    metadata: {{labels: {{app: krt}}}}\n    spec: {{containers: [{{name: d, image: kyverno-runtime}}]}}\n"
        ),
    );
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: rbac-policy\nspec:\n  mode: enforce\n  podSelector: {matchLabels: {app: rbac-web}}\n  behaviors:\n  - exec: {deny: {values: [\"/usr/bin/curl\"]}}\n",
    );
    running_pod(
        cluster,
        NS,
        "rbac-web",
        NODE,
        "app: rbac-web",
        "containerd://00000000000000000000000000000000000000000000000000000000000000aa",
    );
}

/// A workload object's uid.
fn uid_of(cluster: &LocalCluster, kind: &str, name: &str) -> String {
    get_json(cluster, &[kind, name, "-n", NS]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The ownerReference a controller writes, as YAML flow.
fn owned_by(api_version: &str, kind: &str, name: &str, uid: &str) -> String {
    format!(
        "[{{apiVersion: {api_version}, kind: {kind}, name: {name}, uid: {uid}, controller: true}}]"
    )
}

/// A pod on another node (the daemon must not pick it up) with `labels`,
/// owned by `owner`; returned as a finding's identity.
fn owned_pod(
    cluster: &LocalCluster,
    name: &str,
    labels: &str,
    owner: (&str, &str, &str, &str),
) -> kyverno_runtime_report::PodIdentity {
    let (api_version, kind, owner_name, owner_uid) = owner;
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\n  labels: {{{labels}}}\n  ownerReferences: {}\nspec:\n  nodeName: rbac-other-node\n  containers:\n  - name: main\n    image: busybox\n",
            owned_by(api_version, kind, owner_name, owner_uid)
        ),
    );
    kyverno_runtime_report::PodIdentity {
        namespace: NS.into(),
        name: name.into(),
        uid: uid_of(cluster, "pod", name),
        container: Some("main".into()),
        owner_kind: Some(kind.into()),
        owner_name: Some(owner_name.into()),
    }
}

/// Pods of a Deployment (through its ReplicaSet), a StatefulSet, a
/// DaemonSet and a CronJob (through its Job), made as their controllers
/// would have made them.
fn controlled_pods(cluster: &LocalCluster) -> Vec<kyverno_runtime_report::PodIdentity> {
    let spec = |selector: &str| {
        format!("  selector: {{matchLabels: {{{selector}}}}}\n  template:\n    metadata: {{labels: {{{selector}}}}}\n    spec: {{containers: [{{name: main, image: busybox}}]}}\n")
    };
    let object = |api: &str, kind: &str, name: &str, extra: &str, body: &str| {
        apply(
            cluster,
            &format!("apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: {NS}\n{extra}spec:\n{body}"),
        );
        uid_of(cluster, kind, name)
    };
    let deploy = object(
        "apps/v1",
        "Deployment",
        "rbac-deploy",
        "",
        &spec("app: rbac-deploy"),
    );
    let rs = object(
        "apps/v1",
        "ReplicaSet",
        "rbac-deploy-7f",
        &format!(
            "  ownerReferences: {}\n",
            owned_by("apps/v1", "Deployment", "rbac-deploy", &deploy)
        ),
        &spec("app: rbac-deploy, h: 7f"),
    );
    let sts = object(
        "apps/v1",
        "StatefulSet",
        "rbac-sts",
        "",
        &format!("  serviceName: rbac-sts\n{}", spec("app: rbac-sts")),
    );
    let ds = object("apps/v1", "DaemonSet", "rbac-ds", "", &spec("app: rbac-ds"));
    let cron = object(
        "batch/v1",
        "CronJob",
        "rbac-cron",
        "",
        "  schedule: \"0 0 * * *\"\n  jobTemplate:\n    spec:\n      template:\n        spec: {restartPolicy: Never, containers: [{name: main, image: busybox}]}\n",
    );
    let job = object(
        "batch/v1",
        "Job",
        "rbac-cron-1",
        &format!("  ownerReferences: {}\n", owned_by("batch/v1", "CronJob", "rbac-cron", &cron)),
        "  template:\n    spec: {restartPolicy: Never, containers: [{name: main, image: busybox}]}\n",
    );
    // The API server generated the Job's selector; its pods carry it.
    let job_json = get_json(cluster, &["job", "rbac-cron-1", "-n", NS]).unwrap();
    let job_labels = job_json["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap()))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        owned_pod(
            cluster,
            "rbac-deploy-7f-a",
            "app: rbac-deploy, h: 7f",
            ("apps/v1", "ReplicaSet", "rbac-deploy-7f", &rs),
        ),
        owned_pod(
            cluster,
            "rbac-sts-0",
            "app: rbac-sts",
            ("apps/v1", "StatefulSet", "rbac-sts", &sts),
        ),
        owned_pod(
            cluster,
            "rbac-ds-x",
            "app: rbac-ds",
            ("apps/v1", "DaemonSet", "rbac-ds", &ds),
        ),
        owned_pod(
            cluster,
            "rbac-cron-1-x",
            &job_labels,
            ("batch/v1", "Job", "rbac-cron-1", &job),
        ),
    ]
}

/// The daemon's reporter, authenticated with the daemon's token, run on
/// findings from `pods` until their controllers' Reports are written.
fn run_reporter(
    cluster: &LocalCluster,
    kubeconfig: &Path,
    pods: &[kyverno_runtime_report::PodIdentity],
) {
    use kyverno_runtime_report::{controller_report_name, ControllerKind as K};
    let policy_uid = uid_of_policy(cluster, "rbac-policy");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        let reporter = kyverno_runtime_report::Reporter::new(
            kube::Client::try_from(config).unwrap(),
            kyverno_runtime_report::ReporterOptions {
                interval: Duration::from_millis(200),
                node: NODE.into(),
                cleanup_spread: Duration::ZERO,
                ..Default::default()
            },
        );
        let handle = reporter.handle();
        let now = std::time::SystemTime::now();
        for pod in pods {
            handle.submit(kyverno_runtime_report::Finding {
                policy: "rbac-policy".into(),
                policy_uid: policy_uid.clone(),
                behavior: kyverno_runtime_report::Behavior::Exec,
                pod: pod.clone(),
                target: "/usr/bin/curl".into(),
                enforced: true,
                decision: None,
                count: 1,
                first_observed: now,
                last_observed: now,
                process: None,
                matched: Vec::new(),
            });
        }
        // A flush outside `run`: the policy's roll-up setting is read with
        // a get (no watch yet), each pod's owners are verified, and the
        // controllers' Reports are written.
        let flushed = reporter.flush().await;
        let mut written: Vec<&str> = flushed.outcomes.iter().map(|o| o.report.as_str()).collect();
        written.sort_unstable();
        let mut want = [
            controller_report_name(K::Deployment, "rbac-deploy"),
            controller_report_name(K::StatefulSet, "rbac-sts"),
            controller_report_name(K::DaemonSet, "rbac-ds"),
            controller_report_name(K::CronJob, "rbac-cron"),
        ];
        want.sort_unstable();
        assert_eq!(written, want, "{flushed:?}");
        for outcome in &flushed.outcomes {
            assert!(outcome.result.is_ok(), "{outcome:?}");
        }
        // `run`: the policy watch, and once it has listed the policies the
        // sweep for results of deleted ones (a list of Reports).
        let before = audit_lines();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(reporter.run(async {
            let _ = stopped.await;
        }));
        let mut swept = false;
        for _ in 0..150 {
            swept = audit_since(before)
                .iter()
                .any(|e| e["verb"] == "list" && e["objectRef"]["resource"] == "reports");
            if swept {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(swept, "the reporter never listed Reports");
        stop.send(()).unwrap();
        run.await.unwrap();
        assert_eq!(handle.dropped(), 0);
    });
}

fn uid_of_policy(cluster: &LocalCluster, name: &str) -> String {
    get_json(cluster, &["rpol", name]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn start_daemon(kubeconfig: &Path, pins: &Path) -> Daemon {
    start_daemon_on(NODE, &[], kubeconfig, pins)
}

fn start_daemon_on(node: &str, extra: &[&str], kubeconfig: &Path, pins: &Path) -> Daemon {
    let mut args = vec![
        "--metrics-addr",
        "",
        "--status-interval",
        "1s",
        "--pin-dir",
        pins.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Daemon::start(
        &args,
        &[
            ("NODE_NAME", node),
            ("POD_NAMESPACE", NS),
            ("DAEMONSET_NAME", SA),
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ],
    )
}

fn print_tally(title: &str, t: &BTreeMap<(String, String), (u32, u32)>) {
    println!(
        "{title}\n{:<8} {:<32} {:>8} {:>8}",
        "VERB", "RESOURCE", "REQUESTS", "REFUSED"
    );
    for ((verb, resource), (n, refused)) in t {
        println!("{verb:<8} {resource:<32} {n:>8} {refused:>8}");
    }
}

/// One test, because the steps share the cluster-wide ClusterRole: with
/// the chart's role nothing is refused; without `watch` on pods the daemon
/// is refused and says so; the role never reads Secrets; without `list` on
/// RuntimePolicies the daemon never starts its pod watch.
/// The chart's startup taint key.
const TAINT: &str = "kyverno-runtime.io/agent-not-ready";

/// A Node as a kubelet with `registerWithTaints` registers it: the startup
/// taint and a taint of someone else's.
fn tainted_node(cluster: &LocalCluster, name: &str) {
    let _ = cluster.kubectl_output(&["delete", "node", name, "--ignore-not-found"]);
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nspec:\n  taints:\n  - {{key: {TAINT}, value: \"true\", effect: NoExecute}}\n  - {{key: example.com/maintenance, effect: NoSchedule}}\n"
        ),
    );
}

fn taint_keys(cluster: &LocalCluster, node: &str) -> Vec<String> {
    get_json(cluster, &["node", node])
        .and_then(|n| {
            Some(
                n["spec"]["taints"]
                    .as_array()?
                    .iter()
                    .filter_map(|t| t["key"].as_str().map(str::to_string))
                    .collect(),
            )
        })
        .unwrap_or_default()
}

#[test]
fn the_startup_taint_goes_after_the_first_reconcile_and_only_with_the_role_for_it() {
    let cluster = cluster();
    setup(cluster);
    let node = "rbac-taint-node";
    let dir = tempdir();
    let (kubeconfig, _token) = token_kubeconfig(cluster, dir.path());
    let flag = format!("--startup-taint={TAINT}");

    // 1. The chart's role without daemon.startupTaint: the daemon may not
    //    touch Nodes; it says so, keeps trying, and the taint stays.
    tainted_node(cluster, node);
    let mut daemon = start_daemon_on(node, &[&flag], &kubeconfig, &dir.path().join("pins-1"));
    daemon.wait_log(
        "the startup taint could not be removed yet",
        Duration::from_secs(30),
    );
    let said = daemon
        .log()
        .into_iter()
        .find(|l| l.contains("the startup taint could not be removed yet"))
        .unwrap();
    println!("without the role: {said}");
    assert!(
        said.contains("forbidden") || said.contains("Forbidden"),
        "{said}"
    );
    assert!(taint_keys(cluster, node).contains(&TAINT.to_string()));
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));

    // 2. With daemon.startupTaint.enabled: removed once the first full
    //    reconcile is done, never before, and every other taint kept.
    apply(
        cluster,
        &rendered_rbac_with(&["daemon.startupTaint.enabled=true"]),
    );
    tainted_node(cluster, node);
    let before = audit_lines();
    let mut daemon = start_daemon_on(node, &[&flag], &kubeconfig, &dir.path().join("pins-2"));
    daemon.wait_log("startup taint removed", Duration::from_secs(30));
    let log = daemon.log();
    let listed = log
        .iter()
        .position(|l| l.contains("pods on this node listed"))
        .expect("the pods were listed");
    let removed = log
        .iter()
        .position(|l| l.contains("startup taint removed"))
        .unwrap();
    println!("with the role: {}", log[removed]);
    assert!(
        listed < removed,
        "the taint went before the pods were listed:\n{}",
        log.join("\n")
    );
    // (The API server's TaintNodesByCondition admission adds
    // node.kubernetes.io/not-ready to a new Node: also someone else's.)
    let left = taint_keys(cluster, node);
    println!("the Node's taints now: {left:?}");
    assert!(!left.contains(&TAINT.to_string()), "{left:?}");
    assert!(
        left.contains(&"example.com/maintenance".to_string()),
        "{left:?}"
    );
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    std::thread::sleep(Duration::from_secs(1));
    let t = tally(&audit_since(before));
    for needed in [("get", "nodes"), ("patch", "nodes")] {
        let (n, refused) = t
            .get(&(needed.0.to_string(), needed.1.to_string()))
            .copied()
            .unwrap_or_default();
        println!("{} {}: {n} requests, {refused} refused", needed.0, needed.1);
        assert!(
            n > 0 && refused == 0,
            "{needed:?}: {n} requests, {refused} refused"
        );
    }
    let _ = cluster.kubectl_output(&["delete", "node", node]);
    // The other tests read the default role.
    apply(cluster, &rendered_rbac());
}

#[test]
fn the_chart_role_is_exactly_enough() {
    let cluster = cluster();
    setup(cluster);
    let dir = tempdir();
    let (kubeconfig, _token) = token_kubeconfig(cluster, dir.path());
    let pins = dir.path().join("pins");

    // 1. The chart's role: the daemon syncs, writes its shard, stops, and
    //    the audit log holds not one 403.
    let before = audit_lines();
    let mut daemon = start_daemon(&kubeconfig, &pins);
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    wait_for("this node's shard", Duration::from_secs(20), || {
        let rp = get_json(cluster, &["rpol", "rbac-policy"])?;
        rp["status"]["nodes"]
            .as_array()?
            .iter()
            .any(|s| s["nodeName"] == NODE && s["podsMatched"] == true)
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    let pods = controlled_pods(cluster);
    run_reporter(cluster, &kubeconfig, &pods);
    // The audit backend writes asynchronously; give it a moment.
    std::thread::sleep(Duration::from_secs(1));
    let entries = audit_since(before);
    let t = tally(&entries);
    print_tally("with the chart's ClusterRole and Role:", &t);
    for needed in [
        ("watch", "runtimepolicies"),
        ("list", "pods"),
        ("watch", "pods"),
        ("list", "namespaces"),
        ("list", "nodes"),
        ("list", "services"),
        ("watch", "services"),
        ("list", "endpointslices"),
        ("watch", "endpointslices"),
        ("watch", "daemonsets"),
        ("get", "runtimepolicies/status"),
        ("update", "runtimepolicies/status"),
        // The reporter's controller roll-up.
        ("get", "pods"),
        ("get", "replicasets"),
        ("get", "deployments"),
        ("get", "statefulsets"),
        ("get", "daemonsets"),
        ("get", "jobs"),
        ("get", "cronjobs"),
        ("get", "runtimepolicies"),
        ("list", "reports"),
        ("get", "reports"),
        ("create", "reports"),
    ] {
        assert!(
            t.keys().any(|(v, r)| v == needed.0 && r == needed.1),
            "the daemon never did {needed:?}: the test would prove nothing about it"
        );
    }
    let refused: Vec<_> = t.iter().filter(|(_, (_, r))| *r > 0).collect();
    assert!(
        refused.is_empty(),
        "forbidden requests with the chart's role: {refused:?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.contains("forbidden") || l.contains("Forbidden")),
        "the daemon logged a refusal:\n{}",
        log.join("\n")
    );

    // 2. Secrets: neither allowed by the role nor readable with the token.
    let can = cluster
        .kubectl_output(&[
            "auth",
            "can-i",
            "get",
            "secrets",
            "--all-namespaces",
            "--as",
            &format!("system:serviceaccount:{NS}:{SA}"),
        ])
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&can.stdout).trim(), "no");
    let read = cluster
        .kubectl_output(&[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "get",
            "secrets",
            "-n",
            NS,
        ])
        .unwrap();
    let stderr = String::from_utf8_lossy(&read.stderr);
    println!("reading Secrets with the daemon's token: {}", stderr.trim());
    assert!(
        !read.status.success() && stderr.contains("forbidden"),
        "{stderr}"
    );

    // 3. Without `watch` on pods and namespaces the daemon is refused, and
    //    its log says which request.
    let role_name = format!("{RELEASE}-kyverno-runtime");
    let mut role: serde_json::Value = get_json(cluster, &["clusterrole", &role_name]).unwrap();
    let rules = role["rules"].as_array_mut().unwrap();
    let mut removed = false;
    for rule in rules.iter_mut() {
        if rule["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "pods"))
        {
            rule["verbs"] = serde_json::json!(["list"]);
            removed = true;
        }
    }
    assert!(removed, "the chart's role has no pods rule: {role}");
    role["metadata"] = serde_json::json!({"name": role_name});
    apply(cluster, &role.to_string());
    let before = audit_lines();
    let mut daemon = start_daemon(&kubeconfig, &pins);
    daemon.wait_log("forbidden", Duration::from_secs(30));
    let (_, _, log) = daemon.terminate(Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(1));
    let t = tally(&audit_since(before));
    print_tally("with watch removed from pods and namespaces:", &t);
    let refused_watch = t.iter().any(|((v, r), (_, refused))| {
        v == "watch" && (r == "pods" || r == "namespaces") && *refused > 0
    });
    assert!(refused_watch, "no refused watch in the audit log: {t:?}");
    let line = log.iter().find(|l| l.contains("forbidden")).unwrap();
    println!("the daemon's log: {line}");

    // 4. The engine's order, as the API server sees it: the pod watch of
    //    this node starts only once RuntimePolicies (and Namespaces) have
    //    been listed, so no pod is matched against a partial policy cache.
    //    With RuntimePolicies unlistable, the daemon retries the list and
    //    makes no pod request at all; allowed again, the policies are
    //    listed first and the pod watch follows.
    apply(cluster, &rendered_rbac());
    let mut role: serde_json::Value = get_json(cluster, &["clusterrole", &role_name]).unwrap();
    let rules = role["rules"].as_array_mut().unwrap();
    let policy_rule = |r: &serde_json::Value| {
        r["resources"] == serde_json::json!(["runtimepolicies"])
            && r["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == "list"))
    };
    let kept = rules.len();
    rules.retain(|r| !policy_rule(r));
    assert_eq!(
        rules.len() + 1,
        kept,
        "the chart's role has no policy list rule: {role}"
    );
    role["metadata"] = serde_json::json!({"name": role_name});
    apply(cluster, &role.to_string());
    let before = audit_lines();
    let mut daemon = start_daemon(&kubeconfig, &pins);
    wait_for(
        "a refused RuntimePolicy list in the audit log",
        Duration::from_secs(30),
        || {
            audit_since(before)
                .iter()
                .any(|e| {
                    e["objectRef"]["resource"] == "runtimepolicies"
                        && e["verb"] == "list"
                        && e["responseStatus"]["code"] == 403
                })
                .then_some(())
        },
    );
    // Long enough for a pod watch started at once to show (the other
    // watches list within milliseconds).
    std::thread::sleep(Duration::from_secs(3));
    let refused_window = audit_since(before);
    let early = pod_watch_requests(&refused_window);
    println!(
        "RuntimePolicies unlistable for 3 s: {} pod watch request(s) of this node",
        early.len()
    );
    assert!(
        early.is_empty(),
        "the pod watch started before RuntimePolicies were listed: {early:?}"
    );
    apply(cluster, &rendered_rbac());
    daemon.wait_log("pods on this node listed", Duration::from_secs(60));
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    std::thread::sleep(Duration::from_secs(1));
    let entries = audit_since(before);
    let listed = policies_first_listed(&entries).expect("RuntimePolicies never listed");
    let started = pod_watch_requests(&entries)
        .into_iter()
        .min()
        .expect("no pod watch of this node's pods");
    println!("RuntimePolicies listed at {listed}; this node's pod watch started at {started}");
    assert!(
        started > listed,
        "the pod watch started before the policies were listed"
    );

    // Put the chart's role back for whoever runs next.
    apply(cluster, &rendered_rbac());
    cluster
        .kubectl_ok(&["delete", "rpol", "rbac-policy"])
        .unwrap();
}

/// The example RBAC (examples/rbac/runtimepolicy-writers.yaml, issue 37)
/// keeps writing RuntimePolicies with its writers' group: as the API
/// server authorizes it, a reader lists but cannot create, and neither
/// can a namespace admin or anyone bound to the built-in `admin`
/// ClusterRole (the CRD aggregates into no built-in role).
#[test]
fn the_example_rbac_keeps_writing_policies_with_cluster_admins_and_its_group() {
    let cluster = cluster();
    let example = root().join("examples/rbac/runtimepolicy-writers.yaml");
    cluster
        .kubectl_ok(&["apply", "-f", example.to_str().unwrap()])
        .unwrap();
    cluster
        .kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "rbac-example-builtin-admin",
            "--clusterrole=admin",
            "--user=ns-admin",
        ])
        .ok();
    let can = |verb: &str, user: &str, group: Option<&str>| -> bool {
        let mut args = vec![
            "auth",
            "can-i",
            verb,
            "runtimepolicies.runtime.nirmata.io",
            "--as",
            user,
        ];
        if let Some(g) = group {
            args.extend(["--as-group", g]);
        }
        let out = cluster.kubectl_output(&args).unwrap();
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(said == "yes" || said == "no", "can-i said {said:?}");
        said == "yes"
    };
    let rows = [
        ("create", "alice", Some("runtime-policy-admins"), true),
        ("delete", "alice", Some("runtime-policy-admins"), true),
        ("list", "rita", Some("runtime-policy-readers"), true),
        ("create", "rita", Some("runtime-policy-readers"), false),
        ("create", "ns-admin", None, false),
        ("create", "nobody", Some("system:authenticated"), false),
    ];
    for (verb, user, group, want) in rows {
        let got = can(verb, user, group);
        println!("can-i {verb} runtimepolicies as {user} ({group:?}): {got}");
        assert_eq!(got, want, "{verb} as {user} in {group:?}");
    }
    cluster
        .kubectl_ok(&["delete", "-f", example.to_str().unwrap()])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "clusterrolebinding", "rbac-example-builtin-admin"])
        .unwrap();
}
