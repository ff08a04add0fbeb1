//! The engine: the one owner of the managers and of this node's picture of
//! policies, namespaces and pods.
//!
//! Every watch event reaches it in order on one task, so the fan-out the
//! specification gives (attribution learns a pod before anything asks about
//! its events; a policy is compiled before the pods it selects arrive) is
//! the order of the calls below rather than a property of locks. After each
//! event the engine rewrites this node's report on every policy; the flush
//! loop writes those reports on its own schedule.

mod disclosure;
mod observe;
mod pod_dirs;
mod policies;
mod recover;
mod reports;
mod started;

pub use observe::{
    denial_event, dns_event, exec_events, ExecGate, Plane, DENIALS_SOURCE, DNS_SOURCE,
    EGRESS_SOURCE, EXEC_TRACE_SOURCE, OPENEXEC_SOURCE,
};
pub use pod_dirs::ScannedPodDir;
pub use recover::{Late, LateSlot};

use super::convert;
use super::data::Fetcher;
use super::resolve::{CgroupResolver, PodCgroups};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kyverno_runtime_api::runtimepolicy::{
    BehaviorBackend, EventSourceState, EventSourceStatus, NodePolicyStatus, RuntimePolicyMode,
    UnresolvedPod,
};
use kyverno_runtime_bpf::egress::SnoopStats;
use kyverno_runtime_enforce::dns::{DnsGateManager, KernelDns};
use kyverno_runtime_enforce::egress::{EgressEnforcer, EgressManager, NetworkPod, Reprogrammed};
use kyverno_runtime_enforce::lsm::LsmEnforcer;
use kyverno_runtime_enforce::names::ServiceName;
use kyverno_runtime_enforce::openexec::{OpenExecManager, Pod as OpenExecPod};
use kyverno_runtime_enforce::protocol::{KernelProtocol, ProtocolManager};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_metrics::BackendBehavior;
use kyverno_runtime_metrics::{DropReason, Metrics};
use kyverno_runtime_plane::SourceState;
use kyverno_runtime_policy::compile::EvaluationResult;
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::selector::{PodTarget, NAMESPACE_NAME_LABEL};
use kyverno_runtime_policy::values::BehaviorKind;
use kyverno_runtime_report::{Finding, ReporterHandle};
use kyverno_runtime_status::{types, NodeReport, Reports};
use policies::{enforce_failure, PolicyOutcome, PolicyState};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// At most this many pods are named in a shard's `unresolvedPods`; the
/// count beside it is exact.
const UNRESOLVED_SHOWN: usize = 16;
/// At most this many rejected values are named in a spec condition.
const REJECTIONS_SHOWN: usize = 8;

/// The open/exec manager over the kernel backend.
pub type OpenExec = OpenExecManager<LsmEnforcer, LsmEnforcer>;
/// The network manager over the kernel backend.
pub type Egress = EgressManager<EgressEnforcer>;
/// The protocol manager over the kernel classifier.
pub type Protocol = ProtocolManager<KernelProtocol>;
/// The DNS question observer's gate over the kernel observer.
pub type Dns = DnsGateManager<KernelDns>;

/// A backend slot: the loaded manager, or why there is none.
pub enum Slot<M> {
    /// Loaded and attached.
    Ready(M),
    /// Not available on this node, with the reason shown in status.
    Unavailable(String),
}

impl<M> Slot<M> {
    fn get_ref(&self) -> Option<&M> {
        match self {
            Slot::Ready(m) => Some(m),
            Slot::Unavailable(_) => None,
        }
    }

    fn get(&mut self) -> Option<&mut M> {
        match self {
            Slot::Ready(m) => Some(m),
            Slot::Unavailable(_) => None,
        }
    }

    /// Why it is unavailable, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Slot::Ready(_) => None,
            Slot::Unavailable(r) => Some(r),
        }
    }
}

