//! The verified chains of pods seen recently, by pod uid (issue 38, point
//! 7).
//!
//! A pod's last findings are often flushed after the pod is gone: a
//! Deployment scaled down, a rollout, a StatefulSet's pod recreated under
//! its name. The API then has no pod with that uid, so its chain cannot be
//! verified any more, and without this memory its findings would go to the
//! pod's own Report, owned by a uid that no longer exists, which the
//! garbage collector deletes at once. What the reporter verified while the
//! pod lived is still true of the findings it made then, so they go to the
//! controller's Report instead.
//!
//! Only chains the API verified are kept, by uid (never reused), so a pod
//! cannot borrow another's: a recreated pod of the same name has a uid of
//! its own.

use super::{Controller, NamedOwner};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a verified chain is kept after it was last verified: far
/// longer than the flush interval plus the retries of a failing write,
/// and short enough that the memory holds only this node's recent pods.
pub(crate) const KEEP_CHAINS_FOR: Duration = Duration::from_secs(15 * 60);

/// Pods remembered at most (each entry is a few hundred bytes); when full,
/// the least recently verified is forgotten.
pub(crate) const MAX_REMEMBERED: usize = 20_000;

/// A verified chain: the owner a pod's Report names, and the roll-up
/// candidates (see [`Chain::Verified`](super::Chain::Verified)).
type Remembered = (NamedOwner, Vec<Controller>);

/// Verified chains by pod uid, each with when it was last verified.
pub(crate) struct RecentChains {
    keep: Duration,
    max: usize,
    chains: Mutex<HashMap<String, (Instant, Remembered)>>,
}

impl RecentChains {
    /// A memory keeping each chain for `keep`, and at most `max` of them.
    pub(crate) fn new(keep: Duration, max: usize) -> RecentChains {
        RecentChains {
            keep,
            max: max.max(1),
            chains: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (Instant, Remembered)>> {
        // Each critical section is one map operation (or a scan that
        // changes nothing until its single removal).
        self.chains.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the pod `uid` verified with `owner` and `rollup` now.
    pub(crate) fn remember(&self, uid: &str, owner: &NamedOwner, rollup: &[Controller]) {
        let mut chains = self.lock();
        if !chains.contains_key(uid) && chains.len() >= self.max {
            let keep = self.keep;
            chains.retain(|_, (at, _)| at.elapsed() < keep);
            if chains.len() >= self.max {
                let oldest = chains
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    chains.remove(&oldest);
                }
            }
        }
        chains.insert(
            uid.to_string(),
            (Instant::now(), (owner.clone(), rollup.to_vec())),
        );
    }

    /// The chain the pod `uid` verified with within the retention, if it
    /// did.
    pub(crate) fn recall(&self, uid: &str) -> Option<Remembered> {
        let chains = self.lock();
        let (at, chain) = chains.get(uid)?;
        (at.elapsed() < self.keep).then(|| chain.clone())
    }

    /// Forgets what has expired (once per flush).
    pub(crate) fn prune(&self) {
        let keep = self.keep;
        self.lock().retain(|_, (at, _)| at.elapsed() < keep);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::autogen::ControllerKind;

    fn chain(name: &str) -> Remembered {
        (
            NamedOwner {
                kind: "Deployment".into(),
                name: name.into(),
            },
            vec![Controller {
                kind: ControllerKind::Deployment,
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("{name}-uid"),
            }],
        )
    }

    #[test]
    fn a_chain_is_recalled_by_uid_within_the_retention() {
        let recent = RecentChains::new(Duration::from_secs(60), 10);
        let (owner, rollup) = chain("web");
        recent.remember("pod-a", &owner, &rollup);
        assert_eq!(recent.recall("pod-a"), Some(chain("web")));
        assert_eq!(recent.recall("pod-b"), None, "another uid borrows nothing");

        let expired = RecentChains::new(Duration::ZERO, 10);
        expired.remember("pod-a", &owner, &rollup);
        assert_eq!(expired.recall("pod-a"), None);
        expired.prune();
        assert!(expired.lock().is_empty());
    }

    #[test]
    fn a_full_memory_forgets_the_least_recently_verified() {
        let recent = RecentChains::new(Duration::from_secs(60), 2);
        for (uid, name) in [("a", "one"), ("b", "two")] {
            let (owner, rollup) = chain(name);
            recent.remember(uid, &owner, &rollup);
            std::thread::sleep(Duration::from_millis(2));
        }
        // `a` verified again: `b` is now the oldest.
        let (owner, rollup) = chain("one");
        recent.remember("a", &owner, &rollup);
        let (owner, rollup) = chain("three");
        recent.remember("c", &owner, &rollup);
        assert_eq!(recent.lock().len(), 2);
        assert!(recent.recall("a").is_some());
        assert!(recent.recall("b").is_none());
        assert!(recent.recall("c").is_some());
    }
}
