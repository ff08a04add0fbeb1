//! The engine's side of the event plane (`kyverno_runtime_plane`).
//!
//! The engine owns the managers, so it is what the poll sources drain
//! through ([`Engine::poll_openexec`], [`Engine::poll_egress`]); and it sees
//! every policy, namespace and pod change first, so it keeps the plane's
//! views current: the attribution [`Index`], the [`Monitor`]'s policies and
//! namespaces, and the exec tracer's cgroup gate (the cgroups of the pods a
//! monitor-mode policy with an exec behavior selects).
//!
//! Exec observations reach the monitor once each: where the exec tracer is
//! available and gates the cgroup, a traced exec (with argv, pid, comm and
//! the paths the exec programs resolved) is the observation, and the
//! counters' allowed execs of that cgroup are not emitted again; refusals
//! never reach the tracer (a refused exec does not happen) and come from
//! the refusal records, or from the counters for what a cgroup's record
//! budget left out.

use super::{Engine, Slot};
use kyverno_runtime_api::runtimepolicy::RuntimePolicyMode;
use kyverno_runtime_bpf::dns::DnsQuestion;
use kyverno_runtime_bpf::egress::Evictions;
use kyverno_runtime_bpf::exectrace::{ExecRecord, ExecTraceError, ExecTracer};
use kyverno_runtime_bpf::openexec::{self as kopenexec, Denial};
use kyverno_runtime_enforce::Decision;
use kyverno_runtime_metrics::{DropReason, GateOperation};
use kyverno_runtime_plane::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use kyverno_runtime_plane::sources::Polled;
use kyverno_runtime_plane::{
    Index, Monitor, MonitorPolicy, SourceError, SourceState, SourceStates,
};
use kyverno_runtime_policy::values::BehaviorKind;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Source names, as status and metrics label them.
pub const OPENEXEC_SOURCE: &str = "openexec-observe";
/// The per-occurrence refusal records of the open/exec programs.
pub const DENIALS_SOURCE: &str = "openexec-denials";
/// The exec tracer.
pub const EXEC_TRACE_SOURCE: &str = "exec-trace";
/// The egress filter's and the classifier's counters.
pub const EGRESS_SOURCE: &str = "egress-observe";
/// The DNS question observer.
pub const DNS_SOURCE: &str = "dnsquery";

/// The exec tracer's cgroup gate, as the engine drives it: the seam that
/// lets its bookkeeping be tested without a kernel.
pub trait ExecGate: Send + Sync {
    /// Lets the cgroup's execs be traced.
    fn admit(&self, cgroup: u64) -> Result<(), ExecTraceError>;
    /// Stops them; whether it was admitted.
    fn revoke(&self, cgroup: u64) -> Result<bool, ExecTraceError>;
}

impl ExecGate for ExecTracer {
    fn admit(&self, cgroup: u64) -> Result<(), ExecTraceError> {
        ExecTracer::admit(self, cgroup)
    }

    fn revoke(&self, cgroup: u64) -> Result<bool, ExecTraceError> {
        ExecTracer::revoke(self, cgroup)
    }
}

/// The plane's parts the engine keeps current.
pub struct Plane {
    /// Attribution.
    pub index: Arc<Index>,
    /// The monitor.
    pub monitor: Arc<Monitor>,
    /// The exec tracer's gate, when the tracer loaded.
    pub tracer: Option<Arc<dyn ExecGate>>,
    /// Every source's lifecycle, for the shards' eventSources.
    pub sources: SourceStates,
}

/// The first wait before a failed gate operation is tried again; it
/// doubles while they keep failing, up to [`GATE_RETRY_MAX`].
const GATE_RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait between retries of failed gate operations.
const GATE_RETRY_MAX: Duration = Duration::from_secs(60);

/// [`Plane`] and what the engine derived from it.
pub(super) struct PlaneState {
    pub(super) parts: Plane,
    /// The cgroups the exec tracer's gate holds: admitted, and not since
    /// revoked (a failed admit is not here, a failed revoke still is).
    traced: BTreeSet<u64>,
    /// When the gate operations that failed are tried again.
    gate_retry: Option<(Instant, Duration)>,
}

