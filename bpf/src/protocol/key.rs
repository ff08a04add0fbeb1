//! Map keys and values as the kernel reads them, laid out from the
//! skeleton's types (`bpf/include/protocol.h`), never from hand-copied
//! offsets; protocol, decision and flag values come from the skeleton's
//! enum constants.
//!
//! Encoding writes into buffers sized from the same types, so it cannot go
//! out of bounds; decoding checks every access of the bytes the kernel
//! returned, so a skew between object and code is an error, not a panic.

use std::mem::{offset_of, size_of};

use super::{Alpn, Decision, ProtoEvent, ProtoFlags, ProtoKey, ProtoStats, Protocol, ALPN_MAX_LEN};
use crate::skel::protocol::classifier::types;

type Gate = types::krt_proto_gate;
type RuleKey = types::krt_proto_key;
type EventKey = types::krt_proto_event_key;
type FlowKey = types::krt_flow_key;
type FlowVerdict = types::krt_flow_verdict;
type StatsValue = types::krt_proto_stats;
type Id = types::krt_proto_id;
type RawDecision = types::krt_proto_decision;
type Flag = types::krt_proto_flag;

// What the rest of the handle assumes about the layouts.
const _: () = {
    assert!(
        size_of::<RuleKey>() == 24,
        "krt_proto_key must stay padding-free"
    );
    assert!(
        size_of::<EventKey>() == 32,
        "krt_proto_event_key must stay padding-free"
    );
    assert!(size_of::<FlowKey>() == 48);
    assert!(size_of::<FlowVerdict>() == 32);
    assert!(size_of::<Gate>() == 8);
    assert!(size_of::<[i8; ALPN_MAX_LEN]>() == size_of::<[u8; ALPN_MAX_LEN]>());
};

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(size_of::<u32>())?)?;
    b.try_into().ok().map(u32::from_ne_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(size_of::<u64>())?)?;
    b.try_into().ok().map(u64::from_ne_bytes)
}

fn alpn_at(bytes: &[u8], at: usize) -> Option<[u8; ALPN_MAX_LEN]> {
    bytes
        .get(at..at.checked_add(ALPN_MAX_LEN)?)?
        .try_into()
        .ok()
}

/// The kernel's id of `protocol` (`enum krt_proto_id`).
pub(super) const fn proto_id(protocol: Protocol) -> u32 {
    match protocol {
        Protocol::Unclassified => Id::KRT_PROTO_UNCLASSIFIED.0,
        Protocol::Ssh => Id::KRT_PROTO_SSH.0,
        Protocol::Tls => Id::KRT_PROTO_TLS.0,
        Protocol::Http2 => Id::KRT_PROTO_HTTP2.0,
        Protocol::Http1 => Id::KRT_PROTO_HTTP1.0,
        Protocol::Quic => Id::KRT_PROTO_QUIC.0,
        Protocol::Dns => Id::KRT_PROTO_DNS.0,
    }
}

/// The protocol of a kernel id; `None` for an id this code does not know.
pub(super) fn protocol(id: u32) -> Option<Protocol> {
    Protocol::ALL.into_iter().find(|&p| proto_id(p) == id)
}

/// The decision of a kernel value (`enum krt_proto_decision`).
pub(super) fn decision(raw: u32) -> Option<Decision> {
    Some(match types::krt_proto_decision(raw) {
        RawDecision::KRT_DECISION_PASS => Decision::Pass,
        RawDecision::KRT_DECISION_ALLOW => Decision::Allow,
        RawDecision::KRT_DECISION_DENY => Decision::Deny,
        RawDecision::KRT_DECISION_DEFAULT_DENY => Decision::DefaultDeny,
        _ => return None,
    })
}

/// The `proto_cgroups` key of a cgroup id.
pub(super) fn cgroup_key(cgroup_id: u64) -> [u8; 8] {
    cgroup_id.to_ne_bytes()
}

