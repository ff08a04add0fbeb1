//! The exec tracer: one record per exec of a gated cgroup, with its argv
//! (`bpf/exectrace/exec_trace.bpf.c`).
//!
//! A `raw_tp/sched_process_exec` program, attached once for the node. It
//! fires after an exec succeeded (the new image is in place: `comm` is the
//! new program's name), so it sees what ran, never what was refused; the
//! enforcing programs report refusals themselves (see
//! [`crate::openexec::OpenExec::denial_reader`]).
//!
//! - **The gate.** The program first looks the current task's cgroup id up
//!   in `krt_et_cgroups` ([`ExecTracer::admit`], [`ExecTracer::revoke`]) and
//!   returns when it is absent: an unselected pod's execs cost one hash
//!   lookup and never enter the ring buffer.
//! - **The record** ([`ExecRecord`]): pid, parent pid, comm, the filename
//!   the exec asked for, `argc`, and up to [`ARGV_SLOTS`] arguments of at
//!   most [`ARG_LEN`]` - 1` bytes each. What did not fit is flagged
//!   ([`Truncation`]), never guessed. The kernel zeroes each record before
//!   filling it (ring buffer memory is recycled and mapped into userspace),
//!   and [`decode_exec`] refuses a record whose padding is not zero.
//! - **Loss is counted** ([`ExecTraceStats`] in the kernel,
//!   [`RecordReader::undecodable`] here).
//!
//! [`decode_exec`] is pure and total; the kernel side is behind
//! [`ExecTracer`]. In a build without BPF objects [`ExecTracer::load`]
//! fails with [`ExecTraceError::NotBuilt`].

use crate::ring::{RecordReader, RingError};

#[cfg(not(krt_bpf_stub))]
mod kernel;
#[cfg(krt_bpf_stub)]
mod stub;

#[cfg(not(krt_bpf_stub))]
use kernel as imp;
#[cfg(krt_bpf_stub)]
use stub as imp;

/// Argument slots of a record.
pub const ARGV_SLOTS: usize = 8;
/// Bytes of one argument slot, its NUL included.
pub const ARG_LEN: usize = 128;
/// Bytes of the filename field, its NUL included.
pub const FILENAME_LEN: usize = 256;
/// Bytes of the comm field, its NUL included.
pub const COMM_LEN: usize = 16;

// Offsets of `struct krt_exec_record` (checked against the skeleton's type
// at compile time in the kernel build; the decoder exists in stub builds
// too, so it carries its own).
pub(crate) const CGROUP_ID_AT: usize = 0;
pub(crate) const PID_AT: usize = 8;
pub(crate) const PPID_AT: usize = 12;
pub(crate) const ARGC_AT: usize = 16;
pub(crate) const FLAGS_AT: usize = 20;
pub(crate) const RECORDED_AT: usize = 24;
pub(crate) const COMM_AT: usize = 32;
pub(crate) const FILENAME_AT: usize = COMM_AT + COMM_LEN;
pub(crate) const ARGV_AT: usize = FILENAME_AT + FILENAME_LEN;
pub(crate) const RESOLVED_COUNT_AT: usize = RECORDED_AT + 4;
pub(crate) const RESOLVED_AT: usize = ARGV_AT + ARGV_SLOTS * ARG_LEN;
/// Resolved paths a record can carry (the binary, a script's interpreter).
pub const RESOLVED_SLOTS: usize = 2;
/// Bytes of one ring buffer record.
pub const RECORD_LEN: usize = RESOLVED_AT + RESOLVED_SLOTS * FILENAME_LEN;

// `enum krt_et_flag`.
const ARGV_TRUNCATED: u32 = 1 << 0;
const ARG_TRUNCATED: u32 = 1 << 1;
const ARGV_UNREADABLE: u32 = 1 << 2;
const FILENAME_TRUNCATED: u32 = 1 << 3;
const KNOWN_FLAGS: u32 = ARGV_TRUNCATED | ARG_TRUNCATED | ARGV_UNREADABLE | FILENAME_TRUNCATED;

