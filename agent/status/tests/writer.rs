//! Tier 3: several nodes writing one policy's status against a real
//! kube-apiserver and etcd converge, lose no shard, and prune a deleted
//! node's shard once the Node watch says it is gone; the daemon's
//! placement (its DaemonSet and pods, watched) makes a node that has not
//! reported read Unknown; the flush loop persists on shutdown.
//!
//! There is no kube-controller-manager here, so the tests play the
//! controllers' part: they create the DaemonSet's pods, write its status,
//! and remove a departed node's pod, as the DaemonSet and pod GC
//! controllers would.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams};
use kyverno_runtime_api::runtimepolicy::{EventSourceState, RuntimePolicy};
use kyverno_runtime_compat::Backend;
use kyverno_runtime_status::{
    backends, ClusterView, FlushLoop, NodeReport, PolicyRef, Reports, StatusWriter,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_converge_then_a_deleted_node_is_pruned() {
    let cluster = cluster();
    let nodes = ["krt-node-a", "krt-node-b", "krt-node-c"];
    for n in nodes {
        node_object(cluster, n);
    }
    policy(cluster, "status-three-nodes");
    let client = client(cluster).await;
    let placement = daemonset(cluster, &client, "krt-status-three", &nodes).await;
    // The view the daemons act on comes from the real Node, DaemonSet and
    // pod watches, not from the test.
    let (mut rx, watch_task) = watch_cluster(&client, placement, |v| {
        has_all(&v.existing_nodes, &nodes) && v.expected_nodes == Some(set(&nodes))
    })
    .await;
    let view = rx.borrow().clone();

    // Three nodes flush concurrently, many times each: node-b cannot
    // enforce (neither open/exec hook loads there), node-c fell back to
    // fmod_ret, only node-a has a matching pod.
    let mut b = shard(
        false,
        false,
        Some("open/exec: no BPF-LSM or fmod_ret backend"),
    );
    b.shard.backends = backends(&plan(entry(
        Backend::None,
        "BPF-LSM: lsm/file_open: load refused: EPERM; fmod_ret: fmod_ret/security_file_open: attach refused: ENOTSUPP",
    )));
    let mut c = shard(true, false, None);
    c.shard.backends = backends(&plan(entry(
        Backend::FmodRet,
        "fmod_ret/security_file_open loaded, attached and ran when triggered (BPF-LSM unavailable: bpf is not in the active LSM list (lockdown,capability))",
    )));
    let mut a = shard(true, true, None);
    a.shard.backends = backends(&plan(entry(
        Backend::BpfLsm,
        "bpf is in the active LSM list",
    )));
    let mut tasks = Vec::new();
    for (node, report) in [("krt-node-a", a), ("krt-node-b", b), ("krt-node-c", c)] {
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
    assert_eq!(shard_names(&p), nodes, "no shard lost to a conflict");
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    assert_eq!(enforcement.status, "False");
    assert!(
        enforcement.message.contains("krt-node-b"),
        "{}",
        enforcement.message
    );
    assert!(
        !enforcement.message.contains("krt-node-a") && !enforcement.message.contains("krt-node-c"),
        "{}",
        enforcement.message
    );
    assert_eq!(condition(&p, "PodsMatched").unwrap().status, "True");
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", "EnforcementAvailable")
    );
    // The mixed cluster shows, per node, what serves exec and why.
    let exec_backend = |node: &str| {
        let shard = p
            .status
            .as_ref()
            .unwrap()
            .nodes
            .iter()
            .find(|s| s.node_name == node)
            .unwrap();
        let b = shard
            .backends
            .iter()
            .find(|b| b.behavior == "exec")
            .unwrap();
        (b.backend.clone(), b.reason.clone().unwrap_or_default())
    };
    assert_eq!(
        exec_backend("krt-node-a"),
        ("bpf_lsm".into(), String::new())
    );
    let (backend, reason) = exec_backend("krt-node-c");
    assert_eq!(backend, "fmod_ret");
    assert!(
        reason.contains("bpf is not in the active LSM list"),
        "{reason}"
    );
    let (backend, reason) = exec_backend("krt-node-b");
    assert_eq!(backend, "none");
    assert!(reason.contains("attach refused: ENOTSUPP"), "{reason}");

    let table = cluster
        .kubectl_ok(&["get", "rpol", "status-three-nodes"])
        .unwrap();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &header[..4],
        ["NAME", "MODE", "APPLIED", "REASON"],
        "{table}"
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
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

    // node-b leaves the cluster: its Node object is deleted, and the
    // controllers (played here) remove its daemon pod and stop wanting
    // one there. Once the watches reflect that, the next flush prunes its
    // shard and the aggregate turns True.
    cluster
        .kubectl_ok(&["delete", "node", "krt-node-b"])
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "krt-status-three");
    pods.delete(
        "kyverno-runtime-krt-node-b",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    set_desired(&client, "krt-status-three", 2, 1).await;
    let remaining = ["krt-node-a", "krt-node-c"];
    wait_view(&mut rx, |v| {
        v.existing_nodes
            .as_ref()
            .is_some_and(|n| !n.contains("krt-node-b") && has_all(&v.existing_nodes, &remaining))
            && v.expected_nodes == Some(set(&remaining))
    })
    .await;
    let view = rx.borrow().clone();
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
    assert_eq!(shard_names(&p), remaining);
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

    watch_task.abort();
    cluster
        .kubectl_ok(&["delete", "rpol", "status-three-nodes"])
        .unwrap();
    for n in remaining {
        let _ = cluster.kubectl_output(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placed_node_that_has_not_reported_reads_unknown() {
    let cluster = cluster();
    let nodes = ["krt-unk-a", "krt-unk-b"];
    for n in nodes {
        node_object(cluster, n);
    }
    policy(cluster, "status-unreported");
    let client = client(cluster).await;
    // krt-unk-b's daemon pod is still pending: placed, not yet running.
    let placement = daemonset(cluster, &client, "krt-status-unknown", &nodes).await;
    let (rx, watch_task) = watch_cluster(&client, placement, |v| {
        has_all(&v.existing_nodes, &nodes) && v.expected_nodes == Some(set(&nodes))
    })
    .await;
    let view = rx.borrow().clone();

    StatusWriter::new(client.clone(), "krt-unk-a")
        .flush("status-unreported", &shard(true, true, None), &view)
        .await
        .unwrap();
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let p = api.get("status-unreported").await.unwrap();
    let enforcement = condition(&p, "EnforcementAvailable").unwrap();
    assert_eq!(enforcement.status, "Unknown", "{enforcement:?}");
    assert!(
        enforcement.message.contains("krt-unk-b"),
        "{}",
        enforcement.message
    );
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("Unknown", "EnforcementAvailable")
    );

    StatusWriter::new(client.clone(), "krt-unk-b")
        .flush("status-unreported", &shard(true, false, None), &view)
        .await
        .unwrap();
    let p = api.get("status-unreported").await.unwrap();
    assert_eq!(
        condition(&p, "EnforcementAvailable").unwrap().status,
        "True"
    );
    assert_eq!(condition(&p, "Applied").unwrap().status, "True");

    watch_task.abort();
    cluster
        .kubectl_ok(&["delete", "rpol", "status-unreported"])
        .unwrap();
    for n in nodes {
        let _ = cluster.kubectl_output(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_daemon_left_keeps_its_shard_but_not_its_say_on_event_sources() {
    let cluster = cluster();
    let nodes = ["krt-dep-a", "krt-dep-b"];
    for n in nodes {
        node_object(cluster, n);
    }
    monitor_policy(cluster, "status-departed");
    let client = client(cluster).await;
    let placement = daemonset(cluster, &client, "krt-status-departed", &nodes).await;
    let (mut rx, watch_task) = watch_cluster(&client, placement, |v| {
        has_all(&v.existing_nodes, &nodes) && v.expected_nodes == Some(set(&nodes))
    })
    .await;
    let view = rx.borrow().clone();
    StatusWriter::new(client.clone(), "krt-dep-a")
        .flush(
            "status-departed",
            &monitor_shard(EventSourceState::Available, None),
            &view,
        )
        .await
        .unwrap();
    StatusWriter::new(client.clone(), "krt-dep-b")
        .flush(
            "status-departed",
            &monitor_shard(EventSourceState::Failed, None),
            &view,
        )
        .await
        .unwrap();
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let p = api.get("status-departed").await.unwrap();
    let sources = condition(&p, "EventSourcesAvailable").unwrap();
    assert_eq!(sources.status, "False", "{sources:?}");
    assert!(sources.message.contains("krt-dep-b"), "{}", sources.message);

    // The daemon leaves krt-dep-b (a taint, a changed nodeSelector): the
    // DaemonSet controller (played here) deletes its pod there and wants
    // one pod fewer; the Node stays. Once the watches say so, the next
    // flush keeps b's shard and no longer counts its failed source.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "krt-status-departed");
    pods.delete(
        "kyverno-runtime-krt-dep-b",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    set_desired(&client, "krt-status-departed", 1, 1).await;
    wait_view(&mut rx, |v| {
        has_all(&v.existing_nodes, &nodes) && v.expected_nodes == Some(set(&["krt-dep-a"]))
    })
    .await;
    let view = rx.borrow().clone();
    StatusWriter::new(client.clone(), "krt-dep-a")
        .flush(
            "status-departed",
            &monitor_shard(EventSourceState::Available, None),
            &view,
        )
        .await
        .unwrap();
    let p = api.get("status-departed").await.unwrap();
    assert_eq!(
        shard_names(&p),
        nodes,
        "only a Node deletion prunes a shard"
    );
    let sources = condition(&p, "EventSourcesAvailable").unwrap();
    assert_eq!(
        (sources.status.as_str(), sources.reason.as_str()),
        ("True", "SourcesAvailable"),
        "{sources:?}"
    );
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(applied.status, "True", "{applied:?}");
    println!(
        "after krt-dep-b's daemon left: shards {:?}, EventSourcesAvailable {} ({})",
        shard_names(&p),
        sources.status,
        sources.message
    );

    watch_task.abort();
    cluster
        .kubectl_ok(&["delete", "rpol", "status-departed"])
        .unwrap();
    for n in nodes {
        let _ = cluster.kubectl_output(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_last_evaluated_time_of_any_shard_is_the_policys() {
    let cluster = cluster();
    monitor_policy(cluster, "status-evaluated");
    let client = client(cluster).await;
    let nodes = ["krt-eval-a", "krt-eval-b"];
    let view = ClusterView {
        existing_nodes: Some(set(&nodes)),
        expected_nodes: Some(set(&nodes)),
    };
    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let top = |p: &RuntimePolicy| {
        p.status
            .as_ref()
            .and_then(|s| s.last_evaluated_time.clone())
    };
    let flush = |node: &'static str, at: &'static str| {
        let client = client.clone();
        let view = view.clone();
        async move {
            StatusWriter::new(client, node)
                .flush(
                    "status-evaluated",
                    &monitor_shard(EventSourceState::Available, Some(at)),
                    &view,
                )
                .await
                .unwrap();
        }
    };
    flush("krt-eval-a", "2026-01-01T10:00:00Z").await;
    let p = api.get("status-evaluated").await.unwrap();
    assert_eq!(top(&p), Some(time("2026-01-01T10:00:00Z")));
    // Another node evaluated later: its time is lifted.
    flush("krt-eval-b", "2026-01-01T10:05:00Z").await;
    let p = api.get("status-evaluated").await.unwrap();
    assert_eq!(top(&p), Some(time("2026-01-01T10:05:00Z")));
    // A node writing an older time does not move it back.
    flush("krt-eval-a", "2026-01-01T10:01:00Z").await;
    let p = api.get("status-evaluated").await.unwrap();
    assert_eq!(top(&p), Some(time("2026-01-01T10:05:00Z")));
    let shard_times: Vec<_> = p
        .status
        .as_ref()
        .unwrap()
        .nodes
        .iter()
        .map(|s| (s.node_name.clone(), s.last_evaluated_time.clone()))
        .collect();
    assert_eq!(
        shard_times,
        [
            ("krt-eval-a".to_string(), Some(time("2026-01-01T10:01:00Z"))),
            ("krt-eval-b".to_string(), Some(time("2026-01-01T10:05:00Z"))),
        ]
    );
    // The newest shard goes (its Node is deleted): the newest of the rest.
    let view = ClusterView {
        existing_nodes: Some(set(&["krt-eval-a"])),
        expected_nodes: Some(set(&["krt-eval-a"])),
    };
    StatusWriter::new(client.clone(), "krt-eval-a")
        .flush(
            "status-evaluated",
            &monitor_shard(EventSourceState::Available, Some("2026-01-01T10:01:00Z")),
            &view,
        )
        .await
        .unwrap();
    let p = api.get("status-evaluated").await.unwrap();
    assert_eq!(top(&p), Some(time("2026-01-01T10:01:00Z")));
    println!(
        "lastEvaluatedTime lifted: {:?}",
        top(&p).map(|t| t.0.to_string())
    );
    cluster
        .kubectl_ok(&["delete", "rpol", "status-evaluated"])
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flush_loop_persists_on_shutdown_and_reports_each_change() {
    let cluster = cluster();
    policy(cluster, "status-flush-loop");
    let _ = cluster.kubectl_output(&["delete", "rpol", "status-flush-gone", "--ignore-not-found"]);
    let client = client(cluster).await;
    let (_view_tx, view) = watch::channel(ClusterView {
        existing_nodes: Some(set(&["krt-loop-a"])),
        expected_nodes: Some(set(&["krt-loop-a"])),
    });
    let reports = Reports::new();
    reports.set("status-flush-loop", shard(true, true, None));
    // A policy deleted after this node learned of it: skipped, not fatal.
    reports.set("status-flush-gone", shard(true, true, None));
    let seen: Arc<Mutex<Vec<(PolicyRef, Condition)>>> = Arc::default();
    // An hour: the only flush this test can see is the one on shutdown.
    let flush_loop = FlushLoop::new(
        StatusWriter::new(client.clone(), "krt-loop-a"),
        reports.clone(),
        view,
    )
    .interval(Duration::from_secs(3600))
    .on_condition_changed({
        let seen = seen.clone();
        move |policy, condition| {
            seen.lock()
                .unwrap()
                .push((policy.clone(), condition.clone()))
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(flush_loop.run(async move {
        let _ = stop_rx.await;
    }));

    let api: kube::Api<RuntimePolicy> = kube::Api::all(client.clone());
    let before = api.get("status-flush-loop").await.unwrap();
    assert!(
        shard_names(&before).is_empty(),
        "nothing written before an interval or shutdown"
    );
    stop_tx.send(()).unwrap();
    running.await.unwrap();

    let p = api.get("status-flush-loop").await.unwrap();
    assert_eq!(
        shard_names(&p),
        ["krt-loop-a"],
        "the shutdown flush persisted"
    );
    let applied = condition(&p, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("True", "Applied")
    );
    let seen = seen.lock().unwrap().clone();
    let uid = p.metadata.uid.clone();
    let mut types: Vec<&str> = seen
        .iter()
        .inspect(|(policy, _)| {
            assert_eq!(
                policy,
                &PolicyRef {
                    name: "status-flush-loop".into(),
                    uid: uid.clone()
                }
            );
        })
        .map(|(_, c)| c.type_.as_str())
        .collect();
    types.sort_unstable();
    assert_eq!(types, ["Applied", "EnforcementAvailable", "PodsMatched"]);

    // The same report again persists nothing new, so nothing is reported;
    // a compile failure changes Applied alone.
    let notified: Arc<Mutex<Vec<Condition>>> = Arc::default();
    let (_view_tx, view) = watch::channel(ClusterView {
        existing_nodes: Some(set(&["krt-loop-a"])),
        expected_nodes: Some(set(&["krt-loop-a"])),
    });
    reports.remove("status-flush-gone");
    let flush_loop = FlushLoop::new(
        StatusWriter::new(client.clone(), "krt-loop-a"),
        reports.clone(),
        view,
    )
    .on_condition_changed({
        let notified = notified.clone();
        move |_, condition| notified.lock().unwrap().push(condition.clone())
    });
    let results = flush_loop.flush_all().await;
    assert!(
        results
            .iter()
            .all(|(_, r)| r.as_ref().is_ok_and(|f| f.attempts == 0)),
        "{results:?}"
    );
    assert!(notified.lock().unwrap().is_empty());
    reports.update("status-flush-loop", |r| {
        r.compile_error = Some("spec.behaviors[0]: boom".into())
    });
    flush_loop.flush_all().await;
    let notified = notified.lock().unwrap().clone();
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert_eq!(
        (
            notified[0].type_.as_str(),
            notified[0].status.as_str(),
            notified[0].reason.as_str()
        ),
        ("Applied", "False", "CompileFailed")
    );

    cluster
        .kubectl_ok(&["delete", "rpol", "status-flush-loop"])
        .unwrap();
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
    let table = cluster
        .kubectl_ok(&["get", "rpol", "status-compile-failed", "--no-headers"])
        .unwrap();
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["status-compile-failed", "enforce", "False", "CompileFailed"],
        "{table}"
    );

    for name in ["status-no-pods", "status-compile-failed"] {
        cluster.kubectl_ok(&["delete", "rpol", name]).unwrap();
    }
}
