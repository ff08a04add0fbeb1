//! Each filter set's share of the learned-address map (issue 37, finding
//! 5: one pod's DNS answers must not push out what another's taught), on
//! the host kernel with BPF_PROG_TEST_RUN (tier 2: needs root).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! dnssnoop_share`. The test skb's socket is charged to this process's
//! cgroup, so each step maps that cgroup to the set whose pod is asking
//! (as the agent maps a container's). Every answer answers a question the
//! pod asked a declared resolver first, as the snooper requires.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;
#[path = "common/dnsmsg.rs"]
mod dnsmsg;
#[path = "common/frames.rs"]
mod frames;
#[path = "common/snoop.rs"]
mod snoop;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cgroup::own_cgroup_id;
use dnsmsg::{ptr, Response, QNAME_AT, TYPE_A};
use kyverno_runtime_bpf::egress::{
    DomainVerdicts, EgressFilter, FilterFlags, LearnedUse, LEARNED_MAX,
};
use snoop::{answer_from, d, question_to, ALLOW, DENY, RESOLVER};

const PASS: u32 = 1;
const DROP: u32 = 0;
/// The flooding pod's set and its neighbour's.
const FLOODER: u32 = 7;
const NEIGHBOUR: u32 = 8;
const PORT: u16 = 41000;

/// Name ids: `wild.test` (allowed), `denied.test`.
const WILD: u32 = 1;
const DENIED: u32 = 2;
/// `watched.test`, named by a monitor policy only.
const WATCHED: u32 = 3;
const OBSERVE: DomainVerdicts = DomainVerdicts {
    allow: false,
    deny: false,
    observe: true,
};

/// A filter with both sets naming `wild.test` (allow) and `denied.test`
/// (deny), the tests' resolver declared, every set's share capped at `cap`.
fn filter(cap: u64) -> EgressFilter {
    let f = EgressFilter::load().unwrap();
    if let Some(e) = f.snoop_error() {
        panic!("the snooper did not load: {e}");
    }
    for set in [FLOODER, NEIGHBOUR] {
        f.set_domain(set, &d("wild.test"), ALLOW, WILD).unwrap();
        f.set_domain(set, &d("denied.test"), DENY, DENIED).unwrap();
        f.set_domain(set, &d("watched.test"), OBSERVE, WATCHED)
            .unwrap();
    }
    f.set_dns_resolvers(&[IpAddr::V4(RESOLVER)]).unwrap();
    f.cap_learned_share(cap).unwrap();
    f
}

/// This process's cgroup (the test skb's) now belongs to `set`'s pod.
fn as_pod_of(f: &EgressFilter, set: u32) {
    let flags = FilterFlags {
        default_deny: false,
        observe: false,
        domains: true,
    };
    f.set_filter(own_cgroup_id(), set, flags).unwrap();
}

/// The pod asks the resolver for `name` (transaction id `id`), and the
/// resolver answers with `addrs`: the snooper's verdict on the answer.
fn ask_and_answer(f: &EgressFilter, id: u16, name: &str, addrs: &[Ipv4Addr]) -> u32 {
    f.test_run(&question_to(
        RESOLVER,
        PORT,
        &dnsmsg::query(id, name, TYPE_A),
    ))
    .unwrap();
    let mut r = Response::new(name, TYPE_A);
    r.bytes[..2].copy_from_slice(&id.to_be_bytes());
    for a in addrs {
        r.a(&ptr(QNAME_AT), 300, *a);
    }
    f.test_run_snoop(&answer_from(RESOLVER, PORT, &r.bytes))
        .unwrap()
}

/// `n` addresses 198.18.`block`.0, .1, ...
fn block(block: u8, n: u8) -> Vec<Ipv4Addr> {
    (0..n).map(|i| Ipv4Addr::new(198, 18, block, i)).collect()
}

/// What set `set` learned: (address, name id, denied).
fn learned_by(f: &EgressFilter, set: u32) -> BTreeSet<(IpAddr, u32, bool)> {
    f.learned()
        .unwrap()
        .into_iter()
        .filter(|l| l.set_id == set)
        .map(|l| (l.addr, l.name_id, l.verdicts.deny))
        .collect()
}

fn use_of(f: &EgressFilter, set: u32) -> LearnedUse {
    f.learned_use()
        .unwrap()
        .into_iter()
        .find(|u| u.set_id == set)
        .unwrap_or_default()
}

