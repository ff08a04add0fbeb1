//! The egress filter on the host kernel with BPF_PROG_TEST_RUN (tier 2:
//! needs root and a cgroup v2 mount).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! egress_test_run`. Nothing is attached: every packet is a test run.
//!
//! How the packet's cgroup is chosen: the kernel gives a test-run skb a
//! socket that it allocates in the calling process, so the program's
//! `bpf_skb_cgroup_id` returns this process's cgroup v2 id (measured on
//! 6.18; `moved_into_a_child_cgroup_the_filter_sees_the_child` proves it
//! with a non-root cgroup). The tests read that id the way the agent will
//! read a container's (the inode number of its cgroup v2 directory, the
//! path from /proc/self/cgroup under the mount from /proc/self/mountinfo)
//! and register it in `cgroup_filters`.
//!
//! Each case loads its own filter, so counters start at zero and the
//! assertions can compare whole [`Stats`] values.

// A test harness, helpers included: a panic is the failure report
// (clippy.toml allows unwrap in `#[test]` functions only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;

use cgroup::{cgroup2_mount, exclusive, own_cgroup_dir, own_cgroup_id, shared};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use kyverno_runtime_bpf::egress::{
    Decision, EgressError, EgressFilter, FilterFlags, Observation, Prefix, Stats, Verdict,
};

const PASS: u32 = 1;
const DROP: u32 = 0;

// ----------------------------------------------------------------------------
// The test process's cgroup.

// shared() and exclusive(): tests/common/cgroup.rs.

/// This process moved into a fresh child cgroup; moved back and the child
/// removed on drop.
struct InChildCgroup {
    original: PathBuf,
    child: PathBuf,
}

