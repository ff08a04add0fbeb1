use super::*;
use kyverno_runtime_api::runtimepolicy::EventSourceStatus;

fn shard(
    node: &str,
    enforce: Option<bool>,
    observe: Option<bool>,
    pods: Option<bool>,
) -> NodePolicyStatus {
    NodePolicyStatus {
        node_name: node.into(),
        enforcement_available: enforce,
        observation_available: observe,
        pods_matched: pods,
        message: None,
        ..NodePolicyStatus::default()
    }
}

fn nodes(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn find<'a>(derived: &'a [Derived], type_: &str) -> Option<&'a Derived> {
    derived.iter().find(|d| d.type_ == type_)
}

fn enforce_view<'a>(
    shards: &'a [NodePolicyStatus],
    expected: Option<&'a BTreeSet<String>>,
) -> PolicyView<'a> {
    PolicyView {
        mode: Some(RuntimePolicyMode::Enforce),
        active_behaviors: &["exec"],
        shards,
        expected_nodes: expected,
        generation: None,
    }
}

#[test]
fn one_node_that_cannot_enforce_makes_enforcement_false_and_names_it() {
    let mut restricted = shard("node-b", Some(false), None, Some(false));
    restricted.message = Some("open/exec: no BPF-LSM or fmod_ret".into());
    let shards = [
        shard("node-a", Some(true), None, Some(true)),
        restricted,
        shard("node-c", Some(true), None, Some(false)),
    ];
    let expected = nodes(&["node-a", "node-b", "node-c"]);
    let d = derive(&enforce_view(&shards, Some(&expected)));
    let e = find(&d, types::ENFORCEMENT_AVAILABLE).unwrap();
    assert_eq!(e.status, Status::False);
    assert_eq!(
        e.message,
        "unavailable on node-b (open/exec: no BPF-LSM or fmod_ret)"
    );
    assert_eq!(
        find(&d, types::PODS_MATCHED).unwrap().status,
        Status::True,
        "any-true"
    );
    let applied = find(&d, types::APPLIED).unwrap();
    assert_eq!(
        (applied.status, applied.reason.as_str()),
        (Status::False, types::ENFORCEMENT_AVAILABLE)
    );

    // The restricted node is deleted: its shard is pruned and the aggregate turns True.
    let pruned = [shards[0].clone(), shards[2].clone()];
    let expected = nodes(&["node-a", "node-c"]);
    let d = derive(&enforce_view(&pruned, Some(&expected)));
    assert_eq!(
        find(&d, types::ENFORCEMENT_AVAILABLE).unwrap().status,
        Status::True
    );
    assert_eq!(find(&d, types::APPLIED).unwrap().status, Status::True);
}

#[test]
fn a_selector_matching_nothing_reads_applied_false_with_pods_matched() {
    let shards = [
        shard("a", Some(true), None, Some(false)),
        shard("b", Some(true), None, Some(false)),
    ];
    let expected = nodes(&["a", "b"]);
    let d = derive(&enforce_view(&shards, Some(&expected)));
    let pods = find(&d, types::PODS_MATCHED).unwrap();
    assert_eq!(
        (pods.status, pods.reason.as_str()),
        (Status::False, "NoMatchingPods")
    );
    let applied = find(&d, types::APPLIED).unwrap();
    assert_eq!(
        (applied.status, applied.reason.as_str()),
        (Status::False, types::PODS_MATCHED)
    );
}

#[test]
fn an_attachment_failure_is_reported_ahead_of_a_selector_matching_nothing() {
    let shards = [shard("a", Some(false), None, Some(false))];
    let expected = nodes(&["a"]);
    let applied = derive(&enforce_view(&shards, Some(&expected)))
        .pop()
        .unwrap();
    assert_eq!(applied.reason, types::ENFORCEMENT_AVAILABLE);
}

#[test]
fn an_expected_node_that_has_not_reported_reads_unknown_not_true() {
    let shards = [shard("a", Some(true), None, Some(true))];
    let expected = nodes(&["a", "b"]);
    let d = derive(&enforce_view(&shards, Some(&expected)));
    let e = find(&d, types::ENFORCEMENT_AVAILABLE).unwrap();
    assert_eq!(
        (e.status, e.message.as_str()),
        (Status::Unknown, "not reported yet by b")
    );
    assert_eq!(find(&d, types::APPLIED).unwrap().status, Status::Unknown);
    // PodsMatched is any-true: one node with a match is enough.
    assert_eq!(find(&d, types::PODS_MATCHED).unwrap().status, Status::True);
}