#[test]
fn a_set_at_its_share_learns_nothing_more_and_displaces_no_neighbour() {
    const SHARE: u64 = 40;
    let f = filter(SHARE);

    // The neighbour's pod learns ten addresses.
    as_pod_of(&f, NEIGHBOUR);
    assert_eq!(ask_and_answer(&f, 1, "wild.test", &block(1, 10)), PASS);
    let neighbours = learned_by(&f, NEIGHBOUR);
    assert_eq!(neighbours.len(), 10);

    // The flooding pod's answers carry 48 addresses: 40 fit its share, 8
    // are refused and counted; the neighbour's ten are all still there.
    as_pod_of(&f, FLOODER);
    for (i, b) in [2u8, 3, 4].into_iter().enumerate() {
        let id = 10 + u16::try_from(i).unwrap();
        assert_eq!(ask_and_answer(&f, id, "wild.test", &block(b, 16)), PASS);
    }
    assert_eq!(learned_by(&f, FLOODER).len(), 40);
    let stats = f.read_snoop_stats().unwrap();
    assert_eq!((stats.learned, stats.over_share), (50, 8), "{stats:?}");
    assert_eq!(
        use_of(&f, FLOODER),
        LearnedUse {
            set_id: FLOODER,
            held: 40,
            over_share: 8,
            answers_refused: 0,
        }
    );
    assert_eq!(learned_by(&f, NEIGHBOUR), neighbours);

    // A denied name's new address it has no room for: the answer is
    // dropped (the pod must not be told an address that would not be
    // refused), counted, and nothing is learned.
    let new = Ipv4Addr::new(203, 0, 113, 9);
    assert_eq!(ask_and_answer(&f, 20, "denied.test", &[new]), DROP);
    let stats = f.read_snoop_stats().unwrap();
    assert_eq!(
        (stats.answers_refused, stats.over_share),
        (1, 9),
        "{stats:?}"
    );
    assert_eq!(use_of(&f, FLOODER).answers_refused, 1);
    assert!(!learned_by(&f, FLOODER).contains(&(IpAddr::V4(new), DENIED, true)));

    // A name only a monitor policy names (beside the enforce ones): its
    // new address without room is not learned, and the answer passes
    // (monitor never refuses).
    let watched = Ipv4Addr::new(203, 0, 113, 10);
    assert_eq!(ask_and_answer(&f, 22, "watched.test", &[watched]), PASS);
    let stats = f.read_snoop_stats().unwrap();
    assert_eq!(
        (stats.answers_refused, stats.over_share),
        (1, 10),
        "{stats:?}"
    );
    assert!(!learned_by(&f, FLOODER)
        .iter()
        .any(|(a, _, _)| *a == IpAddr::V4(watched)));

    // An address the set holds needs no room: a denied name giving it
    // passes and marks it denied.
    let held = Ipv4Addr::new(198, 18, 2, 0);
    assert_eq!(ask_and_answer(&f, 21, "denied.test", &[held]), PASS);
    assert!(learned_by(&f, FLOODER)
        .iter()
        .any(|(a, _, deny)| *a == IpAddr::V4(held) && *deny));

    // The neighbour's pod still learns (its own share is untouched).
    as_pod_of(&f, NEIGHBOUR);
    assert_eq!(ask_and_answer(&f, 30, "wild.test", &block(5, 4)), PASS);
    assert_eq!(learned_by(&f, NEIGHBOUR).len(), 14);

    // Forgetting what a name taught frees the room it took.
    as_pod_of(&f, FLOODER);
    assert_eq!(f.forget_learned(FLOODER, Some(WILD)).unwrap(), 39);
    assert_eq!(use_of(&f, FLOODER).held, 1);
    assert_eq!(ask_and_answer(&f, 40, "denied.test", &[new]), PASS);
    assert!(learned_by(&f, FLOODER).contains(&(IpAddr::V4(new), DENIED, true)));

    // A set forgotten whole starts its counts again.
    f.forget_learned(FLOODER, None).unwrap();
    assert_eq!(use_of(&f, FLOODER), LearnedUse::default());
    assert_eq!(learned_by(&f, NEIGHBOUR).len(), 14);
}

#[test]
fn expired_addresses_are_swept_and_free_their_room() {
    let f = filter(4);
    as_pod_of(&f, FLOODER);
    // Four addresses written already expired (as if their TTLs ran out):
    // they still take the set's room until swept.
    for a in block(1, 4) {
        f.insert_learned(FLOODER, a.into(), ALLOW, WILD, Duration::ZERO)
            .unwrap();
    }
    // One more that counts for an hour.
    f.insert_learned(
        NEIGHBOUR,
        Ipv4Addr::new(198, 18, 9, 9).into(),
        ALLOW,
        WILD,
        Duration::from_secs(3600),
    )
    .unwrap();
    assert_eq!(ask_and_answer(&f, 1, "wild.test", &block(2, 1)), PASS);
    assert_eq!(f.read_snoop_stats().unwrap().over_share, 1);
    assert_eq!(learned_by(&f, FLOODER).len(), 4);

    assert_eq!(f.sweep_learned().unwrap(), 4, "only the expired go");
    assert_eq!(learned_by(&f, FLOODER).len(), 0);
    assert_eq!(learned_by(&f, NEIGHBOUR).len(), 1);
    assert_eq!(ask_and_answer(&f, 2, "wild.test", &block(2, 1)), PASS);
    assert_eq!(learned_by(&f, FLOODER).len(), 1);
    assert_eq!(use_of(&f, FLOODER).held, 1);
}

#[test]
fn every_set_in_use_gets_an_equal_share_that_sums_within_the_map() {
    let f = EgressFilter::load().unwrap();
    let flags = FilterFlags {
        default_deny: false,
        observe: false,
        domains: true,
    };
    let cpus = u64::try_from(libbpf_rs_cpus()).unwrap();
    // Cgroup ids the sets are written for (no program is attached).
    let cgroups: Vec<u64> = (1..=4).map(|i| (1 << 40) + i).collect();
    for (sets, cgroup) in (1u64..).zip(&cgroups) {
        f.set_filter(*cgroup, u32::try_from(sets).unwrap(), flags)
            .unwrap();
        let share = f.learned_share().unwrap().unwrap();
        assert_eq!(share, LEARNED_MAX / sets - cpus, "{sets} sets");
        assert!(share * sets + cpus * sets <= LEARNED_MAX);
    }
    // A second cgroup of a set in use changes nothing.
    f.set_filter((1 << 41) + 1, 1, flags).unwrap();
    assert_eq!(f.learned_share().unwrap(), Some(LEARNED_MAX / 4 - cpus));
    f.remove_cgroup(cgroups[3]).unwrap();
    assert_eq!(f.learned_share().unwrap(), Some(LEARNED_MAX / 3 - cpus));
}

/// The kernel's possible CPUs, as the handle counts them for its margin.
fn libbpf_rs_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}
