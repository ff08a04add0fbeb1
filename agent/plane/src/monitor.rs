//! The monitor: the [`Sink`] that turns attributed events into findings.
//!
//! It holds every monitor- and enforce-mode policy in a per-event-ready
//! form ([`MonitorPolicy`]: mode, selector, compiled matchers, monitorFilter
//! predicates), replaced whole on every change, and the namespaces' labels
//! (events carry the pod's own labels; selectors also read its
//! namespace's). Per event it takes the policies selecting the pod (cached
//! per pod until the pod, a policy or a namespace changes), keeps those
//! with a behavior of the event's kind, and judges the event's target with
//! the kernel's semantics ([`crate::matchers`]):
//!
//! - a **monitor** policy whose lists would deny it makes a counterfactual
//!   finding (`enforced: false`), if its monitorFilter lets it through;
//! - an **enforce** policy makes a finding only when the kernel refused the
//!   operation and the refusal is its own (`enforced: true`): the kernel
//!   merges every selecting policy into one decision by the one rule
//!   ([`kyverno_runtime_policy::rule`]), and the refusal is blamed on the
//!   policies whose explicit deny matched, or, when none did and no policy
//!   allowed it, on the default denies ([`rule::blamed`]); a default deny
//!   that another policy's allow lifted is not named for a refusal an
//!   explicit deny made;
//! - a **dns** question is judged by the name matcher and graded as an
//!   advisory finding (never "would have been denied": `event.wouldDeny`
//!   is false), if the policy's monitorFilter lets it through;
//! - while a policy is reprogrammed, the kernel may refuse by its old
//!   lists or its new ones: the engine stages the new form before the
//!   kernel changes ([`Monitor::stage_policy`]), the old one stays beside it
//!   and, once settled, for a grace as long as a drained counter can take
//!   to arrive; a refusal only the old form denies is judged by it;
//! - a refusal by an enforce policy deleted within that grace makes no
//!   finding (its results go with it) and is counted as `policy_deleted`;
//! - a kernel refusal no enforce policy explains (a policy deleted longer
//!   ago, pins adopted from a previous daemon) is counted as
//!   `unattributed_kernel_deny` and logged, never lost silently.

use crate::collector::Sink;
use crate::event::{Event, Facts, Kind, PodRef};
use crate::filter::{event_value, filter_context, passes, FilterError};
use crate::matchers::Behaviors;
use kyverno_runtime_api::runtimepolicy::RuntimePolicyMode;
use kyverno_runtime_enforce::dns::NameVerdict;
use kyverno_runtime_metrics::{DropReason, Metrics};
use kyverno_runtime_policy::compile::{CompiledFilter, EvaluationResult};
use kyverno_runtime_policy::rule::{self, Decision, Matches};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_report::{self as report, Finding, PodIdentity, Process};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Where findings go (the reporter, the push stream). Implementations
/// redact before anything leaves the daemon.
pub trait FindingSink: Send + Sync {
    /// Takes one finding. Must not block.
    fn submit(&self, finding: Finding);
}

/// One policy as the monitor needs it.
#[derive(Clone, Debug)]
pub struct MonitorPolicy {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// Monitor or enforce.
    pub mode: RuntimePolicyMode,
    /// Which pods it selects.
    pub target: PodTarget,
    /// Its behaviors, compiled.
    pub behaviors: Behaviors,
    /// Its monitorFilter predicates, in order (monitor mode only: admission
    /// and the compiler refuse them on an enforce policy).
    pub filters: Vec<CompiledFilter>,
    /// The form this one replaces while the kernel is being reprogrammed
    /// from it (see [`Monitor::stage_policy`]): the kernel may still refuse
    /// by the old lists, and such a refusal is the policy's all the same.
    pub previous: Option<Arc<MonitorPolicy>>,
    /// Until when [`previous`](Self::previous) explains refusals: `None`
    /// while staged; once settled, the monitor's grace (counters the kernel
    /// took by the old lists arrive with the next drain).
    pub previous_until: Option<Instant>,
}

impl MonitorPolicy {
    /// A policy from its last evaluation.
    pub fn new(
        name: impl Into<String>,
        uid: impl Into<String>,
        mode: RuntimePolicyMode,
        target: PodTarget,
        evaluated: &EvaluationResult,
        filters: Vec<CompiledFilter>,
    ) -> Self {
        MonitorPolicy {
            name: name.into(),
            uid: uid.into(),
            mode,
            target,
            behaviors: Behaviors::compile(evaluated),
            filters,
            previous: None,
            previous_until: None,
        }
    }

