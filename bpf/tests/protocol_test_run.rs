//! The protocol classifier on the host kernel with BPF_PROG_TEST_RUN (tier
//! 2: needs root and a cgroup v2 mount).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! protocol_test_run -- --test-threads=1`. Nothing is attached: every
//! packet is a test run, an Ethernet frame the kernel strips to the IP
//! header (the program sees `skb->protocol` from the EtherType and the IP
//! header at offset 0, as on real egress).
//!
//! How the packet's cgroup is chosen: the kernel gives a test-run skb a
//! socket it allocates in the calling process, so `bpf_skb_cgroup_id`
//! returns this process's cgroup v2 id (measured on 6.18, and proved with a
//! non-root cgroup by `moved_into_a_child_cgroup_the_classifier_sees_it`);
//! the program's fallback to `bpf_get_current_cgroup_id` would give the
//! same id. The tests read that id the way the agent reads a container's
//! (the inode number of its cgroup v2 directory: the `0::` path of
//! /proc/self/cgroup under the mount from /proc/self/mountinfo).
//!
//! Each case loads its own classifier, so the counters, the flow cache and
//! the events start empty, and uses a distinct source port per flow.

// A test harness, helpers included: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;
#[path = "common/tlsmsg.rs"]
mod tlsmsg;

use cgroup::{cgroup2_mount, cgroup_id, exclusive, own_cgroup_dir, shared};
use std::fs;
use tlsmsg::{alpn_extension, client_hello, client_hello_with, extension, u16be};

use kyverno_runtime_bpf::protocol::{
    Alpn, Decision, ProtoEvent, ProtoFlags, ProtoKey, ProtoStats, Protocol, ProtocolClassifier,
    ProtocolError, Verdict,
};

const PASS: u32 = 1;
const DROP: u32 = 0;

const SET: u32 = 7;

// ----------------------------------------------------------------------------
// The test process's cgroup.

// shared() and exclusive(): tests/common/cgroup.rs.

// ----------------------------------------------------------------------------
// Frames.

const ETH_IPV4: u16 = 0x0800;
const ETH_IPV6: u16 = 0x86dd;
const TCP: u8 = 6;
const UDP: u8 = 17;
/// PSH|ACK: an ordinary data segment.
const PSH_ACK: u8 = 0x18;
const SYN: u8 = 0x02;

const SRC4: [u8; 4] = [10, 0, 0, 1];
const DST4: [u8; 4] = [10, 0, 0, 2];
const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

fn ethernet(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 packet (no options) carrying `l4` as protocol `proto`; `frag`
/// is the flags + fragment offset field (0x4000 is DF).
fn ipv4_with(proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + l4.len()).unwrap();
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&SRC4);
    h.extend_from_slice(&DST4);
    let csum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&csum.to_be_bytes());
    h.extend_from_slice(l4);
    ethernet(ETH_IPV4, &h)
}

fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4_with(proto, 0x4000, l4)
}

/// An IPv6 packet whose first next-header is `next` and whose payload (L4
/// or an extension header chain) is `payload`.
fn ipv6(next: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&SRC6);
    h.extend_from_slice(&DST6);
    h.extend_from_slice(payload);
    ethernet(ETH_IPV6, &h)
}

fn tcp_segment(sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&1u32.to_be_bytes()); // seq
    t.extend_from_slice(&1u32.to_be_bytes()); // ack
    t.extend_from_slice(&[0x50, flags]); // doff 5
    t.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, csum, urg
    t.extend_from_slice(payload);
    t
}