impl InChildCgroup {
    fn enter() -> Self {
        let original = own_cgroup_dir();
        let child = cgroup2_mount().join(format!("krt-egress-test-{}", std::process::id()));
        fs::create_dir(&child).unwrap_or_else(|e| panic!("mkdir {}: {e}", child.display()));
        let guard = Self { original, child };
        fs::write(
            guard.child.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .unwrap();
        guard
    }
}

impl Drop for InChildCgroup {
    fn drop(&mut self) {
        let pid = std::process::id().to_string();
        if let Err(e) = fs::write(self.original.join("cgroup.procs"), pid) {
            eprintln!("cannot move back to {}: {e}", self.original.display());
        }
        if let Err(e) = fs::remove_dir(&self.child) {
            eprintln!("cannot remove {}: {e}", self.child.display());
        }
    }
}

// ----------------------------------------------------------------------------
// Frames. The kernel wants an Ethernet frame: it takes skb->protocol from the
// EtherType and strips the header, so the program sees the IP header first.

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_ARP: u16 = 0x0806;
const UDP: u8 = 17;

fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    // Destination and source MAC zero (loopback's).
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn udp(len_payload: usize) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&40000u16.to_be_bytes());
    u.extend_from_slice(&9u16.to_be_bytes());
    u.extend_from_slice(&((8 + len_payload) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend(std::iter::repeat_n(b'k', len_payload));
    u
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

/// An IPv4 header with `options` (a multiple of 4 bytes) and a UDP datagram.
fn ipv4_packet(dst: Ipv4Addr, options: &[u8]) -> Vec<u8> {
    let l4 = udp(4);
    let hlen = 20 + options.len();
    let mut ip = vec![0u8; 20];
    ip[0] = 0x40 | (hlen / 4) as u8;
    ip[2..4].copy_from_slice(&((hlen + l4.len()) as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = UDP;
    ip[12..16].copy_from_slice(&[10, 99, 0, 1]);
    ip[16..20].copy_from_slice(&dst.octets());
    ip.extend_from_slice(options);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&l4);
    ip
}

/// An IPv6 header, `ext` (extension headers, the first one's type in
/// `next`), and a UDP datagram.
fn ipv6_packet(dst: Ipv6Addr, next: u8, ext: &[u8]) -> Vec<u8> {
    let l4 = udp(4);
    let mut ip = vec![0u8; 40];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&((ext.len() + l4.len()) as u16).to_be_bytes());
    ip[6] = next;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&"2001:db8:ffff::1".parse::<Ipv6Addr>().unwrap().octets());
    ip[24..40].copy_from_slice(&dst.octets());
    ip.extend_from_slice(ext);
    ip.extend_from_slice(&l4);
    ip
}

/// A hop-by-hop options header (PadN), a destination options header (PadN)
/// and a fragment header, ending in UDP.
fn extension_chain() -> (u8, Vec<u8>) {
    const HOP_BY_HOP: u8 = 0;
    const DEST_OPTS: u8 = 60;
    const FRAGMENT: u8 = 44;
    let mut ext = Vec::new();
    // Hop-by-hop: next = dest opts, hdr ext len 0 (8 bytes), PadN of 4.
    ext.extend_from_slice(&[DEST_OPTS, 0, 1, 4, 0, 0, 0, 0]);
    // Destination options: next = fragment, 8 bytes, PadN.
    ext.extend_from_slice(&[FRAGMENT, 0, 1, 4, 0, 0, 0, 0]);
    // Fragment: next = UDP, offset 0, M=0 (an atomic fragment), id.
    ext.extend_from_slice(&[UDP, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
    (HOP_BY_HOP, ext)
}

/// What a case sends.
#[derive(Debug, Clone, Copy)]
enum Frame {
    V4(&'static str),
    /// IPv4 with a 4-byte options field (NOP x3, EOL): IHL 6.
    V4Options(&'static str),
    V6(&'static str),
    V6Extensions(&'static str),
    /// The first 12 bytes of an IPv4 header (of 20).
    TruncatedV4,
    /// The first 30 bytes of an IPv6 header (of 40).
    TruncatedV6,
    /// An Ethernet header with the IPv4 EtherType and nothing after it.
    EmptyV4,
    /// The same with the IPv6 EtherType.
    EmptyV6,
    /// IPv4 EtherType, IPv6 bytes: the family is the EtherType's.
    V6BytesAsV4,
    /// IPv6 EtherType, a full IPv4 packet padded to 40 bytes.
    V4BytesAsV6,
    /// IPv4 with IHL 4 (less than the fixed header).
    V4ShortIhl,
    /// An ARP request.
    Arp,
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

impl Frame {
    fn bytes(self) -> Vec<u8> {
        match self {
            Self::V4(dst) => ethernet(ETH_P_IP, &ipv4_packet(v4(dst), &[])),
            Self::V4Options(dst) => ethernet(ETH_P_IP, &ipv4_packet(v4(dst), &[1, 1, 1, 0])),
            Self::V6(dst) => ethernet(ETH_P_IPV6, &ipv6_packet(v6(dst), UDP, &[])),
            Self::V6Extensions(dst) => {
                let (next, ext) = extension_chain();
                ethernet(ETH_P_IPV6, &ipv6_packet(v6(dst), next, &ext))
            }
            Self::TruncatedV4 => ethernet(ETH_P_IP, &ipv4_packet(v4("192.0.2.1"), &[])[..12]),
            Self::TruncatedV6 => {
                ethernet(ETH_P_IPV6, &ipv6_packet(v6("2001:db8::1"), UDP, &[])[..30])
            }
            Self::EmptyV4 => ethernet(ETH_P_IP, &[]),
            Self::EmptyV6 => ethernet(ETH_P_IPV6, &[]),
            Self::V6BytesAsV4 => ethernet(ETH_P_IP, &ipv6_packet(v6("2001:db8::1"), UDP, &[])),
            Self::V4BytesAsV6 => {
                let mut p = ipv4_packet(v4("192.0.2.1"), &[]);
                p.resize(40, 0);
                ethernet(ETH_P_IPV6, &p)
            }
            Self::V4ShortIhl => {
                let mut p = ipv4_packet(v4("192.0.2.1"), &[]);
                p[0] = 0x44;
                ethernet(ETH_P_IP, &p)
            }
            Self::Arp => {
                // Ethernet/IPv4 ARP request, who-has 192.0.2.1.
                let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
                arp.extend_from_slice(&[0; 6]);
                arp.extend_from_slice(&[10, 99, 0, 1]);
                arp.extend_from_slice(&[0; 6]);
                arp.extend_from_slice(&[192, 0, 2, 1]);
                ethernet(ETH_P_ARP, &arp)
            }
        }
    }

    /// Whether the frame's IP header is shorter than the fixed header its
    /// EtherType announces (20 or 40 bytes).
    fn short_ip_header(self) -> bool {
        matches!(
            self,
            Self::TruncatedV4 | Self::TruncatedV6 | Self::EmptyV4 | Self::EmptyV6
        )
    }

    /// The destination the program parses, for a parsable frame.
    fn destination(self) -> Option<IpAddr> {
        match self {
            Self::V4(d) | Self::V4Options(d) => Some(IpAddr::V4(v4(d))),
            Self::V6(d) | Self::V6Extensions(d) => Some(IpAddr::V6(v6(d))),
            _ => None,
        }
    }
}

// ----------------------------------------------------------------------------
// What the kernel's test run accepts.

/// `(major, minor)` of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap();
    (next(), next())
}

/// Whether BPF_PROG_TEST_RUN refuses (EINVAL, before running the program)
/// an skb whose IP header is shorter than the fixed header its EtherType
/// announces. Measured with bpftool on stock kernels: 5.10 runs the
/// program on such a frame; 6.1, 6.12, 6.18 and 7.2 refuse it. On those,
/// the truncated and zero-length cases can only prove that the kernel
/// refuses them and nothing is counted; the program's own handling of
/// them is exercised where the kernel lets them through (5.10).
fn test_run_refuses_short_ip_headers() -> bool {
    kernel_version() >= (6, 1)
}

// ----------------------------------------------------------------------------
// The table.

/// Which outcome counter of [`Stats`] a case must add one to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Parsed(Decision),
    MalformedPassed,
    MalformedDropped,
    OtherProtocol,
}

impl Outcome {
    fn stats(self, observed: bool) -> Stats {
        let mut s = Stats::default();
        match self {
            Self::Parsed(d) => {
                match d {
                    Decision::Denied => s.denied = 1,
                    Decision::Allowed => s.allowed = 1,
                    Decision::DefaultDenied => s.default_denied = 1,
                    Decision::Unmatched => s.unmatched = 1,
                }
                s.observe_inserted = u64::from(observed);
            }
            Self::MalformedPassed => s.malformed_passed = 1,
            Self::MalformedDropped => s.malformed_dropped = 1,
            Self::OtherProtocol => s.other_protocol = 1,
        }
        s
    }

    fn verdict(self) -> u32 {
        match self {
            Self::Parsed(d) if d.dropped() => DROP,
            Self::MalformedDropped => DROP,
            _ => PASS,
        }
    }
}

struct Case {
    name: &'static str,
    allow: &'static [&'static str],
    deny: &'static [&'static str],
    default_deny: bool,
    frame: Frame,
    outcome: Outcome,
}

use Decision::{Allowed, DefaultDenied, Denied, Unmatched};
use Outcome::{MalformedDropped, MalformedPassed, OtherProtocol, Parsed};

const NONE: &[&str] = &[];
const ALL: &[&str] = &["0.0.0.0/0", "::/0"];

#[rustfmt::skip]
const CASES: &[Case] = &[
    // IPv4 deny entries of several lengths.
    Case { name: "v4 /32 deny drops its address", allow: NONE, deny: &["192.0.2.1/32"], default_deny: false, frame: Frame::V4("192.0.2.1"), outcome: Parsed(Denied) },
    Case { name: "v4 /32 deny passes its neighbour", allow: NONE, deny: &["192.0.2.1/32"], default_deny: false, frame: Frame::V4("192.0.2.2"), outcome: Parsed(Unmatched) },
    Case { name: "v4 /8 deny drops inside", allow: NONE, deny: &["10.0.0.0/8"], default_deny: false, frame: Frame::V4("10.200.3.4"), outcome: Parsed(Denied) },
    Case { name: "v4 /8 deny passes outside", allow: NONE, deny: &["10.0.0.0/8"], default_deny: false, frame: Frame::V4("11.0.0.1"), outcome: Parsed(Unmatched) },
    Case { name: "v4 options do not hide the destination", allow: NONE, deny: &["10.0.0.0/8"], default_deny: false, frame: Frame::V4Options("10.0.0.9"), outcome: Parsed(Denied) },
    // Precedence: an explicit deny beats an allow, whatever the lengths.
    Case { name: "v4 /0 deny beats a /32 allow inside it", allow: &["192.0.2.1/32"], deny: &["0.0.0.0/0"], default_deny: false, frame: Frame::V4("192.0.2.1"), outcome: Parsed(Denied) },
    Case { name: "v4 /0 deny drops what no allow covers", allow: &["192.0.2.1/32"], deny: &["0.0.0.0/0"], default_deny: false, frame: Frame::V4("198.51.100.1"), outcome: Parsed(Denied) },
    Case { name: "v4 /32 deny beats a /24 allow around it", allow: &["192.0.2.0/24"], deny: &["192.0.2.66"], default_deny: true, frame: Frame::V4("192.0.2.66"), outcome: Parsed(Denied) },
    // Host entries (in the host map) against prefixes (in the tries): the
    // deny still wins whichever side is the host.
    Case { name: "v4 /32 allow inside a /8 deny is dropped", allow: &["10.1.2.3/32"], deny: &["10.0.0.0/8"], default_deny: false, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Denied) },
    Case { name: "v4 /32 allow inside a /8 deny, default deny: dropped", allow: &["10.1.2.3/32"], deny: &["10.0.0.0/8"], default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Denied) },
    Case { name: "v4 /32 deny inside a /8 allow is dropped", allow: &["10.0.0.0/8"], deny: &["10.1.2.3/32"], default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Denied) },
    Case { name: "v4 /32 deny inside a /8 allow: its neighbour passes", allow: &["10.0.0.0/8"], deny: &["10.1.2.3/32"], default_deny: true, frame: Frame::V4("10.1.2.4"), outcome: Parsed(Allowed) },
    Case { name: "v4 /32 allow with default deny passes", allow: &["10.1.2.3/32"], deny: NONE, default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Allowed) },
    Case { name: "v4 /32 allow with default deny: its neighbour drops", allow: &["10.1.2.3/32"], deny: NONE, default_deny: true, frame: Frame::V4("10.1.2.4"), outcome: Parsed(DefaultDenied) },
    Case { name: "v4 /32 on both lists is denied", allow: &["10.1.2.3/32"], deny: &["10.1.2.3/32"], default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Denied) },
    Case { name: "v4 /31 (a prefix, not a host) allows both", allow: &["10.1.2.2/31"], deny: NONE, default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Allowed) },
    Case { name: "v4 prefixes only: inside the allow", allow: &["10.0.0.0/8"], deny: &["10.9.0.0/16"], default_deny: true, frame: Frame::V4("10.1.2.3"), outcome: Parsed(Allowed) },
    Case { name: "v4 prefixes only: inside the deny", allow: &["10.0.0.0/8"], deny: &["10.9.0.0/16"], default_deny: true, frame: Frame::V4("10.9.2.3"), outcome: Parsed(Denied) },
    Case { name: "v4 prefixes only: outside both", allow: &["10.0.0.0/8"], deny: &["10.9.0.0/16"], default_deny: true, frame: Frame::V4("11.1.2.3"), outcome: Parsed(DefaultDenied) },
    Case { name: "v6 /128 allow inside a /32 deny is dropped", allow: &["2001:db8::7/128"], deny: &["2001:db8::/32"], default_deny: true, frame: Frame::V6("2001:db8::7"), outcome: Parsed(Denied) },
    Case { name: "v6 /128 deny inside a /64 allow is dropped", allow: &["2001:db8::/64"], deny: &["2001:db8::7/128"], default_deny: true, frame: Frame::V6("2001:db8::7"), outcome: Parsed(Denied) },
    Case { name: "v6 /128 deny inside a /64 allow: its neighbour passes", allow: &["2001:db8::/64"], deny: &["2001:db8::7/128"], default_deny: true, frame: Frame::V6("2001:db8::8"), outcome: Parsed(Allowed) },
    Case { name: "v6 /128 allow with default deny passes", allow: &["2001:db8::7/128"], deny: NONE, default_deny: true, frame: Frame::V6("2001:db8::7"), outcome: Parsed(Allowed) },
    Case { name: "v6 /128 allow with default deny: its neighbour drops", allow: &["2001:db8::7/128"], deny: NONE, default_deny: true, frame: Frame::V6("2001:db8::8"), outcome: Parsed(DefaultDenied) },
    Case { name: "v6 /128 on both lists is denied", allow: &["2001:db8::7"], deny: &["2001:db8::7"], default_deny: false, frame: Frame::V6("2001:db8::7"), outcome: Parsed(Denied) },
    Case { name: "v6 prefixes only: inside the deny", allow: &["2001:db8::/32"], deny: &["2001:db8:9::/48"], default_deny: true, frame: Frame::V6("2001:db8:9::1"), outcome: Parsed(Denied) },
    Case { name: "v6 prefixes only: inside the allow", allow: &["2001:db8::/32"], deny: &["2001:db8:9::/48"], default_deny: true, frame: Frame::V6("2001:db8:8::1"), outcome: Parsed(Allowed) },
    Case { name: "v4 hosts do not cover IPv6", allow: &["192.0.2.1"], deny: NONE, default_deny: true, frame: Frame::V6("::ffff:192.0.2.1"), outcome: Parsed(DefaultDenied) },
    Case { name: "v6 hosts do not cover IPv4", allow: NONE, deny: &["::ffff:192.0.2.1", "::c000:201"], default_deny: false, frame: Frame::V4("192.0.2.1"), outcome: Parsed(Unmatched) },
    // Allow lists, with and without default deny.
    Case { name: "v4 default deny passes an allowed /24", allow: &["192.0.2.0/24", "198.51.100.7"], deny: NONE, default_deny: true, frame: Frame::V4("192.0.2.200"), outcome: Parsed(Allowed) },
    Case { name: "v4 default deny passes an allowed /32", allow: &["192.0.2.0/24", "198.51.100.7"], deny: NONE, default_deny: true, frame: Frame::V4("198.51.100.7"), outcome: Parsed(Allowed) },
    Case { name: "v4 default deny drops the rest", allow: &["192.0.2.0/24", "198.51.100.7"], deny: NONE, default_deny: true, frame: Frame::V4("198.51.100.8"), outcome: Parsed(DefaultDenied) },
    Case { name: "v4 allow list without default deny: allowed", allow: &["192.0.2.0/24"], deny: NONE, default_deny: false, frame: Frame::V4("192.0.2.9"), outcome: Parsed(Allowed) },
    Case { name: "v4 allow list without default deny: the rest passes", allow: &["192.0.2.0/24"], deny: NONE, default_deny: false, frame: Frame::V4("203.0.113.9"), outcome: Parsed(Unmatched) },
    Case { name: "v4 default deny with empty lists drops", allow: NONE, deny: NONE, default_deny: true, frame: Frame::V4("192.0.2.1"), outcome: Parsed(DefaultDenied) },
    Case { name: "no entries, no flags: passes", allow: NONE, deny: NONE, default_deny: false, frame: Frame::V4("192.0.2.1"), outcome: Parsed(Unmatched) },
    // IPv6.
    Case { name: "v6 /128 deny drops its address", allow: NONE, deny: &["2001:db8::1/128"], default_deny: false, frame: Frame::V6("2001:db8::1"), outcome: Parsed(Denied) },
    Case { name: "v6 /128 deny passes its neighbour", allow: NONE, deny: &["2001:db8::1/128"], default_deny: false, frame: Frame::V6("2001:db8::2"), outcome: Parsed(Unmatched) },
    Case { name: "v6 /64 deny drops inside", allow: NONE, deny: &["2001:db8:0:1::/64"], default_deny: false, frame: Frame::V6("2001:db8:0:1:ffff:ffff:ffff:ffff"), outcome: Parsed(Denied) },
    Case { name: "v6 /64 deny passes outside", allow: NONE, deny: &["2001:db8:0:1::/64"], default_deny: false, frame: Frame::V6("2001:db8:0:2::1"), outcome: Parsed(Unmatched) },
    Case { name: "v6 ::/0 deny beats a /128 allow", allow: &["2001:db8::1"], deny: &["::/0"], default_deny: false, frame: Frame::V6("2001:db8::1"), outcome: Parsed(Denied) },
    Case { name: "v6 ::/0 allow passes under default deny", allow: &["::/0"], deny: NONE, default_deny: true, frame: Frame::V6("2001:db8:abcd::1"), outcome: Parsed(Allowed) },
    Case { name: "v6 default deny drops outside the allowed /32", allow: &["2001:db8::/32"], deny: NONE, default_deny: true, frame: Frame::V6("2001:db9::1"), outcome: Parsed(DefaultDenied) },
    // Families never cover each other.
    Case { name: "v6 ::/0 allow does not cover IPv4", allow: &["::/0"], deny: NONE, default_deny: true, frame: Frame::V4("192.0.2.1"), outcome: Parsed(DefaultDenied) },
    Case { name: "v4 /0 deny does not cover IPv6", allow: NONE, deny: &["0.0.0.0/0"], default_deny: false, frame: Frame::V6("2001:db8::1"), outcome: Parsed(Unmatched) },
    Case { name: "a v4-mapped v6 deny does not match IPv4 packets", allow: NONE, deny: &["::ffff:192.0.2.1"], default_deny: false, frame: Frame::V4("192.0.2.1"), outcome: Parsed(Unmatched) },
    // Extension headers do not move the destination.
    Case { name: "v6 extensions: deny still matches", allow: NONE, deny: &["2001:db8::bad"], default_deny: false, frame: Frame::V6Extensions("2001:db8::bad"), outcome: Parsed(Denied) },
    Case { name: "v6 extensions: allow still matches", allow: &["2001:db8::/64"], deny: NONE, default_deny: true, frame: Frame::V6Extensions("2001:db8::7"), outcome: Parsed(Allowed) },
    Case { name: "v6 extensions: default deny", allow: &["2001:db8::/64"], deny: NONE, default_deny: true, frame: Frame::V6Extensions("2001:db8:1::7"), outcome: Parsed(DefaultDenied) },
    Case { name: "v6 extensions: unmatched passes", allow: NONE, deny: NONE, default_deny: false, frame: Frame::V6Extensions("2001:db8::7"), outcome: Parsed(Unmatched) },
    // Hostile input: passes, unless the set is default deny (even one that
    // allows everything: nothing can be matched).
    Case { name: "truncated v4 passes", allow: NONE, deny: ALL, default_deny: false, frame: Frame::TruncatedV4, outcome: MalformedPassed },
    Case { name: "truncated v4 under default deny drops", allow: ALL, deny: NONE, default_deny: true, frame: Frame::TruncatedV4, outcome: MalformedDropped },
    Case { name: "truncated v6 passes", allow: NONE, deny: ALL, default_deny: false, frame: Frame::TruncatedV6, outcome: MalformedPassed },
    Case { name: "truncated v6 under default deny drops", allow: ALL, deny: NONE, default_deny: true, frame: Frame::TruncatedV6, outcome: MalformedDropped },
    Case { name: "zero-length v4 packet passes", allow: NONE, deny: ALL, default_deny: false, frame: Frame::EmptyV4, outcome: MalformedPassed },
    Case { name: "zero-length v4 packet under default deny drops", allow: ALL, deny: NONE, default_deny: true, frame: Frame::EmptyV4, outcome: MalformedDropped },
    Case { name: "zero-length v6 packet passes", allow: NONE, deny: ALL, default_deny: false, frame: Frame::EmptyV6, outcome: MalformedPassed },
    Case { name: "zero-length v6 packet under default deny drops", allow: ALL, deny: NONE, default_deny: true, frame: Frame::EmptyV6, outcome: MalformedDropped },
    Case { name: "v6 bytes behind the v4 EtherType are malformed", allow: NONE, deny: ALL, default_deny: false, frame: Frame::V6BytesAsV4, outcome: MalformedPassed },
    Case { name: "v6 bytes behind the v4 EtherType, default deny", allow: ALL, deny: NONE, default_deny: true, frame: Frame::V6BytesAsV4, outcome: MalformedDropped },
    Case { name: "v4 bytes behind the v6 EtherType are malformed", allow: NONE, deny: ALL, default_deny: false, frame: Frame::V4BytesAsV6, outcome: MalformedPassed },
    Case { name: "v4 bytes behind the v6 EtherType, default deny", allow: ALL, deny: NONE, default_deny: true, frame: Frame::V4BytesAsV6, outcome: MalformedDropped },
    Case { name: "v4 IHL below 5 is malformed", allow: NONE, deny: ALL, default_deny: false, frame: Frame::V4ShortIhl, outcome: MalformedPassed },
    Case { name: "v4 IHL below 5, default deny", allow: ALL, deny: NONE, default_deny: true, frame: Frame::V4ShortIhl, outcome: MalformedDropped },
    Case { name: "non-IP passes", allow: NONE, deny: ALL, default_deny: false, frame: Frame::Arp, outcome: OtherProtocol },
    Case { name: "non-IP passes under default deny", allow: NONE, deny: NONE, default_deny: true, frame: Frame::Arp, outcome: OtherProtocol },
];

