//! `/healthz`: healthy once the policy informer has synced and while the
//! collector's dispatch loop keeps ticking.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared health state; components update it, the endpoint reads it.
pub struct Health {
    /// The monotonic clock; injectable so a stall can be proven without
    /// sleeping through one.
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
    started: Instant,
    policies_synced: AtomicBool,
    /// Milliseconds since `started` of the collector's last tick.
    last_collector_tick_ms: AtomicU64,
    stall_after: Duration,
}

/// Why the daemon is unhealthy, one reason per failing check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The RuntimePolicy informer has not synced its cache yet.
    #[error("the RuntimePolicy informer has not synced")]
    PoliciesNotSynced,
    /// The collector loop has not ticked within the stall threshold.
    #[error("the collector loop has not ticked for {0:?}")]
    CollectorStalled(Duration),
}

impl Health {
    /// A health state that reads unhealthy until the informer syncs; the
    /// collector counts as stalled once it has not ticked for `stall_after`.
    pub fn new(stall_after: Duration) -> Self {
        Self::with_clock(stall_after, Instant::now)
    }

    /// Like [`Health::new`], reading time from `clock` (a test's manual
    /// clock); it must never go backwards.
    pub fn with_clock(
        stall_after: Duration,
        clock: impl Fn() -> Instant + Send + Sync + 'static,
    ) -> Self {
        Health {
            started: clock(),
            clock: Box::new(clock),
            policies_synced: AtomicBool::new(false),
            last_collector_tick_ms: AtomicU64::new(0),
            stall_after,
        }
    }

    /// The RuntimePolicy informer's cache has synced.
    pub fn set_policies_synced(&self) {
        self.policies_synced.store(true, Ordering::Release);
    }

    /// The collector's dispatch loop is alive: its heartbeat, called once
    /// per loop iteration. Until the first call the loop counts as having
    /// ticked at construction, so startup gets one stall window of grace.
    pub fn collector_tick(&self) {
        self.last_collector_tick_ms
            .store(self.elapsed_ms(), Ordering::Release);
    }

    fn elapsed_ms(&self) -> u64 {
        let elapsed = (self.clock)().saturating_duration_since(self.started);
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    }

    /// Every failing check, or `Ok` when healthy.
    pub fn check(&self) -> Result<(), Vec<Unhealthy>> {
        let mut failing = Vec::new();
        if !self.policies_synced.load(Ordering::Acquire) {
            failing.push(Unhealthy::PoliciesNotSynced);
        }
        let since_tick = Duration::from_millis(
            self.elapsed_ms()
                .saturating_sub(self.last_collector_tick_ms.load(Ordering::Acquire)),
        );
        if since_tick > self.stall_after {
            failing.push(Unhealthy::CollectorStalled(since_tick));
        }
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_until_synced_then_healthy_while_ticking() {
        let health = Health::new(Duration::from_secs(60));
        assert_eq!(health.check(), Err(vec![Unhealthy::PoliciesNotSynced]));
        health.set_policies_synced();
        health.collector_tick();
        assert_eq!(health.check(), Ok(()));
    }

    #[test]
    fn a_collector_that_stops_ticking_is_stalled() {
        let now = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
        let clock = {
            let now = now.clone();
            move || *now.lock().unwrap()
        };
        let advance = |d: Duration| *now.lock().unwrap() += d;
        let health = Health::with_clock(Duration::from_secs(20), clock);
        health.set_policies_synced();
        health.collector_tick();
        advance(Duration::from_secs(20));
        assert_eq!(health.check(), Ok(()), "exactly the window is not a stall");
        advance(Duration::from_secs(1));
        assert_eq!(
            health.check(),
            Err(vec![Unhealthy::CollectorStalled(Duration::from_secs(21))])
        );
        health.collector_tick();
        assert_eq!(health.check(), Ok(()));
    }
}
