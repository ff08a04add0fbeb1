//! The manager: RuntimePolicies and pods in, programs and bindings out ([`EgressManager`]).

use super::*;

/// The network values naming destinations, taken at one moment
/// ([`EgressManager::destination_names`]).
#[derive(Clone, Debug, Default)]
pub struct DestinationNames {
    pub(super) services: HashMap<IpAddr, Vec<String>>,
    pub(super) learned: BTreeMap<(CgroupId, IpAddr), String>,
}

impl DestinationNames {
    /// The names `dest` is known under for `cgroup`: each Service holding
    /// it (`<name>.<namespace>.svc`), then the domain the cgroup's set
    /// learned it under.
    pub fn of(&self, cgroup: CgroupId, dest: IpAddr) -> Vec<String> {
        let mut out = self.services.get(&dest).cloned().unwrap_or_default();
        if let Some(d) = self.learned.get(&(cgroup, dest)) {
            out.push(d.clone());
        }
        out
    }
}

/// A RuntimePolicy as this manager needs it: evaluated, with its target
/// compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The policy's UID.
    pub id: PolicyId,
    /// Its name, for logs.
    pub name: String,
    /// Enforce or monitor.
    pub mode: Mode,
    /// The pods it applies to.
    pub target: PodTarget,
    /// Its `network` behavior, if it has one.
    pub network: Option<BehaviorLists>,
}

/// One container's cgroup: its id and its cgroup v2 directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContainerCgroup {
    /// The cgroup id (the directory's inode number).
    pub id: CgroupId,
    /// The directory, which the program is attached to.
    pub path: PathBuf,
}

/// A pod on this node, as this manager needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPod {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its namespace's labels.
    pub namespace_labels: BTreeMap<String, String>,
    /// Its containers' cgroups.
    pub cgroups: Vec<ContainerCgroup>,
}

/// A backend call that failed for a policy; retried on the next event.
#[derive(Clone, Debug)]
pub struct EgressFailure {
    /// The policy.
    pub policy: PolicyId,
    /// What was being done.
    pub step: Step,
    /// The backend's error.
    pub error: Arc<EnforceError>,
}

impl fmt::Display for EgressFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "network: {}: {}", self.step, self.error)
    }
}

/// What a change of names ([`EgressManager::set_service_addresses`],
/// [`EgressManager::services_synced`]) re-programmed.
#[derive(Clone, Debug, Default)]
pub struct Reprogrammed {
    /// The policies compiled and converged again (those naming the
    /// Service).
    pub policies: Vec<PolicyId>,
    /// Backend calls that failed (retried on the next event).
    pub failures: Vec<EgressFailure>,
}

/// What [`EgressManager::upsert_policy`] did.
#[derive(Clone, Debug, Default)]
pub struct EgressOutcome {
    /// Values not programmed, in list order.
    pub rejections: Vec<EgressRejection>,
    /// Backend calls that failed.
    pub failures: Vec<EgressFailure>,
}

#[derive(Clone, Debug)]
pub(super) struct DesiredPolicy {
    pub(super) policy: NetworkPolicy,
    pub(super) compiled: CompiledNetwork,
}

/// State kept between [`EgressManager::new`] over a backend that holds
/// something (adopted pins) and [`EgressManager::reconcile_adopted`].
#[derive(Debug, Default)]
pub(super) struct Adoption {
    /// Every cgroup of every pod seen since the restart. A held binding of
    /// any other cgroup belongs to a pod not synced yet, and is kept.
    pub(super) known_cgroups: BTreeSet<CgroupId>,
    /// Policies deleted since the restart: removed even before the
    /// reconcile, since they were asked to go.
    pub(super) deleted: BTreeSet<PolicyId>,
}

