//! Map keys and values as the kernel reads them, laid out from the
//! skeleton's types (`bpf/include/egress.h`, and the ledger's in
//! `bpf/egress/egress_filter.bpf.c`), never from hand-copied
//! offsets.
//!
//! Encoding writes into buffers sized from the same types, so it cannot
//! go out of bounds; decoding reads bytes the kernel returned and checks
//! every access, so a skew between object and code is an error, not a
//! panic.

use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    Decision, Domain, DomainVerdicts, FilterFlags, LedgerKind, Observation, Prefix, SnoopStats,
    Stats, Verdict,
};
use crate::dns::name::DOMAIN_KEY_LEN;
use crate::skel::egress::egress_filter::types;

type V4Key = types::krt_egress_v4_key;
type V6Key = types::krt_egress_v6_key;
type FilterValue = types::krt_egress_filter;
type ObsKey = types::krt_egress_obs_key;
type StatsValue = types::krt_egress_stats;
type Flag = types::krt_egress_flag;
type RawDecision = types::krt_egress_decision;
type Family = types::krt_egress_family;
type Meta = types::krt_egress_meta;
type PolicyKey = types::krt_egress_policy_key;
type PolicyValue = types::krt_egress_policy;
type PolicyKind = types::krt_egress_policy_kind;
type PolicyFlag = types::krt_egress_policy_flag;
type RuleKey = types::krt_egress_rule_key;
type BindingKey = types::krt_egress_binding_key;
type DomainKeyT = types::krt_egress_domain_key;
type DomainValue = types::krt_egress_domain;
type DomainVerdict = types::krt_egress_domain_verdict;
type LearnedKey = types::krt_egress_learned_key;
type LearnedValue = types::krt_egress_learned;
type DomainRuleKey = types::krt_egress_domain_rule_key;
type HostKey = types::krt_egress_host_key;
type HostValue = types::krt_egress_host;
type ResolverKey = types::krt_dns_resolver_key;
type ObsBudget = types::krt_egress_obs_budget;
type LearnedBudget = types::krt_egress_learned_budget;
type RawShareSlot = types::krt_egress_obs_share_slot;
type SnoopStatsValue = crate::skel::dnssnoop::snoop::types::krt_dns_snoop_stats;

/// `KRT_EGRESS_LAYOUT_VERSION` in `egress_filter.bpf.c`, which the public constant
/// must equal.
pub(super) const LAYOUT_VERSION: u32 = types::krt_egress_layout::KRT_EGRESS_LAYOUT_VERSION.0;
const _: () = assert!(LAYOUT_VERSION == super::LAYOUT_VERSION);

/// Width of a ledger policy id field: 63 bytes and a NUL.
pub(super) const POLICY_ID_LEN: usize = size_of::<PolicyKey>();

// The layouts written by hand below are the header's.
const _: () = {
    assert!(size_of::<Meta>() == 8);
    assert!(POLICY_ID_LEN == 64);
    assert!(size_of::<PolicyValue>() == 8);
    assert!(size_of::<RuleKey>() == POLICY_ID_LEN + 4 + 16);
    assert!(size_of::<BindingKey>() == POLICY_ID_LEN + 8);
    assert!(size_of::<DomainKeyT>() == DOMAIN_KEY_LEN + 4);
    assert!(size_of::<DomainRuleKey>() == POLICY_ID_LEN + 4 + DOMAIN_KEY_LEN);
    assert!(size_of::<LearnedKey>() == 24);
    assert!(size_of::<LearnedValue>() == 16);
    // The program looks up egress_learned with its egress_hosts key.
    assert!(size_of::<HostKey>() == size_of::<LearnedKey>());
    assert!(offset_of!(HostKey, set_id) == offset_of!(LearnedKey, set_id));
    assert!(offset_of!(HostKey, family) == offset_of!(LearnedKey, family));
    assert!(offset_of!(HostKey, addr) == offset_of!(LearnedKey, addr));
    assert!(size_of::<HostValue>() == 4);
};

/// Bits of the set id that every trie key's `prefixlen` counts first.
const SET_ID_BITS: u32 = u32::BITS;

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The `struct krt_egress_v4_key` or `krt_egress_v6_key` of `prefix` in
/// set `set_id` (the family picks the struct).
pub(super) fn trie_key(set_id: u32, prefix: &Prefix) -> Vec<u8> {
    let prefixlen = SET_ID_BITS + u32::from(prefix.prefix_len());
    // Big-endian: the kernel reads the key after `prefixlen` as one bit
    // string (see egress.h).
    let set = set_id.to_be_bytes();
    match prefix.addr() {
        IpAddr::V4(addr) => {
            let mut key = vec![0u8; size_of::<V4Key>()];
            put(
                &mut key,
                offset_of!(V4Key, prefixlen),
                &prefixlen.to_ne_bytes(),
            );
            put(&mut key, offset_of!(V4Key, set_id), &set);
            put(&mut key, offset_of!(V4Key, addr), &addr.octets());
            key
        }
        IpAddr::V6(addr) => {
            let mut key = vec![0u8; size_of::<V6Key>()];
            put(
                &mut key,
                offset_of!(V6Key, prefixlen),
                &prefixlen.to_ne_bytes(),
            );
            put(&mut key, offset_of!(V6Key, set_id), &set);
            put(&mut key, offset_of!(V6Key, addr), &addr.octets());
            key
        }
    }
}

/// Where an entry of a set lives, and so which occupancy bit of the
/// cgroup's flags tells the program to look there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// `egress_hosts`, IPv4 (/32 entries of either list).
    HostsV4,
    /// `egress_hosts`, IPv6 (/128 entries of either list).
    HostsV6,
    /// `deny_v4` (shorter IPv4 deny prefixes).
    DenyV4,
    /// `allow_v4`.
    AllowV4,
    /// `deny_v6`.
    DenyV6,
    /// `allow_v6`.
    AllowV6,
}

impl Slot {
    /// Every slot, in [`Self::index`] order.
    pub(super) const ALL: [Self; 6] = [
        Self::HostsV4,
        Self::HostsV6,
        Self::DenyV4,
        Self::AllowV4,
        Self::DenyV6,
        Self::AllowV6,
    ];

    /// Where `prefix` of the allow or deny list goes: a host (/32, /128)
    /// in `egress_hosts`, anything shorter in its trie.
    pub(super) fn of(verdict: Verdict, prefix: &Prefix) -> Self {
        let v4 = prefix.addr().is_ipv4();
        match (is_host(prefix), v4, verdict) {
            (true, true, _) => Self::HostsV4,
            (true, false, _) => Self::HostsV6,
            (false, true, Verdict::Deny) => Self::DenyV4,
            (false, true, Verdict::Allow) => Self::AllowV4,
            (false, false, Verdict::Deny) => Self::DenyV6,
            (false, false, Verdict::Allow) => Self::AllowV6,
        }
    }