impl PlaneState {
    pub(super) fn new(parts: Plane) -> Self {
        PlaneState {
            parts,
            traced: BTreeSet::new(),
            gate_retry: None,
        }
    }

    /// When [`Engine::retry_exec_trace`] has work.
    pub(super) fn gate_retry_due(&self) -> Option<Instant> {
        self.gate_retry.map(|(at, _)| at)
    }
}

/// The kernel's cumulative loss counters as last read, so each poll
/// reports what was lost since the previous one
/// (`events_dropped_total{source,reason}`):
///
/// | counter | source | reason |
/// | --- | --- | --- |
/// | `oe_stats.observe_failed`: the open/exec observation map (a preallocated hash) was full | `openexec-observe` | `map_full` |
/// | `stats.observe_failed`: the egress observation map refused a key | `egress-observe` | `map_full` |
/// | keys the egress observation map (an LRU) evicted before a drain ([`Evictions`]) | `egress-observe` | `evicted` |
/// | observations of a container past its share of the egress observation map (so that it evicts no other's) | `egress-observe` | `over_share` |
/// | `events_lost`: the protocol classifier's decision map was full | `egress-observe` | `map_full` |
///
/// The other kernel-side losses are counted where their records are read:
/// the denial ring's `rate_limited` and `ringbuf_full`
/// (`openexec-denials`), the exec tracer's and the DNS observer's
/// `ringbuf_full` (`exec-trace`, `dnsquery`), the DNS answer snooper's
/// (`dnssnoop`). The pinned counters outlive a daemon, so the baseline is
/// what they hold when the engine is built: a restarted daemon does not
/// count its predecessor's losses again.
#[derive(Debug, Default)]
pub(super) struct Losses {
    openexec_failed: Option<u64>,
    egress_failed: Option<u64>,
    evictions: Option<Evictions>,
    /// Each filter set's cumulative `over_share`, as last read.
    over_share: std::collections::HashMap<u32, u64>,
}

/// What a cumulative counter gained since `seen` (which becomes `now`).
/// The first reading is the baseline; a counter that went down was
/// recreated (new maps), and counts from zero.
fn gained(seen: &mut Option<u64>, now: u64) -> u64 {
    let gained = match *seen {
        None => 0,
        Some(before) if now < before => now,
        Some(before) => now - before,
    };
    *seen = Some(now);
    gained
}

impl Engine {
    /// Reads the loss counters' baselines (see [`Losses`]); a counter that
    /// cannot be read now takes its first poll as the baseline.
    pub(super) fn with_loss_baselines(mut self) -> Self {
        if let Slot::Ready(m) = &self.openexec {
            if let Ok(stats) = m.open_backend().stats() {
                self.losses.openexec_failed = Some(stats.observe_failed);
            }
        }
        if let Slot::Ready(m) = &self.egress {
            let filter = m.backend().kernel().filter();
            // Present keys first, then the counters (Evictions::new).
            let present = filter.count_observations();
            if let Ok(stats) = filter.read_stats() {
                self.losses.egress_failed = Some(stats.observe_failed);
                self.losses.evictions = Some(Evictions::new(
                    present,
                    stats.observe_inserted,
                    filter.observations_taken(),
                ));
            }
        }
        self
    }

    /// Hands a policy's form in force to the monitor (or takes it away when
    /// nothing of it is in force, or it has no mode the engine reports in),
    /// and re-gates the exec tracer.
    pub(super) fn observe_policy(&mut self, name: &str) {
        let monitor = &self.plane.parts.monitor;
        match self.monitor_form(name) {
            Some(form) => monitor.set_policy(form),
            // Deleted (and unprogrammed): its late refusals are its own.
            None if !self.policies.contains_key(name) => monitor.retire_policy(name),
            None => monitor.remove_policy(name),
        }
        self.sync_exec_trace();
    }

