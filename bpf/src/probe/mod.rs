//! Kernel capability probes: load one tiny program or map, and report what
//! the kernel did with it.
//!
//! Every probe is self-contained: it opens, loads, attaches, triggers and
//! checks its object, then detaches and drops everything, so nothing stays
//! attached or pinned after it returns. A failure is not an error of this
//! process but a fact about the kernel: "unsupported, with the reason"
//! ([`ProbeError`] says at which [`Stage`], with which errno, and carries
//! libbpf's log, which includes the verifier's).
//!
//! Each program lives in its own BPF object, so one refused program type
//! cannot hide another; the map probes share one object but create only the
//! map under test.
//!
//! Probes are serialized within the process: libbpf's log callback is
//! process-global, and each probe captures it for its own duration.

use std::fmt;
use std::path::Path;

mod errno;
#[cfg(not(krt_bpf_stub))]
mod kernel;
#[cfg(not(krt_bpf_stub))]
mod packet;
#[cfg(krt_bpf_stub)]
mod stub;

#[cfg(not(krt_bpf_stub))]
use kernel as imp;
#[cfg(krt_bpf_stub)]
use stub as imp;

/// Whether this build contains the compiled BPF objects.
///
/// `false` when the crate was built without clang (or with
/// `KRT_BPF_STUB=1`); every probe then fails at [`Stage::Open`].
pub const BPF_OBJECTS_BUILT: bool = cfg!(not(krt_bpf_stub));

/// Result of a probe.
pub type Result<T, E = ProbeError> = std::result::Result<T, E>;

/// A probe program: the smallest program of one type and attach point that a
/// backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeProgram {
    /// `lsm/file_open` (BPF-LSM open/exec enforcement). Returns 0: never
    /// denies.
    LsmFileOpen,
    /// `fmod_ret/security_file_open` (the enforcement fallback when the BPF
    /// LSM is not active). Returns 0: never changes the hook's result.
    FmodRetFileOpen,
    /// `cgroup_skb/egress` (egress, protocol and DNS backends). Always passes
    /// the packet.
    CgroupSkbEgress,
    /// `raw_tp/sched_process_exec` with a ring buffer (exec tracing).
    RawTpSchedProcessExec,
}

impl ProbeProgram {
    /// Every probe program, in the order a probe table lists them.
    pub const ALL: [Self; 4] = [
        Self::LsmFileOpen,
        Self::FmodRetFileOpen,
        Self::CgroupSkbEgress,
        Self::RawTpSchedProcessExec,
    ];

    /// The program's ELF section, i.e. its libbpf program type and attach
    /// point (`lsm/file_open`, ...).
    pub const fn section(self) -> &'static str {
        match self {
            Self::LsmFileOpen => "lsm/file_open",
            Self::FmodRetFileOpen => "fmod_ret/security_file_open",
            Self::CgroupSkbEgress => "cgroup_skb/egress",
            Self::RawTpSchedProcessExec => "raw_tp/sched_process_exec",
        }
    }
}

impl fmt::Display for ProbeProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.section())
    }
}

/// A probe map: a map type some backend needs that not every kernel (or
/// sandbox) allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeMap {
    /// `BPF_MAP_TYPE_LPM_TRIE` with an IPv6-sized key and
    /// `BPF_F_NO_PREALLOC` (CIDR allow/deny lists).
    LpmTrie,
    /// `BPF_MAP_TYPE_HASH_OF_MAPS` with an inner hash map.
    HashOfMaps,
    /// `BPF_MAP_TYPE_RINGBUF` (event transport).
    RingBuf,
}

impl ProbeMap {
    /// Every probe map, in the order a probe table lists them.
    pub const ALL: [Self; 3] = [Self::LpmTrie, Self::HashOfMaps, Self::RingBuf];

    /// The kernel's name of the map type (`BPF_MAP_TYPE_...`).
    pub const fn map_type(self) -> &'static str {
        match self {
            Self::LpmTrie => "BPF_MAP_TYPE_LPM_TRIE",
            Self::HashOfMaps => "BPF_MAP_TYPE_HASH_OF_MAPS",
            Self::RingBuf => "BPF_MAP_TYPE_RINGBUF",
        }
    }
}

