use super::*;
use crate::compile::EvaluatedBehavior;

fn behavior(index: usize, kind: BehaviorKind, allow: &[&str], deny: &[&str]) -> EvaluatedBehavior {
    let default_deny = deny.contains(&STAR);
    EvaluatedBehavior {
        index,
        kind,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny
            .iter()
            .filter(|v| **v != STAR)
            .map(|s| s.to_string())
            .collect(),
        default_deny,
    }
}

fn result(behaviors: Vec<EvaluatedBehavior>) -> EvaluationResult {
    EvaluationResult { behaviors }
}

/// The exact-value matches of one policy's merged lists (the path kinds'
/// matching; other kinds differ only in what "matches" means).
fn exact(lists: &BehaviorLists, value: &str) -> Matches {
    Matches {
        deny: lists.explicit_denies().any(|d| d == value),
        allow: lists.allow.iter().any(|a| a == value),
        default_deny: lists.default_deny(),
    }
}

#[test]
fn an_explicit_deny_beside_a_default_deny_in_another_behavior_is_kept() {
    // Issue 33's shape: allow a /16 under a default deny, deny one address
    // of it in a second behavior of the same kind.
    let r = result(vec![
        behavior(0, BehaviorKind::Network, &["10.50.0.0/16"], &["*"]),
        behavior(1, BehaviorKind::Network, &[], &["10.50.0.9"]),
    ]);
    let lists = BehaviorLists::merge(&r, BehaviorKind::Network).unwrap();
    assert_eq!(lists.deny, ["*", "10.50.0.9"]);
    assert_eq!(lists.allow, ["10.50.0.0/16"]);
    assert!(lists.default_deny());
    assert_eq!(lists.explicit_denies().collect::<Vec<_>>(), ["10.50.0.9"]);
    assert_eq!(lists.field.as_str(), "spec.behaviors[0].network");
}

#[test]
fn the_merge_does_not_depend_on_the_order_of_behaviors() {
    let a = behavior(0, BehaviorKind::Open, &["/etc/hosts"], &["*"]);
    let b = behavior(1, BehaviorKind::Open, &["/etc/passwd"], &["/etc/hosts"]);
    let c = behavior(2, BehaviorKind::Open, &[], &["/etc/shadow", "/etc/hosts"]);
    let orders = [
        vec![a.clone(), b.clone(), c.clone()],
        vec![c.clone(), b.clone(), a.clone()],
        vec![b.clone(), a.clone(), c.clone()],
    ];
    for order in orders {
        let lists = BehaviorLists::merge(&result(order), BehaviorKind::Open).unwrap();
        for (path, want) in [
            ("/etc/hosts", Decision::Denied),
            ("/etc/passwd", Decision::Allowed),
            ("/etc/shadow", Decision::Denied),
            ("/etc/group", Decision::DefaultDenied),
        ] {
            assert_eq!(decide([exact(&lists, path)]), want, "{path}");
        }
        let mut deny: Vec<_> = lists.deny.clone();
        deny.sort();
        assert_eq!(deny, ["*", "/etc/hosts", "/etc/shadow"]);
    }
}

#[test]
fn other_kinds_are_not_merged_in() {
    let r = result(vec![
        behavior(0, BehaviorKind::Exec, &["/bin/sh"], &["*"]),
        behavior(1, BehaviorKind::Open, &[], &["/bin/sh"]),
    ]);
    let exec = BehaviorLists::merge(&r, BehaviorKind::Exec).unwrap();
    assert_eq!(exec.deny, ["*"]);
    assert_eq!(decide([exact(&exec, "/bin/sh")]), Decision::Allowed);
    assert!(BehaviorLists::merge(&r, BehaviorKind::Network).is_none());
}

