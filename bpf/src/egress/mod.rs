//! The network egress filter: one `cgroup_skb/egress` program
//! (`bpf/egress/egress_filter.bpf.c`) serving every selected pod on the
//! node, and its typed handle, [`EgressFilter`].
//!
//! # Model
//!
//! A *filter set* (a `u32` the caller chooses, e.g. one per pod) is a pair
//! of allow and deny lists of IPv4 and IPv6 [`Prefix`]es of any length,
//! plus [`FilterFlags`]. Cgroups (container cgroup ids) are mapped to one
//! set each with [`EgressFilter::set_filter`]; the program, attached to
//! those cgroups, looks up the packet's cgroup, then the destination in
//! that set. The kernel side is one object whatever the number of pods:
//!
//! | map | type | key | value |
//! | --- | --- | --- | --- |
//! | `cgroup_filters` | hash, 2^14 | `u64` cgroup id | `struct krt_egress_filter { u32 set_id; u32 flags; }` |
//! | `egress_hosts` | hash, 2^18 | `struct krt_egress_host_key { u32 set_id, family; u8 addr[16]; }` | `struct krt_egress_host { u32 verdicts; }` (allow, deny bits) |
//! | `allow_v4`, `deny_v4` | LPM trie, 2^18 | `struct krt_egress_v4_key { u32 prefixlen; be32 set_id; u8 addr[4]; }` | `u8` (unused) |
//! | `allow_v6`, `deny_v6` | LPM trie, 2^18 | `struct krt_egress_v6_key { u32 prefixlen; be32 set_id; u8 addr[16]; }` | `u8` (unused) |
//! | `observations` | LRU hash, 2^14 | `struct krt_egress_obs_key { u32 set_id, decision, family; u8 addr[16]; }` | `u64` packets |
//! | `stats` | per-CPU array, 1 | `u32` 0 | `struct krt_egress_stats` (outcome counters) |
//! | `egress_generation` | array, 2 | `u32` slot | `u64` policy and learned generations (not pinned) |
//! | `egress_cpu_cache` | per-CPU array, 1,024 | `u32` a socket cookie's low bits | `struct krt_egress_cpu_cache`: the socket's cookie and its cached verdict, under a sequence count (not pinned) |
//!
//! | `egress_domains` | hash, 2^14 | `struct krt_egress_domain_key { domain_key name; u32 set_id; }` | `struct krt_egress_domain { u32 verdicts; u32 name_id; }` (allow, deny, observe bits) |
//! | `egress_learned` | hash (not preallocated, never evicts), 2^18 | `struct krt_egress_learned_key { u32 set_id, family; u8 addr[16]; }` | `struct krt_egress_learned { u64 expires_ns; u32 verdicts; u32 name_id; }` |
//! | `learned_share` | array, 1 | `u32` 0 | `u64` the entries of `egress_learned` each set may hold (not pinned) |
//! | `learned_budget` | hash, 2^14 | `u32` set id | `struct krt_egress_learned_budget { u64 inserted, over_share, answers_refused; }` (the snooper's side) |
//! | `learned_released` | hash, 2^14 | `u32` set id | `u64` entries userspace removed, less those it added |
//!
//! An LPM key's `prefixlen` counts the 32 set-id bits plus the address
//! prefix, so a lookup can never match another set's entry.
//!
//! A host entry (an IPv4 `/32`, an IPv6 `/128`) goes to `egress_hosts`,
//! whose value says which lists hold it; only shorter prefixes go to the
//! tries. So a destination costs one hash lookup whatever the number of
//! host entries, and a trie is walked only for a set with prefixes in it:
//! besides the caller's [`FilterFlags`], the handle keeps *occupancy*
//! bits in each cgroup's `cgroup_filters` entry (`HOSTS_V4`, `HOSTS_V6`,
//! `DENY_V4`, `ALLOW_V4`, `DENY_V6`, `ALLOW_V6` in `egress.h`) saying
//! which of the host map and the four tries its set has entries in, and
//! the program skips the others. A set of host entries only never walks a
//! trie. The handle sets a bit on every cgroup of the set before the
//! set's first entry of that kind is written and clears it after the last
//! one is removed, so an entry is never skipped. The split is invisible to
//! callers: [`EgressFilter::insert`] takes any prefix, and
//! [`EgressFilter::read_state`] reports host entries as `/32` and `/128`
//! prefixes.
//!
//! # Domain names: the DNS answer snooper
//!
//! A set may also name [`Domain`]s ([`EgressFilter::set_domain`]), on its
//! allow side, its deny side or both. Their addresses are learned in the
//! kernel from the answers to the cgroup's own DNS questions by a second
//! program, `cgroup_skb/ingress` `krt_dns_snoop`
//! (`bpf/dnssnoop/snoop.bpf.c`), which this handle loads over the
//! filter's own `cgroup_filters`, `egress_domains` and `egress_learned`
//! (its copies of them are never created: libbpf reuses the filter's
//! fds). For a cgroup whose flags have [`FilterFlags::domains`], it reads
//! each UDP datagram from port 53 (a response with one question), follows
//! the answer records owned by the question's name or by a name a CNAME
//! of the same response led to, and writes each A or AAAA address into
//! `egress_learned` for the set with the verdict bits of the names it was
//! reached through, expiring after the record's TTL clamped to
//! [`DNS_TTL_MIN`]..=[`DNS_TTL_MAX`]. It runs when the datagram is queued
//! to the socket, before the application reads it, so the address is
//! known before the first connect. The filter then treats an unexpired
//! learned address like an entry of the side its bits say.
//!
//! Only answers to questions the cgroup asked teach anything
//! (`bpf/include/dnsquestion.h`): the filter notes every DNS question a
//! cgroup whose set names domains sends to a *declared resolver*
//! ([`EgressFilter::set_dns_resolvers`]), keyed by the cgroup, the
//! resolver, the client's port and the transaction id, with its question
//! section; the snooper learns from a response only when it comes from a
//! declared resolver and answers such a question, unexpired
//! ([`DNS_QUESTION_TIMEOUT`]), with the same question section, and the
//! question is then consumed. A pod answering itself, an answer from
//! loopback or any undeclared address, a wrong id or port, and an
//! unsolicited or second answer are counted ([`SnoopStats::refused`]) and
//! teach nothing. A cgroup notes at most [`DNS_QUESTIONS_PER_S`] questions
//! a second, so it cannot flush its neighbours' pending questions.
//!
//! It is a convenience, not a containment boundary: DNS over TCP, TLS or
//! HTTPS is not read, an answer the pod cached before the set named the
//! domain teaches nothing, and an address shared with other names (a CDN,
//! a proxy) is allowed or denied for all of them. [`SnoopStats`] counts
//! what it read and every response it could not read to the end.
//!
//! The snooper is attached with [`EgressFilter::attach_snoop`], *before*
//! the cgroup is programmed and the filter attached (it is gated by
//! `cgroup_filters`, so it does nothing until then), and released after
//! the filter is detached. A kernel that refuses the snooper still gets
//! the filter: [`EgressFilter::snoop_error`] says why domains cannot be
//! served.
//!
//! # Verdict
//!
//! For a packet of a cgroup in `cgroup_filters` (others pass after that
//! one lookup), in this order:
//!
//! 1. a deny entry of the set (a host entry or a prefix) matches the
//!    destination: **drop** ([`Decision::Denied`]);
//! 2. an allow entry matches: pass ([`Decision::Allowed`]);
//! 3. the set is default deny: **drop** ([`Decision::DefaultDenied`]);
//! 4. otherwise pass ([`Decision::Unmatched`]).
//!
//! An explicit deny beats an allow whatever the prefix lengths (a `/0`
//! deny beats a `/32` allow), as the specification's union semantics
//! require: a set is the union of every matching policy's entries, and a
//! deny one policy asserts holds even where another allows. A header that
//! `skb->protocol` announces but that is truncated or malformed passes
//! unless the set is default deny; a packet that is neither IPv4 nor IPv6
//! passes. Both are counted in [`Stats`].
//!
//! [`FilterFlags::observe`] adds per-(set, destination, decision) counting,
//! drained with [`EgressFilter::drain_observations`]; with it off, the
//! program does no per-destination work.
//!
//! # Pinning and restarts
//!
//! [`EgressFilter::load_pinned`] pins every map under `<dir>/maps/<name>`
//! and every link [`EgressFilter::attach_cgroup`] makes under
//! `<dir>/links/<cgroup id>` (bpffs names cannot hold a `.`), so the
//! filter keeps enforcing after the process exits. A later `load_pinned`
//! over the same directory *adopts* them: the maps are reused before the
//! object loads (so the new program reads the very entries the old one
//! did), and each pinned link is opened and switched to the new program
//! atomically (`BPF_LINK_UPDATE`), so no packet of a filtered cgroup ever
//! passes unfiltered across the restart.
//!
//! The tries, `egress_hosts` and `cgroup_filters` hold per-cgroup
//! *unions*: which policy asked for an entry is not in them. A caller that
//! needs it back (the network backend does) records it in the *ledger*,
//! three more pinned maps the program never reads
//! ([`EgressFilter::ledger_set_policy`], [`EgressFilter::ledger_set_rule`],
//! [`EgressFilter::ledger_set_binding`]), and reads everything back with
//! [`EgressFilter::read_state`].
//!
//! | map | key | value |
//! | --- | --- | --- |
//! | `egress_meta` | `u32` 0 | `struct krt_egress_meta { u32 layout_version; u32 reserved; }` |
//! | `egress_policies` | policy id, NUL-padded to 64 bytes | `struct krt_egress_policy { u32 kind; u32 flags; }` |
//! | `egress_rules` | `struct krt_egress_rule_key { id[64]; u8 verdict, family, prefix_len, 0; u8 addr[16]; }` | `u8` |
//! | `egress_domain_rules` | `struct krt_egress_domain_rule_key { id[64]; u8 verdict, 0, 0, 0; domain_key name; }` | `u8` |
//! | `egress_bindings` | `struct krt_egress_binding_key { id[64]; u64 cgroup_id; }` | `u8` |
//!
//! The snooper's links are pinned beside the filter's, under
//! `<dir>/snoop_links/<cgroup id>`, and adopted the same way.
//!
//! `egress_meta` holds the [`LAYOUT_VERSION`] of the build that created
//! the pins. Pins of another version, or an incomplete set, or maps whose
//! type, sizes or flags differ from this object's, are *discarded*: the
//! map pins are removed and fresh maps pinned ([`PinOutcome::Discarded`]
//! says why, for the caller's log). Their links are not removed then: they
//! hold the old program and the old maps, and keep enforcing the old state
//! until the caller replaces them (attaching the cgroup anew replaces the
//! pin atomically) or releases them ([`PinnedLinks::stale`]). A link whose
//! cgroup was removed meanwhile (the kernel reports cgroup id 0 for it) is
//! unpinned at load.
//!
//! The directory carries the layout marker of [`crate::pins`], written
//! before the first pin; [`EgressFilter::remove_pins`] removes exactly the
//! pins of that layout (anything else in the directory stays): each link
//! detaches once no fd holds it any more (after an RCU grace period).
//!
//! # Building without clang
//!
//! In a stub build (see the crate docs) [`EgressFilter::load`] fails with
//! [`EgressError::NotBuilt`]; the pure parts ([`Prefix`], the types) work.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use crate::cgroup_attach::{AttachError, CgroupLink};

