//! An [`Enforcer`] entirely in memory: the reference model of the seam's
//! semantics.
//!
//! The managers' unit tests run against it, and the kernel backends' VM
//! tests replay the same programs and operations against both and compare
//! decisions with [`FakeEnforcer::decide`]. So `decide` is written to be
//! obviously the precedence the seam documents, not to be fast.
//!
//! Beyond the trait it offers what tests need to see and to provoke:
//! [`ops`](FakeEnforcer::ops), the log of every trait call in order;
//! [`fail_next`](FakeEnforcer::fail_next), failure injection per call;
//! [`capacity`](FakeEnforcer::capacity), a policy slot limit; and
//! [`operate`](FakeEnforcer::operate), an operation decided and counted as
//! the kernel would. A clone holds the same state, so a second manager
//! built over a clone of the fake simulates a restart adopting pinned maps.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use kyverno_runtime_compat::{Backend, Behavior};
use kyverno_runtime_policy::rule::Matches;

use crate::seam::{
    CgroupId, Decision, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff,
    Result,
};

/// One of the [`Enforcer`] calls, by name: what [`FakeEnforcer::fail_next`]
/// makes fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// [`Enforcer::add_policy`].
    AddPolicy,
    /// [`Enforcer::update_policy`].
    UpdatePolicy,
    /// [`Enforcer::remove_policy`].
    RemovePolicy,
    /// [`Enforcer::bind`].
    Bind,
    /// [`Enforcer::unbind`].
    Unbind,
    /// [`Enforcer::held`].
    Held,
    /// [`Enforcer::drain`].
    Drain,
}

impl Call {
    /// The method's name.
    pub fn name(self) -> &'static str {
        match self {
            Call::AddPolicy => "add_policy",
            Call::UpdatePolicy => "update_policy",
            Call::RemovePolicy => "remove_policy",
            Call::Bind => "bind",
            Call::Unbind => "unbind",
            Call::Held => "held",
            Call::Drain => "drain",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One logged trait call with its arguments. `behavior` and `backend` are
/// not logged: they are constant getters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeOp<V: Ord> {
    /// `add_policy(policy, program)`.
    Add(PolicyId, Program<V>),
    /// `update_policy(policy, diff)`.
    Update(PolicyId, ProgramDiff<V>),
    /// `remove_policy(policy)`.
    Remove(PolicyId),
    /// `bind(policy, cgroup)`.
    Bind(PolicyId, CgroupId),
    /// `unbind(policy, cgroup)`.
    Unbind(PolicyId, CgroupId),
    /// `held()`.
    Held,
    /// `drain()`.
    Drain,
    /// A call that failed (injected or refused) and changed nothing.
    Failed(Box<FakeOp<V>>),
}

impl<V: Ord> FakeOp<V> {
    /// Which call this is (of the failed call, for [`FakeOp::Failed`]).
    pub fn call(&self) -> Call {
        match self {
            FakeOp::Add(..) => Call::AddPolicy,
            FakeOp::Update(..) => Call::UpdatePolicy,
            FakeOp::Remove(..) => Call::RemovePolicy,
            FakeOp::Bind(..) => Call::Bind,
            FakeOp::Unbind(..) => Call::Unbind,
            FakeOp::Held => Call::Held,
            FakeOp::Drain => Call::Drain,
            FakeOp::Failed(op) => op.call(),
        }
    }

    /// Whether this call changes state when it succeeds (everything but
    /// `held` and `drain`, whose reset is of counters, not of programs).
    pub fn is_mutation(&self) -> bool {
        !matches!(self.call(), Call::Held | Call::Drain)
    }
}

/// The in-memory backend. `V` is both the value a policy entry holds and
/// what an observation reports (the fake sees exactly the value it was
/// asked about; a kernel sees a resolved path).
///
/// Its errors are the ones a kernel backend would give: adding a held
/// policy, or updating an observe one, is a `Kernel` error (`EEXIST`,
/// `EINVAL`); updating or binding an unknown policy is `UnknownPolicy`;
/// adding past the slot limit is `SlotsFull`. Removing an absent policy and
/// (un)binding what is already (un)bound succeed, as the trait promises.
#[derive(Clone, Debug)]
pub struct FakeEnforcer<V: Ord> {
    behavior: Behavior,
    backend: Backend,
    slots: Option<usize>,
    state: BTreeMap<PolicyId, Held<V>>,
    counts: BTreeMap<(CgroupId, V, Decision), u64>,
    // `held` takes `&self` and is logged and injectable like every call, so
    // the log and the injection queue live in cells. A `RefCell` keeps the
    // fake `Send` (the trait's bound) without pretending to be `Sync`.
    ops: RefCell<Vec<FakeOp<V>>>,
    fail: RefCell<VecDeque<Call>>,
}

impl<V: Ord + Clone + fmt::Debug> FakeEnforcer<V> {
    /// An empty fake serving `behavior` as `backend`, with unlimited slots.
    pub fn new(behavior: Behavior, backend: Backend) -> Self {
        Self {
            behavior,
            backend,
            slots: None,
            state: BTreeMap::new(),
            counts: BTreeMap::new(),
            ops: RefCell::new(Vec::new()),
            fail: RefCell::new(VecDeque::new()),
        }
    }