/// What of an exec did not fit its record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Truncation {
    /// More than [`ARGV_SLOTS`] arguments, or one too long to find the next
    /// after it: the rest are missing.
    pub argv: bool,
    /// An argument longer than its slot: the slot holds its prefix.
    pub arg: bool,
    /// The arguments could not be read from the new image (`argc` still
    /// says how many there were).
    pub argv_unreadable: bool,
    /// The filename could not be read or did not fit.
    pub filename: bool,
}

impl Truncation {
    fn from_bits(bits: u32) -> Self {
        Truncation {
            argv: bits & ARGV_TRUNCATED != 0,
            arg: bits & ARG_TRUNCATED != 0,
            argv_unreadable: bits & ARGV_UNREADABLE != 0,
            filename: bits & FILENAME_TRUNCATED != 0,
        }
    }

    fn bits(self) -> u32 {
        [
            (self.argv, ARGV_TRUNCATED),
            (self.arg, ARG_TRUNCATED),
            (self.argv_unreadable, ARGV_UNREADABLE),
            (self.filename, FILENAME_TRUNCATED),
        ]
        .into_iter()
        .filter(|(set, _)| *set)
        .fold(0, |bits, (_, bit)| bits | bit)
    }

    /// Whether anything is missing.
    pub fn any(self) -> bool {
        self.bits() != 0
    }
}

/// One traced exec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecRecord {
    /// cgroup v2 id of the task: the inode number of its cgroup directory.
    pub cgroup_id: u64,
    /// Thread-group id of the task that exec'ed.
    pub pid: u32,
    /// Thread-group id of its parent.
    pub ppid: u32,
    /// `comm` after the exec (the new program's name, at most 15 bytes).
    pub comm: String,
    /// The filename the exec was asked for (as given: relative names stay
    /// relative), at most 255 bytes.
    pub filename: String,
    /// How many arguments the exec was given.
    pub argc: u32,
    /// The recorded arguments, in order: at most [`ARGV_SLOTS`], each at
    /// most [`ARG_LEN`]` - 1` bytes.
    pub argv: Vec<String>,
    /// The paths the open/exec programs judged for this exec, resolved as
    /// the kernel resolves them (symlinks followed, relative to the task's
    /// root): the binary, then a script's interpreter. Empty when no
    /// monitor policy observes the cgroup's execs there (or the open/exec
    /// backend is not loaded).
    pub resolved: Vec<String>,
    /// What did not fit.
    pub truncation: Truncation,
}

/// Why a ring buffer record is not one the kernel program wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is not [`RECORD_LEN`] bytes.
    #[error("record of {len} bytes, expected {RECORD_LEN}")]
    Length {
        /// Its length.
        len: usize,
    },
    /// A string field has no NUL, or bytes after its NUL (the record was
    /// not zeroed).
    #[error("field {field}: {what}")]
    Field {
        /// The field (`comm`, `filename`, `argv[3]`).
        field: String,
        /// What is wrong.
        what: &'static str,
    },
    /// A count or a flag the program never writes.
    #[error("{what}")]
    Header {
        /// What is wrong.
        what: String,
    },
}

fn u32_at(r: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&r[at..at + 4]);
    u32::from_ne_bytes(b)
}

