//! Tier 3: `kyverno-runtime propose` reading the cluster (the real local
//! API server, ci/kube-up).
//!
//! A Deployment, its ReplicaSet and two pods, with findings both on the
//! Deployment's roll-up Report and on one pod's own Report (a policy that
//! does not roll up), as the reporter writes them: a pod named as the
//! workload is taken up to its Deployment, the selector is the pod
//! template's labels (never the pod-template-hash), and both Reports'
//! findings are added up. A bare pod is proposed from its own labels and
//! Report, a Report of a former object of the same name is ignored, and a
//! workload without Reports is refused with what to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use kyverno_runtime_testkube::LocalCluster;
use std::process::Command;

const NS: &str = "propose-kube";

fn uid(cluster: &LocalCluster, args: &[&str]) -> String {
    get_json(cluster, args).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn propose(cluster: &LocalCluster, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .arg("propose")
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A Report of findings (policy, behavior, target, count) about `scope`.
fn report(
    name: &str,
    scope: (&str, &str, &str, &str),
    results: &[(&str, &str, &str, u64)],
) -> String {
    let (api_version, kind, scope_name, scope_uid) = scope;
    let results: Vec<serde_json::Value> = results
        .iter()
        .map(|(policy, behavior, target, count)| {
            serde_json::json!({
                "policy": policy, "rule": behavior, "source": "kyverno-runtime", "result": "fail",
                "properties": {"behavior": behavior, "target": target, "enforced": "false", "count": count.to_string()}
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "openreports.io/v1alpha1", "kind": "Report",
        "metadata": {"name": name, "namespace": NS},
        "source": "kyverno-runtime",
        "scope": {"apiVersion": api_version, "kind": kind, "namespace": NS, "name": scope_name, "uid": scope_uid},
        "results": results,
    })
    .to_string()
}

#[test]
fn the_cluster_gives_the_controller_its_labels_and_every_report() {
    let cluster = cluster();
    namespace(cluster, NS, "team: shop");
    apply(
        cluster,
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: {NS}}}\n\
             spec:\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web, tier: front}}}}\n    \
             spec: {{containers: [{{name: app, image: busybox}}]}}\n"
        ),
    );
    let deploy_uid = uid(cluster, &["deployment", "web", "-n", NS]);
    apply(
        cluster,
        &format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: web-5d8f7\n  namespace: {NS}\n  \
             ownerReferences: [{{apiVersion: apps/v1, kind: Deployment, name: web, uid: {deploy_uid}, controller: true}}]\n\
             spec:\n  selector: {{matchLabels: {{app: web, pod-template-hash: 5d8f7}}}}\n  template:\n    \
             metadata: {{labels: {{app: web, tier: front, pod-template-hash: 5d8f7}}}}\n    \
             spec: {{containers: [{{name: app, image: busybox}}]}}\n"
        ),
    );
    let rs_uid = uid(cluster, &["replicaset", "web-5d8f7", "-n", NS]);
    let mut pods = Vec::new();
    for pod in ["web-5d8f7-a1", "web-5d8f7-b2"] {
        apply(
            cluster,
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {NS}\n  \
                 labels: {{app: web, tier: front, pod-template-hash: 5d8f7}}\n  \
                 ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d8f7, uid: {rs_uid}, controller: true}}]\n\
                 spec: {{containers: [{{name: app, image: busybox}}]}}\n"
            ),
        );
        pods.push(uid(cluster, &["pod", pod, "-n", NS]));
    }
    // The roll-up Report, and one pod's own Report for a policy that does
    // not roll up.
    apply(
        cluster,
        &report(
            "kyverno-runtime-deployment.web",
            ("apps/v1", "Deployment", "web", &deploy_uid),
            &[
                ("discover-web", "exec", "/usr/local/bin/web", 9),
                ("discover-web", "open", "/etc/web.conf", 9),
                ("discover-web", "network", "10.96.0.10", 40),
            ],
        ),
    );
    apply(
        cluster,
        &report(
            "kyverno-runtime-web-5d8f7-b2",
            ("v1", "Pod", "web-5d8f7-b2", &pods[1]),
            &[
                ("discover-web-local", "open", "/etc/web.conf", 1),
                ("discover-web-local", "open", "/var/cache/web/index", 3),
            ],
        ),
    );

    let (ok, yaml, stderr) = propose(cluster, &["-n", NS, "pod/web-5d8f7-a1", "--min-count", "2"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("Pod {NS}/web-5d8f7-a1 is managed by ReplicaSet {NS}/web-5d8f7: proposing for the ReplicaSet")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("ReplicaSet {NS}/web-5d8f7 is managed by Deployment {NS}/web: proposing for the Deployment")),
        "{stderr}"
    );
    for want in [
        format!("for Deployment {NS}/web\n# from 5 monitor findings (policies discover-web, discover-web-local) in the Reports {NS}/kyverno-runtime-deployment.web (3 findings), {NS}/kyverno-runtime-web-5d8f7-b2 (2 findings).\n"),
        "  name: web-observed\n".into(),
        "  podSelector:\n    matchLabels:\n      app: web\n      tier: front\n  namespaceSelector:\n".into(),
        format!("      kubernetes.io/metadata.name: {NS}\n"),
        "        - /etc/web.conf\n        - /var/cache/web/index\n".into(),
        "        - 10.96.0.10\n".into(),
    ] {
        assert!(yaml.contains(&want), "{want:?} not in\n{yaml}");
    }
    assert!(!yaml.contains("pod-template-hash"), "{yaml}");

    // A bare pod: its own labels, its own Report. A Report of that name
    // about an earlier pod (another uid) is not read.
    let bare = running_pod(
        cluster,
        NS,
        "debug",
        "no-node",
        "app: debug",
        "containerd://00",
    );
    apply(
        cluster,
        &report(
            "kyverno-runtime-debug",
            ("v1", "Pod", "debug", &bare),
            &[("discover-debug", "exec", "/bin/sh", 2)],
        ),
    );
    let (ok, yaml, stderr) = propose(cluster, &["-n", NS, "pod/debug", "--name", "debug-shell"]);
    assert!(ok, "{stderr}");
    assert!(yaml.contains("  name: debug-shell\n"), "{yaml}");
    assert!(yaml.contains("      app: debug\n"), "{yaml}");
    assert!(yaml.contains("        - /bin/sh\n"), "{yaml}");
    apply(
        cluster,
        &report(
            "kyverno-runtime-debug",
            ("v1", "Pod", "debug", "an-earlier-pod"),
            &[("discover-debug", "exec", "/bin/sh", 2)],
        ),
    );
    let (ok, _, stderr) = propose(cluster, &["-n", NS, "pod/debug"]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("Report {NS}/kyverno-runtime-debug is about another object (uid an-earlier-pod, not {bare}): not read")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("no Report about Pod {NS}/debug or its pods: run it under a monitor policy that denies everything first")),
        "{stderr}"
    );
    let (ok, _, stderr) = propose(cluster, &["-n", NS, "statefulset/nothing"]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("StatefulSet {NS}/nothing not found")),
        "{stderr}"
    );
}