    /// The previous form, while it still explains refusals.
    fn previous_form(&self) -> Option<&MonitorPolicy> {
        let previous = self.previous.as_deref()?;
        match self.previous_until {
            Some(until) if Instant::now() >= until => None,
            _ => Some(previous),
        }
    }

    /// Whether, as an enforce policy, it denies what `facts` describe: the
    /// refusals it explains.
    fn refuses(&self, facts: &Facts) -> bool {
        self.mode == RuntimePolicyMode::Enforce && self.judge(facts).is_some_and(Decision::refused)
    }

    fn has(&self, kind: Kind) -> bool {
        match kind {
            Kind::Open => self.behaviors.open.is_some(),
            Kind::Exec => self.behaviors.exec.is_some(),
            Kind::Net => self.behaviors.net.is_some(),
            Kind::Protocol => self.behaviors.protocol.is_some(),
            Kind::Dns => self.behaviors.dns.is_some(),
        }
    }

    /// The decision of a non-dns behavior on `facts`, this policy alone.
    fn judge(&self, facts: &Facts) -> Option<Decision> {
        self.matches(facts).map(|m| rule::decide([m]))
    }

    /// Which of a non-dns behavior's lists match `facts`.
    fn matches(&self, facts: &Facts) -> Option<Matches> {
        let b = &self.behaviors;
        match facts {
            Facts::Open { path } => b.open.as_ref().map(|m| m.matches(path)),
            Facts::Exec { filename, .. } => b.exec.as_ref().map(|m| m.matches(filename)),
            Facts::Net { dest, names, .. } => b.net.as_ref().map(|m| m.matches(*dest, names)),
            Facts::Protocol { protocol, alpn } => b
                .protocol
                .as_ref()
                .map(|m| m.matches(protocol, alpn.as_deref())),
            Facts::Dns { .. } => None,
        }
    }
}

#[derive(Default)]
struct Table {
    generation: u64,
    policies: Vec<Arc<MonitorPolicy>>,
    /// Enforce policies deleted less than the grace ago, with when they
    /// stop explaining refusals (see [`Monitor::retire_policy`]).
    retired: Vec<(Instant, Arc<MonitorPolicy>)>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
}

struct Selection {
    pod_version: u64,
    generation: u64,
    policies: Arc<[Arc<MonitorPolicy>]>,
}

thread_local! {
    /// The monitorFilter run-time functions, built once per thread (the
    /// CEL context is neither `Send` nor cheap to build).
    static FILTER_CONTEXT: cel::Context<'static> = filter_context();
}

/// The monitor; see the module docs.
pub struct Monitor {
    table: RwLock<Arc<Table>>,
    selections: Mutex<HashMap<String, Selection>>,
    sinks: Vec<Arc<dyn FindingSink>>,
    metrics: Option<Arc<Metrics>>,
    previous_grace: Duration,
}

impl Monitor {
    /// A monitor handing findings to `sinks`.
    pub fn new(sinks: Vec<Arc<dyn FindingSink>>, metrics: Option<Arc<Metrics>>) -> Self {
        Monitor {
            table: RwLock::default(),
            selections: Mutex::default(),
            sinks,
            metrics,
            previous_grace: Duration::ZERO,
        }
    }

    /// How long a settled policy's previous form still explains refusals:
    /// as long as a refusal can take to reach the monitor (counters are
    /// drained at an interval), so one the old lists made just before the
    /// kernel was reprogrammed is not left unexplained.
    pub fn with_previous_grace(mut self, grace: Duration) -> Self {
        self.previous_grace = grace;
        self
    }

    fn edit(&self, f: impl FnOnce(&mut Table)) {
        let mut guard = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let mut table = Table {
            generation: guard.generation + 1,
            policies: guard.policies.clone(),
            retired: guard
                .retired
                .iter()
                .filter(|(until, _)| now < *until)
                .cloned()
                .collect(),
            namespaces: guard.namespaces.clone(),
        };
        f(&mut table);
        *guard = Arc::new(table);
    }

