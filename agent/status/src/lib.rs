//! RuntimePolicy status: what `kubectl get rpol` answers.
//!
//! Every node runs a daemon and RuntimePolicy is cluster-scoped, so status
//! is sharded: each node replaces only its own entry in `status.nodes`, and
//! every flush derives the cluster-scoped conditions from all shards. This
//! crate is that derivation, as pure functions, so its rules are tested
//! without a cluster:
//!
//! - availability (`EnforcementAvailable`, `ObservationAvailable`,
//!   `EventSourcesAvailable`) is all-true: one node that cannot enforce
//!   leaves its workloads uncovered however many others can, so `False`
//!   names the failing nodes, and a node expected to report that has not
//!   reads `Unknown`, never `True`;
//! - `PodsMatched` is any-true: a policy's pods usually run on a few nodes,
//!   and the others must not read as a selector matching nothing;
//! - `Applied` is derived last, gate by gate in a fixed order, so an
//!   attachment failure (the actionable case) is never masked by a selector
//!   that also matches nothing;
//! - only shards at the object's current `metadata.generation` count, and
//!   only those of nodes the daemon is still placed on: a node still at an
//!   older spec is pending, so `Applied` never describes a spec no node has
//!   applied, and every condition carries the `observedGeneration` it was
//!   decided for (what `kubectl wait --for=condition=Applied` checks).
//!
//! Around those rules sit the parts that talk to the API server:
//! [`StatusWriter`] (one node's write, retried on conflict),
//! [`ClusterWatcher`] (the Node, DaemonSet and pod watches that say which
//! shards to prune and which nodes must report), [`FlushLoop`] (every 30 s
//! and on shutdown, with a callback per persisted condition change), and
//! [`backends`] (a shard's per-behavior backends from the probe's plan).

mod backends;
mod flush;
mod placement;
mod watch;
mod writer;

pub use backends::backends;
pub use flush::{ConditionCallback, FlushLoop, PolicyRef, Reports, DEFAULT_INTERVAL};
pub use placement::expected_nodes;
pub use watch::{ClusterWatcher, Placement};
pub use writer::{ClusterView, Error, Flushed, NodeReport, StatusWriter};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kyverno_runtime_api::runtimepolicy::{EventSourceState, NodePolicyStatus, RuntimePolicyMode};
use std::collections::BTreeSet;

/// Condition types.
pub mod types {
    /// Derived: whether the policy is in force everywhere it should be.
    pub const APPLIED: &str = "Applied";
    /// Node-level: every expected node could attach enforcement.
    pub const ENFORCEMENT_AVAILABLE: &str = "EnforcementAvailable";
    /// Node-level: every expected node could attach observation.
    pub const OBSERVATION_AVAILABLE: &str = "ObservationAvailable";
    /// Node-level: some node has a matching pod.
    pub const PODS_MATCHED: &str = "PodsMatched";
    /// Node-level: every event source a monitor policy needs is ready.
    pub const EVENT_SOURCES_AVAILABLE: &str = "EventSourcesAvailable";
    /// Spec-level, merged verbatim: the network targets could be programmed.
    pub const TARGETS_VALID: &str = "TargetsValid";
    /// Spec-level, merged verbatim: the exec rules could be programmed.
    pub const EXEC_RULES_VALID: &str = "ExecRulesValid";
    /// Spec-level, merged verbatim: the open rules could be programmed.
    pub const OPEN_RULES_VALID: &str = "OpenRulesValid";
    /// The reason `Applied` carries when the compiler refused the policy.
    pub const COMPILE_FAILED: &str = "CompileFailed";
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition before timestamps: what a flush decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// The condition type.
    pub type_: &'static str,
    /// Its status.
    pub status: Status,
    /// A CamelCase reason.
    pub reason: String,
    /// A human message.
    pub message: String,
}

/// The event sources a behavior's observation depends on (from the
/// specification's table).
pub fn required_sources(behavior: &str) -> &'static [&'static str] {
    match behavior {
        "open" => &["openexec-observe"],
        "exec" => &["openexec-observe", "exec-trace"],
        "network" | "protocol" => &["egress-observe"],
        "dns" => &["dnsquery"],
        _ => &[],
    }
}

