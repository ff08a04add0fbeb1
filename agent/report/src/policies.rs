//! Each RuntimePolicy's roll-up setting, and which policies are gone.
//!
//! The engine hands the reporter findings with a policy's name and uid
//! only; the `autogen-controllers` annotation comes from a metadata-only
//! watch of RuntimePolicies kept here ([`Policies::watch`], run by the
//! reporter next to its flush loop), so the engine is not involved. A
//! policy the watch has not delivered yet (the engine's own watch may be a
//! moment ahead), or every policy when the watch is not running, is read
//! with a metadata `get` and cached for a TTL.
//!
//! A policy's uid is never reused, so a uid the watch saw deleted, or that
//! a `get` by name does not find, is *retired* for good: its buffered
//! findings are dropped instead of written back into Reports the cleanup
//! is emptying, and the cleanup removes its results.

use crate::autogen::{Autogen, AUTOGEN_ANNOTATION};
use crate::sanitize::sanitize;
use futures::StreamExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Retired uids remembered (oldest forgotten first): far more policies
/// than a cluster deletes between two flushes.
const MAX_RETIRED: usize = 10_000;

/// What the reporter needs to know about a finding's policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PolicyState {
    /// It exists, with this roll-up setting.
    Live(Autogen),
    /// It was deleted.
    Deleted,
}

/// What the cleanup is told by the watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// These policies were deleted: remove their results.
    Deleted(Vec<String>),
    /// The watch listed every policy: remove results of any policy that
    /// no longer exists (deleted while no daemon was watching).
    Orphans,
}

#[derive(Default)]
struct Table {
    /// From the watch: uid -> setting. Complete once `synced`.
    watched: HashMap<String, Autogen>,
    synced: bool,
    retired: HashSet<String>,
    retired_order: VecDeque<String>,
    /// `get` answers for uids the watch did not know.
    fetched: HashMap<String, (Instant, Autogen)>,
}

impl Table {
    fn retire(&mut self, uid: &str) {
        self.watched.remove(uid);
        self.fetched.remove(uid);
        if self.retired.insert(uid.to_string()) {
            self.retired_order.push_back(uid.to_string());
            while self.retired_order.len() > MAX_RETIRED {
                if let Some(old) = self.retired_order.pop_front() {
                    self.retired.remove(&old);
                }
            }
        }
    }
}

/// The policy table.
pub(crate) struct Policies {
    client: kube::Client,
    ttl: Duration,
    table: Mutex<Table>,
}

/// A policy's roll-up setting from its annotations; unknown kinds are
/// logged (the chart's admission policy refuses them, but it may not be
/// installed).
fn setting_of(name: &str, annotations: &std::collections::BTreeMap<String, String>) -> Autogen {
    let (autogen, unknown) =
        Autogen::parse(annotations.get(AUTOGEN_ANNOTATION).map(String::as_str));
    if !unknown.is_empty() {
        tracing::warn!(
            policy = %sanitize(name),
            annotation = AUTOGEN_ANNOTATION,
            ignored = %sanitize(&unknown.join(",")),
            "the annotation names controller kinds that are not supported; they are ignored (supported: Deployment, StatefulSet, DaemonSet, Job, CronJob, or all, or none)"
        );
    }
    autogen
}

