//! The DNS answer snooper and the egress filter's use of what it learns,
//! on the host kernel with BPF_PROG_TEST_RUN (tier 2: needs root).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! dnssnoop_test_run`. Crafted DNS responses go through the snooper
//! (`EgressFilter::test_run_snoop`); each case asserts the verdict (always
//! pass), the learned map and the snooper's counters. The test skb's socket
//! is charged to this process's cgroup, so each case maps that cgroup (the
//! inode of its cgroup v2 directory) to its set, as the agent maps a
//! container's. Each case loads its own filter, so maps and counters start
//! empty.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;
#[path = "common/dnsmsg.rs"]
mod dnsmsg;
#[path = "common/frames.rs"]
mod frames;
#[path = "common/snoop.rs"]
mod snoop;

use cgroup::own_cgroup_id;
use frames::{ethernet, ipv4, ipv6, udp, ETH_P_IP, ETH_P_IPV6, TCP, UDP};
use snoop::{answer_from, d, question_to, ALLOW, DENY, POD, RESOLVER};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use dnsmsg::{labels_then, ptr, wire, Response, QNAME_AT, TYPE_A, TYPE_AAAA, TYPE_TXT};
use kyverno_runtime_bpf::egress::{
    DomainVerdicts, EgressFilter, FilterFlags, Learned, Prefix, SnoopStats, Verdict, DNS_TTL_MAX,
    DNS_TTL_MIN,
};

const PASS: u32 = 1;
const DROP: u32 = 0;
const SET: u32 = 7;

// ---- frames ------------------------------------------------------------------

const RESOLVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa);

/// A DNS message from the resolver's port 53 to the pod, over IPv4.
fn from_53(msg: &[u8]) -> Vec<u8> {
    from_port(53, msg)
}

fn from_port(sport: u16, msg: &[u8]) -> Vec<u8> {
    ethernet(ETH_P_IP, &ipv4(UDP, RESOLVER, POD, &udp(sport, 41000, msg)))
}

/// The same over IPv6.
fn from_53_v6(msg: &[u8]) -> Vec<u8> {
    let pod: Ipv6Addr = "fd00:1::5".parse().unwrap();
    ethernet(
        ETH_P_IPV6,
        &ipv6(UDP, RESOLVER_V6, pod, &udp(53, 41000, msg)),
    )
}

/// A TCP SYN from the pod to `dst` (what the egress filter judges).
fn syn_to(dst: IpAddr) -> Vec<u8> {
    let mut tcp = 41000u16.to_be_bytes().to_vec();
    tcp.extend_from_slice(&443u16.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    match dst {
        IpAddr::V4(d) => ethernet(ETH_P_IP, &ipv4(TCP, POD, d, &tcp)),
        IpAddr::V6(d) => ethernet(
            ETH_P_IPV6,
            &ipv6(TCP, "fd00:1::5".parse().unwrap(), d, &tcp),
        ),
    }
}

// ---- fixtures -------------------------------------------------------------------

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A filter whose set (this process's cgroup) names `domains` (name,
/// sides; name ids 1, 2, ... in order), with `flags`.
fn snooping(domains: &[(&str, DomainVerdicts)], flags: FilterFlags) -> EgressFilter {
    let f = EgressFilter::load().unwrap();
    if let Some(e) = f.snoop_error() {
        panic!("the snooper did not load: {e}");
    }
    for (i, (name, verdicts)) in domains.iter().enumerate() {
        f.set_domain(SET, &d(name), *verdicts, u32::try_from(i + 1).unwrap())
            .unwrap();
    }
    f.set_filter(own_cgroup_id(), SET, flags).unwrap();
    declare_resolvers(&f);
    f
}

fn domains_on() -> FilterFlags {
    FilterFlags {
        default_deny: false,
        observe: false,
        domains: true,
    }
}

/// The question `response_frame` answers, as the pod sent it: addresses
/// and ports swapped, the DNS message cut by [`dnsmsg::question_of`].
fn question_frame(response_frame: &[u8]) -> Option<Vec<u8>> {
    let ethertype = u16::from_be_bytes([response_frame[12], response_frame[13]]);
    let (udp_at, header) = match ethertype {
        ETH_P_IP => (14 + 20, 20),
        _ => (14 + 40, 40),
    };
    let l4 = response_frame.get(udp_at..)?;
    let (sport, dport) = (
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]]),
    );
    let msg = l4.get(8..)?;
    // A query (QR clear) answers nothing: nothing to ask first.
    if msg.get(2)? & 0x80 == 0 {
        return None;
    }
    let question = dnsmsg::question_of(msg)?;
    let ip = &response_frame[14..14 + header];
    Some(if ethertype == ETH_P_IP {
        let (src, dst): ([u8; 4], [u8; 4]) =
            (ip[12..16].try_into().ok()?, ip[16..20].try_into().ok()?);
        ethernet(
            ETH_P_IP,
            &ipv4(UDP, dst.into(), src.into(), &udp(dport, sport, &question)),
        )
    } else {
        let (src, dst): ([u8; 16], [u8; 16]) =
            (ip[8..24].try_into().ok()?, ip[24..40].try_into().ok()?);
        ethernet(
            ETH_P_IPV6,
            &ipv6(UDP, dst.into(), src.into(), &udp(dport, sport, &question)),
        )
    })
}

