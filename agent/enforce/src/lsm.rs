//! The kernel backends for open and exec: BPF-LSM and fmod_ret, over the
//! one object of `kyverno_runtime_bpf::openexec`.
//!
//! [`load`] attaches the object and returns one [`Enforcer`] per
//! dimension ([`LsmEnforcer`]); both drive the same maps through a shared
//! slot table. A policy takes a slot when it is added; its program is bits
//! in the path rules and masks (see the bpf crate's model), its bindings
//! bits in the cgroup entries.
//!
//! # Ordering
//!
//! Every change is ordered so that, while it is applied, the kernel is
//! never looser than either the state before or the state after it:
//!
//! - add: the slot's rules and flags are written while no cgroup is bound,
//!   so they take effect at the first [`Enforcer::bind`];
//! - update: new denies, removed allows and a new default deny first; new
//!   allows, a dropped default deny and removed denies last;
//! - remove: every binding is revoked first, then the rules go.
//!
//! # Restarts
//!
//! With a pin directory the maps outlive the process; a new [`load`]
//! adopts them and rebuilds its slot table from them
//! ([`Enforcer::held`]), so the manager can reconcile with no moment in
//! which the previous policies are not enforced.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kyverno_runtime_bpf::openexec::{
    self, CgroupSlots, Dimension, Hooks, OpenExec, OpenExecError, PathRule, SlotMasks, SLOTS,
};
use kyverno_runtime_compat::{Backend, Behavior};
use kyverno_runtime_policy::values::AbsPath;

use crate::seam::{
    CgroupId, Decision, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff,
    Result, Rules,
};

/// One occupied slot.
#[derive(Debug, Clone)]
struct Slot {
    policy: PolicyId,
    program: Program<AbsPath>,
    cgroups: BTreeSet<CgroupId>,
}

#[derive(Debug)]
struct Shared {
    object: OpenExec,
    slots: [Vec<Option<Slot>>; 2],
    /// What `oe_cgroups` holds (both dimensions share an entry).
    cgroups: BTreeMap<CgroupId, CgroupSlots>,
    masks: SlotMasks,
    /// How many non-empty path rules (both dimensions) end in each name;
    /// `oe_names` holds exactly the names counted here.
    names: BTreeMap<[u8; openexec::NAME_KEY_LEN], u32>,
    /// Observations of the other dimension taken by a drain.
    pending: [Vec<Observation<String>>; 2],
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // The state is a cache of the kernel's: usable after a panic elsewhere.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An open or exec enforcer on the kernel.
#[derive(Debug)]
pub struct LsmEnforcer {
    shared: Arc<Mutex<Shared>>,
    dim: Dimension,
    backend: Backend,
}

/// Loads and attaches the open/exec object for `hooks` (pinned under
/// `pin_dir`, adopting what is pinned there) and returns the open and the
/// exec enforcer.
pub fn load(hooks: Hooks, pin_dir: Option<&Path>) -> Result<(LsmEnforcer, LsmEnforcer)> {
    let object = OpenExec::load(hooks, pin_dir).map_err(|e| kernel("load", e))?;
    over(object, hooks)
}

/// [`load`] without pins, with room for only `paths` path entries (see
/// [`OpenExec::load_with_path_capacity`]): for tests that fill a map on
/// purpose.
pub fn load_with_path_capacity(hooks: Hooks, paths: u32) -> Result<(LsmEnforcer, LsmEnforcer)> {
    let object = OpenExec::load_with_path_capacity(hooks, paths).map_err(|e| kernel("load", e))?;
    over(object, hooks)
}

/// The two enforcers over a loaded object, adopting what it holds.
fn over(object: OpenExec, hooks: Hooks) -> Result<(LsmEnforcer, LsmEnforcer)> {
    let mut shared = Shared {
        object,
        slots: [vec![None; SLOTS], vec![None; SLOTS]],
        cgroups: BTreeMap::new(),
        masks: SlotMasks::default(),
        names: BTreeMap::new(),
        pending: [Vec::new(), Vec::new()],
    };
    if shared.object.adopted() {
        shared.adopt()?;
    }
    let backend = match hooks {
        Hooks::BpfLsm => Backend::BpfLsm,
        Hooks::FmodRet => Backend::FmodRet,
    };
    let shared = Arc::new(Mutex::new(shared));
    Ok((
        LsmEnforcer {
            shared: Arc::clone(&shared),
            dim: Dimension::Open,
            backend,
        },
        LsmEnforcer {
            shared,
            dim: Dimension::Exec,
            backend,
        },
    ))
}

impl LsmEnforcer {
    /// The program outcome counters (shared by both dimensions).
    pub fn stats(&self) -> Result<openexec::OpenExecStats> {
        lock(&self.shared)
            .object
            .stats()
            .map_err(|e| kernel("stats", e))
    }

