//! The DNS question observer against the host kernel (tier 2: needs root).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! dns_test_run`. Crafted frames go through `BPF_PROG_TEST_RUN`, where the
//! skb's socket is a dummy one charged to this process's cgroup v2, so the
//! gate admits that cgroup's id (the inode of its directory). One test
//! attaches to a real cgroup and sends a real datagram from a child inside
//! it. Every test also asserts the verdict: 1 (pass), always.

// The helpers below are test code too (clippy's allow-unwrap-in-tests only
// covers `#[test]` functions): a panic there is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;

use cgroup::{cgroup_id, own_cgroup_id, TempCgroup};
use std::process::Command;
use std::time::{Duration, Instant};

use kyverno_runtime_bpf::dns::{DnsObserver, DnsQuestion, DnsReader, DnsStats};

const PASS: u32 = 1;

// ---- frames -----------------------------------------------------------------

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const UDP: u8 = 17;
const TCP: u8 = 6;

/// `name` in wire form, case kept (no lowercasing: that is the kernel's
/// job): `"WWW.Example.COM"` -> `\3WWW\7Example\3COM\0`.
fn wire(name: &str) -> Vec<u8> {
    let mut w = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        w.push(u8::try_from(label.len()).unwrap());
        w.extend_from_slice(label.as_bytes());
    }
    w.push(0);
    w
}

/// A DNS query message: header (RD, QDCOUNT `qdcount`), then `qname`
/// bytes as given, then QTYPE A, QCLASS IN.
fn query_with(qdcount: u16, qname: &[u8]) -> Vec<u8> {
    let mut m = vec![0x12, 0x34, 0x01, 0x00];
    m.extend_from_slice(&qdcount.to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(qname);
    m.extend_from_slice(&[0, 1, 0, 1]);
    m
}

fn query(name: &str) -> Vec<u8> {
    query_with(1, &wire(name))
}

fn udp(dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&40000u16.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

fn ethernet(ethertype: u16, packet: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(packet);
    f
}

fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 frame 10.0.0.1 -> 10.0.0.53 carrying `l4` as protocol `proto`,
/// with `options` (a multiple of 4 bytes) after the fixed header.
fn ipv4_with(proto: u8, options: &[u8], frag_off: u16, l4: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let ihl = 5 + options.len() / 4;
    let mut ip = vec![0u8; 20];
    ip[0] = 0x40 | u8::try_from(ihl).unwrap();
    ip[2..4].copy_from_slice(&u16::try_from(ihl * 4 + l4.len()).unwrap().to_be_bytes());
    ip[6..8].copy_from_slice(&frag_off.to_be_bytes());
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 53]);
    ip.extend_from_slice(options);
    let csum = checksum(&ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    ip.extend_from_slice(l4);
    ethernet(ETH_P_IP, &ip)
}

fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4_with(proto, &[], 0x4000, l4)
}

/// An IPv6 frame fd00::1 -> fd00::53: `exts` is a list of (next-header
/// value of the extension, its bytes), walked in order before `l4`.
fn ipv6_with(exts: &[(u8, Vec<u8>)], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut chain: Vec<u8> = Vec::new();
    let mut first = proto;
    // Each extension's first byte is the next header after it.
    for (i, (kind, bytes)) in exts.iter().enumerate() {
        let mut b = bytes.clone();
        b[0] = exts.get(i + 1).map_or(proto, |(k, _)| *k);
        if i == 0 {
            first = *kind;
        }
        chain.extend_from_slice(&b);
    }
    let mut ip = vec![0u8; 40];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&u16::try_from(chain.len() + l4.len()).unwrap().to_be_bytes());
    ip[6] = first;
    ip[7] = 64;
    ip[8] = 0xfd;
    ip[23] = 1;
    ip[24] = 0xfd;
    ip[39] = 0x53;
    ip.extend_from_slice(&chain);
    ip.extend_from_slice(l4);
    ethernet(ETH_P_IPV6, &ip)
}

fn ipv6(l4: &[u8]) -> Vec<u8> {
    ipv6_with(&[], UDP, l4)
}

/// An 8-byte hop-by-hop or destination-options header (a PadN option).
fn options_header(kind: u8) -> (u8, Vec<u8>) {
    (kind, vec![0, 0, 1, 4, 0, 0, 0, 0])
}

