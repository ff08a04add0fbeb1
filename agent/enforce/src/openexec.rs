//! The open/exec manager: RuntimePolicies and pods in, programs and
//! bindings out, over one [`Enforcer`] per dimension (open, exec).
//!
//! The manager keeps the desired state (each policy's evaluated lists,
//! compiled to a [`Program`] per dimension, and the cgroups of the pods its
//! [`PodTarget`] selects) and a mirror of what each backend holds, and
//! after every event *converges* the backend from the mirror to the desired
//! state. The mirror only changes when a backend call succeeds, so a failed
//! call leaves a difference the next event retries: every backend call is
//! idempotent, so retrying converges.
//!
//! # Ordering
//!
//! Per policy and dimension:
//!
//! - new policy: `add_policy`, then `bind` each selected cgroup, so no
//!   cgroup is ever bound to a half-built policy;
//! - update: `unbind` the cgroups no longer selected, then `update_policy`
//!   with the [`ProgramDiff`] (the backend orders its adds before its
//!   removes), then `bind` the newly selected cgroups, so a cgroup leaving
//!   the policy is gone before the rules loosen and a cgroup joining it
//!   only ever sees the new rules;
//! - a mode change across observe/enforce: a rebuild (unbind, remove, add,
//!   bind), so an observer never inherits deny entries and an enforcer
//!   never starts from an observer's empty program;
//! - delete: `unbind` every cgroup, then `remove_policy`.
//!
//! Across policies, a pod event binds and unbinds in an order that never
//! refuses, even for an instant, what neither the state before nor the
//! state after refuses (see `sync_all`): allow-bearing policies are bound
//! before default-deny ones and unbound after them.
//!
//! # Restart
//!
//! [`OpenExecManager::new`] adopts what the backends hold (the previous
//! process's pinned maps) and keeps enforcing it: until
//! [`OpenExecManager::reconcile_adopted`] is called, a held policy that has
//! not been upserted again is left alone, and a held binding is only
//! dropped once the pod owning that cgroup is known not to be selected.
//! `reconcile_adopted`, called once policies and pods are synced, removes
//! whatever is left over.
//!
//! # Errors
//!
//! Nothing here panics on a backend error. A value the kernel cannot hold
//! is a [`Rejection`] and a backend call that failed is a [`Failure`]; both
//! are returned by the call that met them and kept per policy
//! ([`OpenExecManager::rejections`], [`OpenExecManager::failures`]) for the
//! status writer, until the policy changes or converges.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use kyverno_runtime_compat::Behavior;
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{parse_path, AbsPath, PathTarget, Reason, ValueError, STAR};

use crate::seam::{
    CgroupId, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff, Result,
    Rules,
};

/// A RuntimePolicy's mode, as far as the kernel is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Program the lists: the kernel refuses.
    Enforce,
    /// Program nothing but the bindings: the kernel counts, userspace
    /// matches the lists against what it counted.
    Monitor,
}

/// One behavior kind's evaluated lists in one policy, as the decision rule
/// merges them (`"*"` in deny beside the explicit denies).
pub use kyverno_runtime_policy::rule::BehaviorLists;

/// A RuntimePolicy as this manager needs it: evaluated, with its target
/// compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenExecPolicy {
    /// The policy's UID.
    pub id: PolicyId,
    /// Its name, for logs.
    pub name: String,
    /// Enforce or monitor.
    pub mode: Mode,
    /// The pods it applies to ([`PodTarget::nothing`] if its selectors did
    /// not compile).
    pub target: PodTarget,
    /// Its `open` behavior, if it has one.
    pub open: Option<BehaviorLists>,
    /// Its `exec` behavior, if it has one.
    pub exec: Option<BehaviorLists>,
}

/// A pod on this node, as this manager needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its namespace's labels (for `namespaceSelector`).
    pub namespace_labels: BTreeMap<String, String>,
    /// Its containers' cgroups.
    pub cgroups: Vec<CgroupId>,
}

/// A value the kernel cannot hold: its field (`spec.behaviors[2].open.deny`),
/// the value and the [`Reason`]. It is not programmed; the rest of the list
/// is.
pub type Rejection = ValueError;