/// The string in a NUL-terminated, zero-padded field: bytes up to the NUL,
/// as UTF-8 (invalid sequences replaced: a name that is not UTF-8 can match
/// no policy value, which are UTF-8).
fn field_str(bytes: &[u8], field: impl Fn() -> String) -> Result<String, DecodeError> {
    let Some(end) = bytes.iter().position(|b| *b == 0) else {
        return Err(DecodeError::Field {
            field: field(),
            what: "no terminating NUL",
        });
    };
    if bytes[end..].iter().any(|b| *b != 0) {
        return Err(DecodeError::Field {
            field: field(),
            what: "bytes after the NUL (the record was not zeroed)",
        });
    }
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Decodes one ring buffer record (`struct krt_exec_record`).
///
/// Pure and total: arbitrary bytes give an error, never a panic. Every
/// invariant the program keeps is checked, so a layout skew between the C
/// and the Rust side is an error here rather than garbage downstream.
pub fn decode_exec(record: &[u8]) -> Result<ExecRecord, DecodeError> {
    if record.len() != RECORD_LEN {
        return Err(DecodeError::Length { len: record.len() });
    }
    let flags = u32_at(record, FLAGS_AT);
    if flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::Header {
            what: format!("unknown flags {flags:#x}"),
        });
    }
    let argc = u32_at(record, ARGC_AT);
    let recorded = u32_at(record, RECORDED_AT) as usize;
    if recorded > ARGV_SLOTS || recorded as u64 > u64::from(argc) {
        return Err(DecodeError::Header {
            what: format!("{recorded} arguments recorded of argc {argc}"),
        });
    }
    let resolved_count = u32_at(record, RESOLVED_COUNT_AT) as usize;
    if resolved_count > RESOLVED_SLOTS {
        return Err(DecodeError::Header {
            what: format!("{resolved_count} resolved paths"),
        });
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&record[CGROUP_ID_AT..CGROUP_ID_AT + 8]);
    let comm = field_str(&record[COMM_AT..COMM_AT + COMM_LEN], || "comm".into())?;
    let filename = field_str(&record[FILENAME_AT..FILENAME_AT + FILENAME_LEN], || {
        "filename".into()
    })?;
    let mut argv = Vec::with_capacity(recorded);
    for i in 0..ARGV_SLOTS {
        let slot = &record[ARGV_AT + i * ARG_LEN..ARGV_AT + (i + 1) * ARG_LEN];
        if i < recorded {
            argv.push(field_str(slot, || format!("argv[{i}]"))?);
        } else if slot.iter().any(|b| *b != 0) {
            return Err(DecodeError::Field {
                field: format!("argv[{i}]"),
                what: "an unrecorded slot is not zero",
            });
        }
    }
    let mut resolved = Vec::with_capacity(resolved_count);
    for i in 0..RESOLVED_SLOTS {
        let slot = &record[RESOLVED_AT + i * FILENAME_LEN..RESOLVED_AT + (i + 1) * FILENAME_LEN];
        if i < resolved_count {
            resolved.push(field_str(slot, || format!("resolved[{i}]"))?);
        } else if slot.iter().any(|b| *b != 0) {
            return Err(DecodeError::Field {
                field: format!("resolved[{i}]"),
                what: "an unused slot is not zero",
            });
        }
    }
    Ok(ExecRecord {
        cgroup_id: u64::from_ne_bytes(id),
        pid: u32_at(record, PID_AT),
        ppid: u32_at(record, PPID_AT),
        comm,
        filename,
        argc,
        argv,
        resolved,
        truncation: Truncation::from_bits(flags),
    })
}

/// The record the program would write for `r` (tests and the fuzz round
/// trip). Strings longer than their field are cut to fit.
pub fn encode_exec(r: &ExecRecord) -> Vec<u8> {
    fn put_str(buf: &mut [u8], s: &str) {
        let n = s.len().min(buf.len().saturating_sub(1));
        buf[..n].copy_from_slice(&s.as_bytes()[..n]);
    }
    let mut out = vec![0u8; RECORD_LEN];
    out[CGROUP_ID_AT..CGROUP_ID_AT + 8].copy_from_slice(&r.cgroup_id.to_ne_bytes());
    out[PID_AT..PID_AT + 4].copy_from_slice(&r.pid.to_ne_bytes());
    out[PPID_AT..PPID_AT + 4].copy_from_slice(&r.ppid.to_ne_bytes());
    out[ARGC_AT..ARGC_AT + 4].copy_from_slice(&r.argc.to_ne_bytes());
    out[FLAGS_AT..FLAGS_AT + 4].copy_from_slice(&r.truncation.bits().to_ne_bytes());
    let recorded = r.argv.len().min(ARGV_SLOTS) as u32;
    out[RECORDED_AT..RECORDED_AT + 4].copy_from_slice(&recorded.to_ne_bytes());
    put_str(&mut out[COMM_AT..COMM_AT + COMM_LEN], &r.comm);
    put_str(
        &mut out[FILENAME_AT..FILENAME_AT + FILENAME_LEN],
        &r.filename,
    );
    for (i, a) in r.argv.iter().take(ARGV_SLOTS).enumerate() {
        put_str(
            &mut out[ARGV_AT + i * ARG_LEN..ARGV_AT + (i + 1) * ARG_LEN],
            a,
        );
    }
    let resolved = r.resolved.len().min(RESOLVED_SLOTS) as u32;
    out[RESOLVED_COUNT_AT..RESOLVED_COUNT_AT + 4].copy_from_slice(&resolved.to_ne_bytes());
    for (i, p) in r.resolved.iter().take(RESOLVED_SLOTS).enumerate() {
        put_str(
            &mut out[RESOLVED_AT + i * FILENAME_LEN..RESOLVED_AT + (i + 1) * FILENAME_LEN],
            p,
        );
    }
    out
}

