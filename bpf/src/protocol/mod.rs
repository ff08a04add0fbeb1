//! The application protocol classifier: one `cgroup_skb/egress` program
//! (`bpf/protocol/classifier.bpf.c`) serving every gated pod on the node,
//! and its typed handle, [`ProtocolClassifier`].
//!
//! # Model
//!
//! A *rule set* (a `u32` the caller chooses, e.g. one per pod) is a pair of
//! allow and deny lists of [`ProtoKey`]s (a [`Protocol`], for TLS optionally
//! narrowed to the first offered [`Alpn`] name) plus [`ProtoFlags`].
//! Cgroups are mapped to one set each with
//! [`ProtocolClassifier::set_filter`]. The kernel side is one object
//! whatever the number of pods:
//!
//! | map | type | key | value |
//! | --- | --- | --- | --- |
//! | `proto_cgroups` | hash, 2^14 | `u64` cgroup id | `struct krt_proto_gate { u32 set_id; u32 flags; }` |
//! | `allowed_protos`, `banned_protos` | hash, 2^12 | `struct krt_proto_key { u32 set_id; u32 proto_id; char alpn[16]; }` | `u8` (unused) |
//! | `proto_flows` | LRU hash, 2^16 | `struct krt_flow_key { u64 cgroup_id; u8 saddr[16], daddr[16]; be16 sport, dport; u8 l4proto, family, pad[2]; }` | `struct krt_flow_verdict { u64 generation; u32 proto_id, decision; char alpn[16]; }` |
//! | `proto_events` | hash, 2^12 | `struct krt_proto_event_key { u64 cgroup_id; u32 proto_id, decision; char alpn[16]; }` | `u64` flows |
//! | `proto_stats` | per-CPU array, 1 | `u32` 0 | `struct krt_proto_stats` |
//! | `proto_generation` | array, 1 | `u32` 0 | `u64`, bumped by every rule or gate change |
//!
//! Every key is padding-free; an all-zero `alpn` in a rule key means "this
//! protocol with any ALPN (or none)". The flag bits (`1` default deny, `2`
//! observe) are the IP filter's.
//!
//! # Classification
//!
//! The verdict of a flow (its 5-tuple, IPv6 included, and its cgroup) is
//! decided on its first data segment (TCP) or first datagram (UDP), where
//! the protocol evidence is: TCP packets without payload pass with the
//! verdict deferred. The evidence recognised, in this order:
//!
//! - TCP: a TLS record (content type 22, version 3.x) holding a whole
//!   ClientHello, walked to its first offered ALPN name ([`Protocol::Tls`]);
//!   the `SSH-` banner ([`Protocol::Ssh`]); the 24-byte HTTP/2 cleartext
//!   preface ([`Protocol::Http2`]); an HTTP/1 method token (`GET`, `POST`,
//!   `PUT`, `HEAD`, `DELETE`, `OPTIONS`, `PATCH`, `CONNECT`, `TRACE`)
//!   followed by a space ([`Protocol::Http1`]).
//! - UDP: a QUIC version 1 long header ([`Protocol::Quic`]); a cleartext
//!   DNS query, by header sanity and a QNAME walk, whatever the port
//!   ([`Protocol::Dns`]).
//! - Anything else is [`Protocol::Unclassified`], and so is everything that
//!   cannot be parsed within the segment and the walk bounds: a ClientHello
//!   split across segments or records, more than 32 extensions before
//!   ALPN, an ALPN list of more than 8 names or a first name over 16 bytes,
//!   truncated or fragmented IP headers, an IPv6 extension header, any L4
//!   but TCP and UDP. Never a guess: under default deny such a flow is
//!   dropped, otherwise it passes (unless a rule names `unclassified`).
//!
//! The IP family comes from `skb->protocol`, never from the payload.
//!
//! # Decision
//!
//! Explicit deny > explicit allow > default deny > pass ([`Decision`]). The
//! program computes the decision, records it in `proto_events` (always for
//! a refusal, for any decision when the set observes), caches it in
//! `proto_flows`, then enforces it: a dropped
//! first segment stalls the connection, and every later packet of a denied
//! flow is dropped from the cache. Each flow is classified and counted
//! once; a rule or gate change makes the next packet of a cached flow
//! recompute its verdict from the cached classification (it is not
//! reclassified, and not counted again). A TCP SYN forgets the verdict of
//! its tuple, so a reused 5-tuple is classified afresh.
//!
//! # Building without clang
//!
//! In a stub build (see the crate docs) [`ProtocolClassifier::load`] fails
//! with [`ProtocolError::NotBuilt`]; the pure parts (the key types) work.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::cgroup_attach::{AttachError, CgroupLink};