/// The network manager over a backend `B` (the kernel [`EgressEnforcer`],
/// or [`FakeEnforcer`] in tests). It keeps the desired state and a mirror
/// of what the backend holds, and converges the one to the other after
/// every event, in the openexec manager's orders: add then bind; unbind
/// then update then bind; rebuild across observe/enforce; unbind then
/// remove. On a pod event, policies that are not default deny are bound
/// first and unbound last.
///
/// # Names
///
/// A Service a policy names is programmed as the addresses the manager
/// was last told it has ([`EgressManager::set_service_addresses`]); when
/// they change, every policy naming it is recompiled and converged, so the
/// addresses follow the Service (added, removed) like an edit of the
/// policy would. A Service that does not exist resolves to nothing until
/// it does ([`EgressManager::unresolved`]). Until
/// [`EgressManager::services_synced`], a policy naming a Service that the
/// backend already holds (after a restart: what the previous process
/// programmed) keeps its held program, so a restart does not drop a
/// Service's addresses for the moment the watch takes to list them.
/// Domains go to the backend as they are; its snooper learns their
/// addresses.
///
/// # Restart
///
/// [`EgressManager::new`] starts from what the backend holds (after a
/// restart, what the previous process pinned) and, as the openexec
/// manager does, keeps enforcing it until
/// [`EgressManager::reconcile_adopted`]: a held policy that has not been
/// upserted again is left alone, and a held binding is only dropped once
/// the pod owning that cgroup is known not to be selected. The reconcile,
/// called once policies and pods are synced, removes whatever is left over
/// and releases the links of a discarded pin layout.
pub struct EgressManager<B> {
    pub(super) backend: B,
    pub(super) held: BTreeMap<PolicyId, Held<Destination>>,
    pub(super) policies: BTreeMap<PolicyId, DesiredPolicy>,
    pub(super) pods: BTreeMap<String, NetworkPod>,
    pub(super) failures: BTreeMap<PolicyId, Vec<EgressFailure>>,
    pub(super) rejected_total: u64,
    pub(super) adoption: Option<Adoption>,
    /// Policies whose lists are not known yet (see
    /// [`EgressManager::reconcile_adopted`]).
    pub(super) pending: BTreeSet<PolicyId>,
    /// Policies whose last update failed part way: the backend holds their
    /// new rules (`held` says so) but not every cgroup's set converged, so
    /// the next convergence asks it to sync again even with nothing new.
    pub(super) unsettled: BTreeSet<PolicyId>,
    pub(super) services: ServiceAddresses,
}

