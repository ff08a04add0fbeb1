//! Restarts: the ledger and adoption.

use super::*;

pub(super) fn pinned_backend() -> EgressEnforcer<MemKernel> {
    let mut b = EgressEnforcer::new(MemKernel::pinned());
    for c in 1..=4 {
        b.set_cgroup_path(c, PathBuf::from(format!("/sys/fs/cgroup/c{c}")));
    }
    b
}

/// A new process over `b`'s kernel.
pub(super) fn restarted(b: EgressEnforcer<MemKernel>) -> EgressEnforcer<MemKernel> {
    EgressEnforcer::adopt(b.into_kernel().restart()).unwrap()
}

#[test]
fn adoption_rebuilds_what_each_policy_held() {
    let mut b = pinned_backend();
    b.add_policy(&pid("a"), &rules(&["10.0.0.0/8"], &[], true))
        .unwrap();
    b.add_policy(
        &pid("b"),
        &rules(&["2001:db8::/32"], &["10.9.0.0/16", "::1"], false),
    )
    .unwrap();
    b.add_policy(&pid("c"), &Program::observe()).unwrap();
    for (id, c) in [("a", 1), ("a", 2), ("b", 2), ("c", 2), ("c", 3)] {
        b.bind(&pid(id), c).unwrap();
    }
    let diff = ProgramDiff {
        add_allow: [p("192.0.2.0/24")].into(),
        remove_allow: BTreeSet::new(),
        add_deny: [p("10.1.0.0/16")].into(),
        remove_deny: BTreeSet::new(),
        default_deny: Some(false),
    };
    b.update_policy(&pid("a"), &diff).unwrap();
    b.add_policy(&pid("unbound"), &rules(&[], &["::2"], false))
        .unwrap();
    let held = b.held().unwrap();
    let sets: Vec<_> = (1..=4).map(|c| b.set_of(c)).collect();
    let counts: Vec<_> = (1..=4).map(|c| b.flag_counts(c)).collect();

    let mut b = restarted(b);
    assert_eq!(b.held().unwrap(), held);
    assert_eq!(
        b.held().unwrap()[&pid("a")].program,
        rules(&["10.0.0.0/8", "192.0.2.0/24"], &["10.1.0.0/16"], false)
    );
    assert_eq!((1..=4).map(|c| b.set_of(c)).collect::<Vec<_>>(), sets);
    assert_eq!(
        (1..=4).map(|c| b.flag_counts(c)).collect::<Vec<_>>(),
        counts
    );
    assert!(b.kernel().log.is_empty(), "{:?}", b.kernel().log);
    assert_eq!(b.kernel().ledger_writes, 0);
    let k = b.kernel_mut();
    assert_eq!(k.packet(2, ip("10.9.1.1")), Some(bpf::Decision::Denied));
    assert_eq!(k.packet(2, ip("2001:db8::9")), Some(bpf::Decision::Allowed));
    // New cgroups get set ids of their own (paths come from the
    // manager's pods again).
    b.set_cgroup_path(4, PathBuf::from("/sys/fs/cgroup/c4"));
    b.bind(&pid("a"), 4).unwrap();
    let four = b.set_of(4).unwrap();
    assert!(!sets.contains(&Some(four)), "{four} in {sets:?}");
    // Changes after the adoption are kept in the ledger as before.
    b.remove_policy(&pid("b")).unwrap();
    b.unbind(&pid("c"), 3).unwrap();
    let held = b.held().unwrap();
    let b = restarted(b);
    assert_eq!(b.held().unwrap(), held);
    assert!(!b.kernel().ledger.contains_key(b"b".as_slice()));
    assert_eq!(b.set_of(3), None);
}