impl fmt::Display for ProbeMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.map_type())
    }
}

/// How far a probe got before it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Parsing the object (`bpf_object__open`); also where a build without
    /// BPF objects fails.
    Open,
    /// Loading into the kernel: map creation, BTF, the verifier.
    Load,
    /// Attaching the loaded program to its hook (or finding the cgroup to
    /// attach to).
    Attach,
    /// Triggering the attached program or using the created map (test run,
    /// spawning the exec child, map update/lookup).
    Run,
}

impl Stage {
    /// Lower-case name of the stage (`open`, `load`, `attach`, `run`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Load => "load",
            Self::Attach => "attach",
            Self::Run => "run",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a probe failed, with what the kernel said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProbeError {
    /// The stage that failed; the stages before it succeeded.
    pub stage: Stage,
    /// The OS error the failing call returned (e.g. `Some(1)`, EPERM, when
    /// the kernel refuses to load an LSM program); `None` when the failure
    /// did not come from the kernel (no cgroup directory given, a build
    /// without BPF objects, ...).
    pub errno: Option<i32>,
    /// One line for humans, naming the errno when there is one, e.g.
    /// `load refused: EPERM (Operation not permitted)`.
    pub message: String,
    /// libbpf's log during the probe (including the verifier log of a
    /// refused program), the last ~4 KiB of it; `None` when libbpf said
    /// nothing.
    pub verifier_log: Option<String>,
}

impl ProbeError {
    /// A failure with no libbpf log attached (yet).
    pub(crate) fn new(stage: Stage, errno: Option<i32>, message: impl Into<String>) -> Self {
        Self {
            stage,
            errno,
            message: message.into(),
            verifier_log: None,
        }
    }

    /// A failure of `what` (e.g. "load refused") with the given errno,
    /// described as `<what>: EPERM (Operation not permitted)`.
    #[cfg_attr(krt_bpf_stub, allow(dead_code))]
    pub(crate) fn os(stage: Stage, what: &str, errno: i32) -> Self {
        Self::new(
            stage,
            Some(errno),
            format!("{what}: {}", errno::describe(errno)),
        )
    }

    /// A failure of `what` reported by a std I/O call.
    #[cfg_attr(krt_bpf_stub, allow(dead_code))]
    pub(crate) fn io(stage: Stage, what: &str, err: &std::io::Error) -> Self {
        match err.raw_os_error() {
            Some(n) => Self::os(stage, what, n),
            None => Self::new(stage, None, format!("{what}: {err}")),
        }
    }

    /// A failure of `what` reported by libbpf-rs.
    ///
    /// libbpf-rs does not expose the errno of its errors, but every error
    /// that came from a failed syscall or libbpf call bottoms out in a
    /// `std::io::Error` built from the raw OS error, whose text ends in
    /// `(os error N)`; that is where the errno is read from.
    #[cfg(not(krt_bpf_stub))]
    pub(crate) fn libbpf(stage: Stage, what: &str, err: &libbpf_rs::Error) -> Self {
        let chain = format!("{err:#}");
        match errno::os_error_in(&chain) {
            Some(n) => Self::os(stage, what, n),
            None => Self::new(stage, None, format!("{what}: {chain}")),
        }
    }

    /// Attaches the libbpf log captured during the probe (if any).
    #[cfg_attr(krt_bpf_stub, allow(dead_code))]
    pub(crate) fn with_log(mut self, log: Option<String>) -> Self {
        self.verifier_log = log;
        self
    }
}

/// What a successful probe observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramProbe {
    /// Whether the attached program ran when triggered.
    ///
    /// `None` when the probe has no way to trigger the program (e.g. the
    /// kernel does not support `BPF_PROG_TEST_RUN` for it); `Some(false)`
    /// when it attached but never ran, which is what an LSM program does
    /// when `bpf` is not in the active LSM list.
    pub ran: Option<bool>,
}