struct PodState {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    /// The owner findings name ([`convert::owner`]: a Deployment for its
    /// ReplicaSet's pods), as the pod claims it (unverified).
    owner: Option<(String, String)>,
    /// What a monitorFilter's `event.pod` also reads: `spec.nodeName`,
    /// `spec.serviceAccountName`, and the containers' runtime ids.
    node_name: String,
    service_account: String,
    container_ids: BTreeMap<String, String>,
    cgroups: PodCgroups,
}

/// The outputs a finding is handed to; each redacts before anything
/// leaves the daemon.
#[derive(Clone, Default)]
pub struct FindingSinks {
    /// OpenReports Reports (`--reports-enabled`).
    pub reporter: Option<ReporterHandle>,
    /// The gRPC push stream (`--push-target`).
    pub push: Option<kyverno_runtime_push::PushHandle>,
}

impl kyverno_runtime_plane::FindingSink for FindingSinks {
    fn submit(&self, finding: Finding) {
        if let Some(p) = &self.push {
            p.submit(finding.clone());
        }
        if let Some(r) = &self.reporter {
            r.submit(finding);
        }
    }
}

/// What the engine is built from (the daemon's wiring site fills it).
pub struct Parts {
    /// This node's name.
    pub node: String,
    /// The shard's per-behavior backends.
    pub backends: Vec<BehaviorBackend>,
    /// The open/exec manager, or why there is none.
    pub openexec: Slot<OpenExec>,
    /// The network manager, or why there is none.
    pub egress: Slot<Egress>,
    /// The protocol manager, or why there is none.
    pub protocol: Slot<Protocol>,
    /// The DNS gate, or why there is none.
    pub dns: Slot<Dns>,
    /// Finds container cgroups.
    pub resolver: CgroupResolver,
    /// This node's status reports.
    pub reports: Reports,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The event plane's attribution index, monitor, exec tracer and source
    /// states.
    pub plane: Plane,
}

/// The engine; see the module docs.
pub struct Engine {
    node: String,
    backends: Vec<BehaviorBackend>,
    openexec: Slot<OpenExec>,
    egress: Slot<Egress>,
    protocol: Slot<Protocol>,
    dns: Slot<Dns>,
    resolver: CgroupResolver,
    reports: Reports,
    metrics: Arc<Metrics>,
    plane: observe::PlaneState,
    policies: BTreeMap<String, PolicyState>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pods: BTreeMap<String, PodState>,
    /// Failures of backend calls since the policy's last successful
    /// program, by policy uid, for the shard's message.
    failures: BTreeMap<String, Vec<String>>,
    /// Rejected values by policy uid, for the spec-level conditions.
    rejections: BTreeMap<String, Rejections>,
    /// The DNS answer snooper's counters at the last look (they are
    /// cumulative; metrics take the deltas).
    snoop_seen: SnoopStats,
    /// Each filter set's learned-address refusals as last logged
    /// (`over_share`, `answers_refused`).
    learned_seen: std::collections::HashMap<u32, (u64, u64)>,
    /// The kernel's loss counters at the last poll (see
    /// [`observe::Losses`]).
    losses: observe::Losses,
    /// Fetches policies' data sources (`None`: no data, so a policy
    /// reading one fails to evaluate, saying so).
    fetcher: Option<Arc<Fetcher>>,
    /// Namespaces whose pods enforce policies never enforce (the daemon's
    /// own, the cluster's control pods; see [`Engine::set_protected_namespaces`]).
    protected: BTreeSet<String>,
    /// Show values computed from fetched data where operators read (see
    /// `engine/disclosure.rs`).
    show_data_values: bool,
    /// Told what the pod watch sees, so a pod deleted before its first
    /// findings are flushed still rolls up (see [`Engine::saw_pod`]).
    reporter: Option<ReporterHandle>,
    /// Whether what a previous daemon pinned was reconciled (a backend
    /// loaded after that reconciles its own, see `engine/recover.rs`).
    adopted_reconciled: bool,
    /// Service addresses the API reported while no network manager held
    /// them, replayed into one that loads after start.
    late_services: BTreeMap<ServiceName, Option<BTreeSet<IpAddr>>>,
    /// Whether Services were listed while no network manager was loaded.
    late_services_synced: bool,
    /// What a batch of watch events deferred (see [`Engine::begin_batch`]).
    batch: Batch,
    /// Containers the runtime started before their Pod's status says so
    /// (the NRI plugin; see `engine/started.rs`).
    started: started::Started,
    /// Pod directories bound where no runtime hook announces containers
    /// (see `engine/pod_dirs.rs`).
    pod_dirs: pod_dirs::PodDirs,
}