/// The `struct krt_proto_gate` of a set and its flags.
pub(super) fn gate_value(set_id: u32, flags: ProtoFlags) -> Vec<u8> {
    let mut bits = 0;
    if flags.default_deny {
        bits |= Flag::KRT_PROTO_F_DEFAULT_DENY.0;
    }
    if flags.observe {
        bits |= Flag::KRT_PROTO_F_OBSERVE.0;
    }
    let mut value = vec![0u8; size_of::<Gate>()];
    put(&mut value, offset_of!(Gate, set_id), &set_id.to_ne_bytes());
    put(&mut value, offset_of!(Gate, flags), &bits.to_ne_bytes());
    value
}

/// The `struct krt_proto_key` of a rule of set `set_id`: all-zero ALPN
/// bytes for "any ALPN".
pub(super) fn rule_key(set_id: u32, key: &ProtoKey) -> Vec<u8> {
    let mut raw = vec![0u8; size_of::<RuleKey>()];
    put(&mut raw, offset_of!(RuleKey, set_id), &set_id.to_ne_bytes());
    put(
        &mut raw,
        offset_of!(RuleKey, proto_id),
        &proto_id(key.protocol()).to_ne_bytes(),
    );
    if let Some(alpn) = key.alpn() {
        put(&mut raw, offset_of!(RuleKey, alpn), &alpn.padded());
    }
    raw
}

/// The value of every rule (the program only tests presence).
pub(super) const RULE_VALUE: [u8; 1] = [1];

/// The key of the one-element arrays (`proto_stats`, `proto_generation`).
pub(super) const ZERO_KEY: [u8; 4] = 0u32.to_ne_bytes();

/// A `proto_generation` value.
pub(super) fn generation_value(generation: u64) -> [u8; 8] {
    generation.to_ne_bytes()
}

/// What a `proto_events` key says, before its count is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EventKeyFields {
    pub(super) cgroup_id: u64,
    pub(super) key: ProtoKey,
    pub(super) decision: Decision,
}

/// Decodes a `struct krt_proto_event_key`; `None` for bytes this code
/// cannot read (wrong size, unknown protocol or decision, a malformed
/// ALPN, an ALPN on a protocol without one).
pub(super) fn decode_event_key(raw: &[u8]) -> Option<EventKeyFields> {
    if raw.len() != size_of::<EventKey>() {
        return None;
    }
    let cgroup_id = u64_at(raw, offset_of!(EventKey, cgroup_id))?;
    let protocol = protocol(u32_at(raw, offset_of!(EventKey, proto_id))?)?;
    let decision = decision(u32_at(raw, offset_of!(EventKey, decision))?)?;
    let alpn = Alpn::from_padded(alpn_at(raw, offset_of!(EventKey, alpn))?).ok()?;
    let key = match alpn {
        None => ProtoKey::any(protocol),
        Some(alpn) => ProtoKey::with_alpn(protocol, alpn).ok()?,
    };
    Some(EventKeyFields {
        cgroup_id,
        key,
        decision,
    })
}

/// The event of a decoded key and its count.
pub(super) const fn event(fields: EventKeyFields, count: u64) -> ProtoEvent {
    ProtoEvent {
        cgroup_id: fields.cgroup_id,
        key: fields.key,
        decision: fields.decision,
        count,
    }
}

/// A `u64` count value.
pub(super) fn decode_count(value: &[u8]) -> Option<u64> {
    (value.len() == size_of::<u64>())
        .then(|| u64_at(value, 0))
        .flatten()
}

