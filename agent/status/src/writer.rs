//! The status writer: this node's shard in, the cluster's conditions out.
//!
//! Each flush reads the policy fresh, replaces only this node's entry in
//! `status.nodes` (pruning another node's shard only once the Node watch
//! has synced and that Node is gone), derives the cluster conditions from
//! every shard, and writes through the status subresource with the
//! object's resourceVersion. A conflict means another node wrote in
//! between: the flush starts over from a fresh read, so concurrent nodes
//! converge and no shard is lost.

use crate::{changed, compile_failed, derive, merge_conditions, PolicyView};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PostParams};
use kyverno_runtime_api::runtimepolicy::{NodePolicyStatus, RuntimePolicy, RuntimePolicyStatus};
use std::collections::BTreeSet;
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
    /// This node's shard (its `nodeName` must be this writer's node).
    pub shard: NodePolicyStatus,
    /// Spec-level conditions (TargetsValid, ExecRulesValid, OpenRulesValid):
    /// the same answer on every node, merged verbatim.
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
}

impl StatusWriter {
    /// A writer for `node` through `client`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        StatusWriter {
            api: Api::all(client),
            node: node.into(),
            max_attempts: 16,
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
                Ok(_) => {
                    return Ok(Flushed {
                        changed,
                        attempts: attempt,
                        uid,
                    })
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
        shards.push(own);
        shards.sort_by(|a, b| a.node_name.cmp(&b.node_name));

        let derived = match &report.compile_error {
            Some(message) => vec![compile_failed(message)],
            None => {
                let behaviors: Vec<&str> =
                    report.active_behaviors.iter().map(String::as_str).collect();
                derive(&PolicyView {
                    mode: current.spec.mode,
                    active_behaviors: &behaviors,
                    shards: &shards,
                    expected_nodes: view.expected_nodes.as_ref(),
                })
            }
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let conditions = merge_conditions(&old.conditions, &report.spec_conditions, &derived, &now);
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