    /// The same fake with room for only `slots` policies, as a kernel's
    /// ARRAY_OF_MAPS has (an add past it fails with `SlotsFull`).
    pub fn capacity(mut self, slots: usize) -> Self {
        self.slots = Some(slots);
        self
    }

    /// Makes the next call of `call` fail with an injected `Kernel` error
    /// and change nothing. Injections queue: two `fail_next(Bind)` fail the
    /// next two binds.
    pub fn fail_next(&mut self, call: Call) {
        self.fail.get_mut().push_back(call);
    }

    /// Every trait call so far, in order.
    pub fn ops(&self) -> Vec<FakeOp<V>> {
        self.ops.borrow().clone()
    }

    /// The calls so far that changed (or tried to change) programs and
    /// bindings: [`ops`](Self::ops) without `held` and `drain`.
    pub fn mutations(&self) -> Vec<FakeOp<V>> {
        self.ops
            .borrow()
            .iter()
            .filter(|op| op.is_mutation())
            .cloned()
            .collect()
    }

    /// Forgets the call log (not the state).
    pub fn clear_ops(&mut self) {
        self.ops.get_mut().clear();
    }

    /// A copy of this fake's state with an empty log and no pending
    /// injections: the pinned maps as the next process finds them.
    pub fn restarted(&self) -> Self {
        Self {
            ops: RefCell::new(Vec::new()),
            fail: RefCell::new(VecDeque::new()),
            ..self.clone()
        }
    }

    /// The state, without logging a call (for assertions).
    pub fn state(&self) -> &BTreeMap<PolicyId, Held<V>> {
        &self.state
    }

    /// The decision for an operation on `value` by `cgroup`, over every
    /// policy bound to the cgroup, by the specification's rule
    /// (`kyverno_runtime_policy::rule::decide`):
    ///
    /// 1. an explicit deny in any bound enforce policy: [`Decision::Denied`];
    /// 2. else an explicit allow in any bound enforce policy:
    ///    [`Decision::Allowed`];
    /// 3. else any bound enforce policy is default deny:
    ///    [`Decision::DefaultDenied`];
    /// 4. else [`Decision::Unmatched`] (allowed).
    ///
    /// Observe policies take no part: they can never refuse. The verdict
    /// does not depend on the order of policies.
    pub fn decide(&self, cgroup: CgroupId, value: &V) -> Decision {
        kyverno_runtime_policy::rule::decide(
            self.state
                .values()
                .filter(|held| held.cgroups.contains(&cgroup))
                .filter_map(|held| match &held.program {
                    Program::Enforce(rules) => Some(Matches {
                        deny: rules.deny.contains(value),
                        allow: rules.allow.contains(value),
                        default_deny: rules.default_deny,
                    }),
                    Program::Observe(_) => None,
                }),
        )
    }

    /// Whether `cgroup` is bound to an observe policy: its every operation
    /// is counted, not only its refusals.
    pub fn observing(&self, cgroup: CgroupId) -> bool {
        self.state
            .values()
            .any(|held| held.program.is_observe() && held.cgroups.contains(&cgroup))
    }

    /// Does an operation as the kernel would: decides it, and counts it for
    /// the next [`drain`](Enforcer::drain) if it was refused or the cgroup
    /// is being observed. Returns the decision.
    pub fn operate(&mut self, cgroup: CgroupId, value: V) -> Decision {
        let decision = self.decide(cgroup, &value);
        if decision.refused() || self.observing(cgroup) {
            *self.counts.entry((cgroup, value, decision)).or_default() += 1;
        }
        decision
    }

