//! The open/exec manager against the in-memory reference backend: union
//! precedence, the lifecycle of policies and pods, ordering, rejections,
//! backend failures and restart adoption.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kyverno_runtime_compat::{Backend, Behavior};
use kyverno_runtime_enforce::fake::{Call, FakeEnforcer, FakeOp};
use kyverno_runtime_enforce::openexec::{
    BehaviorLists, Dimension, Mode, OpenExecManager, OpenExecPolicy, Pod, Step,
};
use kyverno_runtime_enforce::{
    CgroupId, Decision, EnforceError, Enforcer, PolicyId, Program, ProgramDiff, Rules,
};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{AbsPath, FieldPath, Reason};
use rstest::rstest;

type Fake = FakeEnforcer<AbsPath>;
type Manager = OpenExecManager<Fake, Fake>;

fn open_fake() -> Fake {
    FakeEnforcer::new(Behavior::Open, Backend::BpfLsm)
}

fn exec_fake() -> Fake {
    FakeEnforcer::new(Behavior::Exec, Backend::BpfLsm)
}

/// A manager over empty fakes, past its (empty) adoption.
fn manager_over(open: Fake, exec: Fake) -> Manager {
    let mut m = OpenExecManager::new(open, exec).unwrap();
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    m.open_backend_mut().clear_ops();
    m.exec_backend_mut().clear_ops();
    m
}

fn manager() -> Manager {
    manager_over(open_fake(), exec_fake())
}

fn path(s: &str) -> AbsPath {
    AbsPath::parse(s).unwrap()
}