/// The dimensions this manager serves, each with its own backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// File opens.
    Open,
    /// Program executions.
    Exec,
}

impl Dimension {
    /// Both, in the order they are served.
    pub const BOTH: [Dimension; 2] = [Dimension::Open, Dimension::Exec];

    /// The behavior this dimension is.
    pub fn behavior(self) -> Behavior {
        match self {
            Dimension::Open => Behavior::Open,
            Dimension::Exec => Behavior::Exec,
        }
    }

    fn index(self) -> usize {
        match self {
            Dimension::Open => 0,
            Dimension::Exec => 1,
        }
    }
}

/// The backend call that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Adding the policy's program.
    AddPolicy,
    /// Applying a diff to it.
    UpdatePolicy,
    /// Removing it.
    RemovePolicy,
    /// Binding a cgroup to it.
    Bind(CgroupId),
    /// Unbinding a cgroup from it.
    Unbind(CgroupId),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::AddPolicy => f.write_str("programming the policy"),
            Step::UpdatePolicy => f.write_str("updating the policy"),
            Step::RemovePolicy => f.write_str("removing the policy"),
            Step::Bind(c) => write!(f, "binding cgroup {c}"),
            Step::Unbind(c) => write!(f, "unbinding cgroup {c}"),
        }
    }
}

/// A backend call that failed for a policy. The manager retries it on the
/// next event that touches the policy.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The policy.
    pub policy: PolicyId,
    /// The dimension whose backend failed.
    pub dimension: Dimension,
    /// What was being done.
    pub step: Step,
    /// The backend's error (shared: a failure is both returned and kept).
    pub error: Arc<EnforceError>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.dimension.behavior().name(),
            self.step,
            self.error
        )
    }
}

/// What [`OpenExecManager::upsert_policy`] did.
#[derive(Clone, Debug, Default)]
pub struct PolicyOutcome {
    /// Values not programmed, in list order (open, then exec).
    pub rejections: Vec<Rejection>,
    /// Backend calls that failed.
    pub failures: Vec<Failure>,
}

impl PolicyOutcome {
    /// Whether everything was programmed.
    pub fn is_clean(&self) -> bool {
        self.rejections.is_empty() && self.failures.is_empty()
    }
}

/// What [`OpenExecManager::drain`] took from both backends.
#[derive(Debug, Default)]
pub struct Drained {
    /// The observations, tagged with their behavior (the kernel merged
    /// every policy's decision already, so they carry no policy).
    pub observations: Vec<(Behavior, Observation<String>)>,
    /// The backends whose drain failed; the other was drained anyway.
    pub errors: Vec<(Behavior, EnforceError)>,
}

/// One policy's desired state.
#[derive(Clone, Debug)]
struct Desired {
    policy: OpenExecPolicy,
    /// Per [`Dimension::index`]: the program, or none for no behavior (or
    /// an enforce behavior with nothing to enforce).
    programs: [Option<Program<AbsPath>>; 2],
    rejections: Vec<Rejection>,
}

/// What one (policy, dimension) should hold.
#[derive(Clone, Debug)]
struct Target {
    program: Program<AbsPath>,
    cgroups: BTreeSet<CgroupId>,
}

/// How much of a convergence to do (see `sync_all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Only bind newly selected cgroups, and only where the program is
    /// already what it should be.
    BindOnly,
    /// Only unbind cgroups no longer selected from a policy that stays.
    UnbindOnly,
    /// Everything.
    Full,
}

/// One dimension: its backend and the mirror of what it holds.
struct Side<B> {
    backend: B,
    dimension: Dimension,
    held: BTreeMap<PolicyId, Held<AbsPath>>,
}

/// A [`Side`] with its backend's type erased, so the manager can treat
/// its two (differently typed) sides alike.
trait Converge {
    fn held(&self) -> &BTreeMap<PolicyId, Held<AbsPath>>;
    fn converge(&mut self, id: &PolicyId, target: Option<&Target>, phase: Phase) -> Vec<Failure>;
    fn drain(&mut self) -> Result<Vec<Observation<String>>>;
}

