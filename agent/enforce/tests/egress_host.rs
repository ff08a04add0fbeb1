//! The network manager over the kernel egress backend, with real loopback
//! traffic (needs root): policies and a pod in, connects allowed or dropped
//! out. Run with `cargo test -p kyverno-runtime-enforce --features
//! host-tests --test egress_host`.
//!
//! The pod's "container" is a cgroup this test creates under the cgroup2
//! mount; a child of this binary joins it and connects (so no shell is
//! needed). A dropped SYN shows as a connect timeout: the assertions are
//! on outcomes, never on durations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::egress::{connects, pid, pod, policy};
use common::TempCgroup;

use std::net::IpAddr;

use kyverno_runtime_enforce::egress::{DomainSupport as _, EgressEnforcer, EgressManager};
use kyverno_runtime_enforce::Observation;

/// The connect child of `common::egress::connects`.
#[test]
fn connect_child() {
    common::egress::connect_child();
}

#[test]
fn policies_union_over_a_real_cgroup() {
    let cg = TempCgroup::new("egress-host", "union");
    let mut m = EgressManager::new(EgressEnforcer::load().unwrap()).unwrap();
    m.upsert_pod(pod("pod-1", &cg));
    // Default deny with an allow list, and a value that is refused (an
    // address that is none) rather than dropped.
    let out = m.upsert_policy(policy("allow-list", &["127.0.0.2", "10.0.0.300"], &["*"]));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(out.rejections.len(), 1);
    assert_eq!(out.rejections[0].value, "10.0.0.300");
    // A second policy: its allow lifts the first one's default deny, its
    // deny beats every allow.
    let out = m.upsert_policy(policy("second", &["::1"], &["127.0.0.2/32"]));
    assert!(out.failures.is_empty(), "{:?}", out.failures);

    assert!(connects(&cg, "::1"));
    assert!(!connects(&cg, "127.0.0.2"), "explicit deny beats allow");
    assert!(!connects(&cg, "127.0.0.3"), "default deny");

    // Removing the deny from the second policy (a diff) lets 127.0.0.2 in.
    m.upsert_policy(policy("second", &["::1"], &[]));
    assert!(connects(&cg, "127.0.0.2"));
    // Deleting the default-deny policy lifts the default deny.
    assert!(m.delete_policy(&pid("allow-list")).is_empty());
    assert!(connects(&cg, "127.0.0.3"));
    // The pod gone: detached, nothing filters it.
    m.upsert_policy(policy("second", &[], &["::1"]));
    assert!(!connects(&cg, "::1"));
    assert!(m.delete_pod("pod-1").is_empty());
    assert!(connects(&cg, "::1"));
    assert_eq!(m.backend().kernel().attached().count(), 0);
}

#[test]
fn a_domain_attaches_the_snooper_and_names_the_set() {
    let cg = TempCgroup::new("egress-host", "domain");
    let mut m = EgressManager::new(EgressEnforcer::load().unwrap()).unwrap();
    m.backend()
        .domains_available()
        .expect("the DNS answer snooper loads on this kernel");
    m.upsert_pod(pod("pod-1", &cg));
    let out = m.upsert_policy(policy("names", &["Allowed.Test"], &["denied.test"]));
    assert!(
        out.failures.is_empty() && out.rejections.is_empty(),
        "{out:?}"
    );
    let kernel = m.backend().kernel();
    assert_eq!(kernel.snooped().collect::<Vec<_>>(), [cg.id()]);
    let state = kernel.filter().read_state().unwrap();
    let (set, flags) = state.filters[&cg.id()];
    assert!(flags.domains, "{flags:?}");
    let names: Vec<(String, bool, bool)> = state.sets[&set]
        .domains
        .iter()
        .map(|(d, (v, _))| (d.to_string(), v.allow, v.deny))
        .collect();
    assert_eq!(
        names,
        [
            ("allowed.test".to_string(), true, false),
            ("denied.test".to_string(), false, true)
        ]
    );
    // Nothing named any more: the domains and the flag go, the snooper
    // stays with the filter until the cgroup is released.
    m.upsert_policy(policy("names", &["127.0.0.9"], &[]));
    let state = m.backend().kernel().filter().read_state().unwrap();
    assert!(!state.filters[&cg.id()].1.domains);
    assert!(state.sets.values().all(|s| s.domains.is_empty()));
    assert!(m.delete_pod("pod-1").is_empty());
    assert_eq!(m.backend().kernel().snooped().count(), 0);
    assert_eq!(m.backend().kernel().attached().count(), 0);
}

