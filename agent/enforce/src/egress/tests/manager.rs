//! The manager over the reference model.

use super::*;

pub(super) fn pod(uid: &str, app: &str, cgroups: &[CgroupId]) -> NetworkPod {
    NetworkPod {
        uid: uid.into(),
        namespace: "default".into(),
        name: uid.into(),
        labels: [("app".to_string(), app.to_string())].into(),
        namespace_labels: BTreeMap::new(),
        cgroups: cgroups
            .iter()
            .map(|c| ContainerCgroup {
                id: *c,
                path: PathBuf::from(format!("/sys/fs/cgroup/c{c}")),
            })
            .collect(),
    }
}

pub(super) fn policy(id: &str, mode: Mode, allow: &[&str], deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        id: pid(id),
        name: id.into(),
        mode,
        target: PodTarget::everything(),
        network: Some(lists(allow, deny)),
    }
}

pub(super) fn fake() -> FakeEnforcer<Destination> {
    FakeEnforcer::new(Behavior::Network, Backend::CgroupSkbEgress)
}

#[test]
fn the_manager_adds_then_binds_and_unbinds_then_removes() {
    let mut m = EgressManager::new(fake()).unwrap();
    assert!(m.upsert_pod(pod("p1", "web", &[1, 2])).is_empty());
    let out = m.upsert_policy(policy(
        "a",
        Mode::Enforce,
        &["10.0.0.0/8", "db.example", "10.0.0.300"],
        &["*"],
    ));
    assert!(out.failures.is_empty());
    assert_eq!(out.rejections.len(), 1);
    assert_eq!(m.rejected_total(), 1);
    assert_eq!(m.backend().decide(1, &dom("db.example")), Decision::Allowed);
    let ops = m.backend().mutations();
    assert!(matches!(ops[0], FakeOp::Add(..)));
    assert!(ops[1..].iter().all(|o| matches!(o, FakeOp::Bind(..))));
    assert_eq!(m.backend().decide(1, &p("10.0.0.0/8")), Decision::Allowed);
    assert_eq!(
        m.backend().decide(2, &p("192.0.2.1/32")),
        Decision::DefaultDenied
    );
    m.backend_mut().clear_ops();
    assert!(m.delete_policy(&pid("a")).is_empty());
    let ops = m.backend().mutations();
    assert!(matches!(ops.last(), Some(FakeOp::Remove(..))));
    assert!(m.programmed().is_empty());
}

#[test]
fn the_manager_updates_by_diff_and_rebuilds_across_modes() {
    let mut m = EgressManager::new(fake()).unwrap();
    m.upsert_pod(pod("p1", "web", &[1]));
    m.upsert_policy(policy("a", Mode::Enforce, &["10.0.0.1"], &[]));
    m.backend_mut().clear_ops();
    m.upsert_policy(policy("a", Mode::Enforce, &["10.0.0.2"], &[]));
    let ops = m.backend().mutations();
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(matches!(ops[0], FakeOp::Update(..)));
    m.backend_mut().clear_ops();
    m.upsert_policy(policy("a", Mode::Monitor, &["10.0.0.2"], &[]));
    let calls: Vec<Call> = m.backend().mutations().iter().map(FakeOp::call).collect();
    assert_eq!(
        calls,
        [
            Call::Unbind,
            Call::RemovePolicy,
            Call::AddPolicy,
            Call::Bind
        ]
    );
    assert!(m.backend().observing(1));
}

#[test]
fn a_failed_bind_is_kept_and_retried() {
    let mut m = EgressManager::new(fake()).unwrap();
    m.upsert_policy(policy("a", Mode::Enforce, &["10.0.0.1"], &[]));
    // The bind pass and the full pass of the sweep both fail; only the
    // full pass's failure stands.
    m.backend_mut().fail_next(Call::Bind);
    m.backend_mut().fail_next(Call::Bind);
    let failures = m.upsert_pod(pod("p1", "web", &[1]));
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(m.failures(&pid("a")).len(), 1);
    assert!(m.upsert_pod(pod("p1", "web", &[1])).is_empty());
    assert!(m.failures(&pid("a")).is_empty());
    assert_eq!(m.programmed()[&pid("a")].cgroups, [1].into());
}

