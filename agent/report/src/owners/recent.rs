//! What the reporter knows of pods seen recently, by pod uid (issue 38,
//! point 7).
//!
//! A pod's last findings are often flushed after the pod is gone: a
//! Deployment scaled down, a rollout, a StatefulSet's pod recreated under
//! its name, a short-lived Job's pod. The API then has no pod with that
//! uid, so its chain cannot be verified from the pod any more, and without
//! this memory its findings would go to the pod's own Report, owned by a
//! uid that no longer exists, which the garbage collector deletes at once.
//! Two memories answer for it, both a [`Recent`]:
//!
//! - [`RecentChains`]: the chains the reporter verified while the pod
//!   lived. What was verified then is still true of the findings it made
//!   then, so they go to the controller's Report.
//! - [`SeenPods`]: what the daemon's pod watch saw of the pod (its labels
//!   and controller reference), for a pod whose first findings are flushed
//!   after it is gone. The chain is verified from that reference's owner
//!   up (by uid), as it would have been from the pod.
//!
//! Both are by uid (never reused), so a pod cannot borrow another's: a
//! recreated pod of the same name has a uid of its own.

use super::{Controller, NamedOwner};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long an entry is kept after it was last verified (or seen): far
/// longer than the flush interval plus the retries of a failing write,
/// and short enough that the memory holds only this node's recent pods.
pub(crate) const KEEP_CHAINS_FOR: Duration = Duration::from_secs(15 * 60);

/// Pods remembered at most, per memory (each entry is a few hundred
/// bytes); when full, the least recently verified (or seen) is forgotten.
pub(crate) const MAX_REMEMBERED: usize = 20_000;

/// Label bytes (keys and values) a seen pod may carry and be remembered:
/// with [`MAX_REMEMBERED`], this bounds [`SeenPods`] to some 80 MiB at
/// the very worst. Real pods carry a few hundred bytes; one with more
/// is not remembered, and its late findings go to its own Report.
pub(crate) const MAX_SEEN_LABEL_BYTES: usize = 4096;

/// A verified chain: the owner a pod's Report names, and the roll-up
/// candidates (see [`Chain::Verified`](super::Chain::Verified)).
type Remembered = (NamedOwner, Vec<Controller>);

/// Verified chains by pod uid.
pub(crate) type RecentChains = Recent<Remembered>;

/// What the pod watch saw, by pod uid.
pub(crate) type SeenPods = Recent<SeenPod>;

/// A pod as the daemon's pod watch saw it: what verifying its chain needs
/// besides the owners themselves.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SeenPod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The pod's one `controller: true` reference.
    pub controller: OwnerReference,
}

impl SeenPod {
    /// What is worth remembering of `pod`: its uid and what it was seen
    /// as, or `None` when it has no controller reference (nothing to roll
    /// up to) or too many label bytes.
    pub(crate) fn of(pod: &Pod) -> Option<(&str, Option<SeenPod>)> {
        let meta = &pod.metadata;
        let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
        let controller = meta
            .owner_references
            .as_deref()
            .and_then(super::controller_ref);
        let labels = meta.labels.clone().unwrap_or_default();
        let label_bytes: usize = labels.iter().map(|(k, v)| k.len() + v.len()).sum();
        let seen = match controller {
            Some(c) if label_bytes <= MAX_SEEN_LABEL_BYTES => Some(SeenPod {
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                labels,
                controller: c.clone(),
            }),
            _ => None,
        };
        Some((uid, seen))
    }
}