    /// The kernel's run-time statistics of the attached programs.
    pub fn run_stats(&self) -> Result<Vec<openexec::ProgramRunStats>> {
        lock(&self.shared)
            .object
            .run_stats()
            .map_err(|e| kernel("run stats", e))
    }

    /// Sets how many per-occurrence refusal records each cgroup may send
    /// per second (0: none; refusals are then only counted).
    pub fn set_denial_rate(&self, per_second: u32) -> Result<()> {
        lock(&self.shared)
            .object
            .set_denial_rate(per_second)
            .map_err(|e| kernel("set denial rate", e))
    }

    /// Turns the pod directory fallback on or off (see
    /// [`openexec::OpenExec::set_pod_fallback`]).
    pub fn set_pod_fallback(&self, on: bool) -> Result<()> {
        lock(&self.shared)
            .object
            .set_pod_fallback(on)
            .map_err(|e| kernel("set pod fallback", e))
    }

    /// Exempts a pod's sandbox cgroup from the pod directory fallback (see
    /// [`openexec::OpenExec::set_pod_exempt`]).
    pub fn set_pod_exempt(&self, cgroup: u64, exempt: bool) -> Result<()> {
        lock(&self.shared)
            .object
            .set_pod_exempt(cgroup, exempt)
            .map_err(|e| kernel("set pod exempt", e))
    }

    /// Whether the pod directory fallback is on, and how many decisions it
    /// has taken since the programs were loaded.
    pub fn pod_fallback(&self) -> Result<(bool, u64)> {
        lock(&self.shared)
            .object
            .pod_fallback()
            .map_err(|e| kernel("pod fallback", e))
    }

    /// The map through which the exec programs hand the exec tracer the
    /// paths they resolved (a new descriptor of it).
    pub fn exec_resolved_map(&self) -> Result<kyverno_runtime_bpf::MapHandle> {
        lock(&self.shared)
            .object
            .exec_resolved_map()
            .map_err(|e| kernel("exec resolved map", e))
    }

    /// A reader of the per-occurrence refusal records (both dimensions
    /// share one ring buffer).
    pub fn denial_reader(
        &self,
    ) -> Result<kyverno_runtime_bpf::ring::RecordReader<openexec::Denial>> {
        lock(&self.shared)
            .object
            .denial_reader()
            .map_err(|e| kernel("denial reader", e))
    }

    fn behavior_name(&self) -> &'static str {
        self.dim.name()
    }
}

