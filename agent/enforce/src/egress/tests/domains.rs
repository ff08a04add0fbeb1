//! Domains and Services.

use super::*;

/// The name id the backend gave `name` (what learned entries carry).
pub(super) fn name_id(b: &EgressEnforcer<MemKernel>, name: &str) -> u32 {
    b.kernel()
        .domains
        .iter()
        .find(|((_, d), _)| d.as_str() == name)
        .map(|(_, (_, id))| *id)
        .unwrap()
}

#[test]
fn domains_union_into_the_set_and_deny_wins_over_what_they_teach() {
    let mut b = backend();
    b.add_policy(&pid("a"), &rules(&["10.0.0.1/32"], &[], true))
        .unwrap();
    let allow_both = Program::Enforce(Rules {
        allow: [dom("allowed.test"), dom("shared.test")].into(),
        deny: BTreeSet::new(),
        default_deny: false,
    });
    let deny_shared = Program::Enforce(Rules {
        allow: BTreeSet::new(),
        deny: [dom("shared.test")].into(),
        default_deny: false,
    });
    b.add_policy(&pid("names"), &allow_both).unwrap();
    b.add_policy(&pid("no-shared"), &deny_shared).unwrap();
    for id in ["a", "names", "no-shared"] {
        b.bind(&pid(id), 1).unwrap();
    }
    let set = b.set_of(1).unwrap();
    let k = b.kernel();
    let sides = |name: &str| {
        k.domains
            .get(&(set, Domain::new(name).unwrap()))
            .map(|e| e.0)
    };
    assert_eq!(
        sides("allowed.test"),
        Some(DomainVerdicts {
            allow: true,
            deny: false,
            observe: false
        })
    );
    assert_eq!(
        sides("shared.test"),
        Some(DomainVerdicts {
            allow: true,
            deny: true,
            observe: false
        })
    );
    assert_eq!(
        k.filters[&1].1,
        FilterFlags {
            default_deny: true,
            observe: false,
            domains: true
        }
    );
    assert!(
        k.snooped.contains(&1),
        "the snooper is attached with the filter"
    );
    let (allowed, shared) = (name_id(&b, "allowed.test"), name_id(&b, "shared.test"));
    let k = b.kernel_mut();
    k.learn(set, ip("192.0.2.1"), allowed);
    k.learn(set, ip("192.0.2.2"), shared);
    assert_eq!(k.packet(1, ip("192.0.2.1")), Some(bpf::Decision::Allowed));
    assert_eq!(k.packet(1, ip("192.0.2.2")), Some(bpf::Decision::Denied));
    assert_eq!(
        k.packet(1, ip("192.0.2.3")),
        Some(bpf::Decision::DefaultDenied),
        "an address no answer gave"
    );
    assert_eq!(
        b.learned_addresses(&Domain::new("allowed.test").unwrap())
            .unwrap(),
        [ip("192.0.2.1")].into()
    );
}

