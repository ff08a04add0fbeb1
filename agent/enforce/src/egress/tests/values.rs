//! Values: Services, domains, `*`.

use super::*;

pub(super) fn lists(allow: &[&str], deny: &[&str]) -> BehaviorLists {
    BehaviorLists {
        field: FieldPath::spec()
            .field("behaviors")
            .index(0)
            .field("network"),
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

pub(super) fn no_services() -> ServiceAddresses {
    ServiceAddresses::new()
}

pub(super) fn compile(
    mode: Mode,
    l: &BehaviorLists,
    services: &ServiceAddresses,
) -> CompiledNetwork {
    compile_network(
        mode,
        Some(l),
        &NameContext {
            services,
            domains: Ok(()),
        },
    )
}

pub(super) fn svc(ns: &str, name: &str) -> ServiceName {
    ServiceName::new(ns, name)
}

#[test]
fn services_resolve_to_their_addresses_and_domains_stay_names() {
    let mut services = ServiceAddresses::new();
    services.set(
        svc("default", "api"),
        Some([ip("10.96.0.10"), ip("fd00::a")].into()),
    );
    let l = lists(
        &[
            "10.0.0.0/8",
            "api.default.svc",
            "api.default.svc.cluster.local.",
            "Example.COM",
            "gone.default.svc",
        ],
        &["::1", "fd00::/8", "10.0.0.300"],
    );
    let c = compile(Mode::Enforce, &l, &services);
    assert_eq!(
        c.program,
        Some(Program::Enforce(Rules {
            allow: [
                p("10.0.0.0/8"),
                p("10.96.0.10/32"),
                p("fd00::a/128"),
                dom("example.com"),
            ]
            .into(),
            deny: [p("::1/128"), p("fd00::/8")].into(),
            default_deny: false,
        }))
    );
    assert_eq!(
        c.services,
        [svc("default", "api"), svc("default", "gone")].into()
    );
    assert_eq!(c.unresolved, [svc("default", "gone")].into());
    let shown: Vec<String> = c.rejections.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(matches!(
        c.rejections[0].reason,
        RejectReason::Invalid(Reason::BadIpv4)
    ));
    assert_eq!(c.rejections[0].path, "spec.behaviors[0].network.deny");
}

#[test]
fn domains_the_kernel_cannot_hold_or_learn_are_refused_with_their_path() {
    // The value parser bounds a name by what the kernel's name key
    // holds (the CRD's MAX_HOSTNAME_LEN is that width), so a name too
    // long for the key is refused as invalid before the backend sees
    // it; `DomainTooLong` guards the backend if the two ever differ.
    let long = format!("{}.{}.example", "a".repeat(63), "b".repeat(62));
    let c = compile(Mode::Enforce, &lists(&[&long], &["*"]), &no_services());
    assert_eq!(c.rejections.len(), 1, "{:?}", c.rejections);
    assert!(
        matches!(
            c.rejections[0].reason,
            RejectReason::Invalid(Reason::TooLong { len: 134, .. })
        ),
        "{:?}",
        c.rejections
    );
    assert_eq!(c.rejections[0].path, "spec.behaviors[0].network.allow");
    let services = no_services();
    let c = compile_network(
        Mode::Enforce,
        Some(&lists(&["ok.example", "10.0.0.1"], &[])),
        &NameContext {
            services: &services,
            domains: Err("the verifier refused it"),
        },
    );
    assert_eq!(c.program, Some(rules(&["10.0.0.1/32"], &[], false)));
    assert_eq!(
        c.rejections[0].to_string(),
        "spec.behaviors[0].network.allow: domain \"ok.example\" is not programmed: this node cannot learn domain addresses (the verifier refused it)"
    );
}

#[test]
fn star_in_deny_is_the_default_deny_beside_explicit_denies() {
    let s = no_services();
    let c = compile(Mode::Enforce, &lists(&["::1"], &["*"]), &s);
    assert_eq!(c.program, Some(rules(&["::1"], &[], true)));
    assert!(c.rejections.is_empty());
    // "*" in allow is refused; in deny beside an explicit deny it is
    // the default deny and the explicit deny is kept.
    let c = compile(Mode::Enforce, &lists(&["*"], &["*", "::1"]), &s);
    assert_eq!(c.rejections.len(), 1);
    assert_eq!(c.program, Some(rules(&[], &["::1"], true)));
    let c = compile(
        Mode::Enforce,
        &lists(&["10.50.0.0/16"], &["10.50.0.9", "*", "*"]),
        &s,
    );
    assert!(c.rejections.is_empty(), "{:?}", c.rejections);
    assert_eq!(
        c.program,
        Some(rules(&["10.50.0.0/16"], &["10.50.0.9"], true))
    );
    let c = compile(Mode::Monitor, &lists(&["::1"], &[]), &s);
    assert_eq!(c.program, Some(Program::observe()));
    // A monitor policy names its domains (either side) so their answers
    // are learned; its addresses need no naming.
    let c = compile(
        Mode::Monitor,
        &lists(&["::1", "Ok.Example"], &["bad.example", "*"]),
        &s,
    );
    assert_eq!(
        c.program,
        Some(Program::Observe(
            [dom("ok.example"), dom("bad.example")].into()
        ))
    );
    let c = compile(Mode::Enforce, &lists(&["300.1.1.1"], &[]), &s);
    assert_eq!(c.program, None, "nothing left to enforce takes nothing");
    // A Service with no address yet still holds the policy, so its
    // addresses land when they come.
    let c = compile(Mode::Enforce, &lists(&["api.prod.svc"], &[]), &s);
    assert_eq!(c.program, Some(rules(&[], &[], false)));
}