impl<B> Side<B>
where
    B: Enforcer<Value = AbsPath>,
{
    fn fail(&self, out: &mut Vec<Failure>, id: &PolicyId, step: Step, error: EnforceError) {
        // Said by the caller, once per policy (a full map fails every
        // cgroup's binding, on every event).
        tracing::debug!(
            policy = %id,
            behavior = self.dimension.behavior().name(),
            %step,
            %error,
            "backend call failed; it is retried on the next event"
        );
        out.push(Failure {
            policy: id.clone(),
            dimension: self.dimension,
            step,
            error: Arc::new(error),
        });
    }

    fn add(&mut self, id: &PolicyId, program: &Program<AbsPath>, out: &mut Vec<Failure>) -> bool {
        match self.backend.add_policy(id, program) {
            Ok(()) => {
                self.held.insert(
                    id.clone(),
                    Held {
                        program: program.clone(),
                        cgroups: BTreeSet::new(),
                    },
                );
                true
            }
            Err(e) => {
                self.fail(out, id, Step::AddPolicy, e);
                false
            }
        }
    }

    fn update(
        &mut self,
        id: &PolicyId,
        diff: &ProgramDiff<AbsPath>,
        program: &Program<AbsPath>,
        out: &mut Vec<Failure>,
    ) -> bool {
        match self.backend.update_policy(id, diff) {
            Ok(()) => {
                if let Some(held) = self.held.get_mut(id) {
                    held.program = program.clone();
                }
                true
            }
            Err(e) => {
                self.fail(out, id, Step::UpdatePolicy, e);
                // A later shrink then removes exactly what was written.
                crate::seam::read_back(&self.backend, id, &mut self.held);
                false
            }
        }
    }

    fn remove(&mut self, id: &PolicyId, out: &mut Vec<Failure>) -> bool {
        match self.backend.remove_policy(id) {
            Ok(()) => {
                self.held.remove(id);
                true
            }
            Err(e) => {
                self.fail(out, id, Step::RemovePolicy, e);
                false
            }
        }
    }

    /// Binds each cgroup; one failing does not stop the others.
    fn bind_all(&mut self, id: &PolicyId, cgroups: &BTreeSet<CgroupId>, out: &mut Vec<Failure>) {
        for &cgroup in cgroups {
            match self.backend.bind(id, cgroup) {
                Ok(()) => {
                    if let Some(held) = self.held.get_mut(id) {
                        held.cgroups.insert(cgroup);
                    }
                }
                Err(e) => self.fail(out, id, Step::Bind(cgroup), e),
            }
        }
    }

    /// Unbinds each cgroup; one failing does not stop the others (it stays
    /// bound, which for an enforce policy fails closed).
    fn unbind_all(&mut self, id: &PolicyId, cgroups: &BTreeSet<CgroupId>, out: &mut Vec<Failure>) {
        for &cgroup in cgroups {
            match self.backend.unbind(id, cgroup) {
                Ok(()) => {
                    if let Some(held) = self.held.get_mut(id) {
                        held.cgroups.remove(&cgroup);
                    }
                }
                Err(e) => self.fail(out, id, Step::Unbind(cgroup), e),
            }
        }
    }

    /// Unbinds everything, then removes the policy. If the removal
    /// succeeds the unbind failures are moot (removing drops every
    /// binding) and are forgotten; it is attempted even after them, so a
    /// backend that cannot unbind cannot keep a deleted policy alive.
    fn teardown(&mut self, id: &PolicyId, out: &mut Vec<Failure>) -> bool {
        let bound = self
            .held
            .get(id)
            .map(|h| h.cgroups.clone())
            .unwrap_or_default();
        let mut unbinds = Vec::new();
        self.unbind_all(id, &bound, &mut unbinds);
        if self.remove(id, out) {
            true
        } else {
            out.extend(unbinds);
            false
        }
    }

    fn bound(&self, id: &PolicyId) -> BTreeSet<CgroupId> {
        self.held
            .get(id)
            .map(|h| h.cgroups.clone())
            .unwrap_or_default()
    }
}

