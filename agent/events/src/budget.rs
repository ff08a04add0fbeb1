//! Budgets: how many Events one policy, and one pod, may have written.
//!
//! Each policy and each pod has a token bucket: [`Budget::burst`] Events at
//! once, then one per [`Budget::refill`]. A cause is admitted only when
//! its pod's bucket and its policy's bucket both hold a token, and then
//! takes one from each; otherwise it is dropped and counted under the
//! budget that refused it (the pod's first: it is the narrower one). A
//! policy error has no pod and meets its policy's budget only.
//!
//! Memory is bounded: each table tracks at most `max_keys` buckets. A
//! bucket that has refilled to its burst is the same as no bucket, so those
//! are forgotten first when a table is full; if none has, the least
//! recently used is evicted. An evicted key starts again with a full
//! burst, so the bound on writes is loose only when a node has more than
//! `max_keys` distinct pods (or policies) in quick succession.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The shape of a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Events admitted at once after a quiet spell (0 is taken as 1).
    pub burst: u32,
    /// One more Event is admitted every `refill` (the sustained rate).
    /// Zero means no limit.
    pub refill: Duration,
}

impl Budget {
    /// The default per pod: 25 at once, then one every 5 s (two per report
    /// flush of 10 s). The same burst as client-go's per-object spam
    /// filter; a faster refill, since a repeat is a series patch, not a new
    /// object.
    pub const POD: Budget = Budget {
        burst: 25,
        refill: Duration::from_secs(5),
    };

    /// The default per policy: 100 at once, then two a second, across all
    /// the pods it selects on this node.
    pub const POLICY: Budget = Budget {
        burst: 100,
        refill: Duration::from_millis(500),
    };

    fn burst(self) -> u32 {
        self.burst.max(1)
    }
}

/// Which budget refused a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    Pod,
    Policy,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    /// When `tokens` was last brought up to date: whole refills since then
    /// are still to be added.
    refilled: Instant,
    used: Instant,
}

/// One kind's buckets (pods, or policies), at most `max_keys` of them.
#[derive(Debug)]
struct Table {
    budget: Budget,
    max_keys: usize,
    buckets: HashMap<String, Bucket>,
}

impl Table {
    fn new(budget: Budget, max_keys: usize) -> Self {
        Table {
            budget,
            max_keys: max_keys.max(1),
            buckets: HashMap::new(),
        }
    }

    /// `bucket` brought up to `now`.
    fn refill(budget: Budget, bucket: Bucket, now: Instant) -> Bucket {
        let burst = budget.burst();
        if budget.refill.is_zero() {
            return Bucket {
                tokens: burst,
                refilled: now,
                ..bucket
            };
        }
        let elapsed = now.saturating_duration_since(bucket.refilled);
        let whole = elapsed.as_nanos() / budget.refill.as_nanos();
        let tokens = u128::from(bucket.tokens).saturating_add(whole);
        if tokens >= u128::from(burst) {
            // Full: nothing accrues beyond the burst.
            return Bucket {
                tokens: burst,
                refilled: now,
                ..bucket
            };
        }
        // Below the burst, so `whole` is too, and fits a u32; the part of
        // a refill not yet earned is kept.
        let whole_u32 = u32::try_from(whole).unwrap_or(u32::MAX);
        let earned = budget.refill.saturating_mul(whole_u32);
        Bucket {
            tokens: u32::try_from(tokens).unwrap_or(burst),
            refilled: bucket.refilled.checked_add(earned).unwrap_or(now),
            ..bucket
        }
    }

    /// Whether `key` has a token at `now`.
    fn has_token(&self, key: &str, now: Instant) -> bool {
        match self.buckets.get(key) {
            Some(b) => Self::refill(self.budget, *b, now).tokens > 0,
            None => true,
        }
    }

