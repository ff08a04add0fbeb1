//! The DNS question observer: which names a pod asks for, one record per
//! question (`bpf/dns/query.bpf.c`).
//!
//! One `cgroup_skb/egress` program reads the QNAME of every UDP datagram a
//! gated cgroup sends to port 53 and submits it to a ring buffer in the
//! normalised wire form of [`name`] (`struct domain_key`). It observes and
//! never enforces: every path returns 1 (pass).
//!
//! - **One object for the node.** cgroup_skb programs attach per cgroup, so
//!   observing N containers means N [`DnsLink`]s to one [`DnsObserver`]:
//!   one ring buffer, one [`DnsReader`], one gate.
//! - **The gate.** The program first looks the skb's cgroup id up in the
//!   `krt_dns_cgids` hash ([`DnsObserver::admit`], [`DnsObserver::revoke`])
//!   and returns at once when it is absent, so an attached but unselected
//!   pod costs one hash lookup per datagram and its questions never enter
//!   the buffer. That is a privacy boundary as much as an efficiency one.
//!   Attach first and admit after; revoke first and detach after (a link
//!   without admission produces nothing, an admission without a link is
//!   harmless).
//! - **Loss is counted, never silent** ([`DnsStats`], in the kernel, and
//!   [`DnsReader::undecodable`], here): `ringbuf_full` when the reader is
//!   behind (the buffer holds about 450 records), `name_unreadable` for a
//!   gated question to port 53 whose name is truncated, compressed, of a
//!   reserved label type or longer than the key, and `undecodable` for a
//!   record [`decode_query`] rejects (the C and Rust layouts would have to
//!   disagree), which is dropped without stopping the reader.
//!
//! What is not observed: TCP/53, DNS over TLS or HTTPS, answers, query
//! types, questions after the first of a message, IPv6 datagrams whose UDP
//! header sits behind more than six extension headers or behind AH/ESP,
//! and non-first fragments. A datagram with an empty payload or a header
//! with no question asked nothing and is passed without a count.
//!
//! The kernel side is behind [`DnsObserver`], [`DnsReader`] and
//! [`DnsLink`]; the record decoding ([`decode_query`], [`name`]) is pure and
//! needs no privileges. In a build without BPF objects (see the crate docs)
//! [`DnsObserver::load`] fails with [`DnsError::NotBuilt`].

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod name;

#[cfg(test)]
mod fuzz;
#[cfg(not(krt_bpf_stub))]
mod kernel;
#[cfg(krt_bpf_stub)]
mod stub;

#[cfg(not(krt_bpf_stub))]
use kernel as imp;
#[cfg(krt_bpf_stub)]
use stub as imp;

use name::{NameError, DOMAIN_KEY_LEN};

/// Result of the observer's operations.
pub type Result<T, E = DnsError> = std::result::Result<T, E>;

/// Bytes of one ring buffer record, `struct dns_query_event`: the cgroup id
/// (native-endian `u64`) then the [`name::DomainKey`].
pub const RECORD_LEN: usize = QNAME_AT + DOMAIN_KEY_LEN;

/// Offset of `cgroup_id` in a record (checked against the skeleton's type
/// at compile time).
pub(crate) const CGROUP_ID_AT: usize = 0;
/// Offset of `qname` in a record (checked like [`CGROUP_ID_AT`]).
pub(crate) const QNAME_AT: usize = 8;

/// One observed question.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsQuestion {
    /// cgroup v2 id of the sending socket: the inode number of its cgroup
    /// directory, which attribution maps to a container.
    pub cgroup_id: u64,
    /// The question's name, lowercase, dotted, without a trailing dot (`"."`
    /// for the root), bytes outside `!`..=`~` escaped as `\DDD` (see
    /// [`name`]).
    pub qname: String,
}

/// Kernel-side loss counters, summed over CPUs, cumulative since load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnsStats {
    /// Questions lost because the ring buffer was full (the reader is
    /// behind).
    pub ringbuf_full: u64,
    /// Gated datagrams to port 53 whose name could not be read: truncated,
    /// compressed, a reserved label type, or over the key width.
    pub name_unreadable: u64,
}

/// Why a ring buffer record is not a question the kernel program wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is not [`RECORD_LEN`] bytes.
    #[error("record of {len} bytes, expected {RECORD_LEN}")]
    Length {
        /// Its length.
        len: usize,
    },
    /// The name breaks an invariant of the key encoding.
    #[error("bad qname: {0}")]
    Name(#[from] NameError),
}

