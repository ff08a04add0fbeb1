//! Open and exec enforcement: the BPF-LSM object (`bpf/openexec/lsm.bpf.c`)
//! and the fmod_ret object (`bpf/openexec/fmod_ret.bpf.c`), which share
//! their maps and their decision (`bpf/include/openexec_check.h`), and
//! their typed handle, [`OpenExec`].
//!
//! # Model
//!
//! Each policy with an open (exec) behavior holds one of [`SLOTS`] slots of
//! that [`Dimension`]; its state is one bit per map entry:
//!
//! | map | key | value: bit `s` means slot `s` ... |
//! | --- | --- | --- |
//! | `oe_cgroups` | `u64` cgroup id | [`CgroupSlots`]: selects the cgroup |
//! | `oe_open_paths`, `oe_exec_paths` | path, NUL-padded to [`PATH_KEY_LEN`] | [`PathRule`]: denies / allows the path |
//! | `oe_names` | final path component, NUL-padded to [`NAME_KEY_LEN`] | present: some rule's path ends in it |
//! | `oe_config` | `0` | [`SlotMasks`]: is default deny / is a monitor policy |
//! | `oe_owners` | `dim * SLOTS + slot` | the id of the policy holding the slot (userspace bookkeeping) |
//! | `oe_observations` | `(cgroup, dim, decision, path)` | `u64` count since the last drain |
//! | `oe_stats` | `0` (per CPU) | [`OpenExecStats`] |
//!
//! For an operation of a cgroup whose mask `m` for the dimension is
//! non-zero (any other cgroup returns after one lookup, before the path is
//! resolved), with `r` the path's rule: `r.deny & m` refuses
//! ([`Decision::Denied`]); else `r.allow & m` allows; else
//! `default_deny & m` refuses ([`Decision::DefaultDenied`]); else allowed.
//! So the verdict over any number of policies costs two hash lookups, and
//! separate policies union as the specification requires. Refusals are
//! always counted in `oe_observations`; other decisions only when a bound
//! slot is a monitor slot (`observe & m`).
//!
//! # Hooks
//!
//! [`Hooks::BpfLsm`]: `lsm/file_open` decides the open dimension for every
//! open (an exec's open of its binary and of its ELF interpreter included)
//! and `lsm/bprm_check_security` the exec dimension, for the binary and a
//! script's interpreter. [`Hooks::FmodRet`]: `fmod_ret/security_file_open`
//! decides the open dimension for every open and, for an open with
//! `__FMODE_EXEC`, the exec dimension too, stashing that decision by
//! `struct file` (`oe_pending`); `fmod_ret/security_bprm_check` enforces
//! the stash of `bprm->file` (bpf_d_path is refused there). So both hook
//! sets see the same execs and refuse the same operations (see
//! `bpf/openexec/fmod_ret.bpf.c`).
//!
//! # Pinning and restarts
//!
//! With a pin directory, the maps and the links are pinned there. A new
//! [`OpenExec::load`] over existing pins reuses the maps (so every policy
//! stays enforced), attaches its own programs, and only then replaces the
//! old links, so there is no instant without a program attached. Whoever
//! loads reads back what it adopted ([`OpenExec::adopted`], the map
//! getters) and reconciles it. The directory carries the layout marker of
//! [`crate::pins`], written before the first pin, and the pin names are
//! that layout's; [`OpenExec::remove_pins`] removes exactly those.

use std::path::Path;

#[cfg(not(krt_bpf_stub))]
mod kernel;
#[cfg(krt_bpf_stub)]
mod stub;

#[cfg(not(krt_bpf_stub))]
use kernel as imp;
#[cfg(krt_bpf_stub)]
use stub as imp;

/// Policy slots per dimension (bits of a `u64`).
pub const SLOTS: usize = 64;

/// Width of a path key: 255 bytes of path and its NUL.
pub const PATH_KEY_LEN: usize = 256;

/// Width of an `oe_names` key: a final path component, NUL-padded. A
/// longer name needs no entry (the program resolves such paths in full).
pub const NAME_KEY_LEN: usize = 64;