fn prefixes(list: &[&str]) -> Vec<Prefix> {
    list.iter().map(|p| p.parse().unwrap()).collect()
}

/// A fresh filter with set `set` holding `allow` and `deny`, applied to this
/// process's cgroup with `flags`.
fn filter_for(set: u32, allow: &[&str], deny: &[&str], flags: FilterFlags) -> EgressFilter {
    let f = EgressFilter::load().unwrap_or_else(|e| panic!("load: {e}\n{e:?}"));
    program_set(&f, set, allow, deny, flags);
    f
}

/// Fills set `set` of `f` with `allow` and `deny` and applies it to this
/// process's cgroup with `flags`.
fn program_set(f: &EgressFilter, set: u32, allow: &[&str], deny: &[&str], flags: FilterFlags) {
    for p in prefixes(allow) {
        f.insert(set, Verdict::Allow, p).unwrap();
    }
    for p in prefixes(deny) {
        f.insert(set, Verdict::Deny, p).unwrap();
    }
    f.set_filter(own_cgroup_id(), set, flags).unwrap();
}

/// What the counters counted between two reads. Every field is named, so
/// a counter added to [`Stats`] cannot be left out.
fn counted_since(after: Stats, before: Stats) -> Stats {
    let Stats {
        denied,
        allowed,
        default_denied,
        unmatched,
        malformed_passed,
        malformed_dropped,
        other_protocol,
        observe_inserted,
        observe_failed,
        learned_hits,
        learned_expired,
        cached,
        cache_failed,
    } = after;
    Stats {
        denied: denied - before.denied,
        allowed: allowed - before.allowed,
        default_denied: default_denied - before.default_denied,
        unmatched: unmatched - before.unmatched,
        malformed_passed: malformed_passed - before.malformed_passed,
        malformed_dropped: malformed_dropped - before.malformed_dropped,
        other_protocol: other_protocol - before.other_protocol,
        observe_inserted: observe_inserted - before.observe_inserted,
        observe_failed: observe_failed - before.observe_failed,
        learned_hits: learned_hits - before.learned_hits,
        learned_expired: learned_expired - before.learned_expired,
        cached: cached - before.cached,
        cache_failed: cache_failed - before.cache_failed,
    }
}