fn udp_datagram(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

fn tcp4(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ipv4(TCP, &tcp_segment(sport, dport, PSH_ACK, payload))
}

fn tcp4_flags(sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    ipv4(TCP, &tcp_segment(sport, dport, flags, payload))
}

fn udp4(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ipv4(UDP, &udp_datagram(sport, dport, payload))
}

fn tcp6(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ipv6(TCP, &tcp_segment(sport, dport, PSH_ACK, payload))
}

fn udp6(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ipv6(UDP, &udp_datagram(sport, dport, payload))
}

// ----------------------------------------------------------------------------
// Payloads.

const SSH_BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n";
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A standard query (RD set) for `name` (dotted), type A, class IN.
fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

/// A QUIC Initial of `version`, padded to 1200 bytes as clients send it.
fn quic_initial(version: u32) -> Vec<u8> {
    let mut p = vec![0xc3];
    p.extend_from_slice(&version.to_be_bytes());
    p.push(8);
    p.extend_from_slice(&[0x11; 8]); // DCID
    p.push(0); // SCID length
    p.push(0); // token length
    p.extend_from_slice(&[0x44, 0x9e]); // length (varint)
    p.resize(1200, 0);
    p
}

// ----------------------------------------------------------------------------
// The fixture.

struct Fixture {
    classifier: ProtocolClassifier,
    cgroup: u64,
    _guard: cgroup::SharedCgroup,
}

impl Fixture {
    /// A classifier gating this process's cgroup with set [`SET`], `flags`
    /// and the given rules (`"ssh"`, `"tls/h2"`, ...).
    fn new(flags: ProtoFlags, rules: &[(Verdict, &str)]) -> Self {
        Self::loaded(ProtocolClassifier::load, flags, rules)
    }

    /// [`new`](Self::new) with the classifier `load` gives.
    fn loaded(
        load: fn() -> Result<ProtocolClassifier, ProtocolError>,
        flags: ProtoFlags,
        rules: &[(Verdict, &str)],
    ) -> Self {
        let guard = shared();
        let classifier = load().unwrap_or_else(|e| match e {
            ProtocolError::Load {
                verifier_log: Some(log),
                ..
            } => panic!("load refused; verifier log:\n{log}"),
            e => panic!("load failed: {e}"),
        });
        let cgroup = cgroup_id(&own_cgroup_dir());
        classifier.set_filter(cgroup, SET, flags).unwrap();
        for (verdict, rule) in rules {
            classifier
                .insert(SET, *verdict, rule.parse().unwrap())
                .unwrap();
        }
        Self {
            classifier,
            cgroup,
            _guard: guard,
        }
    }

    fn run(&self, frame: &[u8]) -> u32 {
        self.classifier.test_run(frame).unwrap()
    }

    fn stats(&self) -> ProtoStats {
        self.classifier.read_stats().unwrap()
    }

    fn events(&self) -> Vec<ProtoEvent> {
        let mut e = self.classifier.drain_events().unwrap();
        e.sort();
        e
    }

    fn event(&self, key: &str, decision: Decision, count: u64) -> ProtoEvent {
        ProtoEvent {
            cgroup_id: self.cgroup,
            key: key.parse().unwrap(),
            decision,
            count,
        }
    }
}

const OPEN: ProtoFlags = ProtoFlags {
    default_deny: false,
    observe: false,
};
const OBSERVE: ProtoFlags = ProtoFlags {
    default_deny: false,
    observe: true,
};
const DEFAULT_DENY: ProtoFlags = ProtoFlags {
    default_deny: true,
    observe: true,
};

// ----------------------------------------------------------------------------
// Classification and rules.

#[test]
fn ssh_is_denied_while_tls_to_the_same_port_passes() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "ssh")]);
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp4(40002, 22, &client_hello(&[b"h2"]))), PASS);
    let s = f.stats();
    assert_eq!((s.ssh, s.tls, s.decisions()), (1, 1, 2));
    assert_eq!((s.drops, s.packets, s.parse_failures), (1, 2, 0));
    assert_eq!(
        f.events(),
        vec![
            f.event("ssh", Decision::Deny, 1),
            f.event("tls/h2", Decision::Pass, 1),
        ]
    );
}

#[test]
fn refusals_are_recorded_for_a_set_that_does_not_observe() {
    // An enforce-only pod: its refusals must still reach the monitor (as
    // findings attributed to the enforce policy); its allowed flows not.
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp4(40002, 22, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(f.run(&tcp4(40003, 22, b"GET / HTTP/1.1\r\n\r\n")), PASS);
    assert_eq!(f.events(), vec![f.event("ssh", Decision::Deny, 1)]);

    let enforce_default_deny = ProtoFlags {
        default_deny: true,
        observe: false,
    };
    let g = Fixture::new(enforce_default_deny, &[(Verdict::Allow, "tls")]);
    assert_eq!(g.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(g.run(&tcp4(40002, 443, SSH_BANNER)), DROP);
    assert_eq!(g.run(&udp4(50001, 5353, b"hello")), DROP);
    assert_eq!(
        g.events(),
        vec![
            g.event("unclassified", Decision::DefaultDeny, 1),
            g.event("ssh", Decision::DefaultDeny, 1),
        ]
    );
}

#[test]
fn tls_h2_is_matched_by_tls_h2() {
    let f = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "tls/h2")]);
    assert_eq!(
        f.run(&tcp4(40001, 443, &client_hello(&[b"h2", b"http/1.1"]))),
        PASS
    );
    // The first offered name decides, not any name of the list.
    assert_eq!(
        f.run(&tcp4(40002, 443, &client_hello(&[b"http/1.1", b"h2"]))),
        DROP
    );
    // No ALPN at all: only "tls" (any) rules match it.
    assert_eq!(f.run(&tcp4(40003, 443, &client_hello_with(None, 0))), DROP);
    assert_eq!(f.stats().tls, 3);
    assert_eq!(
        f.events(),
        vec![
            f.event("tls", Decision::DefaultDeny, 1),
            f.event("tls/h2", Decision::Allow, 1),
            f.event("tls/http/1.1", Decision::DefaultDeny, 1),
        ]
    );

    let deny = Fixture::new(OPEN, &[(Verdict::Deny, "tls/h2")]);
    assert_eq!(deny.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), DROP);
    assert_eq!(deny.run(&tcp4(40002, 443, &client_hello(&[b"h3"]))), PASS);
}