mod bench;
mod domain;
mod evictions;
mod prefix;

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

pub use bench::{FloorProgram, TimedRun};
pub use domain::{Domain, DomainVerdicts, Learned};
pub use evictions::Evictions;
pub use prefix::Prefix;

/// The shortest time a learned address counts, whatever its record's TTL
/// (`KRT_DNS_TTL_MIN_S`): the connect right after a TTL-0 answer must
/// still find it.
pub const DNS_TTL_MIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest time a learned address counts, whatever its record's TTL
/// (`KRT_DNS_TTL_MAX_S`).
pub const DNS_TTL_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// The most DNS resolvers [`EgressFilter::set_dns_resolvers`] declares
/// (`KRT_DNS_RESOLVERS_MAX`).
pub const DNS_RESOLVERS_MAX: usize = 64;

/// How long a DNS question waits for its answer
/// (`KRT_DNS_QUESTION_TIMEOUT_S`): a later answer teaches nothing.
pub const DNS_QUESTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// DNS questions one cgroup may have noted per second
/// (`KRT_DNS_QUESTIONS_PER_S`); more are counted, not noted, so one pod
/// cannot flush its neighbours' pending questions.
pub const DNS_QUESTIONS_PER_S: u64 = 512;

/// Keys `observations` holds node-wide (`KRT_EGRESS_MAX_OBSERVATIONS`):
/// each set in use may start an equal share of them per drain, so one
/// container cannot evict another's counts.
pub const OBSERVATIONS_MAX: u64 = 1 << 14;