#[test]
fn table() {
    let _g = shared();
    let mut failures = Vec::new();
    let mut refused = 0;
    // One filter (a load takes seconds on an emulated 5.10): each run has
    // a set of its own, its counters read as what changed, its
    // observations drained. Sets never see each other's entries
    // (two_sets_do_not_leak_into_each_other).
    let f = EgressFilter::load().unwrap_or_else(|e| panic!("load: {e}\n{e:?}"));
    let mut set = 0;
    for case in CASES {
        for observe in [false, true] {
            let flags = FilterFlags {
                default_deny: case.default_deny,
                observe,
                domains: false,
            };
            set += 1;
            program_set(&f, set, case.allow, case.deny, flags);
            let before = f.read_stats().unwrap();
            if case.frame.short_ip_header() && test_run_refuses_short_ip_headers() {
                let got = (
                    f.test_run(&case.frame.bytes()).map_err(|e| match e {
                        EgressError::TestRun { errno, .. } => errno,
                        other => panic!("{other:?}"),
                    }),
                    counted_since(f.read_stats().unwrap(), before),
                    f.drain_observations().unwrap(),
                );
                let want = (Err(Some(libc::EINVAL)), Stats::default(), vec![]);
                if got != want {
                    failures.push(format!(
                        "{} (observe {observe}, the kernel should refuse it):\n   got {got:?}\n  want {want:?}",
                        case.name
                    ));
                }
                refused += 1;
                continue;
            }
            let verdict = match f.test_run(&case.frame.bytes()) {
                Ok(v) => v,
                Err(e) => {
                    failures.push(format!("{} (observe {observe}): {e:?}", case.name));
                    continue;
                }
            };
            let stats = counted_since(f.read_stats().unwrap(), before);
            let observations = f.drain_observations().unwrap();

            // Every refusal is counted; everything else only when observing.
            let refused = matches!(
                case.outcome,
                Parsed(Decision::Denied | Decision::DefaultDenied)
            );
            let counted = matches!(case.outcome, Parsed(_)) && (observe || refused);
            let want_observations: Vec<Observation> = match case.outcome {
                Parsed(decision) if counted => vec![Observation {
                    set_id: set,
                    destination: case.frame.destination().unwrap(),
                    decision,
                    count: 1,
                }],
                _ => vec![],
            };
            let got = (verdict, stats, observations);
            let want = (
                case.outcome.verdict(),
                case.outcome.stats(counted),
                want_observations,
            );
            if got != want {
                failures.push(format!(
                    "{} (observe {observe}):\n   got {got:?}\n  want {want:?}",
                    case.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        CASES.len() * 2,
        failures.join("\n")
    );
    eprintln!(
        "{} runs; {refused} of them short IP headers that kernel {:?} refuses to test-run",
        CASES.len() * 2,
        kernel_version()
    );
}

// ----------------------------------------------------------------------------
// Beyond one packet.

#[test]
fn a_cgroup_not_in_cgroup_filters_passes_uncounted() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    let all = FilterFlags {
        default_deny: true,
        observe: true,
        domains: false,
    };
    for p in prefixes(ALL) {
        f.insert(1, Verdict::Deny, p).unwrap();
    }
    // Another cgroup is selected, this one is not.
    f.set_filter(own_cgroup_id() + 1, 1, all).unwrap();
    for frame in [
        Frame::V4("192.0.2.1"),
        Frame::V6("2001:db8::1"),
        Frame::V4ShortIhl,
        Frame::Arp,
    ] {
        assert_eq!(f.test_run(&frame.bytes()).unwrap(), PASS, "{frame:?}");
    }
    assert_eq!(f.read_stats().unwrap(), Stats::default());
    assert_eq!(f.drain_observations().unwrap(), vec![]);
}

#[test]
fn removing_the_cgroup_stops_filtering_it() {
    let _g = shared();
    let f = filter_for(3, NONE, ALL, FilterFlags::default());
    let frame = Frame::V4("192.0.2.1").bytes();
    assert_eq!(f.test_run(&frame).unwrap(), DROP);
    assert!(f.remove_cgroup(own_cgroup_id()).unwrap());
    assert!(!f.remove_cgroup(own_cgroup_id()).unwrap(), "already gone");
    assert_eq!(f.test_run(&frame).unwrap(), PASS);
    let stats = f.read_stats().unwrap();
    assert_eq!(stats.denied, 1);
    assert_eq!(stats.packets(), 1, "{stats:?}");
}

#[test]
fn two_sets_do_not_leak_into_each_other() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    let me = own_cgroup_id();
    // Set 1 denies 192.0.2.1 and 2001:db8::1; set 2 allows exactly them,
    // under default deny.
    for p in prefixes(&["192.0.2.1", "2001:db8::1"]) {
        f.insert(1, Verdict::Deny, p).unwrap();
        f.insert(2, Verdict::Allow, p).unwrap();
    }
    let observe = FilterFlags {
        observe: true,
        ..FilterFlags::default()
    };
    let strict = FilterFlags {
        default_deny: true,
        observe: true,
        domains: false,
    };
    let run = |dst: &'static str| {
        let frame = if dst.contains(':') {
            Frame::V6(dst)
        } else {
            Frame::V4(dst)
        };
        f.test_run(&frame.bytes()).unwrap()
    };

    f.set_filter(me, 1, observe).unwrap();
    assert_eq!(run("192.0.2.1"), DROP, "set 1 denies it");
    assert_eq!(run("2001:db8::1"), DROP, "set 1 denies it");
    assert_eq!(
        run("198.51.100.1"),
        PASS,
        "set 2's default deny stays in set 2"
    );

    f.set_filter(me, 2, strict).unwrap();
    assert_eq!(run("192.0.2.1"), PASS, "set 1's deny stays in set 1");
    assert_eq!(run("2001:db8::1"), PASS, "set 1's deny stays in set 1");
    assert_eq!(run("198.51.100.1"), DROP, "set 2 is default deny");

    let mut got = f.drain_observations().unwrap();
    got.sort();
    let o = |set_id, dst: &str, decision| Observation {
        set_id,
        destination: dst.parse().unwrap(),
        decision,
        count: 1,
    };
    let mut want = vec![
        o(1, "192.0.2.1", Denied),
        o(1, "2001:db8::1", Denied),
        o(1, "198.51.100.1", Unmatched),
        o(2, "192.0.2.1", Allowed),
        o(2, "2001:db8::1", Allowed),
        o(2, "198.51.100.1", DefaultDenied),
    ];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn host_entries_of_another_set_do_not_match() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    let me = own_cgroup_id();
    // Set 1 allows 192.0.2.1 and 2001:db8::1 and denies .2 and ::2; set 2
    // has host entries too (so its lookups happen), of other addresses,
    // and set 3 has prefixes only.
    for (set, verdict, p) in [
        (1, Verdict::Allow, "192.0.2.1"),
        (1, Verdict::Allow, "2001:db8::1"),
        (1, Verdict::Deny, "192.0.2.2"),
        (1, Verdict::Deny, "2001:db8::2"),
        (2, Verdict::Allow, "192.0.2.9"),
        (2, Verdict::Allow, "2001:db8::9"),
        (3, Verdict::Allow, "198.51.100.0/24"),
        (3, Verdict::Allow, "2001:db9::/64"),
    ] {
        f.insert(set, verdict, p.parse().unwrap()).unwrap();
    }
    let strict = FilterFlags {
        default_deny: true,
        ..FilterFlags::default()
    };
    let run = |dst: &'static str| {
        let frame = if dst.contains(':') {
            Frame::V6(dst)
        } else {
            Frame::V4(dst)
        };
        f.test_run(&frame.bytes()).unwrap()
    };
    f.set_filter(me, 1, strict).unwrap();
    for dst in ["192.0.2.1", "2001:db8::1"] {
        assert_eq!(run(dst), PASS, "set 1 allows {dst}");
    }
    for dst in ["192.0.2.2", "2001:db8::2", "192.0.2.9", "2001:db8::9"] {
        assert_eq!(run(dst), DROP, "set 1 {dst}");
    }
    for set in [2, 3] {
        f.set_filter(me, set, strict).unwrap();
        for dst in ["192.0.2.1", "2001:db8::1"] {
            assert_eq!(run(dst), DROP, "set 1's allow of {dst} stays in set 1");
        }
    }
    f.set_filter(me, 2, FilterFlags::default()).unwrap();
    for dst in ["192.0.2.2", "2001:db8::2"] {
        assert_eq!(run(dst), PASS, "set 1's deny of {dst} stays in set 1");
    }
    let stats = f.read_stats().unwrap();
    assert_eq!(stats.packets(), 12, "{stats:?}");
    assert_eq!((stats.allowed, stats.unmatched), (2, 2), "{stats:?}");
    assert_eq!((stats.denied, stats.default_denied), (2, 6), "{stats:?}");
}