#[cfg(not(krt_bpf_stub))]
mod kernel;
#[cfg(not(krt_bpf_stub))]
mod key;
#[cfg(not(krt_bpf_stub))]
#[doc(hidden)]
pub use key::fuzz_decode_maps;
#[cfg(krt_bpf_stub)]
mod stub;

#[cfg(not(krt_bpf_stub))]
use kernel as imp;
#[cfg(krt_bpf_stub)]
use stub as imp;

/// Result of the classifier's operations.
pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;

/// Bytes of an ALPN protocol name the kernel keys on.
pub const ALPN_MAX_LEN: usize = 16;

/// What the classifier recognises a flow as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// No protocol evidence, or evidence that could not be parsed.
    Unclassified,
    /// The `SSH-` banner (TCP).
    Ssh,
    /// A TLS ClientHello (TCP), with its first offered ALPN name if any.
    Tls,
    /// The HTTP/2 cleartext connection preface (TCP, "h2c" with prior
    /// knowledge).
    Http2,
    /// An HTTP/1 request line (TCP).
    Http1,
    /// A QUIC version 1 long header (UDP).
    Quic,
    /// A cleartext DNS query (UDP).
    Dns,
}

impl Protocol {
    /// Every protocol, in id order.
    pub const ALL: [Self; 7] = [
        Self::Unclassified,
        Self::Ssh,
        Self::Tls,
        Self::Http2,
        Self::Http1,
        Self::Quic,
        Self::Dns,
    ];

    /// The protocol's name in policies and reports (`ssh`, `tls`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unclassified => "unclassified",
            Self::Ssh => "ssh",
            Self::Tls => "tls",
            Self::Http2 => "http2",
            Self::Http1 => "http1",
            Self::Quic => "quic",
            Self::Dns => "dns",
        }
    }

    /// Whether the kernel sees an ALPN name for this protocol (only in a
    /// TLS ClientHello: QUIC's is encrypted).
    pub const fn has_alpn(self) -> bool {
        matches!(self, Self::Tls)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = ProtocolError;

    /// Parses a name of [`Protocol::name`] (exactly, lower case).
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ProtocolError::UnknownProtocol { name: s.to_owned() })
    }
}

/// An ALPN protocol name as the kernel keys on it: 1 to 16 bytes, none of
/// them NUL (keys are NUL-padded, so a NUL would alias a shorter name).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Alpn {
    len: u8,
    bytes: [u8; ALPN_MAX_LEN],
}

impl Alpn {
    /// Validates `name` (e.g. `b"h2"`, `"http/1.1"`).
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self> {
        let name = name.as_ref();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > ALPN_MAX_LEN {
            Some("it is longer than 16 bytes")
        } else if name.contains(&0) {
            Some("it contains a NUL byte")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ProtocolError::InvalidAlpn {
                name: String::from_utf8_lossy(name).into_owned(),
                reason,
            });
        }
        let mut bytes = [0u8; ALPN_MAX_LEN];
        bytes[..name.len()].copy_from_slice(name);
        Ok(Self {
            // At most ALPN_MAX_LEN (checked above), so it fits.
            len: name.len().try_into().unwrap_or(u8::MAX),
            bytes,
        })
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(ALPN_MAX_LEN)]
    }

    /// The NUL-padded 16 bytes of a kernel key.
    pub const fn padded(&self) -> [u8; ALPN_MAX_LEN] {
        self.bytes
    }

    /// The name in NUL-padded key bytes, `None` for all zeroes ("any").
    /// Fails on bytes no kernel key of a valid name can hold (a NUL
    /// followed by a non-NUL).
    #[cfg_attr(krt_bpf_stub, allow(dead_code))]
    pub(crate) fn from_padded(
        bytes: [u8; ALPN_MAX_LEN],
    ) -> Result<Option<Self>, [u8; ALPN_MAX_LEN]> {
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(ALPN_MAX_LEN);
        if bytes[len..].iter().any(|&b| b != 0) {
            return Err(bytes);
        }
        if len == 0 {
            return Ok(None);
        }
        Self::new(&bytes[..len]).map(Some).map_err(|_| bytes)
    }
}