/// Sums the per-CPU `struct krt_proto_stats` values; `None` if one has the
/// wrong size.
pub(super) fn sum_stats(per_cpu: &[Vec<u8>]) -> Option<ProtoStats> {
    let mut s = ProtoStats::default();
    let classified = offset_of!(StatsValue, classified);
    let class = |cpu: &[u8], p: Protocol| {
        let idx = usize::try_from(proto_id(p)).ok()?;
        u64_at(
            cpu,
            classified.checked_add(idx.checked_mul(size_of::<u64>())?)?,
        )
    };
    for cpu in per_cpu {
        if cpu.len() != size_of::<StatsValue>() {
            return None;
        }
        let field = |at: usize| u64_at(cpu, at);
        s.packets += field(offset_of!(StatsValue, packets))?;
        s.deferred += field(offset_of!(StatsValue, deferred))?;
        s.cached += field(offset_of!(StatsValue, cached))?;
        s.ssh += class(cpu, Protocol::Ssh)?;
        s.tls += class(cpu, Protocol::Tls)?;
        s.http2 += class(cpu, Protocol::Http2)?;
        s.http1 += class(cpu, Protocol::Http1)?;
        s.quic += class(cpu, Protocol::Quic)?;
        s.dns += class(cpu, Protocol::Dns)?;
        s.unclassified += class(cpu, Protocol::Unclassified)?;
        s.parse_failures += field(offset_of!(StatsValue, parse_failures))?;
        s.drops += field(offset_of!(StatsValue, drops))?;
        s.events_lost += field(offset_of!(StatsValue, events_lost))?;
        s.flows_lost += field(offset_of!(StatsValue, flows_lost))?;
    }
    Some(s)
}

