//! Translations at the daemon's edges: a RuntimePolicy's evaluation into
//! the managers' inputs, a Pod into a pod the managers know, and the
//! duration strings of flags and `evaluationInterval`.

use k8s_openapi::api::core::v1::Pod;
use kyverno_runtime_api::runtimepolicy::{PolicyBehavior, RuntimePolicyMode};
use kyverno_runtime_enforce::openexec::{BehaviorLists, Mode};
use kyverno_runtime_policy::values::{warn_values, BehaviorKind, ValueWarning};
use std::collections::BTreeMap;
use std::time::Duration;

/// The kernel's view of a mode. `None` (a spec that bypassed the API
/// server's defaulting) programs nothing: it is neither enforce nor monitor.
pub fn kernel_mode(mode: Option<RuntimePolicyMode>) -> Option<Mode> {
    match mode? {
        RuntimePolicyMode::Enforce => Some(Mode::Enforce),
        RuntimePolicyMode::Monitor => Some(Mode::Monitor),
    }
}

/// The warnings of one kind's lists ([`BehaviorLists::merge`]): values accepted as
/// written that cannot match, or were normalized, each named at its list's
/// field as a rejection is.
pub fn warnings(kind: BehaviorKind, lists: &BehaviorLists) -> Vec<ValueWarning> {
    let mut out = warn_values(kind, &lists.allow, &lists.field.field("allow"));
    out.extend(warn_values(kind, &lists.deny, &lists.field.field("deny")));
    out
}

/// The behavior kinds of a spec that say something: a rule with literal
/// values or a non-empty expression. Only these need a backend or an
/// event source (an expression counts even when it evaluates to nothing,
/// since the next evaluation may not).
pub fn active_behaviors(behaviors: &[PolicyBehavior]) -> Vec<BehaviorKind> {
    // The rule types differ per kind (each has its own value schema), so
    // the test is spelled once as a macro rather than once per type.
    macro_rules! says {
        ($rule:expr) => {
            $rule.as_ref().is_some_and(|r| {
                r.literal_values().next().is_some()
                    || r.expression
                        .as_deref()
                        .is_some_and(|e| !e.trim().is_empty())
            })
        };
    }
    let mut out = Vec::new();
    for b in behaviors {
        let (kind, says_something) = if let Some(x) = &b.network {
            (BehaviorKind::Network, says!(x.allow) || says!(x.deny))
        } else if let Some(x) = &b.exec {
            (BehaviorKind::Exec, says!(x.allow) || says!(x.deny))
        } else if let Some(x) = &b.open {
            (BehaviorKind::Open, says!(x.allow) || says!(x.deny))
        } else if let Some(x) = &b.protocol {
            (BehaviorKind::Protocol, says!(x.allow) || says!(x.deny))
        } else if let Some(x) = &b.dns {
            (BehaviorKind::Dns, says!(x.allow) || says!(x.deny))
        } else {
            continue;
        };
        if says_something && !out.contains(&kind) {
            out.push(kind);
        }
    }
    out
}

/// Whether the pod is one the managers should hold: Running (the watch is
/// already narrowed to this node). A pod that finished or has not started
/// has no processes to govern.
pub fn is_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Running")
}

/// A pod's labels (empty when it has none).
pub fn labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

/// The owner a finding names for `pod` (`ownerKind`, `ownerName`), as the
/// specification derives it: the first ownerReference, except that a
/// ReplicaSet whose name is the pod's `pod-template-hash` label appended
/// to a name (`web-5d9c8` for hash `5d9c8`) is a Deployment's, and reads as
/// that Deployment (`web`). Read from the pod alone, so it needs no RBAC
/// and is **unverified**: the Report writer verifies the chain through the
/// API and names the verified owner on the pod's Report.
pub fn owner(pod: &Pod) -> Option<(String, String)> {
    let first = pod.metadata.owner_references.as_ref()?.first()?;
    if first.kind == "ReplicaSet" {
        let hash = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"))
            .filter(|h| !h.is_empty());
        let deployment = hash.and_then(|h| {
            first
                .name
                .strip_suffix(h.as_str())?
                .strip_suffix('-')
                .filter(|d| !d.is_empty())
        });
        if let Some(deployment) = deployment {
            return Some(("Deployment".to_string(), deployment.to_string()));
        }
    }
    Some((first.kind.clone(), first.name.clone()))
}