/// Declares the tests' resolvers (RESOLVER and its IPv6 twin).
fn declare_resolvers(f: &EgressFilter) {
    f.set_dns_resolvers(&[IpAddr::V4(RESOLVER), IpAddr::V6(RESOLVER_V6)])
        .unwrap();
}

/// Sends `frame`'s question through the egress filter (which notes it),
/// then runs the snooper on `frame`, asserting it passed: a pod asking,
/// then its resolver answering.
fn snoop(f: &EgressFilter, frame: &[u8]) {
    if let Some(question) = question_frame(frame) {
        // Noted whatever the verdict (a question the filter drops gets no
        // answer to match).
        f.test_run(&question).unwrap();
    }
    answer_unasked(f, frame);
}

/// Runs the snooper on `frame` alone (no question sent first).
fn answer_unasked(f: &EgressFilter, frame: &[u8]) {
    assert_eq!(
        f.test_run_snoop(frame).unwrap(),
        PASS,
        "the snooper never drops"
    );
}

/// The learned entries without their remaining time (asserted apart).
fn learned(f: &EgressFilter) -> Vec<(u32, IpAddr, DomainVerdicts, u32)> {
    f.learned()
        .unwrap()
        .into_iter()
        .map(|l| (l.set_id, l.addr, l.verdicts, l.name_id))
        .collect()
}

fn stats(f: &EgressFilter) -> SnoopStats {
    f.read_snoop_stats().unwrap()
}

fn only(learned: &[Learned]) -> Learned {
    assert_eq!(learned.len(), 1, "{learned:?}");
    learned[0]
}

// ---- the table -------------------------------------------------------------------

/// One crafted response and what the snooper must make of it, for a set
/// naming `allowed.test` (allow, name id 1) and `denied.test` (deny, 2).
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    learned: Vec<(&'static str, DomainVerdicts, u32)>,
    stats: SnoopStats,
}