/// The `oe_names` key of a path's final component (`/` for the root), or
/// `None` when the name is too long to need one.
pub fn name_key(path: &[u8]) -> Option<[u8; NAME_KEY_LEN]> {
    let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
    let path = &path[..end];
    let name = match path.iter().rposition(|b| *b == b'/') {
        Some(at) if at + 1 < path.len() => &path[at + 1..],
        _ => b"/".as_slice(),
    };
    if name.is_empty() || name.len() >= NAME_KEY_LEN {
        return None;
    }
    let mut key = [0u8; NAME_KEY_LEN];
    key[..name.len()].copy_from_slice(name);
    Some(key)
}

/// Width of a slot's owner id, NUL included.
pub const OWNER_LEN: usize = 64;

/// Result of the open/exec handle.
pub type Result<T, E = OpenExecError> = std::result::Result<T, E>;

/// Which hooks carry enforcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hooks {
    /// `lsm/file_open` and `lsm/bprm_check_security` (needs `bpf` in the
    /// active LSM list, and `bpf_d_path` in LSM programs).
    BpfLsm,
    /// `fmod_ret/security_file_open` (no boot parameter needed).
    FmodRet,
}

impl Hooks {
    /// The stable name (`bpf_lsm`, `fmod_ret`), as `compat` names backends.
    pub const fn name(self) -> &'static str {
        match self {
            Hooks::BpfLsm => "bpf_lsm",
            Hooks::FmodRet => "fmod_ret",
        }
    }
}

/// A semantic dimension: what a slot, a path rule and a mask belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// File opens.
    Open,
    /// Program execution.
    Exec,
}

impl Dimension {
    /// Both, in index order.
    pub const ALL: [Dimension; 2] = [Dimension::Open, Dimension::Exec];

    /// The index in the kernel's arrays (`enum krt_oe_dim`).
    pub const fn index(self) -> usize {
        match self {
            Dimension::Open => 0,
            Dimension::Exec => 1,
        }
    }

    /// The behavior name.
    pub const fn name(self) -> &'static str {
        match self {
            Dimension::Open => "open",
            Dimension::Exec => "exec",
        }
    }
}

/// The kernel's decision (`enum krt_oe_decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Decision {
    /// A bound slot denies the path: refused.
    Denied,
    /// A bound slot allows it and none denies it: allowed.
    Allowed,
    /// Nothing matched and a bound slot is default deny: refused.
    DefaultDenied,
    /// Nothing matched, no default deny: allowed.
    Unmatched,
}

impl Decision {
    /// Every decision, in the kernel's order.
    pub const ALL: [Decision; 4] = [
        Decision::Denied,
        Decision::Allowed,
        Decision::DefaultDenied,
        Decision::Unmatched,
    ];

    /// Decodes the kernel's value.
    pub fn from_raw(raw: u32) -> Option<Self> {
        Self::ALL.get(usize::try_from(raw).ok()?).copied()
    }

    /// Whether the operation was refused.
    pub const fn refused(self) -> bool {
        matches!(self, Decision::Denied | Decision::DefaultDenied)
    }
}

/// The slots that deny and allow one path (`struct krt_oe_rule`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathRule {
    /// Bit `s`: slot `s` denies the path.
    pub deny: u64,
    /// Bit `s`: slot `s` allows the path.
    pub allow: u64,
}

impl PathRule {
    /// No slot says anything about the path (the entry is deleted).
    pub const fn is_empty(&self) -> bool {
        self.deny == 0 && self.allow == 0
    }
}

/// The slots that select one cgroup, per dimension (`struct krt_oe_cgroup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupSlots(pub [u64; 2]);

impl CgroupSlots {
    /// The mask of one dimension.
    pub const fn get(&self, dim: Dimension) -> u64 {
        self.0[dim.index()]
    }

    /// Sets the mask of one dimension.
    pub fn set(&mut self, dim: Dimension, mask: u64) {
        self.0[dim.index()] = mask;
    }

