//! Map keys and values as the kernel reads them, laid out from the
//! skeleton's types (`bpf/include/egress.h`), never from hand-copied
//! offsets.
//!
//! Encoding writes into buffers sized from the same types, so it cannot
//! go out of bounds; decoding reads bytes the kernel returned and checks
//! every access, so a skew between object and code is an error, not a
//! panic.

use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Decision, FilterFlags, Observation, Prefix, Stats};
use crate::skel::egress::egress_filter::types;

type V4Key = types::krt_egress_v4_key;
type V6Key = types::krt_egress_v6_key;
type FilterValue = types::krt_egress_filter;
type ObsKey = types::krt_egress_obs_key;
type StatsValue = types::krt_egress_stats;
type Flag = types::krt_egress_flag;
type RawDecision = types::krt_egress_decision;
type Family = types::krt_egress_family;

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

/// The value of every trie entry (the program only tests presence).
pub(super) const TRIE_VALUE: [u8; 1] = [1];

/// The `cgroup_filters` key of a cgroup id.
pub(super) fn cgroup_key(cgroup_id: u64) -> [u8; 8] {
    cgroup_id.to_ne_bytes()
}

/// The `struct krt_egress_filter` of a set and its flags.
pub(super) fn filter_value(set_id: u32, flags: FilterFlags) -> Vec<u8> {
    let mut bits = 0;
    if flags.default_deny {
        bits |= Flag::KRT_EGRESS_FLAG_DEFAULT_DENY.0;
    }
    if flags.observe {
        bits |= Flag::KRT_EGRESS_FLAG_OBSERVE.0;
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
    }
    Some(s)
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
        let v = filter_value(9, FilterFlags::default());
        assert_eq!(v.len(), 8);
        assert_eq!(&v[..4], &9u32.to_ne_bytes());
        assert_eq!(&v[4..], &0u32.to_ne_bytes());
        let all = FilterFlags {
            default_deny: true,
            observe: true,
        };
        assert_eq!(&filter_value(9, all)[4..], &3u32.to_ne_bytes());
        let observe = FilterFlags {
            observe: true,
            ..FilterFlags::default()
        };
        assert_eq!(&filter_value(9, observe)[4..], &2u32.to_ne_bytes());
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
            |base: u64| -> Vec<u8> { (0..9u64).flat_map(|i| (base + i).to_ne_bytes()).collect() };
        let s = sum_stats(&[cpu(0), cpu(100)]).unwrap();
        assert_eq!(s.denied, 100);
        assert_eq!(s.allowed, 102);
        assert_eq!(s.other_protocol, 6 + 106);
        assert_eq!(s.observe_failed, 8 + 108);
        assert_eq!(sum_stats(&[vec![0; 8]]), None);
        assert_eq!(sum_stats(&[]), Some(Stats::default()));
    }
}