fn id(s: &str) -> PolicyId {
    PolicyId::new(s).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn lists(behavior: usize, kind: &str, allow: &[&str], deny: &[&str]) -> BehaviorLists {
    BehaviorLists {
        field: FieldPath::spec()
            .field("behaviors")
            .index(behavior)
            .field(kind),
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

/// Pods labeled `app=<app>`, in any namespace.
fn app(app: &str) -> PodTarget {
    let s = LabelSelector {
        match_labels: Some(labels(&[("app", app)])),
        match_expressions: None,
    };
    PodTarget::compile(Some(&s), None, &FieldPath::spec()).unwrap()
}

/// An open-only policy.
fn open_policy(
    name: &str,
    mode: Mode,
    target: PodTarget,
    allow: &[&str],
    deny: &[&str],
) -> OpenExecPolicy {
    OpenExecPolicy {
        id: id(name),
        name: name.to_string(),
        mode,
        target,
        open: Some(lists(0, "open", allow, deny)),
        exec: None,
    }
}

fn pod(uid: &str, app: &str, cgroups: &[CgroupId]) -> Pod {
    Pod {
        uid: uid.to_string(),
        namespace: "default".into(),
        name: uid.to_string(),
        labels: labels(&[("app", app)]),
        namespace_labels: labels(&[("kubernetes.io/metadata.name", "default")]),
        cgroups: cgroups.to_vec(),
    }
}

fn open_decides(m: &Manager, cgroup: CgroupId, p: &str) -> Decision {
    m.open_backend().decide(cgroup, &path(p))
}

fn enforce(allow: &[&str], deny: &[&str], default_deny: bool) -> Program<AbsPath> {
    Program::Enforce(Rules {
        allow: allow.iter().map(|s| path(s)).collect(),
        deny: deny.iter().map(|s| path(s)).collect(),
        default_deny,
    })
}

/// Both backends hold exactly what the manager wants, and what it thinks
/// they hold.
fn assert_converged(m: &Manager) {
    for dim in Dimension::BOTH {
        let held = match dim {
            Dimension::Open => m.open_backend().held().unwrap(),
            Dimension::Exec => m.exec_backend().held().unwrap(),
        };
        assert_eq!(held, m.desired(dim), "{dim:?}: backend vs desired");
        assert_eq!(&held, m.programmed(dim), "{dim:?}: backend vs mirror");
    }
}

// ---- union precedence -------------------------------------------------

type Lists<'a> = (Mode, &'a [&'a str], &'a [&'a str]);

const E: Mode = Mode::Enforce;
const M: Mode = Mode::Monitor;

fn l<'a>(mode: Mode, allow: &'a [&'a str], deny: &'a [&'a str]) -> Lists<'a> {
    (mode, allow, deny)
}

#[rstest]
#[case::explicit_deny(l(E, &[], &["/etc/shadow"]), None, "/etc/shadow", Decision::Denied)]
#[case::not_denied(l(E, &[], &["/etc/shadow"]), None, "/etc/hosts", Decision::Unmatched)]
#[case::default_deny(l(E, &["/etc/hosts"], &["*"]), None, "/etc/passwd", Decision::DefaultDenied)]
#[case::own_allow_lifts_own_default_deny(l(E, &["/etc/hosts"], &["*"]), None, "/etc/hosts", Decision::Allowed)]
#[case::allow_without_default_deny(l(E, &["/etc/hosts"], &[]), None, "/etc/passwd", Decision::Unmatched)]
#[case::other_allow_lifts_default_deny(l(E, &[], &["*"]), Some(l(E, &["/etc/hosts"], &[])), "/etc/hosts", Decision::Allowed)]
#[case::other_allow_lifts_only_its_value(l(E, &[], &["*"]), Some(l(E, &["/etc/hosts"], &[])), "/etc/passwd", Decision::DefaultDenied)]
#[case::explicit_deny_beats_other_allow(l(E, &[], &["/etc/hosts"]), Some(l(E, &["/etc/hosts"], &["*"])), "/etc/hosts", Decision::Denied)]
#[case::explicit_deny_beats_own_allow(l(E, &["/etc/hosts"], &["/etc/hosts"]), None, "/etc/hosts", Decision::Denied)]
#[case::observe_never_refuses(l(M, &[], &["*"]), None, "/etc/passwd", Decision::Unmatched)]
#[case::observe_deny_is_not_a_deny(l(M, &[], &["/etc/hosts"]), Some(l(E, &["/etc/hosts"], &["*"])), "/etc/hosts", Decision::Allowed)]
#[case::observe_beside_enforce(l(M, &["/etc/hosts"], &[]), Some(l(E, &[], &["*"])), "/etc/hosts", Decision::DefaultDenied)]
fn union_precedence(
    #[case] a: Lists<'_>,
    #[case] b: Option<Lists<'_>>,
    #[case] value: &str,
    #[case] want: Decision,
) {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_pod(pod("db-1", "db", &[2]));
    assert!(m
        .upsert_policy(open_policy("a", a.0, app("web"), a.1, a.2))
        .is_clean());
    if let Some(b) = b {
        assert!(m
            .upsert_policy(open_policy("b", b.0, app("web"), b.1, b.2))
            .is_clean());
    }
    assert_eq!(open_decides(&m, 1, value), want);
    // The unselected pod is untouched by either policy.
    assert_eq!(open_decides(&m, 2, value), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn exec_is_its_own_dimension() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    let policy = OpenExecPolicy {
        id: id("p"),
        name: "p".into(),
        mode: Mode::Enforce,
        target: app("web"),
        open: None,
        exec: Some(lists(1, "exec", &["/usr/bin/curl"], &["*"])),
    };
    assert!(m.upsert_policy(policy).is_clean());
    assert!(m.open_backend().held().unwrap().is_empty());
    assert_eq!(
        m.exec_backend().decide(1, &path("/bin/sh")),
        Decision::DefaultDenied
    );
    assert_eq!(
        m.exec_backend().decide(1, &path("/usr/bin/curl")),
        Decision::Allowed
    );
    assert_eq!(open_decides(&m, 1, "/bin/sh"), Decision::Unmatched);
    assert_converged(&m);
}

// ---- policy lifecycle -------------------------------------------------

#[test]
fn create_programs_first_then_binds() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1, 2]));
    assert!(
        m.open_backend().ops().is_empty(),
        "no policy, nothing to do"
    );
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/etc/shadow"]));
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Add(id("p"), enforce(&[], &["/etc/shadow"], false)),
            FakeOp::Bind(id("p"), 1),
            FakeOp::Bind(id("p"), 2),
        ]
    );
    assert!(m.exec_backend().mutations().is_empty());
    assert_converged(&m);
}

#[test]
fn update_is_a_diff() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_policy(open_policy("p", E, app("web"), &["/a"], &["/x"]));
    m.open_backend_mut().clear_ops();

    m.upsert_policy(open_policy("p", E, app("web"), &["/b"], &["/x", "/y"]));
    let want = ProgramDiff::between(
        &Rules {
            allow: [path("/a")].into(),
            deny: [path("/x")].into(),
            default_deny: false,
        },
        &Rules {
            allow: [path("/b")].into(),
            deny: [path("/x"), path("/y")].into(),
            default_deny: false,
        },
    );
    assert_eq!(
        m.open_backend().mutations(),
        [FakeOp::Update(id("p"), want)]
    );
    assert_eq!(open_decides(&m, 1, "/y"), Decision::Denied);
    assert_converged(&m);

    // The same policy again changes nothing.
    m.open_backend_mut().clear_ops();
    m.upsert_policy(open_policy("p", E, app("web"), &["/b"], &["/x", "/y"]));
    assert!(m.open_backend().mutations().is_empty());
}

#[test]
fn update_unbinds_leavers_before_loosening_and_binds_joiners_after() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_pod(pod("api-1", "api", &[2]));
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    m.open_backend_mut().clear_ops();

    m.upsert_policy(open_policy("p", E, app("api"), &[], &["/y"]));
    let ops = m.open_backend().mutations();
    assert!(matches!(ops[0], FakeOp::Unbind(_, 1)), "{ops:?}");
    assert!(matches!(ops[1], FakeOp::Update(..)), "{ops:?}");
    assert!(matches!(ops[2], FakeOp::Bind(_, 2)), "{ops:?}");
    assert_eq!(ops.len(), 3);
    assert_converged(&m);
}