/// A pod goes and the next one bound takes its set's id: the refusals the
/// first pod's cgroup made before are reported as its own, never as the
/// next pod's (the kernel counts by set id).
#[test]
fn a_released_sets_refusals_stay_with_its_cgroup_when_the_id_is_reused() {
    let first = TempCgroup::new("egress-host", "released");
    let next = TempCgroup::new("egress-host", "reusing");
    let mut m = EgressManager::new(EgressEnforcer::load().unwrap()).unwrap();
    let out = m.upsert_policy(policy("deny", &[], &["127.0.0.4"]));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    m.upsert_pod(pod("pod-1", &first));
    let set = m.backend().set_of(first.id());
    assert!(!connects(&first, "127.0.0.4"));
    assert!(m.delete_pod("pod-1").is_empty());
    m.upsert_pod(pod("pod-2", &next));
    assert_eq!(m.backend().set_of(next.id()), set, "the id was reused");
    assert!(!connects(&next, "127.0.0.4"));

    let refusals = |cgroup: u64, observations: &[Observation<IpAddr>]| -> u64 {
        observations
            .iter()
            .filter(|o| o.cgroup == cgroup && o.observed == IpAddr::from([127, 0, 0, 4]))
            .map(|o| o.count)
            .sum()
    };
    let observations = m.drain().unwrap();
    // A dropped connect sends its SYN, and again after 1 s: one or two.
    for (cg, what) in [(&first, "the released pod"), (&next, "the next pod")] {
        let n = refusals(cg.id(), &observations);
        assert!(
            (1..=2).contains(&n),
            "{what}: {n} refusals in {observations:?}"
        );
    }
    assert!(
        observations
            .iter()
            .all(|o| o.cgroup == first.id() || o.cgroup == next.id()),
        "{observations:?}"
    );
    assert!(m.delete_pod("pod-2").is_empty());
}

/// Issue 33: an address denied inside an allowed range under a default
/// deny is dropped whether the three lists are one behavior, two behaviors
/// of one policy (merged by the one rule) or two policies; the rest of the
/// range connects, and what is outside it is default denied. IPv4 on
/// 127.0.0.0/16; IPv6 on ::1 (the only loopback address) inside ::/64.
#[test]
fn an_explicit_deny_inside_an_allowed_range_wins_in_every_shape() {
    use kyverno_runtime_policy::compile::{EvaluatedBehavior, EvaluationResult};
    use kyverno_runtime_policy::rule::BehaviorLists;
    use kyverno_runtime_policy::values::BehaviorKind;

    let allow = ["127.0.0.0/16", "::/64"];
    let deny = ["127.0.0.9", "::1"];
    let behavior = |index, allow: &[&str], deny: &[&str], default_deny| EvaluatedBehavior {
        index,
        kind: BehaviorKind::Network,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
        default_deny,
    };
    let one_behavior = vec![policy("one", &allow, &["*", deny[0], deny[1]])];
    let mut merged = policy("two-behaviors", &[], &[]);
    merged.network = BehaviorLists::merge(
        &EvaluationResult {
            behaviors: vec![
                behavior(0, &allow, &[], true),
                behavior(1, &[], &deny, false),
            ],
        },
        BehaviorKind::Network,
    );
    assert_eq!(
        merged.network.as_ref().map(|l| l.deny.clone()),
        Some(vec!["*".into(), deny[0].into(), deny[1].into()])
    );
    let two_policies = vec![policy("allow", &allow, &["*"]), policy("deny", &[], &deny)];
    for (shape, policies) in [
        ("one behavior", one_behavior),
        ("two behaviors", vec![merged]),
        ("two policies", two_policies),
    ] {
        let cg = TempCgroup::new("egress-host", "deny-in-range");
        let mut m = EgressManager::new(EgressEnforcer::load().unwrap()).unwrap();
        m.upsert_pod(pod("pod-1", &cg));
        for p in &policies {
            let out = m.upsert_policy(p.clone());
            assert!(out.failures.is_empty(), "{shape}: {:?}", out.failures);
            assert!(out.rejections.is_empty(), "{shape}: {:?}", out.rejections);
        }
        assert!(
            !connects(&cg, "127.0.0.9"),
            "{shape}: the /32 denied in the /16"
        );
        assert!(!connects(&cg, "::1"), "{shape}: the /128 denied in the /64");
        assert!(connects(&cg, "127.0.0.8"), "{shape}: the rest of the /16");
        assert!(
            !connects(&cg, "127.1.0.1"),
            "{shape}: outside: default deny"
        );
        for p in &policies {
            m.delete_policy(&p.id);
        }
        assert!(m.delete_pod("pod-1").is_empty());
    }
    // Without the IPv6 deny, ::1 connects: the /64 allow lifts the default
    // deny (so above, the deny is what dropped it).
    let cg = TempCgroup::new("egress-host", "deny-in-range-v6");
    let mut m = EgressManager::new(EgressEnforcer::load().unwrap()).unwrap();
    m.upsert_pod(pod("pod-1", &cg));
    m.upsert_policy(policy("one", &allow, &["*", deny[0]]));
    assert!(connects(&cg, "::1"));
    assert!(!connects(&cg, "127.0.0.9"));
    assert!(m.delete_pod("pod-1").is_empty());
}
