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

use super::{Engine, PolicyOutcome, Slot};
use kyverno_runtime_api::runtimepolicy::RuntimePolicyMode;
use kyverno_runtime_bpf::dns::DnsQuestion;
use kyverno_runtime_bpf::exectrace::{ExecRecord, ExecTracer};
use kyverno_runtime_bpf::openexec::{self as kopenexec, Denial};
use kyverno_runtime_enforce::Decision;
use kyverno_runtime_metrics::DropReason;
use kyverno_runtime_plane::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use kyverno_runtime_plane::sources::Polled;
use kyverno_runtime_plane::{
    Index, Monitor, MonitorPolicy, SourceError, SourceState, SourceStates,
};
use kyverno_runtime_policy::values::BehaviorKind;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

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

/// The plane's parts the engine keeps current.
pub struct Plane {
    /// Attribution.
    pub index: Arc<Index>,
    /// The monitor.
    pub monitor: Arc<Monitor>,
    /// The exec tracer, when it loaded.
    pub tracer: Option<Arc<ExecTracer>>,
    /// Every source's lifecycle, for the shards' eventSources.
    pub sources: SourceStates,
}

/// [`Plane`] and what the engine derived from it.
pub(super) struct PlaneState {
    pub(super) parts: Plane,
    /// The cgroups admitted to the exec tracer's gate.
    traced: BTreeSet<u64>,
}

impl PlaneState {
    pub(super) fn new(parts: Plane) -> Self {
        PlaneState {
            parts,
            traced: BTreeSet::new(),
        }
    }
}

fn verdict(d: Decision) -> KernelVerdict {
    match d {
        Decision::Denied => KernelVerdict::Denied,
        Decision::DefaultDenied => KernelVerdict::DefaultDenied,
        Decision::Allowed | Decision::Unmatched => KernelVerdict::Allowed,
    }
}

impl Engine {
    /// Hands a policy's current form to the monitor (or takes it away when
    /// it did not compile, has no successful evaluation, or has no mode the
    /// engine reports in), and re-gates the exec tracer.
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
        match (&p.outcome, p.mode) {
            (
                PolicyOutcome::Compiled {
                    compiled,
                    evaluated: Some(result),
                    ..
                },
                Some(mode),
            ) => Some(MonitorPolicy::new(
                p.name.clone(),
                p.uid.clone(),
                mode,
                compiled.target.clone(),
                result,
                compiled.monitor_filter.clone(),
            )),
            _ => None,
        }
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
                containers: p.cgroups.names.clone(),
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
    fn sync_exec_trace(&mut self) {
        let Some(tracer) = self.plane.parts.tracer.clone() else {
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
        for id in want.difference(&self.plane.traced) {
            if let Err(e) = tracer.admit(*id) {
                tracing::warn!(cgroup = id, error = %e, "admitting a cgroup to the exec tracer failed: its execs are counted without argv");
            }
        }
        let gone: Vec<u64> = self.plane.traced.difference(&want).copied().collect();
        for id in gone {
            if let Err(e) = tracer.revoke(id) {
                tracing::warn!(cgroup = id, error = %e, "revoking a cgroup from the exec tracer failed");
            }
        }
        self.plane.traced = want;
    }

    /// Whether the exec tracer is reporting `cgroup`'s execs now.
    fn traced(&self, cgroup: u64) -> bool {
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
            e.kernel = Some(verdict(obs.decision));
            events.push(e);
        }
        Ok(Polled {
            events,
            lost: Vec::new(),
        })
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
            e.kernel = Some(verdict(decision));
            e
        };
        let mut loaded = false;
        if let Slot::Ready(m) = &mut self.egress {
            loaded = true;
            match m.drain() {
                Ok(observations) => {
                    for obs in observations {
                        polled.events.push(event(
                            Facts::Net {
                                dest: obs.observed,
                                port: None,
                                domain: None,
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
            // count (the ring buffer's label, as before).
            polled
                .lost
                .push((DropReason::ringbuf_full, drained.events_lost));
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