/// Addresses `egress_learned` holds node-wide (`KRT_EGRESS_MAX_LEARNED`):
/// each set in use may hold an equal share of them (less a margin per
/// CPU), so one container's DNS answers cannot push out what another's
/// taught. The map is not preallocated: it costs what it holds.
pub const LEARNED_MAX: u64 = 1 << 18;

/// Result of the egress filter's operations.
pub type Result<T, E = EgressError> = std::result::Result<T, E>;

/// The layout of the pinned maps this build reads and writes
/// (`KRT_EGRESS_LAYOUT_VERSION` in `egress_filter.bpf.c`; see the [module
/// docs](self#pinning-and-restarts)).
pub const LAYOUT_VERSION: u32 = 5;

/// The longest ledger policy id, in bytes (the field is NUL-padded to 64).
pub const LEDGER_ID_MAX_LEN: usize = 63;

/// What [`EgressFilter::load_pinned`] found in its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinOutcome {
    /// Loaded without a pin directory ([`EgressFilter::load`]).
    Unpinned,
    /// Nothing was pinned: fresh maps were created and pinned.
    Fresh,
    /// Pins of this layout were found: their maps are reused and their
    /// links adopted.
    Adopted,
    /// Pins that this build cannot read were found: their map pins were
    /// removed and fresh maps pinned. Their links keep enforcing the old
    /// state until replaced or released ([`PinnedLinks::stale`]).
    Discarded {
        /// Why (the pinned layout version, a missing pin, a map of another
        /// shape), for the log.
        reason: String,
    },
}

/// How the ledger records one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LedgerKind {
    /// An enforcing policy; its prefixes are its ledger rules.
    Enforce {
        /// It denies what no entry allows.
        default_deny: bool,
    },
    /// An observing policy (no rules).
    Observe,
}

/// The entries of one filter set, as the tries, `egress_hosts` and
/// `egress_domains` hold them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetEntries {
    /// The allow list.
    pub allow: BTreeSet<Prefix>,
    /// The deny list.
    pub deny: BTreeSet<Prefix>,
    /// The domains, each with its sides and name id.
    pub domains: BTreeMap<Domain, (DomainVerdicts, u32)>,
}

/// What the ledger holds for one policy id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerPolicy {
    /// Its record; `None` when only rules or bindings of the id are left
    /// (an interrupted removal): nothing to adopt, to clean up.
    pub kind: Option<LedgerKind>,
    /// Its allow prefixes.
    pub allow: BTreeSet<Prefix>,
    /// Its deny prefixes.
    pub deny: BTreeSet<Prefix>,
    /// Its allow domains.
    pub allow_domains: BTreeSet<Domain>,
    /// Its deny domains.
    pub deny_domains: BTreeSet<Domain>,
    /// The cgroups bound to it.
    pub cgroups: BTreeSet<u64>,
}

/// Everything the maps hold that a restarted caller needs, read back by
/// [`EgressFilter::read_state`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedState {
    /// `cgroup_filters`: cgroup id to its set and flags.
    pub filters: BTreeMap<u64, (u32, FilterFlags)>,
    /// The tries and `egress_hosts` (host entries as `/32`, `/128`), by
    /// set id.
    pub sets: BTreeMap<u32, SetEntries>,
    /// The ledger, by policy id.
    pub ledger: BTreeMap<Vec<u8>, LedgerPolicy>,
}

/// The pinned links [`EgressFilter::load_pinned`] found, handed to the
/// caller once ([`EgressFilter::take_pinned_links`]).
#[derive(Debug, Default)]
pub struct PinnedLinks {
    /// Links of cgroups in the adopted `cgroup_filters`, now running this
    /// object's program: they are the caller's attachments, to detach with
    /// [`EgressFilter::detach_cgroup`] like the links it makes itself.
    pub adopted: Vec<CgroupLink>,
    /// Links this object does not serve: of a discarded layout (running
    /// their old program over their old maps), or of a cgroup the adopted
    /// maps do not filter. They still enforce whatever they enforced; the
    /// caller releases each one ([`EgressFilter::release_link`]) once it
    /// has re-programmed what should be (attaching the cgroup anew replaces
    /// its pin by itself).
    pub stale: Vec<CgroupLink>,
    /// The snooper's links of adopted cgroups, now running this object's
    /// snooper (release each with [`EgressFilter::release_snoop`]).
    pub snoop_adopted: Vec<CgroupLink>,
    /// The snooper's links this object does not serve, as
    /// [`Self::stale`].
    pub snoop_stale: Vec<CgroupLink>,
}

/// Which list of a set an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Destinations the set lets through (under default deny, the only
    /// ones).
    Allow,
    /// Destinations the set drops, whatever the allow list says.
    Deny,
}

/// How a set treats what its lists do not decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FilterFlags {
    /// Drop destinations no allow entry matches, and packets whose IP
    /// header cannot be parsed.
    pub default_deny: bool,
    /// Count every parsed packet per destination and decision (see
    /// [`EgressFilter::drain_observations`]). Never changes a verdict.
    pub observe: bool,
    /// The set names domains: the snooper learns the cgroup's DNS answers
    /// and the filter consults what it learned (see the [module
    /// docs](self#domain-names-the-dns-answer-snooper)). Without it
    /// neither does any work for the cgroup.
    pub domains: bool,
}

