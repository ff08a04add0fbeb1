//! ns per packet of the cgroup_skb programs, via `BPF_PROG_TEST_RUN`
//! (needs root): the egress filter with 10, 1,000 and 100,000 entries
//! (IPv4 /32 and IPv6 /128 host entries, IPv6 /64 prefixes; and a set of
//! host entries only, which walks no trie), a socket's later packets (its
//! cached verdict) and, at 100,000, its first (the full path, by single
//! runs), the filter of a set naming domains (a learned address,
//! and one nothing taught), the DNS answer snooper (a datagram of a set
//! naming no domain, an answer to no question, and a question noted by the
//! filter then its answer learned from), the protocol
//! classifier on a first segment and on a cached flow, and an empty
//! cgroup_skb program as the floor, all measured in one run and printed
//! with their ratio to the floor. Then real UDP traffic over loopback from
//! three cgroups side by side (no program, the empty program, the filter
//! with 100,000 entries): per datagram on one socket and per new socket,
//! what an application in a selected pod pays.
//!
//! Run with `cargo bench -p kyverno-runtime-bpf --features host-tests
//! --bench cgroup_skb`. Nothing is asserted about the figures: they vary
//! with the machine, and a timed assertion would be a flaky test.

// A benchmark program: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/cgroup.rs"]
mod cgroup;
#[path = "cgroup_skb/table.rs"]
mod table;
#[path = "../tests/common/tlsmsg.rs"]
mod tlsmsg;

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use cgroup::{own_cgroup_dir, own_cgroup_id, TempCgroup};
use kyverno_runtime_bpf::egress::{
    Domain, DomainVerdicts, EgressFilter, FilterFlags, FloorProgram, Prefix, Verdict,
};
use kyverno_runtime_bpf::protocol::{
    ProtoFlags, ProtoKey, Protocol, ProtocolClassifier, Verdict as ProtoVerdict,
};

/// Runs per measurement with the kernel's repeat count.
const REPEAT: u32 = 200_000;
/// Single-run measurements for the first-segment case (a fresh flow each).
const FRESH_FLOWS: u16 = 20_000;
/// Single-run measurements of a socket's first packet (a new socket each).
const FIRST_PACKETS: u32 = 20_000;
/// Each measurement is taken this many times; the median is printed.
const ROUNDS: usize = 5;
/// Questions asked and answered by single runs (under the per-second
/// budget of questions a cgroup may note).
const ANSWERED: u32 = 400;

const SET: u32 = 1;

/// The benchmarked set's flags: a default deny (the allow list is what
/// the entries fill), observing nothing a packet passes.
const DEFAULT_DENY: FilterFlags = FilterFlags {
    default_deny: true,
    observe: false,
    domains: false,
};

// ---- frames -------------------------------------------------------------------

fn ethernet(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn ipv4(dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + l4.len()).unwrap();
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&[10, 0, 0, 1]);
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(l4);
    ethernet(0x0800, &h)
}

fn ipv6(dst: Ipv6Addr, next: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(l4);
    ethernet(0x86dd, &h)
}

fn udp(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0x30, 0x39, 0x01, 0xbb];
    u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

