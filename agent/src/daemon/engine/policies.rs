//! A policy's life in the engine: compile, evaluate, program, and what
//! stays in force when a step fails.
//!
//! The state model (docs/state-model.md says it for operators): per policy
//! the engine keeps the spec it was last given ([`PolicyOutcome`]: compiled
//! or why not) apart from what is in force ([`InForce`]: the selector and
//! monitorFilter of the last spec that compiled, and each behavior's last
//! good lists, with the generation they were evaluated at). The kernel and
//! the monitor are programmed from the spec's mode and [`InForce`] only:
//!
//! - an edit's mode takes effect at once, whatever else fails (a switch to
//!   monitor is the operator's emergency lever); its selector too, if it
//!   compiles;
//! - a behavior whose new lists cannot be evaluated (compile, evaluation or
//!   data failure) keeps the lists it had, if the edit kept a behavior of
//!   that kind at that index; the others take their new lists;
//! - until a policy has evaluated in full once, nothing of it is in force
//!   and it is *pending*: after a restart, the managers keep what a
//!   previous daemon pinned for it until its first evaluation replaces it.

use super::disclosure::Disclosure;
use super::{bounded, now, Engine, Rejections, Warnings};
use crate::daemon::convert::{self, kernel_mode};
use crate::daemon::data::{DataReady, DataRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kyverno_runtime_api::runtimepolicy::{RuntimePolicy, RuntimePolicyMode};
use kyverno_runtime_enforce::dns::DnsPolicy;
use kyverno_runtime_enforce::egress::NetworkPolicy;
use kyverno_runtime_enforce::openexec::OpenExecPolicy;
use kyverno_runtime_enforce::protocol::ProtocolPolicy;
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_metrics::{BackendBehavior, KernelUpdateFailure};
use kyverno_runtime_policy::cel::eval::{shared_policy_context, RUNTIME_COST_BUDGET};
use kyverno_runtime_policy::compile::{
    CompiledFilter, CompiledPolicy, EvaluatedBehavior, EvaluationResult,
};
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::sources::DataSet;
use kyverno_runtime_policy::values::{BehaviorKind, FieldPath};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

pub(super) struct PolicyState {
    pub(super) name: String,
    pub(super) uid: String,
    /// `metadata.generation`: only a spec change bumps it, so status
    /// writes (ours and other nodes') do not recompile the policy.
    pub(super) generation: Option<i64>,
    pub(super) mode: Option<RuntimePolicyMode>,
    pub(super) active: Vec<BehaviorKind>,
    pub(super) outcome: PolicyOutcome,
    /// What the kernel and the monitor hold for it (see the module docs);
    /// `None` while it is pending.
    pub(super) in_force: Option<InForce>,
    interval: Option<Duration>,
    next_evaluation: Option<Instant>,
    pub(super) evaluated_at: Option<Time>,
    /// The last data request made for this policy (its data sources are
    /// fetched before each evaluation), and whether it is still awaited.
    data_epoch: u64,
    pub(super) awaiting_data: bool,
}

/// The spec last given, as the compiler left it.
pub(super) enum PolicyOutcome {
    /// The compiler refused it: Applied=False/CompileFailed; what was in
    /// force stays, under the new mode (and selector, if it compiled).
    CompileFailed(String),
    /// Compiled; `evaluate_error` is why its last evaluation failed, in
    /// part or in full (`None` once one succeeds).
    Compiled {
        compiled: Box<CompiledPolicy>,
        evaluate_error: Option<String>,
    },
}

/// What is in force for a policy: the kernel is programmed from this and
/// the spec's mode, and the monitor judges by it.
#[derive(Clone, Debug)]
pub(super) struct InForce {
    /// The selector of the last spec whose selector compiled.
    pub(super) target: PodTarget,
    /// The monitorFilter of the last spec that compiled.
    pub(super) filters: Vec<CompiledFilter>,
    /// Each behavior's last good lists.
    pub(super) result: EvaluationResult,
    /// The generation each of `result`'s behaviors was evaluated at, in
    /// its order.
    pub(super) generations: Vec<Option<i64>>,
}

impl InForce {
    /// The behaviors whose lists come from an older generation than
    /// `current`: `behaviors[1].exec (generation 3)`, for the status.
    pub(super) fn stale(&self, current: Option<i64>) -> Vec<String> {
        self.result
            .behaviors
            .iter()
            .zip(&self.generations)
            .filter(|(_, g)| **g != current)
            .map(|(b, g)| {
                let at = FieldPath::spec()
                    .field("behaviors")
                    .index(b.index)
                    .field(b.kind.as_str());
                match g {
                    Some(g) => format!("{at} (generation {g})"),
                    None => at.as_str().to_string(),
                }
            })
            .collect()
    }
}

impl PolicyState {
    /// The pods it applies to: the selector in force, else the one of the
    /// spec (which compiled, or there is none).
    pub(super) fn target(&self) -> Option<&PodTarget> {
        match (&self.in_force, &self.outcome) {
            (Some(f), _) => Some(&f.target),
            (None, PolicyOutcome::Compiled { compiled, .. }) => Some(&compiled.target),
            (None, PolicyOutcome::CompileFailed(_)) => None,
        }
    }
}

/// The lists an evaluation leaves in force: with no failure, its own;
/// otherwise each behavior of the spec takes its new lists if they
/// evaluated, else keeps what `was` in force for a behavior of its kind at
/// its index. With nothing in force before, a partial evaluation puts
/// nothing in force (a policy's lists are only ever programmed whole
/// first: half of one can allow what the other half denies).
fn lists_in_force(
    compiled: &CompiledPolicy,
    evaluated: EvaluationResult,
    failed: bool,
    generation: Option<i64>,
    was: Option<&InForce>,
) -> Option<(EvaluationResult, Vec<Option<i64>>)> {
    if !failed {
        let generations = vec![generation; evaluated.behaviors.len()];
        return Some((evaluated, generations));
    }
    let was = was?;
    let mut behaviors: Vec<EvaluatedBehavior> = Vec::new();
    let mut generations = Vec::new();
    for (index, kind) in compiled.behavior_kinds() {
        if let Some(b) = evaluated.behaviors.iter().find(|b| b.index == index) {
            behaviors.push(b.clone());
            generations.push(generation);
            continue;
        }
        let kept = was
            .result
            .behaviors
            .iter()
            .zip(&was.generations)
            .find(|(b, _)| b.index == index && b.kind == kind);
        if let Some((b, g)) = kept {
            behaviors.push(b.clone());
            generations.push(*g);
        }
    }
    Some((EvaluationResult { behaviors }, generations))
}

impl Engine {
    /// A policy was created or changed: compile, evaluate and program it.
    pub fn apply_policy(&mut self, rp: &RuntimePolicy) {
        let Some(name) = rp.metadata.name.clone() else {
            return;
        };
        let Some(uid) = rp.metadata.uid.clone() else {
            return;
        };
        let generation = rp.metadata.generation;
        if let Some(old) = self.policies.get(&name) {
            if old.uid == uid && generation.is_some() && old.generation == generation {
                return;
            }
        }
        let behaviors = rp.spec.behaviors.as_deref().unwrap_or_default();
        let interval = rp.spec.evaluation_interval.as_deref().and_then(|s| {
            match convert::parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    // Admission validates the format; a value that slips
                    // through means "no periodic re-evaluation", logged.
                    tracing::warn!(policy = %name, error = %e, "spec.evaluationInterval ignored");
                    None
                }
            }
        });
        // A uid change is a delete and a re-create under the same name.
        if let Some(old) = self.policies.get(&name) {
            if old.uid != uid {
                self.delete_policy(&name);
            }
        }
        let mut in_force = self.policies.get(&name).and_then(|p| p.in_force.clone());
        let outcome = match CompiledPolicy::compile(&rp.spec) {
            Ok(compiled) => {
                if let Some(f) = &mut in_force {
                    f.target = compiled.target.clone();
                    f.filters = compiled.monitor_filter.clone();
                }
                PolicyOutcome::Compiled {
                    compiled: Box::new(compiled),
                    evaluate_error: None,
                }
            }
            Err(errors) => {
                let message = errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::warn!(policy = %name, %message, "policy did not compile");
                if let Some(f) = &mut in_force {
                    // The selector on its own terms: if it compiles, it is
                    // what the operator asks for now.
                    if let Ok(target) = PodTarget::compile(
                        rp.spec.pod_selector.as_ref(),
                        rp.spec.namespace_selector.as_ref(),
                        &FieldPath::spec(),
                    ) {
                        f.target = target;
                    }
                    tracing::warn!(policy = %name, in_force = ?f.stale(generation), "the last good lists stay in force");
                }
                PolicyOutcome::CompileFailed(message)
            }
        };
        self.policies.insert(
            name.clone(),
            PolicyState {
                name: name.clone(),
                uid,
                generation,
                mode: rp.spec.mode,
                active: convert::active_behaviors(behaviors),
                outcome,
                in_force,
                interval,
                next_evaluation: None,
                evaluated_at: None,
                data_epoch: self.policies.get(&name).map_or(0, |p| p.data_epoch),
                awaiting_data: false,
            },
        );
        if !self.evaluate(&name) {
            // Not evaluated now (data to fetch, or no spec that compiles):
            // the new mode and selector take effect over the lists in force.
            self.program(&name);
        }
        self.observe_policy(&name);
        self.refresh_reports();
    }

    /// A policy was deleted: unprogram it and stop reporting on it.
    pub fn delete_policy(&mut self, name: &str) {
        let Some(state) = self.policies.remove(name) else {
            return;
        };
        if let Some(f) = &self.fetcher {
            f.cancel(name);
        }
        if let Ok(id) = PolicyId::new(state.uid.clone()) {
            let mut failures = Vec::new();
            if let Some(m) = self.openexec.get() {
                failures.extend(m.delete_policy(&id).iter().map(ToString::to_string));
            }
            if let Some(m) = self.egress.get() {
                failures.extend(m.delete_policy(&id).iter().map(ToString::to_string));
            }
            if let Some(m) = self.protocol.get() {
                failures.extend(m.delete_policy(&id).iter().map(ToString::to_string));
            }
            if let Some(m) = self.dns.get() {
                failures.extend(m.delete_policy(&id).iter().map(ToString::to_string));
            }
            for f in failures {
                tracing::error!(policy = %name, failure = %f, "unprogramming a deleted policy failed");
            }
        }
        self.failures.remove(&state.uid);
        self.rejections.remove(&state.uid);
        self.reports.remove(name);
        self.observe_policy(name);
        self.refresh_reports();
    }

    /// The policies nothing is in force for yet (not evaluated in full
    /// since this daemon started): what a previous daemon pinned for them
    /// stays until they are.
    pub(super) fn pending_policies(&self) -> BTreeSet<PolicyId> {
        self.policies
            .values()
            .filter(|p| p.in_force.is_none())
            .filter_map(|p| PolicyId::new(p.uid.clone()).ok())
            .collect()
    }

    /// Re-evaluates every policy whose `evaluationInterval` has come due,
    /// and retries the exec tracer's gate operations that failed.
    pub fn evaluate_due(&mut self, now: Instant) {
        self.retry_exec_trace(now);
        let due: Vec<String> = self
            .policies
            .values()
            .filter(|p| p.next_evaluation.is_some_and(|t| t <= now))
            .map(|p| p.name.clone())
            .collect();
        for name in &due {
            self.evaluate(name);
            self.observe_policy(name);
        }
        if !due.is_empty() {
            self.refresh_reports();
        }
    }

    /// The next time [`Engine::evaluate_due`] has work.
    pub fn next_due(&self) -> Option<Instant> {
        self.policies
            .values()
            .filter_map(|p| p.next_evaluation)
            .chain(self.plane.gate_retry_due())
            .min()
    }

    /// Evaluates a policy (on a spec change or its interval): at once if it
    /// reads no data source, else once its data has been fetched (see
    /// [`Engine::data_ready`]); the watch loop never waits on the network.
    /// Returns whether it evaluated (and programmed) now.
    fn evaluate(&mut self, name: &str) -> bool {
        let Some(state) = self.policies.get_mut(name) else {
            return false;
        };
        state.next_evaluation = state.interval.map(|d| Instant::now() + d);
        let PolicyOutcome::Compiled { compiled, .. } = &state.outcome else {
            state.evaluated_at = Some(now());
            return false;
        };
        let sources = compiled.sources().to_vec();
        if !sources.is_empty() {
            // Spread the fleet's fetches over the interval (data.rs).
            let random = std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                Instant::now(),
            );
            state.next_evaluation = state.interval.map(|d| Instant::now() + jittered(d, random));
        }
        if let (false, Some(fetcher)) = (sources.is_empty(), &self.fetcher) {
            if state.awaiting_data {
                // The interval came round while the last fetch is still
                // under way (each is bounded by FETCH_TIMEOUT): let it
                // finish rather than restart it, which, with an interval
                // shorter than a slow source, would never evaluate. A spec
                // change starts a fresh state, and so a fresh fetch.
                tracing::debug!(policy = %name, "data sources still being fetched");
                return false;
            }
            state.data_epoch += 1;
            state.awaiting_data = true;
            fetcher.request(DataRequest {
                policy: name.to_string(),
                uid: state.uid.clone(),
                epoch: state.data_epoch,
                sources,
            });
            return false;
        }
        self.evaluate_with(name, &DataSet::new());
        true
    }

    /// A policy's data has been fetched: evaluate it over that data and
    /// program the result (unless the policy changed or was deleted
    /// meanwhile, or a newer request is under way).
    pub fn data_ready(&mut self, ready: DataReady) {
        let Some(state) = self.policies.get_mut(&ready.policy) else {
            return;
        };
        if state.uid != ready.uid || state.data_epoch != ready.epoch || !state.awaiting_data {
            tracing::debug!(policy = %ready.policy, epoch = ready.epoch, "stale data ignored");
            return;
        }
        state.awaiting_data = false;
        tracing::debug!(policy = %ready.policy, sources = ready.data.len(), took = ?ready.took, "data sources fetched");
        self.evaluate_with(&ready.policy, &ready.data);
        self.observe_policy(&ready.policy);
        self.refresh_reports();
    }

    /// Evaluates a policy over `data` and programs what is then in force
    /// (see the module docs: a behavior that fails keeps its last good
    /// lists).
    fn evaluate_with(&mut self, name: &str, data: &DataSet) {
        let show_data_values = self.show_data_values;
        let Some(state) = self.policies.get_mut(name) else {
            return;
        };
        let PolicyOutcome::Compiled {
            compiled,
            evaluate_error,
        } = &mut state.outcome
        else {
            state.evaluated_at = Some(now());
            return;
        };
        let p = compiled.evaluate_partial(shared_policy_context(), data, RUNTIME_COST_BUDGET);
        let disclosure = Disclosure::of(compiled, show_data_values);
        let failed = !p.errors.is_empty();
        if failed {
            // A data source that fails for one interval must not drop
            // enforcement: what was in force stays for what failed.
            let message = p
                .errors
                .iter()
                .map(|e| disclosure.evaluate_error(e))
                .collect::<Vec<_>>()
                .join("; ");
            tracing::warn!(policy = %name, %message, "policy evaluation failed");
            *evaluate_error = Some(message);
        } else {
            *evaluate_error = None;
            // Only a success moves lastEvaluatedTime (issue 38): after a
            // failure it says when the lists in force were last computed.
            state.evaluated_at = Some(now());
        }
        let was = state.in_force.as_ref();
        let Some((result, generations)) =
            lists_in_force(compiled, p.result, failed, state.generation, was)
        else {
            return;
        };
        let changed = was.map(|w| &w.result.behaviors) != Some(&result.behaviors);
        if changed && !compiled.sources().is_empty() {
            // Data-driven lists changed: worth a line, with what they are
            // now.
            tracing::info!(policy = %name, lists = %summary(&result, &disclosure), cost = p.cost, "policy evaluated over fetched data: its lists changed");
        }
        let target = compiled.target.clone();
        let filters = compiled.monitor_filter.clone();
        state.in_force = Some(InForce {
            target,
            filters,
            result,
            generations,
        });
        self.program(name);
    }

    /// Programs every manager from what is in force for a policy, under
    /// its spec's mode.
    pub(super) fn program(&mut self, name: &str) {
        let Some(state) = self.policies.get(name) else {
            return;
        };
        let Some((target, result)) = state
            .in_force
            .as_ref()
            .map(|f| (f.target.clone(), f.result.clone()))
        else {
            return;
        };
        let Some(mode) = kernel_mode(state.mode) else {
            return;
        };
        let disclosure = match &state.outcome {
            PolicyOutcome::Compiled { compiled, .. } => {
                Disclosure::of(compiled, self.show_data_values)
            }
            _ => Disclosure::default(),
        };
        // The protected namespaces' pods are no enforce policy's.
        let target = match mode {
            kyverno_runtime_enforce::openexec::Mode::Enforce => {
                target.excluding_namespaces(&self.protected)
            }
            kyverno_runtime_enforce::openexec::Mode::Monitor => target,
        };
        let uid = state.uid.clone();
        let Ok(id) = PolicyId::new(uid.clone()) else {
            return;
        };
        // The monitor learns the lists before the kernel does, so the
        // first refusal they cause already names this policy (the callers
        // settle it with observe_policy once the kernel holds them).
        self.stage_policy(name);
        let mut failures = Vec::new();
        // The spec-level conditions come from the spec alone (issue 38):
        // the managers' own parse functions over the evaluated lists, with
        // nothing of this node's kernel in them, so every node at the same
        // generation writes the same answer. What a manager here refuses
        // beyond that (a domain where the DNS answer snooper failed) is
        // this node's to say, in its shard.
        let mut rejections = spec_rejections(mode, &result, &disclosure);
        rejections.warnings = Warnings::of(&result);
        let mut refused_here = Rejections::default();
        // Logged when they change, not on every re-evaluation.
        if self.rejections.get(&uid).map(|r| &r.warnings) != Some(&rejections.warnings) {
            let w = &rejections.warnings;
            for warning in w.network.iter().chain(&w.open).chain(&w.exec) {
                tracing::warn!(policy = %name, %warning, "a policy value is accepted but cannot match as written");
            }
        }
        if let Some(m) = self.openexec.get() {
            let outcome = m.upsert_policy(OpenExecPolicy {
                id: id.clone(),
                name: name.to_string(),
                mode,
                target: target.clone(),
                open: BehaviorLists::merge(&result, BehaviorKind::Open),
                exec: BehaviorLists::merge(&result, BehaviorKind::Exec),
            });
            for r in &outcome.rejections {
                // The path names the side (`...open.deny`), which is how the
                // two spec conditions are told apart.
                if r.path.contains(".exec") {
                    refused_here.exec.push(disclosure.rejection(r));
                } else {
                    refused_here.open.push(disclosure.rejection(r));
                }
            }
            for f in &outcome.failures {
                self.metrics
                    .kernel_update_failed(BackendBehavior::open_exec, enforce_failure(&f.error));
            }
            failures.extend(outcome.failures.iter().map(ToString::to_string));
        }
        if let Some(m) = self.egress.get() {
            let outcome = m.upsert_policy(NetworkPolicy {
                id: id.clone(),
                name: name.to_string(),
                mode,
                target: target.clone(),
                network: BehaviorLists::merge(&result, BehaviorKind::Network),
            });
            refused_here
                .network
                .extend(outcome.rejections.iter().map(|r| disclosure.rejection(r)));
            for f in &outcome.failures {
                self.metrics
                    .kernel_update_failed(BackendBehavior::network, enforce_failure(&f.error));
            }
            failures.extend(outcome.failures.iter().map(ToString::to_string));
        }
        if let Some(m) = self.protocol.get() {
            let outcome = m.upsert_policy(ProtocolPolicy {
                id: id.clone(),
                name: name.to_string(),
                mode,
                target: target.clone(),
                protocol: BehaviorLists::merge(&result, BehaviorKind::Protocol),
            });
            refused_here
                .network
                .extend(outcome.rejections.iter().map(|r| disclosure.rejection(r)));
            failures.extend(outcome.failures.iter().map(ToString::to_string));
        }
        if let Some(m) = self.dns.get() {
            let outcome = m.upsert_policy(DnsPolicy {
                id,
                name: name.to_string(),
                mode,
                target,
                dns: BehaviorLists::merge(&result, BehaviorKind::Dns),
            });
            refused_here
                .network
                .extend(outcome.rejections.iter().map(|r| disclosure.rejection(r)));
            failures.extend(outcome.failures.iter().map(ToString::to_string));
        }
        failures.extend(refused_only_here(&refused_here, &rejections));
        if let Some(first) = failures.first() {
            // One line for the policy, not one per failed call (a full map
            // refuses every cgroup's binding).
            tracing::error!(policy = %name, failures = failures.len(), first = %first, "programming the policy failed");
        }
        self.failures.insert(uid.clone(), failures);
        self.rejections.insert(uid, rejections);
    }
}