/// Entries inserted after the cgroup is programmed, and removed again,
/// are seen at once: the set's occupancy bits in `cgroup_filters` follow
/// them, whatever the order of set_filter and insert.
#[test]
fn entries_count_from_the_first_and_stop_at_the_last() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    let me = own_cgroup_id();
    let run = |dst: &'static str| {
        let frame = if dst.contains(':') {
            Frame::V6(dst)
        } else {
            Frame::V4(dst)
        };
        f.test_run(&frame.bytes()).unwrap()
    };
    f.set_filter(me, 8, FilterFlags::default()).unwrap();
    let host: Prefix = "192.0.2.1".parse().unwrap();
    let host6: Prefix = "2001:db8::1".parse().unwrap();
    let net: Prefix = "192.0.2.0/24".parse().unwrap();
    let net6: Prefix = "2001:db8::/64".parse().unwrap();
    for (p, dst) in [
        (host, "192.0.2.1"),
        (net, "192.0.2.1"),
        (host6, "2001:db8::1"),
        (net6, "2001:db8::1"),
    ] {
        assert_eq!(run(dst), PASS, "{p} not yet there");
        f.insert(8, Verdict::Deny, p).unwrap();
        assert_eq!(run(dst), DROP, "{p} denies from its insert on");
        assert!(f.remove(8, Verdict::Deny, p).unwrap());
        assert_eq!(run(dst), PASS, "{p} removed");
    }
    // Two host entries: removing one keeps the other's lookup.
    let other: Prefix = "192.0.2.2".parse().unwrap();
    f.insert(8, Verdict::Deny, host).unwrap();
    f.insert(8, Verdict::Deny, other).unwrap();
    assert!(f.remove(8, Verdict::Deny, host).unwrap());
    assert_eq!(run("192.0.2.2"), DROP, "the other host entry still counts");
    // An address on both lists: taking it off the deny list leaves the
    // allow, under default deny.
    f.insert(8, Verdict::Allow, other).unwrap();
    let strict = FilterFlags {
        default_deny: true,
        ..FilterFlags::default()
    };
    f.set_filter(me, 8, strict).unwrap();
    assert_eq!(run("192.0.2.2"), DROP, "on both lists: denied");
    assert!(f.remove(8, Verdict::Deny, other).unwrap());
    assert!(!f.remove(8, Verdict::Deny, other).unwrap(), "already off");
    assert_eq!(run("192.0.2.2"), PASS, "still on the allow list");
    assert!(f.remove(8, Verdict::Allow, other).unwrap());
    assert_eq!(run("192.0.2.2"), DROP, "on no list: default deny");
    // A second cgroup programmed before the set gets entries sees them too.
    f.set_filter(me + 1, 9, strict).unwrap();
    f.set_filter(me, 9, strict).unwrap();
    f.insert(9, Verdict::Allow, host6).unwrap();
    assert_eq!(run("2001:db8::1"), PASS);
    // The entries read back as prefixes, hosts and tries alike.
    f.insert(9, Verdict::Deny, net).unwrap();
    f.insert(9, Verdict::Allow, host).unwrap();
    f.insert(9, Verdict::Deny, host).unwrap();
    let state = f.read_state().unwrap();
    let set = &state.sets[&9];
    assert_eq!(set.allow, [host, host6].into());
    assert_eq!(set.deny, [host, net].into());
    assert_eq!(
        state.filters[&me],
        (9, strict),
        "occupancy bits are not flags"
    );
}