    /// Adds or replaces a policy (by name). A staged form it settles passes
    /// its previous form on for the grace ([`Self::with_previous_grace`]).
    pub fn set_policy(&self, mut policy: MonitorPolicy) {
        let until = Instant::now() + self.previous_grace;
        self.edit(|t| {
            let old = t.policies.iter().position(|p| p.name == policy.name);
            if let Some(old) = old.map(|i| t.policies.remove(i)) {
                if self.previous_grace > Duration::ZERO {
                    policy.previous = old.previous.clone();
                    policy.previous_until = Some(match old.previous_until {
                        Some(earlier) => earlier.min(until),
                        None => until,
                    });
                }
            }
            t.policies.push(Arc::new(policy));
        });
    }

    /// Adds or replaces a policy (by name) *before* the kernel is
    /// programmed from it. The new form judges from now on, so the first
    /// refusal its lists cause is explained; the form it replaces stays
    /// attached as [`MonitorPolicy::previous`], so a refusal the kernel
    /// still makes by the old lists meanwhile is explained too.
    /// [`set_policy`](Self::set_policy) with the same form, once the kernel
    /// holds it, settles it: the old one is kept for the grace
    /// ([`Self::with_previous_grace`]), then no longer explains anything.
    pub fn stage_policy(&self, mut policy: MonitorPolicy) {
        self.edit(|t| {
            let old = t.policies.iter().position(|p| p.name == policy.name);
            if let Some(old) = old.map(|i| t.policies.remove(i)) {
                // One form back only: a form staged and never settled is
                // what the kernel may hold, its own predecessor is not.
                policy.previous = Some(match &old.previous {
                    None => old,
                    Some(_) => Arc::new(MonitorPolicy {
                        previous: None,
                        previous_until: None,
                        ..(*old).clone()
                    }),
                });
                policy.previous_until = None;
            }
            t.policies.push(Arc::new(policy));
        });
    }

    /// Removes a policy.
    pub fn remove_policy(&self, name: &str) {
        self.edit(|t| t.policies.retain(|p| p.name != name));
    }

    /// Removes a deleted policy, after the kernel stopped enforcing it. For
    /// the grace ([`Self::with_previous_grace`]) an enforce policy still
    /// explains the refusals it made before (drained counters arrive late):
    /// they make no finding (the policy is gone, and so are its results)
    /// and are counted as `policy_deleted`, not as a refusal nothing
    /// explains.
    pub fn retire_policy(&self, name: &str) {
        let until = Instant::now() + self.previous_grace;
        let grace = self.previous_grace > Duration::ZERO;
        self.edit(|t| {
            let old = t.policies.iter().position(|p| p.name == name);
            if let Some(old) = old.map(|i| t.policies.remove(i)) {
                if grace && old.mode == RuntimePolicyMode::Enforce {
                    t.retired.push((until, old));
                }
            }
        });
    }

    /// Sets a namespace's labels.
    pub fn set_namespace(&self, name: &str, labels: BTreeMap<String, String>) {
        self.edit(|t| {
            t.namespaces.insert(name.to_string(), labels);
        });
    }

    /// Forgets a namespace.
    pub fn remove_namespace(&self, name: &str) {
        self.edit(|t| {
            t.namespaces.remove(name);
        });
    }

    /// Policies held.
    pub fn policy_count(&self) -> usize {
        self.current().policies.len()
    }