    /// Hands a policy's new form to the monitor before the kernel is
    /// programmed from it (`Monitor::stage_policy`): a refusal by either the
    /// new lists or the ones being replaced is explained meanwhile.
    pub(super) fn stage_policy(&self, name: &str) {
        if let Some(form) = self.monitor_form(name) {
            self.plane.parts.monitor.stage_policy(form);
        }
    }

    /// The monitor's form of a policy: `None` when it did not compile, has
    /// no successful evaluation, or has no mode the engine reports in.
    fn monitor_form(&self, name: &str) -> Option<MonitorPolicy> {
        let p = self.policies.get(name)?;
        let in_force = p.in_force.as_ref()?;
        Some(MonitorPolicy::new(
            p.name.clone(),
            p.uid.clone(),
            p.mode?,
            in_force.target.clone(),
            &in_force.result,
            in_force.filters.clone(),
        ))
    }

    /// A namespace's labels changed (or it is gone: `None`).
    pub(super) fn observe_namespace(&mut self, name: &str) {
        match self.namespaces.get(name) {
            Some(labels) => self.plane.parts.monitor.set_namespace(name, labels.clone()),
            None => self.plane.parts.monitor.remove_namespace(name),
        }
        self.sync_exec_trace();
    }

    /// A pod changed (or is gone): re-index it.
    pub(super) fn observe_pod(&mut self, uid: &str) {
        match self.pods.get(uid) {
            Some(p) => self.plane.parts.index.upsert(PodRef {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: uid.to_string(),
                labels: p.labels.clone(),
                owner_kind: p.owner.as_ref().map(|o| o.0.clone()),
                owner_name: p.owner.as_ref().map(|o| o.1.clone()),
                containers: {
                    // A decision taken through the pod's directory names
                    // the pod, and no container: none has started yet.
                    let mut names = p.cgroups.names.clone();
                    if let Some(id) = self.pod_dirs.cgroup_of(uid) {
                        names.insert(id, String::new());
                    }
                    names
                },
                container_ids: p.container_ids.clone(),
                node_name: p.node_name.clone(),
                service_account: p.service_account.clone(),
                version: 0,
            }),
            None => self.plane.parts.index.remove(uid),
        }
        self.sync_exec_trace();
    }

    /// Admits to the exec tracer's gate exactly the cgroups of the pods a
    /// monitor-mode policy with an exec behavior selects, and revokes the
    /// rest (admit new ones first, so a pod moving between policies is
    /// never briefly untraced).
    ///
    /// A cgroup counts as traced only once its admit succeeded; a failed
    /// admit or revoke is counted
    /// (`exec_trace_gate_failures_total{operation}`) and tried again by
    /// [`Engine::retry_exec_trace`], after a wait that doubles from 1 s to
    /// 60 s while they keep failing.
    pub(super) fn sync_exec_trace(&mut self) {
        if self.batch.open {
            self.batch.exec_trace = true;
            return;
        }
        let Some(gate) = self.plane.parts.tracer.clone() else {
            return;
        };
        let watching: Vec<_> = self
            .policies
            .values()
            .filter(|p| p.mode == Some(RuntimePolicyMode::Monitor))
            .filter(|p| p.active.contains(&BehaviorKind::Exec))
            .filter_map(|p| p.target().cloned())
            .collect();
        let mut want = BTreeSet::new();
        if !watching.is_empty() {
            for pod in self.pods.values() {
                let ns = self.namespace_labels(&pod.namespace);
                if watching.iter().any(|t| t.matches(&ns, &pod.labels)) {
                    want.extend(pod.cgroups.ids());
                }
            }
        }
        let mut failed: Vec<(u64, GateOperation, ExecTraceError)> = Vec::new();
        let admit: Vec<u64> = want.difference(&self.plane.traced).copied().collect();
        for id in admit {
            match gate.admit(id) {
                Ok(()) => {
                    self.plane.traced.insert(id);
                }
                Err(e) => failed.push((id, GateOperation::admit, e)),
            }
        }
        let revoke: Vec<u64> = self.plane.traced.difference(&want).copied().collect();
        for id in revoke {
            match gate.revoke(id) {
                Ok(_) => {
                    self.plane.traced.remove(&id);
                }
                Err(e) => failed.push((id, GateOperation::revoke, e)),
            }
        }
        let Some((cgroup, operation, error)) = failed.first() else {
            self.plane.gate_retry = None;
            return;
        };
        for (_, op, _) in &failed {
            self.metrics.exec_trace_gate_failure(*op);
        }
        let wait = match self.plane.gate_retry {
            Some((_, last)) => (last * 2).min(GATE_RETRY_MAX),
            None => GATE_RETRY_MIN,
        };
        self.plane.gate_retry = Some((Instant::now() + wait, wait));
        tracing::warn!(
            failed = failed.len(),
            cgroup,
            operation = ?operation,
            %error,
            retry_in = ?wait,
            "the exec tracer's gate refused cgroups (an unadmitted cgroup's execs are counted without argv; a cgroup not revoked is still traced)"
        );
    }