/// `n` responses, each answering a question the pod asked first (see
/// [`snoop`]).
fn responses(n: u64) -> SnoopStats {
    SnoopStats {
        responses: n,
        questions_noted: n,
        ..SnoopStats::default()
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();

    // A: the owner is a pointer to the question, as every server writes it.
    let mut r = Response::new("Allowed.TEST", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 10));
    out.push(Case {
        name: "A record, owner compressed to the question",
        frame: from_53(&r.bytes),
        learned: vec![("192.0.2.10", ALLOW, 1)],
        stats: SnoopStats {
            learned: 1,
            ..responses(1)
        },
    });

    // AAAA over IPv6, two records, the owner written out in full.
    let mut r = Response::new("allowed.test", TYPE_AAAA);
    r.aaaa(&wire("ALLOWED.test"), 60, "2001:db8::10".parse().unwrap());
    r.aaaa(&ptr(QNAME_AT), 60, "2001:db8::11".parse().unwrap());
    out.push(Case {
        name: "AAAA records over IPv6, owner uncompressed and compressed",
        frame: from_53_v6(&r.bytes),
        learned: vec![("2001:db8::10", ALLOW, 1), ("2001:db8::11", ALLOW, 1)],
        stats: SnoopStats {
            learned: 2,
            ..responses(1)
        },
    });

    // CNAME chain: the question names nothing; its CNAME leads through a
    // second CNAME to allowed.test, whose A record is learned with
    // allowed.test's verdicts.
    let mut r = Response::new("www.shop.example", TYPE_A);
    let mid = r.cname(&ptr(QNAME_AT), 30, &labels_then("edge", QNAME_AT + 4));
    let last = r.cname(&ptr(mid), 30, &wire("allowed.test"));
    r.a(&ptr(last), 30, Ipv4Addr::new(192, 0, 2, 20));
    r.a(&ptr(last), 30, Ipv4Addr::new(192, 0, 2, 21));
    out.push(Case {
        name: "CNAME chain of two to a named name",
        frame: from_53(&r.bytes),
        learned: vec![("192.0.2.20", ALLOW, 1), ("192.0.2.21", ALLOW, 1)],
        stats: SnoopStats {
            learned: 2,
            ..responses(1)
        },
    });

    // Compression inside names: the question is denied.test; the CNAME's
    // target is "cdn" + a pointer into the question's last label
    // ("test"), i.e. cdn.test, named nowhere; the A record reached through
    // the chain still carries denied.test's deny.
    let mut r = Response::new("denied.test", TYPE_A);
    let target = r.cname(&ptr(QNAME_AT), 30, &labels_then("cdn", QNAME_AT + 7));
    r.a(&ptr(target), 30, Ipv4Addr::new(192, 0, 2, 30));
    out.push(Case {
        name: "pointer into the middle of a name, deny side",
        frame: from_53(&r.bytes),
        learned: vec![("192.0.2.30", DENY, 2)],
        stats: SnoopStats {
            learned: 1,
            ..responses(1)
        },
    });

    // A name no domain names: nothing learned, counted.
    let mut r = Response::new("other.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 40));
    out.push(Case {
        name: "answer for a name no policy names",
        frame: from_53(&r.bytes),
        learned: vec![],
        stats: SnoopStats {
            unnamed: 1,
            ..responses(1)
        },
    });

    // A record owned by a name the chain never reached: skipped, while
    // the question's own record is learned.
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&wire("denied.test"), 300, Ipv4Addr::new(192, 0, 2, 50));
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 51));
    out.push(Case {
        name: "a record of another owner is not learned",
        frame: from_53(&r.bytes),
        learned: vec![("192.0.2.51", ALLOW, 1)],
        stats: SnoopStats {
            learned: 1,
            unchained: 1,
            ..responses(1)
        },
    });

    // Truncated: the first record is learned, the second ends mid-way.
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 60));
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 61));
    let cut = r.bytes.len() - 2;
    out.push(Case {
        name: "truncated in the second record",
        frame: from_53(&r.bytes[..cut]),
        learned: vec![("192.0.2.60", ALLOW, 1)],
        stats: SnoopStats {
            learned: 1,
            malformed: 1,
            ..responses(1)
        },
    });

    // Truncated in the header.
    let r = Response::new("allowed.test", TYPE_A);
    out.push(Case {
        name: "truncated in the header",
        frame: from_53(&r.bytes[..7]),
        learned: vec![],
        stats: SnoopStats {
            malformed: 1,
            ..SnoopStats::default()
        },
    });

    // A pointer to itself (a loop) and a forward pointer.
    let mut r = Response::new("allowed.test", TYPE_A);
    let at = r.bytes.len();
    r.a(&ptr(at), 300, Ipv4Addr::new(192, 0, 2, 70));
    out.push(Case {
        name: "a compression pointer to itself",
        frame: from_53(&r.bytes),
        learned: vec![],
        stats: SnoopStats {
            malformed: 1,
            ..responses(1)
        },
    });
    let mut r = Response::new("allowed.test", TYPE_A);
    let at = r.bytes.len();
    r.a(&ptr(at + 40), 300, Ipv4Addr::new(192, 0, 2, 71));
    out.push(Case {
        name: "a forward compression pointer",
        frame: from_53(&r.bytes),
        learned: vec![],
        stats: SnoopStats {
            malformed: 1,
            ..responses(1)
        },
    });

    // Over the key width: 3 labels of 50 bytes need 154 bytes.
    let long = ["a".repeat(50), "b".repeat(50), "c".repeat(50)].join(".");
    let mut r = Response::new(&long, TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 80));
    out.push(Case {
        name: "a question name over the key width",
        frame: from_53(&r.bytes),
        learned: vec![],
        // No policy can name it, so the question is not noted, and its
        // answer answers nothing asked.
        stats: SnoopStats {
            questions_noted: 0,
            questions_unreadable: 1,
            unsolicited: 1,
            ..responses(1)
        },
    });

    // Not from port 53: not a DNS response to the snooper.
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 90));
    out.push(Case {
        name: "a response from port 5353",
        frame: from_port(5353, &r.bytes),
        learned: vec![],
        stats: SnoopStats::default(),
    });
    // A query from port 53 (QR clear).
    out.push(Case {
        name: "a query from port 53",
        frame: from_53(&r.clone().query_bit_cleared().bytes),
        learned: vec![],
        stats: SnoopStats::default(),
    });
    // NXDOMAIN, and a response with no answer: nothing to learn.
    out.push(Case {
        name: "NXDOMAIN",
        frame: from_53(&Response::new("allowed.test", TYPE_A).rcode(3).bytes),
        learned: vec![],
        stats: responses(1),
    });
    // Two questions: not what a stub resolver sends.
    out.push(Case {
        name: "QDCOUNT 2",
        frame: from_53(&r.clone().qdcount(2).bytes),
        learned: vec![],
        stats: SnoopStats {
            unsupported: 1,
            ..responses(1)
        },
    });

    // Records of other types and classes are stepped over.
    let mut r = Response::new("allowed.test", TYPE_A);
    r.record(&ptr(QNAME_AT), TYPE_TXT, 1, 300, b"\x05hello");
    r.record(&ptr(QNAME_AT), TYPE_A, 3, 300, &[192, 0, 2, 99]);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 100));
    out.push(Case {
        name: "TXT and a CHAOS-class A are stepped over",
        frame: from_53(&r.bytes),
        learned: vec![("192.0.2.100", ALLOW, 1)],
        stats: SnoopStats {
            learned: 1,
            ..responses(1)
        },
    });

    // An A record with a 5-byte RDATA.
    let mut r = Response::new("allowed.test", TYPE_A);
    r.record(&ptr(QNAME_AT), TYPE_A, 1, 300, &[192, 0, 2, 1, 0]);
    out.push(Case {
        name: "an A record of the wrong length",
        frame: from_53(&r.bytes),
        learned: vec![],
        stats: SnoopStats {
            malformed: 1,
            ..responses(1)
        },
    });

    // More records than the walk reads.
    let mut r = Response::new("allowed.test", TYPE_A);
    for i in 0..20u8 {
        r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(198, 51, 100, i));
    }
    out.push(Case {
        name: "20 answers: the first 16 are learned",
        frame: from_53(&r.bytes),
        learned: (0..16)
            .map(|i| -> (&'static str, DomainVerdicts, u32) {
                (
                    Box::leak(format!("198.51.100.{i}").into_boxed_str()),
                    ALLOW,
                    1,
                )
            })
            .collect(),
        stats: SnoopStats {
            learned: 16,
            walk_limit: 1,
            ..responses(1)
        },
    });

    out
}