/// Decodes one ring buffer record (`struct dns_query_event`).
///
/// Pure and total: arbitrary bytes give an error, never a panic. The
/// reader counts a rejected record as `undecodable` and goes on.
pub fn decode_query(record: &[u8]) -> Result<DnsQuestion, DecodeError> {
    if record.len() != RECORD_LEN {
        return Err(DecodeError::Length { len: record.len() });
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&record[CGROUP_ID_AT..CGROUP_ID_AT + 8]);
    let qname = name::decode_key(&record[QNAME_AT..])?;
    Ok(DnsQuestion {
        cgroup_id: u64::from_ne_bytes(id),
        qname,
    })
}

/// Fuzzing entry point: decodes `data` as a record and, when that
/// succeeds, checks that re-encoding the name gives the record's key back
/// (the decoder is then both total and lossless).
///
/// Panics when that check fails, which is what a fuzzer looks for; it is
/// never called outside tests and fuzz targets.
#[doc(hidden)]
pub fn fuzz_decode_query(data: &[u8]) {
    let Ok(q) = decode_query(data) else {
        return;
    };
    match name::encode_name(&q.qname) {
        Ok(key) => assert!(
            key[..] == data[QNAME_AT..],
            "{:?} re-encodes to other bytes",
            q.qname
        ),
        Err(e) => panic!("decoded name {:?} does not re-encode: {e}", q.qname),
    }
}