/// What the program decided for one parsed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Decision {
    /// A deny entry matched: dropped.
    Denied,
    /// An allow entry matched and no deny entry did: passed.
    Allowed,
    /// Nothing matched and the set is default deny: dropped.
    DefaultDenied,
    /// Nothing matched and the set is not default deny: passed.
    Unmatched,
}

impl Decision {
    /// Whether the packet was dropped.
    pub const fn dropped(self) -> bool {
        matches!(self, Self::Denied | Self::DefaultDenied)
    }
}

/// Packets of selected cgroups by outcome, summed over CPUs since load.
///
/// Each packet of a cgroup in `cgroup_filters` adds one to exactly one of
/// the first seven fields ([`Self::packets`]); packets of other cgroups are
/// not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Dropped by a deny entry.
    pub denied: u64,
    /// Passed by an allow entry.
    pub allowed: u64,
    /// Dropped: nothing matched under default deny.
    pub default_denied: u64,
    /// Passed: nothing matched, no default deny.
    pub unmatched: u64,
    /// IPv4/IPv6 (by `skb->protocol`) with a truncated or malformed
    /// header, passed (no default deny).
    pub malformed_passed: u64,
    /// The same, dropped (default deny).
    pub malformed_dropped: u64,
    /// Neither IPv4 nor IPv6: passed whatever the flags.
    pub other_protocol: u64,
    /// Observations that created a key in the observation map. With the
    /// keys the drains removed, it counts what the bounded map evicted
    /// ([`Evictions`]).
    pub observe_inserted: u64,
    /// Observations the program could not count (map update failed).
    pub observe_failed: u64,
    /// Packets of sets naming domains whose destination the set learned
    /// from a DNS answer, unexpired (the entry took part in the verdict).
    pub learned_hits: u64,
    /// The same, with the entry expired (it decided nothing).
    pub learned_expired: u64,
    /// Packets decided by their socket's cached verdict (each is counted
    /// in one of the outcome counters too).
    pub cached: u64,
    /// Verdicts that could not be cached on their socket (the socket's
    /// next packet takes the full path again).
    pub cache_failed: u64,
}

/// What the DNS answer snooper read, summed over CPUs since its load
/// (`struct krt_dns_snoop_stats`). Every gated response adds one to
/// `responses`; records and failures are counted as they are met. The
/// snooper passes every packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnoopStats {
    /// Gated DNS responses (UDP from port 53, QR set) read.
    pub responses: u64,
    /// A or AAAA records whose address was learned or refreshed.
    pub learned: u64,
    /// A or AAAA records reached from the question through names no
    /// domain of the set names: not learned.
    pub unnamed: u64,
    /// A, AAAA or CNAME records owned by a name neither the question nor
    /// reached through CNAMEs of the response: skipped.
    pub unchained: u64,
    /// Responses the parser stopped in (truncated, a reserved label type,
    /// a compression pointer that does not point backwards).
    pub malformed: u64,
    /// Names over the key width (no policy can name them).
    pub name_too_long: u64,
    /// Records beyond the walk's bound, or CNAMEs beyond the chain's.
    pub walk_limit: u64,
    /// Responses with other than one question.
    pub unsupported: u64,
    /// Learned addresses the map refused.
    pub learn_failed: u64,
    /// A or AAAA records not learned because the set held its share of
    /// the learned addresses ([`LEARNED_MAX`] over the sets in use).
    pub over_share: u64,
    /// Responses dropped because an address a name denied by an enforced
    /// policy could not be learned (the set held its share): the pod is
    /// never told an address it could not be stopped from reaching.
    pub answers_refused: u64,
    /// Responses not from a declared resolver: nothing learned (a pod
    /// answering itself, loopback, a forged source address).
    pub untrusted_source: u64,
    /// Responses from a declared resolver that answer no pending question
    /// of the receiving cgroup (wrong id or port, late, unasked, or a
    /// second answer): nothing learned.
    pub unsolicited: u64,
    /// Responses to a pending question with another question section:
    /// nothing learned.
    pub question_mismatch: u64,
    /// DNS questions to declared resolvers noted, awaiting answers.
    pub questions_noted: u64,
    /// DNS questions to addresses that are not declared resolvers (their
    /// answers teach nothing): a resolver the node should declare, or a
    /// pod going around the cluster's DNS.
    pub questions_undeclared: u64,
    /// DNS questions over a cgroup's per-second budget: not noted.
    pub questions_over_budget: u64,
    /// DNS questions that could not be read or noted.
    pub questions_unreadable: u64,
}

/// One set's use of its share of the learned addresses
/// ([`EgressFilter::learned_use`]); counts since the set id was last freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnedUse {
    /// The filter set.
    pub set_id: u32,
    /// Entries it holds (expired ones until they are swept).
    pub held: u64,
    /// A or AAAA records not learned because it held its share.
    pub over_share: u64,
    /// Responses dropped because a denied name's address could not be
    /// learned.
    pub answers_refused: u64,
}

impl SnoopStats {
    /// Responses or records the snooper could not use because of how
    /// they were written or its bounds (each is also a response or a
    /// record it passed).
    pub const fn unreadable(&self) -> u64 {
        self.malformed + self.name_too_long + self.walk_limit + self.unsupported
    }

    /// Responses refused because they answer no question the cgroup asked
    /// a declared resolver (each is also a response it passed).
    pub const fn refused(&self) -> u64 {
        self.untrusted_source + self.unsolicited + self.question_mismatch
    }
}

impl Stats {
    /// Every counted packet (the seven outcome counters).
    pub const fn packets(&self) -> u64 {
        self.passed() + self.dropped()
    }

    /// Packets passed.
    pub const fn passed(&self) -> u64 {
        self.allowed + self.unmatched + self.malformed_passed + self.other_protocol
    }

    /// Packets dropped.
    pub const fn dropped(&self) -> u64 {
        self.denied + self.default_denied + self.malformed_dropped
    }
}

