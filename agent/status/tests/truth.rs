//! Tier 3: what the status says is true of the spec it names (issue 38,
//! points 1 to 4), against a real kube-apiserver and etcd.
//!
//! - a node's shard says which generation it applied; the conditions
//!   count only shards of the current generation and carry
//!   `observedGeneration`, so `kubectl wait --for=condition=Applied` does
//!   not return on the previous spec;
//! - a report on a deleted policy is never written to its successor;
//! - an idle cluster writes nothing, by the API server's own request
//!   counts;
//! - spec-level conditions are stated only by a node at the current
//!   generation, and a node the daemon left decides nothing.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_status::{ClusterView, NodeReport, StatusWriter};
use kyverno_runtime_testkube::LocalCluster;
use std::time::Duration;

/// The API server's request counts are per resource, not per object:
/// these tests take turns so one's writes are not counted as another's.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many status writes (`PUT .../status`) of RuntimePolicies the API
/// server has served, from its own `apiserver_request_total`.
fn status_writes(cluster: &LocalCluster) -> u64 {
    let metrics = cluster.kubectl_ok(&["get", "--raw", "/metrics"]).unwrap();
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains("resource=\"runtimepolicies\"")
                && l.contains("subresource=\"status\"")
                && (l.contains("verb=\"PUT\"") || l.contains("verb=\"PATCH\""))
        })
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap();
            value.parse::<f64>().unwrap() as u64
        })
        .sum()
}

/// A spec-level condition as the daemon builds it: its author's own time
/// (nanoseconds, different on every node).
fn targets_valid(status: &str, message: &str) -> Condition {
    Condition {
        type_: "TargetsValid".into(),
        status: status.into(),
        reason: if status == "True" {
            "Valid"
        } else {
            "ValuesRejected"
        }
        .into(),
        message: message.into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }
}

/// A report at `generation` for a policy with a network behavior, timed
/// as the daemon times it (now, in nanoseconds).
fn report_at(generation: i64, targets: Condition) -> NodeReport {
    let mut report = shard(true, true, None);
    report.shard.observed_generation = Some(generation);
    report.shard.last_evaluated_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    report.active_behaviors = vec!["network".into()];
    report.spec_conditions = vec![targets];
    report
}

fn network_policy(cluster: &LocalCluster, name: &str, values: &str) {
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
  - network: {{deny: {{values: [{values}]}}}}
"
        ),
    );
}

fn kubectl_wait_applied(cluster: &LocalCluster, name: &str, timeout: &str) -> bool {
    cluster
        .kubectl_output(&[
            "wait",
            "--for=condition=Applied",
            &format!("--timeout={timeout}"),
            &format!("rpol/{name}"),
        ])
        .unwrap()
        .status
        .success()
}

