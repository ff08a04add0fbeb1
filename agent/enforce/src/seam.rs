//! The enforcement seam: one trait between the managers, which know
//! policies and pods, and the backends, which know programs and maps.
//!
//! An [`Enforcer`] serves one behavior (open, exec, network, ...) with one
//! backend chosen by `compat`'s plan. Its contract is policy-level, so the
//! union semantics of the specification are the backend's promise and are
//! tested once, against the reference model in [`crate::fake`]:
//!
//! - a policy holds a [`Program`]: enforce (allow and deny lists and a
//!   default-deny flag) or observe (nothing that can change a verdict);
//! - a policy is *bound* to the cgroups of the pods it selects;
//! - for an operation of a cgroup, the verdict over every policy bound to
//!   it is, in this precedence: an explicit deny of any policy ([`Decision::Denied`]),
//!   else an explicit allow of any policy ([`Decision::Allowed`]), else the
//!   default deny of any policy ([`Decision::DefaultDenied`]), else allowed
//!   ([`Decision::Unmatched`]). Separate policies therefore union: one
//!   policy's allow lifts another's default deny, and an explicit deny
//!   anywhere beats every allow.
//!
//! Changes are diffs ([`ProgramDiff`]) so a backend can apply an update
//! without a window in which the old entries are gone and the new ones are
//! not yet there.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kyverno_runtime_compat::{Backend, Behavior};

/// A container cgroup, by its cgroup v2 id (the directory's inode number,
/// what `bpf_get_current_cgroup_id` returns).
pub type CgroupId = u64;

/// Longest [`PolicyId`] a backend must be able to hold, in bytes. A policy
/// UID is 36.
pub const MAX_POLICY_ID_LEN: usize = 63;

/// Identifies one RuntimePolicy to the backends: its UID, which survives
/// renames and is unique across deletes and re-creates.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(String);

impl PolicyId {
    /// A policy id; refused when empty, longer than [`MAX_POLICY_ID_LEN`]
    /// bytes or holding a NUL (a kernel slot stores it NUL-padded).
    pub fn new(id: impl Into<String>) -> Result<Self, EnforceError> {
        let id = id.into();
        if id.is_empty() || id.len() > MAX_POLICY_ID_LEN || id.contains('\0') {
            return Err(EnforceError::BadPolicyId(id));
        }
        Ok(Self(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What one policy asks of one behavior's backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Program<V: Ord> {
    /// Enforce: the kernel refuses what the lists and the flag say.
    Enforce(Rules<V>),
    /// Monitor: the bound cgroups' operations are counted per value and
    /// decision, and nothing this policy says can refuse one. The set
    /// holds the values the kernel must be told of to name what it counts
    /// (the network backend's domains, whose DNS answers it learns);
    /// empty for every other backend.
    Observe(BTreeSet<V>),
}

impl<V: Ord> Program<V> {
    /// An observe program that needs no value named.
    pub fn observe() -> Self {
        Program::Observe(BTreeSet::new())
    }

    /// Whether this program is on the observe side of the line a mode
    /// change must rebuild across.
    pub fn is_observe(&self) -> bool {
        matches!(self, Program::Observe(_))
    }
}

/// An enforce program's lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules<V: Ord> {
    /// Values allowed explicitly (lifting any policy's default deny).
    pub allow: BTreeSet<V>,
    /// Values denied explicitly (beating any policy's allow).
    pub deny: BTreeSet<V>,
    /// Deny what no policy allows (the `"*"` deny sentinel).
    pub default_deny: bool,
}

impl<V: Ord> Default for Rules<V> {
    fn default() -> Self {
        Self {
            allow: BTreeSet::new(),
            deny: BTreeSet::new(),
            default_deny: false,
        }
    }
}

/// The change from one enforce program to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramDiff<V: Ord> {
    /// Allow entries to add.
    pub add_allow: BTreeSet<V>,
    /// Allow entries to remove.
    pub remove_allow: BTreeSet<V>,
    /// Deny entries to add.
    pub add_deny: BTreeSet<V>,
    /// Deny entries to remove.
    pub remove_deny: BTreeSet<V>,
    /// The new default-deny flag, when it changes.
    pub default_deny: Option<bool>,
}

impl<V: Ord + Clone> ProgramDiff<V> {
    /// What turns `from` into `to`.
    pub fn between(from: &Rules<V>, to: &Rules<V>) -> Self {
        Self {
            add_allow: to.allow.difference(&from.allow).cloned().collect(),
            remove_allow: from.allow.difference(&to.allow).cloned().collect(),
            add_deny: to.deny.difference(&from.deny).cloned().collect(),
            remove_deny: from.deny.difference(&to.deny).cloned().collect(),
            default_deny: (from.default_deny != to.default_deny).then_some(to.default_deny),
        }
    }

    /// What turns program `from` into `to` on the same side of the
    /// observe/enforce line: an enforce program's lists, or an observer's
    /// values as the allow side. `None` across the line (a rebuild).
    pub fn between_programs(from: &Program<V>, to: &Program<V>) -> Option<Self> {
        match (from, to) {
            (Program::Enforce(from), Program::Enforce(to)) => Some(Self::between(from, to)),
            (Program::Observe(from), Program::Observe(to)) => Some(Self {
                add_allow: to.difference(from).cloned().collect(),
                remove_allow: from.difference(to).cloned().collect(),
                add_deny: BTreeSet::new(),
                remove_deny: BTreeSet::new(),
                default_deny: None,
            }),
            _ => None,
        }
    }