#[test]
fn a_domain_only_a_monitor_policy_names_is_learned_and_changes_no_verdict() {
    let mut b = pinned_backend();
    let watch = |names: &[&str]| Program::Observe(names.iter().map(|d| dom(d)).collect());
    b.add_policy(&pid("mon"), &watch(&["watched.test"]))
        .unwrap();
    b.bind(&pid("mon"), 1).unwrap();
    let set = b.set_of(1).unwrap();
    let watched = name_id(&b, "watched.test");
    let k = b.kernel();
    assert_eq!(
        k.domains.get(&(set, Domain::new("watched.test").unwrap())),
        Some(&(
            DomainVerdicts {
                observe: true,
                ..DomainVerdicts::default()
            },
            watched
        )),
        "named on the observe side alone"
    );
    assert!(k.filters[&1].1.domains && k.filters[&1].1.observe);
    assert!(k.snooped.contains(&1), "the snooper reads its answers");

    let k = b.kernel_mut();
    k.learn(set, ip("192.0.2.1"), watched);
    assert_eq!(
        k.packet(1, ip("192.0.2.1")),
        Some(bpf::Decision::Unmatched),
        "an observed name's address is no allow and no deny"
    );
    assert_eq!(
        b.learned_names().unwrap(),
        [((1, ip("192.0.2.1")), "watched.test".to_string())].into(),
        "the monitor knows what the address was answered for"
    );
    // Beside an enforce default deny, the observed name lifts nothing.
    b.add_policy(&pid("dd"), &rules(&[], &[], true)).unwrap();
    b.bind(&pid("dd"), 1).unwrap();
    assert_eq!(
        b.kernel_mut().packet(1, ip("192.0.2.1")),
        Some(bpf::Decision::DefaultDenied)
    );

    // The monitor policy names another domain: updated in place (no
    // unbinding), the old name and what it taught go.
    b.kernel_mut().log.clear();
    let diff =
        ProgramDiff::between_programs(&watch(&["watched.test"]), &watch(&["other.test"])).unwrap();
    b.update_policy(&pid("mon"), &diff).unwrap();
    assert_eq!(
        b.kernel().log,
        [
            "domain other.test allow=false deny=false observe".to_string(),
            "domain watched.test allow=false deny=false".to_string(),
            format!("forget set {set} name Some({watched})"),
        ]
    );
    assert!(b.kernel().learned.is_empty());
    assert_eq!(
        b.held().unwrap()[&pid("mon")].program,
        watch(&["other.test"])
    );

    // A restart adopts the observer with its domain.
    let held = b.held().unwrap();
    let mut b = restarted(b);
    assert_eq!(b.held().unwrap(), held);
    assert!(b.kernel().log.is_empty(), "{:?}", b.kernel().log);
    // Unbound, the set goes and the names with it.
    b.unbind(&pid("mon"), 1).unwrap();
    b.unbind(&pid("dd"), 1).unwrap();
    assert!(b.kernel().domains.is_empty());
    // An observer has no other rules to update.
    let enforce_diff = ProgramDiff::between(
        &Rules::default(),
        &Rules {
            deny: [dom("x.test")].into(),
            ..Rules::default()
        },
    );
    assert!(b.update_policy(&pid("mon"), &enforce_diff).is_err());
}

#[test]
fn a_name_leaving_a_side_forgets_what_it_taught_and_the_flag_follows() {
    let mut b = backend();
    let prog = |allow: &[&str], deny: &[&str]| {
        Program::Enforce(Rules {
            allow: allow.iter().map(|d| dom(d)).collect(),
            deny: deny.iter().map(|d| dom(d)).collect(),
            default_deny: false,
        })
    };
    b.add_policy(&pid("a"), &prog(&["one.test", "two.test"], &[]))
        .unwrap();
    b.bind(&pid("a"), 1).unwrap();
    let set = b.set_of(1).unwrap();
    let (one, two) = (name_id(&b, "one.test"), name_id(&b, "two.test"));
    b.kernel_mut().learn(set, ip("192.0.2.1"), one);
    b.kernel_mut().learn(set, ip("192.0.2.2"), two);
    // What the monitor judges domain values by: each address under the
    // name its cgroup's set learned it for.
    assert_eq!(
        b.learned_names().unwrap(),
        [
            ((1, ip("192.0.2.1")), "one.test".to_string()),
            ((1, ip("192.0.2.2")), "two.test".to_string()),
        ]
        .into()
    );
    b.kernel_mut().log.clear();
    // two.test moves from allow to deny: denied first, then its allow
    // side and what it taught go.
    let diff = ProgramDiff::between(
        &Rules {
            allow: [dom("one.test"), dom("two.test")].into(),
            deny: BTreeSet::new(),
            default_deny: false,
        },
        &Rules {
            allow: [dom("one.test")].into(),
            deny: [dom("two.test")].into(),
            default_deny: false,
        },
    );
    b.update_policy(&pid("a"), &diff).unwrap();
    assert_eq!(
        b.kernel().log,
        [
            "domain two.test allow=true deny=true".to_string(),
            "domain two.test allow=false deny=true".to_string(),
            format!("forget set {set} name Some({two})"),
        ]
    );
    assert_eq!(
        b.kernel().learned.keys().collect::<Vec<_>>(),
        [&(set, ip("192.0.2.1"))]
    );
    // No domain left: the flag comes down, the set's learned go with
    // the release.
    b.update_policy(
        &pid("a"),
        &ProgramDiff::between(
            &Rules {
                allow: [dom("one.test")].into(),
                deny: [dom("two.test")].into(),
                default_deny: false,
            },
            &Rules::default(),
        ),
    )
    .unwrap();
    assert!(!b.kernel().filters[&1].1.domains);
    assert!(b.kernel().domains.is_empty());
    assert!(b.kernel().learned.is_empty());
    b.kernel_mut().learn(set, ip("192.0.2.9"), one);
    b.unbind(&pid("a"), 1).unwrap();
    assert!(
        b.kernel().learned.is_empty(),
        "a released set id is reused: nothing it learned may stay"
    );
    assert!(!b.kernel().snooped.contains(&1));
}