#[test]
fn tls_with_any_alpn_is_matched_by_tls() {
    let f = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "tls")]);
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(
        f.run(&tcp4(40002, 443, &client_hello(&[b"http/1.1"]))),
        PASS
    );
    assert_eq!(f.run(&tcp4(40003, 443, &client_hello_with(None, 0))), PASS);
    assert_eq!(
        f.events(),
        vec![
            f.event("tls", Decision::Allow, 1),
            f.event("tls/h2", Decision::Allow, 1),
            f.event("tls/http/1.1", Decision::Allow, 1),
        ]
    );

    let deny = Fixture::new(OPEN, &[(Verdict::Deny, "tls")]);
    assert_eq!(deny.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), DROP);
}

#[test]
fn tls_h2_is_not_matched_by_tls_http11() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "tls/http/1.1")]);
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(
        f.run(&tcp4(40002, 443, &client_hello(&[b"http/1.1"]))),
        DROP
    );
    assert_eq!(
        f.events(),
        vec![
            f.event("tls/h2", Decision::Pass, 1),
            f.event("tls/http/1.1", Decision::Deny, 1),
        ]
    );

    let allow = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "tls/http/1.1")]);
    assert_eq!(allow.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), DROP);
}

#[test]
fn explicit_deny_beats_explicit_allow() {
    let f = Fixture::new(
        DEFAULT_DENY,
        &[(Verdict::Allow, "tls"), (Verdict::Deny, "tls/h2")],
    );
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), DROP);
    assert_eq!(f.run(&tcp4(40002, 443, &client_hello(&[b"h3"]))), PASS);
    let g = Fixture::new(OPEN, &[(Verdict::Allow, "tls/h2"), (Verdict::Deny, "tls")]);
    assert_eq!(g.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), DROP);
}

#[test]
fn the_http2_preface_is_classified() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "http2")]);
    let mut preface = H2_PREFACE.to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS
    assert_eq!(f.run(&tcp4(40001, 80, &preface)), DROP);
    // Only 23 of the 24 bytes: not the preface.
    assert_eq!(f.run(&tcp4(40002, 80, &H2_PREFACE[..23])), PASS);
    // "PRI" is no HTTP/1 method either.
    assert_eq!(f.run(&tcp4(40003, 80, b"PRI * HTTP/1.1\r\n\r\n")), PASS);
    let s = f.stats();
    assert_eq!((s.http2, s.unclassified, s.http1), (1, 2, 0));
}

#[test]
fn every_http1_method_is_classified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "http1")]);
    let methods = [
        "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    for (i, m) in methods.iter().enumerate() {
        let req = format!("{m} / HTTP/1.1\r\nHost: example.com\r\n\r\n");
        let sport = 41000 + u16::try_from(i).unwrap();
        assert_eq!(f.run(&tcp4(sport, 8080, req.as_bytes())), DROP, "{m}");
    }
    // A method token needs its space, and is case-sensitive.
    for (i, req) in [
        &b"GETX / HTTP/1.1\r\n"[..],
        b"get / HTTP/1.1\r\n",
        b"GET",
        b"POS",
    ]
    .iter()
    .enumerate()
    {
        let sport = 42000 + u16::try_from(i).unwrap();
        assert_eq!(f.run(&tcp4(sport, 8080, req)), PASS, "{req:?}");
    }
    let s = f.stats();
    assert_eq!((s.http1, s.unclassified, s.drops), (9, 4, 9));
}

#[test]
fn a_quic_v1_long_header_is_classified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "quic")]);
    assert_eq!(f.run(&udp4(50001, 443, &quic_initial(1))), DROP);
    // QUIC v2 and a short header are not v1 long headers.
    assert_eq!(f.run(&udp4(50002, 443, &quic_initial(0x6b33_43cf))), PASS);
    let mut short = quic_initial(1);
    short[0] = 0x43;
    short[2] = 0xff; // (keeps these bytes from also passing for a DNS query)
    assert_eq!(f.run(&udp4(50003, 443, &short)), PASS);
    // A connection id over v1's 20 bytes is not a v1 header.
    let mut long_cid = quic_initial(1);
    long_cid[5] = 21;
    assert_eq!(f.run(&udp4(50004, 443, &long_cid)), PASS);
    assert_eq!(f.run(&udp6(50005, 443, &quic_initial(1))), DROP);
    let s = f.stats();
    assert_eq!((s.quic, s.unclassified, s.parse_failures), (2, 3, 1));
}