fn tcp(sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = sport.to_be_bytes().to_vec();
    t.extend_from_slice(&443u16.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    t.extend_from_slice(payload);
    t
}

// ---- entries ------------------------------------------------------------------

/// The `i`th of `n` distinct IPv4 host prefixes (a bijection of `u32`
/// spreads them over the address space, so the trie is not one chain).
fn v4_entry(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(i.wrapping_mul(0x9e37_79b1) ^ 0x0a00_0000)
}

/// The `i`th distinct IPv6 /64 (or the /128 of its first address).
fn v6_entry(i: u32) -> Ipv6Addr {
    let x = i.wrapping_mul(0x9e37_79b1);
    Ipv6Addr::new(
        0x2001,
        0x0db8,
        u16::try_from(x >> 16).unwrap(),
        u16::try_from(x & 0xffff).unwrap(),
        0,
        0,
        0,
        0,
    )
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Row {
    name: String,
    per_packet: Duration,
}

fn main() {
    let cgroup = own_cgroup_id();
    let mut rows = Vec::new();
    // The floor by single runs, interleaved with every single-run case.
    let mut single_floor = Vec::new();
    let probe4 = ipv4(Ipv4Addr::new(192, 0, 2, 1), 17, &udp(b"bench"));

    // The floor, with the same frame as the IPv4 egress case.
    let floor = FloorProgram::load().unwrap();
    let floor_ns = median(
        (0..ROUNDS)
            .map(|_| floor.test_run_repeat(&probe4, REPEAT).unwrap().per_run)
            .collect(),
    );
    rows.push(Row {
        name: "floor: empty cgroup_skb program".into(),
        per_packet: floor_ns,
    });

    // The egress filter: N entries in the allow list of the set (host
    // entries, or /64 prefixes), a default deny and one deny prefix (so
    // the deny trie is walked too); the probe hits one allowed entry
    // (deny miss, allow hit) and one address nothing allows (both misses,
    // default deny). Last, a set of host entries only: no trie at all.
    #[derive(Clone, Copy, PartialEq)]
    enum Entries {
        V4Hosts,
        V6Hosts,
        V6Nets,
    }
    let cases = [10u32, 1_000, 100_000]
        .into_iter()
        .flat_map(|n| [Entries::V4Hosts, Entries::V6Hosts, Entries::V6Nets].map(|e| (n, e, true)))
        .chain([(100_000, Entries::V4Hosts, false)]);
    for (n, entries, deny_prefix) in cases {
        let v6 = entries != Entries::V4Hosts;
        let filter = EgressFilter::load().unwrap();
        for i in 0..n {
            let prefix = match entries {
                Entries::V4Hosts => Prefix::host(v4_entry(i).into()),
                Entries::V6Hosts => Prefix::host(v6_entry(i).into()),
                Entries::V6Nets => Prefix::new(v6_entry(i).into(), 64).unwrap(),
            };
            filter.insert(SET, Verdict::Allow, prefix).unwrap();
        }
        if deny_prefix {
            let deny: Prefix = if v6 {
                "fd00:dead::/32"
            } else {
                "198.51.100.0/24"
            }
            .parse()
            .unwrap();
            filter.insert(SET, Verdict::Deny, deny).unwrap();
        }
        filter.set_filter(cgroup, SET, DEFAULT_DENY).unwrap();
        let hit = match entries {
            Entries::V4Hosts => ipv4(v4_entry(n / 2), 17, &udp(b"bench")),
            Entries::V6Hosts => ipv6(v6_entry(n / 2), 17, &udp(b"bench")),
            Entries::V6Nets => ipv6(
                Ipv6Addr::from(u128::from(v6_entry(n / 2)) | 0x1234),
                17,
                &udp(b"bench"),
            ),
        };
        let miss = if v6 {
            ipv6(
                Ipv6Addr::new(0x2001, 0xdb9, 0, 0, 0, 0, 0, 1),
                17,
                &udp(b"bench"),
            )
        } else {
            ipv4(Ipv4Addr::new(203, 0, 113, 1), 17, &udp(b"bench"))
        };
        let family = match entries {
            Entries::V4Hosts => "IPv4 /32",
            Entries::V6Hosts => "IPv6 /128",
            Entries::V6Nets => "IPv6 /64",
        };
        let what = if deny_prefix { "entries" } else { "hosts only" };
        for (case, frame, want) in [("allowed", &hit, 1), ("default-denied", &miss, 0)] {
            let before = filter.read_stats().unwrap();
            let runs: Vec<Duration> = (0..ROUNDS)
                .map(|_| {
                    let r = filter.test_run_repeat(frame, REPEAT).unwrap();
                    assert_eq!(r.verdict, want, "{family} {n} {what} {case}");
                    r.per_run
                })
                .collect();
            // Each test run is one socket: its first packet decides
            // (and caches), the rest repeat the cached verdict. The
            // figure is of that path.
            let cached = filter.read_stats().unwrap().cached - before.cached;
            assert_eq!(cached, u64::from(REPEAT - 1) * ROUNDS as u64);
            rows.push(Row {
                name: format!("egress {family:<9} {n:>6} {what}, {case}"),
                per_packet: median(runs),
            });
        }
        if n == 100_000 && deny_prefix {
            // A socket's first packet (the full path; nothing cached
            // yet): one test run each, a new socket each time.
            let mut first = Vec::new();
            for _ in 0..FIRST_PACKETS {
                let r = filter.test_run_repeat(&hit, 1).unwrap();
                assert_eq!(r.verdict, 1);
                first.push(r.per_run);
                single_floor.push(floor.test_run_repeat(&hit, 1).unwrap().per_run);
            }
            rows.push(Row {
                name: format!("egress {family:<9} {n:>6} {what}, allowed, 1st packet, single runs"),
                per_packet: mean(&first),
            });
        }
        filter.remove_cgroup(cgroup).unwrap();
    }

    // Domains: a set of 10 prefixes naming one domain under default deny;
    // the probe's address learned (a learned hit), and one nothing taught
    // (a learned miss, then the tries). Then the snooper on the answer
    // that teaches it (one A record, its owner compressed), for a set
    // naming domains, and for one naming none (the gate only).
    {
        let filter = EgressFilter::load().unwrap();
        for i in 0..10 {
            filter
                .insert(SET, Verdict::Allow, Prefix::host(v4_entry(i).into()))
                .unwrap();
        }
        let allow = DomainVerdicts {
            allow: true,
            deny: false,
            observe: false,
        };
        filter
            .set_domain(SET, &Domain::new("bench.test").unwrap(), allow, 1)
            .unwrap();
        let flags = FilterFlags {
            default_deny: true,
            observe: false,
            domains: true,
        };
        filter.set_filter(cgroup, SET, flags).unwrap();
        let learned = Ipv4Addr::new(192, 0, 2, 99);
        filter
            .insert_learned(SET, learned.into(), allow, 1, Duration::from_secs(3600))
            .unwrap();
        for (case, frame, want) in [
            ("learned address", ipv4(learned, 17, &udp(b"bench")), 1),
            (
                "address nothing taught",
                ipv4(Ipv4Addr::new(203, 0, 113, 1), 17, &udp(b"bench")),
                0,
            ),
        ] {
            let runs: Vec<Duration> = (0..ROUNDS)
                .map(|_| {
                    let r = filter.test_run_repeat(&frame, REPEAT).unwrap();
                    assert_eq!(r.verdict, want, "{case}");
                    r.per_run
                })
                .collect();
            rows.push(Row {
                name: format!("egress IPv4, set naming a domain, {case}"),
                per_packet: median(runs),
            });
        }
        // A DNS answer from port 53: header, question, one A record; from
        // 10.0.0.1 (declared) to port 40000, answering the question the
        // pod (10.0.0.1 too, as `ipv4` writes) asked it from there.
        filter
            .set_dns_resolvers(&[Ipv4Addr::new(10, 0, 0, 1).into()])
            .unwrap();
        let section = b"\x05bench\x04test\x00\x00\x01\x00\x01";
        let mut dns = vec![0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
        dns.extend_from_slice(section);
        dns.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0x0e, 0x10, 0, 4]);
        dns.extend_from_slice(&learned.octets());
        let datagram = |sport: u16, dport: u16, payload: &[u8]| {
            let mut u = sport.to_be_bytes().to_vec();
            u.extend_from_slice(&dport.to_be_bytes());
            u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
            u.extend_from_slice(&[0, 0]);
            u.extend_from_slice(payload);
            u
        };
        let answer = ipv4(Ipv4Addr::new(10, 0, 0, 1), 17, &datagram(53, 40_000, &dns));
        let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        query.extend_from_slice(section);
        let question = ipv4(
            Ipv4Addr::new(10, 0, 0, 1),
            17,
            &datagram(40_000, 53, &query),
        );
        for (case, flags) in [
            (
                "answer of a set naming no domain (the gate)",
                FilterFlags::default(),
            ),
            ("answer refused (no question asked)", flags),
        ] {
            filter.set_filter(cgroup, SET, flags).unwrap();
            let runs: Vec<Duration> = (0..ROUNDS)
                .map(|_| {
                    filter
                        .test_run_snoop_repeat(&answer, REPEAT)
                        .unwrap()
                        .per_run
                })
                .collect();
            rows.push(Row {
                name: format!("snooper: {case}"),
                per_packet: median(runs),
            });
        }
        // A question is answered once, and a pod notes a bounded number a
        // second: the pair is measured by single runs, one question then
        // its answer, within one second's budget.
        let (mut asked, mut answered) = (Vec::new(), Vec::new());
        for _ in 0..ANSWERED {
            asked.push(filter.test_run_repeat(&question, 1).unwrap().per_run);
            answered.push(filter.test_run_snoop_repeat(&answer, 1).unwrap().per_run);
            single_floor.push(floor.test_run_repeat(&question, 1).unwrap().per_run);
        }
        let snoop = filter.read_snoop_stats().unwrap();
        assert_eq!(snoop.learned, u64::from(ANSWERED), "{snoop:?}");
        assert_eq!(snoop.questions_noted, u64::from(ANSWERED), "{snoop:?}");
        rows.push(Row {
            name: "egress: a DNS question noted, single runs".to_owned(),
            per_packet: mean(&asked),
        });
        rows.push(Row {
            name: "snooper: its answer matched, learned (1 A record), single runs".to_owned(),
            per_packet: mean(&answered),
        });
        filter.remove_cgroup(cgroup).unwrap();
    }

    // The classifier: a TLS ClientHello on a fresh flow (classified; one
    // run per source port, since the second run of a flow is cached), and
    // on a flow whose verdict is cached.
    let classifier = ProtocolClassifier::load().unwrap();
    classifier
        .insert(SET, ProtoVerdict::Deny, ProtoKey::any(Protocol::Ssh))
        .unwrap();
    classifier
        .set_filter(cgroup, SET, ProtoFlags::default())
        .unwrap();
    let hello = tlsmsg::client_hello(&[b"h2"]);
    let dst = Ipv4Addr::new(192, 0, 2, 10);
    let mut fresh = Vec::new();
    for sport in 1_000..1_000 + FRESH_FLOWS {
        let frame = ipv4(dst, 6, &tcp(sport, &hello));
        let r = classifier.test_run_repeat(&frame, 1).unwrap();
        assert_eq!(r.verdict, 1);
        fresh.push(r.per_run);
        // The floor the same way (one run per call), for a like-for-like
        // ratio: a single run carries the harness's fixed cost.
        single_floor.push(floor.test_run_repeat(&frame, 1).unwrap().per_run);
    }
    let stats = classifier.read_stats().unwrap();
    assert_eq!(stats.tls, u64::from(FRESH_FLOWS), "{stats:?}");
    rows.push(Row {
        name: "floor: empty program, single runs".into(),
        per_packet: mean(&single_floor),
    });
    rows.push(Row {
        name: "classifier: first segment (TLS ClientHello), single runs".into(),
        per_packet: mean(&fresh),
    });
    let cached = ipv4(dst, 6, &tcp(999, &hello));
    classifier.test_run(&cached).unwrap();
    let runs: Vec<Duration> = (0..ROUNDS)
        .map(|_| classifier.test_run_repeat(&cached, REPEAT).unwrap().per_run)
        .collect();
    rows.push(Row {
        name: "classifier: cached flow".into(),
        per_packet: median(runs),
    });
    classifier.remove_cgroup(cgroup).unwrap();

    println!(
        "BPF_PROG_TEST_RUN, repeat {REPEAT} (median of {ROUNDS}; a socket per run, so all but its first packet take the cached verdict); 1st packets: mean of {FIRST_PACKETS} single runs, first segments of {FRESH_FLOWS}"
    );
    println!("{:<72} {:>10} {:>9}", "case", "ns/packet", "x floor");
    let single_floor = mean(&single_floor);
    for r in &rows {
        // Single-run rows compare with the single-run floor.
        let base = if r.name.contains("single runs") {
            single_floor
        } else {
            floor_ns
        };
        let ratio = r.per_packet.as_secs_f64() / base.as_secs_f64().max(1e-9);
        println!(
            "{:<72} {:>10} {:>9.2}",
            r.name,
            r.per_packet.as_nanos(),
            ratio
        );
    }

    // Issue 27's table: per socket, beside the reference.
    let reference_dir = std::env::var_os("KRT_REFERENCE_DIR").map(std::path::PathBuf::from);
    let mut table_rows = table::egress_rows(&floor, reference_dir.as_deref());
    table_rows.extend(table::classifier_rows(&floor));
    table::print(&table_rows, reference_dir.is_some());

    real_traffic(&floor);
}

// ---- real traffic ----------------------------------------------------------------

/// Datagrams per measurement on one connected socket.
const SENDS: u32 = 50_000;
/// New sockets (one datagram each) per measurement.
const ONE_SHOT_SOCKETS: u32 = 5_000;
/// Rounds of the real-traffic measurements (each config once per round,
/// interleaved, so a noisy moment spreads over all three).
const TRAFFIC_ROUNDS: usize = 7;

/// Moves this (single-threaded) process into cgroup `dir`: the sockets it
/// creates from then on belong to that cgroup.
fn join(dir: &Path) {
    fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .unwrap_or_else(|e| panic!("join {}: {e}", dir.display()));
}

/// ns per datagram sent on one connected UDP socket (its first datagram
/// untimed, and it caches the verdict the rest repeat).
fn time_sends(to: SocketAddr) -> Duration {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.connect(to).unwrap();
    let payload = [0x5au8; 32];
    s.send(&payload).unwrap();
    let start = Instant::now();
    for _ in 0..SENDS {
        s.send(&payload).unwrap();
    }
    start.elapsed() / SENDS
}

/// ns per new socket that sends one datagram (socket, bind, sendto,
/// close): what a one-shot client (a DNS lookup) pays.
fn time_one_shot(to: SocketAddr) -> Duration {
    let payload = [0x5au8; 32];
    let start = Instant::now();
    for _ in 0..ONE_SHOT_SOCKETS {
        let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        s.send_to(&payload, to).unwrap();
    }
    start.elapsed() / ONE_SHOT_SOCKETS
}

/// Real UDP traffic over loopback from three cgroups side by side: none
/// with a program, one with the empty program, one with the egress filter
/// holding 100,000 entries under default deny (the destination allowed):
/// what an application in a selected pod pays, per datagram and per new
/// socket, against the same sends without the filter.
fn real_traffic(floor: &FloorProgram) {
    let home = own_cgroup_dir();
    let filter = EgressFilter::load().unwrap();
    for i in 0..100_000 {
        filter
            .insert(SET, Verdict::Allow, Prefix::host(v4_entry(i).into()))
            .unwrap();
    }
    filter
        .insert(
            SET,
            Verdict::Allow,
            Prefix::host(Ipv4Addr::LOCALHOST.into()),
        )
        .unwrap();
    filter
        .insert(SET, Verdict::Deny, "198.51.100.0/24".parse().unwrap())
        .unwrap();
    let none = TempCgroup::new("bench-none");
    let empty = TempCgroup::new("bench-floor");
    let filtered = TempCgroup::new("bench-filter");
    let _floor_link = floor.attach(&empty.0).unwrap();
    let filter_link = filter
        .attach_cgroup(&filtered.0, SET, DEFAULT_DENY)
        .unwrap();
    // Never read: once its buffer is full the kernel drops what arrives,
    // the same work whichever cgroup sent it.
    let sink = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = sink.local_addr().unwrap();

    let configs = [&none.0, &empty.0, &filtered.0];
    let mut sends: [Vec<Duration>; 3] = Default::default();
    let mut one_shot: [Vec<Duration>; 3] = Default::default();
    let before = filter.read_stats().unwrap();
    for _ in 0..TRAFFIC_ROUNDS {
        for (i, dir) in configs.iter().enumerate() {
            join(dir);
            sends[i].push(time_sends(to));
            one_shot[i].push(time_one_shot(to));
        }
    }
    join(&home);
    let after = filter.read_stats().unwrap();
    // Every datagram of the filtered cgroup passed (a drop fails the send),
    // all but the first of each connected socket took the cached verdict
    // (but the first on each CPU the process moved to: the cache is per
    // CPU), and no one-shot socket found one.
    let rounds = TRAFFIC_ROUNDS as u64;
    assert_eq!(
        after.allowed - before.allowed,
        rounds * u64::from(SENDS + 1 + ONE_SHOT_SOCKETS)
    );
    let cached = after.cached - before.cached;
    assert!(
        cached <= rounds * u64::from(SENDS) && cached >= rounds * u64::from(SENDS) * 9 / 10,
        "{cached} cached of {} connected sends",
        rounds * u64::from(SENDS + 1)
    );
    assert!(filter.detach_cgroup(filter_link).unwrap());

    println!();
    println!(
        "real UDP traffic over loopback, 32-byte datagrams, median of {TRAFFIC_ROUNDS} interleaved rounds; the filter holds 100,000 entries under default deny"
    );
    println!(
        "{:<44} {:>11} {:>11} {:>11} {:>13} {:>12}",
        "case", "no program", "empty prog", "filter", "filter/empty", "filter/none"
    );
    for (case, times) in [
        (format!("datagram on a connected socket ({SENDS})"), sends),
        (
            format!("new socket per datagram ({ONE_SHOT_SOCKETS})"),
            one_shot,
        ),
    ] {
        let [n, e, f] = times.map(median);
        println!(
            "{:<44} {:>8} ns {:>8} ns {:>8} ns {:>13.3} {:>12.3}",
            case,
            n.as_nanos(),
            e.as_nanos(),
            f.as_nanos(),
            f.as_secs_f64() / e.as_secs_f64().max(1e-9),
            f.as_secs_f64() / n.as_secs_f64().max(1e-9),
        );
    }
}