/// The node `pod` is scheduled on (`spec.nodeName`); empty when unset.
pub fn node_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// `pod`'s service account (`spec.serviceAccountName`); empty when unset,
/// as the Go original reads it (the admission default is already in it).
pub fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default()
}

/// The containers' runtime ids by container name, as the pod's container
/// statuses write them (`containerd://<id>`): what the Go original names
/// `event.pod.containerID` (init and ephemeral containers included, which
/// it leaves out, since a cgroup of theirs is the pod's as well).
pub fn container_ids(pod: &Pod) -> BTreeMap<String, String> {
    let Some(status) = pod.status.as_ref() else {
        return BTreeMap::new();
    };
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|c| Some((c.name.clone(), c.container_id.clone()?)))
    .collect()
}

/// Parses a Go duration as Kubernetes writes one (`metav1.Duration`:
/// `30s`, `1m30s`, `500ms`, `1.5h`), which is also what the flags take.
/// Zero and negative durations are refused: an interval of zero would spin.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{text:?}: missing a unit (ns, us, ms, s, m, h)"))?;
        if number_len == 0 {
            return Err(format!("{text:?}: expected a number at {rest:?}"));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("{text:?}: {:?} is not a number", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("{text:?}: unknown unit {other:?}")),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    // A day-long interval is already absurd; the bound keeps the float
    // conversion below from ever overflowing.
    if !(total > 0.0 && total <= 1e7) {
        return Err(format!("{text:?}: must be positive and at most 10^7 s"));
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn owned_pod(kind: &str, owner: &str, hash: Option<&str>) -> Pod {
        let mut labels = serde_json::json!({"app": "web"});
        if let Some(h) = hash {
            labels["pod-template-hash"] = h.into();
        }
        serde_json::from_value(serde_json::json!({"metadata": {
            "name": "p", "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner,
                                 "uid": "u", "controller": true}],
        }}))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[rstest]
    #[case::a_deployments_replicaset("ReplicaSet", "web-5d9c8", Some("5d9c8"), "Deployment", "web")]
    #[case::a_dashed_deployment_name(
        "ReplicaSet",
        "my-web-5d9c8",
        Some("5d9c8"),
        "Deployment",
        "my-web"
    )]
    #[case::a_bare_replicaset("ReplicaSet", "web", None, "ReplicaSet", "web")]
    #[case::a_hash_that_is_not_the_suffix(
        "ReplicaSet",
        "web-5d9c8",
        Some("77777"),
        "ReplicaSet",
        "web-5d9c8"
    )]
    #[case::only_the_hash("ReplicaSet", "-5d9c8", Some("5d9c8"), "ReplicaSet", "-5d9c8")]
    #[case::no_dash_before_the_hash(
        "ReplicaSet",
        "web5d9c8",
        Some("5d9c8"),
        "ReplicaSet",
        "web5d9c8"
    )]
    #[case::a_statefulset("StatefulSet", "db", Some("x"), "StatefulSet", "db")]
    fn the_owner_is_the_first_reference_and_a_deployment_for_its_replicaset(
        #[case] kind: &str,
        #[case] name: &str,
        #[case] hash: Option<&str>,
        #[case] want_kind: &str,
        #[case] want_name: &str,
    ) {
        assert_eq!(
            owner(&owned_pod(kind, name, hash)),
            Some((want_kind.to_string(), want_name.to_string()))
        );
    }

    #[test]
    fn a_pod_without_owners_has_none() {
        assert_eq!(owner(&Pod::default()), None);
    }

    #[rstest]
    #[case("30s", 30_000)]
    #[case("1m30s", 90_000)]
    #[case("500ms", 500)]
    #[case("1.5h", 5_400_000)]
    #[case(" 10s ", 10_000)]
    fn durations(#[case] text: &str, #[case] millis: u128) {
        assert_eq!(parse_duration(text).map(|d| d.as_millis()), Ok(millis));
    }

    #[rstest]
    #[case("", "empty")]
    #[case("10", "missing a unit")]
    #[case("10x", "unknown unit")]
    #[case("0s", "positive")]
    #[case("s", "expected a number")]
    #[case("1..2s", "not a number")]
    #[case("99999999h", "at most")]
    fn bad_durations(#[case] text: &str, #[case] message: &str) {
        let err = parse_duration(text).err().unwrap_or_default();
        assert!(err.contains(message), "{text:?}: {err}");
    }
}