impl<B> Converge for Side<B>
where
    B: Enforcer<Value = AbsPath>,
    B::Observed: fmt::Display,
{
    fn held(&self) -> &BTreeMap<PolicyId, Held<AbsPath>> {
        &self.held
    }

    fn converge(&mut self, id: &PolicyId, target: Option<&Target>, phase: Phase) -> Vec<Failure> {
        let mut out = Vec::new();
        let Some(held) = self.held.get(id).cloned() else {
            // Not held: program first, then bind.
            if let (Some(t), Phase::Full) = (target, phase) {
                if self.add(id, &t.program, &mut out) {
                    self.bind_all(id, &t.cgroups, &mut out);
                }
            }
            return out;
        };
        let Some(t) = target else {
            // Held, not wanted. Removals are loosening, so they wait for
            // the full pass (see `sync_all`).
            if phase == Phase::Full {
                self.teardown(id, &mut out);
            }
            return out;
        };
        let rebuild = held.program.is_observe() != t.program.is_observe();
        let diff = match (&held.program, &t.program) {
            (Program::Enforce(from), Program::Enforce(to)) => Some(ProgramDiff::between(from, to)),
            _ => None,
        };
        let program_current = !rebuild && diff.as_ref().is_none_or(ProgramDiff::is_empty);
        match phase {
            Phase::BindOnly => {
                // Binding to rules about to change would let the cgroup
                // see the old ones.
                if program_current {
                    let new = t.cgroups.difference(&held.cgroups).copied().collect();
                    self.bind_all(id, &new, &mut out);
                }
            }
            Phase::UnbindOnly => {
                let stale = held.cgroups.difference(&t.cgroups).copied().collect();
                self.unbind_all(id, &stale, &mut out);
            }
            Phase::Full => {
                let stale = held.cgroups.difference(&t.cgroups).copied().collect();
                self.unbind_all(id, &stale, &mut out);
                if rebuild {
                    if self.teardown(id, &mut out) && self.add(id, &t.program, &mut out) {
                        self.bind_all(id, &t.cgroups, &mut out);
                    }
                    return out;
                }
                if let Some(diff) = diff.filter(|d| !d.is_empty()) {
                    if !self.update(id, &diff, &t.program, &mut out) {
                        // The new cgroups wait for the rules they must see.
                        return out;
                    }
                }
                let new = t.cgroups.difference(&self.bound(id)).copied().collect();
                self.bind_all(id, &new, &mut out);
            }
        }
        out
    }

    fn drain(&mut self) -> Result<Vec<Observation<String>>> {
        Ok(self
            .backend
            .drain()?
            .into_iter()
            .map(|o| Observation {
                cgroup: o.cgroup,
                observed: o.observed.to_string(),
                decision: o.decision,
                count: o.count,
            })
            .collect())
    }
}

/// State kept between [`OpenExecManager::new`] and
/// [`OpenExecManager::reconcile_adopted`].
#[derive(Debug, Default)]
struct Adoption {
    /// Every cgroup of every pod seen since the restart. A held binding of
    /// any other cgroup belongs to a pod not synced yet, and is kept.
    known_cgroups: BTreeSet<CgroupId>,
    /// Policies deleted since the restart: removed even before the
    /// reconcile, since they were asked to go.
    deleted: BTreeSet<PolicyId>,
}

/// The policies whose lists are not known yet (see
/// [`OpenExecManager::reconcile_adopted`]): what is held for them stands
/// until they are upserted or deleted.
type Pending = BTreeSet<PolicyId>;

/// The open/exec manager over an open backend `O` and an exec backend `E`
/// (see the [module docs](self)).
pub struct OpenExecManager<O, E> {
    open: Side<O>,
    exec: Side<E>,
    policies: BTreeMap<PolicyId, Desired>,
    pods: BTreeMap<String, Pod>,
    failures: BTreeMap<(PolicyId, Dimension), Vec<Failure>>,
    adoption: Option<Adoption>,
    pending: Pending,
}

impl<O, E> fmt::Debug for OpenExecManager<O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenExecManager")
            .field("policies", &self.policies.len())
            .field("pods", &self.pods.len())
            .field("adopting", &self.adoption.is_some())
            .finish_non_exhaustive()
    }
}