    /// No slot selects the cgroup (the entry is deleted).
    pub const fn is_empty(&self) -> bool {
        self.0[0] == 0 && self.0[1] == 0
    }
}

/// Per-slot flags as masks (`struct krt_oe_config`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotMasks {
    /// Bit `s` of `[dim]`: slot `s` is default deny.
    pub default_deny: [u64; 2],
    /// Bit `s` of `[dim]`: slot `s` is a monitor-mode policy.
    pub observe: [u64; 2],
}

/// Operations one cgroup did on one path with one decision since the last
/// drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawObservation {
    /// The cgroup id.
    pub cgroup: u64,
    /// The dimension decided.
    pub dimension: Dimension,
    /// The decision.
    pub decision: Decision,
    /// The path as `bpf_d_path` resolved it (bytes up to the NUL; a Linux
    /// path need not be UTF-8).
    pub path: Vec<u8>,
    /// How many times.
    pub count: u64,
}

/// One refusal as the refusing program reported it (`struct
/// krt_oe_denial` in the `oe_denials` ring buffer): one record per refused
/// operation, within its cgroup's budget per second (see
/// [`OpenExec::set_denial_rate`]); a refusal over the budget is counted in
/// the observation counters instead, so each refusal is reported exactly
/// once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Denial {
    /// The cgroup id of the refused task.
    pub cgroup: u64,
    /// The dimension that refused.
    pub dimension: Dimension,
    /// The decision ([`Decision::Denied`] or [`Decision::DefaultDenied`]).
    pub decision: Decision,
    /// The path as `bpf_d_path` resolved it (bytes up to the NUL); empty
    /// when it could not be resolved (refused by a default deny).
    pub path: Vec<u8>,
    /// Thread-group id of the refused task.
    pub pid: u32,
    /// Its `comm`.
    pub comm: String,
}

// Offsets of `struct krt_oe_denial` (checked against the skeleton in the
// kernel build; the decoder exists in stub builds too).
pub(crate) const DENIAL_CGROUP_AT: usize = 0;
pub(crate) const DENIAL_DIM_AT: usize = 8;
pub(crate) const DENIAL_DECISION_AT: usize = 12;
pub(crate) const DENIAL_PATH_AT: usize = 16;
pub(crate) const DENIAL_PID_AT: usize = DENIAL_PATH_AT + PATH_KEY_LEN;
pub(crate) const DENIAL_COMM_AT: usize = DENIAL_PID_AT + 8;
/// Bytes of the comm field, NUL included.
pub const DENIAL_COMM_LEN: usize = 16;
/// Bytes of one `oe_denials` record.
pub const DENIAL_RECORD_LEN: usize = DENIAL_COMM_AT + DENIAL_COMM_LEN;

/// Why an `oe_denials` record is not one the programs wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("denial record: {0}")]
pub struct DenialDecodeError(pub String);

fn ne_u32(r: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&r[at..at + 4]);
    u32::from_ne_bytes(b)
}

/// Bytes up to the NUL of a zero-padded field, or why it is not one.
fn padded(field: &'static str, bytes: &[u8]) -> std::result::Result<Vec<u8>, DenialDecodeError> {
    let end = bytes
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| DenialDecodeError(format!("{field} has no NUL")))?;
    if bytes[end..].iter().any(|b| *b != 0) {
        return Err(DenialDecodeError(format!(
            "bytes after the NUL of {field} (the record was not zeroed)"
        )));
    }
    Ok(bytes[..end].to_vec())
}