#[test]
fn observations_count_per_destination_and_drain_resets_them() {
    let _g = shared();
    let observe = FilterFlags {
        observe: true,
        ..FilterFlags::default()
    };
    let f = filter_for(7, NONE, &["192.0.2.0/24"], observe);
    for _ in 0..3 {
        assert_eq!(f.test_run(&Frame::V4("192.0.2.1").bytes()).unwrap(), DROP);
    }
    for _ in 0..2 {
        assert_eq!(f.test_run(&Frame::V6("2001:db8::9").bytes()).unwrap(), PASS);
    }
    let mut got = f.drain_observations().unwrap();
    got.sort();
    assert_eq!(
        got,
        vec![
            Observation {
                set_id: 7,
                destination: "192.0.2.1".parse().unwrap(),
                decision: Denied,
                count: 3
            },
            Observation {
                set_id: 7,
                destination: "2001:db8::9".parse().unwrap(),
                decision: Unmatched,
                count: 2
            },
        ]
    );
    assert_eq!(f.drain_observations().unwrap(), vec![], "a drain resets");
    assert_eq!(
        f.read_stats().unwrap().observe_inserted,
        2,
        "two keys created"
    );

    // Observation off: the same verdicts; only the refusal is counted
    // per destination (an enforce-only pod's denials still become
    // findings), the allowed packet is not.
    f.set_filter(own_cgroup_id(), 7, FilterFlags::default())
        .unwrap();
    assert_eq!(f.test_run(&Frame::V4("192.0.2.1").bytes()).unwrap(), DROP);
    assert_eq!(f.test_run(&Frame::V6("2001:db8::9").bytes()).unwrap(), PASS);
    assert_eq!(
        f.drain_observations().unwrap(),
        vec![Observation {
            set_id: 7,
            destination: "192.0.2.1".parse().unwrap(),
            decision: Denied,
            count: 1
        }]
    );
    let stats = f.read_stats().unwrap();
    assert_eq!(
        (stats.denied, stats.unmatched, stats.observe_inserted),
        (4, 3, 3)
    );
}