/// Point 1: after an edit, the previous generation's `Applied=True` does
/// not satisfy `kubectl wait`; a node still at the old spec is pending and
/// named, and does not overwrite what the current spec's nodes said of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_describes_the_current_generation_only() {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let name = "truth-generation";
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    network_policy(cluster, name, "10.0.0.1/32");
    let client = client(cluster).await;
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let nodes = ["krt-gen-a", "krt-gen-b"];
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    let valid = || targets_valid("True", "every target value is programmed");
    for n in nodes {
        StatusWriter::new(client.clone(), n)
            .flush(name, &report_at(1, valid()), &view)
            .await
            .unwrap();
    }
    assert!(kubectl_wait_applied(cluster, name, "10s"), "generation 1");

    // The edit: generation 2. No node has applied it yet.
    network_policy(cluster, name, "10.0.0.1/32, 10.0.0.2/32");
    let p = api.get(name).await.unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    let applied = condition(&p, "Applied").unwrap();
    println!(
        "after the edit: Applied {} observedGeneration {:?}, metadata.generation 2",
        applied.status, applied.observed_generation
    );
    assert_eq!(applied.observed_generation, Some(1));
    assert!(
        !kubectl_wait_applied(cluster, name, "3s"),
        "kubectl wait returned on generation 1's Applied=True"
    );

    // a applies generation 2 and finds a value it cannot program (as an
    // expression's value would be); b is still at 1 and flushes after a,
    // with generation 1's answer on the targets.
    let rejected = || targets_valid("False", "1 value(s) not programmed: 10.0.0.2/32");
    StatusWriter::new(client.clone(), "krt-gen-a")
        .flush(name, &report_at(2, rejected()), &view)
        .await
        .unwrap();
    StatusWriter::new(client.clone(), "krt-gen-b")
        .flush(name, &report_at(1, valid()), &view)
        .await
        .unwrap();
    let p = api.get(name).await.unwrap();
    let applied = condition(&p, "Applied").unwrap();
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    println!(
        "a at 2, b at 1: Applied {} ({}), EnforcementAvailable {}: {}",
        applied.status, applied.reason, enforcement.status, enforcement.message
    );
    assert_eq!(
        (applied.status.as_str(), applied.observed_generation),
        ("Unknown", Some(2))
    );
    assert_eq!(
        enforcement.message, "generation 2 not applied yet by krt-gen-b (at 1)",
        "{enforcement:?}"
    );
    let targets = condition(&p, "TargetsValid").unwrap();
    assert_eq!(
        (targets.status.as_str(), targets.observed_generation),
        ("False", Some(2)),
        "a node at generation 1 overwrote what generation 2 says of its targets: {targets:?}"
    );

    // b catches up.
    StatusWriter::new(client.clone(), "krt-gen-b")
        .flush(name, &report_at(2, rejected()), &view)
        .await
        .unwrap();
    assert!(kubectl_wait_applied(cluster, name, "10s"), "generation 2");
    let p = api.get(name).await.unwrap();
    let generations: Vec<Option<i64>> = p
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .map(|c| c.observed_generation)
        .collect();
    assert!(generations.iter().all(|g| *g == Some(2)), "{generations:?}");
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
}

/// Point 1 (uid): a node that has not yet seen a policy deleted and
/// created again under the same name writes nothing to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_on_a_deleted_policy_is_not_written_to_its_successor() {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let name = "truth-recreated";
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    network_policy(cluster, name, "10.0.0.1/32");
    let client = client(cluster).await;
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let old_uid = api.get(name).await.unwrap().metadata.uid;
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
    network_policy(cluster, name, "10.0.0.2/32");
    let view = ClusterView {
        existing_nodes: Some(set(&["krt-uid-a"])),
        expected_nodes: Some(set(&["krt-uid-a"])),
    };
    let stale = NodeReport {
        uid: old_uid,
        ..report_at(1, targets_valid("True", "every target value is programmed"))
    };
    let flushed = StatusWriter::new(client.clone(), "krt-uid-a")
        .flush(name, &stale, &view)
        .await
        .unwrap();
    assert_eq!(flushed.attempts, 0);
    let p = api.get(name).await.unwrap();
    assert_eq!(
        p.status, None,
        "the old policy's report landed on the new one"
    );
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
}