/// Decodes one `oe_denials` record. Pure and total: arbitrary bytes give an
/// error, never a panic; a record that is not a refusal, or whose padding
/// is not zero, is refused.
pub fn decode_denial(record: &[u8]) -> std::result::Result<Denial, DenialDecodeError> {
    if record.len() != DENIAL_RECORD_LEN {
        return Err(DenialDecodeError(format!(
            "{} bytes, expected {DENIAL_RECORD_LEN}",
            record.len()
        )));
    }
    let dimension = match ne_u32(record, DENIAL_DIM_AT) {
        0 => Dimension::Open,
        1 => Dimension::Exec,
        d => return Err(DenialDecodeError(format!("dimension {d}"))),
    };
    let decision = Decision::from_raw(ne_u32(record, DENIAL_DECISION_AT))
        .filter(|d| d.refused())
        .ok_or_else(|| DenialDecodeError("a decision that is not a refusal".into()))?;
    if ne_u32(record, DENIAL_PID_AT + 4) != 0 {
        return Err(DenialDecodeError("non-zero padding".into()));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&record[DENIAL_CGROUP_AT..DENIAL_CGROUP_AT + 8]);
    let path = padded(
        "path",
        &record[DENIAL_PATH_AT..DENIAL_PATH_AT + PATH_KEY_LEN],
    )?;
    let comm = padded(
        "comm",
        &record[DENIAL_COMM_AT..DENIAL_COMM_AT + DENIAL_COMM_LEN],
    )?;
    Ok(Denial {
        cgroup: u64::from_ne_bytes(id),
        dimension,
        decision,
        path,
        pid: ne_u32(record, DENIAL_PID_AT),
        comm: String::from_utf8_lossy(&comm).into_owned(),
    })
}

/// The record the programs would write for `d` (tests and fuzzing).
pub fn encode_denial(d: &Denial) -> Vec<u8> {
    let mut out = vec![0u8; DENIAL_RECORD_LEN];
    out[DENIAL_CGROUP_AT..DENIAL_CGROUP_AT + 8].copy_from_slice(&d.cgroup.to_ne_bytes());
    out[DENIAL_DIM_AT..DENIAL_DIM_AT + 4]
        .copy_from_slice(&(d.dimension.index() as u32).to_ne_bytes());
    let decision = Decision::ALL
        .iter()
        .position(|x| *x == d.decision)
        .unwrap_or_default() as u32;
    out[DENIAL_DECISION_AT..DENIAL_DECISION_AT + 4].copy_from_slice(&decision.to_ne_bytes());
    let n = d.path.len().min(PATH_KEY_LEN - 1);
    out[DENIAL_PATH_AT..DENIAL_PATH_AT + n].copy_from_slice(&d.path[..n]);
    out[DENIAL_PID_AT..DENIAL_PID_AT + 4].copy_from_slice(&d.pid.to_ne_bytes());
    let c = d.comm.len().min(DENIAL_COMM_LEN - 1);
    out[DENIAL_COMM_AT..DENIAL_COMM_AT + c].copy_from_slice(&d.comm.as_bytes()[..c]);
    out
}

/// Fuzzing entry point: decoding is total, and a decoded record with a
/// UTF-8 comm and no NUL in its path encodes back to the same bytes.
/// Panics when that fails; never called outside tests and fuzz targets.
#[doc(hidden)]
pub fn fuzz_decode_denial(data: &[u8]) {
    let Ok(d) = decode_denial(data) else {
        return;
    };
    if !d.comm.contains('\u{fffd}') {
        assert!(encode_denial(&d) == data, "{d:?} re-encodes to other bytes");
    }
}

/// The program's outcome counters summed over CPUs, cumulative since the
/// maps were created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenExecStats {
    /// `[dim][decision]`: decisions on resolved paths.
    pub decisions: [[u64; 4]; 2],
    /// `[dim]`: paths that could not be resolved, allowed.
    pub unresolved_passed: [u64; 2],
    /// `[dim]`: paths that could not be resolved, refused (default deny).
    pub unresolved_denied: [u64; 2],
    /// Observations lost because `oe_observations` was full.
    pub observe_failed: u64,
    /// Refusals sent as [`Denial`] records.
    pub denials_sent: u64,
    /// Refusals not sent as a record because their cgroup had used its
    /// budget for the second (counted as observations instead).
    pub denials_rate_limited: u64,
    /// Refusals not sent as a record because the ring buffer was full
    /// (counted as observations instead).
    pub denials_ringbuf_full: u64,
}