#[test]
fn a_dns_query_is_classified_whatever_the_port() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "dns")]);
    assert_eq!(f.run(&udp4(50001, 53, &dns_query("example.com"))), DROP);
    assert_eq!(
        f.run(&udp4(50002, 5353, &dns_query("a.b.c.example.org"))),
        DROP
    );
    assert_eq!(f.run(&udp6(50003, 8053, &dns_query("example.com"))), DROP);
    // The root name is a name.
    assert_eq!(f.run(&udp4(50004, 53, &dns_query(""))), DROP);

    // A response (QR=1), another opcode, no question: not a query.
    let mut response = dns_query("example.com");
    response[2] |= 0x80;
    assert_eq!(f.run(&udp4(50005, 53, &response)), PASS);
    let mut notify = dns_query("example.com");
    notify[2] |= 4 << 3;
    assert_eq!(f.run(&udp4(50006, 53, &notify)), PASS);
    let mut no_question = dns_query("example.com");
    no_question[5] = 0;
    assert_eq!(f.run(&udp4(50007, 53, &no_question)), PASS);
    // A compression pointer, or a name without QTYPE/QCLASS after it.
    let mut pointer = dns_query("");
    pointer[12] = 0xc0;
    pointer.insert(13, 0x0c);
    assert_eq!(f.run(&udp4(50008, 53, &pointer)), PASS);
    let q = dns_query("example.com");
    assert_eq!(f.run(&udp4(50009, 53, &q[..q.len() - 2])), PASS);
    // A 64-byte label is over the limit.
    let long_label = format!("{}.com", "a".repeat(64));
    assert_eq!(f.run(&udp4(50010, 53, &dns_query(&long_label))), PASS);
    // The longest legal name (253 characters, 127 labels) is walked whole.
    let longest = vec!["a"; 127].join(".");
    assert_eq!(longest.len(), 253);
    assert_eq!(f.run(&udp4(50011, 53, &dns_query(&longest))), DROP);
    let s = f.stats();
    assert_eq!((s.dns, s.unclassified), (5, 6));
    assert_eq!(
        f.events(),
        vec![
            f.event("unclassified", Decision::Pass, 6),
            f.event("dns", Decision::Deny, 5),
        ]
    );
}

#[test]
fn default_deny_drops_what_the_allow_list_does_not_name() {
    let f = Fixture::new(
        DEFAULT_DENY,
        &[(Verdict::Allow, "dns"), (Verdict::Allow, "tls")],
    );
    assert_eq!(f.run(&udp4(50001, 53, &dns_query("example.com"))), PASS);
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(f.run(&tcp4(40002, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp4(40003, 80, b"GET / HTTP/1.1\r\n\r\n")), DROP);
    assert_eq!(f.run(&tcp4(40004, 9000, b"\x00\x01binary")), DROP);
    assert_eq!(
        f.events(),
        vec![
            f.event("unclassified", Decision::DefaultDeny, 1),
            f.event("ssh", Decision::DefaultDeny, 1),
            f.event("tls/h2", Decision::Allow, 1),
            f.event("http1", Decision::DefaultDeny, 1),
            f.event("dns", Decision::Allow, 1),
        ]
    );
    // A rule may name unclassified.
    let g = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "unclassified")]);
    assert_eq!(g.run(&tcp4(40004, 9000, b"\x00\x01binary")), PASS);
    assert_eq!(g.run(&tcp4(40005, 22, SSH_BANNER)), DROP);
}

#[test]
fn ipv6_flows_are_classified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh"), (Verdict::Deny, "tls/h2")]);
    assert_eq!(f.run(&tcp6(40001, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp6(40002, 443, &client_hello(&[b"h2"]))), DROP);
    assert_eq!(
        f.run(&tcp6(40003, 443, &client_hello(&[b"http/1.1"]))),
        PASS
    );
    assert_eq!(f.run(&udp6(50001, 53, &dns_query("example.com"))), PASS);
    let s = f.stats();
    assert_eq!((s.ssh, s.tls, s.dns, s.drops), (1, 2, 1, 2));
}

#[test]
fn ip_and_tcp_options_are_stepped_over() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    // IPv4 with 4 bytes of options (IHL 6).
    let plain = tcp4(40001, 22, SSH_BANNER);
    let mut h = plain[14..34].to_vec();
    h[0] = 0x46;
    let total = u16::from_be_bytes([h[2], h[3]]) + 4;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[10..12].copy_from_slice(&[0, 0]);
    h.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
    let csum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&csum.to_be_bytes());
    h.extend_from_slice(&plain[34..]);
    assert_eq!(f.run(&ethernet(ETH_IPV4, &h)), DROP);
    // TCP with 12 bytes of options (doff 8), as Linux sends timestamps.
    let mut seg = tcp_segment(40002, 22, PSH_ACK, b"");
    seg[12] = 0x80;
    seg.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    seg.extend_from_slice(SSH_BANNER);
    assert_eq!(f.run(&ipv4(TCP, &seg)), DROP);
    assert_eq!(f.run(&ipv6(TCP, &seg)), DROP);
    // A data offset beyond the segment is malformed.
    let mut bad = tcp_segment(40003, 22, PSH_ACK, b"SSH-");
    bad[12] = 0xf0;
    assert_eq!(f.run(&ipv4(TCP, &bad)), PASS);
    let s = f.stats();
    assert_eq!((s.ssh, s.unclassified, s.parse_failures), (3, 1, 1));
}