/// Loads, attaches, triggers and detaches one probe program.
///
/// - [`ProbeProgram::LsmFileOpen`], [`ProbeProgram::FmodRetFileOpen`]: the
///   program counts invocations by this process; the probe opens a file and
///   reports `ran: Some(count > 0)`.
/// - [`ProbeProgram::CgroupSkbEgress`]: needs `cgroup_dir`, a cgroup v2
///   directory the caller created and will remove (without it the probe
///   fails at [`Stage::Attach`] after loading). After attaching there, it
///   runs the program on a minimal IPv4/UDP packet with
///   `BPF_PROG_TEST_RUN` and reports whether it returned "pass"; `ran: None`
///   if the kernel cannot test-run it.
/// - [`ProbeProgram::RawTpSchedProcessExec`]: spawns a short child
///   (`/bin/true`, else `/bin/sh -c :`) and waits up to 1 s for its exec
///   record in the ring buffer.
///
/// `cgroup_dir` is ignored by every program but `CgroupSkbEgress`. Nothing
/// stays attached or pinned when this returns. Concurrent calls are
/// serialized.
pub fn probe_program(program: ProbeProgram, cgroup_dir: Option<&Path>) -> Result<ProgramProbe> {
    imp::probe_program(program, cgroup_dir)
}

/// Creates one probe map (from `bpf/probe/maps.bpf.c`) and uses it once.
///
/// - [`ProbeMap::LpmTrie`]: one update and one longest-prefix lookup.
/// - [`ProbeMap::HashOfMaps`]: creates the inner hash and the outer map and
///   inserts the inner map into the outer one.
/// - [`ProbeMap::RingBuf`]: creating it is enough.
///
/// A use that fails after the map was created is reported at
/// [`Stage::Run`]. Only the map under test is created, so one refused map
/// type cannot hide another.
pub fn probe_map(map: ProbeMap) -> Result<()> {
    imp::probe_map(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_name_the_attach_points() {
        let sections: Vec<_> = ProbeProgram::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            sections,
            [
                "lsm/file_open",
                "fmod_ret/security_file_open",
                "cgroup_skb/egress",
                "raw_tp/sched_process_exec"
            ]
        );
        assert_eq!(
            ProbeMap::HashOfMaps.to_string(),
            "BPF_MAP_TYPE_HASH_OF_MAPS"
        );
        assert_eq!(Stage::Load.to_string(), "load");
    }

    #[test]
    fn os_error_message_names_the_errno() {
        let e = ProbeError::os(Stage::Load, "load refused", libc::EPERM);
        assert_eq!(e.errno, Some(1));
        assert_eq!(e.message, "load refused: EPERM (Operation not permitted)");
        assert_eq!(e.to_string(), e.message);
        assert_eq!(e.verifier_log, None);
    }

    #[test]
    fn io_error_without_errno_keeps_its_text() {
        let err = std::io::Error::other("no such thing");
        let e = ProbeError::io(Stage::Run, "spawn failed", &err);
        assert_eq!(e.errno, None);
        assert_eq!(e.message, "spawn failed: no such thing");
    }

    #[cfg(not(krt_bpf_stub))]
    #[test]
    fn libbpf_error_errno_is_recovered() {
        use libbpf_rs::ErrorExt as _;
        let err = libbpf_rs::Error::from_raw_os_error(libc::EPERM).context("failed to load");
        let e = ProbeError::libbpf(Stage::Load, "load refused", &err);
        assert_eq!(e.errno, Some(libc::EPERM));
        assert_eq!(e.message, "load refused: EPERM (Operation not permitted)");

        let err = libbpf_rs::Error::from(std::io::Error::other("bad ELF"));
        let e = ProbeError::libbpf(Stage::Open, "open failed", &err);
        assert_eq!(e.errno, None);
        assert_eq!(e.message, "open failed: bad ELF");
    }

    #[cfg(krt_bpf_stub)]
    #[test]
    fn stub_probes_say_how_to_fix_the_build() {
        const { assert!(!BPF_OBJECTS_BUILT) };
        let e = probe_program(ProbeProgram::LsmFileOpen, None).unwrap_err();
        assert_eq!(e.stage, Stage::Open);
        assert!(e.message.contains("install clang and rebuild"));
        assert!(probe_map(ProbeMap::RingBuf).is_err());
    }
}