/// What the kernel says of a packet of cgroup 1 to each address.
pub(super) fn verdicts(
    m: &mut EgressManager<EgressEnforcer<MemKernel>>,
    addrs: &[&str],
) -> Vec<bpf::Decision> {
    let k = m.backend_mut().kernel_mut();
    addrs
        .iter()
        .map(|a| k.packet(1, ip(a)).unwrap_or(bpf::Decision::Unmatched))
        .collect()
}

#[test]
fn a_failed_update_then_a_shrink_leaves_exactly_the_spec_in_the_kernel() {
    use bpf::Decision::{Denied, Unmatched};
    let addrs = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
    // The kernel has room for 1, 2, then 3 entries: the growth fails at
    // each of its steps.
    for room in 1..=3 {
        let mut m = EgressManager::new(EgressEnforcer::new(MemKernel::default())).unwrap();
        m.upsert_pod(pod("p1", "web", &[1]));
        let first = m.upsert_policy(policy("a", Mode::Enforce, &[], &addrs[..1]));
        assert!(first.failures.is_empty(), "{:?}", first.failures);
        m.backend_mut().kernel_mut().capacity = Some(room);
        let grown = m.upsert_policy(policy("a", Mode::Enforce, &[], &addrs));
        assert!(!grown.failures.is_empty(), "room {room}");
        let written: Vec<_> = (0..room)
            .map(|_| Denied)
            .chain((room..4).map(|_| Unmatched))
            .collect();
        assert_eq!(
            verdicts(&mut m, &addrs),
            written,
            "room {room}: what the failed update wrote"
        );
        // The shrink: exactly the first stays, whatever the failed
        // attempt had written.
        let shrunk = m.upsert_policy(policy("a", Mode::Enforce, &[], &addrs[..1]));
        assert!(shrunk.failures.is_empty(), "{:?}", shrunk.failures);
        assert_eq!(
            verdicts(&mut m, &addrs),
            [Denied, Unmatched, Unmatched, Unmatched],
            "room {room}: after the shrink"
        );
        assert_eq!(m.backend().kernel().deny.len(), 1, "room {room}");
        assert!(m.failures(&pid("a")).is_empty());
    }
}

#[test]
fn a_failed_update_is_retried_until_the_kernel_holds_it() {
    use bpf::Decision::{Denied, Unmatched};
    let addrs = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    let mut m = EgressManager::new(EgressEnforcer::new(MemKernel::default())).unwrap();
    m.upsert_pod(pod("p1", "web", &[1]));
    m.upsert_policy(policy("a", Mode::Enforce, &[], &addrs[..1]));
    m.backend_mut().kernel_mut().capacity = Some(2);
    assert!(!m
        .upsert_policy(policy("a", Mode::Enforce, &[], &addrs))
        .failures
        .is_empty());
    assert_eq!(verdicts(&mut m, &addrs), [Denied, Denied, Unmatched]);
    // Still full: the next event retries, fails again, and says so.
    assert!(!m.upsert_pod(pod("p2", "web", &[2])).is_empty());
    assert!(!m.failures(&pid("a")).is_empty());
    // Room again: the next event completes it.
    m.backend_mut().kernel_mut().capacity = None;
    assert!(m.upsert_pod(pod("p3", "web", &[3])).is_empty());
    assert!(m.failures(&pid("a")).is_empty());
    assert_eq!(verdicts(&mut m, &addrs), [Denied, Denied, Denied]);
}