fn kernel(op: &str, e: OpenExecError) -> EnforceError {
    match e {
        OpenExecError::Load {
            ref verifier_log, ..
        } => {
            let why = verifier_log
                .as_deref()
                .and_then(kyverno_runtime_bpf::verifier_reason)
                .map(|r| format!(": verifier: {r}"))
                .unwrap_or_default();
            EnforceError::Kernel {
                behavior: "open/exec",
                op: op.to_owned(),
                source: std::io::Error::other(format!("{e}{why}")),
            }
        }
        OpenExecError::MapFull { map, max_entries } => EnforceError::MapFull {
            behavior: "open/exec",
            map,
            capacity: max_entries,
        },
        other => EnforceError::Kernel {
            behavior: "open/exec",
            op: op.to_owned(),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

fn bit(slot: usize) -> u64 {
    1u64 << slot
}

impl Shared {
    /// Rebuilds the slot table from adopted maps. Bits of a slot nobody
    /// owns, path bits of an observe slot, and path entries that are not a
    /// path a policy could hold, are cleared here: nothing could reconcile
    /// them later.
    fn adopt(&mut self) -> Result<()> {
        let adopt_err = |reason: String| EnforceError::Adopt {
            behavior: "open/exec",
            reason,
        };
        self.masks = self.object.masks().map_err(|e| adopt_err(e.to_string()))?;
        for dim in Dimension::ALL {
            let d = dim.index();
            for slot in 0..SLOTS {
                let owner = self
                    .object
                    .owner(dim, slot)
                    .map_err(|e| adopt_err(e.to_string()))?;
                let policy = owner
                    .and_then(|id| String::from_utf8(id).ok())
                    .and_then(|id| PolicyId::new(id).ok());
                self.slots[d][slot] = policy.map(|policy| Slot {
                    policy,
                    program: if self.masks.observe[d] & bit(slot) != 0 {
                        Program::observe()
                    } else {
                        Program::Enforce(Rules {
                            default_deny: self.masks.default_deny[d] & bit(slot) != 0,
                            ..Rules::default()
                        })
                    },
                    cgroups: BTreeSet::new(),
                });
            }
            let live = self.live_mask(dim);
            self.masks.default_deny[d] &= live;
            self.masks.observe[d] &= live;
            // An observe slot holds no paths: a bit of one is left over
            // (an interrupted change) and recorded nowhere, so a policy
            // taking the slot later would inherit it. Cleared here.
            let holds_paths = live & !self.masks.observe[d];
            for (key, rule) in self
                .object
                .rules(dim)
                .map_err(|e| adopt_err(e.to_string()))?
            {
                let path = key
                    .iter()
                    .position(|b| *b == 0)
                    .and_then(|end| std::str::from_utf8(&key[..end]).ok())
                    .and_then(|p| AbsPath::parse(p).ok());
                let kept = match &path {
                    Some(_) => PathRule {
                        deny: rule.deny & holds_paths,
                        allow: rule.allow & holds_paths,
                    },
                    None => PathRule::default(),
                };
                if kept != rule {
                    self.object
                        .set_rule(dim, &key, kept)
                        .map_err(|e| adopt_err(e.to_string()))?;
                }
                if !kept.is_empty() {
                    if let Some(name) = openexec::name_key(&key) {
                        *self.names.entry(name).or_insert(0) += 1;
                    }
                }
                let Some(path) = path else { continue };
                for slot in 0..SLOTS {
                    if let Some(Slot {
                        program: Program::Enforce(rules),
                        ..
                    }) = &mut self.slots[d][slot]
                    {
                        if kept.deny & bit(slot) != 0 {
                            rules.deny.insert(path.clone());
                        }
                        if kept.allow & bit(slot) != 0 {
                            rules.allow.insert(path.clone());
                        }
                    }
                }
            }
        }
        self.object
            .set_masks(&self.masks)
            .map_err(|e| adopt_err(e.to_string()))?;
        // oe_names: exactly the names of the rules kept. Missing ones go in
        // (a rule without its name would be skipped), stale ones out.
        let held: BTreeSet<_> = self
            .object
            .names()
            .map_err(|e| adopt_err(e.to_string()))?
            .into_iter()
            .collect();
        for name in self.names.keys().filter(|n| !held.contains(*n)) {
            self.object
                .set_name(name, true)
                .map_err(|e| adopt_err(e.to_string()))?;
        }
        for name in held.iter().filter(|n| !self.names.contains_key(*n)) {
            self.object
                .set_name(name, false)
                .map_err(|e| adopt_err(e.to_string()))?;
        }
        for (cgroup, slots) in self
            .object
            .cgroups()
            .map_err(|e| adopt_err(e.to_string()))?
        {
            let mut kept = slots;
            for dim in Dimension::ALL {
                kept.set(dim, slots.get(dim) & self.live_mask(dim));
                for slot in 0..SLOTS {
                    if let Some(s) = &mut self.slots[dim.index()][slot] {
                        if kept.get(dim) & bit(slot) != 0 {
                            s.cgroups.insert(cgroup);
                        }
                    }
                }
            }
            if kept != slots {
                self.object
                    .set_cgroup(cgroup, kept)
                    .map_err(|e| adopt_err(e.to_string()))?;
            }
            if !kept.is_empty() {
                self.cgroups.insert(cgroup, kept);
            }
        }
        Ok(())
    }

    fn live_mask(&self, dim: Dimension) -> u64 {
        self.slots[dim.index()]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .fold(0, |m, (i, _)| m | bit(i))
    }

    fn slot_of(&self, dim: Dimension, policy: &PolicyId) -> Option<usize> {
        self.slots[dim.index()]
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| &s.policy == policy))
    }

    /// Sets or clears `slot`'s bit in the rule of every path in `paths`.
    fn set_bits<'a>(
        &mut self,
        dim: Dimension,
        slot: usize,
        paths: impl IntoIterator<Item = &'a AbsPath>,
        deny: bool,
        on: bool,
    ) -> Result<()> {
        for path in paths {
            let key = path.kernel_key();
            let old = self
                .object
                .rule(dim, &key)
                .map_err(|e| kernel("read rule", e))?;
            let mut rule = old;
            let field = if deny {
                &mut rule.deny
            } else {
                &mut rule.allow
            };
            if on {
                *field |= bit(slot);
            } else {
                *field &= !bit(slot);
            }
            let name = openexec::name_key(&key);
            // A rule never exists without its name in oe_names (the
            // program would skip it): the name goes in first, out last.
            if old.is_empty() && !rule.is_empty() {
                if let Some(name) = name {
                    self.name_ref(name, true)?;
                }
            }
            self.object
                .set_rule(dim, &key, rule)
                .map_err(|e| kernel("write rule", e))?;
            // The slot's record follows the kernel path by path, so a
            // failure part way leaves a record of exactly what was
            // written: the next diff starts from it.
            if let Some(Slot {
                program: Program::Enforce(rules),
                ..
            }) = &mut self.slots[dim.index()][slot]
            {
                let list = if deny {
                    &mut rules.deny
                } else {
                    &mut rules.allow
                };
                if on {
                    list.insert(path.clone());
                } else {
                    list.remove(path);
                }
            }
            if !old.is_empty() && rule.is_empty() {
                if let Some(name) = name {
                    self.name_ref(name, false)?;
                }
            }
        }
        Ok(())
    }

    /// Counts a rule in or out of its name, writing `oe_names` when the
    /// count leaves or reaches zero.
    fn name_ref(&mut self, name: [u8; openexec::NAME_KEY_LEN], add: bool) -> Result<()> {
        let count = self.names.get(&name).copied().unwrap_or(0);
        let next = if add {
            count + 1
        } else {
            count.saturating_sub(1)
        };
        if (count == 0) != (next == 0) {
            self.object
                .set_name(&name, next > 0)
                .map_err(|e| kernel("write name", e))?;
        }
        if next == 0 {
            self.names.remove(&name);
        } else {
            self.names.insert(name, next);
        }
        Ok(())
    }

    fn set_mask_bit(
        &mut self,
        dim: Dimension,
        slot: usize,
        default_deny: bool,
        on: bool,
    ) -> Result<()> {
        let d = dim.index();
        let mut masks = self.masks;
        let field = if default_deny {
            &mut masks.default_deny[d]
        } else {
            &mut masks.observe[d]
        };
        if on {
            *field |= bit(slot);
        } else {
            *field &= !bit(slot);
        }
        self.object
            .set_masks(&masks)
            .map_err(|e| kernel("write flags", e))?;
        self.masks = masks;
        if let (
            true,
            Some(Slot {
                program: Program::Enforce(rules),
                ..
            }),
        ) = (default_deny, &mut self.slots[dim.index()][slot])
        {
            rules.default_deny = on;
        }
        Ok(())
    }

    fn set_cgroup_bit(
        &mut self,
        dim: Dimension,
        slot: usize,
        cgroup: CgroupId,
        on: bool,
    ) -> Result<()> {
        let mut slots = self.cgroups.get(&cgroup).copied().unwrap_or_default();
        let mask = slots.get(dim);
        slots.set(
            dim,
            if on {
                mask | bit(slot)
            } else {
                mask & !bit(slot)
            },
        );
        self.object
            .set_cgroup(cgroup, slots)
            .map_err(|e| kernel("write cgroup", e))?;
        if slots.is_empty() {
            self.cgroups.remove(&cgroup);
        } else {
            self.cgroups.insert(cgroup, slots);
        }
        Ok(())
    }

    /// Clears everything a slot holds in the kernel, bindings first.
    fn clear_slot(&mut self, dim: Dimension, slot: usize) -> Result<()> {
        let Some(state) = self.slots[dim.index()][slot].clone() else {
            return Ok(());
        };
        for cgroup in &state.cgroups {
            self.set_cgroup_bit(dim, slot, *cgroup, false)?;
        }
        if let Some(s) = &mut self.slots[dim.index()][slot] {
            s.cgroups.clear();
        }
        match &state.program {
            Program::Enforce(rules) => {
                self.set_mask_bit(dim, slot, true, false)?;
                self.set_bits(dim, slot, &rules.allow, false, false)?;
                self.set_bits(dim, slot, &rules.deny, true, false)?;
            }
            Program::Observe(_) => self.set_mask_bit(dim, slot, false, false)?,
        }
        self.object
            .set_owner(dim, slot, None)
            .map_err(|e| kernel("free slot", e))?;
        self.slots[dim.index()][slot] = None;
        Ok(())
    }

    fn drain(&mut self, dim: Dimension) -> Result<Vec<Observation<String>>> {
        let raw = self
            .object
            .drain_observations()
            .map_err(|e| kernel("drain observations", e))?;
        for o in raw {
            let decision = match o.decision {
                openexec::Decision::Denied => Decision::Denied,
                openexec::Decision::Allowed => Decision::Allowed,
                openexec::Decision::DefaultDenied => Decision::DefaultDenied,
                openexec::Decision::Unmatched => Decision::Unmatched,
            };
            self.pending[o.dimension.index()].push(Observation {
                cgroup: o.cgroup,
                observed: String::from_utf8_lossy(&o.path).into_owned(),
                decision,
                count: o.count,
            });
        }
        Ok(std::mem::take(&mut self.pending[dim.index()]))
    }
}