    fn current(&self) -> Arc<Table> {
        Arc::clone(&self.table.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The policies selecting `pod`, from the cache while neither the pod
    /// nor the table changed.
    fn selecting(&self, table: &Table, pod: &PodRef) -> Arc<[Arc<MonitorPolicy>]> {
        let mut cache = self
            .selections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = cache.get(&pod.uid) {
            if s.pod_version == pod.version && s.generation == table.generation {
                return Arc::clone(&s.policies);
            }
        }
        let empty = BTreeMap::new();
        let ns = table.namespaces.get(&pod.namespace).unwrap_or(&empty);
        let policies: Arc<[Arc<MonitorPolicy>]> = table
            .policies
            .iter()
            .filter(|p| p.target.matches(ns, &pod.labels))
            .cloned()
            .collect();
        // A pod gone from the index leaves its entry; the cache is bounded
        // by clearing it whole (cheap to rebuild) when it outgrows a node.
        if cache.len() > 16_384 {
            cache.clear();
        }
        cache.insert(
            pod.uid.clone(),
            Selection {
                pod_version: pod.version,
                generation: table.generation,
                policies: Arc::clone(&policies),
            },
        );
        policies
    }

    fn emit(
        &self,
        policy: &MonitorPolicy,
        event: &Event,
        pod: &PodRef,
        enforced: bool,
        decision: Option<report::Decision>,
    ) {
        if let Some(m) = &self.metrics {
            m.finding_emitted(&policy.name, behavior(event.kind()).as_str());
        }
        if self.sinks.is_empty() {
            return;
        }
        let process = event.process.as_ref().map(|p| Process {
            pid: p.pid,
            comm: p.comm.clone(),
            argv: match &event.facts {
                Facts::Exec { argv, .. } => argv.clone(),
                _ => Vec::new(),
            },
        });
        let matched = match (&event.facts, &policy.behaviors.net) {
            (Facts::Net { names, .. }, Some(net)) => net.named(names),
            _ => Vec::new(),
        };
        let finding = Finding {
            policy: policy.name.clone(),
            policy_uid: policy.uid.clone(),
            behavior: behavior(event.kind()),
            pod: PodIdentity {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                container: event.container().map(str::to_string),
                owner_kind: pod.owner_kind.clone(),
                owner_name: pod.owner_name.clone(),
            },
            target: event.facts.target(),
            enforced,
            decision,
            count: event.count,
            first_observed: event.time,
            last_observed: event.time,
            process,
            matched,
        };
        let (last, rest) = match self.sinks.split_last() {
            Some(split) => split,
            None => return,
        };
        for sink in rest {
            sink.submit(finding.clone());
        }
        last.submit(finding);
    }

    /// Whether a policy deleted within the grace, selecting the pod,
    /// denies what the kernel refused.
    fn retired_explains(&self, table: &Table, pod: &PodRef, event: &Event) -> bool {
        let now = Instant::now();
        let empty = BTreeMap::new();
        let ns = table.namespaces.get(&pod.namespace).unwrap_or(&empty);
        table.retired.iter().any(|(until, p)| {
            now < *until && p.target.matches(ns, &pod.labels) && p.refuses(&event.facts)
        })
    }

    /// Whether `policy`'s monitorFilter lets the finding on `event`
    /// through; `value` is the event's `event` object, built on first use
    /// with `would_deny`.
    fn admits(
        &self,
        policy: &MonitorPolicy,
        event: &Event,
        pod: &PodRef,
        value: &mut Option<cel::Value>,
        would_deny: bool,
    ) -> bool {
        if policy.filters.is_empty() {
            return true;
        }
        let value = value.get_or_insert_with(|| event_value(event, pod, would_deny));
        let mut errors = Vec::new();
        let pass = FILTER_CONTEXT.with(|ctx| passes(&policy.filters, ctx, value, &mut errors));
        self.filter_errors(policy, errors, &event.facts);
        pass
    }

    fn filter_errors(&self, policy: &MonitorPolicy, errors: Vec<FilterError>, facts: &Facts) {
        for e in errors {
            if let Some(m) = &self.metrics {
                m.monitor_filter_eval_error(&policy.name, &e.expression);
            }
            // The evaluator's error can quote the event (`No such key:
            // <argv[2]>`): a log line is a way out too, so it passes the
            // chokepoint, which masks there what it masks in the argv.
            let argv: &[String] = match facts {
                Facts::Exec { argv, .. } => argv,
                _ => &[],
            };
            let error = report::sanitize_with_argv(&e.error, argv);
            tracing::debug!(policy = %policy.name, expression = %e.expression, error = %error, "monitorFilter failed to evaluate; the finding is reported anyway");
        }
    }
}

/// The finding behavior of an event kind.
pub fn behavior(kind: Kind) -> report::Behavior {
    match kind {
        Kind::Net => report::Behavior::Network,
        Kind::Dns => report::Behavior::Dns,
        Kind::Exec => report::Behavior::Exec,
        Kind::Open => report::Behavior::Open,
        Kind::Protocol => report::Behavior::Protocol,
    }
}

/// The enforce policies a kernel refusal is attributed to: those the rule
/// blames ([`rule::blamed`]). When the rule over the lists the monitor
/// holds refuses nothing (the kernel may still hold lists being replaced),
/// each policy whose own lists refuse it, so that a refusal is not left
/// unexplained for a lag.
fn blame<'a>(enforcing: &[(&'a MonitorPolicy, Matches)]) -> Vec<(&'a MonitorPolicy, Matches)> {
    let matches: Vec<Matches> = enforcing.iter().map(|(_, m)| *m).collect();
    let mut blamed = rule::blamed(&matches);
    if blamed.is_empty() {
        blamed = (0..matches.len())
            .filter(|&i| rule::decide([matches[i]]).refused())
            .collect();
    }
    blamed.into_iter().map(|i| enforcing[i]).collect()
}