#[test]
fn pods_applied_together_end_where_the_same_pods_one_by_one_end() {
    let selecting = |id: &str, app: &str, deny: &[&str]| {
        let mut pol = policy(id, Mode::Enforce, &[], deny);
        pol.target = PodTarget::compile(
            Some(
                &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("app".to_string(), app.to_string())].into()),
                    match_expressions: None,
                },
            ),
            None,
            &FieldPath::spec(),
        )
        .unwrap();
        pol
    };
    let start = || {
        let mut m = EgressManager::new(fake()).unwrap();
        m.upsert_policy(selecting("a", "web", &["10.0.0.1"]));
        m.upsert_policy(selecting("b", "db", &["10.0.0.2"]));
        m.upsert_policy(policy("c", Mode::Enforce, &["10.1.0.0/16"], &["*"]));
        m.upsert_pod(pod("gone", "web", &[9]));
        m
    };
    let pods = [
        pod("p1", "web", &[1]),
        pod("p2", "db", &[2, 3]),
        pod("p3", "web", &[4]),
    ];
    let mut one_by_one = start();
    for p in pods.clone() {
        assert!(one_by_one.upsert_pod(p).is_empty());
    }
    assert!(one_by_one.delete_pod("gone").is_empty());
    let mut together = start();
    assert!(together
        .apply_pods(pods.to_vec(), &["gone".to_string()])
        .is_empty());
    assert_eq!(together.programmed(), one_by_one.programmed());
    assert_eq!(together.programmed()[&pid("a")].cgroups, [1, 4].into());
    assert_eq!(together.programmed()[&pid("b")].cgroups, [2, 3].into());
    assert_eq!(
        together.programmed()[&pid("c")].cgroups,
        [1, 2, 3, 4].into()
    );
    for c in [1, 2, 3, 4, 9] {
        for d in ["10.0.0.1/32", "10.0.0.2/32", "10.1.2.3/32", "192.0.2.1/32"] {
            assert_eq!(
                together.backend().decide(c, &p(d)),
                one_by_one.backend().decide(c, &p(d)),
                "cgroup {c}, {d}"
            );
        }
    }
    assert_eq!(together.pod_of_cgroup(9).map(|p| p.uid.as_str()), None);
}

#[test]
fn a_pod_leaving_a_selector_is_unbound() {
    let mut m = EgressManager::new(fake()).unwrap();
    let mut pol = policy("a", Mode::Enforce, &[], &["10.0.0.1"]);
    pol.target = PodTarget::compile(
        Some(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                match_expressions: None,
            },
        ),
        None,
        &FieldPath::spec(),
    )
    .unwrap();
    m.upsert_policy(pol);
    m.upsert_pod(pod("p1", "web", &[1]));
    assert_eq!(m.programmed()[&pid("a")].cgroups, [1].into());
    m.upsert_pod(pod("p1", "db", &[1]));
    assert!(m.programmed()[&pid("a")].cgroups.is_empty());
    assert_eq!(m.pod_of_cgroup(1).map(|p| p.uid.as_str()), Some("p1"));
    m.delete_pod("p1");
    assert!(m.pod_of_cgroup(1).is_none());
}

#[test]
fn the_manager_drives_the_kernel_backend_too() {
    let mut b = EgressEnforcer::new(MemKernel::default());
    b.set_cgroup_path(7, PathBuf::from("/unused"));
    let mut m = EgressManager::new(b).unwrap();
    m.upsert_pod(pod("p1", "web", &[1]));
    m.upsert_policy(policy("a", Mode::Enforce, &["10.0.0.0/8"], &["*"]));
    m.upsert_policy(policy(
        "b",
        Mode::Enforce,
        &["192.0.2.0/24"],
        &["10.1.0.0/16"],
    ));
    let k = m.backend_mut().kernel_mut();
    assert_eq!(
        k.attached.get(&1),
        Some(&PathBuf::from("/sys/fs/cgroup/c1"))
    );
    assert_eq!(k.packet(1, ip("10.2.0.1")), Some(bpf::Decision::Allowed));
    assert_eq!(k.packet(1, ip("10.1.0.1")), Some(bpf::Decision::Denied));
    assert_eq!(k.packet(1, ip("192.0.2.1")), Some(bpf::Decision::Allowed));
    assert_eq!(
        k.packet(1, ip("198.51.100.1")),
        Some(bpf::Decision::DefaultDenied)
    );
    m.delete_pod("p1");
    assert!(m.backend().kernel().attached.is_empty());
    assert!(m.backend().kernel().allow.is_empty());
}