impl Enforcer for LsmEnforcer {
    type Value = AbsPath;
    type Observed = String;

    fn behavior(&self) -> Behavior {
        match self.dim {
            Dimension::Open => Behavior::Open,
            Dimension::Exec => Behavior::Exec,
        }
    }

    fn backend(&self) -> Backend {
        self.backend
    }

    fn add_policy(&mut self, policy: &PolicyId, program: &Program<AbsPath>) -> Result<()> {
        let dim = self.dim;
        let mut shared = lock(&self.shared);
        if shared.slot_of(dim, policy).is_some() {
            return Err(EnforceError::Adopt {
                behavior: self.behavior_name(),
                reason: format!("policy {policy} is already programmed (remove it first)"),
            });
        }
        let Some(slot) = shared.slots[dim.index()].iter().position(Option::is_none) else {
            return Err(EnforceError::SlotsFull {
                behavior: self.behavior_name(),
                slots: SLOTS,
                policy: policy.clone(),
            });
        };
        shared
            .object
            .set_owner(dim, slot, Some(policy.as_str().as_bytes()))
            .map_err(|e| kernel("take slot", e))?;
        // The slot is recorded before its bits, so a failure half way can
        // be undone by clear_slot (which clears whatever the program says).
        shared.slots[dim.index()][slot] = Some(Slot {
            policy: policy.clone(),
            program: program.clone(),
            cgroups: BTreeSet::new(),
        });
        let written = match program {
            Program::Enforce(rules) => shared
                .set_bits(dim, slot, &rules.deny, true, true)
                .and_then(|()| shared.set_bits(dim, slot, &rules.allow, false, true))
                .and_then(|()| {
                    if rules.default_deny {
                        shared.set_mask_bit(dim, slot, true, true)
                    } else {
                        Ok(())
                    }
                }),
            Program::Observe(_) => shared.set_mask_bit(dim, slot, false, true),
        };
        if let Err(e) = written {
            // Best effort: the error that matters is the first one.
            let _ = shared.clear_slot(dim, slot);
            return Err(e);
        }
        Ok(())
    }