/// Work derived from the whole state that a batch of events defers to its
/// end: each event of a relist would otherwise redo it over every pod and
/// policy (1,000 pods of 1,000 policies: a billion selector matches
/// before the node's pods were listed, measured by `ci/daemon-rss
/// --cgroups`).
#[derive(Debug, Default)]
struct Batch {
    /// Inside a batch: the work below is marked, not done.
    open: bool,
    /// Every policy's report wants rebuilding.
    reports: bool,
    /// The exec tracer's gate wants syncing with the pods.
    exec_trace: bool,
    /// Pods (uids) to hand to the managers, added, changed or gone: each
    /// manager converges once for all of them.
    pods: BTreeSet<String>,
}

/// One pod as each manager takes it.
struct ManagerPods {
    openexec: OpenExecPod,
    egress: NetworkPod,
    /// For the protocol classifier and the DNS observer.
    network: NetworkPod,
}

#[derive(Default)]
struct Rejections {
    network: Vec<String>,
    open: Vec<String>,
    exec: Vec<String>,
    /// Values programmed as written (or normalized) that cannot mean what
    /// they seem to, grouped by the same conditions.
    warnings: Warnings,
}

/// [`convert::warnings`] of a policy's lists, by spec condition: network,
/// protocol and dns under TargetsValid, then open, then exec.
#[derive(Default, PartialEq)]
struct Warnings {
    network: Vec<String>,
    open: Vec<String>,
    exec: Vec<String>,
}

impl Warnings {
    /// The warnings of an evaluation, whatever backend this node has: they
    /// are about the spec, the same answer on every node.
    fn of(result: &EvaluationResult) -> Self {
        let mut w = Warnings::default();
        for kind in BehaviorKind::ALL {
            let Some(lists) = BehaviorLists::merge(result, kind) else {
                continue;
            };
            let into = match kind {
                BehaviorKind::Open => &mut w.open,
                BehaviorKind::Exec => &mut w.exec,
                BehaviorKind::Network | BehaviorKind::Protocol | BehaviorKind::Dns => {
                    &mut w.network
                }
            };
            into.extend(
                convert::warnings(kind, &lists)
                    .iter()
                    .map(ToString::to_string),
            );
        }
        w
    }
}

impl Engine {
    /// An engine over the loaded backends.
    pub fn new(parts: Parts) -> Self {
        let Parts {
            node,
            backends,
            openexec,
            egress,
            protocol,
            dns,
            resolver,
            reports,
            metrics,
            plane,
        } = parts;
        Engine {
            node,
            backends,
            openexec,
            egress,
            protocol,
            dns,
            resolver,
            reports,
            metrics,
            plane: observe::PlaneState::new(plane),
            policies: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            pods: BTreeMap::new(),
            failures: BTreeMap::new(),
            rejections: BTreeMap::new(),
            snoop_seen: SnoopStats::default(),
            learned_seen: std::collections::HashMap::new(),
            losses: observe::Losses::default(),
            fetcher: None,
            protected: BTreeSet::new(),
            show_data_values: false,
            reporter: None,
            adopted_reconciled: false,
            late_services: BTreeMap::new(),
            late_services_synced: false,
            batch: Batch::default(),
            started: started::Started::default(),
            pod_dirs: pod_dirs::PodDirs::default(),
        }
        .with_loss_baselines()
    }

    /// Starts a batch of events: until [`Engine::end_batch`], the reports'
    /// rebuild and the exec tracer's sync are marked instead of done after
    /// each event, then done once.
    pub fn begin_batch(&mut self) {
        self.batch.open = true;
    }