    /// Tries the gate operations that failed again, once their wait is
    /// over (see [`Engine::sync_exec_trace`]).
    pub(super) fn retry_exec_trace(&mut self, now: Instant) {
        if self.plane.gate_retry_due().is_some_and(|at| at <= now) {
            self.sync_exec_trace();
        }
    }

    /// Whether the exec tracer is reporting `cgroup`'s execs now.
    pub(super) fn traced(&self, cgroup: u64) -> bool {
        self.plane.traced.contains(&cgroup)
            && self
                .plane
                .parts
                .sources
                .get(super::observe::EXEC_TRACE_SOURCE)
                .is_some_and(|s| s == SourceState::Available)
    }

    /// Drains the open/exec counters into events (the
    /// `openexec-observe` poll source). Both dimensions are read even when
    /// one fails; the poll fails only when nothing could be read.
    pub fn poll_openexec(&mut self) -> Result<Polled, SourceError> {
        let Slot::Ready(m) = &mut self.openexec else {
            return Err(SourceError::new(
                self.openexec
                    .reason()
                    .unwrap_or("the open/exec backend is not loaded")
                    .to_string(),
            ));
        };
        let drained = m.drain();
        let mut lost = Vec::new();
        match m.open_backend().stats() {
            Ok(stats) => lost.push((
                DropReason::map_full,
                gained(&mut self.losses.openexec_failed, stats.observe_failed),
            )),
            Err(e) => tracing::debug!(error = %e, "open/exec loss counters unavailable"),
        }
        if let Ok((_, decisions)) = m.open_backend().pod_fallback() {
            // Counted from 0 at the programs' load, which this process did.
            let seen = &mut self.pod_dirs.decisions_seen;
            self.metrics
                .pod_cgroup_decisions(decisions.saturating_sub(*seen));
            *seen = (*seen).max(decisions);
        }
        match m.open_backend().run_stats() {
            Ok(stats) => self.metrics.record_bpf_program_stats(
                stats
                    .iter()
                    .map(|s| (s.name.as_str(), s.run_time_ns, s.run_count)),
            ),
            Err(e) => tracing::debug!(error = %e, "BPF run statistics unavailable"),
        }
        let mut errors = Vec::new();
        for (behavior, e) in &drained.errors {
            tracing::warn!(behavior = behavior.name(), error = %e, "draining open/exec counters failed");
            errors.push(format!("{}: {e}", behavior.name()));
        }
        if errors.len() >= 2 {
            return Err(SourceError::new(errors.join("; ")));
        }
        let now = SystemTime::now();
        let mut events = Vec::new();
        for (behavior, obs) in drained.observations {
            let exec = behavior == kyverno_runtime_compat::Behavior::Exec;
            if exec && !obs.decision.refused() && self.traced(obs.cgroup) {
                // The tracer reported this exec, with its argv.
                continue;
            }
            let facts = if exec {
                Facts::Exec {
                    filename: obs.observed,
                    argv: Vec::new(),
                }
            } else {
                Facts::Open { path: obs.observed }
            };
            let mut e = Event::new(OPENEXEC_SOURCE, facts);
            e.time = now;
            e.cgroup = Some(obs.cgroup);
            e.count = obs.count;
            e.kernel = Some(obs.decision.into());
            events.push(e);
        }
        Ok(Polled { events, lost })
    }