/// Fuzzing entry point: decodes `data` and, when that succeeds with valid
/// UTF-8 fields, checks that encoding the record gives `data` back (the
/// decoder is then total and lossless).
///
/// Panics when that check fails, which is what a fuzzer looks for; never
/// called outside tests and fuzz targets.
#[doc(hidden)]
pub fn fuzz_decode_exec(data: &[u8]) {
    let Ok(r) = decode_exec(data) else {
        return;
    };
    let lossless = !r.comm.contains('\u{fffd}')
        && !r.filename.contains('\u{fffd}')
        && r.argv.iter().all(|a| !a.contains('\u{fffd}'))
        && r.resolved.iter().all(|a| !a.contains('\u{fffd}'));
    if lossless {
        assert!(encode_exec(&r) == data, "{r:?} re-encodes to other bytes");
    }
}

/// Kernel-side loss counters, summed over CPUs, cumulative since load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecTraceStats {
    /// Execs of gated cgroups lost because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Records sent with arguments missing or cut (argv or arg truncated).
    pub argv_truncated: u64,
    /// Records sent without the arguments (unreadable).
    pub argv_unreadable: u64,
}

/// What went wrong loading, programming or reading the tracer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecTraceError {
    /// The crate was built without BPF objects.
    #[error("built without BPF objects: install clang and rebuild")]
    NotBuilt,
    /// libbpf could not parse the embedded object.
    #[error("opening the exec tracer object failed: {message}")]
    Open {
        /// libbpf's error.
        message: String,
    },
    /// The kernel refused a map or the program.
    #[error("loading the exec tracer failed: {message}")]
    Load {
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
        /// What libbpf printed during the load (the verifier log of a
        /// refused program included), its last ~4 KiB.
        verifier_log: Option<String>,
    },
    /// The kernel refused to attach the program.
    #[error("attaching the exec tracer failed: {message}")]
    Attach {
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {message}")]
    Map {
        /// The map.
        map: &'static str,
        /// The operation.
        op: &'static str,
        /// The errno (E2BIG: the gate is full).
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// The ring buffer reader could not be set up.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Cgroup id 0 names no cgroup.
    #[error("cgroup id 0 names no cgroup")]
    InvalidCgroupId,
    /// The loaded object is not the one this handle was written for.
    #[error("exec tracer object: {what}")]
    Layout {
        /// What was unexpected.
        what: String,
    },
}

impl ExecTraceError {
    /// A stable snake_case name of the variant, for metric labels.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Self::NotBuilt => "not_built",
            Self::Open { .. } => "open",
            Self::Load { .. } => "load",
            Self::Attach { .. } => "attach",
            Self::Map { .. } => "map",
            Self::Ring(_) => "ring_buffer",
            Self::InvalidCgroupId => "invalid_cgroup_id",
            Self::Layout { .. } => "layout",
        }
    }
}

/// The loaded and attached tracer. Every method takes `&self` and the
/// handle is `Send + Sync`, so the gate can be programmed from one task
/// while another reads the records. Dropping it detaches the program.
#[derive(Debug)]
pub struct ExecTracer {
    inner: imp::Tracer,
}

impl ExecTracer {
    /// Loads the program and attaches it to `sched_process_exec`. Nothing
    /// is traced until a cgroup is admitted. Needs root.
    ///
    /// With `resolved`, the open/exec object's `oe_exec_resolved` map
    /// ([`crate::openexec::OpenExec::exec_resolved_map`]), records carry
    /// the paths the open/exec programs resolved for each exec; without
    /// it, the tracer has a map of its own that nothing fills.
    pub fn load(resolved: Option<&libbpf_rs::MapHandle>) -> Result<Self, ExecTraceError> {
        imp::Tracer::load(resolved).map(|inner| Self { inner })
    }

