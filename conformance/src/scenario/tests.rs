//! Loading, checking and breaking scenarios.

use super::*;

const MINIMAL: &str = r#"
name: sample
description: A sample.
namespaces:
  - name: sample
pods:
  - name: web
    labels: {app: web}
setup:
  programs: [/opt/krt-conformance/sample/tool]
policies:
  - name: sample-policy
    spec:
      mode: enforce
      podSelector: {matchLabels: {app: web}}
      behaviors:
        - exec: {deny: {values: [/opt/krt-conformance/sample/tool]}}
steps:
  - exec: {pod: web, path: /opt/krt-conformance/sample/tool}
    expect: refused
    when: capable
  - connect: {pod: web, to: "127.0.0.9:80"}
    expect: dropped
  - report: {pod: web, policy: sample-policy, behavior: exec, target: /opt/krt-conformance/sample/tool, count: 1}
"#;

fn parsed(text: &str) -> Result<Scenario> {
    parse(Path::new("/repo/conformance/scenarios/sample.yaml"), text)
}

fn error_of(text: &str) -> String {
    match parsed(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_scenario_is_checked_into_closed_steps() {
    let s = parsed(MINIMAL).unwrap();
    assert_eq!(s.file, "conformance/scenarios/sample.yaml");
    assert_eq!(s.pods[0].namespace.as_deref(), Some("sample"));
    assert_eq!(s.pods[0].containers, ["app"]);
    assert_eq!(s.steps.len(), 3);
    assert!(matches!(
        &s.steps[0].kind,
        StepKind::Action { expect: Expect::Refused, errno, .. } if errno == "EPERM"
    ));
    assert_eq!(s.steps[0].when, Some(NodeClass::Capable));
    assert_eq!(s.steps[1].within, DEFAULT_WITHIN);
    // The plan a guest gets round-trips.
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<Scenario>(&json).unwrap(), s);
}

#[test]
fn errors_name_the_file_and_the_field() {
    let typo = MINIMAL.replace("expect: dropped", "expct: dropped");
    let e = error_of(&typo);
    assert!(e.starts_with("conformance/scenarios/sample.yaml: "), "{e}");
    assert!(e.contains("unknown field `expct`"), "{e}");
    assert!(e.contains("line"), "{e}");

    let e = error_of(&MINIMAL.replace("{pod: web, to:", "{pod: wbe, to:"));
    assert_eq!(
        e,
        "conformance/scenarios/sample.yaml: steps[1].connect.pod: no pod \"wbe\" (pods: web)"
    );
    let e = error_of(&MINIMAL.replace("expect: dropped", "expect: refused"));
    assert!(
        e.contains("steps[1].expect: refused does not fit connect: expect delivered or dropped"),
        "{e}"
    );
    let e = error_of(&MINIMAL.replace("name: sample\n", "name: other\n"));
    assert!(e.contains("name: \"other\" must be the file's name"), "{e}");
    let e = error_of(&MINIMAL.replace("policy: sample-policy,", "policy: nope,"));
    assert!(
        e.contains("steps[2].report.policy: no policy \"nope\""),
        "{e}"
    );
    let e = error_of(&MINIMAL.replace("count: 1}", "count: 1, absent: true}"));
    assert!(
        e.contains("steps[2].report: exactly one of count, minCount, absent"),
        "{e}"
    );
    let e = error_of(&MINIMAL.replace(
        "[/opt/krt-conformance/sample/tool]\npolicies",
        "[/usr/bin/tool]\npolicies",
    ));
    assert!(
        e.contains(
            "setup.programs[0]: \"/usr/bin/tool\" must be a file under /opt/krt-conformance/"
        ),
        "{e}"
    );
    let e = error_of(&MINIMAL.replace("mode: enforce", "mode: 3"));
    assert!(
        e.contains("policies[0].spec: not a RuntimePolicy spec"),
        "{e}"
    );
    let e =
        error_of(&MINIMAL.replace("    when: capable\n", "    when: capable\n    within: 9h\n"));
    assert!(
        e.contains("steps[0].within: \"9h\" is not a duration"),
        "{e}"
    );
    let both = MINIMAL.replace(
        "  - connect: {pod: web, to: \"127.0.0.9:80\"}",
        "  - connect: {pod: web, to: \"127.0.0.9:80\"}\n    deletePolicy: {name: sample-policy}",
    );
    assert!(error_of(&both).contains("steps[1]: one kind per step, got connect, deletePolicy"));
}

#[test]
fn names_are_unique_across_the_suite() {
    let a = parsed(MINIMAL).unwrap();
    let mut b = a.clone();
    b.file = "conformance/scenarios/b.yaml".into();
    b.namespaces[0].name = "b".into();
    let e = check_together(&[a, b]).unwrap_err().to_string();
    assert!(
        e.contains("policy \"sample-policy\" is also used by conformance/scenarios/sample.yaml"),
        "{e}"
    );
}

#[test]
fn the_committed_scenarios_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let all = load_dir(&dir).unwrap();
    assert!(all.len() >= 20, "{}", all.len());
    for s in &all {
        assert!(s.steps.iter().all(|st| st.number >= 1), "{}", s.name);
    }
}

#[test]
fn break_flips_one_expectation() {
    let mut s = parsed(MINIMAL).unwrap();
    // The first step without `when` whose expectation flips.
    let what = break_one(&mut s, None).unwrap();
    assert_eq!(what, "sample step 2: expected dropped, now delivered");
    assert!(s.steps[1].broken);
    assert!(matches!(
        s.steps[1].kind,
        StepKind::Action {
            expect: Expect::Delivered,
            ..
        }
    ));
    assert!(!s.steps[0].broken);

    let mut s = parsed(MINIMAL).unwrap();
    assert_eq!(
        break_one(&mut s, Some(3)).unwrap(),
        "sample step 3: expected a result with count 1, now no such result"
    );
    assert!(break_one(&mut s, Some(9))
        .unwrap_err()
        .to_string()
        .contains("has no step 9"));
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("2h"), None);
    assert_eq!(parse_duration("s"), None);
}

#[test]
fn real_nodes_run_every_scenario_but_those_owning_cgroups_or_the_daemon() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let all = load_dir(&dir).unwrap();
    let gaps = |class: NodeClass| -> Vec<(String, String)> {
        all.iter()
            .filter_map(|s| s.real_node_gap(class).map(|g| (s.name.clone(), g)))
            .collect()
    };
    let names =
        |g: &[(String, String)]| -> Vec<String> { g.iter().map(|(n, _)| n.clone()).collect() };
    let capable = gaps(NodeClass::Capable);
    assert_eq!(
        names(&capable),
        ["cgroup-layouts", "daemon-restart", "restricted-node"],
        "{capable:?}"
    );
    assert!(capable[0].1.contains("cgroup driver"), "{capable:?}");
    assert!(capable[1].1.contains("restarts the daemon"), "{capable:?}");
    // restricted-node restarts the daemon only on capable nodes: a real
    // restricted node runs it as it is.
    let restricted = gaps(NodeClass::Restricted);
    assert_eq!(
        names(&restricted),
        ["cgroup-layouts", "daemon-restart"],
        "{restricted:?}"
    );
    // The minimal scenario (one default pod, no restart) runs anywhere.
    assert_eq!(
        parsed(MINIMAL).unwrap().real_node_gap(NodeClass::Capable),
        None
    );
}