#[rstest]
#[case::no_lists(None)]
#[case::empty_lists(Some(lists(0, "open", &[], &[])))]
#[case::only_rejected_values(Some(lists(0, "open", &["relative"], &["/etc/"])))]
fn enforce_with_nothing_to_enforce_removes_the_program(#[case] open: Option<BehaviorLists>) {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["*"]));
    m.open_backend_mut().clear_ops();

    let mut p = open_policy("p", E, app("web"), &[], &[]);
    p.open = open;
    m.upsert_policy(p);
    assert_eq!(
        m.open_backend().mutations(),
        [FakeOp::Unbind(id("p"), 1), FakeOp::Remove(id("p"))]
    );
    assert_eq!(open_decides(&m, 1, "/etc/passwd"), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn monitor_with_a_behavior_observes_even_with_empty_lists() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_policy(open_policy("p", M, app("web"), &[], &[]));
    assert_eq!(
        m.open_backend().held().unwrap()[&id("p")].program,
        Program::observe()
    );
}

#[test]
fn crossing_monitor_and_enforce_rebuilds() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1]));
    m.upsert_policy(open_policy("p", M, app("web"), &[], &["/x"]));
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Add(id("p"), Program::observe()),
            FakeOp::Bind(id("p"), 1)
        ]
    );
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);

    m.open_backend_mut().clear_ops();
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Unbind(id("p"), 1),
            FakeOp::Remove(id("p")),
            FakeOp::Add(id("p"), enforce(&[], &["/x"], false)),
            FakeOp::Bind(id("p"), 1),
        ]
    );
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);

    m.open_backend_mut().clear_ops();
    m.upsert_policy(open_policy("p", M, app("web"), &[], &["/x"]));
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Unbind(id("p"), 1),
            FakeOp::Remove(id("p")),
            FakeOp::Add(id("p"), Program::observe()),
            FakeOp::Bind(id("p"), 1),
        ]
    );
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn delete_unbinds_then_removes() {
    let mut m = manager();
    m.upsert_pod(pod("web-1", "web", &[1, 2]));
    m.upsert_policy(OpenExecPolicy {
        exec: Some(lists(1, "exec", &[], &["/bin/sh"])),
        ..open_policy("p", E, app("web"), &[], &["/x"])
    });
    m.open_backend_mut().clear_ops();
    m.exec_backend_mut().clear_ops();

    assert!(m.delete_policy(&id("p")).is_empty());
    for ops in [m.open_backend().mutations(), m.exec_backend().mutations()] {
        assert_eq!(
            ops,
            [
                FakeOp::Unbind(id("p"), 1),
                FakeOp::Unbind(id("p"), 2),
                FakeOp::Remove(id("p")),
            ]
        );
    }
    assert!(m.open_backend().held().unwrap().is_empty());
    assert!(m.exec_backend().held().unwrap().is_empty());
    assert!(m.rejections(&id("p")).is_empty());
    assert_converged(&m);
}

// ---- pods -------------------------------------------------------------