#[test]
fn crafted_responses_teach_exactly_what_they_should() {
    let mut failures = Vec::new();
    for case in cases() {
        let f = snooping(
            &[("allowed.test", ALLOW), ("denied.test", DENY)],
            domains_on(),
        );
        snoop(&f, &case.frame);
        let mut want: Vec<(u32, IpAddr, DomainVerdicts, u32)> = case
            .learned
            .iter()
            .map(|(a, v, n)| (SET, ip(a), *v, *n))
            .collect();
        want.sort();
        let got = learned(&f);
        let got_stats = stats(&f);
        if got != want || got_stats != case.stats {
            failures.push(format!(
                "{}:\n  learned {got:?}\n     want {want:?}\n  stats {got_stats:?}\n   want {:?}",
                case.name, case.stats
            ));
        } else {
            println!("ok: {} ({} learned)", case.name, got.len());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn ttls_are_clamped_to_the_documented_bounds() {
    for (ttl, lo, hi) in [
        (0, DNS_TTL_MIN - Duration::from_secs(1), DNS_TTL_MIN),
        (1, DNS_TTL_MIN - Duration::from_secs(1), DNS_TTL_MIN),
        (120, Duration::from_secs(119), Duration::from_secs(120)),
        (7 * 86400, DNS_TTL_MAX - Duration::from_secs(1), DNS_TTL_MAX),
    ] {
        let f = snooping(&[("allowed.test", ALLOW)], domains_on());
        let mut r = Response::new("allowed.test", TYPE_A);
        r.a(&ptr(QNAME_AT), ttl, Ipv4Addr::new(192, 0, 2, 1));
        snoop(&f, &from_53(&r.bytes));
        let l = only(&f.learned().unwrap());
        let left = l.remaining.expect("unexpired");
        assert!(
            lo < left && left <= hi,
            "TTL {ttl}: {left:?} left, expected in ({lo:?}, {hi:?}]"
        );
        println!("TTL {ttl}: counts for {left:?}");
    }
}

#[test]
fn a_cgroup_whose_set_names_no_domain_is_not_read() {
    // Mapped, but without the domains flag: one lookup, nothing else.
    let f = snooping(
        &[("allowed.test", ALLOW)],
        FilterFlags {
            domains: false,
            ..FilterFlags::default()
        },
    );
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 1));
    snoop(&f, &from_53(&r.bytes));
    assert_eq!(learned(&f), []);
    assert_eq!(stats(&f), SnoopStats::default());
    // And an unmapped cgroup neither.
    f.remove_cgroup(own_cgroup_id()).unwrap();
    f.set_filter(own_cgroup_id() + 1, SET, domains_on())
        .unwrap();
    snoop(&f, &from_53(&r.bytes));
    assert_eq!(stats(&f), SnoopStats::default());
}

#[test]
fn answers_of_both_sides_merge_and_deny_wins_at_the_filter() {
    // A set allowing everything by prefix: only a learned deny drops.
    let f = snooping(
        &[("allowed.test", ALLOW), ("denied.test", DENY)],
        domains_on(),
    );
    f.insert(SET, Verdict::Allow, "0.0.0.0/0".parse::<Prefix>().unwrap())
        .unwrap();
    let shared = Ipv4Addr::new(192, 0, 2, 5);
    for name in ["allowed.test", "denied.test"] {
        let mut r = Response::new(name, TYPE_A);
        r.a(&ptr(QNAME_AT), 300, shared);
        snoop(&f, &from_53(&r.bytes));
    }
    let both = DomainVerdicts {
        allow: true,
        deny: true,
        observe: false,
    };
    // The bits merge; the id is the latest answer's name.
    assert_eq!(learned(&f), [(SET, IpAddr::V4(shared), both, 2)]);
    assert_eq!(f.test_run(&syn_to(IpAddr::V4(shared))).unwrap(), DROP);
    assert_eq!(
        f.test_run(&syn_to(ip("192.0.2.6"))).unwrap(),
        PASS,
        "the /0 allow"
    );
    let s = f.read_stats().unwrap();
    // The two questions to the resolver passed by the /0 allow too.
    assert_eq!(
        (s.denied, s.allowed, s.learned_hits),
        (1, 1 + 2, 1),
        "{s:?}"
    );
}

#[test]
fn a_name_only_a_monitor_policy_gives_is_learned_and_changes_no_verdict() {
    // `watched.test` is on the observe side alone (a monitor policy names
    // it); `allowed.test` on the allow side, under a default deny.
    let observe = DomainVerdicts {
        observe: true,
        ..DomainVerdicts::default()
    };
    let dd = FilterFlags {
        default_deny: true,
        observe: true,
        domains: true,
    };
    let f = snooping(&[("watched.test", observe), ("allowed.test", ALLOW)], dd);
    let watched = Ipv4Addr::new(192, 0, 2, 40);
    let shared = Ipv4Addr::new(192, 0, 2, 41);
    let mut r = Response::new("watched.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, watched);
    r.a(&ptr(QNAME_AT), 300, shared);
    snoop(&f, &from_53(&r.bytes));
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, shared);
    snoop(&f, &from_53(&r.bytes));
    let both = DomainVerdicts {
        allow: true,
        observe: true,
        ..DomainVerdicts::default()
    };
    assert_eq!(
        learned(&f),
        [
            (SET, IpAddr::V4(watched), observe, 1),
            (SET, IpAddr::V4(shared), both, 2),
        ],
        "learned under the name, with the observe bit"
    );
    // The observed name's address is no allow: the default deny drops
    // it; what the allowed name also answered passes.
    assert_eq!(f.test_run(&syn_to(IpAddr::V4(watched))).unwrap(), DROP);
    assert_eq!(f.test_run(&syn_to(IpAddr::V4(shared))).unwrap(), PASS);
    let s = f.read_stats().unwrap();
    // The two questions to the resolver were default denied too (the
    // set allows no resolver; they were noted all the same).
    assert_eq!(
        (s.default_denied, s.allowed, s.learned_hits),
        (1 + 2, 1, 2),
        "{s:?}"
    );
}

#[test]
fn the_filter_honours_learned_addresses_until_they_expire() {
    let dd = FilterFlags {
        default_deny: true,
        observe: false,
        domains: true,
    };
    let f = snooping(&[("allowed.test", ALLOW)], dd);
    let v4 = ip("192.0.2.7");
    let v6 = ip("2001:db8::7");
    // Not learned yet: default denied.
    assert_eq!(f.test_run(&syn_to(v4)).unwrap(), DROP);
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 7));
    snoop(&f, &from_53(&r.bytes));
    let mut r = Response::new("allowed.test", TYPE_AAAA);
    r.aaaa(&ptr(QNAME_AT), 300, "2001:db8::7".parse().unwrap());
    snoop(&f, &from_53_v6(&r.bytes));
    assert_eq!(f.test_run(&syn_to(v4)).unwrap(), PASS);
    assert_eq!(f.test_run(&syn_to(v6)).unwrap(), PASS);
    assert_eq!(
        f.test_run(&syn_to(ip("192.0.2.8"))).unwrap(),
        DROP,
        "an address no answer gave"
    );

    // Expired (written so by hand: a real TTL is at least 5 s): ignored.
    f.insert_learned(SET, v4, ALLOW, 1, Duration::ZERO).unwrap();
    assert_eq!(f.test_run(&syn_to(v4)).unwrap(), DROP);
    let s = f.read_stats().unwrap();
    assert_eq!(s.learned_hits, 2, "{s:?}");
    assert_eq!(s.learned_expired, 1, "{s:?}");
    assert_eq!(s.allowed, 2, "{s:?}");
    // Three connects and the two questions.
    assert_eq!(s.default_denied, 3 + 2, "{s:?}");

    // Without the domains flag the filter does not look.
    f.set_filter(
        own_cgroup_id(),
        SET,
        FilterFlags {
            domains: false,
            ..dd
        },
    )
    .unwrap();
    assert_eq!(f.test_run(&syn_to(v6)).unwrap(), DROP);

    // Another set does not see this set's addresses.
    f.set_filter(own_cgroup_id(), SET + 1, dd).unwrap();
    assert_eq!(f.test_run(&syn_to(v6)).unwrap(), DROP);
}

