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
    );
    assert_eq!(merged.len(), 2, "the stale ObservationAvailable is gone");
    assert_eq!(merged[0], spec_level, "spec-level conditions are verbatim");
    assert_eq!(
        merged[1].last_transition_time, old.last_transition_time,
        "same status keeps its transition time"
    );
    assert_eq!(
        changed(std::slice::from_ref(&old), &merged).len(),
        2,
        "the message changed, and TargetsValid is new"
    );

    let flipped = Derived {
        status: Status::False,
        ..same
    };
    let merged = merge_conditions(&[old], &[], &[flipped], &now);
    assert_eq!(merged[0].last_transition_time, now);
}