/// A fragment header with fragment offset `offset` (in 8-byte units) and
/// the more-fragments flag set.
fn fragment_header(offset: u16) -> (u8, Vec<u8>) {
    let field = (offset << 3) | 1;
    let mut h = vec![0, 0];
    h.extend_from_slice(&field.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 7]);
    (44, h)
}

// ---- the observer -------------------------------------------------------------

/// A loaded observer with this process's cgroup admitted (or not), and its
/// reader.
struct Fixture {
    observer: DnsObserver,
    reader: DnsReader,
    cgid: u64,
}

impl Fixture {
    fn gated() -> Self {
        let f = Self::ungated();
        f.observer.admit(f.cgid).unwrap();
        f
    }

    fn ungated() -> Self {
        let observer = DnsObserver::load()
            .unwrap_or_else(|e| panic!("load: {e}\n{}", e.verifier_log().unwrap_or("(no log)")));
        let reader = observer.reader().unwrap();
        Self {
            observer,
            reader,
            cgid: own_cgroup_id(),
        }
    }

    /// Runs `frame` and asserts the verdict.
    fn run(&self, frame: &[u8]) {
        assert_eq!(
            self.observer.test_run(frame).unwrap(),
            PASS,
            "every path passes"
        );
    }

    /// What is in the ring buffer now (a committed record is readable
    /// without waiting for the wakeup).
    fn questions(&mut self) -> Vec<DnsQuestion> {
        self.reader.poll_questions(Duration::ZERO).unwrap()
    }

    fn stats(&self) -> DnsStats {
        self.observer.read_stats().unwrap()
    }

    fn question(&self, qname: &str) -> DnsQuestion {
        DnsQuestion {
            cgroup_id: self.cgid,
            qname: qname.to_owned(),
        }
    }

    /// Asserts that `frame` produced no record and changed no counter.
    fn assert_ignored(&mut self, frame: &[u8]) {
        let before = self.stats();
        self.run(frame);
        assert_eq!(self.questions(), [], "no record");
        assert_eq!(self.stats(), before, "no loss counted");
    }

    /// Asserts that `frame` produced no record and counted one unreadable
    /// name.
    fn assert_unreadable(&mut self, frame: &[u8]) {
        let before = self.stats();
        self.run(frame);
        assert_eq!(self.questions(), [], "no record");
        let after = self.stats();
        assert_eq!(after.name_unreadable, before.name_unreadable + 1);
        assert_eq!(after.ringbuf_full, before.ringbuf_full);
    }

    fn assert_clean(&self) {
        assert_eq!(self.reader.undecodable(), 0, "every record decodes");
    }
}

// ---- tests --------------------------------------------------------------------

#[test]
fn a_gated_question_arrives_lowercased() {
    let mut f = Fixture::gated();
    f.run(&ipv4(UDP, &udp(53, &query("WWW.Example.COM"))));
    assert_eq!(f.questions(), [f.question("www.example.com")]);
    assert_eq!(f.stats(), DnsStats::default());
    f.assert_clean();
}

#[test]
fn an_ungated_cgroup_produces_nothing() {
    let mut f = Fixture::ungated();
    f.assert_ignored(&ipv4(UDP, &udp(53, &query("example.com"))));
    // Another cgroup admitted does not open the gate for this one.
    f.observer.admit(f.cgid + 1_000_000).unwrap();
    f.assert_ignored(&ipv4(UDP, &udp(53, &query("example.com"))));
    // Admitted, then revoked.
    f.observer.admit(f.cgid).unwrap();
    assert!(f.observer.revoke(f.cgid).unwrap());
    assert!(!f.observer.revoke(f.cgid).unwrap(), "revoked already");
    f.assert_ignored(&ipv4(UDP, &udp(53, &query("example.com"))));
    assert!(f.observer.admit(0).is_err(), "cgroup id 0 names no cgroup");
}

#[test]
fn ipv6_questions_are_read() {
    let mut f = Fixture::gated();
    f.run(&ipv6(&udp(53, &query("Api.OpenAI.azure.com"))));
    assert_eq!(f.questions(), [f.question("api.openai.azure.com")]);
    assert_eq!(f.stats(), DnsStats::default());
    f.assert_clean();
}