#[test]
fn a_large_client_hello_in_one_skb_is_walked() {
    // A post-quantum key share makes hellos of ~1.8 KB; egress sees one
    // GSO skb where the wire sees two segments.
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "tls/h2")]);
    let mut hello = client_hello_with(None, 0);
    // Splice a 2000-byte padding extension (type 21) and ALPN in front of
    // supported_versions, fixing the three enclosing lengths.
    let mut extra = extension(21, &[0; 2000]);
    extra.extend_from_slice(&alpn_extension(&[b"h2"]));
    let at = hello.len() - 9; // supported_versions is the last 9 bytes
    hello.splice(at..at, extra.iter().copied());
    let grow = |bytes: &mut [u8], n: usize| {
        let v = u16::from_be_bytes([bytes[0], bytes[1]]) as usize + n;
        bytes.copy_from_slice(&u16be(v));
    };
    grow(&mut hello[3..5], extra.len()); // record
    let hs_len = u32::from_be_bytes([0, hello[6], hello[7], hello[8]]) as usize + extra.len();
    hello[6..9].copy_from_slice(&u32::try_from(hs_len).unwrap().to_be_bytes()[1..]);
    let ext_at = 9 + 2 + 32 + 1 + 32 + 6 + 2;
    grow(&mut hello[ext_at..ext_at + 2], extra.len()); // extensions
    assert!(hello.len() > 2000);
    assert_eq!(f.run(&tcp4(40001, 443, &hello)), DROP);
    assert_eq!(f.events(), vec![f.event("tls/h2", Decision::Deny, 1)]);
}

#[test]
fn not_a_client_hello_is_not_tls() {
    let f = Fixture::new(OPEN, &[]);
    let hello = client_hello(&[b"h2"]);
    // A ServerHello, a record version 3.5 or 2.x, an alert record.
    let mut server = hello.clone();
    server[5] = 2;
    let mut v35 = hello.clone();
    v35[2] = 5;
    let mut v2 = hello.clone();
    v2[1] = 2;
    let mut alert = hello.clone();
    alert[0] = 21;
    // An extensions block longer than the hello.
    let mut overlong = hello.clone();
    let ext_at = 9 + 2 + 32 + 1 + 32 + 6 + 2;
    overlong[ext_at + 1] += 1;
    for (i, payload) in [server, v35, v2, alert, overlong].iter().enumerate() {
        let sport = 40001 + u16::try_from(i).unwrap();
        assert_eq!(f.run(&tcp4(sport, 443, payload)), PASS);
    }
    let s = f.stats();
    assert_eq!((s.tls, s.unclassified, s.parse_failures), (0, 5, 1));
}

// ----------------------------------------------------------------------------
// The flow cache.

#[test]
fn a_flow_is_classified_and_counted_once() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "ssh")]);
    // The banner is dropped; so is every later packet of the flow, whatever
    // it carries, and its retransmission.
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), DROP);
    assert_eq!(f.run(&tcp4(40001, 22, b"GET / HTTP/1.1\r\n")), DROP);
    assert_eq!(f.run(&tcp4_flags(40001, 22, 0x11, b"")), DROP); // FIN|ACK
                                                                // A TLS flow's application data passes from the cache: it is not
                                                                // reclassified (it would be unclassified).
    assert_eq!(f.run(&tcp4(40002, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(
        f.run(&tcp4(40002, 443, &[23, 3, 3, 0, 2, 0xaa, 0xbb])),
        PASS
    );
    // The same ports on another address family are another flow.
    assert_eq!(f.run(&tcp6(40002, 443, SSH_BANNER)), DROP);

    let s = f.stats();
    assert_eq!((s.ssh, s.tls, s.unclassified), (2, 1, 0));
    assert_eq!((s.packets, s.cached, s.drops), (7, 4, 5));
    assert_eq!(
        f.events(),
        vec![
            f.event("ssh", Decision::Deny, 2),
            f.event("tls/h2", Decision::Pass, 1),
        ]
    );
    // Read and reset.
    assert_eq!(f.events(), vec![]);
}

#[test]
fn a_rule_change_recomputes_cached_verdicts_without_reclassifying() {
    let f = Fixture::new(OBSERVE, &[]);
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), PASS);
    assert_eq!(f.run(&tcp4(40001, 22, b"\x00\x00\x01\x0c")), PASS);
    f.classifier
        .insert(SET, Verdict::Deny, ProtoKey::any(Protocol::Ssh))
        .unwrap();
    assert_eq!(f.run(&tcp4(40001, 22, b"\x00\x00\x01\x0c")), DROP);
    assert!(f
        .classifier
        .remove(SET, Verdict::Deny, ProtoKey::any(Protocol::Ssh))
        .unwrap());
    assert!(!f
        .classifier
        .remove(SET, Verdict::Deny, ProtoKey::any(Protocol::Ssh))
        .unwrap());
    assert_eq!(f.run(&tcp4(40001, 22, b"\x00\x00\x01\x0c")), PASS);
    // A gate change too: default deny without rules.
    f.classifier
        .set_filter(f.cgroup, SET, DEFAULT_DENY)
        .unwrap();
    assert_eq!(f.run(&tcp4(40001, 22, b"\x00\x00\x01\x0c")), DROP);

    let s = f.stats();
    assert_eq!((s.ssh, s.decisions(), s.cached), (1, 1, 4));
    // Counted once, with the decision of its first segment.
    assert_eq!(f.events(), vec![f.event("ssh", Decision::Pass, 1)]);
}