    /// Takes a token of `key` (which [`has_token`](Self::has_token)).
    fn take(&mut self, key: &str, now: Instant) {
        let budget = self.budget;
        if let Some(b) = self.buckets.get_mut(key) {
            let mut fresh = Self::refill(budget, *b, now);
            fresh.tokens = fresh.tokens.saturating_sub(1);
            fresh.used = now;
            *b = fresh;
            return;
        }
        if self.buckets.len() >= self.max_keys {
            self.make_room(now);
        }
        self.buckets.insert(
            key.to_string(),
            Bucket {
                tokens: budget.burst() - 1,
                refilled: now,
                used: now,
            },
        );
    }

    /// Forgets the buckets that refilled to their burst; if none did,
    /// the least recently used one.
    fn make_room(&mut self, now: Instant) {
        let budget = self.budget;
        let burst = budget.burst();
        self.buckets
            .retain(|_, b| Self::refill(budget, *b, now).tokens < burst);
        if self.buckets.len() < self.max_keys {
            return;
        }
        let oldest = self
            .buckets
            .iter()
            .min_by_key(|(_, b)| b.used)
            .map(|(k, _)| k.clone());
        if let Some(oldest) = oldest {
            tracing::debug!("Event budget table full: forgetting the least recently used key");
            self.buckets.remove(&oldest);
        }
    }
}

/// The per-pod and per-policy budgets of one recorder.
#[derive(Debug)]
pub(crate) struct Budgets {
    pods: Table,
    policies: Table,
}

impl Budgets {
    pub(crate) fn new(pod: Budget, policy: Budget, max_keys: usize) -> Self {
        Budgets {
            pods: Table::new(pod, max_keys),
            policies: Table::new(policy, max_keys),
        }
    }

    /// Admits one Event of `policy` (and of `pod`, for a finding) at
    /// `now`, taking a token from each, or says which budget refused it
    /// (taking nothing).
    pub(crate) fn admit(
        &mut self,
        policy: &str,
        pod: Option<&str>,
        now: Instant,
    ) -> Result<(), Refused> {
        if let Some(pod) = pod {
            if !self.pods.has_token(pod, now) {
                return Err(Refused::Pod);
            }
        }
        if !self.policies.has_token(policy, now) {
            return Err(Refused::Policy);
        }
        if let Some(pod) = pod {
            self.pods.take(pod, now);
        }
        self.policies.take(policy, now);
        Ok(())
    }

    /// Keys tracked: (pods, policies).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> (usize, usize) {
        (self.pods.buckets.len(), self.policies.buckets.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn budget(burst: u32, refill: Duration) -> Budget {
        Budget { burst, refill }
    }

    #[test]
    fn a_pod_gets_its_burst_then_its_rate() {
        let mut b = Budgets::new(budget(3, 10 * SEC), budget(1000, SEC), 16);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(b.admit("p", Some("pod-a"), t0), Ok(()));
        }
        assert_eq!(b.admit("p", Some("pod-a"), t0), Err(Refused::Pod));
        // Another pod of the same policy has its own budget.
        assert_eq!(b.admit("p", Some("pod-b"), t0), Ok(()));
        // 9.9 s later: no whole refill yet.
        let t = t0 + Duration::from_millis(9_900);
        assert_eq!(b.admit("p", Some("pod-a"), t), Err(Refused::Pod));
        // 10 s: one.
        assert_eq!(b.admit("p", Some("pod-a"), t0 + 10 * SEC), Ok(()));
        assert_eq!(
            b.admit("p", Some("pod-a"), t0 + 10 * SEC),
            Err(Refused::Pod)
        );
        // The partial refill is kept: 25 s after t0 is one more (at 20 s),
        // not two.
        assert_eq!(b.admit("p", Some("pod-a"), t0 + 25 * SEC), Ok(()));
        assert_eq!(
            b.admit("p", Some("pod-a"), t0 + 25 * SEC),
            Err(Refused::Pod)
        );
        assert_eq!(b.admit("p", Some("pod-a"), t0 + 30 * SEC), Ok(()));
        // A long quiet spell refills to the burst, not beyond.
        let later = t0 + 3600 * SEC;
        for _ in 0..3 {
            assert_eq!(b.admit("p", Some("pod-a"), later), Ok(()));
        }
        assert_eq!(b.admit("p", Some("pod-a"), later), Err(Refused::Pod));
    }

