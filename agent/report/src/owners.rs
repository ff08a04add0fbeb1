//! A pod's controller chain, verified through the API.
//!
//! A pod's ownerReferences are not evidence: anyone who can create or patch
//! a pod can name any owner, uid and all. Rolling a finding up to a
//! controller on the pod's word would let a workload put its findings on
//! someone else's Report (or hide them there), so the chain is resolved
//! through the API and a link counts only when
//!
//! - the owner exists, with the uid the reference names,
//! - the reference says `controller: true` (the one reference Kubernetes
//!   lets an object mark as its managing controller), and
//! - the owner actually controls the pod: a ReplicaSet, StatefulSet,
//!   DaemonSet or Job (and a Deployment, for its ReplicaSet's pods) has a
//!   `spec.selector` that matches the pod's labels. An empty or invalid
//!   selector verifies nothing.
//!
//! Deployment is reached through a ReplicaSet it controls, CronJob through
//! a Job it controls; neither owns pods directly, so a pod naming one as
//! its owner is not verified. A kind this module does not resolve (a
//! custom controller) is not verified either: verifying it would need RBAC
//! on every kind in the cluster.
//!
//! Lookups are cached for a TTL, found and not found alike, so a flush
//! with findings from twenty replicas reads the ReplicaSet and the
//! Deployment once. Pods and CronJobs are read as metadata only (their
//! labels and references are all that is needed); the others are read
//! whole because the selector is in their spec.

mod recent;

pub(crate) use recent::{RecentChains, SeenPods, KEEP_CHAINS_FOR, MAX_REMEMBERED};

use crate::autogen::ControllerKind;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::Api;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The kinds of object a chain is resolved through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ObjKind {
    Pod,
    ReplicaSet,
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
}

/// What verification needs to know about one object.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Facts {
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub owners: Vec<OwnerReference>,
    /// `spec.selector`, for the kinds that have one.
    pub selector: Option<LabelSelector>,
}

impl Facts {
    fn of(meta: ObjectMeta, selector: Option<LabelSelector>) -> Facts {
        Facts {
            uid: meta.uid.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            owners: meta.owner_references.unwrap_or_default(),
            selector,
        }
    }
}

/// A verified controller of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Controller {
    pub kind: ControllerKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Why a pod's claimed owner did not verify (for the debug log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unverified {
    /// The pod itself is gone (or is another pod of the same name now).
    PodGone,
    /// The pod has ownerReferences, none with `controller: true`.
    NoControllerReference,
    /// An owner in the chain does not exist.
    OwnerMissing,
    /// An owner exists under another uid than the reference names.
    UidMismatch,
    /// An owner's selector is absent, empty, invalid, or does not match
    /// the pod's labels.
    SelectorMismatch,
    /// A kind that does not own pods (Deployment, CronJob) or that this
    /// module does not resolve.
    UnsupportedOwner,
}

/// The owner a pod's own Report names (`ownerKind`, `ownerName`) once its
/// chain verified: the pod's controller, except that a ReplicaSet a
/// Deployment controls reads as that Deployment, as the specification
/// derives it (there from the ReplicaSet's name; here from its verified
/// controller reference).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamedOwner {
    pub kind: String,
    pub name: String,
}

impl NamedOwner {
    fn of(kind: &str, reference: &OwnerReference) -> NamedOwner {
        NamedOwner {
            kind: kind.to_string(),
            name: reference.name.clone(),
        }
    }
}

/// What the API says about a pod's owners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Chain {
    /// The pod has no ownerReferences.
    NoOwner,
    /// Every link verified.
    Verified {
        /// The owner the pod's Report names.
        owner: NamedOwner,
        /// The roll-up candidates, nearest first: `[Job, CronJob]`,
        /// `[Deployment]`, or none for a ReplicaSet without a Deployment (a
        /// bare ReplicaSet is never a roll-up target).
        rollup: Vec<Controller>,
    },
    /// The pod names an owner that does not verify.
    Unverified(Unverified),
}