/// What went wrong loading, programming or reading the observer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The crate was built without BPF objects (no clang, or
    /// `KRT_BPF_STUB=1`).
    #[error("built without BPF objects: install clang and rebuild")]
    NotBuilt,
    /// libbpf could not parse the embedded object (a broken build).
    #[error("opening the DNS observer object failed: {message}")]
    Open {
        /// libbpf's error.
        message: String,
    },
    /// The kernel refused a map or the program.
    #[error("loading the DNS observer failed: {message}")]
    Load {
        /// The errno, when there is one (EPERM without privileges, EINVAL
        /// or EACCES from the verifier, ...).
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
        /// What libbpf printed during the load (the verifier log of a
        /// refused program included), its last ~4 KiB; `None` when empty.
        verifier_log: Option<String>,
    },
    /// The cgroup directory could not be opened.
    #[error("cannot open cgroup directory {}: {message}", path.display())]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// The I/O error.
        message: String,
    },
    /// The kernel refused to attach the program to a cgroup.
    #[error("attaching the DNS observer to {} failed: {message}", path.display())]
    Attach {
        /// The cgroup directory.
        path: PathBuf,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {message}")]
    Map {
        /// The map (`krt_dns_cgids`, `krt_dns_stats`).
        map: &'static str,
        /// The operation (`update`, `delete`, `lookup`).
        op: &'static str,
        /// The errno, when there is one (E2BIG: the gate is full).
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// Setting up or polling the ring buffer failed.
    #[error("ring buffer {op} failed: {message}")]
    RingBuffer {
        /// `setup` or `poll`.
        op: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// `BPF_PROG_TEST_RUN` failed (e.g. EINVAL for a frame shorter than an
    /// Ethernet header).
    #[error("test run failed: {message}")]
    TestRun {
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// Cgroup id 0 names no cgroup (the kernel's ids start at 1), and is
    /// what the program sees for an skb it cannot attribute.
    #[error("cgroup id 0 names no cgroup")]
    InvalidCgroupId,
    /// The loaded object lacks a map or program, or a map returned data of
    /// an unexpected shape: the handle and the object disagree (a build
    /// skew).
    #[error("DNS observer object: {what}")]
    Layout {
        /// What was unexpected.
        what: String,
    },
}

impl DnsError {
    /// A stable snake_case name of the variant, for metric labels.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Self::NotBuilt => "not_built",
            Self::Open { .. } => "open",
            Self::Load { .. } => "load",
            Self::Cgroup { .. } => "cgroup",
            Self::Attach { .. } => "attach",
            Self::Map { .. } => "map",
            Self::RingBuffer { .. } => "ring_buffer",
            Self::TestRun { .. } => "test_run",
            Self::InvalidCgroupId => "invalid_cgroup_id",
            Self::Layout { .. } => "layout",
        }
    }

    /// The verifier (libbpf) log of a [`DnsError::Load`].
    pub fn verifier_log(&self) -> Option<&str> {
        match self {
            Self::Load { verifier_log, .. } => verifier_log.as_deref(),
            _ => None,
        }
    }
}

/// The loaded observer: its program and maps.
///
/// Loading attaches nothing: the program runs where [`Self::attach`] puts
/// it, and through [`Self::test_run`]. Every method takes `&self` and the
/// handle is `Send + Sync`, so the gate can be programmed from one task
/// while another reads the questions ([`Self::reader`]). Dropping it
/// unloads the program once no [`DnsLink`] holds it; a [`DnsReader`]
/// keeps the ring buffer alive on its own.
#[derive(Debug)]
pub struct DnsObserver {
    inner: imp::Observer,
}

impl DnsObserver {
    /// Loads the program and creates its (empty) maps.
    ///
    /// Probes first whether `cgroup_skb` programs may call
    /// `bpf_get_current_cgroup_id` (Linux 5.10 and 6.1 refuse it there):
    /// the program falls back to the current task's cgroup for an skb
    /// without a socket only where it may, and the verifier drops the call
    /// elsewhere. Fails with [`DnsError::Load`], carrying the verifier log,
    /// when the kernel refuses the object, and with [`DnsError::NotBuilt`]
    /// in a stub build. Needs root (`CAP_BPF` and `CAP_NET_ADMIN`).
    ///
    /// Captures libbpf's process-global log callback for its duration, so
    /// it must not run concurrently with a probe or another backend's load.
    pub fn load() -> Result<Self> {
        imp::Observer::load().map(|inner| Self { inner })
    }

    /// Whether the loaded program falls back to `bpf_get_current_cgroup_id`
    /// when `bpf_skb_cgroup_id` is 0 (see [`Self::load`]).
    pub fn uses_current_cgroup_fallback(&self) -> bool {
        self.inner.uses_current_cgroup_fallback()
    }

    /// Lets cgroup `cgroup_id` (the inode number of its cgroup v2
    /// directory) produce records. Idempotent. Fails with
    /// [`DnsError::Map`] (E2BIG) when the gate's 8192 entries are taken.
    pub fn admit(&self, cgroup_id: u64) -> Result<()> {
        self.inner.admit(cgroup_id)
    }

    /// Stops cgroup `cgroup_id` from producing records. Returns whether it
    /// was admitted.
    pub fn revoke(&self, cgroup_id: u64) -> Result<bool> {
        self.inner.revoke(cgroup_id)
    }

    /// The kernel's loss counters, summed over CPUs, cumulative since load
    /// (a caller reporting deltas keeps the previous reading).
    pub fn read_stats(&self) -> Result<DnsStats> {
        self.inner.read_stats()
    }

    /// Attaches the program to the egress of the cgroup v2 directory
    /// `cgroup_dir` (and its descendants). It stays attached while the link
    /// lives. Only admitted cgroups produce records.
    pub fn attach(&self, cgroup_dir: &Path) -> Result<DnsLink> {
        let cgroup_id = crate::cgroup_attach::cgroup_id(cgroup_dir).map_err(|e| match e {
            crate::cgroup_attach::AttachError::Cgroup {
                path,
                errno,
                message,
            }
            | crate::cgroup_attach::AttachError::Attach {
                path,
                errno,
                message,
                ..
            } => DnsError::Cgroup {
                path,
                errno,
                message,
            },
        })?;
        self.inner.attach(cgroup_dir).map(|inner| DnsLink {
            cgroup_id,
            _inner: inner,
        })
    }

    /// Attaches to `cgroup_dir`, *then* admits its cgroup to the gate (the
    /// specification's order: a cgroup whose attach failed never sits in
    /// the gate reading as observed while producing nothing). If the admit
    /// fails the link is dropped again and the error returned.
    pub fn attach_admitted(&self, cgroup_dir: &Path) -> Result<DnsLink> {
        let link = self.attach(cgroup_dir)?;
        self.admit(link.cgroup_id)?;
        Ok(link)
    }

    /// Revokes the cgroup of `link` from the gate, *then* detaches it (an
    /// id admitted after its link is gone is harmless; a link left open
    /// after revocation runs the program for nothing). Returns whether it
    /// was admitted; the link is dropped even if the revoke fails.
    pub fn revoke_and_detach(&self, link: DnsLink) -> Result<bool> {
        // `link` is dropped (detached) when this returns: after the revoke.
        self.revoke(link.cgroup_id)
    }

    /// A reader of the question ring buffer. Each reader consumes what it
    /// reads; the daemon keeps one.
    pub fn reader(&self) -> Result<DnsReader> {
        self.inner.reader().map(|inner| DnsReader { inner })
    }

    /// Runs the program once on `frame` with `BPF_PROG_TEST_RUN` and
    /// returns its verdict (always 1, pass).
    ///
    /// `frame` is an Ethernet frame: the kernel derives `skb->protocol` from
    /// its EtherType and strips it, so the program sees the IP header
    /// first. There is no real socket: the skb's cgroup is the calling
    /// process's cgroup v2, which must be admitted for a record to appear.
    pub fn test_run(&self, frame: &[u8]) -> Result<u32> {
        self.inner.test_run(frame)
    }
}

/// The observer's attachment to one cgroup; detached on drop.
#[derive(Debug)]
pub struct DnsLink {
    /// The cgroup's id (its directory's inode when attached).
    cgroup_id: u64,
    // Held for its drop, which detaches.
    _inner: imp::Link,
}

impl DnsLink {
    /// The id of the cgroup attached to.
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }
}