    /// Whether applying the diff changes nothing.
    pub fn is_empty(&self) -> bool {
        self.add_allow.is_empty()
            && self.remove_allow.is_empty()
            && self.add_deny.is_empty()
            && self.remove_deny.is_empty()
            && self.default_deny.is_none()
    }
}

/// The kernel's decision for one operation, merged over every policy bound
/// to the operation's cgroup: the specification's rule, defined once in
/// `kyverno_runtime_policy::rule`.
pub use kyverno_runtime_policy::rule::Decision;

/// Operations one cgroup did since the last drain, with one value and one
/// decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation<O> {
    /// The cgroup that did them.
    pub cgroup: CgroupId,
    /// What was operated on, as the kernel saw it (a path the kernel
    /// resolved, an address, ...).
    pub observed: O,
    /// The kernel's decision.
    pub decision: Decision,
    /// How many times.
    pub count: u64,
}

/// What a backend holds for one policy: its program and its bound
/// cgroups. After a restart, [`Enforcer::held`] reports what the previous
/// process left in pinned maps, and the manager reconciles it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held<V: Ord> {
    /// The program the kernel holds.
    pub program: Program<V>,
    /// The cgroups bound to it.
    pub cgroups: BTreeSet<CgroupId>,
}

/// Why a backend refused a change.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    /// The policy id cannot be held (see [`PolicyId::new`]).
    #[error("policy id {0:?} is empty, longer than {MAX_POLICY_ID_LEN} bytes or holds a NUL")]
    BadPolicyId(String),
    /// Every policy slot of this behavior is taken.
    #[error("{behavior}: all {slots} policy slots are in use; policy {policy} is not enforced")]
    SlotsFull {
        /// The behavior.
        behavior: &'static str,
        /// How many slots the backend has.
        slots: usize,
        /// The policy refused.
        policy: PolicyId,
    },
    /// A change named a policy the backend does not hold.
    #[error("{behavior}: no policy {0} is programmed", behavior = .1)]
    UnknownPolicy(PolicyId, &'static str),
    /// A map cannot hold another entry.
    #[error("{behavior}: map {map} is full ({capacity} entries)")]
    MapFull {
        /// The behavior.
        behavior: &'static str,
        /// The map.
        map: &'static str,
        /// Its capacity.
        capacity: u32,
    },
    /// The kernel refused an operation.
    #[error("{behavior}: {op}: {source}")]
    Kernel {
        /// The behavior.
        behavior: &'static str,
        /// What was being done.
        op: String,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel state left by an earlier process cannot be read back.
    #[error("{behavior}: cannot adopt pinned state: {reason}")]
    Adopt {
        /// The behavior.
        behavior: &'static str,
        /// Why.
        reason: String,
    },
}

/// Result of the enforcement seam.
pub type Result<T, E = EnforceError> = std::result::Result<T, E>;

/// One behavior's kernel backend, driven by a manager.
///
/// Every method is idempotent where it can be (binding a bound cgroup, or
/// removing an absent policy, is not an error), so a manager that retries
/// after a partial failure converges.
pub trait Enforcer: Send {
    /// The value one policy entry holds (a path, a prefix, a protocol).
    type Value: Ord + Clone + fmt::Debug;
    /// What an observation reports the kernel saw.
    type Observed: Clone + fmt::Debug;

    /// The behavior served.
    fn behavior(&self) -> Behavior;

    /// The backend serving it (for status and logs).
    fn backend(&self) -> Backend;

    /// Adds a policy with its program. It affects nothing until cgroups
    /// are bound to it. Adding a policy already held is an error: crossing
    /// the observe/enforce line is a remove and an add.
    fn add_policy(&mut self, policy: &PolicyId, program: &Program<Self::Value>) -> Result<()>;

    /// Applies a diff to an enforce policy's rules.
    fn update_policy(&mut self, policy: &PolicyId, diff: &ProgramDiff<Self::Value>) -> Result<()>;

    /// Removes a policy and every binding of it. Absent: no-op.
    fn remove_policy(&mut self, policy: &PolicyId) -> Result<()>;

    /// Binds a cgroup to a policy: the policy now decides for it.
    fn bind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()>;

    /// Unbinds a cgroup from a policy. Unbound: no-op.
    fn unbind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()>;

    /// What the backend holds now, per policy (after a restart: what the
    /// previous process left).
    fn held(&self) -> Result<BTreeMap<PolicyId, Held<Self::Value>>>;

    /// Takes the observations counted since the last drain (read and
    /// reset). Refusals are counted whatever the mode; everything else
    /// only for cgroups bound to an observe policy.
    fn drain(&mut self) -> Result<Vec<Observation<Self::Observed>>>;
}

/// After a failed update of `id`: takes the program `backend` records for
/// it into `held`, the manager's copy, so the next diff starts from what
/// the kernel holds (a failure part way may have written some of a diff;
/// the kernel backends record each write as it lands). A record that
/// cannot be read is logged and the copy left as it was.
pub fn read_back<E: Enforcer>(
    backend: &E,
    id: &PolicyId,
    held: &mut BTreeMap<PolicyId, Held<E::Value>>,
) {
    match backend.held() {
        Ok(mut all) => {
            if let (Some(h), Some(recorded)) = (held.get_mut(id), all.remove(id)) {
                h.program = recorded.program;
            }
        }
        Err(e) => {
            tracing::warn!(policy = %id, behavior = backend.behavior().name(), error = %e, "reading back a failed update failed")
        }
    }
}
