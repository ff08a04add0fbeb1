//! Retrying a backend whose load failed where the kernel can serve it
//! (issue 25, point 1): the probe's plan said it is available and the load
//! then failed (the pin directory could not be claimed yet, a map creation
//! hit ENOMEM or EAGAIN, bpffs not mounted yet). Such a failure can go
//! away, so the load is tried again with capped exponential backoff until
//! it succeeds, and the engine then takes the backend as if it had loaded
//! at start. What the probe measured as absent is never retried: the
//! kernel will not grow it.
//!
//! Every attempt is counted (`backend_load_attempts_total{behavior,
//! result}`) and `backend_available{behavior}` says the state; a failure is
//! logged once per distinct reason (then at debug), so a node whose bpffs
//! stays unmounted does not fill its log.

use super::engine::{Late, LateSlot};
use super::load::{self, LoadConfig, Loaded};
use super::watches::{lock, SharedEngine};
use kyverno_runtime_api::runtimepolicy::BehaviorBackend;
use kyverno_runtime_compat::{Backend, Behavior, Plan};
use kyverno_runtime_metrics::{BackendBehavior, BackendLoadResult, Metrics};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The wait before the first retry.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest wait between retries.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// Capped exponential backoff: `first`, doubling, never above `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// A schedule starting at `first` and capped at `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            next: first.min(max),
            max,
        }
    }

    /// The wait before the next attempt; the one after doubles, up to the
    /// cap.
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        now
    }
}

/// One backend being retried.
struct Pending {
    slot: LateSlot,
    /// Why its last attempt failed (a new reason is logged, a repeat not).
    reason: String,
    backoff: Backoff,
    due: Instant,
}

/// The backends to retry and what their loads need.
pub(super) struct Retries {
    cfg: LoadConfig,
    /// This node's `backends` entries as the plan gives them (what a
    /// backend that loads reports).
    planned: Vec<BehaviorBackend>,
    pending: Vec<Pending>,
    metrics: Arc<Metrics>,
}

/// The metric label of a slot.
fn label(slot: LateSlot) -> BackendBehavior {
    match slot {
        LateSlot::OpenExec => BackendBehavior::open_exec,
        LateSlot::Egress => BackendBehavior::network,
        LateSlot::Protocol => BackendBehavior::protocol,
        LateSlot::Dns => BackendBehavior::dns,
    }
}

/// The status behaviors a slot serves.
fn behaviors(slot: LateSlot) -> &'static [&'static str] {
    match slot {
        LateSlot::OpenExec => &["open", "exec"],
        LateSlot::Egress => &["network"],
        LateSlot::Protocol => &["protocol"],
        LateSlot::Dns => &["dns"],
    }
}

/// The plan's entry of a slot.
fn plan_behavior(slot: LateSlot) -> Behavior {
    match slot {
        LateSlot::OpenExec => Behavior::Open,
        LateSlot::Egress => Behavior::Network,
        LateSlot::Protocol => Behavior::Protocol,
        LateSlot::Dns => Behavior::Dns,
    }
}

/// Says in `backends` that open/exec fell back to fmod_ret, and why.
pub(super) fn with_fallback(backends: &mut [BehaviorBackend], reason: &str) {
    for b in backends
        .iter_mut()
        .filter(|b| b.behavior == "open" || b.behavior == "exec")
    {
        b.backend = Backend::FmodRet.id().to_string();
        b.reason = Some(reason.to_owned());
    }
}

impl Retries {
    /// Counts the start's loads and picks what to retry: every backend the
    /// plan says the kernel can serve whose load failed.
    pub(super) fn from_start(loaded: &Loaded, cfg: LoadConfig, metrics: Arc<Metrics>) -> Self {
        let slots = [
            (LateSlot::OpenExec, loaded.openexec.reason()),
            (LateSlot::Egress, loaded.egress.reason()),
            (LateSlot::Protocol, loaded.protocol.reason()),
            (LateSlot::Dns, loaded.dns.reason()),
        ];
        let mut pending = Vec::new();
        for (slot, failed) in slots {
            metrics.set_backend_available(label(slot), failed.is_none());
            if !loaded.plan.entry(plan_behavior(slot)).available {
                continue;
            }
            let result = match failed {
                None => BackendLoadResult::success,
                Some(_) => BackendLoadResult::failure,
            };
            metrics.backend_load_attempt(label(slot), result);
            if let (true, Some(reason)) = (retried(&loaded.plan, slot, failed), failed) {
                let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
                let due = Instant::now() + backoff.next_delay();
                pending.push(Pending {
                    slot,
                    reason: reason.to_owned(),
                    backoff,
                    due,
                });
            }
        }
        for p in &pending {
            tracing::warn!(behavior = ?label(p.slot), reason = %p.reason, first_retry = ?FIRST_RETRY, max_wait = ?MAX_RETRY, "a backend the kernel can serve failed to load: retrying with backoff");
        }
        Retries {
            cfg,
            planned: kyverno_runtime_status::backends(&loaded.plan),
            pending,
            metrics,
        }
    }

    /// `backends` entries of `slot` saying its load failed for `reason`.
    fn failed_entries(&self, slot: LateSlot, reason: &str) -> Vec<BehaviorBackend> {
        self.entries(slot)
            .into_iter()
            .map(|mut b| {
                b.reason = Some(format!("load failed (retrying): {reason}"));
                b
            })
            .collect()
    }