impl Policies {
    pub(crate) fn new(client: kube::Client, ttl: Duration) -> Policies {
        Policies {
            client,
            ttl,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Each critical section leaves the table consistent.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the policy with `uid` is known to be deleted.
    pub(crate) fn is_retired(&self, uid: &str) -> bool {
        self.lock().retired.contains(uid)
    }

    /// Whether `uid` is a policy the watch has listed (`None` until the
    /// watch has listed them all once).
    pub(crate) fn is_watched(&self, uid: &str) -> Option<bool> {
        let table = self.lock();
        table.synced.then(|| table.watched.contains_key(uid))
    }

    /// The state of the policy `name` with `uid`: from the watch, or from
    /// a metadata `get` by name (cached for the TTL) when the watch does
    /// not know it.
    pub(crate) async fn state(&self, name: &str, uid: &str) -> Result<PolicyState, kube::Error> {
        {
            let table = self.lock();
            if let Some(autogen) = table.watched.get(uid) {
                return Ok(PolicyState::Live(autogen.clone()));
            }
            if table.retired.contains(uid) {
                return Ok(PolicyState::Deleted);
            }
            if let Some((at, autogen)) = table.fetched.get(uid) {
                if at.elapsed() < self.ttl {
                    return Ok(PolicyState::Live(autogen.clone()));
                }
            }
        }
        let api: Api<RuntimePolicy> = Api::all(self.client.clone());
        let found = api.get_metadata_opt(name).await?;
        let mut table = self.lock();
        match found {
            Some(meta) if meta.metadata.uid.as_deref() == Some(uid) => {
                let autogen = setting_of(name, meta.annotations());
                table
                    .fetched
                    .insert(uid.to_string(), (Instant::now(), autogen.clone()));
                Ok(PolicyState::Live(autogen))
            }
            // No policy of that name, or another one: uids are never
            // reused, so this one is gone for good.
            _ => {
                table.retire(uid);
                Ok(PolicyState::Deleted)
            }
        }
    }

    fn apply(&self, policy: &PartialObjectMeta<RuntimePolicy>) {
        let Some(uid) = policy.metadata.uid.as_deref() else {
            return;
        };
        let autogen = setting_of(&policy.name_any(), policy.annotations());
        let mut table = self.lock();
        table.fetched.remove(uid);
        table.watched.insert(uid.to_string(), autogen);
    }

    /// Watches RuntimePolicies (metadata only) until the future is
    /// dropped, keeping the table current and telling `cleanup` what was
    /// deleted. A failing watch is retried with kube-runtime's backoff; the
    /// table keeps its last state meanwhile.
    pub(crate) async fn watch(&self, cleanup: mpsc::UnboundedSender<Cleanup>) {
        // `PartialObjectMeta`: kube asks for metadata only.
        let api: Api<PartialObjectMeta<RuntimePolicy>> = Api::all(self.client.clone());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        // The uids of a relist in progress: whatever the table had and the
        // relist does not is a deletion the watch missed.
        let mut relisted: Option<HashSet<String>> = None;
        let mut first_sync = true;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => relisted = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(policy)) => {
                    if let (Some(seen), Some(uid)) =
                        (relisted.as_mut(), policy.metadata.uid.as_ref())
                    {
                        seen.insert(uid.clone());
                    }
                    self.apply(&policy);
                }
                Ok(watcher::Event::InitDone) => {
                    let seen = relisted.take().unwrap_or_default();
                    let gone: Vec<String> = {
                        let mut table = self.lock();
                        let gone: Vec<String> = table
                            .watched
                            .keys()
                            .filter(|uid| !seen.contains(*uid))
                            .cloned()
                            .collect();
                        for uid in &gone {
                            table.retire(uid);
                        }
                        table.synced = true;
                        gone
                    };
                    tracing::debug!(policies = seen.len(), "RuntimePolicy metadata listed");
                    if !gone.is_empty() {
                        let _ = cleanup.send(Cleanup::Deleted(gone));
                    }
                    if first_sync {
                        first_sync = false;
                        let _ = cleanup.send(Cleanup::Orphans);
                    }
                }
                Ok(watcher::Event::Apply(policy)) => self.apply(&policy),
                Ok(watcher::Event::Delete(policy)) => {
                    if let Some(uid) = policy.metadata.uid.clone() {
                        self.lock().retire(&uid);
                        let _ = cleanup.send(Cleanup::Deleted(vec![uid]));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "RuntimePolicy watch (for roll-up settings) failed; retrying with backoff");
                }
            }
        }
    }
}