impl fmt::Debug for Alpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Alpn({self})")
    }
}

impl fmt::Display for Alpn {
    /// The name, with bytes other than printable ASCII escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in self.as_bytes() {
            if b.is_ascii_graphic() {
                write!(f, "{}", char::from(b))?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// A rule's subject: a protocol, and for TLS optionally the first offered
/// ALPN name. Written `tls`, `tls/h2`, `tls/http/1.1` (the name is
/// everything after the first `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtoKey {
    protocol: Protocol,
    alpn: Option<Alpn>,
}

impl ProtoKey {
    /// `protocol` with any ALPN name, or none.
    pub const fn any(protocol: Protocol) -> Self {
        Self {
            protocol,
            alpn: None,
        }
    }

    /// `protocol` whose first offered ALPN name is `alpn`. Fails with
    /// [`ProtocolError::AlpnNotApplicable`] for a protocol the kernel sees
    /// no ALPN of (the rule could never match).
    pub fn with_alpn(protocol: Protocol, alpn: Alpn) -> Result<Self> {
        if !protocol.has_alpn() {
            return Err(ProtocolError::AlpnNotApplicable { protocol });
        }
        Ok(Self {
            protocol,
            alpn: Some(alpn),
        })
    }

    /// The protocol.
    pub const fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The ALPN name; `None` means any.
    pub const fn alpn(&self) -> Option<Alpn> {
        self.alpn
    }
}

impl From<Protocol> for ProtoKey {
    fn from(protocol: Protocol) -> Self {
        Self::any(protocol)
    }
}

impl fmt::Display for ProtoKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.alpn {
            None => write!(f, "{}", self.protocol),
            Some(alpn) => write!(f, "{}/{alpn}", self.protocol),
        }
    }
}

impl FromStr for ProtoKey {
    type Err = ProtocolError;

    /// Parses `proto` or `proto/alpn` (see the type's docs).
    fn from_str(s: &str) -> Result<Self> {
        match s.split_once('/') {
            None => s.parse().map(Self::any),
            Some((proto, alpn)) => Self::with_alpn(proto.parse()?, Alpn::new(alpn)?),
        }
    }
}

/// Which list of a set a rule belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Flows the set lets through (under default deny, the only ones).
    Allow,
    /// Flows the set drops, whatever the allow list says.
    Deny,
}

/// How a set treats what its lists do not decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ProtoFlags {
    /// Drop flows no allow rule matches (unclassified ones included).
    pub default_deny: bool,
    /// Count every flow's decision in `proto_events` (see
    /// [`ProtocolClassifier::drain_events`]), not only the refusals the
    /// program always counts. Never changes a verdict.
    pub observe: bool,
}

/// What the program decided for a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Decision {
    /// No rule matched and the set does not default-deny: passed.
    Pass,
    /// An allow rule matched (and no deny rule): passed.
    Allow,
    /// A deny rule matched: dropped.
    Deny,
    /// No rule matched under default deny: dropped.
    DefaultDeny,
}

impl Decision {
    /// Whether the flow's packets are dropped (the kernel's enforcement,
    /// `KernelDenied` in an event).
    pub const fn dropped(self) -> bool {
        matches!(self, Self::Deny | Self::DefaultDeny)
    }
}

