//! What the status tier's test files share: the local control plane with
//! the CRDs, policies, reports and the daemon's deployment as its
//! controllers would leave it.
// A test harness: a panic is the failure report. Each test binary uses a
// different part of this module.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kyverno_runtime_api::runtimepolicy::{
    EventSourceState, EventSourceStatus, NodePolicyStatus, RuntimePolicy,
};
use kyverno_runtime_compat::{Backend, Plan, PlanEntry};
use kyverno_runtime_status::{ClusterView, ClusterWatcher, NodeReport, Placement};
use kyverno_runtime_testkube::{repo_root, LocalCluster};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::watch;

/// Reports built by the helpers below describe this generation: a policy
/// created by [`policy`] or [`monitor_policy`] is at it.
pub const FIRST_GENERATION: i64 = 1;

pub fn cluster() -> &'static LocalCluster {
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

pub fn apply(cluster: &LocalCluster, manifest: &str) {
    if let Err(e) = cluster.kubectl_stdin(&["apply", "-f", "-"], manifest) {
        panic!("apply: {e}");
    }
}

pub fn policy(cluster: &LocalCluster, name: &str) {
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

/// A monitor-mode policy `name` with a network behavior (its findings
/// come from the `egress-observe` source).
pub fn monitor_policy(cluster: &LocalCluster, name: &str) {
    let _ = cluster.kubectl_output(&["delete", "rpol", name, "--ignore-not-found"]);
    apply(
        cluster,
        &format!(
            "apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {{name: {name}}}
spec:
  mode: monitor
  podSelector: {{matchLabels: {{app: web}}}}
  behaviors:
  - network: {{deny: {{values: [10.0.0.1/32]}}}}
"
        ),
    );
}

/// A monitor node's report: observation attached, `egress-observe` in
/// `state`.
pub fn monitor_shard(state: EventSourceState, evaluated: Option<&str>) -> NodeReport {
    NodeReport {
        shard: NodePolicyStatus {
            observation_available: Some(true),
            pods_matched: Some(true),
            event_sources: vec![EventSourceStatus {
                name: "egress-observe".into(),
                state,
                reason: (state == EventSourceState::Failed)
                    .then(|| "ReaderFailed: the ring buffer is gone".into()),
            }],
            last_evaluated_time: evaluated.map(time),
            observed_generation: Some(FIRST_GENERATION),
            ..NodePolicyStatus::default()
        },
        active_behaviors: vec!["network".into()],
        ..NodeReport::default()
    }
}

pub fn time(rfc3339: &str) -> Time {
    Time(rfc3339.parse().unwrap())
}

pub fn node_object(cluster: &LocalCluster, name: &str) {
    apply(
        cluster,
        &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"),
    );
}

pub async fn client(cluster: &LocalCluster) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

pub fn shard(enforce: bool, pods: bool, message: Option<&str>) -> NodeReport {
    NodeReport {
        shard: NodePolicyStatus {
            enforcement_available: Some(enforce),
            pods_matched: Some(pods),
            message: message.map(str::to_string),
            observed_generation: Some(FIRST_GENERATION),
            ..NodePolicyStatus::default()
        },
        active_behaviors: vec!["exec".into()],
        ..NodeReport::default()
    }
}

pub fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

pub fn condition<'a>(
    p: &'a RuntimePolicy,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn shard_names(p: &RuntimePolicy) -> Vec<&str> {
    p.status
        .as_ref()
        .map(|s| s.nodes.iter().map(|n| n.node_name.as_str()).collect())
        .unwrap_or_default()
}

pub fn entry(backend: Backend, reason: &str) -> PlanEntry {
    PlanEntry {
        backend,
        available: backend != Backend::None,
        reason: reason.into(),
        forced: false,
    }
}

/// A probe plan with `open_exec` serving open and exec, everything else on
/// its usual backend.
pub fn plan(open_exec: PlanEntry) -> Plan {
    Plan {
        open: open_exec.clone(),
        exec: open_exec,
        network: entry(Backend::CgroupSkbEgress, "cgroup_skb/egress attached"),
        protocol: entry(Backend::CgroupSkbClassifier, "cgroup_skb/egress attached"),
        dns: entry(
            Backend::CgroupSkbDns,
            "questions stream through a ring buffer",
        ),
        exec_argv: entry(Backend::RawTpExec, "raw_tp/sched_process_exec loaded"),
    }
}