#[test]
fn forgetting_takes_a_set_or_one_name() {
    let f = snooping(
        &[("allowed.test", ALLOW), ("other.test", ALLOW)],
        domains_on(),
    );
    for (name, last) in [("allowed.test", 1u8), ("other.test", 2)] {
        let mut r = Response::new(name, TYPE_A);
        r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, last));
        snoop(&f, &from_53(&r.bytes));
    }
    f.insert_learned(SET + 1, ip("192.0.2.9"), ALLOW, 1, Duration::from_secs(60))
        .unwrap();
    assert_eq!(f.learned().unwrap().len(), 3);
    assert_eq!(f.forget_learned(SET, Some(2)).unwrap(), 1);
    assert_eq!(
        learned(&f),
        [
            (SET, ip("192.0.2.1"), ALLOW, 1),
            (SET + 1, ip("192.0.2.9"), ALLOW, 1)
        ]
    );
    assert_eq!(f.forget_learned(SET, None).unwrap(), 1);
    assert_eq!(learned(&f), [(SET + 1, ip("192.0.2.9"), ALLOW, 1)]);
}

#[test]
fn a_name_removed_from_the_set_teaches_nothing_more() {
    let f = snooping(&[("allowed.test", ALLOW)], domains_on());
    assert!(f.remove_domain(SET, &d("allowed.test")).unwrap());
    let mut r = Response::new("allowed.test", TYPE_A);
    r.a(&ptr(QNAME_AT), 300, Ipv4Addr::new(192, 0, 2, 1));
    snoop(&f, &from_53(&r.bytes));
    assert_eq!(learned(&f), []);
    assert_eq!(stats(&f).unnamed, 1);
}