    fn log(&self, op: FakeOp<V>) {
        self.ops.borrow_mut().push(op);
    }

    /// Runs one call: fails it if an injection is pending for it, else
    /// applies it; logs it either way.
    fn call<T>(&mut self, op: FakeOp<V>, apply: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let result = match self.take_injection(op.call()) {
            Some(e) => Err(e),
            None => apply(self),
        };
        self.log(if result.is_ok() {
            op
        } else {
            FakeOp::Failed(Box::new(op))
        });
        result
    }

    fn take_injection(&self, call: Call) -> Option<EnforceError> {
        let mut fail = self.fail.borrow_mut();
        let at = fail.iter().position(|c| *c == call)?;
        fail.remove(at);
        Some(self.kernel_error(call, std::io::Error::other("injected failure")))
    }

    fn kernel_error(&self, call: Call, source: std::io::Error) -> EnforceError {
        EnforceError::Kernel {
            behavior: self.behavior.name(),
            op: call.name().to_string(),
            source,
        }
    }

    fn unknown(&self, policy: &PolicyId) -> EnforceError {
        EnforceError::UnknownPolicy(policy.clone(), self.behavior.name())
    }
}

impl<V> Enforcer for FakeEnforcer<V>
where
    V: Ord + Clone + fmt::Debug + Send,
{
    type Value = V;
    type Observed = V;

    fn behavior(&self) -> Behavior {
        self.behavior
    }

    fn backend(&self) -> Backend {
        self.backend
    }

    fn add_policy(&mut self, policy: &PolicyId, program: &Program<V>) -> Result<()> {
        self.call(FakeOp::Add(policy.clone(), program.clone()), |me| {
            if me.state.contains_key(policy) {
                return Err(me.kernel_error(
                    Call::AddPolicy,
                    std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                ));
            }
            if let Some(slots) = me.slots {
                if me.state.len() >= slots {
                    return Err(EnforceError::SlotsFull {
                        behavior: me.behavior.name(),
                        slots,
                        policy: policy.clone(),
                    });
                }
            }
            me.state.insert(
                policy.clone(),
                Held {
                    program: program.clone(),
                    cgroups: BTreeSet::new(),
                },
            );
            Ok(())
        })
    }

    fn update_policy(&mut self, policy: &PolicyId, diff: &ProgramDiff<V>) -> Result<()> {
        self.call(FakeOp::Update(policy.clone(), diff.clone()), |me| {
            let unknown = me.unknown(policy);
            let invalid = me.kernel_error(
                Call::UpdatePolicy,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "an observe policy has no rules to update but the values it names",
                ),
            );
            let held = me.state.get_mut(policy).ok_or(unknown)?;
            let rules = match &mut held.program {
                Program::Enforce(rules) => rules,
                // An observer's values change on the allow side of the
                // diff (`ProgramDiff::between_programs`), and nothing else.
                Program::Observe(watch) => {
                    if !diff.add_deny.is_empty()
                        || !diff.remove_deny.is_empty()
                        || diff.default_deny.is_some()
                    {
                        return Err(invalid);
                    }
                    watch.extend(diff.add_allow.iter().cloned());
                    watch.retain(|v| !diff.remove_allow.contains(v));
                    return Ok(());
                }
            };
            // Adds before removes, as a kernel backend must order them so
            // no lookup falls between the old entry and the new one.
            rules.allow.extend(diff.add_allow.iter().cloned());
            rules.deny.extend(diff.add_deny.iter().cloned());
            if let Some(default_deny) = diff.default_deny {
                rules.default_deny = default_deny;
            }
            rules.allow.retain(|v| !diff.remove_allow.contains(v));
            rules.deny.retain(|v| !diff.remove_deny.contains(v));
            Ok(())
        })
    }

    fn remove_policy(&mut self, policy: &PolicyId) -> Result<()> {
        self.call(FakeOp::Remove(policy.clone()), |me| {
            me.state.remove(policy);
            Ok(())
        })
    }