/// The metric reason of a backend's error.
pub(super) fn enforce_failure(e: &kyverno_runtime_enforce::EnforceError) -> KernelUpdateFailure {
    use kyverno_runtime_enforce::EnforceError as E;
    match e {
        E::MapFull { .. } => KernelUpdateFailure::map_full,
        E::Kernel { .. } => KernelUpdateFailure::kernel,
        _ => KernelUpdateFailure::other,
    }
}

/// The values of a policy's evaluated lists that no node can program,
/// found with the managers' own compile functions and nothing of this
/// node's kernel: domains count as servable and Services as resolvable
/// (a Service without addresses is not a rejection). TargetsValid,
/// OpenRulesValid and ExecRulesValid are built from this alone, so they
/// are the same on every node that evaluated the same lists.
fn spec_rejections(
    mode: kyverno_runtime_enforce::openexec::Mode,
    result: &EvaluationResult,
    disclosure: &Disclosure,
) -> Rejections {
    use kyverno_runtime_enforce::{dns, egress, openexec, protocol};
    let lists = |kind| BehaviorLists::merge(result, kind);
    let mut out = Rejections::default();
    let (_, open) = openexec::compile_paths(mode, lists(BehaviorKind::Open).as_ref());
    out.open
        .extend(open.iter().map(|r| disclosure.rejection(r)));
    let (_, exec) = openexec::compile_paths(mode, lists(BehaviorKind::Exec).as_ref());
    out.exec
        .extend(exec.iter().map(|r| disclosure.rejection(r)));
    let services = kyverno_runtime_enforce::names::ServiceAddresses::new();
    let names = egress::NameContext {
        services: &services,
        domains: Ok(()),
    };
    let compiled = egress::compile_network(mode, lists(BehaviorKind::Network).as_ref(), &names);
    out.network
        .extend(compiled.rejections.iter().map(|r| disclosure.rejection(r)));
    let (_, refused) = protocol::compile_protocol(mode, lists(BehaviorKind::Protocol).as_ref());
    out.network
        .extend(refused.iter().map(|r| disclosure.rejection(r)));
    if let Some(l) = lists(BehaviorKind::Dns) {
        let (_, refused) = dns::NameMatcher::compile(&l);
        out.network
            .extend(refused.iter().map(|r| disclosure.rejection(r)));
    }
    out
}