/// Packets of one set to one destination with one decision, since the
/// previous drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Observation {
    /// The filter set that decided.
    pub set_id: u32,
    /// The packets' destination.
    pub destination: IpAddr,
    /// What the program decided for them.
    pub decision: Decision,
    /// How many packets.
    pub count: u64,
}

/// Why an egress filter operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The crate was built without BPF objects (no clang, or
    /// `KRT_BPF_STUB=1`).
    #[error("built without BPF objects: install clang and rebuild")]
    NotBuilt,
    /// libbpf could not parse the embedded object (a broken build).
    #[error("opening the egress filter object failed: {message}")]
    Open {
        /// libbpf's error.
        message: String,
    },
    /// The kernel refused the object: a map, the BTF or the program (the
    /// verifier).
    #[error("loading the egress filter failed: {message}")]
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
        /// The map (`cgroup_filters`, `allow_v4`, ...).
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
    /// `BPF_PROG_TEST_RUN` failed (e.g. EINVAL for a frame shorter than
    /// an Ethernet header).
    #[error("test run failed: {message}")]
    TestRun {
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// A prefix length beyond the address family's width.
    #[error(
        "{addr}/{len} is not a prefix: {} prefixes are at most /{max}",
        if .addr.is_ipv4() { "IPv4" } else { "IPv6" }
    )]
    InvalidPrefix {
        /// The address given.
        addr: IpAddr,
        /// The length given.
        len: u8,
        /// The family's width (32 or 128).
        max: u8,
    },
    /// Text that is not `addr` or `addr/len`.
    #[error("{input:?} is not an IP prefix: {reason}")]
    ParsePrefix {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Cgroup id 0 names no cgroup (the kernel's ids start at 1).
    #[error("cgroup id 0 names no cgroup")]
    InvalidCgroupId,
    /// A ledger policy id must be 1 to [`LEDGER_ID_MAX_LEN`] bytes
    /// without a NUL.
    #[error("a ledger policy id of {len} bytes (1 to {LEDGER_ID_MAX_LEN}, no NUL)")]
    InvalidLedgerId {
        /// Its length.
        len: usize,
    },
    /// Creating, opening or removing a pin failed.
    #[error("pin {path}: {message}")]
    Pin {
        /// The pin (or pin directory).
        path: String,
        /// What failed.
        message: String,
    },
    /// The kernel returned map data of an unexpected shape: the handle and
    /// the object disagree (a build skew), nothing was changed.
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
    /// The DNS answer snooper is not loaded (the kernel refused it), so
    /// domains cannot be served; the filter itself works.
    #[error("the DNS answer snooper is unavailable: {reason}")]
    SnoopUnavailable {
        /// Why (the load error, with the verifier's reason).
        reason: String,
    },
}

impl EgressError {
    /// A stable snake_case name of the variant, for metric labels.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Self::NotBuilt => "not_built",
            Self::Open { .. } => "open",
            Self::Load { .. } => "load",
            Self::Map { .. } => "map",
            Self::MapFull { .. } => "map_full",
            Self::TestRun { .. } => "test_run",
            Self::InvalidPrefix { .. } => "invalid_prefix",
            Self::ParsePrefix { .. } => "parse_prefix",
            Self::InvalidCgroupId => "invalid_cgroup_id",
            Self::InvalidLedgerId { .. } => "invalid_ledger_id",
            Self::Pin { .. } => "pin",
            Self::Layout { .. } => "layout",
            Self::Attach(AttachError::Cgroup { .. }) => "cgroup",
            Self::Attach(AttachError::Attach { .. }) => "attach",
            Self::SnoopUnavailable { .. } => "snoop_unavailable",
        }
    }
}

/// The loaded egress filter: its program and maps.
///
/// Nothing is attached at load: the program runs where
/// [`Self::attach_cgroup`] (or [`Self::attach`]) puts it, and through
/// [`Self::test_run`]. Every method takes
/// `&self` (map updates are atomic per entry in the kernel), and the handle
/// is `Send + Sync`, so one filter can be shared by the tasks that program
/// it. Dropping it unloads the program and frees every map not held
/// elsewhere (by an attachment, a pin or another fd).
#[derive(Debug)]
pub struct EgressFilter {
    inner: imp::Filter,
}

impl EgressFilter {
    /// Loads the program and creates its (empty) maps.
    ///
    /// Fails with [`EgressError::Load`], carrying the verifier log, when
    /// the kernel refuses it, and with [`EgressError::NotBuilt`] in a stub
    /// build. Needs `CAP_BPF` (and `CAP_NET_ADMIN` for the program type),
    /// in practice root.
    pub fn load() -> Result<Self> {
        imp::Filter::load(None).map(|inner| Self { inner })
    }

    /// Loads the program over maps pinned under `dir` (created if
    /// missing): adopts the maps and links pinned there by an earlier load
    /// of this layout, discards pins of another (see the [module
    /// docs](self#pinning-and-restarts) and [`Self::pin_outcome`]), and
    /// pins what it creates. Links made by [`Self::attach_cgroup`] are
    /// pinned under `dir/links`. `dir` must be on a bpffs.
    pub fn load_pinned(dir: &Path) -> Result<Self> {
        imp::Filter::load(Some(dir)).map(|inner| Self { inner })
    }

    /// What the load found in its pin directory.
    pub fn pin_outcome(&self) -> &PinOutcome {
        self.inner.pin_outcome()
    }

    /// The pin directory, when loaded with one.
    pub fn pin_dir(&self) -> Option<&Path> {
        self.inner.pin_dir()
    }

    /// Takes the pinned links the load found (empty after the first call,
    /// and without a pin directory).
    pub fn take_pinned_links(&mut self) -> PinnedLinks {
        self.inner.take_pinned_links()
    }

    /// Removes the pins [`Self::load_pinned`] made under `dir` (uninstall):
    /// its maps, links and marker, then each directory once empty,
    /// refusing a directory not marked as the egress backend's and
    /// keeping (and naming) anything else (see [`crate::pins`]). Each
    /// pinned link detaches once no process holds an fd of it, after an
    /// RCU grace period; the maps go with their last holder. A missing
    /// directory is an empty removal.
    pub fn remove_pins(dir: &Path) -> crate::pins::Result<crate::pins::Removal> {
        crate::pins::remove_kind(dir, crate::pins::Kind::Egress)
    }