    /// Its position in [`Self::ALL`] (and in a set's entry counts).
    pub(super) const fn index(self) -> usize {
        self as usize
    }

    /// Its bit of `krt_egress_filter.flags`.
    pub(super) const fn flag(self) -> u32 {
        match self {
            Self::HostsV4 => Flag::KRT_EGRESS_FLAG_HOSTS_V4.0,
            Self::HostsV6 => Flag::KRT_EGRESS_FLAG_HOSTS_V6.0,
            Self::DenyV4 => Flag::KRT_EGRESS_FLAG_DENY_V4.0,
            Self::AllowV4 => Flag::KRT_EGRESS_FLAG_ALLOW_V4.0,
            Self::DenyV6 => Flag::KRT_EGRESS_FLAG_DENY_V6.0,
            Self::AllowV6 => Flag::KRT_EGRESS_FLAG_ALLOW_V6.0,
        }
    }
}

/// Whether `prefix` is a single address (/32, /128): an `egress_hosts`
/// entry rather than a trie entry.
pub(super) fn is_host(prefix: &Prefix) -> bool {
    let width = if prefix.addr().is_ipv4() { 32 } else { 128 };
    prefix.prefix_len() == width
}

/// `addr`'s `enum krt_egress_family` value and its bytes in network
/// order, as every address-keyed map lays them out.
fn family_and_octets(addr: IpAddr) -> (u32, Vec<u8>) {
    match addr {
        IpAddr::V4(a) => (Family::KRT_EGRESS_IPV4.0, a.octets().to_vec()),
        IpAddr::V6(a) => (Family::KRT_EGRESS_IPV6.0, a.octets().to_vec()),
    }
}

/// The `egress_hosts` key of address `addr` in set `set_id`.
pub(super) fn host_key(set_id: u32, addr: IpAddr) -> Vec<u8> {
    let mut key = vec![0u8; size_of::<HostKey>()];
    put(&mut key, offset_of!(HostKey, set_id), &set_id.to_ne_bytes());
    let (family, octets) = family_and_octets(addr);
    put(&mut key, offset_of!(HostKey, family), &family.to_ne_bytes());
    put(&mut key, offset_of!(HostKey, addr), &octets);
    key
}

/// The `egress_hosts` value for an address on the allow list, the deny
/// list, or both.
pub(super) fn host_value(lists: DomainVerdicts) -> Vec<u8> {
    let mut value = vec![0u8; size_of::<HostValue>()];
    put(
        &mut value,
        offset_of!(HostValue, verdicts),
        &verdict_bits(lists).to_ne_bytes(),
    );
    value
}

/// The lists of an `egress_hosts` value; `None` for bytes this code does
/// not write.
pub(super) fn decode_host_value(value: &[u8]) -> Option<DomainVerdicts> {
    if value.len() != size_of::<HostValue>() {
        return None;
    }
    Some(decode_verdict_bits(u32_at(
        value,
        offset_of!(HostValue, verdicts),
    )?))
}

