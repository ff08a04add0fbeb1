//! Tier 3: several nodes writing one policy's status against a real
//! kube-apiserver and etcd converge, lose no shard, and prune a deleted
//! node's shard.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "kube-tests")]

use kyverno_runtime_api::runtimepolicy::{NodePolicyStatus, RuntimePolicy};
use kyverno_runtime_status::{ClusterView, NodeReport, StatusWriter};
use kyverno_runtime_testkube::{repo_root, LocalCluster};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::Stdio;

fn cluster() -> &'static LocalCluster {
    let cluster = LocalCluster::get().expect("local control plane (ci/kube-up)");
    let crds = repo_root().join("charts/kyverno-runtime/crds");
    cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().unwrap(),
        ])
        .unwrap();
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/runtimepolicies.runtime.nirmata.io",
        ])
        .unwrap();
    cluster
}

fn apply(cluster: &LocalCluster, manifest: &str) {
    let mut child = cluster
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn policy(cluster: &LocalCluster, name: &str) {
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    apply(
        cluster,
        &format!(
            "apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {{name: {name}}}
spec:
  mode: enforce
  podSelector: {{matchLabels: {{app: web}}}}
  behaviors:
  - exec: {{deny: {{values: [/bin/sh]}}}}
"
        ),
    );
}

fn node_object(cluster: &LocalCluster, name: &str) {
    apply(
        cluster,
        &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"),
    );
}

async fn client(cluster: &LocalCluster) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn shard(enforce: bool, pods: bool, message: Option<&str>) -> NodeReport {
    NodeReport {
        shard: NodePolicyStatus {
            enforcement_available: Some(enforce),
            pods_matched: Some(pods),
            message: message.map(str::to_string),
            ..NodePolicyStatus::default()
        },
        active_behaviors: vec!["exec".into()],
        ..NodeReport::default()
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn condition<'a>(
    p: &'a RuntimePolicy,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_converge_then_a_deleted_node_is_pruned() {
    let cluster = cluster();
    let nodes = ["krt-node-a", "krt-node-b", "krt-node-c"];
    for n in nodes {
        node_object(cluster, n);
    }
    policy(cluster, "status-three-nodes");
    let client = client(cluster).await;
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };

    // Three nodes flush concurrently, many times each: node-b cannot enforce,
    // only node-a has a matching pod.
    let mut tasks = Vec::new();
    for (node, report) in [
        ("krt-node-a", shard(true, true, None)),
        (
            "krt-node-b",
            shard(
                false,
                false,
                Some("open/exec: no BPF-LSM or fmod_ret backend"),
            ),
        ),
        ("krt-node-c", shard(true, false, None)),
    ] {
        let writer = StatusWriter::new(client.clone(), node);
        let view = view.clone();
        tasks.push(tokio::spawn(async move {
            let mut attempts = 0;
            for round in 0..8 {
                let mut report = report.clone();
                // A changing message makes every round a real write.
                report.shard.message = Some(format!(
                    "{} round {round}",
                    report.shard.message.clone().unwrap_or_default()
                ));
                attempts += writer
                    .flush("status-three-nodes", &report, &view)
                    .await
                    .unwrap()
                    .attempts;
            }
            attempts
        }));
    }
    let mut attempts = 0;
    for t in tasks {
        attempts += t.await.unwrap();
    }
    println!(
        "24 flushes took {attempts} write attempts ({} conflicts retried)",
        attempts - 24
    );

    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let p = api.get("status-three-nodes").await.unwrap();
    let shards: Vec<&str> = p
        .status
        .as_ref()
        .unwrap()
        .nodes
        .iter()
        .map(|s| s.node_name.as_str())
        .collect();
    assert_eq!(shards, nodes, "no shard lost to a conflict");
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    assert_eq!(enforcement.status, "False");
    assert!(
        enforcement.message.contains("krt-node-b"),
        "{}",
        enforcement.message
    );
    assert!(
        !enforcement.message.contains("krt-node-a"),
        "{}",
        enforcement.message
    );
    assert_eq!(condition(&p, "PodsMatched").unwrap().status, "True");
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", "EnforcementAvailable")
    );
    let table = cluster
        .kubectl_ok(&["get", "rpol", "status-three-nodes", "--no-headers"])
        .unwrap();
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(
        &row[..4],
        [
            "status-three-nodes",
            "enforce",
            "False",
            "EnforcementAvailable"
        ],
        "{table}"
    );

    // node-b's Node object is deleted; once the Node watch reflects that,
    // the next flush prunes its shard and the aggregate turns True.
    cluster
        .kubectl_ok(&["delete", "node", "krt-node-b"])
        .unwrap();
    let remaining = ["krt-node-a", "krt-node-c"];
    let view = ClusterView {
        existing_nodes: Some(set(&remaining)),
        expected_nodes: Some(set(&remaining)),
    };
    let writer = StatusWriter::new(client.clone(), "krt-node-a");
    let flushed = writer
        .flush("status-three-nodes", &shard(true, true, None), &view)
        .await
        .unwrap();
    assert!(
        flushed
            .changed
            .iter()
            .any(|c| c.type_ == "EnforcementAvailable" && c.status == "True"),
        "{flushed:?}"
    );
    let p = api.get("status-three-nodes").await.unwrap();
    let shards: Vec<&str> = p
        .status
        .as_ref()
        .unwrap()
        .nodes
        .iter()
        .map(|s| s.node_name.as_str())
        .collect();
    assert_eq!(shards, remaining);
    assert_eq!(
        condition(&p, "EnforcementAvailable").unwrap().status,
        "True"
    );
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("True", "Applied")
    );

    // An unchanged flush writes nothing.
    let again = writer
        .flush("status-three-nodes", &shard(true, true, None), &view)
        .await
        .unwrap();
    assert_eq!(again.attempts, 0);

    cluster
        .kubectl_ok(&["delete", "rpol", "status-three-nodes"])
        .unwrap();
    for n in remaining {
        let _ = cluster.kubectl_output(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_matching_nothing_and_a_compile_failure_read_as_such() {
    let cluster = cluster();
    policy(cluster, "status-no-pods");
    policy(cluster, "status-compile-failed");
    let client = client(cluster).await;
    let nodes = ["krt-sel-a", "krt-sel-b"];
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    for n in nodes {
        StatusWriter::new(client.clone(), n)
            .flush("status-no-pods", &shard(true, false, None), &view)
            .await
            .unwrap();
    }
    let table = cluster
        .kubectl_ok(&["get", "rpol", "status-no-pods", "--no-headers"])
        .unwrap();
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["status-no-pods", "enforce", "False", "PodsMatched"],
        "{table}"
    );

    // The compiler's own refusal: a dyn result without a coercion.
    let errors = kyverno_runtime_policy::cel::check_list_of_strings(
        "json.unmarshal('[\"/bin/sh\"]')",
        &kyverno_runtime_policy::cel::Env::policy(),
    )
    .expect_err("a dyn result must be refused");
    let message = format!("spec.behaviors[0].exec.deny.expression: {}", errors[0]);
    assert!(message.contains("dyn"), "{message}");
    let report = NodeReport {
        compile_error: Some(message.clone()),
        ..shard(true, true, None)
    };
    StatusWriter::new(client.clone(), "krt-sel-a")
        .flush("status-compile-failed", &report, &view)
        .await
        .unwrap();
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client);
    let p = api.get("status-compile-failed").await.unwrap();
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (
            applied.status.as_str(),
            applied.reason.as_str(),
            applied.message.as_str()
        ),
        ("False", "CompileFailed", message.as_str())
    );

    for name in ["status-no-pods", "status-compile-failed"] {
        cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
    }
}