/// Values by pod uid, each with when it was last remembered: kept for a
/// while, at most so many, the least recently remembered forgotten first.
pub(crate) struct Recent<V> {
    keep: Duration,
    max: usize,
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> Recent<V> {
    /// A memory keeping each entry for `keep`, and at most `max` of them.
    pub(crate) fn new(keep: Duration, max: usize) -> Recent<V> {
        Recent {
            keep,
            max: max.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (Instant, V)>> {
        // Each critical section is one map operation (or a scan that
        // changes nothing until its single removal).
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes `value` for the pod `uid` now.
    pub(crate) fn remember(&self, uid: &str, value: V) {
        let mut entries = self.lock();
        if !entries.contains_key(uid) && entries.len() >= self.max {
            let keep = self.keep;
            entries.retain(|_, (at, _)| at.elapsed() < keep);
            if entries.len() >= self.max {
                let oldest = entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert(uid.to_string(), (Instant::now(), value));
    }

    /// What was remembered for the pod `uid` within the retention, if
    /// anything.
    pub(crate) fn recall(&self, uid: &str) -> Option<V> {
        let entries = self.lock();
        let (at, value) = entries.get(uid)?;
        (at.elapsed() < self.keep).then(|| value.clone())
    }

    /// Forgets the pod `uid` (what was remembered no longer holds).
    pub(crate) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Forgets what has expired (once per flush).
    pub(crate) fn prune(&self) {
        let keep = self.keep;
        self.lock().retain(|_, (at, _)| at.elapsed() < keep);
    }
}

impl SeenPods {
    /// Notes what the pod watch saw of `pod` (on every apply and on its
    /// delete). A pod without a controller reference now, or with too
    /// many labels, is forgotten: a pod its controller released must not
    /// roll up by what it was before.
    pub(crate) fn saw(&self, pod: &Pod) {
        match SeenPod::of(pod) {
            Some((uid, Some(seen))) => self.remember(uid, seen),
            Some((uid, None)) => self.forget(uid),
            None => {}
        }
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
        recent.remember("pod-a", chain("web"));
        assert_eq!(recent.recall("pod-a"), Some(chain("web")));
        assert_eq!(recent.recall("pod-b"), None, "another uid borrows nothing");

        let expired = RecentChains::new(Duration::ZERO, 10);
        expired.remember("pod-a", chain("web"));
        assert_eq!(expired.recall("pod-a"), None);
        expired.prune();
        assert!(expired.lock().is_empty());
    }

    #[test]
    fn a_full_memory_forgets_the_least_recently_verified() {
        let recent = RecentChains::new(Duration::from_secs(60), 2);
        for (uid, name) in [("a", "one"), ("b", "two")] {
            recent.remember(uid, chain(name));
            std::thread::sleep(Duration::from_millis(2));
        }
        // `a` verified again: `b` is now the oldest.
        recent.remember("a", chain("one"));
        recent.remember("c", chain("three"));
        assert_eq!(recent.lock().len(), 2);
        assert!(recent.recall("a").is_some());
        assert!(recent.recall("b").is_none());
        assert!(recent.recall("c").is_some());
    }

    fn pod(uid: &str, owners: serde_json::Value, labels: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": format!("web-{uid}"), "uid": uid,
                         "labels": labels, "ownerReferences": owners},
        }))
        .unwrap()
    }

    fn rs(controller: bool) -> serde_json::Value {
        serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9",
                            "uid": "rs-uid", "controller": controller}])
    }

    #[test]
    fn the_watch_is_remembered_by_uid_with_the_controller_reference() {
        let seen = SeenPods::new(Duration::from_secs(60), 10);
        seen.saw(&pod("a", rs(true), serde_json::json!({"app": "web"})));
        let a = seen.recall("a").unwrap();
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("ns", "web-a"));
        assert_eq!(a.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            (a.controller.name.as_str(), a.controller.uid.as_str()),
            ("web-5d9", "rs-uid")
        );
        assert_eq!(seen.recall("b"), None, "another uid borrows nothing");

        // No controller reference: nothing to roll up to, nothing kept.
        seen.saw(&pod("b", rs(false), serde_json::json!({})));
        assert_eq!(seen.recall("b"), None);
        // Released by its controller since: forgotten.
        seen.saw(&pod(
            "a",
            serde_json::json!([]),
            serde_json::json!({"app": "web"}),
        ));
        assert_eq!(seen.recall("a"), None);
        // Too many label bytes: not kept.
        let big = "x".repeat(MAX_SEEN_LABEL_BYTES);
        seen.saw(&pod("c", rs(true), serde_json::json!({"big": big})));
        assert_eq!(seen.recall("c"), None);
        // A pod without a uid is ignored.
        seen.saw(&Pod::default());
        assert!(seen.lock().is_empty());
    }

    #[test]
    fn seen_pods_are_bounded_and_expire() {
        let seen = SeenPods::new(Duration::from_secs(60), 2);
        for uid in ["a", "b"] {
            seen.saw(&pod(uid, rs(true), serde_json::json!({"app": "web"})));
            std::thread::sleep(Duration::from_millis(2));
        }
        // `a` seen again (an update): `b` is now the least recently seen.
        seen.saw(&pod("a", rs(true), serde_json::json!({"app": "web"})));
        seen.saw(&pod("c", rs(true), serde_json::json!({"app": "web"})));
        assert_eq!(seen.lock().len(), 2);
        assert!(seen.recall("a").is_some());
        assert!(seen.recall("b").is_none());
        assert!(seen.recall("c").is_some());

        let expired = SeenPods::new(Duration::ZERO, 10);
        expired.saw(&pod("a", rs(true), serde_json::json!({"app": "web"})));
        assert_eq!(expired.recall("a"), None);
        expired.prune();
        assert!(expired.lock().is_empty());
    }
}