    fn update_policy(&mut self, policy: &PolicyId, diff: &ProgramDiff<AbsPath>) -> Result<()> {
        let dim = self.dim;
        let mut shared = lock(&self.shared);
        let slot = shared
            .slot_of(dim, policy)
            .ok_or_else(|| EnforceError::UnknownPolicy(policy.clone(), self.behavior_name()))?;
        if diff.is_empty() {
            return Ok(());
        }
        // Tightening first, loosening last (see the module docs).
        shared.set_bits(dim, slot, &diff.add_deny, true, true)?;
        shared.set_bits(dim, slot, &diff.remove_allow, false, false)?;
        if diff.default_deny == Some(true) {
            shared.set_mask_bit(dim, slot, true, true)?;
        }
        shared.set_bits(dim, slot, &diff.add_allow, false, true)?;
        if diff.default_deny == Some(false) {
            shared.set_mask_bit(dim, slot, true, false)?;
        }
        // Each step recorded the slot's program as it went (set_bits,
        // set_mask_bit): a failure above leaves it saying what the kernel
        // holds.
        shared.set_bits(dim, slot, &diff.remove_deny, true, false)?;
        Ok(())
    }

    fn remove_policy(&mut self, policy: &PolicyId) -> Result<()> {
        let dim = self.dim;
        let mut shared = lock(&self.shared);
        match shared.slot_of(dim, policy) {
            Some(slot) => shared.clear_slot(dim, slot),
            None => Ok(()),
        }
    }