/// What a flush needs to know about one policy.
pub struct PolicyView<'a> {
    /// `spec.mode`; `None` (a spec that bypassed defaulting) is neither
    /// enforce nor observe.
    pub mode: Option<RuntimePolicyMode>,
    /// The behavior kinds with literal values or a non-empty expression
    /// (only those add source dependencies).
    pub active_behaviors: &'a [&'a str],
    /// Every shard in `status.nodes`.
    pub shards: &'a [NodePolicyStatus],
    /// Nodes expected to report (the daemon's placement); `None` while
    /// placement is not yet known.
    pub expected_nodes: Option<&'a BTreeSet<String>>,
    /// The policy's current `metadata.generation`: only shards whose
    /// `observedGeneration` equals it are counted.
    pub generation: Option<i64>,
}

impl PolicyView<'_> {
    /// The shards that decide the aggregate: at the current generation, of
    /// nodes the daemon has not departed.
    fn counted(&self) -> impl Iterator<Item = &NodePolicyStatus> {
        self.shards
            .iter()
            .filter(|s| s.observed_generation == self.generation && !departed(self, s))
    }
}

/// All-true aggregation of one availability signal across shards.
fn availability(
    type_: &'static str,
    view: &PolicyView<'_>,
    signal: impl Fn(&NodePolicyStatus) -> Option<bool>,
) -> Option<Derived> {
    let reported: Vec<(&str, bool, Option<&str>)> = view
        .counted()
        .filter_map(|s| signal(s).map(|v| (s.node_name.as_str(), v, s.message.as_deref())))
        .collect();
    // A type no shard reports is removed rather than left stale.
    if reported.is_empty() {
        return None;
    }
    let failing: Vec<String> = reported
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(node, _, msg)| match msg {
            Some(m) => format!("{node} ({m})"),
            None => (*node).to_string(),
        })
        .collect();
    if !failing.is_empty() {
        return Some(Derived {
            type_,
            status: Status::False,
            reason: "NodesUnavailable".into(),
            message: format!("unavailable on {}", failing.join(", ")),
        });
    }
    let missing = missing_nodes(view, |s| signal(s).is_some());
    if let Some(missing) = missing {
        return Some(Derived {
            type_,
            status: Status::Unknown,
            reason: "NodesNotReported".into(),
            message: missing,
        });
    }
    Some(Derived {
        type_,
        status: Status::True,
        reason: "AllNodesAvailable".into(),
        message: format!("available on {} node(s)", reported.len()),
    })
}

