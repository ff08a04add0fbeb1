//! The cluster facts a flush needs, kept current by watches.
//!
//! Two questions decide what a shard means beyond its own contents:
//!
//! - does its Node still exist? A deleted node's last-known signals must
//!   stop feeding the aggregate, so its shard is pruned; but only once the
//!   Node watch has synced, since before that an absent name proves nothing.
//!   This is a name-only (metadata) watch: nothing else about a Node matters
//!   here, and full Node objects are large and change every few seconds.
//! - is the daemon expected on a node? A node the DaemonSet places but that
//!   has not reported must read Unknown, not True. That comes from the
//!   daemon's own DaemonSet and its pods (see [`crate::expected_nodes`]).
//!
//! [`ClusterWatcher::run`] drives the three watches on one task, so the
//! inventories need no locks, and publishes a [`ClusterView`] on a
//! `tokio::sync::watch` channel whenever the answer (not merely an object)
//! changes: pod status churn and Node heartbeats do not wake anyone.

use crate::{expected_nodes, ClusterView};
use futures::stream::{select_all, BoxStream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::watch;

/// Which deployment of the daemon this is: the chart injects both values
/// (`POD_NAMESPACE`, `DAEMONSET_NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The namespace the daemon's DaemonSet and pods live in.
    pub namespace: String,
    /// The DaemonSet's name.
    pub daemonset: String,
    /// An optional label selector narrowing the pod watch to the daemon's
    /// own pods (its namespace may hold others); ownership by the
    /// DaemonSet's uid is what decides, this only saves traffic.
    pub pod_selector: Option<String>,
}

/// One watched collection: what the last complete list plus the events
/// since say, and whether such a list has completed at all.
struct Inventory<K> {
    synced: bool,
    items: BTreeMap<String, K>,
    /// A relist in progress: it replaces `items` only when complete, so a
    /// half-listed collection is never mistaken for the truth.
    relisting: Option<BTreeMap<String, K>>,
}

impl<K: kube::Resource> Inventory<K> {
    fn new() -> Self {
        Inventory {
            synced: false,
            items: BTreeMap::new(),
            relisting: None,
        }
    }

    fn apply(&mut self, event: Event<K>) {
        match event {
            Event::Init => self.relisting = Some(BTreeMap::new()),
            Event::InitApply(obj) => {
                self.relisting
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key(&obj), obj);
            }
            Event::InitDone => {
                self.items = self.relisting.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(obj) => {
                self.items.insert(key(&obj), obj);
            }
            Event::Delete(obj) => {
                self.items.remove(&key(&obj));
            }
        }
    }
}

fn key<K: kube::Resource>(obj: &K) -> String {
    let meta = obj.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

enum Update {
    Node(Event<PartialObjectMeta<Node>>),
    DaemonSet(Event<DaemonSet>),
    Pod(Event<Pod>),
}

/// Watches Nodes, the daemon's DaemonSet and its pods, and publishes the
/// [`ClusterView`] they imply.
pub struct ClusterWatcher {
    client: kube::Client,
    placement: Placement,
    tx: watch::Sender<ClusterView>,
}

impl ClusterWatcher {
    /// A watcher and the receiving end of its view, which starts as
    /// "nothing known" (no pruning, placement unknown) until the watches
    /// sync.
    pub fn new(client: kube::Client, placement: Placement) -> (Self, watch::Receiver<ClusterView>) {
        let (tx, rx) = watch::channel(ClusterView::default());
        (
            ClusterWatcher {
                client,
                placement,
                tx,
            },
            rx,
        )
    }

    /// Runs the watches until the returned future is dropped. A failing
    /// watch is retried with kube-runtime's default backoff and the last
    /// known view stays published meanwhile: a partition from the API
    /// server must not read as every Node having been deleted.
    pub async fn run(self) {
        let nodes: Api<PartialObjectMeta<Node>> = Api::all(self.client.clone());
        let daemonsets: Api<DaemonSet> =
            Api::namespaced(self.client.clone(), &self.placement.namespace);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.placement.namespace);
        let ds_config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.placement.daemonset));
        let pod_config = match &self.placement.pod_selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        };
        let streams: Vec<BoxStream<'static, Result<Update, watcher::Error>>> = vec![
            watcher::watcher(nodes, watcher::Config::default())
                .default_backoff()
                .map(|r| r.map(Update::Node))
                .boxed(),
            watcher::watcher(daemonsets, ds_config)
                .default_backoff()
                .map(|r| r.map(Update::DaemonSet))
                .boxed(),
            watcher::watcher(pods, pod_config)
                .default_backoff()
                .map(|r| r.map(Update::Pod))
                .boxed(),
        ];
        let mut updates = select_all(streams);
        let mut node_inv = Inventory::new();
        let mut ds_inv = Inventory::new();
        let mut pod_inv = Inventory::new();
        while let Some(update) = updates.next().await {
            match update {
                Ok(Update::Node(e)) => node_inv.apply(e),
                Ok(Update::DaemonSet(e)) => ds_inv.apply(e),
                Ok(Update::Pod(e)) => pod_inv.apply(e),
                Err(e) => {
                    tracing::warn!(error = %e, "cluster watch failed; retrying with backoff");
                    continue;
                }
            }
            let view = view_of(&node_inv, &ds_inv, &pod_inv);
            self.tx.send_if_modified(|current| {
                let changed = *current != view;
                if changed {
                    tracing::debug!(?view, "cluster view changed");
                    *current = view;
                }
                changed
            });
        }
    }
}

