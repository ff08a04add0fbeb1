//! Kernel-side losses of a ring buffer said in the log, with the policies
//! whose findings miss them (issue 34, item 5: an exec storm that overflows
//! the exec trace's ring).
//!
//! The metric (`events_dropped_total{source, reason}`) counts every loss;
//! an operator reading the log learns from this line that it happened,
//! how many, why, and which policies' findings are incomplete. A storm
//! loses records every second for as long as it lasts, so the line is said
//! at once for the first loss and then at most once per interval, with the
//! sum of what was lost in between.

use kyverno_runtime_metrics::DropReason;
use kyverno_runtime_plane::LossPoll;
use std::time::{Duration, Instant};

/// How often a continuing loss is said again, at most.
pub(super) const LOSS_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The rate-limited log of one source's losses.
pub(super) struct LossLog {
    source: &'static str,
    /// What one record is, for the line ("exec records").
    records: &'static str,
    /// What the loss means for findings.
    consequence: &'static str,
    interval: Duration,
    last_said: Option<Instant>,
    /// Lost since the line was last said, by reason.
    pending: Vec<(DropReason, u64)>,
}

impl LossLog {
    /// The log of `source`, whose records are `records`.
    pub(super) fn new(
        source: &'static str,
        records: &'static str,
        consequence: &'static str,
        interval: Duration,
    ) -> Self {
        LossLog {
            source,
            records,
            consequence,
            interval,
            last_said: None,
            pending: Vec::new(),
        }
    }

    /// Adds one poll's losses; returns the line to say now, if any (the
    /// first loss at once, then the sum once per interval).
    pub(super) fn record(&mut self, now: Instant, lost: &[(DropReason, u64)]) -> Option<String> {
        for &(reason, n) in lost.iter().filter(|(_, n)| *n > 0) {
            match self.pending.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, total)) => *total = total.saturating_add(n),
                None => self.pending.push((reason, n)),
            }
        }
        if self.pending.is_empty() {
            return None;
        }
        if let Some(last) = self.last_said {
            if now.saturating_duration_since(last) < self.interval {
                return None;
            }
        }
        self.last_said = Some(now);
        let counts: Vec<String> = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(reason, n)| format!("{n} ({reason:?})"))
            .collect();
        Some(format!(
            "{} lost in the kernel: {} (said at most every {} s); {} \
             (events_dropped_total{{source=\"{}\"}})",
            self.records,
            counts.join(", "),
            self.interval.as_secs(),
            self.consequence,
            self.source,
        ))
    }
}

/// Wraps `poll` so that its losses are also said in the log, naming the
/// policies `affected` returns at that moment.
pub(super) fn logged(
    mut log: LossLog,
    mut poll: LossPoll,
    affected: impl Fn() -> Vec<String> + Send + 'static,
) -> LossPoll {
    Box::new(move || {
        let lost = poll();
        if let Some(line) = log.record(Instant::now(), &lost) {
            let policies = affected();
            let policies = if policies.is_empty() {
                "(none in force)".to_owned()
            } else {
                policies.join(", ")
            };
            tracing::warn!(source = log.source, policies = %policies, "{line}");
        }
        lost
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> LossLog {
        LossLog::new(
            "exec-trace",
            "exec records",
            "findings of the policies below miss them",
            Duration::from_secs(30),
        )
    }

    #[test]
    fn the_first_loss_is_said_at_once_and_the_rest_summed_once_per_interval() {
        let mut l = log();
        let t0 = Instant::now();
        assert_eq!(l.record(t0, &[(DropReason::ringbuf_full, 0)]), None);
        let first = l.record(t0, &[(DropReason::ringbuf_full, 5)]).unwrap();
        assert!(first.starts_with("exec records lost in the kernel: 5 (ringbuf_full)"));
        assert!(first.contains("events_dropped_total{source=\"exec-trace\"}"));
        // Within the interval: summed, not said.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(l.record(t1, &[(DropReason::ringbuf_full, 7)]), None);
        let t2 = t0 + Duration::from_secs(10);
        assert_eq!(l.record(t2, &[(DropReason::ringbuf_full, 8)]), None);
        // Past it: the sum, even from a poll that lost nothing.
        let t3 = t0 + Duration::from_secs(31);
        let second = l.record(t3, &[(DropReason::ringbuf_full, 0)]).unwrap();
        assert!(second.contains(": 15 (ringbuf_full)"), "{second}");
        // Nothing pending: nothing said, however long after.
        assert_eq!(l.record(t3 + Duration::from_secs(60), &[]), None);
    }

    #[test]
    fn reasons_are_counted_apart() {
        let mut l = log();
        let line = l
            .record(
                Instant::now(),
                &[(DropReason::ringbuf_full, 2), (DropReason::rate_limited, 3)],
            )
            .unwrap();
        assert!(
            line.contains("2 (ringbuf_full), 3 (rate_limited)"),
            "{line}"
        );
    }
}