impl<B> fmt::Debug for EgressManager<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressManager")
            .field("policies", &self.policies.len())
            .field("pods", &self.pods.len())
            .field("adopting", &self.adoption.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> EgressManager<B>
where
    B: Enforcer<Value = Destination> + CgroupPaths + DomainSupport,
{
    /// A manager over `backend`, starting from what it holds (after a
    /// restart, what the previous process pinned: see the type's docs)
    /// and changing none of it until told what is desired. Fails if the
    /// backend's state cannot be read.
    pub fn new(backend: B) -> Result<Self> {
        let held = backend.held()?;
        if !held.is_empty() {
            tracing::info!(
                policies = held.len(),
                "network: adopting policies held by the backend"
            );
        }
        Ok(Self {
            backend,
            // A backend holding nothing has nothing to keep: the adoption
            // rules would change nothing, so they are off.
            adoption: (!held.is_empty()).then(Adoption::default),
            held,
            policies: BTreeMap::new(),
            pods: BTreeMap::new(),
            failures: BTreeMap::new(),
            rejected_total: 0,
            pending: BTreeSet::new(),
            unsettled: BTreeSet::new(),
            services: ServiceAddresses::new(),
        })
    }

    /// Ends the adoption begun by [`new`](Self::new): call it once the
    /// policies and pods are synced. Held policies neither desired nor
    /// `pending` are removed, held bindings of cgroups no selected pod owns
    /// are unbound, and the links of a discarded pin layout are released;
    /// unless a backend call fails (returned), the backend then holds
    /// exactly what is desired.
    ///
    /// `pending` are the policies that exist but whose lists are not known
    /// yet (data being fetched, an evaluation failing): what a previous
    /// process held for them stays, untouched, until they are upserted or
    /// deleted, as the openexec manager does.
    pub fn reconcile_adopted(&mut self, pending: &BTreeSet<PolicyId>) -> Vec<EgressFailure> {
        self.adoption = None;
        self.pending = pending
            .iter()
            .filter(|id| !self.policies.contains_key(*id))
            .cloned()
            .collect();
        let failures = self.sync_all();
        match self.backend.release_unowned() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                links = n,
                "network: released links of a discarded pin layout"
            ),
            Err(e) => tracing::warn!(error = %e, "network: releasing stale links failed"),
        }
        failures
    }

    /// Adds or replaces a policy: parses its values (each unusable one an
    /// [`EgressRejection`], counted), programs it and binds the cgroups of
    /// the pods it selects.
    pub fn upsert_policy(&mut self, policy: NetworkPolicy) -> EgressOutcome {
        let id = policy.id.clone();
        let compiled = self.compile(&policy);
        for r in &compiled.rejections {
            tracing::warn!(policy = %id, name = %policy.name, rejection = %r, "network value not programmed");
        }
        self.log_unresolved(&policy.name, None, &compiled);
        self.rejected_total = self
            .rejected_total
            .saturating_add(u64::try_from(compiled.rejections.len()).unwrap_or(u64::MAX));
        let rejections = compiled.rejections.clone();
        self.policies
            .insert(id.clone(), DesiredPolicy { policy, compiled });
        if let Some(a) = &mut self.adoption {
            a.deleted.remove(&id);
        }
        self.pending.remove(&id);
        let failures = self.converge(&id);
        EgressOutcome {
            rejections,
            failures,
        }
    }

    pub(super) fn compile(&self, policy: &NetworkPolicy) -> CompiledNetwork {
        let domains = self.backend.domains_available();
        compile_network(
            policy.mode,
            policy.network.as_ref(),
            &NameContext {
                services: &self.services,
                domains: domains.as_ref().copied().map_err(String::as_str),
            },
        )
    }

    /// Logs the Services a policy names that now resolve to nothing (or
    /// again to something), once the Service watch has listed: before,
    /// every Service would read as unresolved.
    pub(super) fn log_unresolved(
        &self,
        name: &str,
        before: Option<&CompiledNetwork>,
        now: &CompiledNetwork,
    ) {
        if !self.services.synced() {
            return;
        }
        let was = before.map(|b| &b.unresolved);
        for s in &now.unresolved {
            if was.is_none_or(|w| !w.contains(s)) {
                tracing::info!(policy = %name, service = %s, "network: the Service has no address (it does not exist, or has no ClusterIP and no endpoints): it resolves to nothing until it has one");
            }
        }
        if let Some(was) = was {
            for s in was.difference(&now.unresolved) {
                tracing::info!(policy = %name, service = %s, "network: the Service resolves to addresses again");
            }
        }
    }

    /// Sets the addresses of `service` as the API reports them (`None`:
    /// it does not exist) and re-programs every policy naming it (a
    /// Service no policy names costs a map insert).
    pub fn set_service_addresses(
        &mut self,
        service: ServiceName,
        addresses: Option<BTreeSet<IpAddr>>,
    ) -> Reprogrammed {
        if !self.services.set(service.clone(), addresses) {
            return Reprogrammed::default();
        }
        let naming: Vec<PolicyId> = self
            .policies
            .iter()
            .filter(|(_, d)| d.compiled.services.contains(&service))
            .map(|(id, _)| id.clone())
            .collect();
        self.recompile_all(naming, false)
    }

    /// The Service watch has listed: every Service is known, so policies
    /// naming Services stop keeping what the backend held (see the type's
    /// docs) and are re-programmed from the addresses.
    pub fn services_synced(&mut self) -> Reprogrammed {
        if self.services.synced() {
            return Reprogrammed::default();
        }
        self.services.mark_synced();
        let naming: Vec<PolicyId> = self
            .policies
            .iter()
            .filter(|(_, d)| !d.compiled.services.is_empty())
            .map(|(id, _)| id.clone())
            .collect();
        // Every name unresolved now is news: before the sync nothing was
        // logged.
        self.recompile_all(naming, true)
    }

    pub(super) fn recompile_all(&mut self, policies: Vec<PolicyId>, log_all: bool) -> Reprogrammed {
        let failures = policies
            .iter()
            .flat_map(|id| self.recompile(id, log_all))
            .collect();
        Reprogrammed { policies, failures }
    }

    /// Compiles a desired policy again (its Services changed) and
    /// converges it; logs the names that became unresolved (every
    /// unresolved one with `log_all`).
    pub(super) fn recompile(&mut self, id: &PolicyId, log_all: bool) -> Vec<EgressFailure> {
        let Some(d) = self.policies.get(id) else {
            return Vec::new();
        };
        let compiled = self.compile(&d.policy);
        let before = (!log_all).then_some(&d.compiled);
        self.log_unresolved(&d.policy.name, before, &compiled);
        if let Some(d) = self.policies.get_mut(id) {
            d.compiled = compiled;
        }
        self.converge(id)
    }

    /// The Services a policy names that resolve to nothing yet, as
    /// `<name>.<namespace>.svc` (for its status and logs).
    pub fn unresolved(&self, id: &PolicyId) -> Vec<String> {
        self.policies
            .get(id)
            .map(|d| {
                d.compiled
                    .unresolved
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The addresses currently known for the network value `name`: a
    /// Service's (`<name>.<namespace>.svc[.<cluster domain>]`) as the API
    /// last reported them, a domain's as DNS answers taught the kernel
    /// (unexpired), an address or CIDR nothing (it names itself). For a
    /// monitor judging an observed address against a policy that names
    /// destinations by name; empty when nothing is known or `name` is not
    /// a network value.
    pub fn known_addresses(&self, name: &str) -> BTreeSet<IpAddr> {
        let at = kyverno_runtime_policy::values::FieldPath::spec();
        match parse_network(name, &at) {
            Ok(NetworkTarget::Service { name, namespace }) => self
                .services
                .get(&ServiceName { namespace, name })
                .cloned()
                .unwrap_or_default(),
            Ok(NetworkTarget::Domain(d)) => Domain::new(&d)
                .ok()
                .and_then(|d| match self.backend.learned_addresses(&d) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::debug!(error = %e, domain = %d, "network: learned addresses unavailable");
                        None
                    }
                })
                .unwrap_or_default(),
            _ => BTreeSet::new(),
        }
    }

    /// Removes a policy: unbinds its cgroups and removes it.
    pub fn delete_policy(&mut self, id: &PolicyId) -> Vec<EgressFailure> {
        self.policies.remove(id);
        if let Some(a) = &mut self.adoption {
            a.deleted.insert(id.clone());
        }
        self.pending.remove(id);
        self.converge(id)
    }

    /// Adds or replaces a pod and (un)binds its cgroups across policies.
    pub fn upsert_pod(&mut self, pod: NetworkPod) -> Vec<EgressFailure> {
        self.insert_pod(pod);
        self.sync_all()
    }

    /// [`upsert_pod`](Self::upsert_pod) of each of `upserts` and
    /// [`delete_pod`](Self::delete_pod) of each of `deletes` with one
    /// convergence of every policy for all of them (a relist of a node's
    /// pods would otherwise converge every policy once per pod).
    pub fn apply_pods(
        &mut self,
        upserts: Vec<NetworkPod>,
        deletes: &[String],
    ) -> Vec<EgressFailure> {
        for pod in upserts {
            self.insert_pod(pod);
        }
        let departed: Vec<NetworkPod> = deletes
            .iter()
            .filter_map(|uid| self.pods.remove(uid))
            .collect();
        let failures = self.sync_all();
        for c in departed.iter().flat_map(|p| &p.cgroups) {
            self.backend.forget_cgroup_path(c.id);
        }
        failures
    }

    pub(super) fn insert_pod(&mut self, pod: NetworkPod) {
        if let Some(old) = self.pods.get(&pod.uid) {
            for c in &old.cgroups {
                if !pod.cgroups.iter().any(|n| n.id == c.id) {
                    self.backend.forget_cgroup_path(c.id);
                }
            }
        }
        for c in &pod.cgroups {
            self.backend.set_cgroup_path(c.id, c.path.clone());
        }
        if let Some(a) = &mut self.adoption {
            a.known_cgroups.extend(pod.cgroups.iter().map(|c| c.id));
        }
        self.pods.insert(pod.uid.clone(), pod);
    }

    /// Forgets a pod and unbinds its cgroups.
    pub fn delete_pod(&mut self, uid: &str) -> Vec<EgressFailure> {
        let Some(pod) = self.pods.remove(uid) else {
            return Vec::new();
        };
        let failures = self.sync_all();
        for c in &pod.cgroups {
            self.backend.forget_cgroup_path(c.id);
        }
        failures
    }

    /// Takes the backend's observations.
    pub fn drain(&mut self) -> Result<Vec<Observation<B::Observed>>> {
        self.backend.drain()
    }

    /// The values of a policy that were not programmed, for its status.
    pub fn rejections(&self, id: &PolicyId) -> &[EgressRejection] {
        self.policies
            .get(id)
            .map(|d| d.compiled.rejections.as_slice())
            .unwrap_or_default()
    }

    /// Every value refused since start (for a metric).
    pub fn rejected_total(&self) -> u64 {
        self.rejected_total
    }

    /// The backend calls for a policy still to be retried.
    pub fn failures(&self, id: &PolicyId) -> &[EgressFailure] {
        self.failures.get(id).map(Vec::as_slice).unwrap_or_default()
    }

    /// What the manager believes the backend holds.
    pub fn programmed(&self) -> &BTreeMap<PolicyId, Held<Destination>> {
        &self.held
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (tests; changing it behind the manager's back
    /// makes the mirror wrong).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The network values naming each destination as the kernel holds
    /// them now, for the monitor to judge Service and domain values by the
    /// addresses the kernel uses ([`DestinationNames::of`]): the Services
    /// any policy names, by their ClusterIPs and endpoints as the API last
    /// reported them, and the domains the cgroups' sets learned from DNS
    /// answers, unexpired. A failed read of the learned addresses leaves
    /// the domains out (logged), never the Services.
    pub fn destination_names(&self) -> DestinationNames {
        let mut services: HashMap<IpAddr, Vec<String>> = HashMap::new();
        let named: BTreeSet<&ServiceName> = self
            .policies
            .values()
            .flat_map(|d| d.compiled.services.iter())
            .collect();
        for service in named {
            for addr in self.services.get(service).into_iter().flatten() {
                services.entry(*addr).or_default().push(service.to_string());
            }
        }
        let learned = self.backend.learned_names().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "network: learned addresses unavailable to the monitor");
            BTreeMap::new()
        });
        DestinationNames { services, learned }
    }

    /// The pod owning a cgroup, for attributing an observation.
    pub fn pod_of_cgroup(&self, cgroup: CgroupId) -> Option<&NetworkPod> {
        self.pods
            .values()
            .find(|p| p.cgroups.iter().any(|c| c.id == cgroup))
    }

    pub(super) fn target(&self, id: &PolicyId) -> Option<Held<Destination>> {
        let Some(d) = self.policies.get(id) else {
            // Pending: what is held stands (see `reconcile_adopted`).
            return self
                .pending
                .contains(id)
                .then(|| self.held.get(id).cloned())
                .flatten();
        };
        let mut program = d.compiled.program.clone()?;
        if !self.services.synced() && !d.compiled.services.is_empty() {
            if let Some(h) = self.held.get(id) {
                // The Service watch has not listed yet: what the backend
                // holds (the previous process's addresses) stands.
                program = h.program.clone();
            }
        }
        let mut cgroups: BTreeSet<CgroupId> = self
            .pods
            .values()
            .filter(|p| d.policy.target.matches(&p.namespace_labels, &p.labels))
            .flat_map(|p| p.cgroups.iter().map(|c| c.id))
            .collect();
        if let (Some(adoption), Some(held)) = (&self.adoption, self.held.get(id)) {
            // A binding of a cgroup whose pod is not synced yet: keep it,
            // or the restart would open a gap for that pod.
            cgroups.extend(
                held.cgroups
                    .iter()
                    .filter(|c| !adoption.known_cgroups.contains(c)),
            );
        }
        Some(Held { program, cgroups })
    }

    pub(super) fn fail(
        out: &mut Vec<EgressFailure>,
        id: &PolicyId,
        step: Step,
        error: EnforceError,
    ) {
        // Said by the caller, once per policy (a full map fails every
        // cgroup's binding, on every event).
        tracing::debug!(policy = %id, %step, %error, "network backend call failed; retried on the next event");
        out.push(EgressFailure {
            policy: id.clone(),
            step,
            error: Arc::new(error),
        });
    }

    /// Converges one policy fully, recording its failures.
    pub(super) fn converge(&mut self, id: &PolicyId) -> Vec<EgressFailure> {
        let target = self.target(id);
        let mut out = Vec::new();
        self.converge_phase(id, target.as_ref(), Phase::Full, &mut out);
        self.failures.remove(id);
        if !out.is_empty() {
            self.failures.insert(id.clone(), out.clone());
        }
        out
    }

    pub(super) fn converge_phase(
        &mut self,
        id: &PolicyId,
        target: Option<&Held<Destination>>,
        phase: Phase,
        out: &mut Vec<EgressFailure>,
    ) {
        let held = self.held.get(id).cloned();
        match (held, target) {
            (None, None) => {}
            (Some(h), None) => {
                if phase == Phase::BindOnly {
                    return;
                }
                self.unbind_all(id, &h.cgroups, out);
                if phase == Phase::Full {
                    match self.backend.remove_policy(id) {
                        Ok(()) => {
                            self.held.remove(id);
                            self.unsettled.remove(id);
                        }
                        Err(e) => Self::fail(out, id, Step::RemovePolicy, e),
                    }
                }
            }
            (None, Some(t)) => {
                if phase != Phase::Full {
                    return;
                }
                match self.backend.add_policy(id, &t.program) {
                    Ok(()) => {
                        self.held.insert(
                            id.clone(),
                            Held {
                                program: t.program.clone(),
                                cgroups: BTreeSet::new(),
                            },
                        );
                        self.bind_all(id, &t.cgroups, out);
                    }
                    Err(e) => Self::fail(out, id, Step::AddPolicy, e),
                }
            }
            (Some(h), Some(t)) => {
                let gone: BTreeSet<CgroupId> = h.cgroups.difference(&t.cgroups).copied().collect();
                let new: BTreeSet<CgroupId> = t.cgroups.difference(&h.cgroups).copied().collect();
                let same_program = h.program == t.program;
                match phase {
                    Phase::BindOnly => {
                        if same_program {
                            self.bind_all(id, &new, out);
                        }
                    }
                    Phase::UnbindOnly => self.unbind_all(id, &gone, out),
                    Phase::Full => {
                        if h.program.is_observe() != t.program.is_observe() {
                            // Rebuild across the observe/enforce line.
                            self.unbind_all(id, &h.cgroups, out);
                            match self.backend.remove_policy(id) {
                                Ok(()) => {
                                    self.held.remove(id);
                                    self.unsettled.remove(id);
                                }
                                Err(e) => return Self::fail(out, id, Step::RemovePolicy, e),
                            }
                            return self.converge_phase(id, Some(t), Phase::Full, out);
                        }
                        self.unbind_all(id, &gone, out);
                        if let Some(diff) = ProgramDiff::between_programs(&h.program, &t.program) {
                            if !diff.is_empty() || self.unsettled.contains(id) {
                                match self.backend.update_policy(id, &diff) {
                                    Ok(()) => {
                                        if let Some(m) = self.held.get_mut(id) {
                                            m.program = t.program.clone();
                                        }
                                        self.unsettled.remove(id);
                                    }
                                    Err(e) => {
                                        Self::fail(out, id, Step::UpdatePolicy, e);
                                        self.resettle(id);
                                        return;
                                    }
                                }
                            }
                        }
                        let bound = self
                            .held
                            .get(id)
                            .map(|h| h.cgroups.clone())
                            .unwrap_or_default();
                        let missing: BTreeSet<CgroupId> =
                            t.cgroups.difference(&bound).copied().collect();
                        self.bind_all(id, &missing, out);
                    }
                }
            }
        }
    }

    /// After a failed update: what the backend records for `id` is what
    /// the next diff starts from (a failure part way may have recorded
    /// the new rules, and written some of them), and the policy is synced
    /// again on its next convergence even if nothing changes by then. A
    /// shrink after the failure then removes exactly what was written.
    pub(super) fn resettle(&mut self, id: &PolicyId) {
        self.unsettled.insert(id.clone());
        crate::seam::read_back(&self.backend, id, &mut self.held);
    }

    pub(super) fn bind_all(
        &mut self,
        id: &PolicyId,
        cgroups: &BTreeSet<CgroupId>,
        out: &mut Vec<EgressFailure>,
    ) {
        for c in cgroups {
            match self.backend.bind(id, *c) {
                Ok(()) => {
                    if let Some(h) = self.held.get_mut(id) {
                        h.cgroups.insert(*c);
                    }
                }
                Err(e) => Self::fail(out, id, Step::Bind(*c), e),
            }
        }
    }

    pub(super) fn unbind_all(
        &mut self,
        id: &PolicyId,
        cgroups: &BTreeSet<CgroupId>,
        out: &mut Vec<EgressFailure>,
    ) {
        for c in cgroups {
            match self.backend.unbind(id, *c) {
                Ok(()) => {
                    if let Some(h) = self.held.get_mut(id) {
                        h.cgroups.remove(c);
                    }
                }
                Err(e) => Self::fail(out, id, Step::Unbind(*c), e),
            }
        }
    }

    pub(super) fn default_denies(&self, id: &PolicyId) -> bool {
        let wanted = self
            .policies
            .get(id)
            .and_then(|d| d.compiled.program.as_ref());
        let held = self.held.get(id).map(|h| &h.program);
        [wanted, held].into_iter().flatten().any(|p| {
            matches!(
                p,
                Program::Enforce(Rules {
                    default_deny: true,
                    ..
                })
            )
        })
    }

    /// Converges every policy after a pod event: binds to policies that are
    /// not default deny first, unbinds from default-deny ones, unbinds from
    /// the rest, then everything else default-deny first (the openexec
    /// manager's plan, so no instant refuses what neither state refuses).
    pub(super) fn sync_all(&mut self) -> Vec<EgressFailure> {
        // Every desired policy, and every held one that should go (before
        // the reconcile: only those deleted since the restart).
        let mut ids: BTreeSet<PolicyId> = self.policies.keys().cloned().collect();
        match &self.adoption {
            Some(a) => ids.extend(
                a.deleted
                    .iter()
                    .filter(|id| self.held.contains_key(*id))
                    .cloned(),
            ),
            None => ids.extend(self.held.keys().cloned()),
        }
        let pairs: Vec<(PolicyId, bool)> = ids
            .into_iter()
            .map(|id| {
                let dd = self.default_denies(&id);
                (id, dd)
            })
            .collect();
        let plan = [
            (false, Phase::BindOnly),
            (true, Phase::UnbindOnly),
            (false, Phase::UnbindOnly),
            (true, Phase::Full),
            (false, Phase::Full),
        ];
        let mut all: BTreeMap<PolicyId, Vec<EgressFailure>> = BTreeMap::new();
        for (dd, phase) in plan {
            for (id, _) in pairs.iter().filter(|p| p.1 == dd) {
                let target = self.target(id);
                let mut out = Vec::new();
                self.converge_phase(id, target.as_ref(), phase, &mut out);
                let slot = all.entry(id.clone()).or_default();
                if phase == Phase::Full {
                    // The full pass retried everything the partial passes
                    // tried: only its failures stand.
                    slot.clear();
                }
                slot.extend(out);
            }
        }
        let mut out = Vec::new();
        for (id, fails) in all {
            self.failures.remove(&id);
            if !fails.is_empty() {
                self.failures.insert(id.clone(), fails.clone());
            }
            out.extend(fails);
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    BindOnly,
    UnbindOnly,
    Full,
}