#[test]
fn adoption_cleans_what_an_interrupted_change_left() {
    let mut k = MemKernel::pinned();
    let x = pfx("10.0.0.1/32");
    let y = pfx("10.0.0.2/32");
    // Cgroup 1: attached, its set 5 holds a's deny and a stray allow.
    k.filters.insert(1, (5, FilterFlags::default()));
    k.attached.insert(1, PathBuf::from("/pin/1"));
    k.deny.insert((5, x));
    k.allow.insert((5, y));
    // Cgroup 2: in the map without a link; set 7: no cgroup at all.
    k.filters.insert(2, (6, FilterFlags::default()));
    k.deny.insert((6, x));
    k.deny.insert((7, y));
    k.ledger.insert(
        b"a".to_vec(),
        bpf::LedgerPolicy {
            kind: Some(LedgerKind::Enforce {
                default_deny: false,
            }),
            allow: BTreeSet::new(),
            deny: [x].into(),
            cgroups: [1, 2, 9].into(),
            ..bpf::LedgerPolicy::default()
        },
    );
    // An interrupted removal: entries without a record.
    k.ledger.insert(
        b"z".to_vec(),
        bpf::LedgerPolicy {
            kind: None,
            allow: [y].into(),
            deny: BTreeSet::new(),
            cgroups: [1].into(),
            ..bpf::LedgerPolicy::default()
        },
    );
    let b = EgressEnforcer::adopt(k.restart()).unwrap();
    assert_eq!(
        b.held().unwrap(),
        BTreeMap::from([(
            pid("a"),
            Held {
                program: rules(&[], &["10.0.0.1/32"], false),
                cgroups: [1].into(),
            }
        )])
    );
    let k = b.kernel();
    assert_eq!(k.allow, BTreeSet::new(), "the stray allow went");
    assert_eq!(k.deny, [(5, x)].into(), "sets 6 and 7 went");
    assert_eq!(k.filters.keys().copied().collect::<Vec<_>>(), [1]);
    assert!(!k.ledger.contains_key(b"z".as_slice()));
    assert_eq!(k.ledger[b"a".as_slice()].cgroups, [1].into());
    assert_eq!(b.set_of(1), Some(5));
}

#[test]
fn an_unpinned_kernel_keeps_no_ledger_and_adopts_nothing() {
    let mut b = backend();
    b.add_policy(&pid("a"), &rules(&["10.0.0.1/32"], &[], false))
        .unwrap();
    b.bind(&pid("a"), 1).unwrap();
    assert!(b.kernel().ledger.is_empty());
    let b = EgressEnforcer::adopt(b.into_kernel()).unwrap();
    assert!(b.held().unwrap().is_empty());
}

#[test]
fn the_manager_adopts_keeps_until_reconcile_then_converges() {
    let mut m = EgressManager::new(pinned_backend()).unwrap();
    m.upsert_pod(pod("pa", "web", &[1]));
    m.upsert_pod(pod("pb", "web", &[2]));
    for (id, deny) in [("deny-2", "10.0.0.2"), ("deny-3", "10.0.0.3")] {
        assert!(m
            .upsert_policy(policy(id, Mode::Enforce, &[], &[deny]))
            .failures
            .is_empty());
    }
    let before = m.programmed().clone();
    let (backend, ..) = (m.backend, ());
    let backend = restarted(backend);

    let mut m = EgressManager::new(backend).unwrap();
    assert_eq!(m.programmed(), &before);
    // Pod pa and deny-2 again: nothing changes in the kernel.
    assert!(m.upsert_pod(pod("pa", "web", &[1])).is_empty());
    let out = m.upsert_policy(policy("deny-2", Mode::Enforce, &[], &["10.0.0.2"]));
    assert!(out.failures.is_empty());
    assert!(
        m.backend().kernel().log.is_empty(),
        "{:?}",
        m.backend().kernel().log
    );
    assert_eq!(m.backend().kernel().ledger_writes, 0);
    // pb is not synced yet: its binding is kept, and so is deny-3.
    assert_eq!(m.programmed(), &before);
    assert_eq!(
        m.backend_mut().kernel_mut().packet(2, ip("10.0.0.3")),
        Some(bpf::Decision::Denied)
    );
    // The reconcile drops what is not desired.
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert_eq!(m.programmed().keys().collect::<Vec<_>>(), [&pid("deny-2")]);
    assert_eq!(m.programmed()[&pid("deny-2")].cgroups, [1].into());
    let k = m.backend_mut().kernel_mut();
    assert_eq!(k.packet(1, ip("10.0.0.2")), Some(bpf::Decision::Denied));
    assert_eq!(k.packet(1, ip("10.0.0.3")), Some(bpf::Decision::Unmatched));
    assert_eq!(k.packet(2, ip("10.0.0.3")), None, "pb's cgroup detached");
}

#[test]
fn a_policy_deleted_before_the_reconcile_goes_at_once() {
    let mut m = EgressManager::new(pinned_backend()).unwrap();
    m.upsert_pod(pod("pa", "web", &[1]));
    m.upsert_policy(policy("gone", Mode::Enforce, &[], &["10.0.0.2"]));
    let mut m = EgressManager::new(restarted(m.backend)).unwrap();
    assert!(m.delete_policy(&pid("gone")).is_empty());
    assert!(m.programmed().is_empty());
    assert!(m.backend().kernel().attached.is_empty());
}