/// An `egress_hosts` entry: `(set id, host prefix, lists)`; `None` for
/// bytes this code does not write (an unknown family, no list).
pub(super) fn decode_host(key: &[u8], value: &[u8]) -> Option<(u32, Prefix, DomainVerdicts)> {
    if key.len() != size_of::<HostKey>() {
        return None;
    }
    let set_id = u32_at(key, offset_of!(HostKey, set_id))?;
    let at = offset_of!(HostKey, addr);
    let addr = match types::krt_egress_family(u32_at(key, offset_of!(HostKey, family))?) {
        Family::KRT_EGRESS_IPV4 => {
            let octets: [u8; 4] = key.get(at..at + 4)?.try_into().ok()?;
            // The rest of the field is zero in every key written.
            if key.get(at + 4..at + 16)?.iter().any(|b| *b != 0) {
                return None;
            }
            IpAddr::V4(Ipv4Addr::from(octets))
        }
        Family::KRT_EGRESS_IPV6 => {
            let octets: [u8; 16] = key.get(at..at + 16)?.try_into().ok()?;
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    let lists = decode_host_value(value)?;
    (!lists.is_empty()).then_some((set_id, Prefix::host(addr), lists))
}

/// The value of every trie entry (the program only tests presence).
pub(super) const TRIE_VALUE: [u8; 1] = [1];

/// The `cgroup_filters` key of a cgroup id.
pub(super) fn cgroup_key(cgroup_id: u64) -> [u8; 8] {
    cgroup_id.to_ne_bytes()
}

/// The `struct krt_egress_filter` of a set and its flags, with
/// `occupancy` (the [`Slot::flag`] bits of the slots the set has entries
/// in) added.
pub(super) fn filter_value(set_id: u32, flags: FilterFlags, occupancy: u32) -> Vec<u8> {
    let mut bits = occupancy & occupancy_mask();
    if flags.default_deny {
        bits |= Flag::KRT_EGRESS_FLAG_DEFAULT_DENY.0;
    }
    if flags.observe {
        bits |= Flag::KRT_EGRESS_FLAG_OBSERVE.0;
    }
    if flags.domains {
        bits |= Flag::KRT_EGRESS_FLAG_DOMAINS.0;
    }
    let mut value = vec![0u8; size_of::<FilterValue>()];
    put(
        &mut value,
        offset_of!(FilterValue, set_id),
        &set_id.to_ne_bytes(),
    );
    put(
        &mut value,
        offset_of!(FilterValue, flags),
        &bits.to_ne_bytes(),
    );
    value
}

/// Every occupancy bit.
pub(super) fn occupancy_mask() -> u32 {
    Slot::ALL.iter().fold(0, |bits, s| bits | s.flag())
}

/// The `cgroup_filters` entry `(cgroup id, set id, flags)` of a key and a
/// value (the occupancy bits are the set's, not the caller's: left out);
/// `None` for bytes this code does not write.
pub(super) fn decode_filter(key: &[u8], value: &[u8]) -> Option<(u64, u32, FilterFlags)> {
    if key.len() != 8 || value.len() != size_of::<FilterValue>() {
        return None;
    }
    let id = u64_at(key, 0)?;
    let set_id = u32_at(value, offset_of!(FilterValue, set_id))?;
    let bits = u32_at(value, offset_of!(FilterValue, flags))?;
    let flags = FilterFlags {
        default_deny: bits & Flag::KRT_EGRESS_FLAG_DEFAULT_DENY.0 != 0,
        observe: bits & Flag::KRT_EGRESS_FLAG_OBSERVE.0 != 0,
        domains: bits & Flag::KRT_EGRESS_FLAG_DOMAINS.0 != 0,
    };
    Some((id, set_id, flags))
}

/// The `(set id, prefix)` of a trie key of the IPv4 (`v6` false) or IPv6
/// trie; `None` for bytes this code does not write.
pub(super) fn decode_trie_key(key: &[u8], v6: bool) -> Option<(u32, Prefix)> {
    let (size, len_at, set_at, addr_at, width) = if v6 {
        (
            size_of::<V6Key>(),
            offset_of!(V6Key, prefixlen),
            offset_of!(V6Key, set_id),
            offset_of!(V6Key, addr),
            128u32,
        )
    } else {
        (
            size_of::<V4Key>(),
            offset_of!(V4Key, prefixlen),
            offset_of!(V4Key, set_id),
            offset_of!(V4Key, addr),
            32u32,
        )
    };
    if key.len() != size {
        return None;
    }
    let bits = u32_at(key, len_at)?.checked_sub(SET_ID_BITS)?;
    if bits > width {
        return None;
    }
    let set_id = u32::from_be_bytes(key.get(set_at..set_at + 4)?.try_into().ok()?);
    let addr = if v6 {
        let octets: [u8; 16] = key.get(addr_at..addr_at + 16)?.try_into().ok()?;
        IpAddr::V6(Ipv6Addr::from(octets))
    } else {
        let octets: [u8; 4] = key.get(addr_at..addr_at + 4)?.try_into().ok()?;
        IpAddr::V4(Ipv4Addr::from(octets))
    };
    let prefix = Prefix::new(addr, u8::try_from(bits).ok()?).ok()?;
    Some((set_id, prefix))
}

/// The `egress_generation` key of the slot userspace writes.
pub(super) const GENERATION_POLICY_KEY: [u8; 4] =
    types::krt_egress_generation_slot::KRT_EGRESS_GEN_POLICY
        .0
        .to_ne_bytes();

/// The `egress_meta` key (its only element).
pub(super) const META_KEY: [u8; 4] = 0u32.to_ne_bytes();

/// The `egress_meta` value recording layout `version` (this build writes
/// [`LAYOUT_VERSION`]).
pub(super) fn meta_value(version: u32) -> Vec<u8> {
    let mut value = vec![0u8; size_of::<Meta>()];
    put(
        &mut value,
        offset_of!(Meta, layout_version),
        &version.to_ne_bytes(),
    );
    value
}

/// The layout version of an `egress_meta` value.
pub(super) fn decode_meta(value: &[u8]) -> Option<u32> {
    (value.len() == size_of::<Meta>())
        .then(|| u32_at(value, offset_of!(Meta, layout_version)))
        .flatten()
}

/// A ledger policy id field: `id` NUL-padded; `None` unless `id` is 1 to
/// 63 bytes without a NUL.
fn id_field(id: &[u8]) -> Option<[u8; POLICY_ID_LEN]> {
    if id.is_empty() || id.len() >= POLICY_ID_LEN || id.contains(&0) {
        return None;
    }
    let mut field = [0u8; POLICY_ID_LEN];
    field[..id.len()].copy_from_slice(id);
    Some(field)
}

/// The id in a NUL-padded field at the start of `bytes`; `None` when empty
/// or not NUL-padded.
fn decode_id(bytes: &[u8]) -> Option<Vec<u8>> {
    let field = bytes.get(..POLICY_ID_LEN)?;
    let len = field.iter().position(|b| *b == 0)?;
    if len == 0 || field[len..].iter().any(|b| *b != 0) {
        return None;
    }
    Some(field[..len].to_vec())
}

/// The `egress_policies` key of a policy id.
pub(super) fn policy_key(id: &[u8]) -> Option<Vec<u8>> {
    id_field(id).map(|f| f.to_vec())
}

/// The `egress_policies` value of a kind.
pub(super) fn policy_value(kind: LedgerKind) -> Vec<u8> {
    let (raw, flags) = match kind {
        LedgerKind::Enforce { default_deny } => (
            PolicyKind::KRT_EGRESS_POLICY_ENFORCE.0,
            if default_deny {
                PolicyFlag::KRT_EGRESS_POLICY_DEFAULT_DENY.0
            } else {
                0
            },
        ),
        LedgerKind::Observe => (PolicyKind::KRT_EGRESS_POLICY_OBSERVE.0, 0),
    };
    let mut value = vec![0u8; size_of::<PolicyValue>()];
    put(
        &mut value,
        offset_of!(PolicyValue, kind),
        &raw.to_ne_bytes(),
    );
    put(
        &mut value,
        offset_of!(PolicyValue, flags),
        &flags.to_ne_bytes(),
    );
    value
}

/// An `egress_policies` entry: the policy id and its kind.
pub(super) fn decode_policy(key: &[u8], value: &[u8]) -> Option<(Vec<u8>, LedgerKind)> {
    if key.len() != POLICY_ID_LEN || value.len() != size_of::<PolicyValue>() {
        return None;
    }
    let id = decode_id(key)?;
    let flags = u32_at(value, offset_of!(PolicyValue, flags))?;
    let kind = match u32_at(value, offset_of!(PolicyValue, kind))? {
        k if k == PolicyKind::KRT_EGRESS_POLICY_ENFORCE.0 => LedgerKind::Enforce {
            default_deny: flags & PolicyFlag::KRT_EGRESS_POLICY_DEFAULT_DENY.0 != 0,
        },
        k if k == PolicyKind::KRT_EGRESS_POLICY_OBSERVE.0 => LedgerKind::Observe,
        _ => return None,
    };
    Some((id, kind))
}

const RULE_ALLOW: u8 = 1;
const RULE_DENY: u8 = 2;

/// The `egress_rules` key of one prefix of one policy.
pub(super) fn rule_key(id: &[u8], verdict: Verdict, prefix: &Prefix) -> Option<Vec<u8>> {
    let mut key = vec![0u8; size_of::<RuleKey>()];
    put(&mut key, offset_of!(RuleKey, id), &id_field(id)?);
    key[offset_of!(RuleKey, verdict)] = match verdict {
        Verdict::Allow => RULE_ALLOW,
        Verdict::Deny => RULE_DENY,
    };
    let (family, octets) = match prefix.addr() {
        IpAddr::V4(a) => (Family::KRT_EGRESS_IPV4.0, a.octets().to_vec()),
        IpAddr::V6(a) => (Family::KRT_EGRESS_IPV6.0, a.octets().to_vec()),
    };
    key[offset_of!(RuleKey, family)] = u8::try_from(family).ok()?;
    key[offset_of!(RuleKey, prefix_len)] = prefix.prefix_len();
    put(&mut key, offset_of!(RuleKey, addr), &octets);
    Some(key)
}

/// An `egress_rules` key: the policy id, the list and the prefix.
pub(super) fn decode_rule_key(key: &[u8]) -> Option<(Vec<u8>, Verdict, Prefix)> {
    if key.len() != size_of::<RuleKey>() {
        return None;
    }
    let id = decode_id(key)?;
    let verdict = match key[offset_of!(RuleKey, verdict)] {
        RULE_ALLOW => Verdict::Allow,
        RULE_DENY => Verdict::Deny,
        _ => return None,
    };
    let at = offset_of!(RuleKey, addr);
    let family = u32::from(key[offset_of!(RuleKey, family)]);
    let addr = if family == Family::KRT_EGRESS_IPV4.0 {
        let octets: [u8; 4] = key.get(at..at + 4)?.try_into().ok()?;
        IpAddr::V4(Ipv4Addr::from(octets))
    } else if family == Family::KRT_EGRESS_IPV6.0 {
        let octets: [u8; 16] = key.get(at..at + 16)?.try_into().ok()?;
        IpAddr::V6(Ipv6Addr::from(octets))
    } else {
        return None;
    };
    let prefix = Prefix::new(addr, key[offset_of!(RuleKey, prefix_len)]).ok()?;
    Some((id, verdict, prefix))
}

/// The `egress_bindings` key of a (policy, cgroup) binding.
pub(super) fn binding_key(id: &[u8], cgroup_id: u64) -> Option<Vec<u8>> {
    let mut key = vec![0u8; size_of::<BindingKey>()];
    put(&mut key, offset_of!(BindingKey, id), &id_field(id)?);
    put(
        &mut key,
        offset_of!(BindingKey, cgroup_id),
        &cgroup_id.to_ne_bytes(),
    );
    Some(key)
}

/// An `egress_bindings` key: the policy id and the cgroup id.
pub(super) fn decode_binding_key(key: &[u8]) -> Option<(Vec<u8>, u64)> {
    if key.len() != size_of::<BindingKey>() {
        return None;
    }
    Some((
        decode_id(key)?,
        u64_at(key, offset_of!(BindingKey, cgroup_id))?,
    ))
}

/// The verdict bits of `verdicts`.
fn verdict_bits(verdicts: DomainVerdicts) -> u32 {
    let mut bits = 0;
    if verdicts.allow {
        bits |= DomainVerdict::KRT_EGRESS_DOMAIN_ALLOW.0;
    }
    if verdicts.deny {
        bits |= DomainVerdict::KRT_EGRESS_DOMAIN_DENY.0;
    }
    if verdicts.observe {
        bits |= DomainVerdict::KRT_EGRESS_DOMAIN_OBSERVE.0;
    }
    bits
}

/// The verdicts of verdict bits (unknown bits ignored, as the programs
/// ignore them).
fn decode_verdict_bits(bits: u32) -> DomainVerdicts {
    DomainVerdicts {
        allow: bits & DomainVerdict::KRT_EGRESS_DOMAIN_ALLOW.0 != 0,
        deny: bits & DomainVerdict::KRT_EGRESS_DOMAIN_DENY.0 != 0,
        observe: bits & DomainVerdict::KRT_EGRESS_DOMAIN_OBSERVE.0 != 0,
    }
}

/// The `egress_domains` key of `domain` in set `set_id`.
pub(super) fn domain_key(set_id: u32, domain: &Domain) -> Vec<u8> {
    let mut key = vec![0u8; size_of::<DomainKeyT>()];
    put(&mut key, offset_of!(DomainKeyT, name), &domain.key());
    put(
        &mut key,
        offset_of!(DomainKeyT, set_id),
        &set_id.to_ne_bytes(),
    );
    key
}

/// The `egress_domains` value of a name's sides and id.
pub(super) fn domain_value(verdicts: DomainVerdicts, name_id: u32) -> Vec<u8> {
    let mut value = vec![0u8; size_of::<DomainValue>()];
    put(
        &mut value,
        offset_of!(DomainValue, verdicts),
        &verdict_bits(verdicts).to_ne_bytes(),
    );
    put(
        &mut value,
        offset_of!(DomainValue, name_id),
        &name_id.to_ne_bytes(),
    );
    value
}

/// An `egress_domains` entry: `(set id, domain, sides, name id)`; `None`
/// for bytes this code does not write.
pub(super) fn decode_domain(
    key: &[u8],
    value: &[u8],
) -> Option<(u32, Domain, DomainVerdicts, u32)> {
    if key.len() != size_of::<DomainKeyT>() || value.len() != size_of::<DomainValue>() {
        return None;
    }
    let at = offset_of!(DomainKeyT, name);
    let domain = Domain::from_key(key.get(at..at + DOMAIN_KEY_LEN)?)?;
    let set_id = u32_at(key, offset_of!(DomainKeyT, set_id))?;
    let verdicts = decode_verdict_bits(u32_at(value, offset_of!(DomainValue, verdicts))?);
    let name_id = u32_at(value, offset_of!(DomainValue, name_id))?;
    (!verdicts.is_empty()).then_some((set_id, domain, verdicts, name_id))
}

/// The `egress_learned` key of `addr` in set `set_id`.
pub(super) fn learned_key(set_id: u32, addr: IpAddr) -> Vec<u8> {
    let mut key = vec![0u8; size_of::<LearnedKey>()];
    put(
        &mut key,
        offset_of!(LearnedKey, set_id),
        &set_id.to_ne_bytes(),
    );
    let (family, octets) = family_and_octets(addr);
    put(
        &mut key,
        offset_of!(LearnedKey, family),
        &family.to_ne_bytes(),
    );
    put(&mut key, offset_of!(LearnedKey, addr), &octets);
    key
}

/// The `dns_resolvers` key of a declared resolver (an IPv4-mapped IPv6
/// address as the IPv4 address its packets carry).
pub(super) fn resolver_key(addr: IpAddr) -> Vec<u8> {
    let mut key = vec![0u8; size_of::<ResolverKey>()];
    let (family, octets) = family_and_octets(addr.to_canonical());
    put(
        &mut key,
        offset_of!(ResolverKey, family),
        &family.to_ne_bytes(),
    );
    put(&mut key, offset_of!(ResolverKey, addr), &octets);
    key
}

/// A slot of `observe_share`.
#[derive(Clone, Copy, Debug)]
pub(super) enum ObsShareSlot {
    /// The drain epoch.
    Epoch,
    /// The per-set share.
    Share,
}

/// The `observe_share` key of `slot`.
pub(super) fn obs_share_slot(slot: ObsShareSlot) -> [u8; 4] {
    match slot {
        ObsShareSlot::Epoch => RawShareSlot::KRT_EGRESS_OBS_EPOCH.0,
        ObsShareSlot::Share => RawShareSlot::KRT_EGRESS_OBS_SHARE.0,
    }
    .to_ne_bytes()
}

/// An `observe_budget` entry: the set and the observations it counted
/// past its share.
pub(super) fn decode_obs_budget(key: &[u8], value: &[u8]) -> Option<(u32, u64)> {
    if value.len() != size_of::<ObsBudget>() {
        return None;
    }
    Some((
        u32_at(key, 0)?,
        u64_at(value, offset_of!(ObsBudget, over_share))?,
    ))
}

/// A `learned_budget` entry: the set, the keys the snooper added, the
/// records it did not learn past the set's share, and the responses it
/// refused.
pub(super) fn decode_learned_budget(key: &[u8], value: &[u8]) -> Option<(u32, [u64; 3])> {
    if value.len() != size_of::<LearnedBudget>() {
        return None;
    }
    Some((
        u32_at(key, 0)?,
        [
            u64_at(value, offset_of!(LearnedBudget, inserted))?,
            u64_at(value, offset_of!(LearnedBudget, over_share))?,
            u64_at(value, offset_of!(LearnedBudget, answers_refused))?,
        ],
    ))
}

/// The `learned_share` key (its only element), and the key of a set in
/// `learned_budget` and `learned_released`.
pub(super) fn set_key(set_id: u32) -> [u8; 4] {
    set_id.to_ne_bytes()
}

/// The expiry of an `egress_learned` value.
pub(super) fn learned_value_expires(value: &[u8]) -> Option<u64> {
    if value.len() != size_of::<LearnedValue>() {
        return None;
    }
    u64_at(value, offset_of!(LearnedValue, expires_ns))
}

/// The `dns_resolvers` value (a presence flag).
pub(super) const RESOLVER_VALUE: [u8; 1] = [1];

/// The `egress_learned` value: expiry (`bpf_ktime_get_ns` time), sides,
/// name id.
pub(super) fn learned_value(expires_ns: u64, verdicts: DomainVerdicts, name_id: u32) -> Vec<u8> {
    let mut value = vec![0u8; size_of::<LearnedValue>()];
    put(
        &mut value,
        offset_of!(LearnedValue, expires_ns),
        &expires_ns.to_ne_bytes(),
    );
    put(
        &mut value,
        offset_of!(LearnedValue, verdicts),
        &verdict_bits(verdicts).to_ne_bytes(),
    );
    put(
        &mut value,
        offset_of!(LearnedValue, name_id),
        &name_id.to_ne_bytes(),
    );
    value
}

/// The set id of an `egress_learned` key (to forget a set's entries
/// without decoding the rest).
pub(super) fn learned_key_set(key: &[u8]) -> Option<u32> {
    (key.len() == size_of::<LearnedKey>())
        .then(|| u32_at(key, offset_of!(LearnedKey, set_id)))
        .flatten()
}

/// The name id of an `egress_learned` value.
pub(super) fn learned_value_name_id(value: &[u8]) -> Option<u32> {
    (value.len() == size_of::<LearnedValue>())
        .then(|| u32_at(value, offset_of!(LearnedValue, name_id)))
        .flatten()
}

/// An `egress_learned` entry: `(set id, address, sides, name id, expiry)`;
/// `None` for bytes the snooper does not write.
pub(super) fn decode_learned(
    key: &[u8],
    value: &[u8],
) -> Option<(u32, IpAddr, DomainVerdicts, u32, u64)> {
    if key.len() != size_of::<LearnedKey>() || value.len() != size_of::<LearnedValue>() {
        return None;
    }
    let set_id = u32_at(key, offset_of!(LearnedKey, set_id))?;
    let at = offset_of!(LearnedKey, addr);
    let addr = match types::krt_egress_family(u32_at(key, offset_of!(LearnedKey, family))?) {
        Family::KRT_EGRESS_IPV4 => {
            let octets: [u8; 4] = key.get(at..at + 4)?.try_into().ok()?;
            IpAddr::V4(Ipv4Addr::from(octets))
        }
        Family::KRT_EGRESS_IPV6 => {
            let octets: [u8; 16] = key.get(at..at + 16)?.try_into().ok()?;
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    let expires = u64_at(value, offset_of!(LearnedValue, expires_ns))?;
    let verdicts = decode_verdict_bits(u32_at(value, offset_of!(LearnedValue, verdicts))?);
    let name_id = u32_at(value, offset_of!(LearnedValue, name_id))?;
    Some((set_id, addr, verdicts, name_id, expires))
}

/// The `egress_domain_rules` key of one domain of one policy.
pub(super) fn domain_rule_key(id: &[u8], verdict: Verdict, domain: &Domain) -> Option<Vec<u8>> {
    let mut key = vec![0u8; size_of::<DomainRuleKey>()];
    put(&mut key, offset_of!(DomainRuleKey, id), &id_field(id)?);
    key[offset_of!(DomainRuleKey, verdict)] = match verdict {
        Verdict::Allow => RULE_ALLOW,
        Verdict::Deny => RULE_DENY,
    };
    put(&mut key, offset_of!(DomainRuleKey, name), &domain.key());
    Some(key)
}

/// An `egress_domain_rules` key: the policy id, the list and the domain.
pub(super) fn decode_domain_rule_key(key: &[u8]) -> Option<(Vec<u8>, Verdict, Domain)> {
    if key.len() != size_of::<DomainRuleKey>() {
        return None;
    }
    let id = decode_id(key)?;
    let verdict = match key[offset_of!(DomainRuleKey, verdict)] {
        RULE_ALLOW => Verdict::Allow,
        RULE_DENY => Verdict::Deny,
        _ => return None,
    };
    let at = offset_of!(DomainRuleKey, name);
    let domain = Domain::from_key(key.get(at..at + DOMAIN_KEY_LEN)?)?;
    Some((id, verdict, domain))
}

/// The sum of per-CPU `struct krt_dns_snoop_stats` values; `None` when
/// one has the wrong size.
pub(super) fn sum_snoop_stats(per_cpu: &[Vec<u8>]) -> Option<SnoopStats> {
    let mut s = SnoopStats::default();
    for v in per_cpu {
        if v.len() != size_of::<SnoopStatsValue>() {
            return None;
        }
        let field = |at: usize| u64_at(v, at);
        s.responses += field(offset_of!(SnoopStatsValue, responses))?;
        s.learned += field(offset_of!(SnoopStatsValue, learned))?;
        s.unnamed += field(offset_of!(SnoopStatsValue, unnamed))?;
        s.unchained += field(offset_of!(SnoopStatsValue, unchained))?;
        s.malformed += field(offset_of!(SnoopStatsValue, malformed))?;
        s.name_too_long += field(offset_of!(SnoopStatsValue, name_too_long))?;
        s.walk_limit += field(offset_of!(SnoopStatsValue, walk_limit))?;
        s.unsupported += field(offset_of!(SnoopStatsValue, unsupported))?;
        s.learn_failed += field(offset_of!(SnoopStatsValue, learn_failed))?;
        s.over_share += field(offset_of!(SnoopStatsValue, over_share))?;
        s.answers_refused += field(offset_of!(SnoopStatsValue, answers_refused))?;
        s.untrusted_source += field(offset_of!(SnoopStatsValue, untrusted_source))?;
        s.unsolicited += field(offset_of!(SnoopStatsValue, unsolicited))?;
        s.question_mismatch += field(offset_of!(SnoopStatsValue, question_mismatch))?;
        s.questions_noted += field(offset_of!(SnoopStatsValue, questions_noted))?;
        s.questions_undeclared += field(offset_of!(SnoopStatsValue, questions_undeclared))?;
        s.questions_over_budget += field(offset_of!(SnoopStatsValue, questions_over_budget))?;
        s.questions_unreadable += field(offset_of!(SnoopStatsValue, questions_unreadable))?;
    }
    Some(s)
}

/// The `stats` key (its only element).
pub(super) const STATS_KEY: [u8; 4] = 0u32.to_ne_bytes();

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    b.try_into().ok().map(u32::from_ne_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    b.try_into().ok().map(u64::from_ne_bytes)
}

/// An `observations` key: what one counter counts (set, destination,
/// decision). `None` for bytes no version of the program writes.
pub(super) fn decode_observation_key(key: &[u8]) -> Option<(u32, IpAddr, Decision)> {
    if key.len() != size_of::<ObsKey>() {
        return None;
    }
    let set_id = u32_at(key, offset_of!(ObsKey, set_id))?;
    let decision = match types::krt_egress_decision(u32_at(key, offset_of!(ObsKey, decision))?) {
        RawDecision::KRT_EGRESS_DENIED => Decision::Denied,
        RawDecision::KRT_EGRESS_ALLOWED => Decision::Allowed,
        RawDecision::KRT_EGRESS_DEFAULT_DENIED => Decision::DefaultDenied,
        RawDecision::KRT_EGRESS_UNMATCHED => Decision::Unmatched,
        _ => return None,
    };
    let at = offset_of!(ObsKey, addr);
    let addr = match types::krt_egress_family(u32_at(key, offset_of!(ObsKey, family))?) {
        Family::KRT_EGRESS_IPV4 => {
            let octets: [u8; 4] = key.get(at..at + 4)?.try_into().ok()?;
            IpAddr::V4(Ipv4Addr::from(octets))
        }
        Family::KRT_EGRESS_IPV6 => {
            let octets: [u8; 16] = key.get(at..at + 16)?.try_into().ok()?;
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some((set_id, addr, decision))
}

/// An `observations` value: a packet count.
pub(super) fn decode_count(value: &[u8]) -> Option<u64> {
    (value.len() == size_of::<u64>())
        .then(|| u64_at(value, 0))
        .flatten()
}

/// An observation from a decoded key and its count.
pub(super) fn observation(
    (set_id, destination, decision): (u32, IpAddr, Decision),
    count: u64,
) -> Observation {
    Observation {
        set_id,
        destination,
        decision,
        count,
    }
}

/// The sum of per-CPU `struct krt_egress_stats` values; `None` when one
/// has the wrong size.
pub(super) fn sum_stats(per_cpu: &[Vec<u8>]) -> Option<Stats> {
    let mut s = Stats::default();
    for v in per_cpu {
        if v.len() != size_of::<StatsValue>() {
            return None;
        }
        let field = |at: usize| u64_at(v, at);
        s.denied += field(offset_of!(StatsValue, denied))?;
        s.allowed += field(offset_of!(StatsValue, allowed))?;
        s.default_denied += field(offset_of!(StatsValue, default_denied))?;
        s.unmatched += field(offset_of!(StatsValue, unmatched))?;
        s.malformed_passed += field(offset_of!(StatsValue, malformed_passed))?;
        s.malformed_dropped += field(offset_of!(StatsValue, malformed_dropped))?;
        s.other_protocol += field(offset_of!(StatsValue, other_protocol))?;
        s.observe_inserted += field(offset_of!(StatsValue, observe_inserted))?;
        s.observe_failed += field(offset_of!(StatsValue, observe_failed))?;
        s.learned_hits += field(offset_of!(StatsValue, learned_hits))?;
        s.learned_expired += field(offset_of!(StatsValue, learned_expired))?;
        s.cached += field(offset_of!(StatsValue, cached))?;
        s.cache_failed += field(offset_of!(StatsValue, cache_failed))?;
    }
    Some(s)
}

/// Fuzzing entry point: every decoder of the filter's maps (the
/// observation counters the daemon drains, the learned addresses the
/// snooper writes, the sets, domains and the ledger a restart adopts) on
/// arbitrary bytes, split at the first byte's position into a key and a
/// value. None may panic, whatever the kernel (or a corrupted pin) hands
/// over. Never called outside tests and fuzz targets.
#[doc(hidden)]
pub fn fuzz_decode_maps(data: &[u8]) {
    let split = usize::from(data.first().copied().unwrap_or(0)).min(data.len());
    let (key, value) = data.split_at(split);
    let _ = decode_filter(key, value);
    let _ = decode_trie_key(key, false);
    let _ = decode_trie_key(key, true);
    let _ = decode_meta(value);
    let _ = decode_policy(key, value);
    let _ = decode_rule_key(key);
    let _ = decode_binding_key(key);
    let _ = decode_domain(key, value);
    let _ = decode_learned(key, value);
    let _ = decode_host(key, value);
    let _ = decode_domain_rule_key(key);
    let _ = decode_observation_key(key);
    let _ = decode_count(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn v4_trie_key_counts_the_set_id_bits() {
        let key = trie_key(7, &p("10.0.0.0/8"));
        let mut want = Vec::new();
        want.extend_from_slice(&(32u32 + 8).to_ne_bytes());
        want.extend_from_slice(&[0, 0, 0, 7]);
        want.extend_from_slice(&[10, 0, 0, 0]);
        assert_eq!(key, want);
        assert_eq!(
            key.len(),
            12,
            "u32 prefixlen + be32 set id + 4 address bytes"
        );
    }

    #[test]
    fn v6_trie_key_counts_the_set_id_bits() {
        let key = trie_key(0x0102_0304, &p("2001:db8::/32"));
        assert_eq!(
            key.len(),
            24,
            "u32 prefixlen + be32 set id + 16 address bytes"
        );
        assert_eq!(&key[..4], &(32u32 + 32).to_ne_bytes());
        assert_eq!(&key[4..8], &[1, 2, 3, 4]);
        assert_eq!(&key[8..12], &[0x20, 0x01, 0x0d, 0xb8]);
        assert!(key[12..].iter().all(|&b| b == 0));
    }

    #[test]
    fn zero_length_prefixes_still_pin_the_set() {
        assert_eq!(&trie_key(1, &p("0.0.0.0/0"))[..4], &32u32.to_ne_bytes());
        assert_eq!(&trie_key(1, &p("::/0"))[..4], &32u32.to_ne_bytes());
        assert_eq!(&trie_key(1, &p("::1"))[..4], &160u32.to_ne_bytes());
        // Same prefix, different sets: different keys.
        assert_ne!(trie_key(1, &p("::/0")), trie_key(2, &p("::/0")));
    }

    #[test]
    fn filter_value_carries_set_and_flag_bits() {
        let v = filter_value(9, FilterFlags::default(), 0);
        assert_eq!(v.len(), 8);
        assert_eq!(&v[..4], &9u32.to_ne_bytes());
        assert_eq!(&v[4..], &0u32.to_ne_bytes());
        let all = FilterFlags {
            default_deny: true,
            observe: true,
            domains: true,
        };
        assert_eq!(&filter_value(9, all, 0)[4..], &7u32.to_ne_bytes());
        let observe = FilterFlags {
            observe: true,
            ..FilterFlags::default()
        };
        assert_eq!(&filter_value(9, observe, 0)[4..], &2u32.to_ne_bytes());
        // Occupancy bits are added; anything else in them is not.
        let hosts = Slot::HostsV4.flag() | Slot::AllowV6.flag();
        assert_eq!(
            &filter_value(9, observe, hosts | (1 << 31))[4..],
            &(2 | hosts).to_ne_bytes()
        );
    }

    #[test]
    fn slots_split_hosts_from_shorter_prefixes() {
        let allow = Verdict::Allow;
        let deny = Verdict::Deny;
        assert_eq!(Slot::of(allow, &p("192.0.2.1/32")), Slot::HostsV4);
        assert_eq!(Slot::of(deny, &p("192.0.2.1/32")), Slot::HostsV4);
        assert_eq!(Slot::of(deny, &p("192.0.2.0/31")), Slot::DenyV4);
        assert_eq!(Slot::of(allow, &p("0.0.0.0/0")), Slot::AllowV4);
        assert_eq!(Slot::of(allow, &p("::1/128")), Slot::HostsV6);
        assert_eq!(Slot::of(deny, &p("2001:db8::/127")), Slot::DenyV6);
        assert_eq!(Slot::of(allow, &p("2001:db8::/64")), Slot::AllowV6);
        let bits: Vec<u32> = Slot::ALL.iter().map(|s| s.flag()).collect();
        assert_eq!(bits, [8, 16, 32, 64, 128, 256]);
        for (i, s) in Slot::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }

    #[test]
    fn host_entries_decode_to_what_was_encoded() {
        let both = DomainVerdicts {
            allow: true,
            deny: true,
            observe: false,
        };
        for addr in ["192.0.2.1", "2001:db8::1"] {
            let addr: IpAddr = addr.parse().unwrap();
            let key = host_key(11, addr);
            assert_eq!(key, learned_key(11, addr), "the learned key's layout");
            assert_eq!(
                decode_host(&key, &host_value(both)),
                Some((11, Prefix::host(addr), both))
            );
        }
        let key = host_key(11, "192.0.2.1".parse().unwrap());
        assert_eq!(
            decode_host(&key, &host_value(DomainVerdicts::default())),
            None,
            "no list: no entry"
        );
        let mut bad = key.clone();
        bad[20] = 1;
        assert_eq!(decode_host(&bad, &host_value(both)), None, "v4 tail");
        assert_eq!(decode_host(&key[..20], &host_value(both)), None);
        assert_eq!(decode_host(&key, &[1]), None);
    }

    #[test]
    fn trie_keys_decode_to_what_was_encoded() {
        for (set, prefix, v6) in [
            (7, "10.0.0.0/8", false),
            (1, "0.0.0.0/0", false),
            (0x0102_0304, "127.0.0.2/32", false),
            (9, "2001:db8::/32", true),
            (9, "::/0", true),
            (3, "::1/128", true),
        ] {
            let key = trie_key(set, &p(prefix));
            assert_eq!(decode_trie_key(&key, v6), Some((set, p(prefix))));
            assert_eq!(decode_trie_key(&key, !v6), None, "the other family");
        }
        let mut bad = trie_key(1, &p("10.0.0.0/8"));
        bad[..4].copy_from_slice(&(32u32 + 33).to_ne_bytes());
        assert_eq!(decode_trie_key(&bad, false), None, "/33");
        bad[..4].copy_from_slice(&31u32.to_ne_bytes());
        assert_eq!(decode_trie_key(&bad, false), None, "shorter than a set id");
    }

    #[test]
    fn filters_decode_to_what_was_encoded() {
        let flags = FilterFlags {
            default_deny: true,
            observe: false,
            domains: true,
        };
        assert_eq!(
            decode_filter(&cgroup_key(42), &filter_value(5, flags, 0)),
            Some((42, 5, flags))
        );
        assert_eq!(
            decode_filter(&cgroup_key(42), &filter_value(5, flags, occupancy_mask())),
            Some((42, 5, flags)),
            "occupancy bits are not flags"
        );
        assert_eq!(decode_filter(&[0; 4], &filter_value(5, flags, 0)), None);
    }

    #[test]
    fn ledger_entries_decode_to_what_was_encoded() {
        let id = b"0b5e2a1c-7d4f-4e55-9a3b-5d7c1e2f3a4b";
        for kind in [
            LedgerKind::Observe,
            LedgerKind::Enforce { default_deny: true },
            LedgerKind::Enforce {
                default_deny: false,
            },
        ] {
            let key = policy_key(id).unwrap();
            assert_eq!(key.len(), 64);
            assert_eq!(
                decode_policy(&key, &policy_value(kind)),
                Some((id.to_vec(), kind))
            );
        }
        for (verdict, prefix) in [
            (Verdict::Allow, "10.0.0.0/8"),
            (Verdict::Deny, "2001:db8::1/128"),
            (Verdict::Deny, "0.0.0.0/0"),
        ] {
            let key = rule_key(id, verdict, &p(prefix)).unwrap();
            assert_eq!(key.len(), 84);
            assert_eq!(
                decode_rule_key(&key),
                Some((id.to_vec(), verdict, p(prefix)))
            );
        }
        let key = binding_key(id, 77).unwrap();
        assert_eq!(decode_binding_key(&key), Some((id.to_vec(), 77)));
        assert_eq!(
            decode_meta(&meta_value(LAYOUT_VERSION)),
            Some(LAYOUT_VERSION)
        );
        assert_eq!(decode_meta(&meta_value(7)), Some(7));
    }

    #[test]
    fn ledger_ids_are_nul_free_and_short() {
        assert_eq!(policy_key(b""), None);
        assert_eq!(policy_key(&[b'a'; 64]), None);
        assert!(policy_key(&[b'a'; 63]).is_some());
        assert_eq!(policy_key(b"a\0b"), None);
        // A field that is not NUL-padded is not an id.
        let mut key = policy_key(b"abc").unwrap();
        key[10] = b'x';
        assert_eq!(
            decode_policy(&key, &policy_value(LedgerKind::Observe)),
            None
        );
    }

    #[test]
    fn domain_entries_decode_to_what_was_encoded() {
        let d = Domain::new("Allowed.Test").unwrap();
        let key = domain_key(7, &d);
        assert_eq!(key.len(), 132);
        assert_eq!(&key[..14], b"\x07allowed\x04test\x00");
        assert_eq!(&key[128..], &7u32.to_ne_bytes());
        // Every combination of sides, the observe-only one included (a
        // name only monitor policies give).
        for bits in 1..8u8 {
            let sides = DomainVerdicts {
                allow: bits & 1 != 0,
                deny: bits & 2 != 0,
                observe: bits & 4 != 0,
            };
            assert_eq!(
                decode_domain(&key, &domain_value(sides, 3)),
                Some((7, d.clone(), sides, 3)),
                "{sides:?}"
            );
        }
        // A value naming no side is no entry userspace writes.
        assert_eq!(
            decode_domain(&key, &domain_value(DomainVerdicts::default(), 3)),
            None
        );
        let id = b"uid-1";
        let rule = domain_rule_key(id, Verdict::Deny, &d).unwrap();
        assert_eq!(rule.len(), 196);
        assert_eq!(
            decode_domain_rule_key(&rule),
            Some((id.to_vec(), Verdict::Deny, d))
        );
    }

    #[test]
    fn learned_entries_decode_to_what_was_encoded() {
        let allow = DomainVerdicts {
            allow: true,
            ..DomainVerdicts::default()
        };
        for addr in ["192.0.2.1", "2001:db8::1"] {
            let addr: IpAddr = addr.parse().unwrap();
            let key = learned_key(4, addr);
            let value = learned_value(123_456, allow, 9);
            assert_eq!(learned_key_set(&key), Some(4));
            assert_eq!(learned_value_name_id(&value), Some(9));
            assert_eq!(
                decode_learned(&key, &value),
                Some((4, addr, allow, 9, 123_456))
            );
        }
        let mut bad = learned_key(4, "192.0.2.1".parse().unwrap());
        bad[4] = 5;
        assert_eq!(decode_learned(&bad, &learned_value(1, allow, 1)), None);
        assert_eq!(
            decode_learned(&bad[..20], &learned_value(1, allow, 1)),
            None
        );
    }

    #[test]
    fn snoop_stats_sum_over_cpus() {
        let cpu =
            |base: u64| -> Vec<u8> { (0..18u64).flat_map(|i| (base + i).to_ne_bytes()).collect() };
        let s = sum_snoop_stats(&[cpu(0), cpu(10)]).unwrap();
        assert_eq!(s.responses, 10);
        assert_eq!(s.learned, 12);
        assert_eq!(s.learn_failed, 8 + 18);
        assert_eq!(s.over_share, 9 + 19);
        assert_eq!(s.answers_refused, 10 + 20);
        assert_eq!(s.untrusted_source, 11 + 21);
        assert_eq!(s.questions_unreadable, 17 + 27);
        assert_eq!(sum_snoop_stats(&[vec![0; 8]]), None);
    }

    fn obs_key(set: u32, decision: u32, family: u32, addr: &[u8]) -> Vec<u8> {
        let mut k = Vec::new();
        k.extend_from_slice(&set.to_ne_bytes());
        k.extend_from_slice(&decision.to_ne_bytes());
        k.extend_from_slice(&family.to_ne_bytes());
        let mut a = [0u8; 16];
        a[..addr.len()].copy_from_slice(addr);
        k.extend_from_slice(&a);
        k
    }

    #[test]
    fn observation_keys_decode() {
        let k = obs_key(5, 1, 4, &[192, 0, 2, 1]);
        assert_eq!(
            decode_observation_key(&k),
            Some((5, "192.0.2.1".parse().unwrap(), Decision::Denied))
        );
        let v6: Ipv6Addr = "2001:db8::7".parse().unwrap();
        let k = obs_key(6, 4, 6, &v6.octets());
        assert_eq!(
            decode_observation_key(&k),
            Some((6, IpAddr::V6(v6), Decision::Unmatched))
        );
        assert_eq!(
            decode_observation_key(&obs_key(1, 2, 4, &[1, 1, 1, 1])).map(|k| k.2),
            Some(Decision::Allowed)
        );
        assert_eq!(
            decode_observation_key(&obs_key(1, 3, 4, &[1, 1, 1, 1])).map(|k| k.2),
            Some(Decision::DefaultDenied)
        );
    }

    #[test]
    fn foreign_observation_keys_are_refused() {
        assert_eq!(
            decode_observation_key(&obs_key(1, 0, 4, &[])),
            None,
            "decision 0"
        );
        assert_eq!(
            decode_observation_key(&obs_key(1, 5, 4, &[])),
            None,
            "decision 5"
        );
        assert_eq!(
            decode_observation_key(&obs_key(1, 1, 5, &[])),
            None,
            "family 5"
        );
        assert_eq!(
            decode_observation_key(&obs_key(1, 1, 4, &[])[..27]),
            None,
            "short"
        );
        assert_eq!(decode_count(&7u64.to_ne_bytes()), Some(7));
        assert_eq!(decode_count(&[0; 4]), None);
    }

    #[test]
    fn stats_sum_over_cpus_field_by_field() {
        let cpu =
            |base: u64| -> Vec<u8> { (0..13u64).flat_map(|i| (base + i).to_ne_bytes()).collect() };
        let s = sum_stats(&[cpu(0), cpu(100)]).unwrap();
        assert_eq!(s.denied, 100);
        assert_eq!(s.allowed, 102);
        assert_eq!(s.other_protocol, 6 + 106);
        assert_eq!(s.observe_failed, 8 + 108);
        assert_eq!(s.learned_expired, 10 + 110);
        assert_eq!(s.cached, 11 + 111);
        assert_eq!(s.cache_failed, 12 + 112);
        assert_eq!(sum_stats(&[vec![0; 8]]), None);
        assert_eq!(sum_stats(&[]), Some(Stats::default()));
    }
}
