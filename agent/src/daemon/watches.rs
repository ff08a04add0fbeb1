//! The watches that feed the engine, in the order the specification asks:
//! RuntimePolicies and Namespaces first; the Pod watch (this node only)
//! starts once both have listed, so a new pod is matched against every
//! known policy and its namespace's labels; pinned state is reconciled once
//! pods have listed too. Services and EndpointSlices are watched from the
//! start beside them, for the network values that name a Service (see
//! [`super::services`]): each change hands the Service's addresses to the
//! engine, and once both have listed the engine is told they are complete.

use super::data::DataReady;
use super::engine::Engine;
use super::services::{Changes, ServiceNames};
use futures::stream::{select_all, BoxStream, StreamExt};
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_metrics::{ApiResource, Health, Metrics};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The engine, shared with the event plane's poll sources (which drain
/// the kernel counters through it). Locked per batch of watch events
/// and per poll, never across an await.
pub type SharedEngine = Arc<Mutex<Engine>>;

/// Events handled in one batch at most, so the event plane (which locks
/// the engine to attribute what the kernel saw) waits a bounded time.
const MAX_BATCH: usize = 500;

/// Locks the engine even if a panicking holder poisoned it: its state is
/// the managers' bookkeeping, which every call leaves consistent.
pub fn lock(engine: &SharedEngine) -> MutexGuard<'_, Engine> {
    engine.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the engine task needs besides the engine.
pub struct Watches {
    /// The API client.
    pub client: kube::Client,
    /// This node (the Pod watch's field selector).
    pub node: String,
    /// Told when policies have synced.
    pub health: Arc<Health>,
    /// Told how each watch fares (see [`super::api_health`]).
    pub metrics: Arc<Metrics>,
    /// Policies' fetched data, handed to the engine as it arrives.
    pub data: Option<tokio::sync::mpsc::UnboundedReceiver<DataReady>>,
    /// Told (true) once policies, namespaces and this node's pods have all
    /// been listed and handed to the engine: the first full reconcile.
    pub reconciled: Option<tokio::sync::watch::Sender<bool>>,
}

// Boxed: a Pod is several times larger than the others, and every update
// moves through the merged stream.
enum Update {
    Policy(Box<Event<RuntimePolicy>>),
    Namespace(Box<Event<Namespace>>),
    Pod(Box<Event<Pod>>),
    Service(Box<Event<Service>>),
    Slice(Box<Event<EndpointSlice>>),
}

impl Update {
    /// The watch it came from.
    fn resource(&self) -> ApiResource {
        match self {
            Update::Policy(_) => ApiResource::policies,
            Update::Namespace(_) => ApiResource::namespaces,
            Update::Pod(_) => ApiResource::pods,
            Update::Service(_) => ApiResource::services,
            Update::Slice(_) => ApiResource::endpointslices,
        }
    }
}

/// A relist in progress: the keys it has delivered so far, so that keys
/// the engine holds but the relist did not deliver are deleted at its end
/// (a delete missed while the watch was down).
#[derive(Default)]
struct Relists {
    policies: Option<BTreeSet<String>>,
    namespaces: Option<BTreeSet<String>>,
    pods: Option<BTreeSet<String>>,
}

#[derive(Default)]
struct Synced {
    policies: bool,
    namespaces: bool,
    pods: bool,
    pod_watch_started: bool,
    reconciled_told: bool,
}

impl Watches {
    /// Runs until `stop` completes; an error is fatal to the daemon.
    pub async fn run(
        self,
        engine: SharedEngine,
        stop: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let policies = watcher::watcher(
            Api::<RuntimePolicy>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|e| Update::Policy(Box::new(e)))
                .map_err(|e| (ApiResource::policies, e))
        })
        .boxed();
        let namespaces = watcher::watcher(
            Api::<Namespace>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|e| Update::Namespace(Box::new(e)))
                .map_err(|e| (ApiResource::namespaces, e))
        })
        .boxed();
        let services = watcher::watcher(
            Api::<Service>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|e| Update::Service(Box::new(e)))
                .map_err(|e| (ApiResource::services, e))
        })
        .boxed();
        let slices = watcher::watcher(
            Api::<EndpointSlice>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|e| Update::Slice(Box::new(e)))
                .map_err(|e| (ApiResource::endpointslices, e))
        })
        .boxed();
        let mut streams: futures::stream::SelectAll<BoxStream<'static, _>> =
            select_all([policies, namespaces, services, slices]);
        let mut names = ServiceNames::new();
        let mut relists = Relists::default();
        let mut synced = Synced::default();
        let mut data = self.data;
        tokio::pin!(stop);
        loop {
            let due = lock(&engine).next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                // The event plane drains the kernel one last time after
                // this (its sources poll at stop).
                () = &mut stop => return Ok(()),
                item = streams.next() => {
                    // This event and every one already waiting (a relist
                    // delivers its objects at once) in one batch: what is
                    // derived from the whole state is redone once at its
                    // end, not after each (see Engine::begin_batch).
                    let mut guard = lock(&engine);
                    guard.begin_batch();
                    let mut next = Some(item);
                    let mut handled = 0;
                    while let Some(item) = next.take() {
                        if let Some(Ok(update)) = &item {
                            // An event from a watch: it is connected.
                            let api = self.metrics.api();
                            api.succeeded(update.resource(), api.now());
                        }
                        match item {
                            None => anyhow::bail!("every watch stream ended"),
                            // kube-runtime's backoff retries; the error is worth a
                            // line each time (a Forbidden here is an RBAC gap).
                            Some(Err((resource, e))) => {
                                let kind = super::api_health::watch_failure(&e);
                                self.metrics.api().failed(resource, kind, self.metrics.api().now());
                                tracing::warn!(error = %e, %resource, "watch error (retrying)");
                            }
                            Some(Ok(Update::Service(event))) => {
                                hand_over(&mut guard, names.service_event(*event));
                            }
                            Some(Ok(Update::Slice(event))) => {
                                hand_over(&mut guard, names.slice_event(*event));
                            }
                            Some(Ok(update)) => apply(&mut guard, &mut relists, &mut synced, update),
                        }
                        handled += 1;
                        if handled < MAX_BATCH {
                            next = streams.next().now_or_never();
                        }
                    }
                    guard.end_batch();
                }
                () = sleep_until(due), if due.is_some() => lock(&engine).evaluate_due(std::time::Instant::now()),
                ready = next_data(&mut data) => lock(&engine).data_ready(ready),
            }
            if synced.policies && synced.namespaces && synced.pods && !synced.reconciled_told {
                synced.reconciled_told = true;
                if let Some(tx) = &self.reconciled {
                    let _ = tx.send(true);
                }
            }
            if synced.policies && synced.namespaces && !synced.pod_watch_started {
                synced.pod_watch_started = true;
                self.health.set_policies_synced();
                tracing::info!("policies and namespaces listed; starting the pod watch");
                let pods = watcher::watcher(
                    Api::<Pod>::all(self.client.clone()),
                    watcher::Config::default().fields(&format!("spec.nodeName={}", self.node)),
                )
                .default_backoff()
                .map(|e| {
                    e.map(|e| Update::Pod(Box::new(e)))
                        .map_err(|e| (ApiResource::pods, e))
                })
                .boxed();
                streams.push(pods);
            }
        }
    }
}