#[test]
fn unknown_placement_reads_unknown() {
    let shards = [shard("a", Some(true), None, Some(true))];
    let d = derive(&enforce_view(&shards, None));
    assert_eq!(
        find(&d, types::ENFORCEMENT_AVAILABLE).unwrap().status,
        Status::Unknown
    );
}

#[test]
fn a_type_nobody_reports_is_absent() {
    let shards = [shard("a", Some(true), None, Some(true))];
    let expected = nodes(&["a"]);
    let d = derive(&enforce_view(&shards, Some(&expected)));
    assert!(find(&d, types::OBSERVATION_AVAILABLE).is_none());
    assert!(
        find(&d, types::EVENT_SOURCES_AVAILABLE).is_none(),
        "enforce policies do not depend on sources"
    );
}

fn sources(list: &[(&str, EventSourceState)]) -> Vec<EventSourceStatus> {
    list.iter()
        .map(|(n, s)| EventSourceStatus {
            name: n.to_string(),
            state: *s,
            reason: (*s == EventSourceState::Failed).then(|| "ReaderFailed".into()),
        })
        .collect()
}

#[test]
fn monitor_policies_depend_on_the_sources_of_their_active_behaviors() {
    let expected = nodes(&["a"]);
    let mut s = shard("a", None, Some(true), Some(true));
    s.event_sources = sources(&[
        ("openexec-observe", EventSourceState::Available),
        ("exec-trace", EventSourceState::Failed),
    ]);
    let shards = [s];
    let view = PolicyView {
        mode: Some(RuntimePolicyMode::Monitor),
        active_behaviors: &["exec"],
        shards: &shards,
        expected_nodes: Some(&expected),
        generation: None,
    };
    let d = derive(&view);
    let es = find(&d, types::EVENT_SOURCES_AVAILABLE).unwrap();
    assert_eq!(
        (es.status, es.message.as_str()),
        (Status::False, "failed: exec-trace on a (ReaderFailed)")
    );
    assert_eq!(
        find(&d, types::APPLIED).unwrap().reason,
        types::EVENT_SOURCES_AVAILABLE
    );

    // An open-only policy does not need the exec tracer.
    let view = PolicyView {
        active_behaviors: &["open"],
        ..view
    };
    let d = derive(&view);
    assert_eq!(
        find(&d, types::EVENT_SOURCES_AVAILABLE).unwrap().status,
        Status::True
    );
    assert_eq!(find(&d, types::APPLIED).unwrap().status, Status::True);

    // A starting source is Unknown; a policy with no active behavior needs none.
    let mut s = shard("a", None, Some(true), Some(true));
    s.event_sources = sources(&[("dnsquery", EventSourceState::Starting)]);
    let shards = [s];
    let view = PolicyView {
        mode: Some(RuntimePolicyMode::Monitor),
        active_behaviors: &["dns"],
        shards: &shards,
        expected_nodes: Some(&expected),
        generation: None,
    };
    assert_eq!(
        find(&derive(&view), types::EVENT_SOURCES_AVAILABLE)
            .unwrap()
            .status,
        Status::Unknown
    );
    let view = PolicyView {
        active_behaviors: &[],
        ..view
    };
    assert!(find(&derive(&view), types::EVENT_SOURCES_AVAILABLE).is_none());
}

#[test]
fn a_node_the_daemon_departed_no_longer_decides_event_sources() {
    let mut a = shard("a", None, Some(true), Some(true));
    a.event_sources = sources(&[("egress-observe", EventSourceState::Available)]);
    let mut b = shard("b", None, Some(true), Some(false));
    b.event_sources = sources(&[("egress-observe", EventSourceState::Failed)]);
    let shards = [a, b];
    let view = |expected| PolicyView {
        mode: Some(RuntimePolicyMode::Monitor),
        active_behaviors: &["network"],
        shards: &shards,
        expected_nodes: expected,
        generation: None,
    };
    // While b's daemon is placed there, its failed source decides.
    let both = nodes(&["a", "b"]);
    let d = derive(&view(Some(&both)));
    let es = find(&d, types::EVENT_SOURCES_AVAILABLE).unwrap();
    assert_eq!(
        (es.status, es.message.as_str()),
        (Status::False, "failed: egress-observe on b (ReaderFailed)")
    );
    // Placement completed without b (the Node still exists, its shard
    // stays): b's last report no longer counts.
    let only_a = nodes(&["a"]);
    let d = derive(&view(Some(&only_a)));
    let es = find(&d, types::EVENT_SOURCES_AVAILABLE).unwrap();
    assert_eq!(
        (es.status, es.reason.as_str()),
        (Status::True, "SourcesAvailable"),
        "{es:?}"
    );
    assert_eq!(find(&d, types::APPLIED).unwrap().status, Status::True);
    // Placement unknown: nothing is known to have departed.
    let d = derive(&view(None));
    assert_eq!(
        find(&d, types::EVENT_SOURCES_AVAILABLE).unwrap().status,
        Status::False
    );
}