    fn bind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        self.call(FakeOp::Bind(policy.clone(), cgroup), |me| {
            let unknown = me.unknown(policy);
            me.state
                .get_mut(policy)
                .ok_or(unknown)?
                .cgroups
                .insert(cgroup);
            Ok(())
        })
    }

    fn unbind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        self.call(FakeOp::Unbind(policy.clone(), cgroup), |me| {
            // Unbinding from an absent policy is a no-op: there is no
            // binding left to remove.
            if let Some(held) = me.state.get_mut(policy) {
                held.cgroups.remove(&cgroup);
            }
            Ok(())
        })
    }

    fn held(&self) -> Result<BTreeMap<PolicyId, Held<V>>> {
        let result = match self.take_injection(Call::Held) {
            Some(e) => Err(e),
            None => Ok(self.state.clone()),
        };
        self.log(if result.is_ok() {
            FakeOp::Held
        } else {
            FakeOp::Failed(Box::new(FakeOp::Held))
        });
        result
    }

    fn drain(&mut self) -> Result<Vec<Observation<V>>> {
        self.call(FakeOp::Drain, |me| {
            Ok(std::mem::take(&mut me.counts)
                .into_iter()
                .map(|((cgroup, observed, decision), count)| Observation {
                    cgroup,
                    observed,
                    decision,
                    count,
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::seam::Rules;
    use rstest::rstest;

    type Fake = FakeEnforcer<&'static str>;

    fn fake() -> Fake {
        FakeEnforcer::new(Behavior::Open, Backend::BpfLsm)
    }

    fn id(s: &str) -> PolicyId {
        PolicyId::new(s).unwrap()
    }

    fn enforce(allow: &[&'static str], deny: &[&'static str], dd: bool) -> Program<&'static str> {
        Program::Enforce(Rules {
            allow: allow.iter().copied().collect(),
            deny: deny.iter().copied().collect(),
            default_deny: dd,
        })
    }

    /// Binds cgroup 1 to one policy per program.
    fn bound(programs: &[Program<&'static str>]) -> Fake {
        let mut f = fake();
        for (i, p) in programs.iter().enumerate() {
            let pid = id(&format!("p{i}"));
            f.add_policy(&pid, p).unwrap();
            f.bind(&pid, 1).unwrap();
        }
        f
    }

    #[rstest]
    #[case::nothing_bound(vec![], "/a", Decision::Unmatched)]
    #[case::deny(vec![enforce(&[], &["/a"], false)], "/a", Decision::Denied)]
    #[case::deny_other(vec![enforce(&[], &["/a"], false)], "/b", Decision::Unmatched)]
    #[case::allow(vec![enforce(&["/a"], &[], true)], "/a", Decision::Allowed)]
    #[case::default_deny(vec![enforce(&["/a"], &[], true)], "/b", Decision::DefaultDenied)]
    #[case::allow_without_dd(vec![enforce(&["/a"], &[], false)], "/a", Decision::Allowed)]
    #[case::deny_beats_own_allow(vec![enforce(&["/a"], &["/a"], true)], "/a", Decision::Denied)]
    #[case::other_allow_lifts_dd(vec![enforce(&[], &[], true), enforce(&["/a"], &[], false)], "/a", Decision::Allowed)]
    #[case::other_allow_lifts_dd_reversed(vec![enforce(&["/a"], &[], false), enforce(&[], &[], true)], "/a", Decision::Allowed)]
    #[case::other_deny_beats_allow(vec![enforce(&["/a"], &[], true), enforce(&[], &["/a"], false)], "/a", Decision::Denied)]
    #[case::other_deny_beats_allow_reversed(vec![enforce(&[], &["/a"], false), enforce(&["/a"], &[], true)], "/a", Decision::Denied)]
    #[case::observe_never_refuses(vec![Program::observe()], "/a", Decision::Unmatched)]
    #[case::observe_beside_dd(vec![Program::observe(), enforce(&[], &[], true)], "/a", Decision::DefaultDenied)]
    fn decide_follows_the_precedence(
        #[case] programs: Vec<Program<&'static str>>,
        #[case] value: &'static str,
        #[case] want: Decision,
    ) {
        let f = bound(&programs);
        assert_eq!(f.decide(1, &value), want);
        // Policies bind per cgroup: another cgroup is untouched.
        assert_eq!(f.decide(2, &value), Decision::Unmatched);
    }

    #[test]
    fn counts_refusals_always_and_the_rest_only_when_observed() {
        let mut f = bound(&[enforce(&["/ok"], &[], true)]);
        assert_eq!(f.operate(1, "/ok"), Decision::Allowed);
        assert_eq!(f.operate(1, "/no"), Decision::DefaultDenied);
        assert_eq!(f.operate(1, "/no"), Decision::DefaultDenied);
        let obs = f.drain().unwrap();
        assert_eq!(
            obs,
            [Observation {
                cgroup: 1,
                observed: "/no",
                decision: Decision::DefaultDenied,
                count: 2
            }]
        );
        assert!(f.drain().unwrap().is_empty(), "a drain resets");

        let observe = id("obs");
        f.add_policy(&observe, &Program::observe()).unwrap();
        f.bind(&observe, 1).unwrap();
        f.operate(1, "/ok");
        let obs = f.drain().unwrap();
        assert_eq!(obs.len(), 1);
        assert_eq!(obs[0].decision, Decision::Allowed);
    }

    #[test]
    fn update_applies_a_diff() {
        let mut f = bound(&[enforce(&["/a"], &["/x"], false)]);
        let diff = ProgramDiff::between(
            &Rules {
                allow: ["/a"].into(),
                deny: ["/x"].into(),
                default_deny: false,
            },
            &Rules {
                allow: ["/b"].into(),
                deny: ["/x"].into(),
                default_deny: true,
            },
        );
        f.update_policy(&id("p0"), &diff).unwrap();
        assert_eq!(
            f.state()[&id("p0")].program,
            enforce(&["/b"], &["/x"], true)
        );
    }

    #[test]
    fn refuses_what_a_kernel_would() {
        let mut f = fake().capacity(1);
        f.add_policy(&id("a"), &Program::observe()).unwrap();
        assert!(matches!(
            f.add_policy(&id("a"), &Program::observe()),
            Err(EnforceError::Kernel { .. })
        ));
        assert!(matches!(
            f.add_policy(&id("b"), &Program::observe()),
            Err(EnforceError::SlotsFull { slots: 1, .. })
        ));
        assert!(matches!(
            f.bind(&id("b"), 1),
            Err(EnforceError::UnknownPolicy(..))
        ));
        // An observer has no rules to update: only the values it names.
        let deny =
            ProgramDiff::between_programs(&Program::observe(), &enforce(&[], &["/x"], false));
        assert_eq!(deny, None, "across the observe/enforce line");
        let deny = ProgramDiff {
            add_deny: ["/x"].into(),
            ..ProgramDiff::between(&Rules::default(), &Rules::default())
        };
        assert!(f.update_policy(&id("a"), &deny).is_err());
        let named =
            ProgramDiff::between_programs(&Program::observe(), &Program::Observe(["/y"].into()))
                .unwrap();
        f.update_policy(&id("a"), &named).unwrap();
        assert_eq!(f.state()[&id("a")].program, Program::Observe(["/y"].into()));
        // Idempotent removals succeed.
        f.unbind(&id("a"), 9).unwrap();
        f.unbind(&id("zzz"), 9).unwrap();
        f.remove_policy(&id("zzz")).unwrap();
    }

    #[test]
    fn injected_failures_change_nothing_and_are_logged() {
        let mut f = fake();
        f.fail_next(Call::AddPolicy);
        f.fail_next(Call::Held);
        assert!(f.add_policy(&id("a"), &Program::observe()).is_err());
        assert!(f.state().is_empty());
        assert!(f.held().is_err());
        f.add_policy(&id("a"), &Program::observe()).unwrap();
        assert_eq!(f.held().unwrap().len(), 1);
        assert_eq!(
            f.ops(),
            [
                FakeOp::Failed(Box::new(FakeOp::Add(id("a"), Program::observe()))),
                FakeOp::Failed(Box::new(FakeOp::Held)),
                FakeOp::Add(id("a"), Program::observe()),
                FakeOp::Held,
            ]
        );
        assert_eq!(f.mutations().len(), 2);
    }

    #[test]
    fn restarted_keeps_state_and_forgets_the_log() {
        let f = bound(&[enforce(&[], &["/x"], false)]);
        let g = f.restarted();
        assert!(g.ops().is_empty());
        assert_eq!(g.held().unwrap(), f.held().unwrap());
        assert_eq!(g.decide(1, &"/x"), Decision::Denied);
    }
}