/// The classifier's counters, summed over CPUs, since load.
///
/// Every packet of a gated cgroup adds one to [`Self::packets`]. A
/// decision adds one to exactly one per-protocol counter (`ssh` ...
/// `unclassified`): once per flow, or once per packet for packets without a
/// flow (truncated or fragmented IP headers, neither IPv4 nor IPv6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtoStats {
    /// Packets of gated cgroups.
    pub packets: u64,
    /// TCP packets without payload that passed before their flow had a
    /// verdict.
    pub deferred: u64,
    /// Packets decided by a cached flow verdict.
    pub cached: u64,
    /// Decisions for SSH flows.
    pub ssh: u64,
    /// Decisions for TLS flows.
    pub tls: u64,
    /// Decisions for HTTP/2 (preface) flows.
    pub http2: u64,
    /// Decisions for HTTP/1 flows.
    pub http1: u64,
    /// Decisions for QUIC flows.
    pub quic: u64,
    /// Decisions for DNS flows.
    pub dns: u64,
    /// Decisions for unclassified flows (and flowless packets).
    pub unclassified: u64,
    /// Inputs that could not be parsed (a subset of the unclassified):
    /// truncated or fragmented headers, unreadable bytes, a ClientHello
    /// or QUIC header that does not parse within the segment and bounds.
    pub parse_failures: u64,
    /// Packets dropped: denied first segments and every later packet of a
    /// denied flow.
    pub drops: u64,
    /// Decisions `proto_events` could not count (full map).
    pub events_lost: u64,
    /// Verdicts `proto_flows` refused to cache.
    pub flows_lost: u64,
}

impl ProtoStats {
    /// The decisions counted for `protocol`.
    pub const fn decided(&self, protocol: Protocol) -> u64 {
        match protocol {
            Protocol::Unclassified => self.unclassified,
            Protocol::Ssh => self.ssh,
            Protocol::Tls => self.tls,
            Protocol::Http2 => self.http2,
            Protocol::Http1 => self.http1,
            Protocol::Quic => self.quic,
            Protocol::Dns => self.dns,
        }
    }

    /// Every decision counted (flows, plus flowless packets).
    pub const fn decisions(&self) -> u64 {
        self.ssh + self.tls + self.http2 + self.http1 + self.quic + self.dns + self.unclassified
    }
}

/// Flows of one cgroup with one classification and decision, since the
/// previous drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtoEvent {
    /// The sending cgroup (v2 id).
    pub cgroup_id: u64,
    /// What the flows were classified as (the ALPN is the first offered
    /// name; `None` when there was none).
    pub key: ProtoKey,
    /// What the program decided for them.
    pub decision: Decision,
    /// How many flows (or flowless packets).
    pub count: u64,
}