#[test]
fn entries_can_be_removed_exactly() {
    let _g = shared();
    let f = filter_for(
        5,
        NONE,
        &["10.0.0.0/8", "10.1.0.0/16"],
        FilterFlags::default(),
    );
    let frame = Frame::V4("10.1.2.3").bytes();
    assert_eq!(f.test_run(&frame).unwrap(), DROP);
    // Host bits do not matter: 10.9.9.9/8 is 10.0.0.0/8.
    assert!(f
        .remove(5, Verdict::Deny, "10.9.9.9/8".parse().unwrap())
        .unwrap());
    assert!(!f
        .remove(5, Verdict::Deny, "10.0.0.0/8".parse().unwrap())
        .unwrap());
    assert_eq!(f.test_run(&frame).unwrap(), DROP, "the /16 still denies");
    assert!(
        !f.remove(5, Verdict::Allow, "10.1.0.0/16".parse().unwrap())
            .unwrap(),
        "not in allow"
    );
    assert!(
        !f.remove(6, Verdict::Deny, "10.1.0.0/16".parse().unwrap())
            .unwrap(),
        "not in set 6"
    );
    assert!(f
        .remove(5, Verdict::Deny, "10.1.0.0/16".parse().unwrap())
        .unwrap());
    assert_eq!(f.test_run(&frame).unwrap(), PASS);
    // Inserting twice is one entry: one removal clears it.
    let p: Prefix = "2001:db8::/48".parse().unwrap();
    f.insert(5, Verdict::Deny, p).unwrap();
    f.insert(5, Verdict::Deny, p).unwrap();
    assert_eq!(f.test_run(&Frame::V6("2001:db8::1").bytes()).unwrap(), DROP);
    assert!(f.remove(5, Verdict::Deny, p).unwrap());
    assert_eq!(f.test_run(&Frame::V6("2001:db8::1").bytes()).unwrap(), PASS);
}

#[test]
fn a_zero_length_frame_is_refused_by_the_kernel() {
    let _g = shared();
    let f = filter_for(
        1,
        NONE,
        NONE,
        FilterFlags {
            default_deny: true,
            observe: true,
            domains: false,
        },
    );
    // The kernel needs at least an Ethernet header; the program never runs.
    for short in [&[][..], &[0u8; 13][..]] {
        match f.test_run(short) {
            Err(EgressError::TestRun { errno, .. }) => assert_eq!(errno, Some(libc::EINVAL)),
            other => panic!("{} bytes: {other:?}", short.len()),
        }
    }
    assert_eq!(f.read_stats().unwrap(), Stats::default());
}

#[test]
fn cgroup_id_zero_is_refused() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    assert_eq!(
        f.set_filter(0, 1, FilterFlags::default()),
        Err(EgressError::InvalidCgroupId)
    );
}

#[test]
fn moved_into_a_child_cgroup_the_filter_sees_the_child() {
    let _g = exclusive();
    let parent = own_cgroup_id();
    let f = EgressFilter::load().unwrap();
    for p in prefixes(ALL) {
        f.insert(9, Verdict::Deny, p).unwrap();
    }
    let frame = Frame::V4("192.0.2.1").bytes();

    let child = InChildCgroup::enter();
    let id = own_cgroup_id();
    assert_ne!(id, parent, "the move changed this process's cgroup");
    // Only the parent registered: the packet is the child's, so it passes.
    f.set_filter(parent, 9, FilterFlags::default()).unwrap();
    assert_eq!(f.test_run(&frame).unwrap(), PASS);
    // The child registered: dropped.
    f.set_filter(id, 9, FilterFlags::default()).unwrap();
    assert_eq!(f.test_run(&frame).unwrap(), DROP);
    drop(child);

    assert_eq!(own_cgroup_id(), parent, "moved back");
    assert_eq!(
        f.test_run(&frame).unwrap(),
        DROP,
        "the parent is registered too"
    );
    assert_eq!(f.read_stats().unwrap().denied, 2);
}

/// The node-wide trie ceiling is sized for the 100,000-entry benchmark set.
#[test]
fn a_set_of_100k_prefixes_fits() {
    let _g = shared();
    let f = filter_for(
        100,
        NONE,
        NONE,
        FilterFlags {
            default_deny: true,
            observe: false,
            domains: false,
        },
    );
    // 100,000 /32s from 10.0.0.0 up, and 2,000 IPv6 /64s.
    for i in 0..100_000u32 {
        let addr = Ipv4Addr::from(0x0a00_0000 + i * 3);
        f.insert(100, Verdict::Allow, Prefix::host(IpAddr::V4(addr)))
            .unwrap();
    }
    for i in 0..2_000u128 {
        let addr = Ipv6Addr::from((0x2001_0db8u128 << 96) | (i << 64));
        f.insert(
            100,
            Verdict::Allow,
            Prefix::new(IpAddr::V6(addr), 64).unwrap(),
        )
        .unwrap();
    }
    let run = |frame: Frame| f.test_run(&frame.bytes()).unwrap();
    assert_eq!(run(Frame::V4("10.0.0.0")), PASS);
    assert_eq!(run(Frame::V4("10.0.0.1")), DROP, "between two entries");
    // The last one: 10.0.0.0 + 99,999 * 3 = 10.4.147.221.
    assert_eq!(run(Frame::V4("10.4.147.221")), PASS);
    assert_eq!(run(Frame::V6("2001:db8:0:7cf::1")), PASS, "the 2000th /64");
    assert_eq!(run(Frame::V6("2001:db8:0:7d0::1")), DROP);
}