    /// Drains the egress filter's and the classifier's counters into events
    /// (the `egress-observe` poll source), and the DNS answer snooper's
    /// counters into metrics.
    pub fn poll_egress(&mut self) -> Result<Polled, SourceError> {
        self.snoop_counters();
        let mut polled = Polled::default();
        let mut errors = Vec::new();
        let now = SystemTime::now();
        let event = |facts: Facts, cgroup: u64, count: u64, decision: Decision| {
            let mut e = Event::new(EGRESS_SOURCE, facts);
            e.time = now;
            e.cgroup = Some(cgroup);
            e.count = count;
            e.kernel = Some(decision.into());
            e
        };
        let mut loaded = false;
        if let Slot::Ready(m) = &mut self.egress {
            loaded = true;
            // Read before the drain, so a key created during it is never
            // counted as evicted (see Evictions).
            let before = m.backend().kernel().filter().read_stats();
            let drained = m.drain();
            match before {
                Ok(stats) => {
                    let losses = &mut self.losses;
                    polled.lost.push((
                        DropReason::map_full,
                        gained(&mut losses.egress_failed, stats.observe_failed),
                    ));
                    let taken = m.backend().kernel().filter().observations_taken();
                    let evicted = match &mut losses.evictions {
                        Some(e) => e.update(stats.observe_inserted, taken),
                        None => {
                            // No baseline at start: this poll is it.
                            losses.evictions =
                                Some(Evictions::new(0, stats.observe_inserted, taken));
                            0
                        }
                    };
                    polled.lost.push((DropReason::evicted, evicted));
                }
                Err(e) => errors.push(format!("egress loss counters: {e}")),
            }
            match m.backend().kernel().filter().observations_over_share() {
                Ok(sets) => {
                    let seen = &mut self.losses.over_share;
                    let mut lost = 0;
                    for (set, over) in &sets {
                        // The budgets are not pinned: a set's counter starts
                        // at zero with this daemon's load.
                        let mut before = Some(seen.get(set).copied().unwrap_or(0));
                        let gained = gained(&mut before, *over);
                        if gained > 0 {
                            tracing::warn!(set = set, lost = gained, "egress: a container sent to more distinct destinations than its share of the observation map; those were not counted, so that it evicts no other container's counts");
                        }
                        lost += gained;
                    }
                    // A set freed since is gone from the map (and its
                    // counter with it).
                    *seen = sets.into_iter().collect();
                    polled.lost.push((DropReason::over_share, lost));
                }
                Err(e) => errors.push(format!("egress observation shares: {e}")),
            }
            match drained {
                Ok(observations) => {
                    // The names the monitor judges Service and domain
                    // values by, read once per drain and only when needed.
                    let names = (!observations.is_empty()).then(|| m.destination_names());
                    for obs in observations {
                        let names = names
                            .as_ref()
                            .map(|n| n.of(obs.cgroup, obs.observed))
                            .unwrap_or_default();
                        polled.events.push(event(
                            Facts::Net {
                                dest: obs.observed,
                                port: None,
                                names,
                            },
                            obs.cgroup,
                            obs.count,
                            obs.decision,
                        ));
                    }
                }
                Err(e) => errors.push(format!("egress: {e}")),
            }
        }
        if let Slot::Ready(m) = &mut self.protocol {
            loaded = true;
            let drained = m.drain();
            // The classifier's decision map was full: flows it could not
            // count.
            polled
                .lost
                .push((DropReason::map_full, drained.events_lost));
            for e in drained.errors {
                errors.push(format!("protocol: {e}"));
            }
            for obs in drained.observations {
                polled.events.push(event(
                    Facts::Protocol {
                        protocol: obs.protocol,
                        alpn: obs.alpn,
                    },
                    obs.cgroup,
                    obs.count,
                    obs.decision,
                ));
            }
        }
        if !loaded {
            return Err(SourceError::new(
                self.egress
                    .reason()
                    .unwrap_or("the egress filter is not loaded")
                    .to_string(),
            ));
        }
        for e in &errors {
            tracing::warn!(error = %e, "draining egress counters failed");
        }
        if polled.events.is_empty() && errors.len() >= 2 {
            return Err(SourceError::new(errors.join("; ")));
        }
        Ok(polled)
    }

