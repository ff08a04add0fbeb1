//! The status writer: this node's shard in, the cluster's conditions out.
//!
//! Each flush reads the policy fresh, replaces only this node's entry in
//! `status.nodes` (pruning another node's shard only once the Node watch
//! has synced and that Node is gone), derives the cluster conditions from
//! every shard, and writes through the status subresource with the
//! object's resourceVersion. A conflict means another node wrote in
//! between: the flush starts over from a fresh read, so concurrent nodes
//! converge and no shard is lost.
//!
//! A flush that would change nothing writes nothing: times are compared at
//! the precision the API server stores, and a condition's
//! `lastTransitionTime` moves only when its status does, so an idle
//! cluster sends no status writes at all. A node that has not yet applied
//! the object's current generation writes its shard (it is pending) but
//! leaves the spec-level conditions, which describe the current spec, to
//! the nodes that have.

use crate::{
    changed, compile_failed, derive, merge_conditions, stored_precision, types, PolicyView,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PostParams};
use kyverno_runtime_api::runtimepolicy::{NodePolicyStatus, RuntimePolicy, RuntimePolicyStatus};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Errors of a flush.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("RuntimePolicy {policy}: {source}")]
    Api {
        /// The policy.
        policy: String,
        /// What the client reported.
        source: kube::Error,
    },
    /// Every attempt lost a write race.
    #[error("RuntimePolicy {policy}: still conflicting after {attempts} attempts")]
    Conflicts {
        /// The policy.
        policy: String,
        /// How many writes were tried.
        attempts: u32,
    },
}

impl Error {
    /// A short stable name for metric labels
    /// (`status_writes_failed_total{reason}`): the API server could not be
    /// reached, throttled the write (429), failed it (5xx) or refused it
    /// (another 4xx: RBAC, validation), or every attempt lost a race.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                429 => "throttled",
                500..=599 => "server_error",
                _ => "refused",
            },
            Error::Api { .. } => "unreachable",
            Error::Conflicts { .. } => "conflicts",
        }
    }

    /// Whether the policy does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(status), .. } if status.code == 404)
    }
}

/// What this node knows about one policy at flush time.
#[derive(Debug, Clone, Default)]
pub struct NodeReport {
    /// This node's shard (its `nodeName` must be this writer's node; its
    /// `observedGeneration` the generation the report describes).
    pub shard: NodePolicyStatus,
    /// The uid of the policy object the report describes: a report on a
    /// deleted policy is never written to a new one of the same name.
    /// `None` writes to whatever object has the name.
    pub uid: Option<String>,
    /// Spec-level conditions (TargetsValid, ExecRulesValid, OpenRulesValid):
    /// decided from the spec alone, so the same answer on every node at
    /// the same generation; written only when the report is at the
    /// object's current generation. Their `lastTransitionTime` and
    /// `observedGeneration` are the writer's to set.
    pub spec_conditions: Vec<Condition>,
    /// Behavior kinds with values or a non-empty expression.
    pub active_behaviors: Vec<String>,
    /// The compiler's message when it refused the policy: Applied is then
    /// recorded as CompileFailed directly.
    pub compile_error: Option<String>,
}

/// What this node knows about the cluster at flush time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Node names that exist, once the Node watch has synced; `None` before
    /// that, and then no shard is pruned.
    pub existing_nodes: Option<BTreeSet<String>>,
    /// Nodes expected to run the daemon (its placement); `None` while unknown.
    pub expected_nodes: Option<BTreeSet<String>>,
}

/// What a flush did.
#[derive(Debug, Clone, PartialEq)]
pub struct Flushed {
    /// Conditions whose status, reason or message this write changed.
    pub changed: Vec<Condition>,
    /// Writes attempted (1 without conflicts, 0 when nothing had changed).
    pub attempts: u32,
    /// The policy's uid, as read by this flush.
    pub uid: Option<String>,
}