/// Issue 36: the daemon rewrites a gate, then bumps the generation. An
/// update landing between the program's read of the generation and its
/// read of the gate (made here by the test hook, once, during the first
/// packet: default deny raised, generation bumped) must not leave the old
/// gate's verdict cached under the new generation: the flow is dropped
/// from its first packet on. Reading the gate first, as the program did,
/// passed every packet of the flow.
#[test]
fn a_gate_updated_between_the_reads_decides_the_flow() {
    let f = Fixture::loaded(
        ProtocolClassifier::load_with_update_between_reads,
        OPEN,
        &[],
    );
    let first = f.run(&tcp4(40021, 22, SSH_BANNER));
    let second = f.run(&tcp4(40021, 22, b"\x00\x00\x01\x0c"));
    assert_eq!(
        (first, second),
        (DROP, DROP),
        "the default deny raised during the first packet"
    );
    // The hook ran once: a new flow is decided by the raised gate too.
    assert_eq!(f.run(&tcp4(40022, 22, SSH_BANNER)), DROP);
}

#[test]
fn a_syn_starts_a_new_flow_on_a_reused_tuple() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    assert_eq!(f.run(&tcp4(40001, 8022, SSH_BANNER)), DROP);
    // The connection is gone; a new one reuses the tuple.
    assert_eq!(f.run(&tcp4_flags(40001, 8022, SYN, b"")), PASS);
    assert_eq!(f.run(&tcp4(40001, 8022, b"GET / HTTP/1.1\r\n\r\n")), PASS);
    let s = f.stats();
    assert_eq!((s.ssh, s.http1, s.deferred), (1, 1, 1));
}

#[test]
fn tcp_without_payload_is_deferred_and_udp_without_payload_is_unclassified() {
    let f = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "tls")]);
    // SYN, then the handshake's ACK: no evidence yet, so no verdict.
    assert_eq!(f.run(&tcp4_flags(40001, 443, SYN, b"")), PASS);
    assert_eq!(f.run(&tcp4_flags(40001, 443, 0x10, b"")), PASS);
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&[b"h2"]))), PASS);
    assert_eq!(f.run(&tcp6(40002, 443, b"")), PASS);
    // An empty datagram is the whole first datagram: unclassified.
    assert_eq!(f.run(&udp4(50001, 53, b"")), DROP);
    assert_eq!(f.run(&udp6(50002, 53, b"")), DROP);
    let s = f.stats();
    assert_eq!((s.deferred, s.tls, s.unclassified), (3, 1, 2));
    assert_eq!((s.parse_failures, s.drops), (0, 2));

    let open = Fixture::new(OPEN, &[]);
    assert_eq!(open.run(&udp4(50001, 53, b"")), PASS);
    assert_eq!(open.stats().unclassified, 1);
}

#[test]
fn an_ungated_cgroup_is_not_classified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    assert!(f.classifier.remove_cgroup(f.cgroup).unwrap());
    assert!(!f.classifier.remove_cgroup(f.cgroup).unwrap());
    assert_eq!(f.run(&tcp4(40001, 22, SSH_BANNER)), PASS);
    assert_eq!(f.stats(), ProtoStats::default());
}

// ----------------------------------------------------------------------------
// Hostile and unparsable input.

#[test]
fn a_client_hello_split_across_segments_is_unclassified() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "tls")]);
    let hello = client_hello(&[b"h2"]);
    // The first segment holds the record header and part of the hello.
    assert_eq!(f.run(&tcp4(40001, 443, &hello[..60])), PASS);
    // The rest of the hello arrives on the cached (unclassified) flow.
    assert_eq!(f.run(&tcp4(40001, 443, &hello[60..])), PASS);
    // So is a record header alone.
    assert_eq!(f.run(&tcp4(40002, 443, &hello[..5])), PASS);
    let s = f.stats();
    assert_eq!((s.tls, s.unclassified, s.parse_failures), (0, 2, 2));
    assert_eq!(f.events(), vec![f.event("unclassified", Decision::Pass, 2)]);

    // Under default deny an allowed TLS hello split this way is dropped.
    let g = Fixture::new(DEFAULT_DENY, &[(Verdict::Allow, "tls")]);
    assert_eq!(g.run(&tcp4(40001, 443, &hello[..60])), DROP);
}

#[test]
fn a_client_hello_in_two_records_is_unclassified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "tls")]);
    let hello = client_hello(&[b"h2"]);
    // Re-frame the handshake message into two records in one segment.
    let hs = &hello[5..];
    let (a, b) = hs.split_at(40);
    let mut two = vec![22, 3, 1];
    two.extend_from_slice(&u16be(a.len()));
    two.extend_from_slice(a);
    two.extend_from_slice(&[22, 3, 1]);
    two.extend_from_slice(&u16be(b.len()));
    two.extend_from_slice(b);
    assert_eq!(f.run(&tcp4(40001, 443, &two)), PASS);
    let s = f.stats();
    assert_eq!((s.unclassified, s.parse_failures), (1, 1));
}