/// Looks objects up by kind, namespace and name; `None` when there is no
/// such object.
pub(crate) trait Fetch {
    async fn fetch(
        &self,
        kind: ObjKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Facts>, kube::Error>;
}

/// The API group of an `apiVersion` (`""` for the core group).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// The one reference marked `controller: true`.
fn controller_ref(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners.iter().find(|o| o.controller == Some(true))
}

/// Whether `selector` selects `labels`, with Kubernetes' semantics, except
/// that an empty selector (which would select everything) verifies
/// nothing: the controllers resolved here are required to have a
/// non-empty one, so an empty one is not evidence of control.
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector.match_labels.as_ref();
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    if match_labels.is_none_or(BTreeMap::is_empty) && expressions.is_empty() {
        return false;
    }
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && expressions.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                // `In` and `NotIn` need values; without them the selector
                // is invalid and matches nothing.
                "In" => !values.is_empty() && value.is_some_and(|v| values.contains(v)),
                "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.contains(v)),
                "Exists" => values.is_empty() && value.is_some(),
                "DoesNotExist" => values.is_empty() && value.is_none(),
                _ => false,
            }
        })
}

/// Reads the owner `reference` names and checks that it is the object
/// the reference means (same uid) and, if `pod_labels` is given, that its
/// selector matches them.
async fn verified_owner(
    fetch: &impl Fetch,
    kind: ObjKind,
    namespace: &str,
    reference: &OwnerReference,
    pod_labels: Option<&BTreeMap<String, String>>,
) -> Result<Result<Facts, Unverified>, kube::Error> {
    let Some(facts) = fetch.fetch(kind, namespace, &reference.name).await? else {
        return Ok(Err(Unverified::OwnerMissing));
    };
    if facts.uid.is_empty() || facts.uid != reference.uid {
        return Ok(Err(Unverified::UidMismatch));
    }
    if let Some(labels) = pod_labels {
        if !facts.selector.as_ref().is_some_and(|s| selects(s, labels)) {
            return Ok(Err(Unverified::SelectorMismatch));
        }
    }
    Ok(Ok(facts))
}

fn controller(kind: ControllerKind, namespace: &str, reference: &OwnerReference) -> Controller {
    Controller {
        kind,
        namespace: namespace.to_string(),
        name: reference.name.clone(),
        uid: reference.uid.clone(),
    }
}