/// Fuzzing entry point: the classifier's flow-event key and count decoders
/// on arbitrary bytes (split at the first byte's position); neither may
/// panic. Never called outside tests and fuzz targets.
#[doc(hidden)]
pub fn fuzz_decode_maps(data: &[u8]) {
    let split = usize::from(data.first().copied().unwrap_or(0)).min(data.len());
    let (key, value) = data.split_at(split);
    let _ = decode_event_key(key);
    let _ = decode_count(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_h2() -> ProtoKey {
        ProtoKey::with_alpn(Protocol::Tls, Alpn::new("h2").unwrap()).unwrap()
    }

    #[test]
    fn protocol_ids_are_the_kernels_and_round_trip() {
        assert_eq!(proto_id(Protocol::Unclassified), 1);
        assert_eq!(proto_id(Protocol::Dns), 7);
        // Every id indexes krt_proto_stats.classified.
        let slots = size_of::<[u64; 8]>() / size_of::<u64>();
        for p in Protocol::ALL {
            assert_eq!(protocol(proto_id(p)), Some(p));
            assert!((proto_id(p) as usize) < slots);
            assert_eq!(Id::KRT_PROTO_COUNT.0 as usize, slots);
        }
        assert_eq!(protocol(0), None);
        assert_eq!(protocol(Id::KRT_PROTO_COUNT.0), None);
    }

    #[test]
    fn rule_keys_are_laid_out_like_the_c_struct() {
        let k = rule_key(7, &tls_h2());
        assert_eq!(k.len(), 24, "u32 set_id + u32 proto_id + 16 ALPN bytes");
        assert_eq!(&k[0..4], &7u32.to_ne_bytes());
        assert_eq!(&k[4..8], &3u32.to_ne_bytes());
        assert_eq!(&k[8..10], b"h2");
        assert!(k[10..].iter().all(|&b| b == 0), "NUL padded: {k:?}");

        // "Any ALPN" is the all-zero ALPN.
        let any = rule_key(7, &ProtoKey::any(Protocol::Tls));
        assert_eq!(&any[..8], &k[..8]);
        assert_eq!(&any[8..], &[0u8; 16]);

        let long = ProtoKey::with_alpn(Protocol::Tls, Alpn::new([b'x'; 16]).unwrap()).unwrap();
        assert_eq!(&rule_key(1, &long)[8..], &[b'x'; 16]);
    }

    #[test]
    fn gate_values_carry_set_and_flag_bits() {
        let v = gate_value(
            0x0102_0304,
            ProtoFlags {
                default_deny: true,
                observe: false,
            },
        );
        assert_eq!(v.len(), 8);
        assert_eq!(&v[0..4], &0x0102_0304u32.to_ne_bytes());
        assert_eq!(&v[4..8], &1u32.to_ne_bytes());
        let both = ProtoFlags {
            default_deny: true,
            observe: true,
        };
        assert_eq!(&gate_value(0, both)[4..8], &3u32.to_ne_bytes());
        assert_eq!(&gate_value(0, ProtoFlags::default())[4..8], &[0; 4]);
    }

    fn raw_event(cgroup: u64, proto: u32, decision: u32, alpn: &[u8]) -> Vec<u8> {
        let mut raw = vec![0u8; size_of::<EventKey>()];
        put(
            &mut raw,
            offset_of!(EventKey, cgroup_id),
            &cgroup.to_ne_bytes(),
        );
        put(
            &mut raw,
            offset_of!(EventKey, proto_id),
            &proto.to_ne_bytes(),
        );
        put(
            &mut raw,
            offset_of!(EventKey, decision),
            &decision.to_ne_bytes(),
        );
        put(&mut raw, offset_of!(EventKey, alpn), alpn);
        raw
    }

    #[test]
    fn event_keys_decode() {
        let f = decode_event_key(&raw_event(42, 3, 3, b"h2")).unwrap();
        assert_eq!(f.cgroup_id, 42);
        assert_eq!(f.key, tls_h2());
        assert_eq!(f.decision, Decision::Deny);
        let ev = event(f, 5);
        assert_eq!(ev.count, 5);

        let f = decode_event_key(&raw_event(1, 2, 4, b"")).unwrap();
        assert_eq!(f.key, ProtoKey::any(Protocol::Ssh));
        assert_eq!(f.decision, Decision::DefaultDeny);
        let f = decode_event_key(&raw_event(1, 1, 1, b"")).unwrap();
        assert_eq!(
            (f.key.protocol(), f.decision),
            (Protocol::Unclassified, Decision::Pass)
        );
    }

    #[test]
    fn undecodable_event_keys_are_refused() {
        assert_eq!(decode_event_key(&raw_event(1, 99, 1, b"")), None);
        assert_eq!(decode_event_key(&raw_event(1, 2, 0, b"")), None);
        // An ALPN on SSH, a holey ALPN: not a key the kernel writes.
        assert_eq!(decode_event_key(&raw_event(1, 2, 1, b"h2")), None);
        assert_eq!(decode_event_key(&raw_event(1, 3, 1, b"a\0b")), None);
        assert_eq!(decode_event_key(&[0u8; 31]), None);
    }

    #[test]
    fn counts_and_stats_decode() {
        assert_eq!(decode_count(&9u64.to_ne_bytes()), Some(9));
        assert_eq!(decode_count(&[0u8; 4]), None);

        let mut cpu = vec![0u8; size_of::<StatsValue>()];
        put(
            &mut cpu,
            offset_of!(StatsValue, packets),
            &3u64.to_ne_bytes(),
        );
        let tls_at = offset_of!(StatsValue, classified) + 3 * 8;
        put(&mut cpu, tls_at, &2u64.to_ne_bytes());
        let unclassified_at = offset_of!(StatsValue, classified) + 8;
        put(&mut cpu, unclassified_at, &1u64.to_ne_bytes());
        put(
            &mut cpu,
            offset_of!(StatsValue, flows_lost),
            &7u64.to_ne_bytes(),
        );
        let s = sum_stats(&[cpu.clone(), cpu]).unwrap();
        assert_eq!(s.packets, 6);
        assert_eq!(s.tls, 4);
        assert_eq!(s.unclassified, 2);
        assert_eq!(s.flows_lost, 14);
        assert_eq!(s.decisions(), 6);
        assert_eq!(sum_stats(&[vec![0u8; 3]]), None);
    }

    #[test]
    fn generation_and_zero_keys() {
        assert_eq!(generation_value(5), 5u64.to_ne_bytes());
        assert_eq!(ZERO_KEY, [0; 4]);
        assert_eq!(cgroup_key(1), 1u64.to_ne_bytes());
    }
}