/// Writes one node's view of RuntimePolicy status.
pub struct StatusWriter {
    api: Api<RuntimePolicy>,
    node: String,
    max_attempts: u32,
    /// Whether [`StatusWriter::check_schema`] has already said the CRD is
    /// out of date.
    schema_warned: AtomicBool,
}

impl StatusWriter {
    /// A writer for `node` through `client`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        StatusWriter {
            api: Api::all(client),
            node: node.into(),
            max_attempts: 16,
            schema_warned: AtomicBool::new(false),
        }
    }

    /// The node this writer reports for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Replaces this node's shard of `policy` and re-derives its conditions.
    pub async fn flush(
        &self,
        policy: &str,
        report: &NodeReport,
        view: &ClusterView,
    ) -> Result<Flushed, Error> {
        let api_err = |source| Error::Api {
            policy: policy.to_string(),
            source,
        };
        for attempt in 1..=self.max_attempts {
            let mut current = self.api.get_status(policy).await.map_err(api_err)?;
            if report.uid.is_some() && report.uid != current.metadata.uid {
                // The policy was deleted and created again under the same
                // name, and this node has not seen the new one yet: its
                // report is about an object that no longer exists.
                tracing::debug!(policy, node = %self.node, "status report is for a deleted policy of the same name; not written");
                return Ok(Flushed {
                    changed: Vec::new(),
                    attempts: 0,
                    uid: current.metadata.uid.clone(),
                });
            }
            let old = current.status.clone().unwrap_or_default();
            let new = self.next_status(&current, &old, report, view);
            if new == old {
                return Ok(Flushed {
                    changed: Vec::new(),
                    attempts: 0,
                    uid: current.metadata.uid.clone(),
                });
            }
            let changed: Vec<Condition> = changed(&old.conditions, &new.conditions)
                .into_iter()
                .cloned()
                .collect();
            current.status = Some(new);
            let uid = current.metadata.uid.clone();
            match self
                .api
                .replace_status(policy, &PostParams::default(), &current)
                .await
            {
                Ok(stored) => {
                    self.check_schema(&stored, report);
                    return Ok(Flushed {
                        changed,
                        attempts: attempt,
                        uid,
                    });
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::debug!(policy, node = %self.node, attempt, "status write conflicted; retrying from a fresh read");
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Err(e) => return Err(api_err(e)),
            }
        }
        Err(Error::Conflicts {
            policy: policy.to_string(),
            attempts: self.max_attempts,
        })
    }

    /// Says, once, when the API server dropped the generation this node
    /// wrote in its shard: the installed CRD predates this daemon (Helm
    /// never upgrades a chart's CRDs), and every policy will read as not
    /// applied until it is re-applied.
    fn check_schema(&self, stored: &RuntimePolicy, report: &NodeReport) {
        if report.shard.observed_generation.is_none() {
            return;
        }
        let pruned = stored
            .status
            .as_ref()
            .and_then(|s| s.nodes.iter().find(|n| n.node_name == self.node))
            .is_some_and(|own| own.observed_generation.is_none());
        if pruned && !self.schema_warned.swap(true, Ordering::Relaxed) {
            tracing::error!(
                node = %self.node,
                "the API server dropped status.nodes[].observedGeneration: the RuntimePolicy CRD \
                 installed predates this daemon, so no policy can read as applied; re-apply it: \
                 kubectl apply --server-side -f charts/kyverno-runtime/crds/"
            );
        }
    }

    /// A short wait that grows with the attempt and differs between nodes,
    /// so writers that collided do not collide again in lockstep.
    fn backoff(&self, attempt: u32) -> Duration {
        let spread = self
            .node
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
            % 20;
        Duration::from_millis(10 * u64::from(attempt.min(10)) + spread)
    }

    fn next_status(
        &self,
        current: &RuntimePolicy,
        old: &RuntimePolicyStatus,
        report: &NodeReport,
        view: &ClusterView,
    ) -> RuntimePolicyStatus {
        let generation = current.metadata.generation;
        let mut shards: Vec<NodePolicyStatus> = old
            .nodes
            .iter()
            .filter(|s| s.node_name != self.node)
            // Prune a deleted node's shard only once the Node watch is
            // synced; never this node's own.
            .filter(|s| {
                view.existing_nodes
                    .as_ref()
                    .is_none_or(|nodes| nodes.contains(&s.node_name))
            })
            .cloned()
            .collect();
        let mut own = report.shard.clone();
        own.node_name = self.node.clone();
        own.last_evaluated_time = own.last_evaluated_time.as_ref().map(stored_precision);
        let report_current = own.observed_generation == generation;
        shards.push(own);
        shards.sort_by(|a, b| a.node_name.cmp(&b.node_name));

        // The spec-level conditions and a compile failure describe the
        // spec: only a node at the current generation may state them.
        // Another node keeps what is stored.
        let (spec_level, stored_compile_failure): (Vec<Condition>, _) = if report_current {
            let spec_level = report
                .spec_conditions
                .iter()
                .map(|c| Condition {
                    observed_generation: generation,
                    ..c.clone()
                })
                .collect();
            (spec_level, None)
        } else {
            let spec_level = old
                .conditions
                .iter()
                .filter(|c| SPEC_LEVEL.contains(&c.type_.as_str()))
                .cloned()
                .collect();
            let failure = old.conditions.iter().find(|c| {
                c.type_ == types::APPLIED
                    && c.reason == types::COMPILE_FAILED
                    && c.observed_generation == generation
            });
            (spec_level, failure.map(|c| c.message.clone()))
        };
        let compile_error = match report_current {
            true => report.compile_error.clone(),
            false => stored_compile_failure,
        };
        let derived = match &compile_error {
            Some(message) => vec![compile_failed(message)],
            None => {
                let behaviors: Vec<&str> =
                    report.active_behaviors.iter().map(String::as_str).collect();
                derive(&PolicyView {
                    mode: current.spec.mode,
                    active_behaviors: &behaviors,
                    shards: &shards,
                    expected_nodes: view.expected_nodes.as_ref(),
                    generation,
                })
            }
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let conditions = merge_conditions(&old.conditions, &spec_level, &derived, &now, generation);
        let last_evaluated_time = shards
            .iter()
            .filter_map(|s| s.last_evaluated_time.clone())
            .max_by_key(|t| t.0);
        RuntimePolicyStatus {
            conditions,
            nodes: shards,
            last_evaluated_time,
        }
    }
}

/// The condition types decided by the spec alone.
const SPEC_LEVEL: [&str; 3] = [
    types::TARGETS_VALID,
    types::EXEC_RULES_VALID,
    types::OPEN_RULES_VALID,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        let mut status = kube::core::Status::failure("refused", "Test");
        status.code = code;
        Error::Api {
            policy: "p".into(),
            source: kube::Error::Api(status.boxed()),
        }
    }

    /// The reasons of `status_writes_failed_total` (issue 38: failed status
    /// writes were only logged).
    #[test]
    fn a_failed_write_is_labelled_by_what_the_api_server_did() {
        assert_eq!(api(429).metric_label(), "throttled");
        assert_eq!(api(500).metric_label(), "server_error");
        assert_eq!(api(503).metric_label(), "server_error");
        assert_eq!(api(403).metric_label(), "refused");
        assert_eq!(api(422).metric_label(), "refused");
        let unreachable = Error::Api {
            policy: "p".into(),
            source: kube::Error::TlsRequired,
        };
        assert_eq!(unreachable.metric_label(), "unreachable");
        let raced = Error::Conflicts {
            policy: "p".into(),
            attempts: 5,
        };
        assert_eq!(raced.metric_label(), "conflicts");
        assert!(api(404).is_not_found());
        assert!(!api(403).is_not_found());
    }
}