fn view_of(
    nodes: &Inventory<PartialObjectMeta<Node>>,
    daemonsets: &Inventory<DaemonSet>,
    pods: &Inventory<Pod>,
) -> ClusterView {
    let existing_nodes = nodes.synced.then(|| {
        nodes
            .items
            .values()
            .map(|n| n.name_any())
            .collect::<BTreeSet<_>>()
    });
    // Placement is known only once both lists completed and the DaemonSet
    // exists; a missing DaemonSet is unavailable discovery, hence Unknown.
    let expected_nodes = if daemonsets.synced && pods.synced {
        daemonsets.items.values().next().and_then(|ds| {
            let pods: Vec<Pod> = pods.items.values().cloned().collect();
            expected_nodes(ds, &pods)
        })
    } else {
        None
    };
    ClusterView {
        existing_nodes,
        expected_nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str) -> PartialObjectMeta<Node> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    fn names(inv: &Inventory<PartialObjectMeta<Node>>) -> Vec<String> {
        inv.items.values().map(|n| n.name_any()).collect()
    }

    #[test]
    fn a_relist_replaces_the_inventory_only_once_complete() {
        let mut inv = Inventory::new();
        for e in [
            Event::Init,
            Event::InitApply(node("a")),
            Event::InitApply(node("b")),
        ] {
            inv.apply(e);
        }
        assert!(!inv.synced, "a half-listed collection is not synced");
        inv.apply(Event::InitDone);
        assert!(inv.synced);
        assert_eq!(names(&inv), ["a", "b"]);

        // A relist after a watch error: b is gone, but only InitDone says so.
        inv.apply(Event::Init);
        inv.apply(Event::InitApply(node("a")));
        assert_eq!(
            names(&inv),
            ["a", "b"],
            "the old list stands until the new one completes"
        );
        inv.apply(Event::InitDone);
        assert_eq!(names(&inv), ["a"]);

        inv.apply(Event::Apply(node("c")));
        inv.apply(Event::Delete(node("a")));
        assert_eq!(names(&inv), ["c"]);
    }

    #[test]
    fn nothing_is_known_before_the_watches_sync() {
        let nodes = Inventory::new();
        let ds = Inventory::new();
        let pods = Inventory::new();
        assert_eq!(view_of(&nodes, &ds, &pods), ClusterView::default());

        let mut nodes = Inventory::new();
        nodes.apply(Event::Init);
        nodes.apply(Event::InitDone);
        let mut ds: Inventory<DaemonSet> = Inventory::new();
        ds.apply(Event::Init);
        ds.apply(Event::InitDone);
        let mut pods: Inventory<Pod> = Inventory::new();
        pods.apply(Event::Init);
        pods.apply(Event::InitDone);
        let view = view_of(&nodes, &ds, &pods);
        assert_eq!(
            view.existing_nodes,
            Some(BTreeSet::new()),
            "synced and empty"
        );
        assert_eq!(view.expected_nodes, None, "no DaemonSet: placement unknown");
    }
}