/// Resolves and verifies the controller chain of the pod
/// `namespace/name` with `uid`. An error is an API failure (the caller
/// decides whether it is worth retrying); everything the API answered is
/// a [`Chain`].
pub(crate) async fn resolve(
    fetch: &impl Fetch,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Chain, kube::Error> {
    match fetch.fetch(ObjKind::Pod, namespace, name).await? {
        Some(pod) if pod.uid == uid => resolve_from(fetch, namespace, &pod).await,
        _ => Ok(Chain::Unverified(Unverified::PodGone)),
    }
}

/// Verifies the controller chain of `pod` (as the API answered for it, or
/// as the pod watch saw it) from its controller reference up: every owner
/// is read through the API and checked as the module docs say.
async fn resolve_from(
    fetch: &impl Fetch,
    namespace: &str,
    pod: &Facts,
) -> Result<Chain, kube::Error> {
    use Unverified::*;
    if pod.owners.is_empty() {
        return Ok(Chain::NoOwner);
    }
    let Some(reference) = controller_ref(&pod.owners) else {
        return Ok(Chain::Unverified(NoControllerReference));
    };
    let labels = Some(&pod.labels);
    macro_rules! verify {
        ($kind:expr, $reference:expr, $labels:expr) => {
            match verified_owner(fetch, $kind, namespace, $reference, $labels).await? {
                Ok(facts) => facts,
                Err(why) => return Ok(Chain::Unverified(why)),
            }
        };
    }
    let (owner, rollup) = match (group(&reference.api_version), reference.kind.as_str()) {
        ("apps", "ReplicaSet") => {
            let rs = verify!(ObjKind::ReplicaSet, reference, labels);
            match controller_ref(&rs.owners) {
                Some(d) if group(&d.api_version) == "apps" && d.kind == "Deployment" => {
                    verify!(ObjKind::Deployment, d, labels);
                    (
                        NamedOwner::of("Deployment", d),
                        vec![controller(ControllerKind::Deployment, namespace, d)],
                    )
                }
                // A bare ReplicaSet, or one managed by something else: the
                // link verified, and there is nothing to roll up to.
                _ => (NamedOwner::of("ReplicaSet", reference), Vec::new()),
            }
        }
        ("apps", "StatefulSet") => {
            verify!(ObjKind::StatefulSet, reference, labels);
            (
                NamedOwner::of("StatefulSet", reference),
                vec![controller(
                    ControllerKind::StatefulSet,
                    namespace,
                    reference,
                )],
            )
        }
        ("apps", "DaemonSet") => {
            verify!(ObjKind::DaemonSet, reference, labels);
            (
                NamedOwner::of("DaemonSet", reference),
                vec![controller(ControllerKind::DaemonSet, namespace, reference)],
            )
        }
        ("batch", "Job") => {
            let job = verify!(ObjKind::Job, reference, labels);
            let mut chain = vec![controller(ControllerKind::Job, namespace, reference)];
            if let Some(c) = controller_ref(&job.owners) {
                if group(&c.api_version) == "batch" && c.kind == "CronJob" {
                    // A CronJob has no selector: that it controls the Job
                    // (uid and controller: true) is the evidence.
                    verify!(ObjKind::CronJob, c, None);
                    chain.push(controller(ControllerKind::CronJob, namespace, c));
                }
            }
            (NamedOwner::of("Job", reference), chain)
        }
        _ => return Ok(Chain::Unverified(UnsupportedOwner)),
    };
    Ok(Chain::Verified { owner, rollup })
}

/// [`resolve`], remembering every chain that verifies by the pod's uid,
/// and answering for a pod that is gone (or is another pod of the same
/// name now) with the chain it last verified with, if `recent` still has
/// it: the findings it made while it lived belong to that controller
/// (see `recent`). A gone pod that never verified is verified from what
/// the pod watch saw of it (`seen`): its controller reference, whose
/// owner must still exist with that uid, and its labels, which the
/// owners' selectors must match. A pod neither remembers is
/// [`Unverified::PodGone`], as is one whose seen chain has no owner.
pub(crate) async fn resolve_remembering(
    fetch: &impl Fetch,
    recent: &RecentChains,
    seen: &SeenPods,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Chain, kube::Error> {
    let gone = match resolve(fetch, namespace, name, uid).await? {
        Chain::Verified { owner, rollup } => {
            recent.remember(uid, (owner.clone(), rollup.clone()));
            return Ok(Chain::Verified { owner, rollup });
        }
        Chain::Unverified(Unverified::PodGone) => Chain::Unverified(Unverified::PodGone),
        other => return Ok(other),
    };
    if let Some((owner, rollup)) = recent.recall(uid) {
        return Ok(Chain::Verified { owner, rollup });
    }
    // The watch's record is keyed by uid; the name and namespace must
    // also be the finding's, or it is not the same pod's record.
    let Some(pod) = seen
        .recall(uid)
        .filter(|p| p.namespace == namespace && p.name == name)
    else {
        return Ok(gone);
    };
    let facts = Facts {
        uid: uid.to_string(),
        labels: pod.labels,
        owners: vec![pod.controller],
        selector: None,
    };
    Ok(match resolve_from(fetch, namespace, &facts).await? {
        Chain::Verified { owner, rollup } => {
            recent.remember(uid, (owner.clone(), rollup.clone()));
            Chain::Verified { owner, rollup }
        }
        Chain::NoOwner => gone,
        unverified => unverified,
    })
}

/// An object by kind, namespace and name.
type ObjKey = (ObjKind, String, String);
/// What a lookup found (nothing, for an object that does not exist), and
/// when.
type Cache = HashMap<ObjKey, (Instant, Option<Facts>)>;

/// The API lookups, cached for a TTL.
pub(crate) struct Owners {
    client: kube::Client,
    ttl: Duration,
    max_entries: usize,
    cache: Mutex<Cache>,
}

impl Owners {
    pub(crate) fn new(client: kube::Client, ttl: Duration, max_entries: usize) -> Owners {
        Owners {
            client,
            ttl,
            max_entries,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Each critical section is one map operation.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets what has expired (called once per flush, so the cache
    /// holds only what recent flushes needed).
    pub(crate) fn prune(&self) {
        let ttl = self.ttl;
        self.lock().retain(|_, (at, _)| at.elapsed() < ttl);
    }

    /// The uid of the pod named `name` now, read through the API (not the
    /// cache: this decides whether a Report about another pod of the name
    /// may be taken over, and a cached answer may predate a recreation).
    pub(crate) async fn live_uid(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, kube::Error> {
        Ok(self
            .fetch_uncached(ObjKind::Pod, namespace, name)
            .await?
            .map(|pod| pod.uid))
    }

    async fn fetch_uncached(
        &self,
        kind: ObjKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Facts>, kube::Error> {
        let c = self.client.clone();
        Ok(match kind {
            ObjKind::Pod => Api::<Pod>::namespaced(c, namespace)
                .get_metadata_opt(name)
                .await?
                .map(|m| Facts::of(m.metadata, None)),
            ObjKind::CronJob => Api::<CronJob>::namespaced(c, namespace)
                .get_metadata_opt(name)
                .await?
                .map(|m| Facts::of(m.metadata, None)),
            ObjKind::ReplicaSet => Api::<ReplicaSet>::namespaced(c, namespace)
                .get_opt(name)
                .await?
                .map(|o| Facts::of(o.metadata, Some(o.spec.selector))),
            ObjKind::Deployment => Api::<Deployment>::namespaced(c, namespace)
                .get_opt(name)
                .await?
                .map(|o| Facts::of(o.metadata, Some(o.spec.selector))),
            ObjKind::StatefulSet => Api::<StatefulSet>::namespaced(c, namespace)
                .get_opt(name)
                .await?
                .map(|o| Facts::of(o.metadata, Some(o.spec.selector))),
            ObjKind::DaemonSet => Api::<DaemonSet>::namespaced(c, namespace)
                .get_opt(name)
                .await?
                .map(|o| Facts::of(o.metadata, Some(o.spec.selector))),
            ObjKind::Job => Api::<Job>::namespaced(c, namespace)
                .get_opt(name)
                .await?
                .map(|o| Facts::of(o.metadata, o.spec.and_then(|s| s.selector))),
        })
    }
}

impl Fetch for Owners {
    async fn fetch(
        &self,
        kind: ObjKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Facts>, kube::Error> {
        let key = (kind, namespace.to_string(), name.to_string());
        if let Some((at, facts)) = self.lock().get(&key) {
            if at.elapsed() < self.ttl {
                return Ok(facts.clone());
            }
        }
        let facts = self.fetch_uncached(kind, namespace, name).await?;
        let mut cache = self.lock();
        // Full (of entries still within their TTL): look it up again next
        // time rather than grow without bound.
        if cache.len() < self.max_entries || cache.contains_key(&key) {
            cache.insert(key, (Instant::now(), facts.clone()));
        }
        Ok(facts)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    //! The verification rules over an in-memory object table (pure
    //! bookkeeping); `tests/rollup_kube.rs` proves them against the real
    //! API server.
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Table {
        objects: HashMap<(ObjKind, String), Facts>,
        reads: RefCell<Vec<ObjKind>>,
    }

    impl Fetch for Table {
        async fn fetch(
            &self,
            kind: ObjKind,
            _namespace: &str,
            name: &str,
        ) -> Result<Option<Facts>, kube::Error> {
            self.reads.borrow_mut().push(kind);
            Ok(self.objects.get(&(kind, name.to_string())).cloned())
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }

    fn reference(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn facts(uid: &str, owners: Vec<OwnerReference>, selector: Option<LabelSelector>) -> Facts {
        Facts {
            uid: uid.into(),
            labels: BTreeMap::new(),
            owners,
            selector,
        }
    }

    /// web (Deployment) -> web-5d9 (ReplicaSet) -> web-5d9-a (Pod).
    fn deployment() -> Table {
        let mut t = Table::default();
        let selector = match_labels(&[("app", "web")]);
        t.objects.insert(
            (ObjKind::Deployment, "web".into()),
            facts("d-uid", vec![], Some(selector.clone())),
        );
        t.objects.insert(
            (ObjKind::ReplicaSet, "web-5d9".into()),
            facts(
                "rs-uid",
                vec![reference("apps/v1", "Deployment", "web", "d-uid")],
                Some(selector),
            ),
        );
        let mut pod = facts(
            "pod-uid",
            vec![reference("apps/v1", "ReplicaSet", "web-5d9", "rs-uid")],
            None,
        );
        pod.labels = labels(&[("app", "web"), ("pod-template-hash", "5d9")]);
        t.objects.insert((ObjKind::Pod, "web-5d9-a".into()), pod);
        t
    }

    fn resolve_now(t: &Table, pod: &str, uid: &str) -> Chain {
        let fut = resolve(t, "ns", pod, uid);
        // The table answers at once: one poll completes the future.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = std::pin::pin!(fut);
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r.unwrap(),
            std::task::Poll::Pending => panic!("the table never waits"),
        }
    }

    use std::future::Future as _;

    fn named(kind: &str, name: &str) -> NamedOwner {
        NamedOwner {
            kind: kind.into(),
            name: name.into(),
        }
    }

    fn ctrl(kind: ControllerKind, name: &str, uid: &str) -> Controller {
        Controller {
            kind,
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_deployment_is_reached_through_its_replicaset() {
        let t = deployment();
        assert_eq!(
            resolve_now(&t, "web-5d9-a", "pod-uid"),
            Chain::Verified {
                owner: named("Deployment", "web"),
                rollup: vec![ctrl(ControllerKind::Deployment, "web", "d-uid")]
            }
        );
        assert_eq!(
            *t.reads.borrow(),
            [ObjKind::Pod, ObjKind::ReplicaSet, ObjKind::Deployment]
        );
    }

    #[test]
    fn every_link_must_verify() {
        use Unverified::*;
        type Case = (&'static str, fn(&mut Table), Chain);
        let cases: [Case; 8] = [
            (
                "the pod is another one now",
                |_| {},
                Chain::Unverified(PodGone),
            ),
            (
                "the ReplicaSet has another uid",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::ReplicaSet, "web-5d9".into()))
                        .unwrap()
                        .uid = "x".into()
                },
                Chain::Unverified(UidMismatch),
            ),
            (
                "the Deployment is gone",
                |t| {
                    t.objects.remove(&(ObjKind::Deployment, "web".into()));
                },
                Chain::Unverified(OwnerMissing),
            ),
            (
                "the Deployment's selector does not match the pod",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::Deployment, "web".into()))
                        .unwrap()
                        .selector = Some(match_labels(&[("app", "db")]))
                },
                Chain::Unverified(SelectorMismatch),
            ),
            (
                "the ReplicaSet's selector is empty",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::ReplicaSet, "web-5d9".into()))
                        .unwrap()
                        .selector = Some(LabelSelector::default())
                },
                Chain::Unverified(SelectorMismatch),
            ),
            (
                "the pod's reference is not a controller reference",
                |t| {
                    let pod = t
                        .objects
                        .get_mut(&(ObjKind::Pod, "web-5d9-a".into()))
                        .unwrap();
                    pod.owners[0].controller = None;
                },
                Chain::Unverified(NoControllerReference),
            ),
            (
                "the pod names the Deployment itself",
                |t| {
                    let pod = t
                        .objects
                        .get_mut(&(ObjKind::Pod, "web-5d9-a".into()))
                        .unwrap();
                    pod.owners = vec![reference("apps/v1", "Deployment", "web", "d-uid")];
                },
                Chain::Unverified(UnsupportedOwner),
            ),
            (
                "the ReplicaSet has no Deployment",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::ReplicaSet, "web-5d9".into()))
                        .unwrap()
                        .owners
                        .clear()
                },
                Chain::Verified {
                    owner: named("ReplicaSet", "web-5d9"),
                    rollup: vec![],
                },
            ),
        ];
        for (i, (what, change, want)) in cases.into_iter().enumerate() {
            let mut t = deployment();
            change(&mut t);
            let uid = if i == 0 { "other-uid" } else { "pod-uid" };
            assert_eq!(resolve_now(&t, "web-5d9-a", uid), want, "{what}");
        }
    }

    fn resolve_remembering_now(t: &Table, recent: &RecentChains, pod: &str, uid: &str) -> Chain {
        let seen = SeenPods::new(KEEP_CHAINS_FOR, MAX_REMEMBERED);
        resolve_seen_now(t, recent, &seen, pod, uid)
    }

    fn resolve_seen_now(
        t: &Table,
        recent: &RecentChains,
        seen: &SeenPods,
        pod: &str,
        uid: &str,
    ) -> Chain {
        let fut = resolve_remembering(t, recent, seen, "ns", pod, uid);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = std::pin::pin!(fut);
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r.unwrap(),
            std::task::Poll::Pending => panic!("the table never waits"),
        }
    }

    /// Issue 38, point 7: a pod deleted (or recreated under its name)
    /// before its last findings are flushed keeps the chain it verified
    /// with while it lived; a uid that never verified borrows nothing.
    #[test]
    fn a_gone_pod_keeps_the_chain_it_verified_with() {
        let mut t = deployment();
        let recent = RecentChains::new(KEEP_CHAINS_FOR, MAX_REMEMBERED);
        let verified = Chain::Verified {
            owner: named("Deployment", "web"),
            rollup: vec![ctrl(ControllerKind::Deployment, "web", "d-uid")],
        };
        assert_eq!(
            resolve_remembering_now(&t, &recent, "web-5d9-a", "pod-uid"),
            verified
        );
        // Recreated under its name: another uid.
        t.objects
            .get_mut(&(ObjKind::Pod, "web-5d9-a".into()))
            .unwrap()
            .uid = "new-uid".into();
        assert_eq!(
            resolve_remembering_now(&t, &recent, "web-5d9-a", "pod-uid"),
            verified,
            "the old pod's findings keep its chain"
        );
        // Deleted.
        t.objects.remove(&(ObjKind::Pod, "web-5d9-a".into()));
        assert_eq!(
            resolve_remembering_now(&t, &recent, "web-5d9-a", "pod-uid"),
            verified
        );
        assert_eq!(
            resolve_remembering_now(&t, &recent, "web-5d9-a", "never-seen"),
            Chain::Unverified(Unverified::PodGone)
        );
        // Without the memory (what `resolve` alone says).
        assert_eq!(
            resolve_now(&t, "web-5d9-a", "pod-uid"),
            Chain::Unverified(Unverified::PodGone)
        );
    }

    /// What the pod watch saw of `web-5d9-a` in [`deployment`].
    fn seen_web_pod(t: &Table) -> SeenPods {
        let facts = &t.objects[&(ObjKind::Pod, "web-5d9-a".into())];
        let pod = k8s_openapi::api::core::v1::Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("web-5d9-a".into()),
                uid: Some(facts.uid.clone()),
                labels: Some(facts.labels.clone()),
                owner_references: Some(facts.owners.clone()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        };
        let seen = SeenPods::new(KEEP_CHAINS_FOR, MAX_REMEMBERED);
        seen.saw(&pod);
        seen
    }

    /// Issue 38, point 7: a pod gone before its chain was ever verified
    /// is verified from what the watch saw, from its owner up, by uid and
    /// selector; the pod itself is not needed, and a changed owner fails.
    #[test]
    fn a_gone_pod_never_verified_is_verified_from_what_the_watch_saw() {
        use Unverified::*;
        let verified = Chain::Verified {
            owner: named("Deployment", "web"),
            rollup: vec![ctrl(ControllerKind::Deployment, "web", "d-uid")],
        };
        type Case = (&'static str, fn(&mut Table), &'static str, Chain);
        let cases: [Case; 5] = [
            ("the owners are as they were", |_| {}, "web-5d9-a", verified),
            (
                "the ReplicaSet was recreated under its name",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::ReplicaSet, "web-5d9".into()))
                        .unwrap()
                        .uid = "rs-uid-2".into()
                },
                "web-5d9-a",
                Chain::Unverified(UidMismatch),
            ),
            (
                "the Deployment is gone",
                |t| {
                    t.objects.remove(&(ObjKind::Deployment, "web".into()));
                },
                "web-5d9-a",
                Chain::Unverified(OwnerMissing),
            ),
            (
                "the ReplicaSet selects other pods",
                |t| {
                    t.objects
                        .get_mut(&(ObjKind::ReplicaSet, "web-5d9".into()))
                        .unwrap()
                        .selector = Some(match_labels(&[("app", "db")]))
                },
                "web-5d9-a",
                Chain::Unverified(SelectorMismatch),
            ),
            (
                "the finding names another pod",
                |_| {},
                "web-5d9-b",
                Chain::Unverified(PodGone),
            ),
        ];
        for (what, change, pod, want) in cases {
            let mut t = deployment();
            let seen = seen_web_pod(&t);
            t.objects.remove(&(ObjKind::Pod, "web-5d9-a".into()));
            change(&mut t);
            let recent = RecentChains::new(KEEP_CHAINS_FOR, MAX_REMEMBERED);
            assert_eq!(
                resolve_seen_now(&t, &recent, &seen, pod, "pod-uid"),
                want,
                "{what}"
            );
            // A chain verified this way is remembered like any other.
            assert_eq!(
                recent.recall("pod-uid").is_some(),
                matches!(want, Chain::Verified { .. }),
                "{what}"
            );
        }
        // Another uid borrows nothing of what the watch saw.
        let t = deployment();
        let seen = seen_web_pod(&t);
        let recent = RecentChains::new(KEEP_CHAINS_FOR, MAX_REMEMBERED);
        assert_eq!(
            resolve_seen_now(&t, &recent, &seen, "web-5d9-a", "other-uid"),
            Chain::Unverified(PodGone)
        );
    }

    #[test]
    fn a_pod_without_owners_has_no_chain() {
        let mut t = Table::default();
        t.objects
            .insert((ObjKind::Pod, "solo".into()), facts("u", vec![], None));
        assert_eq!(resolve_now(&t, "solo", "u"), Chain::NoOwner);
    }

    #[test]
    fn a_cronjob_is_reached_through_its_job() {
        let mut t = Table::default();
        let selector = match_labels(&[("batch.kubernetes.io/controller-uid", "job-uid")]);
        t.objects.insert(
            (ObjKind::CronJob, "nightly".into()),
            facts("cj-uid", vec![], None),
        );
        t.objects.insert(
            (ObjKind::Job, "nightly-29".into()),
            facts(
                "job-uid",
                vec![reference("batch/v1", "CronJob", "nightly", "cj-uid")],
                Some(selector),
            ),
        );
        let mut pod = facts(
            "pod-uid",
            vec![reference("batch/v1", "Job", "nightly-29", "job-uid")],
            None,
        );
        pod.labels = labels(&[("batch.kubernetes.io/controller-uid", "job-uid")]);
        t.objects.insert((ObjKind::Pod, "nightly-29-x".into()), pod);
        assert_eq!(
            resolve_now(&t, "nightly-29-x", "pod-uid"),
            Chain::Verified {
                owner: named("Job", "nightly-29"),
                rollup: vec![
                    ctrl(ControllerKind::Job, "nightly-29", "job-uid"),
                    ctrl(ControllerKind::CronJob, "nightly", "cj-uid"),
                ]
            }
        );
        // A Job whose CronJob is another object of the same name.
        t.objects
            .get_mut(&(ObjKind::CronJob, "nightly".into()))
            .unwrap()
            .uid = "other".into();
        assert_eq!(
            resolve_now(&t, "nightly-29-x", "pod-uid"),
            Chain::Unverified(Unverified::UidMismatch)
        );
    }

    #[test]
    fn selector_semantics() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        let expr = |key: &str, op: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
        };
        assert!(selects(&match_labels(&[("app", "web")]), &pod));
        assert!(!selects(&match_labels(&[("app", "db")]), &pod));
        assert!(
            !selects(&LabelSelector::default(), &pod),
            "empty: no evidence"
        );
        assert!(selects(&expr("tier", "In", &["front", "back"]), &pod));
        assert!(!selects(&expr("tier", "In", &["back"]), &pod));
        assert!(!selects(&expr("tier", "In", &[]), &pod), "invalid");
        assert!(selects(&expr("tier", "NotIn", &["back"]), &pod));
        assert!(selects(&expr("zone", "NotIn", &["a"]), &pod));
        assert!(!selects(&expr("tier", "NotIn", &["front"]), &pod));
        assert!(selects(&expr("app", "Exists", &[]), &pod));
        assert!(!selects(&expr("app", "Exists", &["web"]), &pod), "invalid");
        assert!(selects(&expr("zone", "DoesNotExist", &[]), &pod));
        assert!(!selects(&expr("app", "DoesNotExist", &[]), &pod));
        assert!(!selects(&expr("app", "Gt", &["1"]), &pod));
        let mut both = match_labels(&[("app", "web")]);
        both.match_expressions = expr("tier", "In", &["back"]).match_expressions;
        assert!(!selects(&both, &pod), "ANDed");
    }
}