#[test]
fn pods_bind_and_unbind_as_they_come_change_and_go() {
    let mut m = manager();
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);

    m.upsert_pod(pod("a", "web", &[1]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert_converged(&m);

    // A relabel out of the target unbinds; back in binds.
    m.upsert_pod(pod("a", "db", &[1]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    m.upsert_pod(pod("a", "web", &[1]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);

    // A container restarting changes the cgroups.
    m.open_backend_mut().clear_ops();
    m.upsert_pod(pod("a", "web", &[3]));
    assert_eq!(
        m.open_backend().mutations(),
        [FakeOp::Bind(id("p"), 3), FakeOp::Unbind(id("p"), 1)]
    );
    assert_eq!(m.pod_of_cgroup(3).map(|p| p.uid.as_str()), Some("a"));
    assert_converged(&m);

    m.open_backend_mut().clear_ops();
    assert!(m.delete_pod("a").is_empty());
    assert_eq!(m.open_backend().mutations(), [FakeOp::Unbind(id("p"), 3)]);
    assert_eq!(open_decides(&m, 3, "/x"), Decision::Unmatched);
    assert!(m.delete_pod("a").is_empty(), "an unknown pod is a no-op");
    assert_converged(&m);
}

#[test]
fn a_pod_binds_allows_before_default_denies_and_unbinds_them_after() {
    let mut m = manager();
    // Named so that the default-deny policy sorts first: the order must not
    // come from the names.
    m.upsert_policy(open_policy("a-deny-all", E, app("web"), &[], &["*"]));
    m.upsert_policy(open_policy("b-allow", E, app("web"), &["/etc/hosts"], &[]));
    m.open_backend_mut().clear_ops();

    m.upsert_pod(pod("web-1", "web", &[1]));
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Bind(id("b-allow"), 1),
            FakeOp::Bind(id("a-deny-all"), 1),
        ],
        "binding the default deny first would refuse /etc/hosts for a moment"
    );
    m.open_backend_mut().clear_ops();
    m.delete_pod("web-1");
    assert_eq!(
        m.open_backend().mutations(),
        [
            FakeOp::Unbind(id("a-deny-all"), 1),
            FakeOp::Unbind(id("b-allow"), 1),
        ]
    );
}

#[test]
fn namespace_labels_select() {
    let ns = LabelSelector {
        match_labels: Some(labels(&[("team", "payments")])),
        match_expressions: None,
    };
    let target = PodTarget::compile(None, Some(&ns), &FieldPath::spec()).unwrap();
    let mut m = manager();
    m.upsert_policy(open_policy("p", E, target, &[], &["/x"]));
    let mut payments = pod("a", "web", &[1]);
    payments.namespace_labels = labels(&[("team", "payments")]);
    let mut other = pod("b", "web", &[2]);
    other.namespace_labels = labels(&[("team", "search")]);
    m.upsert_pod(payments.clone());
    m.upsert_pod(other.clone());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert_eq!(open_decides(&m, 2, "/x"), Decision::Unmatched);

    // A namespace relabel reaches the manager as its pods' updates.
    payments.namespace_labels = labels(&[("team", "search")]);
    other.namespace_labels = labels(&[("team", "payments")]);
    m.upsert_pod(payments);
    m.upsert_pod(other);
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert_eq!(open_decides(&m, 2, "/x"), Decision::Denied);
    assert_converged(&m);
}

#[test]
fn a_target_that_failed_to_build_binds_nothing() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_policy(open_policy("p", E, PodTarget::nothing(), &[], &["*"]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert!(m.open_backend().held().unwrap()[&id("p")]
        .cgroups
        .is_empty());
}

// ---- rejections -------------------------------------------------------

#[rstest]
#[case::relative(&["curl"], &[], "spec.behaviors[2].open.allow", "curl", Reason::NotAbsolute)]
#[case::glob(&[], &["/etc/*"], "spec.behaviors[2].open.deny", "/etc/*", Reason::PathWildcard)]
#[case::star_in_allow(&["*"], &[], "spec.behaviors[2].open.allow", "*", Reason::StarInAllow)]
#[case::dot_dot(&[], &["/etc/../shadow"], "spec.behaviors[2].open.deny", "/etc/../shadow", Reason::DotSegment)]
fn rejections_name_field_value_and_reason(
    #[case] allow: &[&str],
    #[case] deny: &[&str],
    #[case] field: &str,
    #[case] value: &str,
    #[case] reason: Reason,
    #[values(Mode::Enforce, Mode::Monitor)] mode: Mode,
) {
    let mut m = manager();
    let mut allow = allow.to_vec();
    allow.push("/ok/allowed");
    let mut p = open_policy("p", mode, app("web"), &allow, deny);
    p.open = Some(lists(2, "open", &allow, deny));
    let outcome = m.upsert_policy(p);
    assert_eq!(outcome.rejections.len(), 1, "{:?}", outcome.rejections);
    let r = &outcome.rejections[0];
    assert_eq!((r.path.as_str(), r.value.as_str()), (field, value));
    assert_eq!(r.reason, reason);
    assert!(outcome.failures.is_empty());
    assert_eq!(m.rejections(&id("p")), &outcome.rejections[..]);
    if mode == Mode::Enforce {
        // The rest is programmed.
        let Program::Enforce(rules) = &m.open_backend().held().unwrap()[&id("p")].program else {
            panic!("not enforce")
        };
        assert!(rules.allow.contains(&path("/ok/allowed")));
        assert!(!rules.default_deny);
    }
}

#[test]
fn too_long_a_path_is_rejected_in_bytes() {
    let mut m = manager();
    let long = format!("/{}", "é".repeat(128));
    let p = open_policy("p", E, app("web"), &[], &[&long, "/x"]);
    let outcome = m.upsert_policy(p);
    assert_eq!(outcome.rejections.len(), 1);
    assert!(matches!(
        outcome.rejections[0].reason,
        Reason::TooLong { len: 257, max: 255 }
    ));
    assert_eq!(
        outcome.rejections[0].to_string().split(':').next(),
        Some("spec.behaviors[0].open.deny")
    );
}

#[test]
fn rejections_follow_the_policy() {
    let mut m = manager();
    m.upsert_policy(open_policy("p", E, app("web"), &["bad"], &["/x"]));
    assert_eq!(m.rejections(&id("p")).len(), 1);
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    assert!(m.rejections(&id("p")).is_empty());
    assert!(m.rejections(&id("nope")).is_empty());
}

// ---- backend failures -------------------------------------------------

#[test]
fn slots_full_is_reported_and_retried() {
    let mut m = manager_over(open_fake().capacity(1), exec_fake());
    m.upsert_pod(pod("a", "web", &[1]));
    assert!(m
        .upsert_policy(open_policy("p1", E, app("web"), &[], &["/x"]))
        .is_clean());
    let outcome = m.upsert_policy(open_policy("p2", E, app("web"), &[], &["/y"]));
    assert_eq!(outcome.failures.len(), 1);
    let f = &outcome.failures[0];
    assert_eq!((f.dimension, f.step), (Dimension::Open, Step::AddPolicy));
    assert!(matches!(*f.error, EnforceError::SlotsFull { slots: 1, .. }));
    assert!(f
        .to_string()
        .starts_with("open: programming the policy: open: all 1 policy slots"));
    assert_eq!(m.failures(&id("p2")).len(), 1);
    // No bind was tried for a policy that is not there.
    let p2 = id("p2");
    assert!(!m.open_backend().ops().iter().any(|op| match op {
        FakeOp::Failed(op) => matches!(**op, FakeOp::Bind(ref p, _) if *p == p2),
        FakeOp::Bind(p, _) => *p == p2,
        _ => false,
    }));
    assert_eq!(open_decides(&m, 1, "/y"), Decision::Unmatched);

    // A slot frees; the next event programs the policy that waited.
    m.delete_policy(&id("p1"));
    assert!(m.upsert_pod(pod("a", "web", &[1])).is_empty());
    assert!(m.failures(&id("p2")).is_empty());
    assert_eq!(open_decides(&m, 1, "/y"), Decision::Denied);
    assert_converged(&m);
}

#[test]
fn a_failed_add_binds_nothing_and_is_retried() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.open_backend_mut().fail_next(Call::AddPolicy);
    let outcome = m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    assert_eq!(outcome.failures.len(), 1);
    assert_eq!(outcome.failures[0].step, Step::AddPolicy);
    assert_eq!(
        m.open_backend().ops().len(),
        1,
        "{:?}",
        m.open_backend().ops()
    );
    assert!(m.programmed(Dimension::Open).is_empty());

    assert!(m.upsert_pod(pod("b", "other", &[2])).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert!(m.failures(&id("p")).is_empty());
    assert_converged(&m);
}

#[test]
fn a_failed_update_holds_back_new_cgroups() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_pod(pod("b", "api", &[2]));
    let select_both = PodTarget::everything();
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    m.open_backend_mut().fail_next(Call::UpdatePolicy);
    let outcome = m.upsert_policy(open_policy("p", E, select_both.clone(), &[], &["/y"]));
    assert_eq!(outcome.failures.len(), 1);
    assert_eq!(outcome.failures[0].step, Step::UpdatePolicy);
    // Cgroup 2 would have seen the old rules: it waits.
    assert_eq!(open_decides(&m, 2, "/x"), Decision::Unmatched);
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);

    let outcome = m.upsert_policy(open_policy("p", E, select_both, &[], &["/y"]));
    assert!(outcome.is_clean());
    assert_eq!(open_decides(&m, 2, "/y"), Decision::Denied);
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn a_failed_bind_is_reported_per_policy_and_retried() {
    let mut m = manager();
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["*"]));
    m.open_backend_mut().fail_next(Call::Bind);
    let failures = m.upsert_pod(pod("a", "web", &[1, 2]));
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].step, Step::Bind(1));
    assert_eq!(m.failures(&id("p")).len(), 1);
    // The other cgroup was bound anyway.
    assert_eq!(open_decides(&m, 2, "/x"), Decision::DefaultDenied);
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);

    assert!(m.upsert_pod(pod("z", "none", &[9])).is_empty());
    assert!(m.failures(&id("p")).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::DefaultDenied);
    assert_converged(&m);
}

