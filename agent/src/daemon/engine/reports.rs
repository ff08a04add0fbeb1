//! This node's report on each policy: the shard (availability, matches,
//! unresolved pods, event sources, backends, the generation applied) and
//! the spec-level conditions, rebuilt from the engine's state and handed
//! to the status flush loop through [`Reports`].

use super::*;

/// What a shard's message lists at most, of what is unavailable.
const MESSAGE_ENTRIES: usize = 8;

impl Engine {
    /// Rewrites this node's report on every policy (at the end of the
    /// batch, inside one).
    pub fn refresh_reports(&mut self) {
        if self.batch.open {
            self.batch.reports = true;
            return;
        }
        let names: Vec<String> = self.policies.keys().cloned().collect();
        for name in names {
            let report = self.report(&name);
            if let Some(report) = report {
                self.reports.set(name, report);
            }
        }
    }

    fn report(&self, name: &str) -> Option<NodeReport> {
        let p = self.policies.get(name)?;
        let mut shard = NodePolicyStatus {
            node_name: self.node.clone(),
            observed_generation: p.generation,
            backends: self.backends.clone(),
            last_evaluated_time: p.evaluated_at.clone(),
            ..Default::default()
        };
        let active: Vec<String> = p.active.iter().map(|k| k.as_str().to_string()).collect();
        if let PolicyOutcome::CompileFailed(message) = &p.outcome {
            // What stays in force is the node's to say.
            shard.message = p
                .in_force
                .as_ref()
                .map(|f| in_force_message("the spec did not compile", &f.stale(p.generation)));
            return Some(NodeReport {
                shard,
                uid: Some(p.uid.clone()),
                spec_conditions: Vec::new(),
                active_behaviors: active,
                compile_error: Some(message.clone()),
            });
        }
        let matched: Vec<(&String, &PodState)> = match p.target() {
            Some(target) => self
                .pods
                .iter()
                .filter(|(_, pod)| {
                    target.matches(&self.namespace_labels(&pod.namespace), &pod.labels)
                })
                .collect(),
            None => Vec::new(),
        };
        shard.pods_matched = Some(!matched.is_empty());

        // Which of this policy's behaviors this node cannot serve, and why.
        let mut missing: Vec<String> = Vec::new();
        let monitor = p.mode == Some(RuntimePolicyMode::Monitor);
        for kind in &p.active {
            let gap = match kind {
                BehaviorKind::Open | BehaviorKind::Exec => {
                    self.openexec.reason().map(|r| format!("{kind}: {r}"))
                }
                BehaviorKind::Network => self.egress.reason().map(|r| format!("network: {r}")),
                BehaviorKind::Protocol => self.protocol.reason().map(|r| format!("protocol: {r}")),
                BehaviorKind::Dns => monitor
                    .then(|| self.dns.reason().map(|r| format!("dns: {r}")))
                    .flatten(),
            };
            missing.extend(gap);
        }
        if let Some(f) = self.failures.get(&p.uid) {
            missing.extend(f.iter().cloned());
        }
        if let Ok(id) = PolicyId::new(p.uid.clone()) {
            if let Some(m) = self.protocol.get_ref() {
                missing.extend(m.failures(&id).iter().map(|f| format!("protocol: {f}")));
            }
            if let Some(m) = self.dns.get_ref() {
                missing.extend(m.failures(&id).iter().map(|f| format!("dns: {f}")));
            }
        }
        if let PolicyOutcome::Compiled {
            evaluate_error,
            compiled,
        } = &p.outcome
        {
            let stale = p.in_force.as_ref().map(|f| f.stale(p.generation));
            match (stale, evaluate_error) {
                (None, Some(e)) => missing.push(format!("evaluation failed: {e}")),
                (None, None) if p.awaiting_data => missing.push(format!(
                    "evaluation pending: fetching {} data source(s)",
                    compiled.sources().len()
                )),
                (Some(stale), Some(e)) => {
                    missing.push(in_force_message(&format!("evaluation failed: {e}"), &stale))
                }
                (Some(stale), None) if p.awaiting_data && !stale.is_empty() => {
                    missing.push(in_force_message(
                        &format!(
                            "evaluation pending: fetching {} data source(s)",
                            compiled.sources().len()
                        ),
                        &stale,
                    ))
                }
                _ => {}
            }
        }
        let unresolved: Vec<UnresolvedPod> = matched
            .iter()
            .filter(|(_, pod)| !pod.cgroups.unresolved.is_empty())
            .map(|(_, pod)| UnresolvedPod {
                pod: format!("{}/{}", pod.namespace, pod.name),
                containers: i32::try_from(pod.cgroups.unresolved.len()).unwrap_or(i32::MAX),
                reason: pod
                    .cgroups
                    .unresolved
                    .first()
                    .map(|u| format!("{}: {}", u.container, u.reason))
                    .unwrap_or_default(),
            })
            .collect();
        if !unresolved.is_empty() {
            missing.push(format!(
                "{} matching pod(s) with containers whose cgroup was not found (first: {} {})",
                unresolved.len(),
                unresolved[0].pod,
                unresolved[0].reason
            ));
        }
        shard.unresolved_pod_count =
            (!unresolved.is_empty()).then(|| i32::try_from(unresolved.len()).unwrap_or(i32::MAX));
        shard.unresolved_pods = unresolved.into_iter().take(UNRESOLVED_SHOWN).collect();
        let available = Some(missing.is_empty());
        match p.mode {
            Some(RuntimePolicyMode::Enforce) => shard.enforcement_available = available,
            Some(RuntimePolicyMode::Monitor) => shard.observation_available = available,
            None => {}
        }
        // Not a gap in enforcement: a Service that does not exist (yet) has
        // no address to enforce, and is said so.
        let unresolved = match (self.egress.get_ref(), PolicyId::new(p.uid.clone())) {
            (Some(m), Ok(id)) => m.unresolved(&id),
            _ => Vec::new(),
        };
        if !unresolved.is_empty() {
            missing.push(format!(
                "network: Services without addresses yet (they resolve once they have some): {}",
                unresolved.join(", ")
            ));
        }
        // Not a gap either: protection the operator chose.
        if let (Some(RuntimePolicyMode::Enforce), Some(target)) = (p.mode, p.target()) {
            let protected = self.protected_pods(target);
            if let Some(first) = protected.first() {
                missing.push(format!(
                    "{} selected pod(s) in protected namespaces are not enforced (first: {first}; \
                     protected: {}; the daemon's --protected-namespaces)",
                    protected.len(),
                    self.protected
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        if !missing.is_empty() {
            // Bounded: the shard is written to the API, and a full map
            // fails every cgroup's binding (the log and the metric count
            // them all).
            let more = missing.len().saturating_sub(MESSAGE_ENTRIES);
            missing.truncate(MESSAGE_ENTRIES);
            if more > 0 {
                missing.push(format!("and {more} more"));
            }
            shard.message = Some(missing.join("; "));
        }
        if monitor {
            shard.event_sources = self.event_sources(&p.active);
        }
        Some(NodeReport {
            shard,
            uid: Some(p.uid.clone()),
            spec_conditions: self.spec_conditions(p),
            active_behaviors: active,
            compile_error: None,
        })
    }

    /// The event sources a monitor policy's behaviors need, as this node
    /// has them (their lifecycle in the collector).
    fn event_sources(&self, active: &[BehaviorKind]) -> Vec<EventSourceStatus> {
        let mut names: BTreeSet<&str> = BTreeSet::new();
        for kind in active {
            names.extend(kyverno_runtime_status::required_sources(kind.as_str()));
        }
        names
            .into_iter()
            .map(|name| {
                let (state, reason) = match self.plane.parts.sources.get(name) {
                    Some(SourceState::Available) => (EventSourceState::Available, None),
                    Some(SourceState::Starting) => (EventSourceState::Starting, None),
                    Some(SourceState::Failed { reason, kind }) => (
                        EventSourceState::Failed,
                        Some(format!("{kind:?}: {reason}")),
                    ),
                    None => (
                        EventSourceState::Failed,
                        Some(format!("{name} is not running on this node")),
                    ),
                };
                EventSourceStatus {
                    name: name.to_string(),
                    state,
                    reason: reason.map(|r| bounded(&r, 256)),
                }
            })
            .collect()
    }

    /// TargetsValid, OpenRulesValid and ExecRulesValid for the behaviors
    /// the policy has: the same answer on every node.
    fn spec_conditions(&self, p: &PolicyState) -> Vec<Condition> {
        let empty = Rejections::default();
        let r = self.rejections.get(&p.uid).unwrap_or(&empty);
        let mut out = Vec::new();
        // TargetsValid covers every egress-side behavior: network
        // destinations, protocol tokens and dns names.
        let egress_side = [
            BehaviorKind::Network,
            BehaviorKind::Protocol,
            BehaviorKind::Dns,
        ]
        .into_iter()
        .find(|k| p.active.contains(k));
        let w = &r.warnings;
        for (kind, type_, list, warnings) in [
            (
                egress_side.unwrap_or(BehaviorKind::Network),
                types::TARGETS_VALID,
                &r.network,
                &w.network,
            ),
            (
                BehaviorKind::Open,
                types::OPEN_RULES_VALID,
                &r.open,
                &w.open,
            ),
            (
                BehaviorKind::Exec,
                types::EXEC_RULES_VALID,
                &r.exec,
                &w.exec,
            ),
        ] {
            if !p.active.contains(&kind) {
                continue;
            }
            let what = if type_ == types::TARGETS_VALID {
                "target"
            } else {
                kind.as_str()
            };
            let (status, reason, mut message) = if list.is_empty() {
                let reason = if warnings.is_empty() {
                    "Valid"
                } else {
                    "ValidWithWarnings"
                };
                ("True", reason, format!("every {what} value is programmed"))
            } else {
                (
                    "False",
                    "ValuesRejected",
                    format!(
                        "{} value(s) not programmed: {}",
                        list.len(),
                        first_few(list)
                    ),
                )
            };
            if !warnings.is_empty() {
                message.push_str(&format!(
                    "; {} warning(s): {}",
                    warnings.len(),
                    first_few(warnings)
                ));
            }
            out.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message,
                // The writer keeps the stored transition time unless the
                // status changed, and sets the generation it was decided for.
                last_transition_time: p.evaluated_at.clone().unwrap_or_else(now),
                observed_generation: p.generation,
            });
        }
        out
    }
}

/// Why a policy's current generation is not wholly in force, and which
/// behaviors' lists are from an older one (`stale`, see
/// [`policies::InForce::stale`]).
fn in_force_message(why: &str, stale: &[String]) -> String {
    if stale.is_empty() {
        return why.to_string();
    }
    format!(
        "{why}; the last good lists stay in force for {}",
        first_few(stale)
    )
}

/// The first [`REJECTIONS_SHOWN`] of `list` joined by `; `, and how many
/// more there are.
fn first_few(list: &[String]) -> String {
    let mut shown: Vec<&str> = list
        .iter()
        .take(REJECTIONS_SHOWN)
        .map(String::as_str)
        .collect();
    shown.dedup();
    let more = list.len().saturating_sub(REJECTIONS_SHOWN);
    let mut out = shown.join("; ");
    if more > 0 {
        out.push_str(&format!("; and {more} more"));
    }
    out
}