#[test]
fn a_full_map_is_reported_as_full() {
    let _g = shared();
    let f = EgressFilter::load().unwrap();
    // Fake cgroup ids far above any real one: nothing runs in them.
    let base = 1 << 40;
    let mut inserted = 0u64;
    let err = loop {
        match f.set_filter(base + inserted, 1, FilterFlags::default()) {
            Ok(()) => inserted += 1,
            Err(e) => break e,
        }
        assert!(inserted <= 1 << 20, "cgroup_filters never filled up");
    };
    assert_eq!(
        err,
        EgressError::MapFull {
            map: "cgroup_filters",
            max_entries: 1 << 14
        }
    );
    assert_eq!(inserted, 1 << 14);
    // Replacing an existing entry still works at the ceiling.
    f.set_filter(base, 2, FilterFlags::default()).unwrap();
    assert!(f.remove_cgroup(base).unwrap());
    f.set_filter(base + inserted, 1, FilterFlags::default())
        .unwrap();
}

#[test]
fn loading_restores_the_callers_libbpf_print_callback() {
    // Exclusive: the print callback is process-global.
    let _g = exclusive();
    fn mine(_: libbpf_rs::PrintLevel, _: String) {}
    let before = libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, mine)));
    // Loaded and dropped at once: only the callback around it matters.
    EgressFilter::load().unwrap();
    let after = libbpf_rs::get_print().map(|(level, _)| level);
    libbpf_rs::set_print(before);
    assert_eq!(after, Some(libbpf_rs::PrintLevel::Debug));
}

/// A test run with a repeat count sends its packets over one socket: the
/// first takes the full path and caches the verdict, the rest the cached
/// verdict, which is counted and observed like the verdict it repeats. A
/// malformed packet is never cached.
#[test]
fn a_sockets_later_packets_take_its_cached_verdict() {
    let _g = shared();
    let observe = FilterFlags {
        observe: true,
        ..FilterFlags::default()
    };
    let f = filter_for(7, NONE, &["192.0.2.0/24"], observe);
    let run = f
        .test_run_repeat(&Frame::V4("192.0.2.1").bytes(), 50)
        .unwrap();
    assert_eq!(run.verdict, DROP);
    let run = f
        .test_run_repeat(&Frame::V6("2001:db8::9").bytes(), 30)
        .unwrap();
    assert_eq!(run.verdict, PASS);
    let stats = f.read_stats().unwrap();
    assert_eq!(
        (
            stats.denied,
            stats.unmatched,
            stats.cached,
            stats.cache_failed
        ),
        (50, 30, 49 + 29, 0),
        "{stats:?}"
    );
    let mut got = f.drain_observations().unwrap();
    got.sort();
    assert_eq!(
        got.iter()
            .map(|o| (o.destination, o.decision, o.count))
            .collect::<Vec<_>>(),
        vec![
            ("192.0.2.1".parse().unwrap(), Denied, 50),
            ("2001:db8::9".parse().unwrap(), Unmatched, 30),
        ]
    );

    // A change between two runs: the next socket's first packet decides
    // anew (a socket of its own), and so do the cached ones after it.
    f.remove(7, Verdict::Deny, "192.0.2.0/24".parse().unwrap())
        .unwrap();
    let run = f
        .test_run_repeat(&Frame::V4("192.0.2.1").bytes(), 20)
        .unwrap();
    assert_eq!(run.verdict, PASS);

    let before = f.read_stats().unwrap();
    f.test_run_repeat(&Frame::V4ShortIhl.bytes(), 10).unwrap();
    let after = f.read_stats().unwrap();
    assert_eq!(
        (
            after.malformed_passed - before.malformed_passed,
            after.cached - before.cached
        ),
        (10, 0),
        "{after:?}"
    );
}

/// Issue 37, finding 5: one container flooding distinct destinations
/// cannot evict another's counts. Sixteen sets are in use (this process's
/// cgroup, and cgroup ids standing for neighbours), so each may start a
/// sixteenth of the observation map per drain and the shares sum to the
/// map: its LRU never has to evict. The neighbour's set counts a
/// destination first (the least recently used key), then the flooding set
/// sends to twice its share of distinct destinations. (Twice, not more
/// than the whole map: a guest under TCG runs this table too.)
#[test]
fn a_set_flooding_destinations_keeps_to_its_share_and_evicts_no_neighbour() {
    let _g = shared();
    const FLOODER: u32 = 11;
    const NEIGHBOUR: u32 = 12;
    const SETS: u32 = 16;
    let observe = FilterFlags {
        observe: true,
        ..FilterFlags::default()
    };
    let f = EgressFilter::load().unwrap();
    f.set_filter(own_cgroup_id() + 1_000_000, FLOODER, observe)
        .unwrap();
    for other in 2..SETS {
        f.set_filter(
            own_cgroup_id() + 1_000_000 + u64::from(other),
            100 + other,
            observe,
        )
        .unwrap();
    }
    f.set_filter(own_cgroup_id(), NEIGHBOUR, observe).unwrap();
    let share = f.observation_share().unwrap().unwrap();
    assert_eq!(
        share,
        kyverno_runtime_bpf::egress::OBSERVATIONS_MAX / u64::from(SETS)
    );
    assert_eq!(f.test_run(&Frame::V4("192.0.2.77").bytes()).unwrap(), PASS);

    // This process's cgroup now speaks for the flooding set.
    f.set_filter(own_cgroup_id(), FLOODER, observe).unwrap();
    f.set_filter(own_cgroup_id() + 1_000_000, NEIGHBOUR, observe)
        .unwrap();
    let flood = 2 * share;
    for i in 0..flood {
        let dst = Ipv4Addr::from(0x0a00_0000 + u32::try_from(i).unwrap());
        let frame = kyverno_runtime_bpf::frame::udp_to(IpAddr::V4(dst));
        assert_eq!(f.test_run(&frame).unwrap(), PASS);
    }
    let over = f.observations_over_share().unwrap();
    let got = f.drain_observations().unwrap();
    let of = |set: u32| got.iter().filter(|o| o.set_id == set).count() as u64;
    println!(
        "share {share}: flooding set counted {} destinations, {over:?} past its share; neighbour {}",
        of(FLOODER),
        of(NEIGHBOUR)
    );
    assert_eq!(of(FLOODER), share, "the flooder kept to its share");
    assert_eq!(
        over,
        [(FLOODER, flood - share)],
        "every observation past it counted"
    );
    assert!(
        got.iter().any(|o| o.set_id == NEIGHBOUR
            && o.destination == IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))
            && o.count == 1),
        "the neighbour's count survived the flood"
    );
    let stats = f.read_stats().unwrap();
    assert_eq!(stats.observe_failed, 0, "{stats:?}");

    // The drain starts every share again.
    let dst = Ipv4Addr::new(198, 51, 100, 1);
    f.test_run(&kyverno_runtime_bpf::frame::udp_to(IpAddr::V4(dst)))
        .unwrap();
    let again = f.drain_observations().unwrap();
    assert_eq!(again.len(), 1, "{again:?}");
}