/// Reads and decodes the question ring buffer.
///
/// `Send`, not `Sync`: it belongs to the one task that drains the buffer.
#[derive(Debug)]
pub struct DnsReader {
    inner: crate::ring::RecordReader<DnsQuestion>,
}

impl DnsReader {
    /// Waits up to `timeout` for records (not at all for
    /// [`Duration::ZERO`]), then returns every question available, oldest
    /// first. Records [`decode_query`] rejects are counted in
    /// [`Self::undecodable`] and skipped. An interrupted wait returns what
    /// it has.
    pub fn poll_questions(&mut self, timeout: Duration) -> Result<Vec<DnsQuestion>> {
        self.inner.poll(timeout).map_err(|e| match e {
            crate::ring::RingError::Setup { errno, message, .. }
            | crate::ring::RingError::Read { errno, message, .. } => DnsError::RingBuffer {
                op: "poll",
                errno,
                message,
            },
        })
    }

    /// Records this reader dropped as undecodable, cumulative.
    pub fn undecodable(&self) -> u64 {
        self.inner.undecodable()
    }

    /// The generic record reader underneath, for an event loop (its
    /// readiness descriptor and non-blocking reads).
    pub fn into_records(self) -> crate::ring::RecordReader<DnsQuestion> {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cgroup_id: u64, wire: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; RECORD_LEN];
        r[..8].copy_from_slice(&cgroup_id.to_ne_bytes());
        r[QNAME_AT..QNAME_AT + wire.len()].copy_from_slice(wire);
        r
    }

    #[test]
    fn decodes_a_valid_record() {
        let r = record(4242, b"\x03www\x07example\x03com\x00");
        assert_eq!(
            decode_query(&r),
            Ok(DnsQuestion {
                cgroup_id: 4242,
                qname: "www.example.com".into()
            })
        );
        fuzz_decode_query(&r);
    }

    #[test]
    fn rejects_a_truncated_or_long_record() {
        let r = record(1, b"\x01a\x00");
        assert_eq!(
            decode_query(&r[..RECORD_LEN - 1]),
            Err(DecodeError::Length {
                len: RECORD_LEN - 1
            })
        );
        assert_eq!(decode_query(&[]), Err(DecodeError::Length { len: 0 }));
        let mut long = r.clone();
        long.push(0);
        assert_eq!(
            decode_query(&long),
            Err(DecodeError::Length {
                len: RECORD_LEN + 1
            })
        );
    }

    #[test]
    fn rejects_bad_label_lengths() {
        // A compression pointer, a reserved label type, a label past the end.
        for (wire, at, len) in [(&b"\xc0\x0c"[..], 0, 0xc0), (&b"\x03www\x80"[..], 4, 0x80)] {
            assert_eq!(
                decode_query(&record(1, wire)),
                Err(DecodeError::Name(NameError::LabelTooLong { at, len })),
                "{wire:?}"
            );
        }
        let mut r = record(1, b"");
        r[QNAME_AT] = 63;
        r[QNAME_AT + 1..QNAME_AT + 64].fill(b'a');
        r[QNAME_AT + 64] = 63;
        r[QNAME_AT + 65..].fill(b'b');
        assert_eq!(
            decode_query(&r),
            Err(DecodeError::Name(NameError::Unterminated))
        );
    }

    #[test]
    fn rejects_non_zero_padding_and_uppercase() {
        let mut r = record(1, b"\x01a\x00");
        r[RECORD_LEN - 1] = 1;
        assert_eq!(
            decode_query(&r),
            Err(DecodeError::Name(NameError::Padding { at: 127 }))
        );
        assert_eq!(
            decode_query(&record(1, b"\x01A\x00")),
            Err(DecodeError::Name(NameError::Uppercase { at: 1 }))
        );
    }

    #[test]
    fn handles_can_move_to_their_tasks() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<DnsObserver>();
        send_sync::<DnsLink>();
        send::<DnsReader>();
        send_sync::<DnsError>();
    }

    #[test]
    fn metric_labels_are_snake_case() {
        assert_eq!(DnsError::NotBuilt.metric_label(), "not_built");
        assert_eq!(
            DnsError::InvalidCgroupId.metric_label(),
            "invalid_cgroup_id"
        );
        let e = DnsError::Load {
            errno: Some(13),
            message: "x".into(),
            verifier_log: Some("R1 invalid mem access".into()),
        };
        assert_eq!(e.verifier_log(), Some("R1 invalid mem access"));
        assert_eq!(DnsError::NotBuilt.verifier_log(), None);
    }

    #[cfg(krt_bpf_stub)]
    #[test]
    fn stub_load_says_how_to_fix_the_build() {
        assert_eq!(DnsObserver::load().unwrap_err(), DnsError::NotBuilt);
    }
}