/// The daemon's deployment in `namespace`: a DaemonSet whose controller
/// (played here) has observed it and wants `nodes` scheduled, and one pod
/// per node — bound for all but the last, which is pending and pinned by
/// node affinity the way the DaemonSet controller pins its pods.
pub async fn daemonset(
    cluster: &LocalCluster,
    client: &kube::Client,
    namespace: &str,
    nodes: &[&str],
) -> Placement {
    apply(
        cluster,
        &format!(
            "apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: default, namespace: {namespace}}}
"
        ),
    );
    // A previous run's objects: pods are removed at once (no kubelet will
    // confirm a graceful deletion), then the DaemonSet, so the new one has
    // a fresh uid that no stale pod claims.
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for p in pods.list(&Default::default()).await.unwrap() {
        let _ = pods.delete(&p.metadata.name.unwrap(), &force).await;
    }
    let _ = cluster.kubectl_output(&[
        "delete",
        "daemonset",
        "-n",
        namespace,
        "kyverno-runtime",
        "--ignore-not-found",
        "--wait",
    ]);
    apply(
        cluster,
        &format!(
            "apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: kyverno-runtime, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: kyverno-runtime}}}}
  template:
    metadata: {{labels: {{app: kyverno-runtime}}}}
    spec:
      containers: [{{name: daemon, image: kyverno-runtime:test}}]
"
        ),
    );
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let ds = daemonsets.get("kyverno-runtime").await.unwrap();
    let uid = ds.metadata.uid.clone().unwrap();
    for (i, node) in nodes.iter().enumerate() {
        let placement = if i + 1 < nodes.len() {
            serde_json::json!({ "nodeName": node })
        } else {
            serde_json::json!({ "affinity": { "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
                    { "matchFields": [
                        { "key": "metadata.name", "operator": "In", "values": [node] }
                    ] }
                ] }
            } } })
        };
        let mut spec = serde_json::json!({
            "containers": [{ "name": "daemon", "image": "kyverno-runtime:test" }]
        });
        spec.as_object_mut()
            .unwrap()
            .extend(placement.as_object().unwrap().clone());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("kyverno-runtime-{node}"),
                "labels": { "app": "kyverno-runtime" },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kyverno-runtime",
                    "uid": uid, "controller": true
                }]
            },
            "spec": spec
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    set_desired(
        client,
        namespace,
        nodes.len(),
        ds.metadata.generation.unwrap(),
    )
    .await;
    Placement {
        namespace: namespace.into(),
        daemonset: "kyverno-runtime".into(),
        pod_selector: Some("app=kyverno-runtime".into()),
    }
}

/// What the DaemonSet controller writes: it has observed `generation` and
/// wants `desired` pods scheduled.
pub async fn set_desired(client: &kube::Client, namespace: &str, desired: usize, generation: i64) {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    daemonsets
        .patch_status(
            "kyverno-runtime",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": {
                "desiredNumberScheduled": desired,
                "observedGeneration": generation,
                "currentNumberScheduled": 0,
                "numberMisscheduled": 0,
                "numberReady": 0
            } })),
        )
        .await
        .unwrap();
}

/// Starts the real watches and waits until their view satisfies `ready`.
/// The wait is bounded only so a broken watch fails the test instead of
/// hanging it; nothing is asserted about how long it takes.
pub async fn watch_cluster(
    client: &kube::Client,
    placement: Placement,
    ready: impl FnMut(&ClusterView) -> bool,
) -> (watch::Receiver<ClusterView>, tokio::task::JoinHandle<()>) {
    let (watcher, mut rx) = ClusterWatcher::new(client.clone(), placement);
    let task = tokio::spawn(watcher.run());
    wait_view(&mut rx, ready).await;
    (rx, task)
}

pub async fn wait_view(
    rx: &mut watch::Receiver<ClusterView>,
    ready: impl FnMut(&ClusterView) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(120), rx.wait_for(ready))
        .await
        .expect("the cluster view never reached the expected state")
        .unwrap();
}

pub fn has_all(set: &Option<BTreeSet<String>>, names: &[&str]) -> bool {
    set.as_ref()
        .is_some_and(|s| names.iter().all(|n| s.contains(*n)))
}