    /// Removes the map pins under `dir`, keeping the link pins (which keep
    /// enforcing until replaced or released): what a load does with pins
    /// it cannot read, for a caller that finds the state unreadable only
    /// after the load ([`Self::read_state`] failed). The next
    /// [`Self::load_pinned`] starts fresh, its links stale.
    pub fn discard_pinned_maps(dir: &Path) -> Result<()> {
        imp::Filter::discard_pinned_maps(dir)
    }

    /// The layout version recorded in the pins under `dir`; `None` when
    /// nothing is pinned there.
    pub fn pinned_layout_version(dir: &Path) -> Result<Option<u32>> {
        imp::Filter::pinned_layout_version(dir)
    }

    /// Overwrites the layout version recorded in the pins under `dir`
    /// (tests of the discard path: it makes the pins read as another
    /// layout's).
    #[doc(hidden)]
    pub fn set_pinned_layout_version(dir: &Path, version: u32) -> Result<()> {
        imp::Filter::set_pinned_layout_version(dir, version)
    }

    /// Everything the maps hold (filters, set entries, the ledger), for a
    /// caller adopting pinned state. An entry this code cannot decode
    /// fails it ([`EgressError::Layout`]).
    pub fn read_state(&self) -> Result<PinnedState> {
        self.inner.read_state()
    }

    /// What the maps pinned under `dir` hold (as [`Self::read_state`]
    /// reads a loaded filter's), read without loading or adopting
    /// anything: for diagnostics and for tests of a running daemon's
    /// state. Nothing pinned there: an empty state.
    pub fn read_pinned_state(dir: &Path) -> Result<PinnedState> {
        imp::Filter::read_pinned_state(dir)
    }

    /// Records policy `id` in the ledger as `kind`, or (`None`) removes
    /// its record (its rules and bindings are separate entries).
    pub fn ledger_set_policy(&self, id: &[u8], kind: Option<LedgerKind>) -> Result<()> {
        self.inner.ledger_set_policy(id, kind)
    }

    /// Records (`present`) or removes one prefix of policy `id`'s allow or
    /// deny list in the ledger.
    pub fn ledger_set_rule(
        &self,
        id: &[u8],
        verdict: Verdict,
        prefix: Prefix,
        present: bool,
    ) -> Result<()> {
        self.inner.ledger_set_rule(id, verdict, prefix, present)
    }

    /// Records (`present`) or removes the binding of cgroup `cgroup_id` to
    /// policy `id` in the ledger.
    pub fn ledger_set_binding(&self, id: &[u8], cgroup_id: u64, present: bool) -> Result<()> {
        self.inner.ledger_set_binding(id, cgroup_id, present)
    }

    /// Makes set `set_id` with `flags` apply to the packets of cgroup
    /// `cgroup_id` (replacing its previous set and flags, atomically).
    ///
    /// `cgroup_id` is the kernel's id of a cgroup v2 directory: its inode
    /// number. The set's entries may be inserted before or after.
    pub fn set_filter(&self, cgroup_id: u64, set_id: u32, flags: FilterFlags) -> Result<()> {
        self.inner.set_filter(cgroup_id, set_id, flags)
    }

    /// Stops filtering cgroup `cgroup_id`: its packets pass untouched
    /// again. Returns whether it was filtered. Its set's entries stay (other
    /// cgroups may use the set).
    pub fn remove_cgroup(&self, cgroup_id: u64) -> Result<bool> {
        self.inner.remove_cgroup(cgroup_id)
    }