    /// Ends a batch: does once what its events deferred.
    pub fn end_batch(&mut self) {
        self.batch.open = false;
        self.flush_pods();
        if std::mem::take(&mut self.batch.exec_trace) {
            self.sync_exec_trace();
        }
        if std::mem::take(&mut self.batch.reports) {
            self.refresh_reports();
        }
    }

    /// Enforce policies never enforce on the pods of `namespaces` (issue
    /// 37: one policy must not cut the daemon off the API server, or stop
    /// the cluster's control pods); a policy selecting such pods says so
    /// in its shard. Monitor policies observe them as any other. Empty:
    /// none protected (the operator opted in).
    pub fn set_protected_namespaces(&mut self, namespaces: BTreeSet<String>) {
        self.protected = namespaces;
        let names: Vec<String> = self.policies.keys().cloned().collect();
        for name in names {
            self.program(&name);
        }
        self.refresh_reports();
    }

    /// Hands what the pod watch sees to `reporter` (`--reports-enabled`).
    pub fn set_reporter(&mut self, reporter: ReporterHandle) {
        self.reporter = Some(reporter);
    }

    /// The pod watch delivered `pod` (applied or deleted): the reporter
    /// keeps its controller reference by uid, without an API call, for
    /// findings flushed after the pod is gone (issue 38, point 7).
    pub fn saw_pod(&self, pod: &Pod) {
        if let Some(r) = &self.reporter {
            r.saw_pod(pod);
        }
    }

    /// Shows values computed from fetched data in status, errors and logs
    /// (the operator's opt-in; hidden by default, see
    /// `engine/disclosure.rs`).
    pub fn set_show_data_values(&mut self, show: bool) {
        self.show_data_values = show;
    }

    /// The pods `target` selects in the protected namespaces, as
    /// `namespace/name`.
    fn protected_pods(&self, target: &PodTarget) -> Vec<String> {
        self.pods
            .values()
            .filter(|pod| self.protected.contains(&pod.namespace))
            .filter(|pod| target.matches(&self.namespace_labels(&pod.namespace), &pod.labels))
            .map(|pod| format!("{}/{}", pod.namespace, pod.name))
            .collect()
    }

    /// Fetches data sources with `fetcher` from now on.
    pub fn set_fetcher(&mut self, fetcher: Arc<Fetcher>) {
        self.fetcher = Some(fetcher);
    }

    /// The names of the policies it knows (for a relist's deletions).
    pub fn policy_names(&self) -> BTreeSet<String> {
        self.policies.keys().cloned().collect()
    }

    /// The uids of the pods it holds.
    pub fn pod_uids(&self) -> BTreeSet<String> {
        self.pods.keys().cloned().collect()
    }

    /// The namespaces it knows.
    pub fn namespace_names(&self) -> BTreeSet<String> {
        self.namespaces.keys().cloned().collect()
    }

    // ---- namespaces and pods --------------------------------------------------------

    /// A namespace was created or relabeled: a relabel replays its pods, so
    /// a `namespaceSelector` follows it.
    pub fn apply_namespace(&mut self, ns: &Namespace) {
        let Some(name) = ns.metadata.name.clone() else {
            return;
        };
        let labels = ns.metadata.labels.clone().unwrap_or_default();
        let changed = self.namespaces.get(&name) != Some(&labels);
        self.namespaces.insert(name.clone(), labels);
        if changed {
            self.observe_namespace(&name);
            let uids: Vec<String> = self
                .pods
                .iter()
                .filter(|(_, p)| p.namespace == name)
                .map(|(uid, _)| uid.clone())
                .collect();
            for uid in uids {
                self.program_pod(&uid);
            }
            self.refresh_reports();
        }
    }