#[test]
fn ipv6_extension_headers_are_walked() {
    let mut f = Fixture::gated();
    let exts = [
        options_header(0),
        options_header(60),
        fragment_header(0),
        options_header(60),
    ];
    f.run(&ipv6_with(&exts, UDP, &udp(53, &query("hidden.example"))));
    assert_eq!(f.questions(), [f.question("hidden.example")]);
    // A later fragment carries no UDP header.
    f.assert_ignored(&ipv6_with(
        &[fragment_header(2)],
        UDP,
        &udp(53, &query("x.example")),
    ));
    // Longer chains than the walk's bound are not observed.
    let long: Vec<_> = (0..7).map(|_| options_header(60)).collect();
    f.assert_ignored(&ipv6_with(&long, UDP, &udp(53, &query("x.example"))));
    f.assert_clean();
}

#[test]
fn ipv4_options_and_fragments() {
    let mut f = Fixture::gated();
    // IHL 6: one NOP-padded option word.
    f.run(&ipv4_with(
        UDP,
        &[1, 1, 1, 0],
        0,
        &udp(53, &query("opt.example")),
    ));
    assert_eq!(f.questions(), [f.question("opt.example")]);
    // A first fragment (MF, offset 0) is read; a later one is not.
    f.run(&ipv4_with(
        UDP,
        &[],
        0x2000,
        &udp(53, &query("frag.example")),
    ));
    assert_eq!(f.questions(), [f.question("frag.example")]);
    f.assert_ignored(&ipv4_with(UDP, &[], 0x2001, &udp(53, &query("x.example"))));
    f.assert_clean();
}

#[test]
fn other_ports_and_protocols_produce_nothing() {
    let mut f = Fixture::gated();
    f.assert_ignored(&ipv4(UDP, &udp(5353, &query("printer.local"))));
    f.assert_ignored(&ipv6(&udp(853, &query("example.com"))));
    // Port 53 over TCP: the same bytes, not UDP.
    f.assert_ignored(&ipv4(TCP, &udp(53, &query("example.com"))));
    // Neither IPv4 nor IPv6.
    f.assert_ignored(&ethernet(0x0806, &[0u8; 28]));
}

#[test]
fn a_compression_pointer_is_unreadable() {
    let mut f = Fixture::gated();
    f.assert_unreadable(&ipv4(UDP, &udp(53, &query_with(1, b"\xc0\x0c"))));
    // After a label, too.
    f.assert_unreadable(&ipv4(UDP, &udp(53, &query_with(1, b"\x03www\xc0\x0c"))));
    // A reserved label type.
    f.assert_unreadable(&ipv4(UDP, &udp(53, &query_with(1, b"\x03www\x41"))));
}

#[test]
fn names_are_bounded_by_the_key_width() {
    let mut f = Fixture::gated();
    // 1+63+1+62 = 127 bytes of labels: the widest name a key holds.
    let widest = format!("{}.{}", "A".repeat(63), "b".repeat(62));
    f.run(&ipv4(UDP, &udp(53, &query(&widest))));
    assert_eq!(f.questions(), [f.question(&widest.to_lowercase())]);
    // One byte more does not fit.
    let over = format!("{}.{}", "a".repeat(63), "b".repeat(63));
    f.assert_unreadable(&ipv4(UDP, &udp(53, &query(&over))));
    // Far over, at the wire's own limit of 255.
    let far = vec!["c".repeat(63); 3].join(".") + "." + &"d".repeat(61);
    f.assert_unreadable(&ipv6(&udp(53, &query(&far))));
    f.assert_clean();
}

#[test]
fn truncated_packets_are_unreadable() {
    let mut f = Fixture::gated();
    let full = query("www.example.com");
    // Cut inside a label.
    f.assert_unreadable(&ipv4(UDP, &udp(53, &full[..12 + 6])));
    // Cut exactly after a label: the zeroed record must not pass for the
    // root label.
    f.assert_unreadable(&ipv4(UDP, &udp(53, &full[..12 + 4])));
    // Cut inside the DNS header.
    f.assert_unreadable(&ipv4(UDP, &udp(53, &full[..5])));
    // A header and no name at all.
    f.assert_unreadable(&ipv6(&udp(53, &full[..12])));
    // Cut after the name, before QTYPE: the name is whole and is read.
    f.run(&ipv4(UDP, &udp(53, &full[..12 + 17])));
    assert_eq!(f.questions(), [f.question("www.example.com")]);
    f.assert_clean();
}