/// Point 2: three nodes whose reports do not change flush again and
/// again, each time with its own clock, and the API server serves no
/// status write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_writes_no_status() {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let name = "truth-idle";
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    network_policy(cluster, name, "10.0.0.1/32");
    let client = client(cluster).await;
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let nodes = ["krt-idle-a", "krt-idle-b", "krt-idle-c"];
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    // Each node's report as its daemon holds it: evaluated once, at its own
    // nanosecond; its spec-level condition stamped with its own clock.
    let reports: Vec<(StatusWriter, NodeReport)> = nodes
        .iter()
        .map(|n| {
            (
                StatusWriter::new(client.clone(), *n),
                report_at(1, targets_valid("True", "every target value is programmed")),
            )
        })
        .collect();
    for (writer, report) in &reports {
        writer.flush(name, report, &view).await.unwrap();
    }
    // A second round settles anything the first left (the aggregate
    // changes as the nodes join).
    for (writer, report) in &reports {
        writer.flush(name, report, &view).await.unwrap();
    }
    let version = api.get(name).await.unwrap().metadata.resource_version;
    let before = status_writes(cluster);
    const ROUNDS: usize = 5;
    for _ in 0..ROUNDS {
        for (writer, report) in &reports {
            // Each node's spec-level condition is restamped, as a
            // re-evaluation would.
            let mut report = report.clone();
            report.spec_conditions =
                vec![targets_valid("True", "every target value is programmed")];
            writer.flush(name, &report, &view).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let after = status_writes(cluster);
    println!(
        "{ROUNDS} idle rounds of {} nodes: {} status write(s) served by the API server",
        nodes.len(),
        after - before
    );
    assert_eq!(after - before, 0, "an idle cluster wrote status");
    assert_eq!(
        api.get(name).await.unwrap().metadata.resource_version,
        version
    );
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
}

/// Point 4: a node that still exists but no longer runs the daemon keeps
/// its shard, and its last word (enforcement unavailable, a pod matched)
/// no longer decides the policy's conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_daemon_left_decides_nothing() {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let name = "truth-departed";
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    policy(cluster, name);
    let client = client(cluster).await;
    let nodes = ["krt-left-a", "krt-left-b"];
    for n in nodes {
        node_object(cluster, n);
    }
    // b's daemon could not enforce, then left (a taint, a nodeSelector):
    // placement is now a alone, and b's Node stays.
    let both = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    StatusWriter::new(client.clone(), "krt-left-b")
        .flush(
            name,
            &shard(false, true, Some("open/exec: no BPF-LSM")),
            &both,
        )
        .await
        .unwrap();
    let placement = daemonset(cluster, &client, "krt-truth-departed", &["krt-left-a"]).await;
    let (rx, watch_task) = watch_cluster(&client, placement, |v| {
        v.expected_nodes.as_ref() == Some(&set(&["krt-left-a"]))
            && has_all(&v.existing_nodes, &nodes)
    })
    .await;
    let view = rx.borrow().clone();
    StatusWriter::new(client.clone(), "krt-left-a")
        .flush(name, &shard(true, false, None), &view)
        .await
        .unwrap();
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let p = api.get(name).await.unwrap();
    assert_eq!(
        shard_names(&p),
        nodes,
        "b's shard stays while its Node does"
    );
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    let pods = condition(&p, "PodsMatched").unwrap();
    println!(
        "b departed: EnforcementAvailable {} ({}), PodsMatched {} ({})",
        enforcement.status, enforcement.message, pods.status, pods.message
    );
    assert_eq!(enforcement.status, "True", "{enforcement:?}");
    assert_eq!(
        (pods.status.as_str(), pods.reason.as_str()),
        ("False", "NoMatchingPods"),
        "{pods:?}"
    );
    watch_task.abort();
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
    for n in nodes {
        let _ = cluster.kubectl_output(&["delete", "node", n]);
    }
}

/// Point 3: on a mixed cluster the spec-level conditions are one answer,
/// whichever node flushed last, and what one node cannot serve is that
/// node's: a domain value is a valid target everywhere (TargetsValid is
/// computed from the spec alone), and the node whose DNS answer snooper
/// did not load says so in its shard, which makes EnforcementAvailable
/// False naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_cluster_states_one_answer_on_the_spec() {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let name = "truth-mixed";
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    network_policy(cluster, name, "example.com");
    let client = client(cluster).await;
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let nodes = ["krt-mixed-a", "krt-mixed-b"];
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    let able = report_at(1, targets_valid("True", "every target value is programmed"));
    let mut unable = report_at(1, targets_valid("True", "every target value is programmed"));
    unable.shard.enforcement_available = Some(false);
    unable.shard.message = Some(
        "not programmable on this node: spec.behaviors[0].network.deny: \"example.com\": \
         the DNS answer snooper did not load"
            .into(),
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        for (node, report) in [("krt-mixed-a", &able), ("krt-mixed-b", &unable)] {
            StatusWriter::new(client.clone(), node)
                .flush(name, report, &view)
                .await
                .unwrap();
            let p = api.get(name).await.unwrap();
            seen.push(condition(&p, "TargetsValid").unwrap().clone());
        }
    }
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "TargetsValid changed with the node that flushed: {seen:?}"
    );
    let p = api.get(name).await.unwrap();
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    println!(
        "TargetsValid {} after 4 flushes by 2 nodes; EnforcementAvailable {}: {}",
        seen[0].status, enforcement.status, enforcement.message
    );
    assert_eq!(enforcement.status, "False");
    assert!(
        enforcement
            .message
            .starts_with("unavailable on krt-mixed-b (")
            && enforcement.message.contains("example.com"),
        "{enforcement:?}"
    );
    cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
}