/// What the kernel's BPF statistics say about one attached program.
/// `run_time_ns` and `run_count` only advance while
/// `kernel.bpf_stats_enabled` is 1 (see [`enable_bpf_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramRunStats {
    /// The program's name.
    pub name: String,
    /// Total run time.
    pub run_time_ns: u64,
    /// Invocations.
    pub run_count: u64,
}

/// Why an open/exec operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenExecError {
    /// The crate was built without BPF objects (no clang).
    #[error("built without BPF objects: install clang and rebuild")]
    NotBuilt,
    /// libbpf could not open the embedded object.
    #[error("opening the {hooks} open/exec object failed: {message}")]
    Open {
        /// The hooks.
        hooks: &'static str,
        /// libbpf's error.
        message: String,
    },
    /// The kernel refused to load the object (the verifier log says why).
    #[error("loading the {hooks} open/exec object failed: {message}")]
    Load {
        /// The hooks.
        hooks: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
        /// The tail of libbpf's log during the load.
        verifier_log: Option<String>,
    },
    /// Attaching a program failed.
    #[error("attaching {program} failed: {message}")]
    Attach {
        /// The program.
        program: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A pin could not be created, opened or replaced.
    #[error("pin {path}: {message}")]
    Pin {
        /// The pin path.
        path: String,
        /// What failed.
        message: String,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {message}")]
    Map {
        /// The map.
        map: &'static str,
        /// The operation.
        op: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A map is full.
    #[error("map {map} is full ({max_entries} entries)")]
    MapFull {
        /// The map.
        map: &'static str,
        /// Its capacity.
        max_entries: u32,
    },
    /// A slot index of [`SLOTS`] or more, or an owner id too long.
    #[error("{0}")]
    Invalid(String),
    /// The denial ring buffer reader could not be set up.
    #[error(transparent)]
    Ring(#[from] crate::ring::RingError),
    /// Bytes from the kernel that do not have the layout this code reads.
    #[error("map {map} returned {what}")]
    Layout {
        /// The map.
        map: &'static str,
        /// What was wrong.
        what: String,
    },
}

impl OpenExecError {
    /// The errno of the failing syscall, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Load { errno, .. } | Self::Attach { errno, .. } | Self::Map { errno, .. } => {
                *errno
            }
            _ => None,
        }
    }
}

/// The loaded, attached open/exec object.
#[derive(Debug)]
pub struct OpenExec {
    inner: imp::Inner,
}

impl OpenExec {
    /// Loads the object for `hooks` and attaches its programs.
    ///
    /// With `pin_dir`, maps found pinned there are reused (their contents
    /// are adopted: see [`Self::adopted`]) and the new links replace the
    /// pinned ones only once attached; maps of another layout version are
    /// discarded and recreated. Without it, nothing outlives the handle.
    pub fn load(hooks: Hooks, pin_dir: Option<&Path>) -> Result<Self> {
        imp::Inner::load(hooks, pin_dir, None).map(|inner| Self { inner })
    }

    /// [`Self::load`] without pins, with room for only `paths` entries in
    /// each path map and the name map: a map made small so that it fills
    /// on purpose (what the tests of a failed update use; the kernel's
    /// own "full" error, not an imitation of it).
    pub fn load_with_path_capacity(hooks: Hooks, paths: u32) -> Result<Self> {
        imp::Inner::load(hooks, None, Some(paths)).map(|inner| Self { inner })
    }

    /// The hooks this object attached.
    pub fn hooks(&self) -> Hooks {
        self.inner.hooks()
    }

    /// Whether the maps were adopted from pins left by an earlier load.
    pub fn adopted(&self) -> bool {
        self.inner.adopted()
    }

    /// The id of the policy holding `slot` of `dim`, if any.
    pub fn owner(&self, dim: Dimension, slot: usize) -> Result<Option<Vec<u8>>> {
        self.inner.owner(dim, slot)
    }

    /// Records (or, with `None`, frees) the holder of a slot.
    pub fn set_owner(&self, dim: Dimension, slot: usize, owner: Option<&[u8]>) -> Result<()> {
        self.inner.set_owner(dim, slot, owner)
    }