/// What this node's managers refused beyond what [`spec_rejections`]
/// refuses everywhere, as failures of this node (its shard's message and
/// availability): the value is valid, this node cannot serve it.
pub(super) fn refused_only_here(here: &Rejections, everywhere: &Rejections) -> Vec<String> {
    let everywhere: BTreeSet<&String> = everywhere
        .network
        .iter()
        .chain(&everywhere.open)
        .chain(&everywhere.exec)
        .collect();
    here.network
        .iter()
        .chain(&here.open)
        .chain(&here.exec)
        .filter(|r| !everywhere.contains(r))
        .map(|r| format!("not programmable on this node: {r}"))
        .collect()
}

/// A policy's evaluated lists in one bounded line (the first values of
/// each list and how many more; only their sizes when `disclosure` hides
/// values).
fn summary(result: &EvaluationResult, disclosure: &Disclosure) -> String {
    const SHOWN: usize = 8;
    disclosure.lists(result, |values: &[String]| {
        let mut out = values
            .iter()
            .take(SHOWN)
            .map(|v| bounded(v, 64))
            .collect::<Vec<_>>()
            .join(", ");
        if values.len() > SHOWN {
            out.push_str(&format!(", … ({} in all)", values.len()));
        }
        format!("[{out}]")
    })
}