#[test]
fn empty_payloads_and_messages_without_questions_ask_nothing() {
    let mut f = Fixture::gated();
    f.assert_ignored(&ipv4(UDP, &udp(53, &[])));
    f.assert_ignored(&ipv6(&udp(53, &[])));
    f.assert_ignored(&ipv4(UDP, &udp(53, &query_with(0, &wire("example.com")))));
    // A truncated UDP header is not known to be DNS.
    f.assert_ignored(&ipv4(UDP, &udp(53, &[])[..6]));
}

#[test]
fn the_root_and_odd_bytes_are_reported() {
    let mut f = Fixture::gated();
    f.run(&ipv4(UDP, &udp(53, &query_with(1, b"\x00"))));
    f.run(&ipv4(
        UDP,
        &udp(53, &query_with(1, b"\x04A.B\xff\x03com\x00")),
    ));
    assert_eq!(
        f.questions(),
        [f.question("."), f.question("a\\.b\\255.com")]
    );
    f.assert_clean();
}

#[test]
fn records_do_not_leak_the_previous_name() {
    let mut f = Fixture::gated();
    let long = vec!["x".repeat(40); 3].join(".");
    // Without reading in between, so the ring's memory is reused in order.
    for _ in 0..4 {
        f.run(&ipv4(UDP, &udp(53, &query(&long))));
        f.run(&ipv4(UDP, &udp(53, &query("a.io"))));
    }
    let got = f.questions();
    assert_eq!(got.len(), 8);
    for pair in got.chunks(2) {
        assert_eq!(pair, [f.question(&long), f.question("a.io")]);
    }
    f.assert_clean();
}

#[test]
fn a_full_ring_buffer_counts_what_it_loses() {
    let mut f = Fixture::gated();
    let frame = ipv4(UDP, &udp(53, &query("flood.example")));
    const SENT: u64 = 600;
    for _ in 0..SENT {
        f.run(&frame);
    }
    let read = f.questions().len() as u64;
    let stats = f.stats();
    assert!(
        stats.ringbuf_full > 0,
        "64 KiB holds ~450 records: {stats:?}"
    );
    assert_eq!(read + stats.ringbuf_full, SENT, "{stats:?}");
    assert_eq!(stats.name_unreadable, 0);
    // Drained, it records again; the counters are cumulative.
    f.run(&frame);
    assert_eq!(f.questions().len(), 1);
    assert_eq!(f.stats(), stats);
    f.assert_clean();
}

#[test]
fn an_attached_cgroup_reports_a_real_question() {
    let f = Fixture::ungated();
    let mut reader = f.reader;
    let gated = TempCgroup::new("dns-test-gated");
    let ungated = TempCgroup::new("dns-test-ungated");
    let _links = [
        f.observer.attach(&gated.0).unwrap(),
        f.observer.attach(&ungated.0).unwrap(),
    ];
    f.observer.admit(cgroup_id(&gated.0)).unwrap();

    // A child joins the cgroup, then sends one datagram to 127.0.0.1:53
    // (nothing needs to listen: egress is what is observed).
    let send = |cg: &TempCgroup, name: &str| {
        let payload: String = query(name).iter().map(|b| format!("\\x{b:02x}")).collect();
        let script = format!(
            "echo $$ > '{}/cgroup.procs' && printf '{payload}' > /dev/udp/127.0.0.1/53",
            cg.0.display()
        );
        let status = Command::new("bash").args(["-c", &script]).status().unwrap();
        assert!(status.success(), "sender: {status}");
    };
    send(&ungated, "Quiet.Example");
    send(&gated, "Real.Example.ORG");

    let deadline = Instant::now() + Duration::from_secs(2);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        got = reader.poll_questions(Duration::from_millis(100)).unwrap();
    }
    assert_eq!(
        got,
        [DnsQuestion {
            cgroup_id: cgroup_id(&gated.0),
            qname: "real.example.org".into()
        }]
    );
    assert_eq!(f.observer.read_stats().unwrap(), DnsStats::default());
    assert_eq!(reader.undecodable(), 0);
}

#[test]
fn the_cgroup_fallback_is_chosen_by_probing() {
    // Linux 5.10 and 6.1 refuse bpf_get_current_cgroup_id in cgroup_skb
    // programs; either way the object loads (the call is dead code where
    // refused) and the socket's cgroup is what the other tests see.
    let f = Fixture::gated();
    eprintln!(
        "current-cgroup fallback: {}",
        f.observer.uses_current_cgroup_fallback()
    );
}