#[test]
fn adoption_keeps_domains_and_their_numbers() {
    let mut b = pinned_backend();
    b.add_policy(
        &pid("a"),
        &Program::Enforce(Rules {
            allow: [dom("allowed.test"), p("10.0.0.1/32")].into(),
            deny: [dom("denied.test")].into(),
            default_deny: true,
        }),
    )
    .unwrap();
    b.bind(&pid("a"), 1).unwrap();
    let set = b.set_of(1).unwrap();
    let id = name_id(&b, "allowed.test");
    b.kernel_mut().learn(set, ip("192.0.2.1"), id);
    let held = b.held().unwrap();
    let b = restarted(b);
    assert_eq!(b.held().unwrap(), held);
    assert!(b.kernel().log.is_empty(), "{:?}", b.kernel().log);
    assert_eq!(b.kernel().ledger_writes, 0);
    assert_eq!(
        b.learned_addresses(&Domain::new("allowed.test").unwrap())
            .unwrap(),
        [ip("192.0.2.1")].into(),
        "the name keeps its number across the restart"
    );
}

#[test]
fn domains_are_refused_where_the_snooper_did_not_load() {
    let k = MemKernel {
        no_snoop: true,
        ..MemKernel::default()
    };
    let mut m = EgressManager::new(EgressEnforcer::new(k)).unwrap();
    let out = m.upsert_policy(policy("a", Mode::Enforce, &["x.test", "10.0.0.1"], &[]));
    assert_eq!(out.rejections.len(), 1);
    assert!(matches!(
        out.rejections[0].reason,
        RejectReason::DomainsUnavailable(_)
    ));
    assert_eq!(
        m.programmed()[&pid("a")].program,
        rules(&["10.0.0.1"], &[], false)
    );
}