// ---- issue 37, finding 1: forged answers ----------------------------------------

/// An answer to `name` (id `id`) giving `addr`.
fn answer(id: u16, name: &str, addr: Ipv4Addr) -> Vec<u8> {
    let mut r = Response::new(name, TYPE_A);
    r.bytes[..2].copy_from_slice(&id.to_be_bytes());
    r.a(&ptr(QNAME_AT), 300, addr);
    r.bytes
}

#[test]
fn only_answers_to_the_cgroups_own_questions_to_declared_resolvers_teach() {
    const ID: u16 = 0x4b1d;
    const PORT: u16 = 41000;
    let evil = Ipv4Addr::new(203, 0, 113, 66);
    let ask = |f: &EgressFilter, to: Ipv4Addr, name: &str| {
        f.test_run(&question_to(to, PORT, &dnsmsg::query(ID, name, TYPE_A)))
            .unwrap();
    };
    struct Forgery {
        name: &'static str,
        run: Box<dyn Fn(&EgressFilter)>,
        stats: SnoopStats,
    }
    let noted = |n: u64| SnoopStats {
        questions_noted: n,
        ..SnoopStats::default()
    };
    let forgeries = vec![
        Forgery {
            name: "an unsolicited answer (nothing asked)",
            run: Box::new(move |f| {
                answer_unasked(
                    f,
                    &answer_from(RESOLVER, PORT, &answer(ID, "allowed.test", evil)),
                )
            }),
            stats: SnoopStats {
                responses: 1,
                unsolicited: 1,
                ..SnoopStats::default()
            },
        },
        Forgery {
            name: "an answer from another address than the resolver asked",
            run: Box::new(move |f| {
                ask(f, RESOLVER, "allowed.test");
                let other = Ipv4Addr::new(10, 96, 0, 11);
                answer_unasked(
                    f,
                    &answer_from(other, PORT, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                untrusted_source: 1,
                ..noted(1)
            },
        },
        Forgery {
            name: "an answer from loopback (the pod answering itself)",
            run: Box::new(move |f| {
                ask(f, RESOLVER, "allowed.test");
                answer_unasked(
                    f,
                    &answer_from(Ipv4Addr::LOCALHOST, PORT, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                untrusted_source: 1,
                ..noted(1)
            },
        },
        Forgery {
            name: "a question to an undeclared resolver, and its answer",
            run: Box::new(move |f| {
                let undeclared = Ipv4Addr::new(198, 51, 100, 53);
                ask(f, undeclared, "allowed.test");
                answer_unasked(
                    f,
                    &answer_from(undeclared, PORT, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                untrusted_source: 1,
                questions_undeclared: 1,
                ..SnoopStats::default()
            },
        },
        Forgery {
            name: "a wrong transaction id",
            run: Box::new(move |f| {
                ask(f, RESOLVER, "allowed.test");
                answer_unasked(
                    f,
                    &answer_from(RESOLVER, PORT, &answer(ID ^ 1, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                unsolicited: 1,
                ..noted(1)
            },
        },
        Forgery {
            name: "a wrong port",
            run: Box::new(move |f| {
                ask(f, RESOLVER, "allowed.test");
                answer_unasked(
                    f,
                    &answer_from(RESOLVER, PORT + 1, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                unsolicited: 1,
                ..noted(1)
            },
        },
        Forgery {
            name: "the right id and port, another question",
            run: Box::new(move |f| {
                ask(f, RESOLVER, "elsewhere.test");
                answer_unasked(
                    f,
                    &answer_from(RESOLVER, PORT, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                question_mismatch: 1,
                ..noted(1)
            },
        },
        Forgery {
            name: "the right question, another type",
            run: Box::new(move |f| {
                f.test_run(&question_to(
                    RESOLVER,
                    PORT,
                    &dnsmsg::query(ID, "allowed.test", TYPE_TXT),
                ))
                .unwrap();
                answer_unasked(
                    f,
                    &answer_from(RESOLVER, PORT, &answer(ID, "allowed.test", evil)),
                );
            }),
            stats: SnoopStats {
                responses: 1,
                question_mismatch: 1,
                ..noted(1)
            },
        },
    ];
    let mut failures = Vec::new();
    for forgery in &forgeries {
        let f = snooping(&[("allowed.test", ALLOW)], domains_on());
        (forgery.run)(&f);
        let (got, got_stats) = (learned(&f), stats(&f));
        if !got.is_empty() || got_stats != forgery.stats {
            failures.push(format!(
                "{}: learned {got:?}\n  stats {got_stats:?}\n   want {:?}",
                forgery.name, forgery.stats
            ));
        } else {
            println!("refused: {} ({} learned)", forgery.name, got.len());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_question_is_answered_once_and_a_forgery_leaves_it_pending() {
    const ID: u16 = 0x1234;
    const PORT: u16 = 41000;
    let f = snooping(&[("allowed.test", ALLOW)], domains_on());
    let first = Ipv4Addr::new(192, 0, 2, 91);
    let again = Ipv4Addr::new(192, 0, 2, 92);
    f.test_run(&question_to(
        RESOLVER,
        PORT,
        &dnsmsg::query(ID, "allowed.test", TYPE_A),
    ))
    .unwrap();
    // A forgery with the right id for another name first: refused, and
    // the question stays pending for its real answer.
    answer_unasked(
        &f,
        &answer_from(RESOLVER, PORT, &answer(ID, "other.test", again)),
    );
    answer_unasked(
        &f,
        &answer_from(RESOLVER, PORT, &answer(ID, "allowed.test", first)),
    );
    // The question was consumed: a second answer teaches nothing.
    answer_unasked(
        &f,
        &answer_from(RESOLVER, PORT, &answer(ID, "allowed.test", again)),
    );
    assert_eq!(learned(&f), [(SET, IpAddr::V4(first), ALLOW, 1)]);
    let s = stats(&f);
    assert_eq!(
        (s.learned, s.question_mismatch, s.unsolicited),
        (1, 1, 1),
        "{s:?}"
    );
}

#[test]
fn a_cgroup_notes_a_bounded_number_of_questions_a_second() {
    let f = snooping(&[("allowed.test", ALLOW)], domains_on());
    let question = question_to(RESOLVER, 41000, &dnsmsg::query(7, "allowed.test", TYPE_A));
    let sent = 4 * kyverno_runtime_bpf::egress::DNS_QUESTIONS_PER_S;
    let run = f
        .test_run_repeat(&question, u32::try_from(sent).unwrap())
        .unwrap();
    let s = stats(&f);
    let took = run.per_run * u32::try_from(sent).unwrap();
    println!(
        "{sent} questions in {took:?}: {} noted, {} over the budget",
        s.questions_noted, s.questions_over_budget
    );
    assert_eq!(s.questions_noted + s.questions_over_budget, sent, "{s:?}");
    // Each second of the run may note one budget's worth.
    let seconds = took.as_secs() + 1;
    assert!(
        s.questions_noted <= seconds * kyverno_runtime_bpf::egress::DNS_QUESTIONS_PER_S,
        "{s:?}"
    );
    assert!(s.questions_over_budget > 0, "{s:?}");
}