#[test]
fn the_extension_walk_is_bounded() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "tls")]);
    // SNI + 30 fillers: ALPN is the 32nd extension, the last one walked.
    assert_eq!(
        f.run(&tcp4(40001, 443, &client_hello_with(Some(&[b"h2"]), 30))),
        DROP
    );
    // SNI + 31 fillers: ALPN is the 33rd, beyond the walk.
    assert_eq!(
        f.run(&tcp4(40002, 443, &client_hello_with(Some(&[b"h2"]), 31))),
        PASS
    );
    // Without ALPN, 32 extensions (SNI, 30 fillers, supported_versions)
    // are walked to the end: tls without ALPN ...
    assert_eq!(f.run(&tcp4(40003, 443, &client_hello_with(None, 30))), DROP);
    // ... 33 are not.
    assert_eq!(f.run(&tcp4(40004, 443, &client_hello_with(None, 31))), PASS);
    assert_eq!(
        f.events(),
        vec![
            f.event("unclassified", Decision::Pass, 2),
            f.event("tls", Decision::Deny, 1),
            f.event("tls/h2", Decision::Deny, 1),
        ]
    );
}

#[test]
fn an_alpn_list_longer_than_the_walk_is_unclassified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "tls")]);
    let eight: Vec<&[u8]> = vec![b"h2"; 8];
    let nine: Vec<&[u8]> = vec![b"h2"; 9];
    assert_eq!(f.run(&tcp4(40001, 443, &client_hello(&eight))), DROP);
    assert_eq!(f.run(&tcp4(40002, 443, &client_hello(&nine))), PASS);
    // A first name of 16 bytes fits a key, one of 17 does not.
    assert_eq!(
        f.run(&tcp4(40003, 443, &client_hello(&[&[b'x'; 16]]))),
        DROP
    );
    assert_eq!(
        f.run(&tcp4(40004, 443, &client_hello(&[&[b'x'; 17]]))),
        PASS
    );
    // An empty name, or a NUL in the first name: malformed.
    assert_eq!(f.run(&tcp4(40005, 443, &client_hello(&[b"h2", b""]))), PASS);
    assert_eq!(f.run(&tcp4(40006, 443, &client_hello(&[b"h\x002"]))), PASS);
    let s = f.stats();
    assert_eq!((s.tls, s.unclassified, s.parse_failures), (2, 4, 4));

    let g = Fixture::new(OBSERVE, &[]);
    let sixteen = Alpn::new([b'x'; 16]).unwrap();
    g.run(&tcp4(40003, 443, &client_hello(&[&[b'x'; 16]])));
    assert_eq!(
        g.events(),
        vec![ProtoEvent {
            cgroup_id: g.cgroup,
            key: ProtoKey::with_alpn(Protocol::Tls, sixteen).unwrap(),
            decision: Decision::Pass,
            count: 1,
        }]
    );
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap();
    (next(), next())
}

/// Whether BPF_PROG_TEST_RUN refuses (EINVAL, before running the program)
/// an skb whose IP header is shorter than the fixed header its EtherType
/// announces: 5.10 runs the program on such a frame; 6.1, 6.12, 6.18 and
/// 7.2 refuse it (measured with bpftool by the egress filter's tests).
fn test_run_refuses_short_ip_headers() -> bool {
    kernel_version() >= (6, 1)
}

/// Runs a frame whose IP header is shorter than the fixed header: `None`
/// when this kernel's test run refuses it, as it must where
/// [`test_run_refuses_short_ip_headers`].
fn run_short(f: &Fixture, frame: &[u8]) -> Option<u32> {
    match f.classifier.test_run(frame) {
        Ok(v) => {
            assert!(!test_run_refuses_short_ip_headers(), "the kernel ran it");
            Some(v)
        }
        Err(ProtocolError::TestRun {
            errno: Some(libc::EINVAL),
            ..
        }) if test_run_refuses_short_ip_headers() => None,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn truncated_ip_headers_are_unclassified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    let v4 = tcp4(40001, 22, SSH_BANNER);
    let v6 = tcp6(40001, 22, SSH_BANNER);
    // 10 of IPv4's 20 header bytes; 30 of IPv6's 40. Where the kernel runs
    // the program on them at all (5.10), they pass unclassified.
    let mut short = 0;
    for frame in [&v4[..14 + 10], &v6[..14 + 30]] {
        if let Some(verdict) = run_short(&f, frame) {
            assert_eq!(verdict, PASS);
            short += 1;
        }
    }
    // A TCP header cut short.
    assert_eq!(f.run(&v4[..14 + 20 + 10]), PASS);
    assert_eq!(f.run(&v6[..14 + 40 + 10]), PASS);
    // An IHL below 5.
    let mut bad_ihl = v4.clone();
    bad_ihl[14] = 0x44;
    assert_eq!(f.run(&bad_ihl), PASS);
    // An IPv4 total length shorter than its header.
    let mut bad_total = v4.clone();
    bad_total[16..18].copy_from_slice(&10u16.to_be_bytes());
    assert_eq!(f.run(&bad_total), PASS);
    let s = f.stats();
    // No flow: each packet is its own decision.
    assert_eq!(
        (s.unclassified, s.parse_failures, s.ssh, s.packets),
        (4 + short, 4 + short, 0, 4 + short)
    );

    // Under default deny they are dropped.
    let g = Fixture::new(DEFAULT_DENY, &[]);
    assert_eq!(g.run(&v4[..14 + 20 + 10]), DROP);
    assert_eq!(g.run(&bad_ihl), DROP);
    for frame in [&v4[..14 + 10], &v6[..14 + 30]] {
        if let Some(verdict) = run_short(&g, frame) {
            assert_eq!(verdict, DROP);
        }
    }
}

#[test]
fn the_ip_family_comes_from_skb_protocol() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "ssh")]);
    // An IPv6 packet behind an IPv4 EtherType is not read as IPv4...
    let mut v6_as_v4 = tcp6(40001, 22, SSH_BANNER);
    v6_as_v4[12..14].copy_from_slice(&ETH_IPV4.to_be_bytes());
    assert_eq!(f.run(&v6_as_v4), PASS);
    // ...nor an IPv4 one behind an IPv6 EtherType as IPv6.
    let mut v4_as_v6 = tcp4(40001, 22, SSH_BANNER);
    v4_as_v6[12..14].copy_from_slice(&ETH_IPV6.to_be_bytes());
    assert_eq!(f.run(&v4_as_v6), PASS);
    assert_eq!(f.stats().parse_failures, 2);
}

