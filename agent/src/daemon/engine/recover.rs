//! A backend that loaded after start (`daemon/retry.rs` retries a load
//! that failed where the kernel can serve it) joins the engine the way it
//! would have at start: through the same programming paths, so it holds
//! what a backend loaded at start would.

use super::*;
use kyverno_runtime_metrics::SourceFailureReason;

/// A backend loaded after start.
// Made once per backend and moved once into its slot: the size is moot.
#[allow(clippy::large_enum_variant)]
pub enum Late {
    /// The open/exec manager.
    OpenExec(OpenExec),
    /// The network manager.
    Egress(Egress),
    /// The protocol classifier.
    Protocol(Protocol),
    /// The DNS question observer's gate.
    Dns(Dns),
}

impl Late {
    /// What it is, for the logs and the sources' reason.
    fn what(&self) -> &'static str {
        match self {
            Late::OpenExec(_) => "the open/exec backend",
            Late::Egress(_) => "the egress filter",
            Late::Protocol(_) => "the protocol classifier",
            Late::Dns(_) => "the DNS question observer",
        }
    }

    /// Its slot.
    fn slot(&self) -> LateSlot {
        match self {
            Late::OpenExec(_) => LateSlot::OpenExec,
            Late::Egress(_) => LateSlot::Egress,
            Late::Protocol(_) => LateSlot::Protocol,
            Late::Dns(_) => LateSlot::Dns,
        }
    }

    /// The event sources built from it at start: the collector starts
    /// its sources once, so these stay down until a restart.
    fn sources(&self) -> &'static [&'static str] {
        match self {
            Late::OpenExec(_) => &[OPENEXEC_SOURCE, DENIALS_SOURCE, EXEC_TRACE_SOURCE],
            Late::Egress(_) | Late::Protocol(_) => &[EGRESS_SOURCE],
            Late::Dns(_) => &[DNS_SOURCE],
        }
    }
}

impl Engine {
    /// Takes a backend that loaded after start: the slot becomes ready,
    /// `backends` (this node's entries for the behaviors it serves) replace
    /// the shard's, every policy is programmed into it and every known pod
    /// bound, exactly as at start; what a previous daemon pinned is
    /// reconciled if the start's reconciliation already ran. Event sources
    /// that would have been built from it and are down say they need a
    /// restart (one still running, as `egress-observe` with the protocol
    /// classifier loaded, drains the new backend through the engine).
    pub fn install(&mut self, late: Late, backends: Vec<BehaviorBackend>) {
        let what = late.what();
        let sources = late.sources();
        let slot = late.slot();
        match late {
            Late::OpenExec(m) => self.openexec = Slot::Ready(m),
            Late::Egress(m) => {
                self.egress = Slot::Ready(m);
                self.replay_services();
            }
            Late::Protocol(m) => self.protocol = Slot::Ready(m),
            Late::Dns(m) => self.dns = Slot::Ready(m),
        }
        for b in backends {
            match self.backends.iter_mut().find(|e| e.behavior == b.behavior) {
                Some(e) => *e = b,
                None => self.backends.push(b),
            }
        }
        // Policies first, then pods: the order of the start's sync.
        let names: Vec<String> = self.policies.keys().cloned().collect();
        for name in &names {
            self.program(name);
            self.observe_policy(name);
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            self.program_pod(uid);
        }
        if self.adopted_reconciled {
            self.reconcile_late(slot);
        }
        for source in sources {
            if let Some(SourceState::Failed { .. }) = self.plane.parts.sources.get(source) {
                self.plane.parts.sources.set(
                    source,
                    SourceState::Failed {
                        kind: SourceFailureReason::DependencyUnavailable,
                        reason: format!("{what} loaded after start; observation needs a restart"),
                    },
                );
            }
        }
        tracing::info!(
            backend = what,
            policies = names.len(),
            pods = uids.len(),
            "{what} loaded after start: every policy programmed into it and every pod bound"
        );
        self.refresh_reports();
    }

    /// A retry of `slot`'s load failed for a new `reason`: the shard says
    /// it from now on.
    pub fn still_unavailable(
        &mut self,
        slot: LateSlot,
        reason: &str,
        backends: Vec<BehaviorBackend>,
    ) {
        let reason = reason.to_owned();
        match slot {
            LateSlot::OpenExec if self.openexec.get_ref().is_none() => {
                self.openexec = Slot::Unavailable(reason)
            }
            LateSlot::Egress if self.egress.get_ref().is_none() => {
                self.egress = Slot::Unavailable(reason)
            }
            LateSlot::Protocol if self.protocol.get_ref().is_none() => {
                self.protocol = Slot::Unavailable(reason)
            }
            LateSlot::Dns if self.dns.get_ref().is_none() => self.dns = Slot::Unavailable(reason),
            _ => return,
        }
        for b in backends {
            if let Some(e) = self.backends.iter_mut().find(|e| e.behavior == b.behavior) {
                *e = b;
            }
        }
        self.refresh_reports();
    }

    /// Hands the Service addresses reported while no network manager was
    /// loaded to the one that now is.
    fn replay_services(&mut self) {
        let services = std::mem::take(&mut self.late_services);
        let synced = std::mem::take(&mut self.late_services_synced);
        let Some(m) = self.egress.get() else {
            return;
        };
        // No policy is programmed into it yet: nothing to re-program.
        for (service, addresses) in services {
            let _ = m.set_service_addresses(service, addresses);
        }
        if synced {
            let _ = m.services_synced();
        }
    }

    /// The start's reconciliation of adopted pins, for a pinned backend
    /// that loaded after it (only that one: the others were reconciled
    /// then, and again would drop what they keep for policies pending
    /// since).
    fn reconcile_late(&mut self, slot: LateSlot) {
        let pending = self.pending_policies();
        match slot {
            LateSlot::OpenExec => self.reconcile_adopted_openexec(&pending),
            LateSlot::Egress => self.reconcile_adopted_egress(&pending),
            // Not pinned: nothing adopted.
            LateSlot::Protocol | LateSlot::Dns => {}
        }
    }
}

/// Which slot a retried load is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateSlot {
    /// Open/exec.
    OpenExec,
    /// Network.
    Egress,
    /// Protocol.
    Protocol,
    /// DNS.
    Dns,
}
