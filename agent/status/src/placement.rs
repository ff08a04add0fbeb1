//! Daemon placement: which nodes are expected to report.
//!
//! A node that should run the daemon but has not reported must read
//! Unknown, not True, so the status writer needs the set of nodes the
//! daemon's DaemonSet places pods on. That set comes from the DaemonSet's
//! own pods — their `spec.nodeName`, or for a pod not yet bound, the node
//! the DaemonSet controller pinned it to with a `metadata.name` node
//! affinity — rather than from re-implementing the scheduler's selector,
//! affinity and toleration rules. While the DaemonSet controller has not
//! observed the current generation, or fewer nodes are known than it
//! wants scheduled, the inventory is incomplete and the answer is `None`.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeSet;

/// The nodes the daemon is expected to run on, or `None` while that is not
/// known yet.
pub fn expected_nodes(daemonset: &DaemonSet, pods: &[Pod]) -> Option<BTreeSet<String>> {
    let uid = daemonset.metadata.uid.as_deref()?;
    let status = daemonset.status.as_ref()?;
    if status.observed_generation < daemonset.metadata.generation {
        return None;
    }
    let owned = || pods.iter().filter(|pod| owned_by(pod, uid));
    let live: BTreeSet<String> = owned()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(pod_node)
        .collect();
    let desired = usize::try_from(status.desired_number_scheduled).unwrap_or(0);
    if live.len() >= desired {
        // Every node the controller wants has a live pod: a terminating
        // pod's node is one that left the placement.
        return Some(live);
    }
    // Fewer live pods than wanted: a rollout step replacing a pod (issue
    // 38: every policy's conditions turned Unknown at each step). The node
    // of a terminating pod is still expected, its replacement on the way.
    let all: BTreeSet<String> = owned().filter_map(pod_node).collect();
    (all.len() >= desired).then_some(all)
}

fn owned_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

/// The node a DaemonSet pod runs on, or is pinned to before it is bound.
fn pod_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|term| term.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn daemonset(generation: i64, observed: i64, desired: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                uid: Some("ds-uid".into()),
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed),
                desired_number_scheduled: desired,
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    fn pod(owner_uid: &str, node: Option<&str>, pinned: Option<&str>) -> Pod {
        let affinity = pinned.map(|n| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![n.into()]),
                        }]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
        Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    uid: owner_uid.into(),
                    controller: Some(true),
                    kind: "DaemonSet".into(),
                    name: "kyverno-runtime".into(),
                    api_version: "apps/v1".into(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                affinity,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bound_and_pinned_pods_name_the_expected_nodes() {
        let pods = [
            pod("ds-uid", Some("a"), None),
            pod("ds-uid", None, Some("b")),
            pod("other", Some("c"), None),
        ];
        assert_eq!(
            expected_nodes(&daemonset(3, 3, 2), &pods),
            Some(set(&["a", "b"]))
        );
    }

    #[test]
    fn an_unobserved_generation_or_a_short_inventory_is_unknown() {
        let pods = [pod("ds-uid", Some("a"), None)];
        assert_eq!(
            expected_nodes(&daemonset(4, 3, 1), &pods),
            None,
            "controller has not observed generation 4"
        );
        assert_eq!(
            expected_nodes(&daemonset(3, 3, 2), &pods),
            None,
            "two desired, one known"
        );
        assert_eq!(
            expected_nodes(&daemonset(3, 3, 1), &pods),
            Some(set(&["a"]))
        );
    }

    #[test]
    fn terminating_pods_and_missing_status_do_not_count() {
        let mut leaving = pod("ds-uid", Some("a"), None);
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            expected_nodes(&daemonset(1, 1, 0), &[leaving]),
            Some(BTreeSet::new())
        );
        let mut no_status = daemonset(1, 1, 0);
        no_status.status = None;
        assert_eq!(expected_nodes(&no_status, &[]), None);
    }

    #[test]
    fn a_rollout_step_keeps_the_replaced_pods_node_expected() {
        let mut replaced = pod("ds-uid", Some("b"), None);
        replaced.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let pods = [
            pod("ds-uid", Some("a"), None),
            replaced,
            pod("ds-uid", Some("c"), None),
        ];
        // Three wanted, two live, one being replaced: the placement is
        // known (it was None, and every policy read Unknown).
        let want: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        assert_eq!(expected_nodes(&daemonset(2, 2, 3), &pods), Some(want));
        // Two wanted: b left the placement, and its pod is going.
        let live: BTreeSet<String> = ["a", "c"].map(String::from).into();
        assert_eq!(expected_nodes(&daemonset(2, 2, 2), &pods), Some(live));
    }
}