    /// The rule of one path (empty when there is no entry).
    pub fn rule(&self, dim: Dimension, path: &[u8; PATH_KEY_LEN]) -> Result<PathRule> {
        self.inner.rule(dim, path)
    }

    /// Writes the rule of one path; an empty rule deletes the entry.
    pub fn set_rule(
        &self,
        dim: Dimension,
        path: &[u8; PATH_KEY_LEN],
        rule: PathRule,
    ) -> Result<()> {
        self.inner.set_rule(dim, path, rule)
    }

    /// Every path rule of a dimension.
    pub fn rules(&self, dim: Dimension) -> Result<Vec<([u8; PATH_KEY_LEN], PathRule)>> {
        self.inner.rules(dim)
    }

    /// Marks a final path component as named (or no longer named) by some
    /// rule: the program resolves the full path only for names in this set
    /// unless a bound policy is default deny or observing.
    pub fn set_name(&self, name: &[u8; NAME_KEY_LEN], present: bool) -> Result<()> {
        self.inner.set_name(name, present)
    }

    /// Every name in the set.
    pub fn names(&self) -> Result<Vec<[u8; NAME_KEY_LEN]>> {
        self.inner.names()
    }

    /// The slots selecting a cgroup (empty when there is no entry).
    pub fn cgroup(&self, cgroup: u64) -> Result<CgroupSlots> {
        self.inner.cgroup(cgroup)
    }

    /// Writes the slots selecting a cgroup; empty deletes the entry.
    pub fn set_cgroup(&self, cgroup: u64, slots: CgroupSlots) -> Result<()> {
        self.inner.set_cgroup(cgroup, slots)
    }

    /// Every cgroup entry.
    pub fn cgroups(&self) -> Result<Vec<(u64, CgroupSlots)>> {
        self.inner.cgroups()
    }

    /// The per-slot flags.
    pub fn masks(&self) -> Result<SlotMasks> {
        self.inner.masks()
    }

    /// Writes the per-slot flags.
    pub fn set_masks(&self, masks: &SlotMasks) -> Result<()> {
        self.inner.set_masks(masks)
    }

    /// Takes the observations counted since the last drain.
    pub fn drain_observations(&self) -> Result<Vec<RawObservation>> {
        self.inner.drain_observations()
    }

    /// The outcome counters, summed over CPUs.
    pub fn stats(&self) -> Result<OpenExecStats> {
        self.inner.stats()
    }

    /// The kernel's run-time statistics of the attached programs.
    pub fn run_stats(&self) -> Result<Vec<ProgramRunStats>> {
        self.inner.run_stats()
    }

    /// Sets how many [`Denial`] records each cgroup may send per second (0:
    /// none; every refusal is then only counted). Kept across a restart
    /// with the pinned configuration.
    pub fn set_denial_rate(&self, per_second: u32) -> Result<()> {
        self.inner.set_denial_rate(per_second)
    }

    /// The budget of [`Denial`] records per cgroup and second.
    pub fn denial_rate(&self) -> Result<u32> {
        self.inner.denial_rate()
    }

    /// Turns the pod directory fallback on or off: a task whose own cgroup
    /// is not bound is decided by its parent cgroup's binding (the pod's
    /// directory, bound where no runtime hook announces containers before
    /// they start). Off after every load.
    pub fn set_pod_fallback(&self, on: bool) -> Result<()> {
        self.inner.set_pod_fallback(on)
    }

    /// Exempts `cgroup` from the pod directory fallback (or ends its
    /// exemption): a pod's sandbox, which lives in a child of the pod's
    /// directory as its containers do. Exempt before the directory is
    /// bound.
    pub fn set_pod_exempt(&self, cgroup: u64, exempt: bool) -> Result<()> {
        self.inner.set_pod_exempt(cgroup, exempt)
    }

    /// Whether the pod directory fallback is on, and how many decisions
    /// it has taken since the programs were loaded.
    pub fn pod_fallback(&self) -> Result<(bool, u64)> {
        self.inner.pod_fallback()
    }