#[test]
fn a_failed_remove_keeps_the_failure_until_retried() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    m.open_backend_mut().fail_next(Call::RemovePolicy);
    let failures = m.delete_policy(&id("p"));
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].step, Step::RemovePolicy);
    assert_eq!(m.failures(&id("p")).len(), 1);
    assert!(m.open_backend().held().unwrap().contains_key(&id("p")));

    assert!(m.upsert_pod(pod("a", "web", &[1])).is_empty());
    assert!(m.open_backend().held().unwrap().is_empty());
    assert!(m.failures(&id("p")).is_empty());
    assert_converged(&m);
}

#[test]
fn a_failed_unbind_stays_bound_and_is_retried() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    // Fails in the unbind pass and again in the full pass that retries it.
    m.open_backend_mut().fail_next(Call::Unbind);
    m.open_backend_mut().fail_next(Call::Unbind);
    let failures = m.upsert_pod(pod("a", "db", &[1]));
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].step, Step::Unbind(1));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied, "fails closed");
    assert!(m.delete_pod("a").is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn a_failure_retried_within_the_sweep_is_not_reported() {
    let mut m = manager();
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    m.open_backend_mut().fail_next(Call::Bind);
    assert!(m.upsert_pod(pod("a", "web", &[1])).is_empty());
    assert!(m.failures(&id("p")).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
}

#[test]
fn new_fails_when_held_state_cannot_be_read() {
    let mut open = open_fake();
    open.fail_next(Call::Held);
    assert!(OpenExecManager::new(open, exec_fake()).is_err());
}

// ---- drain ------------------------------------------------------------

#[test]
fn drain_takes_both_and_survives_one_failing() {
    let mut m = manager();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_policy(OpenExecPolicy {
        exec: Some(lists(1, "exec", &[], &["/bin/sh"])),
        ..open_policy("p", E, app("web"), &[], &["/x"])
    });
    m.upsert_policy(open_policy("watch", M, app("web"), &[], &[]));
    m.open_backend_mut().operate(1, path("/x"));
    m.open_backend_mut().operate(1, path("/ok"));
    m.exec_backend_mut().operate(1, path("/bin/sh"));
    m.exec_backend_mut().operate(1, path("/bin/ls"));

    m.open_backend_mut().fail_next(Call::Drain);
    let drained = m.drain();
    assert_eq!(drained.errors.len(), 1);
    assert_eq!(drained.errors[0].0, Behavior::Open);
    let got: Vec<_> = drained
        .observations
        .iter()
        .map(|(b, o)| (*b, o.observed.as_str(), o.decision, o.count))
        .collect();
    // Exec has no observe policy: only its refusal was counted.
    assert_eq!(got, [(Behavior::Exec, "/bin/sh", Decision::Denied, 1)]);

    // Open still holds its counts: the failed drain took nothing.
    let drained = m.drain();
    assert!(drained.errors.is_empty());
    let got: Vec<_> = drained
        .observations
        .iter()
        .map(|(b, o)| (*b, o.observed.as_str(), o.decision))
        .collect();
    assert_eq!(
        got,
        [
            (Behavior::Open, "/ok", Decision::Unmatched),
            (Behavior::Open, "/x", Decision::Denied),
        ]
    );
}

// ---- restart ----------------------------------------------------------

#[test]
fn restart_adopts_without_a_gap_and_reconcile_leaves_nothing_stale() {
    // The previous process.
    let mut before = manager();
    before.upsert_policy(OpenExecPolicy {
        exec: Some(lists(1, "exec", &[], &["/bin/sh"])),
        ..open_policy("p", E, app("web"), &[], &["/etc/shadow"])
    });
    before.upsert_policy(open_policy("gone", M, PodTarget::everything(), &[], &[]));
    for (uid, label, cg) in [
        ("a", "web", 1),
        ("b", "web", 2),
        ("c", "web", 3),
        ("d", "web", 4),
    ] {
        before.upsert_pod(pod(uid, label, &[cg]));
    }

    // It dies; its pinned maps survive.
    let open = before.open_backend().restarted();
    let exec = before.exec_backend().restarted();
    drop(before);
    let mut m = OpenExecManager::new(open, exec).unwrap();
    for cg in 1..=4 {
        assert_eq!(open_decides(&m, cg, "/etc/shadow"), Decision::Denied);
    }
    assert_eq!(m.open_backend().ops(), [FakeOp::Held]);

    // The sync begins: a (unchanged), b (relabeled while we were down).
    // c and d are not synced yet; c still exists, d is gone.
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_pod(pod("b", "db", &[2]));
    // The policy is not synced yet: left as it was.
    assert_eq!(open_decides(&m, 2, "/etc/shadow"), Decision::Denied);

    // The policy changed while we were down: a diff, never a remove.
    let outcome = m.upsert_policy(OpenExecPolicy {
        exec: Some(lists(1, "exec", &[], &["/bin/sh"])),
        ..open_policy("p", E, app("web"), &[], &["/etc/shadow", "/etc/gshadow"])
    });
    assert!(outcome.is_clean());
    assert_eq!(
        open_decides(&m, 2, "/etc/shadow"),
        Decision::Unmatched,
        "b is known not to be selected"
    );
    // Their pods are not synced: still enforced.
    assert_eq!(open_decides(&m, 3, "/etc/shadow"), Decision::Denied);
    assert_eq!(open_decides(&m, 4, "/etc/shadow"), Decision::Denied);
    m.upsert_pod(pod("c", "web", &[3]));
    for cg in [1, 3, 4] {
        assert_eq!(open_decides(&m, cg, "/etc/gshadow"), Decision::Denied);
    }
    assert_eq!(
        m.exec_backend().decide(4, &path("/bin/sh")),
        Decision::Denied
    );
    // "gone" was not upserted again, but nothing said it is gone yet.
    assert!(m.open_backend().held().unwrap().contains_key(&id("gone")));
    for ops in [m.open_backend().mutations(), m.exec_backend().mutations()] {
        assert!(
            !ops.iter()
                .any(|op| matches!(op, FakeOp::Remove(_) | FakeOp::Add(..))),
            "no gap: {ops:?}"
        );
    }

    // Synced: what is left over goes.
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert!(!m.open_backend().held().unwrap().contains_key(&id("gone")));
    assert_eq!(open_decides(&m, 4, "/etc/shadow"), Decision::Unmatched);
    assert_eq!(
        m.exec_backend().decide(4, &path("/bin/sh")),
        Decision::Unmatched
    );
    assert_eq!(open_decides(&m, 3, "/etc/shadow"), Decision::Denied);
    assert_converged(&m);
    let held = m.open_backend().held().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[&id("p")].cgroups, [1, 3].into());
}

#[test]
fn a_policy_deleted_during_adoption_goes_at_once() {
    let mut before = manager();
    before.upsert_pod(pod("a", "web", &[1]));
    before.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    let mut m = OpenExecManager::new(before.open_backend().restarted(), exec_fake()).unwrap();
    assert!(m.delete_policy(&id("p")).is_empty());
    assert!(m.open_backend().held().unwrap().is_empty());
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert_converged(&m);
}

#[test]
fn a_mode_change_during_adoption_rebuilds_and_keeps_unsynced_bindings() {
    let mut before = manager();
    before.upsert_pod(pod("a", "web", &[1]));
    before.upsert_pod(pod("b", "web", &[2]));
    before.upsert_policy(open_policy("p", M, app("web"), &[], &["/x"]));
    let mut m = OpenExecManager::new(before.open_backend().restarted(), exec_fake()).unwrap();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_policy(open_policy("p", E, app("web"), &[], &["/x"]));
    // b is not synced yet, and the rebuild kept its binding.
    assert_eq!(open_decides(&m, 2, "/x"), Decision::Denied);
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert!(m.reconcile_adopted(&BTreeSet::new()).is_empty());
    assert_eq!(open_decides(&m, 2, "/x"), Decision::Unmatched);
    assert_converged(&m);
}

#[test]
fn a_pending_policy_keeps_what_was_held_through_the_reconcile_until_it_is_evaluated() {
    let mut before = manager();
    before.upsert_pod(pod("a", "web", &[1]));
    before.upsert_policy(open_policy("data", E, app("web"), &[], &["/x"]));
    before.upsert_policy(open_policy("gone", E, app("web"), &[], &["/y"]));
    let mut m = OpenExecManager::new(before.open_backend().restarted(), exec_fake()).unwrap();
    m.upsert_pod(pod("a", "web", &[1]));
    m.upsert_pod(pod("b", "web", &[2]));
    // "data" exists but its lists are not known yet (its data is being
    // fetched); "gone" is not in the cluster any more.
    assert!(m.reconcile_adopted(&[id("data")].into()).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied, "held stands");
    assert_eq!(
        open_decides(&m, 1, "/y"),
        Decision::Unmatched,
        "not pending"
    );
    assert_converged(&m);
    // A pod event sweeps every policy: the pending one is left as it is.
    m.upsert_pod(pod("c", "web", &[3]));
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert_converged(&m);
    // Evaluated: its lists replace what was held, on every selected pod.
    assert!(m
        .upsert_policy(open_policy("data", E, app("web"), &[], &["/z"]))
        .failures
        .is_empty());
    for cg in [1, 2, 3] {
        assert_eq!(open_decides(&m, cg, "/z"), Decision::Denied);
        assert_eq!(open_decides(&m, cg, "/x"), Decision::Unmatched);
    }
    assert_converged(&m);
}

#[test]
fn a_pending_policy_deleted_goes() {
    let mut before = manager();
    before.upsert_pod(pod("a", "web", &[1]));
    before.upsert_policy(open_policy("data", E, app("web"), &[], &["/x"]));
    let mut m = OpenExecManager::new(before.open_backend().restarted(), exec_fake()).unwrap();
    m.upsert_pod(pod("a", "web", &[1]));
    assert!(m.reconcile_adopted(&[id("data")].into()).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Denied);
    assert!(m.delete_policy(&id("data")).is_empty());
    assert_eq!(open_decides(&m, 1, "/x"), Decision::Unmatched);
    assert!(m.open_backend().held().unwrap().is_empty());
    assert_converged(&m);
}

// ---- pods applied together --------------------------------------------

/// A relist's pods handed over at once converge to what the same pods
/// handed over one by one converge to, with each policy converged once.
#[test]
fn pods_applied_together_end_where_one_by_one_ends() {
    let start = || {
        let mut m = manager();
        for p in [
            open_policy("a", E, app("web"), &[], &["/etc/shadow"]),
            open_policy("b", E, app("db"), &["/data"], &["/etc/passwd"]),
            open_policy("c", M, PodTarget::everything(), &[], &["/tmp"]),
        ] {
            assert!(m.upsert_policy(p).failures.is_empty());
        }
        assert!(m.upsert_pod(pod("gone", "web", &[9])).is_empty());
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
    assert_converged(&together);
    for dim in Dimension::BOTH {
        assert_eq!(
            together.programmed(dim),
            one_by_one.programmed(dim),
            "{dim:?}"
        );
    }
    for c in [1, 2, 3, 4, 9] {
        for f in ["/etc/shadow", "/etc/passwd", "/data/x", "/tmp/y"] {
            assert_eq!(
                open_decides(&together, c, f),
                open_decides(&one_by_one, c, f),
                "cgroup {c}, {f}"
            );
        }
    }
    assert_eq!(open_decides(&together, 1, "/etc/shadow"), Decision::Denied);
    assert_eq!(
        open_decides(&together, 9, "/etc/shadow"),
        Decision::Unmatched
    );
}
