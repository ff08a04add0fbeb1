//! Tier 3: the daemon with exactly the chart's RBAC, through a
//! ServiceAccount token, against the real local API server with RBAC on.
//!
//! The API server's audit log (ci/kube-up records every ServiceAccount
//! request) is the witness: the daemon makes requests of every kind it
//! needs and none is refused; with one verb removed from the ClusterRole it
//! is refused (and says so in its log); and the role cannot read Secrets.
#![cfg(feature = "kube-tests")]
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

fn start_daemon(kubeconfig: &Path, pins: &Path) -> Daemon {
    Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
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
/// is refused and says so; the role never reads Secrets.
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

    // Put the chart's role back for whoever runs next.
    apply(cluster, &rendered_rbac());
    cluster
        .kubectl_ok(&["delete", "rpol", "rbac-policy"])
        .unwrap();
}