/// When a policy that reads data sources is evaluated again: its interval
/// plus `random`'s share of up to a tenth of it, so that the nodes of a
/// fleet, which all fetch for themselves, spread their fetches over the
/// interval instead of asking together at its start.
fn jittered(interval: Duration, random: u64) -> Duration {
    let spread = u64::try_from((interval / 10).as_nanos()).unwrap_or(u64::MAX);
    if spread == 0 {
        return interval;
    }
    interval.saturating_add(Duration::from_nanos(random % spread))
}

#[cfg(test)]
mod tests {
    use super::jittered;
    use std::time::Duration;

    #[test]
    fn a_data_policys_next_evaluation_is_spread_over_a_tenth_of_its_interval() {
        let interval = Duration::from_secs(60);
        let mut seen = std::collections::BTreeSet::new();
        for random in [0, 1, 5_999_999_999, 6_000_000_000, u64::MAX, 12_345_678_901] {
            let d = jittered(interval, random);
            assert!(
                interval <= d && d < interval + Duration::from_secs(6),
                "{random}: {d:?}"
            );
            seen.insert(d);
        }
        assert!(seen.len() > 3, "spread, not one value: {seen:?}");
        assert_eq!(jittered(Duration::ZERO, 7), Duration::ZERO);
        assert_eq!(
            jittered(Duration::from_nanos(9), 7),
            Duration::from_nanos(9)
        );
    }
}