#[test]
fn an_ipv6_extension_header_is_unclassified() {
    let f = Fixture::new(OBSERVE, &[(Verdict::Deny, "ssh")]);
    // Hop-by-hop options (PadN), then TCP carrying an SSH banner.
    let mut chain = vec![TCP, 0, 1, 4, 0, 0, 0, 0];
    chain.extend_from_slice(&tcp_segment(40001, 22, PSH_ACK, SSH_BANNER));
    assert_eq!(f.run(&ipv6(0, &chain)), PASS);
    // A fragment header likewise.
    let mut frag = vec![TCP, 0, 0, 0, 0, 0, 0, 1];
    frag.extend_from_slice(&tcp_segment(40002, 22, PSH_ACK, SSH_BANNER));
    assert_eq!(f.run(&ipv6(44, &frag)), PASS);
    // ICMPv6 and IPv4 ICMP: no TCP/UDP either.
    assert_eq!(f.run(&ipv6(58, &[128, 0, 0, 0, 0, 1, 0, 1])), PASS);
    assert_eq!(f.run(&ipv4(1, &[8, 0, 0, 0, 0, 1, 0, 1])), PASS);
    // Four port-less flows (addresses and next header), each decided once:
    // a second packet of one comes from the cache.
    assert_eq!(f.run(&ipv6(0, &chain)), PASS);
    let s = f.stats();
    assert_eq!((s.unclassified, s.ssh, s.parse_failures), (4, 0, 0));
    assert_eq!((s.decisions(), s.cached), (4, 1));
    assert_eq!(f.events(), vec![f.event("unclassified", Decision::Pass, 4)]);
}

#[test]
fn ipv4_fragments_are_unclassified() {
    let f = Fixture::new(OPEN, &[(Verdict::Deny, "dns")]);
    let datagram = udp_datagram(50001, 53, &dns_query("example.com"));
    // The first fragment (MF set) carries the header but maybe not all of
    // the question; a later one carries no header at all.
    assert_eq!(f.run(&ipv4_with(UDP, 0x2000, &datagram)), PASS);
    assert_eq!(f.run(&ipv4_with(UDP, 0x0003, &datagram[24..])), PASS);
    // The same datagram unfragmented is a DNS query.
    assert_eq!(f.run(&ipv4_with(UDP, 0, &datagram)), DROP);
    let s = f.stats();
    assert_eq!((s.unclassified, s.parse_failures, s.dns), (2, 2, 1));
}

// ----------------------------------------------------------------------------
// The cgroup of a test run.

#[test]
fn moved_into_a_child_cgroup_the_classifier_sees_it() {
    let _exclusive = exclusive();
    let home = own_cgroup_dir();
    let child = cgroup2_mount().join(format!("krt-protocol-test-{}", std::process::id()));
    fs::create_dir(&child).unwrap();
    let pid = std::process::id().to_string();
    let result = std::panic::catch_unwind(|| {
        fs::write(child.join("cgroup.procs"), &pid).unwrap();
        let classifier = ProtocolClassifier::load().unwrap();
        let flags = ProtoFlags::default();
        // The old cgroup is not the packet's; the child is.
        classifier.set_filter(cgroup_id(&home), SET, flags).unwrap();
        classifier
            .insert(SET, Verdict::Deny, ProtoKey::any(Protocol::Ssh))
            .unwrap();
        assert_eq!(
            classifier.test_run(&tcp4(40001, 22, SSH_BANNER)).unwrap(),
            PASS
        );
        classifier
            .set_filter(cgroup_id(&child), SET, flags)
            .unwrap();
        assert_eq!(
            classifier.test_run(&tcp4(40002, 22, SSH_BANNER)).unwrap(),
            DROP
        );
    });
    fs::write(home.join("cgroup.procs"), &pid).unwrap();
    fs::remove_dir(&child).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn cgroup_id_zero_is_refused() {
    let f = Fixture::new(OPEN, &[]);
    assert_eq!(
        f.classifier.set_filter(0, SET, OPEN),
        Err(ProtocolError::InvalidCgroupId)
    );
}