    /// The open/exec programs' outcome counters, when they are loaded.
    pub fn openexec_stats(&self) -> Option<kopenexec::OpenExecStats> {
        let Slot::Ready(m) = &self.openexec else {
            return None;
        };
        m.open_backend().stats().ok()
    }

    /// The names of the policies with a behavior of one of `kinds` in
    /// force, in `mode` (any mode: `None`), that select a pod on this
    /// node: those whose findings a loss of those records (which cannot
    /// say whose they were) may leave incomplete.
    pub fn policies_with(
        &self,
        mode: Option<RuntimePolicyMode>,
        kinds: &[BehaviorKind],
    ) -> Vec<String> {
        self.policies
            .values()
            .filter(|p| mode.is_none() || p.mode == mode)
            .filter(|p| p.active.iter().any(|k| kinds.contains(k)))
            .filter(|p| {
                p.target().is_some_and(|t| {
                    self.pods
                        .values()
                        .any(|pod| t.matches(&self.namespace_labels(&pod.namespace), &pod.labels))
                })
            })
            .map(|p| p.name.clone())
            .collect()
    }

    /// The DNS observer's kernel-side losses since the last call.
    pub fn dns_losses(&mut self) -> Vec<(DropReason, u64)> {
        let Slot::Ready(m) = &mut self.dns else {
            return Vec::new();
        };
        match m.stats_delta() {
            Ok(d) => vec![
                (DropReason::ringbuf_full, d.ringbuf_full),
                (DropReason::name_unreadable, d.name_unreadable),
            ],
            Err(e) => {
                tracing::debug!(error = %e, "DNS loss counters unavailable");
                Vec::new()
            }
        }
    }
}

/// The event of one refusal record (`openexec-denials`).
pub fn denial_event(d: Denial) -> Event {
    let path = String::from_utf8_lossy(&d.path).into_owned();
    let facts = match d.dimension {
        kopenexec::Dimension::Exec => Facts::Exec {
            filename: path,
            argv: Vec::new(),
        },
        kopenexec::Dimension::Open => Facts::Open { path },
    };
    let mut e = Event::new(DENIALS_SOURCE, facts);
    e.cgroup = Some(d.cgroup);
    e.kernel = Some(match d.decision {
        kopenexec::Decision::DefaultDenied => KernelVerdict::DefaultDenied,
        _ => KernelVerdict::Denied,
    });
    e.process = Some(ProcessInfo {
        pid: d.pid,
        comm: d.comm,
    });
    e
}

/// The events of one traced exec (`exec-trace`): one per path the exec
/// programs resolved (the binary, a script's interpreter), or one for the
/// filename as given when they resolved none.
pub fn exec_events(r: ExecRecord) -> Vec<Event> {
    let filenames = if r.resolved.is_empty() {
        vec![r.filename]
    } else {
        r.resolved
    };
    filenames
        .into_iter()
        .map(|filename| {
            let mut e = Event::new(
                EXEC_TRACE_SOURCE,
                Facts::Exec {
                    filename,
                    argv: r.argv.clone(),
                },
            );
            e.cgroup = Some(r.cgroup_id);
            e.kernel = Some(KernelVerdict::Allowed);
            e.process = Some(ProcessInfo {
                pid: r.pid,
                comm: r.comm.clone(),
            });
            e
        })
        .collect()
}

/// The event of one DNS question (`dnsquery`).
pub fn dns_event(q: DnsQuestion) -> Event {
    let mut e = Event::new(DNS_SOURCE, Facts::Dns { qname: q.qname });
    e.cgroup = Some(q.cgroup_id);
    e
}