/// A finding's decision property: which list refused (or would).
fn decision_of(d: Decision) -> Option<report::Decision> {
    match d {
        Decision::Denied => Some(report::Decision::Denied),
        Decision::DefaultDenied => Some(report::Decision::DefaultDenied),
        Decision::Allowed | Decision::Unmatched => None,
    }
}

impl Sink for Monitor {
    fn name(&self) -> &'static str {
        "monitor"
    }

    fn handle(&self, event: &Event) {
        let Some(pod) = event.pod.as_deref() else {
            // Attribution drops what it cannot place; nothing to match.
            return;
        };
        let table = self.current();
        let kind = event.kind();
        let kernel_denied = event.kernel_denied();
        let mut explained = false;
        // Built at most once per event, and only for a filter (a dns
        // question takes only the advisory path, anything else only the
        // counterfactual one, so one `wouldDeny` per event).
        let mut filter_event = None;
        // The enforce policies with a behavior of the kind, and what their
        // lists say: a kernel refusal is theirs to share by the rule.
        let mut enforcing: Vec<(&MonitorPolicy, Matches)> = Vec::new();
        let selecting = self.selecting(&table, pod);
        for policy in selecting.iter() {
            // While a policy is being reprogrammed, a refusal only its
            // previous form explains is judged by that form.
            let policy = match policy.previous_form() {
                Some(previous)
                    if kernel_denied
                        && !policy.refuses(&event.facts)
                        && previous.refuses(&event.facts) =>
                {
                    previous
                }
                _ => &**policy,
            };
            if !policy.has(kind) {
                continue;
            }
            if let Facts::Dns { qname } = &event.facts {
                let Some(m) = &policy.behaviors.dns else {
                    continue;
                };
                let v = m.judge(qname);
                // Advisory: no enforcing form would have blocked a
                // question, so, as in the Go original, `wouldDeny` is
                // false, and the filter narrows it all the same.
                if v.reported() && self.admits(policy, event, pod, &mut filter_event, false) {
                    let decision = (v == NameVerdict::Denied).then_some(report::Decision::Denied);
                    self.emit(policy, event, pod, false, decision);
                }
                continue;
            }
            let Some(matches) = policy.matches(&event.facts) else {
                continue;
            };
            let verdict = rule::decide([matches]);
            match policy.mode {
                RuntimePolicyMode::Enforce => {
                    if kernel_denied {
                        enforcing.push((policy, matches));
                    }
                }
                RuntimePolicyMode::Monitor if !verdict.refused() => {}
                RuntimePolicyMode::Monitor => {
                    // The counterfactual: an enforcing form of this policy
                    // would have denied it (`wouldDeny`).
                    if self.admits(policy, event, pod, &mut filter_event, true) {
                        self.emit(policy, event, pod, false, decision_of(verdict));
                    }
                }
            }
        }
        for (policy, matches) in blame(&enforcing) {
            explained = true;
            self.emit(
                policy,
                event,
                pod,
                true,
                decision_of(rule::decide([matches])),
            );
        }
        if kernel_denied {
            // A log line is a way out of the daemon too: the target passes
            // through the redaction chokepoint.
            tracing::info!(
                behavior = behavior(kind).as_str(),
                target = %report::sanitize(&event.facts.target()),
                pod = %format!("{}/{}", pod.namespace, pod.name),
                count = event.count,
                pid = event.process.as_ref().map(|p| p.pid),
                comm = %event.process.as_ref().map(|p| report::sanitize(&p.comm)).unwrap_or_default(),
                "kernel refused"
            );
        }
        if kernel_denied && !explained && self.retired_explains(&table, pod, event) {
            if let Some(m) = &self.metrics {
                m.events_dropped("monitor", DropReason::policy_deleted, event.count);
            }
            tracing::debug!(
                kind = kind.as_str(),
                pod = %format!("{}/{}", pod.namespace, pod.name),
                target = %report::sanitize(&event.facts.target()),
                "the kernel refused an operation by a policy deleted since"
            );
            return;
        }
        if kernel_denied && !explained {
            if let Some(m) = &self.metrics {
                m.events_dropped("monitor", DropReason::unattributed_kernel_deny, event.count);
            }
            tracing::debug!(
                kind = kind.as_str(),
                pod = %format!("{}/{}", pod.namespace, pod.name),
                target = %report::sanitize(&event.facts.target()),
                "the kernel refused an operation no enforce policy explains"
            );
        }
    }
}