/// Why a classifier operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The crate was built without BPF objects (no clang, or
    /// `KRT_BPF_STUB=1`).
    #[error("built without BPF objects: install clang and rebuild")]
    NotBuilt,
    /// libbpf could not parse the embedded object (a broken build).
    #[error("opening the protocol classifier object failed: {message}")]
    Open {
        /// libbpf's error.
        message: String,
    },
    /// The kernel refused the object: a map, the BTF or the program (the
    /// verifier).
    #[error("loading the protocol classifier failed: {message}")]
    Load {
        /// The errno of the failing call, when there is one.
        errno: Option<i32>,
        /// libbpf's error, with the errno's text.
        message: String,
        /// libbpf's log during the load (the verifier log of a refused
        /// program included), its last ~4 KiB; `None` when it was empty.
        verifier_log: Option<String>,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {message}")]
    Map {
        /// The map (`proto_cgroups`, `allowed_protos`, ...).
        map: &'static str,
        /// The operation (`update`, `delete`, `lookup`, ...).
        op: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A map is at its ceiling; nothing was inserted.
    #[error("map {map} is full ({max_entries} entries)")]
    MapFull {
        /// The map.
        map: &'static str,
        /// Its ceiling.
        max_entries: u32,
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
    /// A name that is not a [`Protocol`].
    #[error("{name:?} is not a protocol (expected one of unclassified, ssh, tls, http2, http1, quic, dns)")]
    UnknownProtocol {
        /// The name given.
        name: String,
    },
    /// An ALPN name the kernel cannot key on.
    #[error("{name:?} is not a usable ALPN protocol name: {reason}")]
    InvalidAlpn {
        /// The name given (lossily decoded).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An ALPN name on a protocol whose ALPN the kernel never sees.
    #[error("{protocol} rules cannot name an ALPN protocol (only tls can)")]
    AlpnNotApplicable {
        /// The protocol given.
        protocol: Protocol,
    },
    /// Cgroup id 0 names no cgroup (the kernel's ids start at 1).
    #[error("cgroup id 0 names no cgroup")]
    InvalidCgroupId,
    /// The kernel returned map data of an unexpected shape: the handle and
    /// the object disagree (a build skew); nothing was changed.
    #[error("map {map} returned {what}")]
    Layout {
        /// The map.
        map: &'static str,
        /// What was unexpected.
        what: String,
    },
    /// Attaching the program to a cgroup failed.
    #[error(transparent)]
    Attach(#[from] AttachError),
}

impl ProtocolError {
    /// A stable snake_case name of the variant, for metric labels.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Self::NotBuilt => "not_built",
            Self::Open { .. } => "open",
            Self::Load { .. } => "load",
            Self::Map { .. } => "map",
            Self::MapFull { .. } => "map_full",
            Self::TestRun { .. } => "test_run",
            Self::UnknownProtocol { .. } => "unknown_protocol",
            Self::InvalidAlpn { .. } => "invalid_alpn",
            Self::AlpnNotApplicable { .. } => "alpn_not_applicable",
            Self::InvalidCgroupId => "invalid_cgroup_id",
            Self::Layout { .. } => "layout",
            Self::Attach(AttachError::Cgroup { .. }) => "cgroup",
            Self::Attach(AttachError::Attach { .. }) => "attach",
        }
    }
}

/// The loaded classifier: its program and maps.
///
/// Nothing is attached at load: the program runs where
/// [`Self::attach_cgroup`] (or [`Self::attach`]) puts it, and through
/// [`Self::test_run`]. Every method takes `&self` (map updates
/// are atomic per entry in the kernel; rule changes are serialized with
/// their generation bump), and the handle is `Send + Sync`. Dropping it
/// unloads the program and frees every map not held elsewhere.
#[derive(Debug)]
pub struct ProtocolClassifier {
    inner: imp::Classifier,
}

impl ProtocolClassifier {
    /// Loads the program and creates its (empty) maps.
    ///
    /// Fails with [`ProtocolError::Load`], carrying the verifier log, when
    /// the kernel refuses it, and with [`ProtocolError::NotBuilt`] in a
    /// stub build. Needs `CAP_BPF` and `CAP_NET_ADMIN`, in practice root.
    pub fn load() -> Result<Self> {
        imp::Classifier::load().map(|inner| Self { inner })
    }

    /// [`load`](Self::load) with a test hook set: during the first packet
    /// of a gated cgroup the program itself raises that cgroup's default
    /// deny and bumps the generation, between its read of the generation
    /// and its read of the gate, as a concurrent update of the daemon
    /// would (issue 36). Tests only.
    #[cfg(feature = "host-tests")]
    pub fn load_with_update_between_reads() -> Result<Self> {
        imp::Classifier::load_with_update_between_reads().map(|inner| Self { inner })
    }

    /// Makes set `set_id` with `flags` apply to the packets of cgroup
    /// `cgroup_id` (replacing its previous set and flags, atomically).
    /// Cached verdicts of the cgroup's flows are recomputed under the new
    /// set at their next packet.
    ///
    /// `cgroup_id` is the kernel's id of a cgroup v2 directory: its inode
    /// number.
    pub fn set_filter(&self, cgroup_id: u64, set_id: u32, flags: ProtoFlags) -> Result<()> {
        self.inner.set_filter(cgroup_id, set_id, flags)
    }

    /// Stops classifying cgroup `cgroup_id`: its packets pass untouched
    /// again. Returns whether it was gated. Its set's rules stay.
    pub fn remove_cgroup(&self, cgroup_id: u64) -> Result<bool> {
        self.inner.remove_cgroup(cgroup_id)
    }

    /// Adds `key` to the allow or deny list of set `set_id` (a no-op if it
    /// is there already). Fails with [`ProtocolError::MapFull`] at the
    /// node-wide ceiling of that list.
    pub fn insert(&self, set_id: u32, verdict: Verdict, key: ProtoKey) -> Result<()> {
        self.inner.insert(set_id, verdict, key)
    }

    /// Removes `key` from the allow or deny list of set `set_id`. Returns
    /// whether it was there. Only that exact key goes (removing `tls/h2`
    /// leaves `tls`).
    pub fn remove(&self, set_id: u32, verdict: Verdict, key: ProtoKey) -> Result<bool> {
        self.inner.remove(set_id, verdict, key)
    }

    /// The counters, summed over CPUs, since load.
    pub fn read_stats(&self) -> Result<ProtoStats> {
        self.inner.read_stats()
    }

    /// Reads and resets the per-(cgroup, classification, decision) flow
    /// counts of observing sets.
    ///
    /// Each key present when the drain starts is removed with its count
    /// (atomically per key; on kernels before 5.14, which lack that
    /// operation for hash maps, flows counted between reading and removing
    /// a key are lost). Keys created during the drain stay for the next.
    /// The order is unspecified.
    pub fn drain_events(&self) -> Result<Vec<ProtoEvent>> {
        self.inner.drain_events()
    }

    /// Attaches the program to the egress of the cgroup v2 directory `dir`
    /// (and its descendants) as a multi-attach BPF link, programming
    /// nothing (ungated cgroups pass after one lookup). Prefer
    /// [`Self::attach_cgroup`].
    pub fn attach(&self, dir: &Path) -> Result<CgroupLink> {
        self.inner.attach(dir)
    }

    /// Gates cgroup `dir` (its id, the directory's inode) to rule set
    /// `set_id` with `flags`, *then* attaches the program, so the first
    /// packet it classifies already finds its rules (which should be
    /// inserted before). A failed attach removes the gate entry again.
    pub fn attach_cgroup(&self, dir: &Path, set_id: u32, flags: ProtoFlags) -> Result<CgroupLink> {
        let id = crate::cgroup_attach::cgroup_id(dir)?;
        self.set_filter(id, set_id, flags)?;
        match self.attach(dir) {
            Ok(link) => Ok(link),
            Err(e) => {
                // The attach error is the one to report; a leftover gate
                // entry is read by no program.
                let _ = self.remove_cgroup(id);
                Err(e)
            }
        }
    }

    /// Revokes the cgroup of `link` from the gate, *then* detaches it.
    /// Returns whether it was gated; the link is dropped even if the
    /// revoke fails (whose error is returned).
    pub fn detach_cgroup(&self, link: CgroupLink) -> Result<bool> {
        let revoked = self.remove_cgroup(link.cgroup_id());
        drop(link);
        revoked
    }

    /// Runs the program once on `frame` with `BPF_PROG_TEST_RUN` and
    /// returns its verdict: 1 pass, 0 drop.
    ///
    /// `frame` is an Ethernet frame: the kernel takes `skb->protocol` from
    /// its EtherType and strips the 14-byte header, so the program sees the
    /// IP header first, as on real egress. The packet's cgroup is the
    /// calling process's (the kernel gives the test skb a socket of this
    /// process; where it gives none, the program falls back to the current
    /// task's cgroup on kernels that allow that helper), so a test
    /// registers its own cgroup id with [`Self::set_filter`]. Counters,
    /// events and the flow cache are updated as for a real packet.
    pub fn test_run(&self, frame: &[u8]) -> Result<u32> {
        self.inner.test_run(frame)
    }

    /// Runs the program `repeat` times on `frame` with `BPF_PROG_TEST_RUN`
    /// and returns the last verdict and the kernel's mean time per run
    /// (for benchmarks). The first run classifies the flow; later runs of
    /// the same frame hit the flow cache.
    pub fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<crate::egress::TimedRun> {
        self.inner.test_run_repeat(frame, repeat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names_round_trip() {
        for p in Protocol::ALL {
            assert_eq!(p.name().parse::<Protocol>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let err = "SSH".parse::<Protocol>().unwrap_err();
        assert_eq!(err.metric_label(), "unknown_protocol");
        assert!(
            err.to_string().contains("\"SSH\" is not a protocol"),
            "{err}"
        );
    }

    #[test]
    fn alpn_names_are_validated() {
        let h2 = Alpn::new("h2").unwrap();
        assert_eq!(h2.as_bytes(), b"h2");
        let mut padded = [0u8; 16];
        padded[..2].copy_from_slice(b"h2");
        assert_eq!(h2.padded(), padded);
        assert_eq!(h2.to_string(), "h2");

        let sixteen = Alpn::new([b'a'; 16]).unwrap();
        assert_eq!(sixteen.as_bytes().len(), 16);
        assert_eq!(sixteen.padded(), [b'a'; 16]);

        for (bad, reason) in [
            (&b""[..], "it is empty"),
            (&[b'a'; 17][..], "it is longer than 16 bytes"),
            (&b"h\x002"[..], "it contains a NUL byte"),
        ] {
            match Alpn::new(bad) {
                Err(ProtocolError::InvalidAlpn { reason: r, .. }) => assert_eq!(r, reason),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(Alpn::new([0xff, b'x']).unwrap().to_string(), "\\xffx");
    }

    #[test]
    fn alpn_decodes_from_padded_key_bytes() {
        assert_eq!(Alpn::from_padded([0; 16]), Ok(None));
        assert_eq!(
            Alpn::from_padded(Alpn::new("http/1.1").unwrap().padded()),
            Ok(Some(Alpn::new("http/1.1").unwrap()))
        );
        assert_eq!(
            Alpn::from_padded([b'z'; 16]),
            Ok(Some(Alpn::new([b'z'; 16]).unwrap()))
        );
        let mut holey = [0u8; 16];
        holey[0] = b'a';
        holey[2] = b'b';
        assert_eq!(Alpn::from_padded(holey), Err(holey));
    }

    #[test]
    fn proto_keys_parse_and_print() {
        let tls_h2: ProtoKey = "tls/h2".parse().unwrap();
        assert_eq!(tls_h2.protocol(), Protocol::Tls);
        assert_eq!(tls_h2.alpn(), Some(Alpn::new("h2").unwrap()));
        assert_eq!(tls_h2.to_string(), "tls/h2");

        let http11: ProtoKey = "tls/http/1.1".parse().unwrap();
        assert_eq!(http11.alpn().unwrap().as_bytes(), b"http/1.1");
        assert_eq!(http11.to_string(), "tls/http/1.1");

        assert_eq!("ssh".parse::<ProtoKey>(), Ok(ProtoKey::any(Protocol::Ssh)));
        assert_eq!(ProtoKey::from(Protocol::Dns).to_string(), "dns");

        assert_eq!(
            "ssh/h2".parse::<ProtoKey>(),
            Err(ProtocolError::AlpnNotApplicable {
                protocol: Protocol::Ssh
            })
        );
        assert!(matches!(
            "tls/".parse::<ProtoKey>(),
            Err(ProtocolError::InvalidAlpn { .. })
        ));
        assert!(matches!(
            "ftp".parse::<ProtoKey>(),
            Err(ProtocolError::UnknownProtocol { .. })
        ));
    }

    #[test]
    fn decisions_know_whether_they_drop() {
        assert!(Decision::Deny.dropped());
        assert!(Decision::DefaultDeny.dropped());
        assert!(!Decision::Allow.dropped());
        assert!(!Decision::Pass.dropped());
    }

    #[test]
    fn stats_sum_decisions() {
        let s = ProtoStats {
            ssh: 1,
            tls: 2,
            http2: 4,
            http1: 8,
            quic: 16,
            dns: 32,
            unclassified: 64,
            ..ProtoStats::default()
        };
        assert_eq!(s.decisions(), 127);
        assert_eq!(s.decided(Protocol::Quic), 16);
        assert_eq!(s.decided(Protocol::Unclassified), 64);
    }

    #[test]
    fn metric_labels_name_the_variant() {
        assert_eq!(ProtocolError::NotBuilt.metric_label(), "not_built");
        assert_eq!(
            ProtocolError::InvalidCgroupId.metric_label(),
            "invalid_cgroup_id"
        );
        let full = ProtocolError::MapFull {
            map: "banned_protos",
            max_entries: 4,
        };
        assert_eq!(full.metric_label(), "map_full");
        assert_eq!(full.to_string(), "map banned_protos is full (4 entries)");
    }

    #[test]
    fn the_handle_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ProtocolClassifier>();
    }

    #[cfg(krt_bpf_stub)]
    #[test]
    fn a_stub_build_says_how_to_fix_it() {
        let err = ProtocolClassifier::load().unwrap_err();
        assert_eq!(err, ProtocolError::NotBuilt);
        assert!(err.to_string().contains("install clang and rebuild"));
    }
}