/// Hands what a Service or EndpointSlice event changed to the engine.
fn hand_over(engine: &mut Engine, changes: Changes) {
    for (service, addresses) in changes.services {
        engine.service_addresses(service, addresses);
    }
    if changes.synced {
        tracing::info!("Services and EndpointSlices listed; Service names resolve");
        engine.services_synced();
    }
}

/// The next fetched data, or never (no fetcher, or it is gone).
async fn next_data(rx: &mut Option<tokio::sync::mpsc::UnboundedReceiver<DataReady>>) -> DataReady {
    match rx {
        Some(rx) => match rx.recv().await {
            Some(ready) => ready,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn apply(engine: &mut Engine, relists: &mut Relists, synced: &mut Synced, update: Update) {
    match update {
        // Handed to the Service names above.
        Update::Service(_) | Update::Slice(_) => {}
        Update::Policy(event) => match *event {
            Event::Init => relists.policies = Some(BTreeSet::new()),
            Event::InitApply(rp) => {
                relists
                    .policies
                    .get_or_insert_with(BTreeSet::new)
                    .insert(rp.name_any());
                engine.apply_policy(&rp);
            }
            Event::InitDone => {
                let seen = relists.policies.take().unwrap_or_default();
                for gone in engine.policy_names().difference(&seen) {
                    engine.delete_policy(gone);
                }
                if !synced.policies {
                    tracing::info!(policies = seen.len(), "RuntimePolicies listed");
                }
                synced.policies = true;
            }
            Event::Apply(rp) => engine.apply_policy(&rp),
            Event::Delete(rp) => engine.delete_policy(&rp.name_any()),
        },
        Update::Namespace(event) => match *event {
            Event::Init => relists.namespaces = Some(BTreeSet::new()),
            Event::InitApply(ns) => {
                relists
                    .namespaces
                    .get_or_insert_with(BTreeSet::new)
                    .insert(ns.name_any());
                engine.apply_namespace(&ns);
            }
            Event::InitDone => {
                let seen = relists.namespaces.take().unwrap_or_default();
                for gone in engine.namespace_names().difference(&seen) {
                    engine.delete_namespace(gone);
                }
                synced.namespaces = true;
            }
            Event::Apply(ns) => engine.apply_namespace(&ns),
            Event::Delete(ns) => engine.delete_namespace(&ns.name_any()),
        },
        Update::Pod(event) => match *event {
            Event::Init => relists.pods = Some(BTreeSet::new()),
            Event::InitApply(pod) => {
                if let Some(uid) = pod.uid() {
                    relists.pods.get_or_insert_with(BTreeSet::new).insert(uid);
                }
                engine.apply_pod(&pod);
            }
            Event::InitDone => {
                let seen = relists.pods.take().unwrap_or_default();
                for gone in engine.pod_uids().difference(&seen) {
                    engine.delete_pod(gone);
                }
                if !synced.pods {
                    // Everything current is known: what a previous daemon
                    // left pinned and nobody wants any more goes now.
                    tracing::info!(
                        pods = seen.len(),
                        "pods on this node listed; reconciling pinned state"
                    );
                    engine.reconcile_adopted();
                }
                synced.pods = true;
            }
            Event::Apply(pod) => engine.apply_pod(&pod),
            Event::Delete(pod) => {
                engine.saw_pod(&pod);
                if let Some(uid) = pod.uid() {
                    engine.delete_pod(&uid);
                }
            }
        },
    }
}