#[test]
fn a_spec_without_mode_is_not_applied() {
    let view = PolicyView {
        mode: None,
        active_behaviors: &[],
        shards: &[],
        expected_nodes: None,
        generation: None,
    };
    let applied = derive(&view).pop().unwrap();
    assert_eq!(
        (applied.status, applied.reason.as_str()),
        (Status::False, "NoMode")
    );
}

#[test]
fn compile_failures_are_recorded_directly() {
    let d = compile_failed("spec.behaviors[0].exec.deny.expression: expression has type dyn");
    assert_eq!(
        (d.type_, d.status, d.reason.as_str()),
        (types::APPLIED, Status::False, types::COMPILE_FAILED)
    );
}

fn time(s: &str) -> Time {
    Time(s.parse().unwrap())
}

#[test]
fn merging_keeps_transition_times_and_drops_stale_types() {
    let old = Condition {
        type_: types::APPLIED.into(),
        status: "True".into(),
        reason: "Applied".into(),
        message: "old".into(),
        last_transition_time: time("2026-01-01T00:00:00Z"),
        observed_generation: None,
    };
    let stale = Condition {
        type_: types::OBSERVATION_AVAILABLE.into(),
        ..old.clone()
    };
    let spec_level = Condition {
        type_: types::TARGETS_VALID.into(),
        ..old.clone()
    };
    let now = time("2026-06-01T00:00:00Z");
    let same = Derived {
        type_: types::APPLIED,
        status: Status::True,
        reason: "Applied".into(),
        message: "new".into(),
    };
    let merged = merge_conditions(
        &[old.clone(), stale],
        std::slice::from_ref(&spec_level),
        std::slice::from_ref(&same),
        &now,
        Some(7),
    );
    assert_eq!(merged.len(), 2, "the stale ObservationAvailable is gone");
    assert_eq!(
        (merged[0].type_.as_str(), merged[0].observed_generation),
        (types::TARGETS_VALID, None),
        "spec-level conditions keep their own observedGeneration"
    );
    assert_eq!(
        merged[0].last_transition_time, now,
        "a new spec-level type starts at the writer's time, not its author's"
    );
    assert_eq!(
        merged[1].last_transition_time, old.last_transition_time,
        "same status keeps its transition time"
    );
    assert_eq!(merged[1].observed_generation, Some(7));
    assert_eq!(
        changed(std::slice::from_ref(&old), &merged).len(),
        2,
        "the message changed, and TargetsValid is new"
    );

    let flipped = Derived {
        status: Status::False,
        ..same
    };
    let merged = merge_conditions(&[old], &[], &[flipped], &now, None);
    assert_eq!(merged[0].last_transition_time, now);
}

/// Issue 38, point 2: each node put its own evaluation time in the
/// spec-level conditions' `lastTransitionTime`, so nodes writing the same
/// answer overwrote one another every flush.
#[test]
fn a_spec_level_condition_keeps_the_stored_transition_time_whoever_writes_it() {
    let stored = Condition {
        type_: types::TARGETS_VALID.into(),
        status: "True".into(),
        reason: "Valid".into(),
        message: "every target value is programmed".into(),
        last_transition_time: time("2026-01-01T00:00:00Z"),
        observed_generation: Some(3),
    };
    let from_another_node = Condition {
        last_transition_time: time("2026-03-04T05:06:07.123456789Z"),
        ..stored.clone()
    };
    let now = time("2026-06-01T00:00:00.5Z");
    let merged = merge_conditions(
        std::slice::from_ref(&stored),
        &[from_another_node],
        &[],
        &now,
        Some(3),
    );
    assert_eq!(merged, std::slice::from_ref(&stored), "nothing to write");
    let turned_false = Condition {
        status: "False".into(),
        ..stored.clone()
    };
    let merged = merge_conditions(&[stored], &[turned_false], &[], &now, Some(3));
    assert_eq!(
        merged[0].last_transition_time,
        time("2026-06-01T00:00:00Z"),
        "a transition takes the writer's time at the stored precision"
    );
}