impl<O, E> OpenExecManager<O, E>
where
    O: Enforcer<Value = AbsPath>,
    O::Observed: fmt::Display,
    E: Enforcer<Value = AbsPath>,
    E::Observed: fmt::Display,
{
    /// A manager over the two backends, adopting what they hold (after a
    /// restart, what the previous process left) and changing none of it
    /// until told what is desired. Fails if either backend's state cannot
    /// be read.
    pub fn new(open: O, exec: E) -> Result<Self> {
        let open_held = open.held()?;
        let exec_held = exec.held()?;
        if !open_held.is_empty() || !exec_held.is_empty() {
            tracing::info!(
                open = open_held.len(),
                exec = exec_held.len(),
                "adopting policies held by the backends"
            );
        }
        Ok(Self {
            open: Side {
                backend: open,
                dimension: Dimension::Open,
                held: open_held,
            },
            exec: Side {
                backend: exec,
                dimension: Dimension::Exec,
                held: exec_held,
            },
            policies: BTreeMap::new(),
            pods: BTreeMap::new(),
            failures: BTreeMap::new(),
            adoption: Some(Adoption::default()),
            pending: Pending::new(),
        })
    }

    /// Adds or replaces a policy: parses its values (each unusable one a
    /// [`Rejection`]), programs both dimensions and binds the cgroups of
    /// the pods it selects. See the [module docs](self) for the order.
    pub fn upsert_policy(&mut self, policy: OpenExecPolicy) -> PolicyOutcome {
        let id = policy.id.clone();
        let mut rejections = Vec::new();
        let mut programs = [None, None];
        for dim in Dimension::BOTH {
            let lists = match dim {
                Dimension::Open => policy.open.as_ref(),
                Dimension::Exec => policy.exec.as_ref(),
            };
            let (program, rejected) = compile_paths(policy.mode, lists);
            programs[dim.index()] = program;
            rejections.extend(rejected);
        }
        for r in &rejections {
            tracing::warn!(policy = %id, name = %policy.name, rejection = %r, "value not programmed");
        }
        self.policies.insert(
            id.clone(),
            Desired {
                policy,
                programs,
                rejections: rejections.clone(),
            },
        );
        if let Some(a) = &mut self.adoption {
            a.deleted.remove(&id);
        }
        self.pending.remove(&id);
        let mut failures = Vec::new();
        for dim in Dimension::BOTH {
            failures.extend(self.converge(dim, &id, Phase::Full));
        }
        PolicyOutcome {
            rejections,
            failures,
        }
    }

    /// Removes a policy: unbinds its cgroups and removes its programs.
    /// Returns the backend calls that failed (retried on later events).
    pub fn delete_policy(&mut self, id: &PolicyId) -> Vec<Failure> {
        self.policies.remove(id);
        if let Some(a) = &mut self.adoption {
            a.deleted.insert(id.clone());
        }
        self.pending.remove(id);
        let mut failures = Vec::new();
        for dim in Dimension::BOTH {
            failures.extend(self.converge(dim, id, Phase::Full));
        }
        failures
    }

    /// Adds or replaces a pod (new, relabeled, namespace relabeled, cgroups
    /// changed) and binds or unbinds its cgroups across every policy.
    /// Returns the backend calls that failed.
    pub fn upsert_pod(&mut self, pod: Pod) -> Vec<Failure> {
        self.insert_pod(pod);
        self.sync_all()
    }

    fn insert_pod(&mut self, pod: Pod) {
        if let Some(a) = &mut self.adoption {
            a.known_cgroups.extend(pod.cgroups.iter().copied());
        }
        self.pods.insert(pod.uid.clone(), pod);
    }

    /// [`upsert_pod`](Self::upsert_pod) of each of `upserts` and
    /// [`delete_pod`](Self::delete_pod) of each of `deletes` with one
    /// convergence of every policy for all of them (a relist of a node's
    /// pods would otherwise converge every policy once per pod).
    pub fn apply_pods(&mut self, upserts: Vec<Pod>, deletes: &[String]) -> Vec<Failure> {
        for pod in upserts {
            self.insert_pod(pod);
        }
        for uid in deletes {
            self.pods.remove(uid);
        }
        self.sync_all()
    }

    /// Forgets a pod and unbinds its cgroups from every policy. Returns the
    /// backend calls that failed.
    pub fn delete_pod(&mut self, uid: &str) -> Vec<Failure> {
        if self.pods.remove(uid).is_none() {
            return Vec::new();
        }
        self.sync_all()
    }

    /// Ends the adoption begun by [`new`](Self::new): call it once the
    /// policies and pods are synced. Held policies neither desired nor
    /// `pending` are removed and held bindings of cgroups no selected pod
    /// owns are unbound; unless a backend call fails (returned), both
    /// backends then hold exactly [`desired`](Self::desired).
    ///
    /// `pending` are the policies that exist but whose lists are not known
    /// yet (their data is being fetched, or they fail to evaluate): what a
    /// previous process held for them stays, untouched, until they are
    /// upserted (their lists replace it) or deleted. Removing it for being
    /// "not yet wanted" would drop enforcement at every restart for as
    /// long as a data source is slow, and for good while it is down.
    pub fn reconcile_adopted(&mut self, pending: &BTreeSet<PolicyId>) -> Vec<Failure> {
        self.adoption = None;
        self.pending = pending
            .iter()
            .filter(|id| !self.policies.contains_key(*id))
            .cloned()
            .collect();
        self.sync_all()
    }

    /// Takes both backends' observations. A backend whose drain fails does
    /// not stop the other's; its error is returned alongside.
    pub fn drain(&mut self) -> Drained {
        let mut drained = Drained::default();
        for dim in Dimension::BOTH {
            match self.side_mut(dim).drain() {
                Ok(obs) => drained
                    .observations
                    .extend(obs.into_iter().map(|o| (dim.behavior(), o))),
                Err(e) => {
                    tracing::warn!(behavior = dim.behavior().name(), error = %e, "drain failed");
                    drained.errors.push((dim.behavior(), e));
                }
            }
        }
        drained
    }

    /// The values of a policy that were not programmed, for its status.
    pub fn rejections(&self, id: &PolicyId) -> &[Rejection] {
        self.policies
            .get(id)
            .map(|d| d.rejections.as_slice())
            .unwrap_or_default()
    }

    /// The backend calls for a policy that failed in its last convergence
    /// and are still to be retried, for its status. Empty once it
    /// converged.
    pub fn failures(&self, id: &PolicyId) -> Vec<Failure> {
        Dimension::BOTH
            .iter()
            .filter_map(|dim| self.failures.get(&(id.clone(), *dim)))
            .flatten()
            .cloned()
            .collect()
    }

    /// What the manager wants the backend of `dim` to hold: per desired
    /// policy with a program for `dim`, the program and the cgroups of the
    /// pods it selects (before [`reconcile_adopted`](Self::reconcile_adopted),
    /// also the adopted bindings still kept).
    pub fn desired(&self, dim: Dimension) -> BTreeMap<PolicyId, Held<AbsPath>> {
        self.policies
            .keys()
            .chain(&self.pending)
            .filter_map(|id| {
                self.target(dim, id).map(|t| {
                    (
                        id.clone(),
                        Held {
                            program: t.program,
                            cgroups: t.cgroups,
                        },
                    )
                })
            })
            .collect()
    }

    /// What the manager believes the backend of `dim` holds: what it
    /// adopted, changed by every call that succeeded since.
    pub fn programmed(&self, dim: Dimension) -> &BTreeMap<PolicyId, Held<AbsPath>> {
        self.side(dim).held()
    }

    /// The pod owning a cgroup, for attributing an observation.
    pub fn pod_of_cgroup(&self, cgroup: CgroupId) -> Option<&Pod> {
        self.pods.values().find(|p| p.cgroups.contains(&cgroup))
    }

    /// The open backend.
    pub fn open_backend(&self) -> &O {
        &self.open.backend
    }

    /// The exec backend.
    pub fn exec_backend(&self) -> &E {
        &self.exec.backend
    }

    /// The open backend, mutably: for tests (failure injection, simulated
    /// operations). Changing what it holds behind the manager's back makes
    /// the manager's mirror wrong.
    pub fn open_backend_mut(&mut self) -> &mut O {
        &mut self.open.backend
    }

    /// The exec backend, mutably (see [`open_backend_mut`](Self::open_backend_mut)).
    pub fn exec_backend_mut(&mut self) -> &mut E {
        &mut self.exec.backend
    }

    fn side(&self, dim: Dimension) -> &dyn Converge {
        match dim {
            Dimension::Open => &self.open,
            Dimension::Exec => &self.exec,
        }
    }

    fn side_mut(&mut self, dim: Dimension) -> &mut dyn Converge {
        match dim {
            Dimension::Open => &mut self.open,
            Dimension::Exec => &mut self.exec,
        }
    }

    /// The cgroups of every known pod `target` selects.
    fn selected(&self, target: &PodTarget) -> BTreeSet<CgroupId> {
        self.pods
            .values()
            .filter(|p| target.matches(&p.namespace_labels, &p.labels))
            .flat_map(|p| p.cgroups.iter().copied())
            .collect()
    }

    /// What (`id`, `dim`) should hold, or `None` if it should not be held.
    fn target(&self, dim: Dimension, id: &PolicyId) -> Option<Target> {
        let Some(desired) = self.policies.get(id) else {
            // Pending: what is held stands (see `reconcile_adopted`).
            let held = self.side(dim).held().get(id)?;
            return self.pending.contains(id).then(|| Target {
                program: held.program.clone(),
                cgroups: held.cgroups.clone(),
            });
        };
        let program = desired.programs[dim.index()].clone()?;
        let mut cgroups = self.selected(&desired.policy.target);
        if let (Some(adoption), Some(held)) = (&self.adoption, self.side(dim).held().get(id)) {
            // A binding of a cgroup whose pod is not synced yet: keep it,
            // or the restart would open a gap for that pod.
            cgroups.extend(
                held.cgroups
                    .iter()
                    .filter(|c| !adoption.known_cgroups.contains(c)),
            );
        }
        Some(Target { program, cgroups })
    }

    /// Converges one (policy, dimension) and records its failures.
    fn converge(&mut self, dim: Dimension, id: &PolicyId, phase: Phase) -> Vec<Failure> {
        let target = self.target(dim, id);
        let failures = self.side_mut(dim).converge(id, target.as_ref(), phase);
        self.record(dim, id, phase, &failures);
        failures
    }

    /// Keeps the failures of a convergence for [`failures`](Self::failures).
    /// A full pass replaces what was kept (it tried everything); a partial
    /// pass only adds.
    fn record(&mut self, dim: Dimension, id: &PolicyId, phase: Phase, failures: &[Failure]) {
        let key = (id.clone(), dim);
        if phase == Phase::Full {
            self.failures.remove(&key);
        }
        if !failures.is_empty() {
            self.failures
                .entry(key)
                .or_default()
                .extend(failures.iter().cloned());
        }
    }

    /// The policies a sweep converges: every desired one, and every held
    /// one that should go (before the reconcile: only those deleted since
    /// the restart).
    fn sweep_ids(&self) -> BTreeSet<PolicyId> {
        let mut ids: BTreeSet<PolicyId> = self.policies.keys().cloned().collect();
        match &self.adoption {
            Some(a) => ids.extend(a.deleted.iter().cloned()),
            None => {
                for dim in Dimension::BOTH {
                    ids.extend(self.side(dim).held().keys().cloned());
                }
            }
        }
        ids
    }

    /// Whether (`id`, `dim`) is, or is to become, default deny: what
    /// orders it in a sweep.
    fn default_denies(&self, dim: Dimension, id: &PolicyId) -> bool {
        let wanted = self
            .policies
            .get(id)
            .and_then(|d| d.programs[dim.index()].as_ref());
        let held = self.side(dim).held().get(id).map(|h| &h.program);
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

    /// Converges every policy after a pod event (or the reconcile), in an
    /// order that never refuses, between the state before and the state
    /// after, what neither of them refuses:
    ///
    /// 1. bind cgroups to policies that are not default deny: new allows
    ///    (and new explicit denies, which the end state has too);
    /// 2. unbind cgroups from default-deny policies: fewer refusals;
    /// 3. unbind cgroups from the other policies: what an allow stops
    ///    lifting, a default deny that stays still refuses at the end;
    /// 4. and 5. everything else (binds to default-deny policies, now that
    ///    every allow is in place; programs; removals), default-deny
    ///    policies first so a removed allow goes last.
    fn sync_all(&mut self) -> Vec<Failure> {
        let ids = self.sweep_ids();
        let mut pairs: Vec<(Dimension, PolicyId, bool)> = Vec::new();
        for dim in Dimension::BOTH {
            for id in &ids {
                pairs.push((dim, id.clone(), self.default_denies(dim, id)));
            }
        }
        let plan = [
            (false, Phase::BindOnly),
            (true, Phase::UnbindOnly),
            (false, Phase::UnbindOnly),
            (true, Phase::Full),
            (false, Phase::Full),
        ];
        // Per pair: failures of the partial passes, then of the full one.
        let mut failures: BTreeMap<(Dimension, PolicyId), (Vec<Failure>, Vec<Failure>)> =
            BTreeMap::new();
        for (dd, phase) in plan {
            for (dim, id, _) in pairs.iter().filter(|p| p.2 == dd) {
                let target = self.target(*dim, id);
                let got = self.side_mut(*dim).converge(id, target.as_ref(), phase);
                let (partial, full) = failures.entry((*dim, id.clone())).or_default();
                if phase == Phase::Full {
                    full.extend(got);
                } else {
                    partial.extend(got);
                }
            }
        }
        // The full pass retries what a partial pass failed, so a partial
        // failure only stands if it is still outstanding and the full pass
        // did not report it again.
        let mut all = Vec::new();
        for ((dim, id), (partial, mut full)) in failures {
            let held = self.side(dim).held().get(&id);
            let standing: Vec<Failure> = partial
                .into_iter()
                .filter(|f| {
                    let outstanding = match f.step {
                        Step::Bind(c) => !held.is_some_and(|h| h.cgroups.contains(&c)),
                        Step::Unbind(c) => held.is_some_and(|h| h.cgroups.contains(&c)),
                        _ => true,
                    };
                    outstanding && !full.iter().any(|g| g.step == f.step)
                })
                .collect();
            full.extend(standing);
            self.record(dim, &id, Phase::Full, &full);
            all.extend(full);
        }
        all
    }
}

/// Compiles one `open` or `exec` behavior's lists for `mode`: the program
/// (none when there is nothing to hold) and the values refused. The
/// manager programs exactly this; `kyverno-runtime policy check` prints it.
///
/// Monitor mode parses the values too (their rejections belong on the
/// status either way) but programs [`Program::Observe`], which holds none.
/// Enforce mode with nothing left to enforce programs nothing, so it takes
/// no slot.
pub fn compile_paths(
    mode: Mode,
    lists: Option<&BehaviorLists>,
) -> (Option<Program<AbsPath>>, Vec<Rejection>) {
    let Some(lists) = lists else {
        return (None, Vec::new());
    };
    let mut rejections = Vec::new();
    let mut rules = Rules::default();
    let allow_at = lists.field.field("allow");
    for value in &lists.allow {
        if value == STAR {
            rejections.push(ValueError::new(&allow_at, value, Reason::StarInAllow));
            continue;
        }
        match parse_path(value, &allow_at) {
            Ok(PathTarget::Path(p)) => {
                rules.allow.insert(p);
            }
            // Only "*" parses as Any, and it was handled above.
            Ok(PathTarget::Any) => {}
            Err(e) => rejections.push(e),
        }
    }
    let deny_at = lists.field.field("deny");
    for value in &lists.deny {
        if value == STAR {
            // The default deny; the explicit denies beside it are still
            // programmed, and win over every allow (kyverno_runtime_policy::rule).
            rules.default_deny = true;
            continue;
        }
        match parse_path(value, &deny_at) {
            Ok(PathTarget::Path(p)) => {
                rules.deny.insert(p);
            }
            Ok(PathTarget::Any) => {}
            Err(e) => rejections.push(e),
        }
    }
    let program = match mode {
        Mode::Monitor => Some(Program::observe()),
        Mode::Enforce if rules.allow.is_empty() && rules.deny.is_empty() && !rules.default_deny => {
            None
        }
        Mode::Enforce => Some(Program::Enforce(rules)),
    };
    (program, rejections)
}