#[test]
fn a_services_addresses_follow_the_api() {
    let mut m = EgressManager::new(fake()).unwrap();
    m.services_synced();
    m.upsert_pod(pod("p1", "web", &[1]));
    let out = m.upsert_policy(policy(
        "a",
        Mode::Enforce,
        &["api.prod.svc", "10.0.0.1"],
        &["*"],
    ));
    assert!(out.rejections.is_empty() && out.failures.is_empty());
    assert_eq!(m.unresolved(&pid("a")), ["api.prod.svc"]);
    assert_eq!(
        m.programmed()[&pid("a")].program,
        rules(&["10.0.0.1"], &[], true),
        "absent: resolves to nothing"
    );
    let api = svc("prod", "api");
    let r = m.set_service_addresses(
        api.clone(),
        Some([ip("10.96.0.5"), ip("10.244.1.7")].into()),
    );
    assert!(r.failures.is_empty());
    assert_eq!(r.policies, [pid("a")]);
    assert!(
        m.set_service_addresses(svc("prod", "other"), Some([ip("10.96.0.9")].into()))
            .policies
            .is_empty(),
        "a Service no policy names re-programs nothing"
    );
    assert!(m.unresolved(&pid("a")).is_empty());
    assert_eq!(
        m.programmed()[&pid("a")].program,
        rules(&["10.0.0.1", "10.96.0.5", "10.244.1.7"], &[], true)
    );
    assert_eq!(
        m.backend().decide(1, &p("10.244.1.7/32")),
        Decision::Allowed
    );
    assert_eq!(
        m.known_addresses("api.prod.svc.cluster.local"),
        [ip("10.96.0.5"), ip("10.244.1.7")].into()
    );
    // The monitor's view: a named Service's addresses carry its name;
    // a Service no policy names is not looked at.
    let names = m.destination_names();
    assert_eq!(names.of(1, ip("10.244.1.7")), ["api.prod.svc"]);
    assert_eq!(names.of(2, ip("10.96.0.5")), ["api.prod.svc"]);
    assert!(names.of(1, ip("10.96.0.9")).is_empty());
    // An endpoint replaced: one update, by diff.
    m.backend_mut().clear_ops();
    m.set_service_addresses(
        api.clone(),
        Some([ip("10.96.0.5"), ip("10.244.2.9")].into()),
    );
    let ops = m.backend().mutations();
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(matches!(ops[0], FakeOp::Update(..)));
    assert_eq!(
        m.backend().decide(1, &p("10.244.1.7/32")),
        Decision::DefaultDenied
    );
    // The same addresses again change nothing.
    m.backend_mut().clear_ops();
    m.set_service_addresses(
        api.clone(),
        Some([ip("10.96.0.5"), ip("10.244.2.9")].into()),
    );
    assert!(m.backend().mutations().is_empty());
    // The Service deleted: its addresses go.
    m.set_service_addresses(api, None);
    assert_eq!(
        m.programmed()[&pid("a")].program,
        rules(&["10.0.0.1"], &[], true)
    );
    assert_eq!(m.unresolved(&pid("a")), ["api.prod.svc"]);
    assert!(m.known_addresses("api.prod.svc").is_empty());
    assert!(m.known_addresses("not a value").is_empty());
}

#[test]
fn until_the_services_are_listed_a_restart_keeps_their_addresses() {
    let mut m = EgressManager::new(pinned_backend()).unwrap();
    m.services_synced();
    m.set_service_addresses(svc("prod", "db"), Some([ip("10.96.0.7")].into()));
    m.upsert_pod(pod("pa", "web", &[1]));
    m.upsert_policy(policy("a", Mode::Enforce, &[], &["db.prod.svc"]));
    let before = m.programmed().clone();
    assert_eq!(before[&pid("a")].program, rules(&[], &["10.96.0.7"], false));

    let mut m = EgressManager::new(restarted(m.backend)).unwrap();
    m.upsert_pod(pod("pa", "web", &[1]));
    // The policy before the Service watch listed: nothing changes.
    m.upsert_policy(policy("a", Mode::Enforce, &[], &["db.prod.svc"]));
    assert_eq!(m.programmed(), &before);
    assert!(
        m.backend().kernel().log.is_empty(),
        "{:?}",
        m.backend().kernel().log
    );
    assert_eq!(
        m.backend_mut().kernel_mut().packet(1, ip("10.96.0.7")),
        Some(bpf::Decision::Denied)
    );
    // Listed with the same address: still nothing to write.
    m.set_service_addresses(svc("prod", "db"), Some([ip("10.96.0.7")].into()));
    assert!(m.services_synced().failures.is_empty());
    assert!(
        m.backend().kernel().log.is_empty(),
        "{:?}",
        m.backend().kernel().log
    );
    // Gone since: the sync takes it out.
    m.set_service_addresses(svc("prod", "db"), None);
    assert_eq!(m.programmed()[&pid("a")].program, rules(&[], &[], false));
    assert_eq!(
        m.backend_mut().kernel_mut().packet(1, ip("10.96.0.7")),
        Some(bpf::Decision::Unmatched)
    );
}