#[test]
fn times_compare_at_the_precision_the_api_server_stores() {
    let t = time("2026-03-04T05:06:07.999999999Z");
    assert_eq!(stored_precision(&t), time("2026-03-04T05:06:07Z"));
    let json = serde_json::to_string(&t).unwrap();
    let back: Time = serde_json::from_str(&json).unwrap();
    assert_eq!(back, stored_precision(&t), "what a write then a read gives");
}

fn at(mut s: NodePolicyStatus, generation: i64) -> NodePolicyStatus {
    s.observed_generation = Some(generation);
    s
}

/// Issue 38, point 1: the aggregate combined the new spec with shards
/// built for the old one, so `Applied=True` described a spec no node had
/// applied.
#[test]
fn only_shards_at_the_current_generation_decide() {
    let expected = nodes(&["a", "b"]);
    let shards = [
        at(shard("a", Some(true), None, Some(true)), 5),
        at(shard("b", Some(true), None, Some(true)), 4),
    ];
    let view = PolicyView {
        generation: Some(5),
        ..enforce_view(&shards, Some(&expected))
    };
    let d = derive(&view);
    let e = find(&d, types::ENFORCEMENT_AVAILABLE).unwrap();
    assert_eq!(
        (e.status, e.message.as_str()),
        (Status::Unknown, "generation 5 not applied yet by b (at 4)")
    );
    let applied = find(&d, types::APPLIED).unwrap();
    assert_eq!(
        (applied.status, applied.reason.as_str()),
        (Status::Unknown, types::ENFORCEMENT_AVAILABLE)
    );

    // b catches up.
    let shards = [shards[0].clone(), at(shards[1].clone(), 5)];
    let view = PolicyView {
        generation: Some(5),
        ..enforce_view(&shards, Some(&expected))
    };
    assert_eq!(
        find(&derive(&view), types::APPLIED).unwrap().status,
        Status::True
    );
}

#[test]
fn a_mode_switch_is_not_applied_by_shards_of_the_old_mode() {
    // Generation 6 switched enforce to monitor; both nodes still report
    // generation 5 (enforcement available).
    let expected = nodes(&["a", "b"]);
    let shards = [
        at(shard("a", Some(true), None, Some(true)), 5),
        at(shard("b", Some(true), None, Some(true)), 5),
    ];
    let view = PolicyView {
        mode: Some(RuntimePolicyMode::Monitor),
        active_behaviors: &["open"],
        shards: &shards,
        expected_nodes: Some(&expected),
        generation: Some(6),
    };
    let d = derive(&view);
    assert!(
        find(&d, types::ENFORCEMENT_AVAILABLE).is_none(),
        "no shard of generation 6 speaks of enforcement: {d:?}"
    );
    let applied = find(&d, types::APPLIED).unwrap();
    assert_eq!(
        (applied.status, applied.message.as_str()),
        (
            Status::Unknown,
            "ObservationAvailable has not been reported by any node at generation 6"
        )
    );
}

/// Issue 38, point 4: a node that no longer runs the daemon but still
/// exists kept deciding the aggregate with its last report.
#[test]
fn a_departed_nodes_last_report_decides_nothing() {
    let mut b = shard("b", Some(false), None, Some(true));
    b.message = Some("open/exec: no BPF-LSM".into());
    let shards = [shard("a", Some(true), None, Some(false)), b];
    let only_a = nodes(&["a"]);
    let d = derive(&enforce_view(&shards, Some(&only_a)));
    assert_eq!(
        find(&d, types::ENFORCEMENT_AVAILABLE).unwrap().status,
        Status::True,
        "{d:?}"
    );
    let pods = find(&d, types::PODS_MATCHED).unwrap();
    assert_eq!(
        (pods.status, pods.reason.as_str()),
        (Status::False, "NoMatchingPods"),
        "b's matches went with its daemon"
    );
    // While b is placed, it decides.
    let both = nodes(&["a", "b"]);
    let d = derive(&enforce_view(&shards, Some(&both)));
    assert_eq!(
        find(&d, types::ENFORCEMENT_AVAILABLE).unwrap().status,
        Status::False
    );
}