#[test]
fn a_second_star_is_folded() {
    let mut b = behavior(0, BehaviorKind::Exec, &[], &["*", "/bin/sh"]);
    b.deny.push(STAR.to_string());
    let lists = BehaviorLists::merge(&result(vec![b]), BehaviorKind::Exec).unwrap();
    assert_eq!(lists.deny, ["*", "/bin/sh"]);
}

#[test]
fn the_rule_is_explicit_deny_then_allow_then_default_deny() {
    // Every combination of what one policy's lists can say about a value.
    for deny in [false, true] {
        for allow in [false, true] {
            for default_deny in [false, true] {
                let m = Matches {
                    deny,
                    allow,
                    default_deny,
                };
                let want = if deny {
                    Decision::Denied
                } else if allow {
                    Decision::Allowed
                } else if default_deny {
                    Decision::DefaultDenied
                } else {
                    Decision::Unmatched
                };
                assert_eq!(decide([m]), want, "{m:?}");
            }
        }
    }
}

#[test]
fn the_union_across_policies_is_order_independent() {
    // Every pair and triple of the eight one-policy shapes, in every order,
    // decides as the flattened union does.
    let shapes: Vec<Matches> = (0..8)
        .map(|i| Matches {
            deny: i & 1 != 0,
            allow: i & 2 != 0,
            default_deny: i & 4 != 0,
        })
        .collect();
    for a in &shapes {
        for b in &shapes {
            for c in &shapes {
                let forward = decide([*a, *b, *c]);
                assert_eq!(decide([*c, *b, *a]), forward);
                assert_eq!(decide([*b, *a, *c]), forward);
                let union = Matches {
                    deny: a.deny || b.deny || c.deny,
                    allow: a.allow || b.allow || c.allow,
                    default_deny: a.default_deny || b.default_deny || c.default_deny,
                };
                assert_eq!(decide([union]), forward);
            }
        }
    }
    assert_eq!(decide([]), Decision::Unmatched);
}

#[test]
fn a_deny_beside_a_star_wins_over_another_policys_allow() {
    // A: deny ["*", "/usr/bin/curl"]; B: allow ["/usr/bin/curl"].
    let a = BehaviorLists::merge(
        &result(vec![behavior(
            0,
            BehaviorKind::Exec,
            &[],
            &["*", "/usr/bin/curl"],
        )]),
        BehaviorKind::Exec,
    )
    .unwrap();
    let b = BehaviorLists::merge(
        &result(vec![behavior(
            0,
            BehaviorKind::Exec,
            &["/usr/bin/curl"],
            &[],
        )]),
        BehaviorKind::Exec,
    )
    .unwrap();
    let curl = [exact(&a, "/usr/bin/curl"), exact(&b, "/usr/bin/curl")];
    assert_eq!(decide(curl), Decision::Denied);
    assert_eq!(blamed(&curl), [0]);
    let wget = [exact(&a, "/usr/bin/wget"), exact(&b, "/usr/bin/wget")];
    assert_eq!(decide(wget), Decision::DefaultDenied);
    assert_eq!(blamed(&wget), [0]);
}

#[test]
fn a_refusal_is_blamed_on_the_policies_that_refused_it_only() {
    // A: deny ["*"]; B: allow curl; C: deny curl. The kernel refuses curl
    // because of C: A's default deny was lifted by B.
    let (a, b, c) = (
        Matches {
            default_deny: true,
            ..Matches::default()
        },
        Matches {
            allow: true,
            ..Matches::default()
        },
        Matches {
            deny: true,
            ..Matches::default()
        },
    );
    assert_eq!(blamed(&[a, b, c]), [2]);
    // Without C, nothing refuses and nobody is blamed.
    assert_eq!(decide([a, b]), Decision::Allowed);
    assert!(blamed(&[a, b]).is_empty());
    // Two default denies, nothing allowing: both refused it.
    assert_eq!(blamed(&[a, Matches::default(), a]), [0, 2]);
    // Two explicit denies and a default deny: the explicit ones.
    assert_eq!(blamed(&[c, a, c]), [0, 2]);
}