    /// Lets cgroup `cgroup_id` produce records. Idempotent.
    pub fn admit(&self, cgroup_id: u64) -> Result<(), ExecTraceError> {
        self.inner.admit(cgroup_id)
    }

    /// Stops cgroup `cgroup_id` from producing records. Returns whether it
    /// was admitted.
    pub fn revoke(&self, cgroup_id: u64) -> Result<bool, ExecTraceError> {
        self.inner.revoke(cgroup_id)
    }

    /// The kernel's loss counters, summed over CPUs, cumulative.
    pub fn read_stats(&self) -> Result<ExecTraceStats, ExecTraceError> {
        self.inner.read_stats()
    }

    /// A reader of the record ring buffer (each reader consumes what it
    /// reads; the daemon keeps one).
    pub fn reader(&self) -> Result<RecordReader<ExecRecord>, ExecTraceError> {
        self.inner.reader()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ExecRecord {
        ExecRecord {
            cgroup_id: 4242,
            pid: 77,
            ppid: 1,
            comm: "curl".into(),
            filename: "/usr/bin/curl".into(),
            argc: 3,
            argv: vec!["curl".into(), "".into(), "-sS".into()],
            resolved: vec!["/usr/bin/curl".into()],
            truncation: Truncation::default(),
        }
    }

    #[test]
    fn round_trips_a_record_with_an_empty_argument() {
        let bytes = encode_exec(&sample());
        assert_eq!(bytes.len(), RECORD_LEN);
        assert_eq!(decode_exec(&bytes), Ok(sample()));
        fuzz_decode_exec(&bytes);
    }

    #[test]
    fn keeps_the_truncation_flags() {
        let mut r = sample();
        r.argc = 20;
        r.truncation = Truncation {
            argv: true,
            arg: true,
            argv_unreadable: false,
            filename: true,
        };
        assert_eq!(decode_exec(&encode_exec(&r)), Ok(r));
    }

    #[test]
    fn refuses_bad_lengths_counts_and_flags() {
        let good = encode_exec(&sample());
        assert_eq!(
            decode_exec(&good[1..]),
            Err(DecodeError::Length {
                len: RECORD_LEN - 1
            })
        );
        let mut more_than_argc = good.clone();
        more_than_argc[RECORDED_AT] = 4;
        assert!(matches!(
            decode_exec(&more_than_argc),
            Err(DecodeError::Header { .. })
        ));
        let mut flags = good.clone();
        flags[FLAGS_AT] = 0x80;
        assert!(matches!(
            decode_exec(&flags),
            Err(DecodeError::Header { .. })
        ));
    }

    #[test]
    fn refuses_a_record_that_was_not_zeroed() {
        let good = encode_exec(&sample());
        // Bytes after the filename's NUL: the tail of an earlier record.
        let mut stale = good.clone();
        stale[FILENAME_AT + 40] = b'x';
        assert_eq!(
            decode_exec(&stale),
            Err(DecodeError::Field {
                field: "filename".into(),
                what: "bytes after the NUL (the record was not zeroed)"
            })
        );
        // A slot past the recorded ones holding another exec's argument.
        let mut slot = good.clone();
        slot[ARGV_AT + 5 * ARG_LEN] = b'y';
        assert!(matches!(
            decode_exec(&slot),
            Err(DecodeError::Field { field, .. }) if field == "argv[5]"
        ));
        // A string with no NUL at all.
        let mut comm = good;
        comm[COMM_AT..COMM_AT + COMM_LEN].fill(b'a');
        assert!(matches!(
            decode_exec(&comm),
            Err(DecodeError::Field { field, what: "no terminating NUL" }) if field == "comm"
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut bytes = vec![0u8; RECORD_LEN];
        for _ in 0..2000 {
            for b in bytes.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Mostly zeros, so some records get far into the decoder.
                *b = if seed % 5 == 0 { seed as u8 } else { 0 };
            }
            fuzz_decode_exec(&bytes);
        }
    }

    #[test]
    fn handles_can_move_to_their_tasks() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<ExecTracer>();
        send::<RecordReader<ExecRecord>>();
    }

    #[cfg(krt_bpf_stub)]
    #[test]
    fn stub_load_says_how_to_fix_the_build() {
        assert_eq!(
            ExecTracer::load(None).unwrap_err(),
            ExecTraceError::NotBuilt
        );
    }
}