    #[test]
    fn a_policy_is_budgeted_across_its_pods_and_its_errors() {
        let mut b = Budgets::new(budget(100, SEC), budget(4, 60 * SEC), 16);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(b.admit("p", Some(&format!("pod-{i}")), t0), Ok(()));
        }
        // A policy error counts against the same policy.
        assert_eq!(b.admit("p", None, t0), Ok(()));
        assert_eq!(b.admit("p", Some("pod-9"), t0), Err(Refused::Policy));
        assert_eq!(b.admit("p", None, t0), Err(Refused::Policy));
        // Another policy is not affected.
        assert_eq!(b.admit("q", Some("pod-9"), t0), Ok(()));
    }

    #[test]
    fn a_refusal_takes_nothing_from_the_other_budget() {
        let mut b = Budgets::new(budget(1, 3600 * SEC), budget(2, 3600 * SEC), 16);
        let t0 = Instant::now();
        assert_eq!(b.admit("p", Some("pod-a"), t0), Ok(()));
        // pod-a is out: the policy keeps its remaining token for pod-b.
        for _ in 0..5 {
            assert_eq!(b.admit("p", Some("pod-a"), t0), Err(Refused::Pod));
        }
        assert_eq!(b.admit("p", Some("pod-b"), t0), Ok(()));
        assert_eq!(b.admit("p", Some("pod-c"), t0), Err(Refused::Policy));
    }

    #[test]
    fn memory_is_bounded_and_full_buckets_go_first() {
        let mut b = Budgets::new(budget(2, 10 * SEC), budget(1_000_000, SEC), 8);
        let t0 = Instant::now();
        // Ten thousand distinct pods: never more than 8 tracked.
        for i in 0..10_000 {
            assert_eq!(b.admit("p", Some(&format!("pod-{i}")), t0), Ok(()));
            assert!(b.tracked().0 <= 8);
        }
        assert!(b.tracked().1 <= 8);
        // When the table is full, the least recently used pod goes, never
        // the busy one; once the others have refilled to their burst they
        // are forgotten first (a full bucket is the same as none).
        let mut b = Budgets::new(budget(2, 10 * SEC), budget(1_000_000, SEC), 8);
        for i in 0..7 {
            assert_eq!(b.admit("p", Some(&format!("quiet-{i}")), t0), Ok(()));
        }
        let t1 = t0 + SEC;
        assert_eq!(b.admit("p", Some("busy"), t1), Ok(()));
        assert_eq!(b.admit("p", Some("busy"), t1), Ok(()));
        assert_eq!(b.tracked().0, 8);
        let t5 = t0 + 5 * SEC;
        assert_eq!(b.admit("p", Some("new"), t5), Ok(()));
        assert_eq!(b.tracked().0, 8);
        assert_eq!(
            b.admit("p", Some("busy"), t5),
            Err(Refused::Pod),
            "still spent"
        );
        let t15 = t0 + 15 * SEC;
        assert_eq!(b.admit("p", Some("newer"), t15), Ok(()));
        // Every quiet pod and `new` had refilled: only `busy` (one token
        // of two back) and `newer` are left.
        assert_eq!(b.tracked().0, 2);
        assert_eq!(b.admit("p", Some("busy"), t15), Ok(()));
        assert_eq!(b.admit("p", Some("busy"), t15), Err(Refused::Pod));
    }

    #[test]
    fn degenerate_budgets_do_not_panic() {
        let t0 = Instant::now();
        let mut unlimited = Budgets::new(budget(0, Duration::ZERO), budget(0, Duration::ZERO), 0);
        for _ in 0..100 {
            assert_eq!(unlimited.admit("p", Some("pod"), t0), Ok(()));
        }
        let mut b = Budgets::new(budget(u32::MAX, Duration::from_nanos(1)), Budget::POLICY, 1);
        assert_eq!(b.admit("p", Some("pod"), t0), Ok(()));
        // Time going backwards (another clock's instant) is no refill.
        let earlier = t0.checked_sub(SEC).unwrap_or(t0);
        assert_eq!(b.admit("p", Some("pod"), earlier), Ok(()));
    }
}