    /// A namespace is gone (its pods go with it through their own deletes).
    pub fn delete_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name).is_some() {
            self.observe_namespace(name);
        }
    }

    /// A pod on this node was created or changed (the watch).
    pub fn apply_pod(&mut self, pod: &Pod) {
        self.pod_dirs_watched(pod);
        let pod = self.started.watched(pod);
        self.take_pod(&pod);
    }

    /// A pod as it now is (the watch's, with the runtime's containers).
    fn take_pod(&mut self, pod: &Pod) {
        self.saw_pod(pod);
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if !convert::is_running(pod) && !self.starting_in_pod_dir(&uid, pod) {
            self.remove_pod(&uid);
            return;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        // Resolution is retried whenever the container statuses change, and
        // on every update while incomplete: a cgroup that was not there yet
        // may be now.
        let cgroups = match self.pods.get(&uid) {
            Some(old)
                if old.cgroups.key == super::resolve::container_ids_key(pod)
                    && old.cgroups.unresolved.is_empty() =>
            {
                old.cgroups.clone()
            }
            _ => self.resolver.resolve(pod),
        };
        for u in &cgroups.unresolved {
            tracing::warn!(pod = %format!("{namespace}/{name}"), container = %u.container, reason = %u.reason, "container cgroup not resolved: nothing is enforced or observed for it");
        }
        let before = self
            .pods
            .get(&uid)
            .map(|p| (p.labels.clone(), p.cgroups.ids()));
        let owner = convert::owner(pod);
        let state = PodState {
            namespace,
            name,
            labels: convert::labels(pod),
            owner,
            node_name: convert::node_name(pod),
            service_account: convert::service_account(pod),
            container_ids: convert::container_ids(pod),
            cgroups,
        };
        let unchanged = before.as_ref() == Some(&(state.labels.clone(), state.cgroups.ids()));
        self.pods.insert(uid.clone(), state);
        if !unchanged {
            // Attribution learns the pod before anything can ask about its
            // events.
            self.observe_pod(&uid);
            self.program_pod(&uid);
        }
        self.update_unresolved_metric();
        self.refresh_reports();
    }

    /// A pod left this node (the watch: deleted, or moved).
    pub fn delete_pod(&mut self, uid: &str) {
        self.started.forget(uid);
        self.pod_dirs_forget(uid);
        self.remove_pod(uid);
    }

    /// A pod left this node (deleted, or no longer Running).
    fn remove_pod(&mut self, uid: &str) {
        if self.pods.remove(uid).is_none() {
            return;
        }
        self.observe_pod(uid);
        if self.batch.open {
            self.batch.pods.insert(uid.to_owned());
            self.update_unresolved_metric();
            self.refresh_reports();
            return;
        }
        let mut failures = Vec::new();
        if let Some(m) = self.openexec.get() {
            failures.extend(m.delete_pod(uid).iter().map(ToString::to_string));
        }
        if let Some(m) = self.egress.get() {
            failures.extend(m.delete_pod(uid).iter().map(ToString::to_string));
        }
        if let Some(m) = self.protocol.get() {
            failures.extend(m.delete_pod(uid).iter().map(ToString::to_string));
        }
        if let Some(m) = self.dns.get() {
            failures.extend(m.delete_pod(uid).iter().map(ToString::to_string));
        }
        for f in failures {
            tracing::error!(pod = %uid, failure = %f, "unbinding a departed pod failed");
        }
        self.update_unresolved_metric();
        self.refresh_reports();
    }

    /// A pod (as it is now, with its namespace's labels) as each manager
    /// takes it.
    fn manager_pods(&self, uid: &str) -> Option<ManagerPods> {
        let p = self.pods.get(uid)?;
        let namespace_labels = self
            .namespaces
            .get(&p.namespace)
            .cloned()
            .unwrap_or_default();
        Some(ManagerPods {
            openexec: OpenExecPod {
                uid: uid.to_string(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                labels: p.labels.clone(),
                namespace_labels: namespace_labels.clone(),
                // The pod's own directory too, while no runtime hook
                // announces its containers before they start.
                cgroups: p
                    .cgroups
                    .ids()
                    .into_iter()
                    .chain(self.pod_dirs.cgroup_of(uid))
                    .collect(),
            },
            egress: NetworkPod {
                uid: uid.to_string(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                labels: p.labels.clone(),
                namespace_labels,
                cgroups: p.cgroups.containers.clone(),
            },
            network: NetworkPod {
                uid: uid.to_string(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                labels: p.labels.clone(),
                namespace_labels: self.namespace_labels(&p.namespace),
                cgroups: p.cgroups.containers.clone(),
            },
        })
    }

    /// Hands a pod to the managers (at the end of the batch, inside one).
    fn program_pod(&mut self, uid: &str) {
        if self.batch.open {
            self.batch.pods.insert(uid.to_owned());
            return;
        }
        // One pod is a batch of one: the managers converge the same way.
        self.program_pods(BTreeSet::from([uid.to_owned()]));
    }

    /// Hands the managers the pods the open batch has touched so far: what
    /// releases everything no pod claims (the adoption's reconcile) must
    /// not run before the managers know the pods (it would unbind a pod
    /// the relist just delivered, and the batch's end bind it again: a
    /// gap, found by `faults_kill.rs`).
    fn flush_pods(&mut self) {
        let touched = std::mem::take(&mut self.batch.pods);
        if !touched.is_empty() {
            self.program_pods(touched);
        }
    }

    /// Hands the pods a batch touched to the managers: those still on the
    /// node as they are now, the others as gone; each manager converges
    /// once for all of them.
    fn program_pods(&mut self, uids: BTreeSet<String>) {
        let mut present = Vec::new();
        let mut departed = Vec::new();
        for uid in uids {
            match self.manager_pods(&uid) {
                Some(pod) => present.push(pod),
                None => departed.push(uid),
            }
        }
        let mut failures = Vec::new();
        let metrics = self.metrics.clone();
        if let Some(m) = self.openexec.get() {
            let pods = present.iter().map(|p| p.openexec.clone()).collect();
            failures.extend(m.apply_pods(pods, &departed).into_iter().map(|f| {
                metrics.kernel_update_failed(BackendBehavior::open_exec, enforce_failure(&f.error));
                (f.policy.as_str().to_string(), f.to_string())
            }));
        }
        if let Some(m) = self.egress.get() {
            let pods = present.iter().map(|p| p.egress.clone()).collect();
            failures.extend(m.apply_pods(pods, &departed).into_iter().map(|f| {
                metrics.kernel_update_failed(BackendBehavior::network, enforce_failure(&f.error));
                (f.policy.as_str().to_string(), f.to_string())
            }));
        }
        if let Some(m) = self.protocol.get() {
            // Converged pod by pod already (its sets are per pod).
            for pod in &present {
                for f in m.upsert_pod(pod.network.clone()) {
                    tracing::error!(pod = %pod.network.uid, failure = %f, "attaching the protocol classifier failed");
                }
            }
            for uid in &departed {
                for f in m.delete_pod(uid) {
                    tracing::error!(pod = %uid, failure = %f, "detaching the protocol classifier failed");
                }
            }
        }
        if let Some(m) = self.dns.get() {
            let pods = present.iter().map(|p| p.network.clone()).collect();
            for f in m.apply_pods(pods, &departed) {
                tracing::error!(failure = %f, "gating the DNS observer failed");
            }
        }
        self.record_failures(failures, "binding or unbinding pods failed");
    }

    /// Records failed backend calls (policy uid, failure) for their
    /// policies' shards, each distinct failure once, and says the new ones
    /// in the log, one line per policy with its name. A call that keeps
    /// failing (a full map) is retried on every event: recorded and said
    /// each time, it grew the list and flooded the log (415,000 lines in
    /// four minutes with 2,000 pods past a map's capacity, `ci/daemon-rss
    /// --cgroups 1000 2000`).
    fn record_failures(&mut self, failures: Vec<(String, String)>, what: &str) {
        let mut by_policy: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (uid, f) in failures {
            by_policy.entry(uid).or_default().push(f);
        }
        for (uid, fs) in by_policy {
            let standing = self.failures.entry(uid.clone()).or_default();
            let mut known: std::collections::HashSet<String> = standing.iter().cloned().collect();
            let mut new = Vec::new();
            for f in fs {
                if known.insert(f.clone()) {
                    standing.push(f.clone());
                    new.push(f);
                }
            }
            if let Some(first) = new.first() {
                let name = self
                    .policies
                    .values()
                    .find(|p| p.uid == uid)
                    .map_or(uid.as_str(), |p| p.name.as_str());
                tracing::error!(policy = %name, new_failures = new.len(), first = %first, "{what}");
            }
        }
    }

    /// Pods the namespace watch has not delivered yet are matched against
    /// no labels; the daemon syncs namespaces before pods, so this only
    /// covers a namespace created after its first pod was seen.
    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        let mut labels = self.namespaces.get(namespace).cloned().unwrap_or_default();
        // What the API server sets on every namespace, for a namespace not
        // delivered yet too: what protection selects by.
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| namespace.to_owned());
        labels
    }

    fn update_unresolved_metric(&self) {
        let n = self
            .pods
            .values()
            .filter(|p| !p.cgroups.unresolved.is_empty())
            .count();
        self.metrics.set_pods_unresolved(n as i64);
    }

    // ---- cluster Service names ------------------------------------------------------

    /// The API reported `service`'s addresses (`None`: it does not exist):
    /// the network manager re-programs the policies naming it.
    pub fn service_addresses(&mut self, service: ServiceName, addresses: Option<BTreeSet<IpAddr>>) {
        match self.egress.get() {
            Some(m) => {
                let done = m.set_service_addresses(service, addresses);
                self.reprogrammed(done);
            }
            None => {
                self.late_services.insert(service, addresses);
            }
        }
    }

    /// Every Service and EndpointSlice has been listed: Service names
    /// resolve from now on (until then an adopted policy keeps what it
    /// held).
    pub fn services_synced(&mut self) {
        match self.egress.get() {
            Some(m) => {
                let done = m.services_synced();
                self.reprogrammed(done);
            }
            None => self.late_services_synced = true,
        }
    }

    /// Counts what the DNS answer snooper read since the last call: learned
    /// addresses as ingested, and every response or record it could not
    /// use as dropped (source `dnssnoop`), so a domain that learns nothing
    /// is explained.
    pub fn snoop_counters(&mut self) {
        let Some(m) = self.egress.get_ref() else {
            return;
        };
        let now = match m.backend().kernel().filter().read_snoop_stats() {
            Ok(s) => s,
            // Not loaded here: domains are refused, nothing to count.
            Err(e) => {
                tracing::trace!(error = %e, "DNS answer snooper counters unavailable");
                return;
            }
        };
        // The learned-address map never evicts: expired entries go here,
        // so they stop taking room in their set's share.
        if let Err(e) = m.backend().kernel().filter().sweep_learned() {
            tracing::warn!(error = %e, "DNS answer snooper: removing expired learned addresses failed");
        }
        let was = std::mem::replace(&mut self.snoop_seen, now);
        let delta = |n: u64, w: u64| n.saturating_sub(w);
        self.metrics
            .events_ingested("dnssnoop", "response", delta(now.responses, was.responses));
        self.metrics
            .events_ingested("dnssnoop", "learned", delta(now.learned, was.learned));
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::answer_unreadable,
            delta(
                now.malformed + now.name_too_long + now.unsupported,
                was.malformed + was.name_too_long + was.unsupported,
            ),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::walk_limit,
            delta(now.walk_limit, was.walk_limit),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::learn_failed,
            delta(now.learn_failed, was.learn_failed),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::over_share,
            delta(now.over_share, was.over_share),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::answer_refused,
            delta(now.answers_refused, was.answers_refused),
        );
        if now.over_share > was.over_share {
            self.log_learned_over_share();
        }
        self.metrics.events_ingested(
            "dnssnoop",
            "question",
            delta(now.questions_noted, was.questions_noted),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::answer_unsolicited,
            delta(now.refused(), was.refused()),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::question_undeclared,
            delta(now.questions_undeclared, was.questions_undeclared),
        );
        self.metrics.events_dropped(
            "dnssnoop",
            DropReason::question_not_noted,
            delta(
                now.questions_over_budget + now.questions_unreadable,
                was.questions_over_budget + was.questions_unreadable,
            ),
        );
    }

    /// Says which filter sets held their share of the learned-address map
    /// since the last call, and what that cost them.
    fn log_learned_over_share(&mut self) {
        let Some(m) = self.egress.get_ref() else {
            return;
        };
        let filter = m.backend().kernel().filter();
        let (uses, share) = match (filter.learned_use(), filter.learned_share()) {
            (Ok(u), Ok(s)) => (u, s),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "DNS answer snooper: reading the learned-address shares failed");
                return;
            }
        };
        for u in uses {
            let (over, refused) = self
                .learned_seen
                .get(&u.set_id)
                .copied()
                .unwrap_or_default();
            if u.over_share > over || u.answers_refused > refused {
                tracing::warn!(
                    set = u.set_id,
                    held = u.held,
                    share = share.unwrap_or(0),
                    not_learned = u.over_share.saturating_sub(over),
                    answers_refused = u.answers_refused.saturating_sub(refused),
                    "DNS answer snooper: a filter set holds its share of the learned-address map; \
                     further addresses are not learned (answers naming a denied domain's are dropped), \
                     so that it displaces nothing another pod learned"
                );
            }
            self.learned_seen
                .insert(u.set_id, (u.over_share, u.answers_refused));
        }
    }

    fn reprogrammed(&mut self, done: Reprogrammed) {
        let failures = done
            .failures
            .iter()
            .map(|f| (f.policy.as_str().to_string(), f.to_string()))
            .collect();
        self.record_failures(failures, "re-programming a Service's addresses failed");
        if !done.policies.is_empty() {
            self.refresh_reports();
        }
    }

    /// Reconciles what a previous daemon left pinned, once policies and
    /// pods have synced: anything held that no current policy wants is
    /// removed.
    pub fn reconcile_adopted(&mut self) {
        self.adopted_reconciled = true;
        // A policy not yet evaluated (its data still being fetched, its
        // source down, its spec failing) keeps what was pinned for it.
        let pending = self.pending_policies();
        if !pending.is_empty() {
            tracing::info!(
                policies = pending.len(),
                "policies not evaluated yet keep what a previous daemon pinned for them"
            );
        }
        self.reconcile_adopted_openexec(&pending);
        self.reconcile_adopted_egress(&pending);
    }

    /// The open/exec manager's reconciliation of what it adopted; its
    /// failures are counted and recorded like any binding's.
    fn reconcile_adopted_openexec(&mut self, pending: &BTreeSet<PolicyId>) {
        self.flush_pods();
        let metrics = self.metrics.clone();
        let Some(m) = self.openexec.get() else {
            return;
        };
        let failures = m
            .reconcile_adopted(pending)
            .into_iter()
            .map(|f| {
                metrics.kernel_update_failed(BackendBehavior::open_exec, enforce_failure(&f.error));
                (f.policy.as_str().to_string(), f.to_string())
            })
            .collect();
        self.record_failures(failures, "reconciling adopted open/exec state failed");
    }

    /// As [`Engine::reconcile_adopted_openexec`], for the egress manager.
    fn reconcile_adopted_egress(&mut self, pending: &BTreeSet<PolicyId>) {
        self.flush_pods();
        let metrics = self.metrics.clone();
        let Some(m) = self.egress.get() else {
            return;
        };
        let failures = m
            .reconcile_adopted(pending)
            .into_iter()
            .map(|f| {
                metrics.kernel_update_failed(BackendBehavior::network, enforce_failure(&f.error));
                (f.policy.as_str().to_string(), f.to_string())
            })
            .collect();
        self.record_failures(failures, "reconciling adopted egress state failed");
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests;