/// Names the expected nodes that have not reported, or says placement is
/// unknown; `None` when every expected node has reported.
fn missing_nodes(
    view: &PolicyView<'_>,
    reported: impl Fn(&NodePolicyStatus) -> bool,
) -> Option<String> {
    let Some(expected) = view.expected_nodes else {
        return Some("the daemon's placement is not known yet".into());
    };
    let mut absent = Vec::new();
    let mut behind = Vec::new();
    let mut unrecorded = false;
    for node in expected {
        if view.counted().any(|s| &s.node_name == node && reported(s)) {
            continue;
        }
        match view.shards.iter().find(|s| &s.node_name == node) {
            Some(s) if s.observed_generation != view.generation => {
                behind.push(match s.observed_generation {
                    Some(g) => format!("{node} (at {g})"),
                    None => {
                        unrecorded = true;
                        format!("{node} (no generation recorded)")
                    }
                });
            }
            _ => absent.push(node.as_str()),
        }
    }
    let mut parts = Vec::new();
    if !absent.is_empty() {
        parts.push(format!("not reported yet by {}", absent.join(", ")));
    }
    if !behind.is_empty() {
        let generation = view.generation.map_or_else(
            || "the current generation".to_string(),
            |g| format!("generation {g}"),
        );
        parts.push(format!(
            "{generation} not applied yet by {}",
            behind.join(", ")
        ));
    }
    if unrecorded {
        // The API server prunes a field its CRD does not declare, so a
        // CRD not re-applied after an upgrade drops every shard's
        // generation: say how to fix it where the operator looks.
        parts.push(
            "a shard with no generation comes from an older daemon, or from a \
             RuntimePolicy CRD not re-applied after an upgrade (kubectl apply \
             --server-side -f the chart's crds/)"
                .into(),
        );
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Any-true aggregation of PodsMatched.
fn pods_matched(view: &PolicyView<'_>) -> Option<Derived> {
    let reported: Vec<bool> = view.counted().filter_map(|s| s.pods_matched).collect();
    if reported.is_empty() {
        return None;
    }
    if reported.iter().any(|m| *m) {
        let nodes: Vec<&str> = view
            .counted()
            .filter(|s| s.pods_matched == Some(true))
            .map(|s| s.node_name.as_str())
            .collect();
        return Some(Derived {
            type_: types::PODS_MATCHED,
            status: Status::True,
            reason: "PodsMatched".into(),
            message: format!("matching pods on {}", nodes.join(", ")),
        });
    }
    if let Some(missing) = missing_nodes(view, |s| s.pods_matched.is_some()) {
        return Some(Derived {
            type_: types::PODS_MATCHED,
            status: Status::Unknown,
            reason: "NodesNotReported".into(),
            message: missing,
        });
    }
    Some(Derived {
        type_: types::PODS_MATCHED,
        status: Status::False,
        reason: "NoMatchingPods".into(),
        message: "no node has a pod this policy selects".into(),
    })
}

/// Whether placement is known and no longer puts the daemon on the
/// shard's node (a taint, a changed nodeSelector): the node still exists,
/// so its shard stays (only a Node deletion prunes it), but its last word
/// (on availability, matches or event sources) is no longer news about the
/// cluster.
fn departed(view: &PolicyView<'_>, shard: &NodePolicyStatus) -> bool {
    view.expected_nodes
        .is_some_and(|expected| !expected.contains(&shard.node_name))
}

/// EventSourcesAvailable for a monitor policy: False if any required source
/// failed on any node the daemon is placed on, Unknown while a required
/// source or node has not reported, True when every expected node reports
/// every required source available. Only [`PolicyView::counted`] shards
/// take part. `None` when the policy needs no source.
fn event_sources(view: &PolicyView<'_>) -> Option<Derived> {
    if view.mode != Some(RuntimePolicyMode::Monitor) {
        return None;
    }
    let required: BTreeSet<&str> = view
        .active_behaviors
        .iter()
        .flat_map(|b| required_sources(b).iter().copied())
        .collect();
    if required.is_empty() {
        return None;
    }
    let mut failed = Vec::new();
    let mut pending = Vec::new();
    for shard in view.counted() {
        for source in &required {
            match shard.event_sources.iter().find(|e| e.name == *source) {
                Some(e) if e.state == EventSourceState::Failed => failed.push(format!(
                    "{source} on {}{}",
                    shard.node_name,
                    e.reason
                        .as_deref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                )),
                Some(e) if e.state == EventSourceState::Available => {}
                _ => pending.push(format!("{source} on {}", shard.node_name)),
            }
        }
    }
    let (status, reason, message) = if !failed.is_empty() {
        (
            Status::False,
            "SourcesFailed",
            format!("failed: {}", failed.join(", ")),
        )
    } else if !pending.is_empty() {
        (
            Status::Unknown,
            "SourcesStarting",
            format!("not ready yet: {}", pending.join(", ")),
        )
    } else if let Some(missing) = missing_nodes(view, |s| !s.event_sources.is_empty()) {
        (Status::Unknown, "NodesNotReported", missing)
    } else {
        let names: Vec<&str> = required.into_iter().collect();
        (
            Status::True,
            "SourcesAvailable",
            format!("{} available on every node", names.join(", ")),
        )
    };
    Some(Derived {
        type_: types::EVENT_SOURCES_AVAILABLE,
        status,
        reason: reason.into(),
        message,
    })
}

/// The node-level conditions aggregated across shards, then Applied.
pub fn derive(view: &PolicyView<'_>) -> Vec<Derived> {
    let mut out = Vec::new();
    let enforcement = availability(types::ENFORCEMENT_AVAILABLE, view, |s| {
        s.enforcement_available
    });
    let observation = availability(types::OBSERVATION_AVAILABLE, view, |s| {
        s.observation_available
    });
    let sources = event_sources(view);
    let pods = pods_matched(view);
    let at = view
        .generation
        .map(|g| format!(" at generation {g}"))
        .unwrap_or_default();
    out.extend(enforcement.clone());
    out.extend(observation.clone());
    out.extend(sources.clone());
    out.extend(pods.clone());
    out.push(applied(
        view.mode,
        enforcement.as_ref(),
        observation.as_ref(),
        sources.as_ref(),
        pods.as_ref(),
        &at,
    ));
    out
}

/// Applied, gate by gate: the attachment the mode promises, then (monitor)
/// the event sources, then PodsMatched. The first gate that is not True
/// decides, with its own type as the reason.
fn applied(
    mode: Option<RuntimePolicyMode>,
    enforcement: Option<&Derived>,
    observation: Option<&Derived>,
    sources: Option<&Derived>,
    pods: Option<&Derived>,
    at: &str,
) -> Derived {
    let (attachment, attachment_type) = match mode {
        Some(RuntimePolicyMode::Enforce) => (enforcement, types::ENFORCEMENT_AVAILABLE),
        Some(RuntimePolicyMode::Monitor) => (observation, types::OBSERVATION_AVAILABLE),
        None => {
            return Derived {
                type_: types::APPLIED,
                status: Status::False,
                reason: "NoMode".into(),
                message: "spec.mode is unset: the policy neither enforces nor observes".into(),
            }
        }
    };
    let gates = [
        (attachment_type, attachment),
        (types::EVENT_SOURCES_AVAILABLE, sources),
        (types::PODS_MATCHED, pods),
    ];
    for (gate_type, gate) in gates {
        let gate = match gate {
            Some(g) => g,
            // EventSourcesAvailable is absent when the policy needs no source.
            None if gate_type == types::EVENT_SOURCES_AVAILABLE => continue,
            None => {
                return Derived {
                    type_: types::APPLIED,
                    status: Status::Unknown,
                    reason: gate_type.into(),
                    message: format!("{gate_type} has not been reported by any node{at}"),
                }
            }
        };
        if gate.status != Status::True {
            return Derived {
                type_: types::APPLIED,
                status: gate.status,
                reason: gate_type.into(),
                message: gate.message.clone(),
            };
        }
    }
    Derived {
        type_: types::APPLIED,
        status: Status::True,
        reason: "Applied".into(),
        message: "in force on every node that should enforce or observe it".into(),
    }
}

/// The Applied condition for a policy the compiler refused: recorded
/// directly, since nothing compiled to derive anything from.
pub fn compile_failed(message: &str) -> Derived {
    Derived {
        type_: types::APPLIED,
        status: Status::False,
        reason: types::COMPILE_FAILED.into(),
        message: message.to_string(),
    }
}

/// Builds `status.conditions`: the spec-level ones (as given, with their
/// own `observedGeneration`), then the derived ones (decided for
/// `generation`). Every condition keeps the stored `lastTransitionTime`
/// when its status did not change, whatever time its author put in, so
/// nodes writing the same answer write the same object; a type nobody
/// reports any more is dropped rather than left at what an older writer
/// put there. `now` is taken at the stored precision (whole seconds, see
/// [`stored_precision`]).
pub fn merge_conditions(
    existing: &[Condition],
    spec_level: &[Condition],
    derived: &[Derived],
    now: &Time,
    generation: Option<i64>,
) -> Vec<Condition> {
    let now = stored_precision(now);
    let transition = |type_: &str, status: &str| {
        existing
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone())
    };
    let mut out: Vec<Condition> = spec_level
        .iter()
        .map(|c| Condition {
            last_transition_time: transition(&c.type_, &c.status),
            ..c.clone()
        })
        .collect();
    for d in derived {
        out.push(Condition {
            type_: d.type_.to_string(),
            status: d.status.as_str().to_string(),
            reason: d.reason.clone(),
            message: d.message.clone(),
            last_transition_time: transition(d.type_, d.status.as_str()),
            observed_generation: generation,
        });
    }
    out
}

/// `time` as the API server stores it: `metav1.Time` is serialized in
/// whole seconds, so a time kept in nanoseconds never equals its stored
/// copy, and a flush that compared them would rewrite an unchanged status
/// every interval (issue 38).
pub fn stored_precision(time: &Time) -> Time {
    let seconds = time.0.as_second();
    Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap_or(time.0))
}

/// The conditions whose status, reason or message a write changed, for the
/// condition-change callback (Kubernetes Events): judged against what the
/// API object held, never against local memory.
pub fn changed<'a>(before: &[Condition], after: &'a [Condition]) -> Vec<&'a Condition> {
    after
        .iter()
        .filter(|c| {
            !before.iter().any(|b| {
                b.type_ == c.type_
                    && b.status == c.status
                    && b.reason == c.reason
                    && b.message == c.message
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