    /// Adds `prefix` to the allow or deny list of set `set_id` (a no-op if
    /// it is there already): a host (`/32`, `/128`) to `egress_hosts`,
    /// anything shorter to that list's trie. Fails with
    /// [`EgressError::MapFull`] at the node-wide ceiling of that map.
    pub fn insert(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<()> {
        self.inner.insert(set_id, verdict, prefix)
    }

    /// Removes `prefix` from the allow or deny list of set `set_id`.
    /// Returns whether it was there. Only that exact prefix goes: narrower
    /// or wider entries stay.
    pub fn remove(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<bool> {
        self.inner.remove(set_id, verdict, prefix)
    }

    /// Puts `domain` on the sides `verdicts` of set `set_id`, replacing
    /// what the set had for it (empty `verdicts` remove it). `name_id` is
    /// the caller's number for the name, the same for every set naming
    /// it: what the name teaches carries it ([`Learned::name_id`]). Fails
    /// with [`EgressError::MapFull`] at the node-wide ceiling.
    ///
    /// The snooper only learns for cgroups whose flags have
    /// [`FilterFlags::domains`].
    pub fn set_domain(
        &self,
        set_id: u32,
        domain: &Domain,
        verdicts: DomainVerdicts,
        name_id: u32,
    ) -> Result<()> {
        if verdicts.is_empty() {
            return self.remove_domain(set_id, domain).map(|_| ());
        }
        self.inner.set_domain(set_id, domain, verdicts, name_id)
    }

    /// Removes `domain` from set `set_id`; whether it was there. What the
    /// set learned from it stays until it expires or
    /// [`Self::forget_learned`] removes it.
    pub fn remove_domain(&self, set_id: u32, domain: &Domain) -> Result<bool> {
        self.inner.remove_domain(set_id, domain)
    }

    /// Every address a set learned from a DNS answer, expired ones
    /// included (with [`Learned::remaining`] `None`). An entry this code
    /// cannot decode fails the read ([`EgressError::Layout`]).
    pub fn learned(&self) -> Result<Vec<Learned>> {
        self.inner.learned()
    }

    /// Forgets what set `set_id` learned (only what name `name_id`
    /// taught, when given): for a set freed, or a name a set stops
    /// naming. Returns how many entries went.
    pub fn forget_learned(&self, set_id: u32, name_id: Option<u32>) -> Result<usize> {
        self.inner.forget_learned(set_id, name_id)
    }

    /// Writes a learned entry directly, counting for `counts_for` from
    /// now (zero: already expired). Tests of the filter's use of learned
    /// addresses without a DNS answer.
    #[doc(hidden)]
    pub fn insert_learned(
        &self,
        set_id: u32,
        addr: IpAddr,
        verdicts: DomainVerdicts,
        name_id: u32,
        counts_for: std::time::Duration,
    ) -> Result<()> {
        self.inner
            .insert_learned(set_id, addr, verdicts, name_id, counts_for)
    }

    /// Why the DNS answer snooper is not loaded, when it is not (the
    /// kernel refused it): domains cannot be served then.
    pub fn snoop_error(&self) -> Option<&EgressError> {
        self.inner.snoop_error()
    }

    /// Declares the DNS resolvers whose answers the snooper may learn
    /// from (replacing the set declared before): the cluster DNS Service
    /// addresses, node-local DNS, what the operator lists. An answer from
    /// any other address, or one that answers no question the receiving
    /// cgroup asked a declared resolver, teaches nothing (see the [module
    /// docs](self#domain-names-the-dns-answer-snooper)). With none
    /// declared, domains learn nothing. At most [`DNS_RESOLVERS_MAX`].
    pub fn set_dns_resolvers(&self, addrs: &[IpAddr]) -> Result<()> {
        self.inner.set_dns_resolvers(addrs)
    }

    /// Observations each set counted past its share of the observation
    /// map since it was last made (set id, count), for sets that have
    /// any: what a container's monitoring lost so that it could not evict
    /// another's. The share is the map's size over the sets in use, per
    /// drain.
    pub fn observations_over_share(&self) -> Result<Vec<(u32, u64)>> {
        self.inner.observations_over_share()
    }

    /// The current share of the observation map per set per drain (the
    /// map's size over the sets in use), or `None` before any set.
    pub fn observation_share(&self) -> Result<Option<u64>> {
        self.inner.observation_share()
    }

    /// Removes the learned addresses that expired (the map never evicts:
    /// an expired entry takes room in its set's share until it goes).
    /// Returns how many went. The daemon calls it at every poll.
    pub fn sweep_learned(&self) -> Result<usize> {
        self.inner.sweep_learned()
    }

    /// Each set's use of its share of the learned addresses (sets that
    /// learned nothing since their id was last freed are absent).
    pub fn learned_use(&self) -> Result<Vec<LearnedUse>> {
        self.inner.learned_use()
    }

    /// The learned addresses each set may hold now: [`LEARNED_MAX`] over
    /// the sets in use, less a margin per CPU, or less if capped
    /// ([`Self::cap_learned_share`]); `None` before any set.
    pub fn learned_share(&self) -> Result<Option<u64>> {
        self.inner.learned_share()
    }

    /// Bounds every set's share of the learned addresses by `cap` (at
    /// least 1), below the equal share it would otherwise get.
    pub fn cap_learned_share(&self, cap: u64) -> Result<()> {
        self.inner.cap_learned_share(cap)
    }

    /// The snooper's counters, summed over CPUs, since its load.
    pub fn read_snoop_stats(&self) -> Result<SnoopStats> {
        self.inner.read_snoop_stats()
    }

    /// Attaches the snooper to the ingress of the cgroup v2 directory
    /// `dir` (pinned at `snoop_links/<cgroup id>` with a pin directory).
    /// Attach it before the cgroup is programmed and the filter attached
    /// ([`Self::attach_cgroup`]): it is gated by the filter map, so it
    /// does nothing until then, and the first answer after that is
    /// learned. Fails with [`EgressError::SnoopUnavailable`] when the
    /// snooper is not loaded.
    pub fn attach_snoop(&self, dir: &Path) -> Result<CgroupLink> {
        let mut link = self.inner.attach_snoop(dir)?;
        self.inner.pin_snoop_link(&mut link)?;
        Ok(link)
    }

    /// Releases a snooper link (after [`Self::detach_cgroup`] of the same
    /// cgroup): unpins it (unless its pin holds another link by now) and
    /// closes it, so it detaches.
    pub fn release_snoop(&self, link: CgroupLink) -> Result<()> {
        self.release_link(link)
    }

    /// Runs the snooper once on `frame` with `BPF_PROG_TEST_RUN`, as
    /// [`Self::test_run`] runs the filter (the packet's cgroup is the
    /// caller's); returns its verdict (always 1).
    pub fn test_run_snoop(&self, frame: &[u8]) -> Result<u32> {
        self.inner.test_run_snoop(frame)
    }

    /// Runs the snooper `repeat` times on `frame` (see
    /// [`Self::test_run_repeat`]); for benchmarks.
    pub fn test_run_snoop_repeat(&self, frame: &[u8], repeat: u32) -> Result<TimedRun> {
        self.inner.test_run_snoop_repeat(frame, repeat)
    }

    /// Records (`present`) or removes one domain of policy `id`'s allow or
    /// deny list in the ledger.
    pub fn ledger_set_domain_rule(
        &self,
        id: &[u8],
        verdict: Verdict,
        domain: &Domain,
        present: bool,
    ) -> Result<()> {
        self.inner
            .ledger_set_domain_rule(id, verdict, domain, present)
    }

    /// The outcome counters, summed over CPUs, since load.
    pub fn read_stats(&self) -> Result<Stats> {
        self.inner.read_stats()
    }

    /// Reads and resets the per-destination counters of observing sets.
    ///
    /// Each key present when the drain starts is removed with its count
    /// (atomically per key; on kernels before 5.14, which lack that
    /// operation for hash maps, packets counted between reading and
    /// removing a key are lost). Keys created during the drain stay for
    /// the next one. Entries with the same set, destination and decision
    /// appear once; the order is unspecified. A key this code cannot decode
    /// fails the drain before anything is removed; a kernel error midway
    /// (not expected: a lookup or delete of a present key) fails it too,
    /// and the counts it had already removed are lost.
    pub fn drain_observations(&self) -> Result<Vec<Observation>> {
        self.inner.drain_observations()
    }

    /// Keys the drains of this handle removed from the observation map
    /// since load, cumulative. With [`Stats::observe_inserted`] it counts
    /// what the map evicted ([`Evictions`]).
    pub fn observations_taken(&self) -> u64 {
        self.inner.observations_taken()
    }

    /// Keys in the observation map now (a walk of its keys; for
    /// [`Evictions::new`]).
    pub fn count_observations(&self) -> u64 {
        self.inner.count_observations()
    }

    /// Attaches the program to the egress of the cgroup v2 directory `dir`
    /// (and its descendants) as a multi-attach BPF link, programming
    /// nothing: packets of cgroups not in the filter map pass after one
    /// lookup. Prefer [`Self::attach_cgroup`], which orders the map entry
    /// before the link.
    pub fn attach(&self, dir: &Path) -> Result<CgroupLink> {
        self.inner.attach(dir)
    }

    /// Programs cgroup `dir` (its id, the directory's inode) to set
    /// `set_id` with `flags`, *then* attaches the program to it: the first
    /// packet that runs the program already finds the set. The set's
    /// entries should be inserted before. If the attach fails the map
    /// entry is removed again and the error returned, so a cgroup never
    /// reads as filtered while nothing filters it.
    ///
    /// With a pin directory the link is pinned at `links/<cgroup id>`,
    /// replacing (atomically) a link pinned there before; a failed pin
    /// fails the call the same way.
    pub fn attach_cgroup(&self, dir: &Path, set_id: u32, flags: FilterFlags) -> Result<CgroupLink> {
        let id = crate::cgroup_attach::cgroup_id(dir)?;
        self.set_filter(id, set_id, flags)?;
        let attached = self.attach(dir).and_then(|mut link| {
            // Dropped on a failed pin: the link detaches with it.
            self.inner.pin_link(&mut link)?;
            Ok(link)
        });
        if attached.is_err() {
            // Best effort: the attach error is the one to report; a
            // failed removal leaves an entry no program of this object
            // reads.
            let _ = self.remove_cgroup(id);
        }
        attached
    }

    /// Revokes the cgroup of `link` from the filter map, *then* detaches
    /// the link (the specification's revoke-before-detach order). Returns
    /// whether the cgroup was in the map. The link is dropped even when the
    /// revoke fails (the error is returned): a link left open would keep
    /// running the program on a cgroup the caller is done with. A pinned
    /// link is unpinned too (unless its pin holds another link by now), so
    /// it detaches once its last fd closes.
    pub fn detach_cgroup(&self, link: CgroupLink) -> Result<bool> {
        let revoked = self.remove_cgroup(link.cgroup_id());
        let unpinned = self.inner.unpin_link(&link);
        drop(link);
        let revoked = revoked?;
        unpinned.map(|()| revoked)
    }

    /// Releases a link without touching the maps (a stale link of
    /// [`PinnedLinks::stale`]): unpins it (unless its pin holds another
    /// link by now) and closes it, so it detaches.
    pub fn release_link(&self, link: CgroupLink) -> Result<()> {
        let unpinned = self.inner.unpin_link(&link);
        drop(link);
        unpinned
    }

    /// Runs the program once on `frame` with `BPF_PROG_TEST_RUN` and
    /// returns its verdict: 1 pass, 0 drop.
    ///
    /// `frame` is an Ethernet frame: the kernel takes `skb->protocol` from
    /// its EtherType and strips the 14-byte header, so the program sees
    /// the IP header first, as on real egress. The packet's cgroup is that
    /// of the calling process (the kernel gives the test skb a socket
    /// created by this process), so a test registers its own cgroup id with
    /// [`Self::set_filter`]. Counters and observations are updated as for a
    /// real packet.
    pub fn test_run(&self, frame: &[u8]) -> Result<u32> {
        self.inner.test_run(frame)
    }

    /// Runs the program `repeat` times on `frame` with `BPF_PROG_TEST_RUN`
    /// and returns the last verdict and the kernel's mean time per run
    /// (for benchmarks; compare with [`FloorProgram`]). Counters count
    /// every run.
    pub fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<TimedRun> {
        self.inner.test_run_repeat(frame, repeat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_sum_outcomes() {
        let s = Stats {
            denied: 1,
            allowed: 2,
            default_denied: 4,
            unmatched: 8,
            malformed_passed: 16,
            malformed_dropped: 32,
            other_protocol: 64,
            observe_inserted: 1000,
            observe_failed: 1000,
            learned_hits: 1000,
            learned_expired: 1000,
            cached: 1000,
            cache_failed: 1000,
        };
        assert_eq!(s.dropped(), 1 + 4 + 32);
        assert_eq!(s.passed(), 2 + 8 + 16 + 64);
        assert_eq!(s.packets(), 127);
    }

    #[test]
    fn decisions_know_whether_they_drop() {
        assert!(Decision::Denied.dropped());
        assert!(Decision::DefaultDenied.dropped());
        assert!(!Decision::Allowed.dropped());
        assert!(!Decision::Unmatched.dropped());
    }

    #[test]
    fn metric_labels_name_the_variant() {
        assert_eq!(EgressError::NotBuilt.metric_label(), "not_built");
        assert_eq!(
            EgressError::InvalidCgroupId.metric_label(),
            "invalid_cgroup_id"
        );
        let full = EgressError::MapFull {
            map: "allow_v4",
            max_entries: 4,
        };
        assert_eq!(full.metric_label(), "map_full");
        assert_eq!(full.to_string(), "map allow_v4 is full (4 entries)");
    }

    #[test]
    fn the_handle_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<EgressFilter>();
    }

    #[cfg(krt_bpf_stub)]
    #[test]
    fn a_stub_build_says_how_to_fix_it() {
        assert_eq!(
            EgressFilter::load_pinned(Path::new("/nonexistent")).unwrap_err(),
            EgressError::NotBuilt
        );
        let err = EgressFilter::load().unwrap_err();
        assert_eq!(err, EgressError::NotBuilt);
        assert!(err.to_string().contains("install clang and rebuild"));
    }
}