    /// The map through which the exec programs hand the exec tracer the
    /// paths they resolved (a new descriptor of it, for
    /// [`crate::exectrace::ExecTracer::load`]).
    pub fn exec_resolved_map(&self) -> Result<libbpf_rs::MapHandle> {
        self.inner.exec_resolved_map()
    }

    /// A reader of the [`Denial`] records (each reader consumes what it
    /// reads; the daemon keeps one).
    pub fn denial_reader(&self) -> Result<crate::ring::RecordReader<Denial>> {
        self.inner.denial_reader()
    }

    /// Removes the pins [`OpenExec::load`] made under `pin_dir` (its maps,
    /// links and marker, then the directory once empty), refusing a
    /// directory that is not marked as the open/exec backend's, and
    /// keeping (and naming) anything else (see [`crate::pins`]). The
    /// programs are detached once no process holds them (bpffs frees an
    /// unlinked inode after an RCU grace period, so shortly after this
    /// returns). For uninstalling and tests.
    pub fn remove_pins(pin_dir: &Path) -> crate::pins::Result<crate::pins::Removal> {
        crate::pins::remove_kind(pin_dir, crate::pins::Kind::OpenExec)
    }
}

/// Turns the kernel's BPF run-time statistics on (`kernel.bpf_stats_enabled
/// = 1`); they cost a few nanoseconds per program run, so they are off by
/// default. Returns the previous setting.
pub fn enable_bpf_stats(on: bool) -> std::io::Result<bool> {
    const KNOB: &str = "/proc/sys/kernel/bpf_stats_enabled";
    // A sysctl holds "0\n" or "1\n": a few bytes are all that is read.
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(KNOB)?, 16),
        &mut text,
    )?;
    let before = text.trim() == "1";
    std::fs::write(KNOB, if on { "1" } else { "0" })?;
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial() -> Denial {
        Denial {
            cgroup: 99,
            dimension: Dimension::Exec,
            decision: Decision::DefaultDenied,
            path: b"/usr/bin/curl".to_vec(),
            pid: 4321,
            comm: "sh".into(),
        }
    }

    #[test]
    fn a_denial_round_trips() {
        let bytes = encode_denial(&denial());
        assert_eq!(bytes.len(), DENIAL_RECORD_LEN);
        assert_eq!(decode_denial(&bytes), Ok(denial()));
        fuzz_decode_denial(&bytes);
        let unresolved = Denial {
            path: Vec::new(),
            ..denial()
        };
        assert_eq!(decode_denial(&encode_denial(&unresolved)), Ok(unresolved));
    }

    #[test]
    fn a_denial_that_is_not_one_is_refused() {
        let good = encode_denial(&denial());
        let mut allowed = good.clone();
        allowed[DENIAL_DECISION_AT] = 1;
        assert!(decode_denial(&allowed).is_err());
        let mut dim = good.clone();
        dim[DENIAL_DIM_AT] = 2;
        assert!(decode_denial(&dim).is_err());
        let mut stale = good.clone();
        stale[DENIAL_PATH_AT + 200] = b'x';
        assert_eq!(
            decode_denial(&stale),
            Err(DenialDecodeError(
                "bytes after the NUL of path (the record was not zeroed)".into()
            ))
        );
        assert!(decode_denial(&good[..10]).is_err());
    }

    fn name(path: &str) -> Option<String> {
        name_key(path.as_bytes()).map(|k| {
            String::from_utf8(k.iter().copied().take_while(|b| *b != 0).collect())
                .unwrap_or_default()
        })
    }

    #[test]
    fn a_name_key_is_the_final_component() {
        assert_eq!(name("/usr/bin/curl").as_deref(), Some("curl"));
        assert_eq!(name("/etc").as_deref(), Some("etc"));
        assert_eq!(name("/").as_deref(), Some("/"));
        // The kernel resolves names of 64 bytes or more in full.
        assert_eq!(name(&format!("/x/{}", "n".repeat(64))), None);
        assert_eq!(
            name(&format!("/x/{}", "n".repeat(63))).map(|n| n.len()),
            Some(63)
        );
    }
}