    /// The plan's `backends` entries of `slot`.
    fn entries(&self, slot: LateSlot) -> Vec<BehaviorBackend> {
        self.planned
            .iter()
            .filter(|b| behaviors(slot).contains(&b.behavior.as_str()))
            .cloned()
            .collect()
    }

    /// Says in `backends` (the shard's) which loads failed and are retried.
    pub(super) fn mark(&self, backends: &mut [BehaviorBackend]) {
        for p in &self.pending {
            for failed in self.failed_entries(p.slot, &p.reason) {
                if let Some(b) = backends.iter_mut().find(|b| b.behavior == failed.behavior) {
                    *b = failed;
                }
            }
        }
    }

    /// Retries until every pending backend has loaded, then waits for
    /// `stop` (the daemon's tasks all run until shutdown).
    pub(super) async fn run(mut self, engine: SharedEngine, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let Some((i, due)) = self
                .pending
                .iter()
                .enumerate()
                .map(|(i, p)| (i, p.due))
                .min_by_key(|(_, due)| *due)
            else {
                stop.await;
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = &mut stop => return,
            }
            let slot = self.pending[i].slot;
            let cfg = self.cfg.clone();
            // Loading blocks (the verifier, map creation): off the runtime's
            // threads, one at a time (libbpf's log callback is process-wide).
            let result = tokio::task::spawn_blocking(move || attempt(slot, &cfg))
                .await
                .unwrap_or_else(|e| Err(format!("the load panicked: {e}")));
            match result {
                Ok((late, fallback)) => {
                    self.metrics
                        .backend_load_attempt(label(slot), BackendLoadResult::success);
                    self.metrics.set_backend_available(label(slot), true);
                    let mut entries = self.entries(slot);
                    if let Some(reason) = &fallback {
                        with_fallback(&mut entries, reason);
                    }
                    self.pending.swap_remove(i);
                    lock(&engine).install(late, entries);
                }
                Err(reason) => {
                    self.metrics
                        .backend_load_attempt(label(slot), BackendLoadResult::failure);
                    let failed = self.failed_entries(slot, &reason);
                    let p = &mut self.pending[i];
                    let wait = p.backoff.next_delay();
                    p.due = Instant::now() + wait;
                    if p.reason == reason {
                        tracing::debug!(behavior = ?label(slot), %reason, retry_in = ?wait, "a backend failed to load again, for the same reason");
                    } else {
                        tracing::warn!(behavior = ?label(slot), %reason, retry_in = ?wait, "a backend failed to load again, for a new reason");
                        p.reason = reason.clone();
                        lock(&engine).still_unavailable(slot, &reason, failed);
                    }
                }
            }
        }
    }
}

/// One load of `slot`'s backend.
fn attempt(slot: LateSlot, cfg: &LoadConfig) -> Result<(Late, Option<String>), String> {
    Ok(match slot {
        LateSlot::OpenExec => {
            let (m, fallback) = load::load_openexec(cfg)?;
            return Ok((Late::OpenExec(m), fallback));
        }
        LateSlot::Egress => Late::Egress(load::load_egress(cfg)?),
        LateSlot::Protocol => Late::Protocol(load::load_protocol()?),
        LateSlot::Dns => Late::Dns(load::load_dns()?),
    })
    .map(|late| (late, None))
}

/// Whether `slot` is retried: only where the plan says the kernel can
/// serve it and its load `failed`.
fn retried(plan: &Plan, slot: LateSlot, failed: Option<&str>) -> bool {
    plan.entry(plan_behavior(slot)).available && failed.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_five_seconds_to_five_minutes_and_stays() {
        let mut b = Backoff::new(FIRST_RETRY, MAX_RETRY);
        let waits: Vec<u64> = (0..10).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]);
    }

    #[test]
    fn the_backoff_never_starts_above_its_cap_or_overflows() {
        let mut b = Backoff::new(Duration::from_secs(600), MAX_RETRY);
        assert_eq!(b.next_delay(), MAX_RETRY);
        let mut b = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(b.next_delay(), Duration::MAX);
        assert_eq!(b.next_delay(), Duration::MAX);
    }

    #[test]
    fn only_a_load_that_failed_where_the_kernel_can_serve_it_is_retried() {
        use kyverno_runtime_compat::PlanEntry;
        let entry = |available: bool| PlanEntry {
            backend: if available {
                Backend::CgroupSkbEgress
            } else {
                Backend::None
            },
            available,
            reason: "measured".into(),
            forced: false,
        };
        let plan = |network: bool| Plan {
            open: entry(false),
            exec: entry(false),
            network: entry(network),
            protocol: entry(false),
            dns: entry(false),
            exec_argv: entry(false),
        };
        let failed = Some("--pin-dir: not a bpffs");
        assert!(retried(&plan(true), LateSlot::Egress, failed));
        assert!(!retried(&plan(true), LateSlot::Egress, None));
        // Measured absent: the kernel will not grow it.
        assert!(!retried(&plan(false), LateSlot::Egress, failed));
        assert!(!retried(&plan(true), LateSlot::OpenExec, failed));
    }
}