    fn bind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        let dim = self.dim;
        let mut shared = lock(&self.shared);
        let slot = shared
            .slot_of(dim, policy)
            .ok_or_else(|| EnforceError::UnknownPolicy(policy.clone(), self.behavior_name()))?;
        shared.set_cgroup_bit(dim, slot, cgroup, true)?;
        if let Some(s) = &mut shared.slots[dim.index()][slot] {
            s.cgroups.insert(cgroup);
        }
        Ok(())
    }

    fn unbind(&mut self, policy: &PolicyId, cgroup: CgroupId) -> Result<()> {
        let dim = self.dim;
        let mut shared = lock(&self.shared);
        let Some(slot) = shared.slot_of(dim, policy) else {
            return Ok(());
        };
        shared.set_cgroup_bit(dim, slot, cgroup, false)?;
        if let Some(s) = &mut shared.slots[dim.index()][slot] {
            s.cgroups.remove(&cgroup);
        }
        Ok(())
    }

    fn held(&self) -> Result<BTreeMap<PolicyId, Held<AbsPath>>> {
        let shared = lock(&self.shared);
        Ok(shared.slots[self.dim.index()]
            .iter()
            .flatten()
            .map(|s| {
                (
                    s.policy.clone(),
                    Held {
                        program: s.program.clone(),
                        cgroups: s.cgroups.clone(),
                    },
                )
            })
            .collect())
    }

    fn drain(&mut self) -> Result<Vec<Observation<String>>> {
        lock(&self.shared).drain(self.dim)
    }
}

/// What [`load_planned`] attached.
#[derive(Debug)]
pub struct Loaded {
    /// The open enforcer.
    pub open: LsmEnforcer,
    /// The exec enforcer.
    pub exec: LsmEnforcer,
    /// The hooks attached.
    pub hooks: Hooks,
    /// Why the planned backend was not the one attached, when it was not.
    pub fallback: Option<String>,
}

/// Loads the backend `compat`'s plan chose for open/exec, falling back from
/// BPF-LSM to fmod_ret when the BPF-LSM object itself is refused (the plan
/// probes a minimal LSM program; the real one also needs `bpf_d_path`,
/// which LSM programs only have from Linux 5.11). The reason for a
/// fallback is returned for the status shard and the log.
pub fn load_planned(planned: Backend, pin_dir: Option<&Path>) -> Result<Loaded> {
    let first = match planned {
        Backend::BpfLsm => Hooks::BpfLsm,
        Backend::FmodRet => Hooks::FmodRet,
        other => {
            return Err(EnforceError::Kernel {
                behavior: "open/exec",
                op: "load".to_owned(),
                source: std::io::Error::other(format!(
                    "the plan has no open/exec backend ({other})"
                )),
            })
        }
    };
    match load(first, pin_dir) {
        Ok((open, exec)) => Ok(Loaded {
            open,
            exec,
            hooks: first,
            fallback: None,
        }),
        Err(e) if first == Hooks::BpfLsm => {
            let reason = format!("the BPF-LSM object was refused ({e}); using fmod_ret");
            tracing::warn!(%reason, "open/exec backend fallback");
            let (open, exec) = load(Hooks::FmodRet, pin_dir)?;
            Ok(Loaded {
                open,
                exec,
                hooks: Hooks::FmodRet,
                fallback: Some(reason),
            })
        }
        Err(e) => Err(e),
    }
}
