//! The Rust value parsers agree with the CRD's admission rules on every
//! manifest in `agent/api/tests/admission/` (each states what the API
//! server answers: `# expect: accept|reject`, then `# message:` lines).
//!
//! Every literal under `spec.behaviors[*].<kind>.{allow,deny}.values` is
//! run through its kind's parser, and every such list through
//! `check_star`. A manifest is classified by its messages:
//!
//! - `accept`: every value parses and every list passes the star check;
//! - `reject` naming a value's path (`...values[i]`): that value is
//!   refused, with an error naming the same path, and every other value
//!   parses (so the refusal is that value's);
//! - `reject` quoting a value (`"v" is not ...`, the value rules' message)
//!   without a path: every occurrence of `v` is refused, the rest parse;
//! - `reject` with a star rule's message: some list fails `check_star`
//!   with that rule, and every value parses but the one another message
//!   quotes, if any (the server reports a bad value beside a misplaced
//!   `"*"` too: one error does not hide the other);
//! - any other `reject` (selectors, counts, unknown fields, intervals,
//!   variables, mode): not a value rule, so every value found parses and
//!   every list passes the star check. Lists under misspelled fields
//!   (`behaviours`, `value`) are not found and so not checked.

// A panic in a test helper is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_policy::values::{
    check_star, parse_dns, parse_network, parse_path, parse_protocol, BehaviorKind, FieldPath,
    Reason, RuleSide, ValueError,
};
use serde_yaml::Value;
use std::path::{Path, PathBuf};

/// One literal allow or deny list of a manifest.
struct List {
    path: FieldPath,
    kind: BehaviorKind,
    side: RuleSide,
    values: Vec<String>,
}

/// How a manifest's expectation constrains the values.
#[derive(Debug, PartialEq)]
enum Expectation {
    Accept,
    ValueAtPath(String),
    QuotedValue(String),
    Star(Reason, Option<String>),
    OtherRule,
}

struct Manifest {
    name: String,
    expectation: Expectation,
    lists: Vec<List>,
}

fn admission_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests/admission")
}

fn parse_value(kind: BehaviorKind, value: &str, path: &FieldPath) -> Result<(), ValueError> {
    match kind {
        BehaviorKind::Network => parse_network(value, path).map(drop),
        BehaviorKind::Exec | BehaviorKind::Open => parse_path(value, path).map(drop),
        BehaviorKind::Protocol => parse_protocol(value, path).map(drop),
        BehaviorKind::Dns => parse_dns(value, path).map(drop),
    }
}

fn classify(name: &str, expect: &str, messages: &[String]) -> Expectation {
    match expect {
        "accept" => return Expectation::Accept,
        "reject" => {}
        other => panic!("{name}: unknown expectation {other:?}"),
    }
    let quoted = messages
        .iter()
        .filter(|m| !m.starts_with("\"*\""))
        .find_map(|m| {
            m.strip_prefix('"')
                .and_then(|m| m.split_once("\" is not "))
                .map(|(v, _)| v.to_string())
        });
    for m in messages {
        if m.starts_with("\"*\" in a dns deny list must be the only value") {
            return Expectation::Star(Reason::StarNotAlone, quoted);
        }
        if m.starts_with("\"*\" is only meaningful in deny") {
            return Expectation::Star(Reason::StarInAllow, quoted);
        }
    }
    if let Some(path) = messages
        .iter()
        .find(|m| m.starts_with("spec.") && m.contains(".values[") && m.ends_with(']'))
    {
        return Expectation::ValueAtPath(path.clone());
    }
    if let Some(value) = quoted {
        return Expectation::QuotedValue(value);
    }
    Expectation::OtherRule
}

fn lists(doc: &Value) -> Vec<List> {
    let mut out = Vec::new();
    let Some(behaviors) = doc["spec"]["behaviors"].as_sequence() else {
        return out;
    };
    for (b, behavior) in behaviors.iter().enumerate() {
        for kind in BehaviorKind::ALL {
            for side in [RuleSide::Allow, RuleSide::Deny] {
                let Some(values) = behavior[kind.as_str()][side.as_str()]["values"].as_sequence()
                else {
                    continue;
                };
                let values = values
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .unwrap_or_else(|| panic!("a non-string value {v:?}"))
                            .to_string()
                    })
                    .collect();
                out.push(List {
                    path: FieldPath::values(b, kind, side),
                    kind,
                    side,
                    values,
                });
            }
        }
    }
    out
}

fn manifests() -> Vec<Manifest> {
    let mut files: Vec<_> = std::fs::read_dir(admission_dir())
        .expect("the admission manifests")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(file).unwrap();
            let mut expect = None;
            let mut messages = Vec::new();
            for line in text.lines().take_while(|l| l.starts_with('#')) {
                if let Some(e) = line.strip_prefix("# expect:") {
                    expect = Some(e.trim().to_string());
                } else if let Some(m) = line.strip_prefix("# message:") {
                    messages.push(m.trim().to_string());
                }
            }
            let expect = expect.unwrap_or_else(|| panic!("{name}: no `# expect:` line"));
            let doc: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            Manifest {
                expectation: classify(&name, &expect, &messages),
                lists: lists(&doc),
                name,
            }
        })
        .collect()
}

/// Every value parses except those `refused` selects, which must not; and
/// returns the refusals.
fn check_values(m: &Manifest, refused: impl Fn(&str, &str) -> bool) -> Vec<ValueError> {
    let mut errors = Vec::new();
    for list in &m.lists {
        for (i, value) in list.values.iter().enumerate() {
            let path = list.path.index(i);
            let got = parse_value(list.kind, value, &path);
            if refused(path.as_str(), value) {
                let e = got.expect_err(&format!(
                    "{}: {path} = {value:?} is refused by the API server but parses",
                    m.name
                ));
                assert_eq!(e.path, path.as_str(), "{}", m.name);
                assert_eq!(e.value, *value, "{}", m.name);
                errors.push(e);
            } else if let Err(e) = got {
                panic!("{}: {path} should parse: {e}", m.name);
            }
        }
    }
    errors
}

fn star_errors(m: &Manifest) -> Vec<ValueError> {
    m.lists
        .iter()
        .filter_map(|l| check_star(l.kind, &l.values, &l.path, l.side).err())
        .collect()
}

#[test]
fn the_parsers_agree_with_every_admission_manifest() {
    let manifests = manifests();
    assert!(
        manifests.len() >= 50,
        "found only {} manifests",
        manifests.len()
    );
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for m in &manifests {
        let label = match &m.expectation {
            Expectation::Accept => {
                check_values(m, |_, _| false);
                assert_eq!(star_errors(m), [], "{}", m.name);
                "accept"
            }
            Expectation::ValueAtPath(at) => {
                let refused = check_values(m, |path, _| path == at);
                assert_eq!(refused.len(), 1, "{}: no literal at {at}", m.name);
                eprintln!("{}: {}", m.name, refused[0]);
                "reject: value at path"
            }
            Expectation::QuotedValue(v) => {
                let refused = check_values(m, |_, value| value == v);
                assert!(!refused.is_empty(), "{}: no literal {v:?}", m.name);
                eprintln!("{}: {}", m.name, refused[0]);
                "reject: quoted value"
            }
            Expectation::Star(reason, quoted) => {
                let refused = check_values(m, |_, value| Some(value) == quoted.as_deref());
                assert_eq!(refused.is_empty(), quoted.is_none(), "{}", m.name);
                let errors = star_errors(m);
                assert!(
                    errors.iter().any(|e| e.reason == *reason),
                    "{}: check_star passes, want {reason:?}",
                    m.name
                );
                eprintln!("{}: {}", m.name, errors[0]);
                "reject: star rule"
            }
            Expectation::OtherRule => {
                check_values(m, |_, _| false);
                assert_eq!(star_errors(m), [], "{}", m.name);
                "reject: not a value rule"
            }
        };
        *counts.entry(label).or_default() += 1;
    }
    eprintln!("{counts:#?}");
    // Each classification is exercised, so none of them passes vacuously.
    for label in [
        "accept",
        "reject: value at path",
        "reject: quoted value",
        "reject: star rule",
        "reject: not a value rule",
    ] {
        assert!(
            counts.get(label).is_some_and(|&n| n > 0),
            "no manifest is {label:?}"
        );
    }
}

#[test]
fn the_classification_reads_the_messages_as_intended() {
    let by_name = |name: &str| {
        manifests()
            .into_iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .expectation
    };
    assert_eq!(
        by_name("20-network-bad-cidr.yaml"),
        Expectation::ValueAtPath("spec.behaviors[0].network.deny.values[1]".into())
    );
    assert_eq!(
        by_name("24-protocol-unclassified.yaml"),
        Expectation::QuotedValue("unclassified".into())
    );
    assert_eq!(
        by_name("39-star-with-other-deny-values.yaml"),
        Expectation::Accept
    );
    assert_eq!(
        by_name("79-dns-star-with-other-deny-values.yaml"),
        Expectation::Star(Reason::StarNotAlone, None)
    );
    assert_eq!(
        by_name("78-star-and-bad-values.yaml"),
        Expectation::Star(Reason::StarInAllow, Some("curl".into()))
    );
    assert_eq!(
        by_name("40-star-in-allow.yaml"),
        Expectation::Star(Reason::StarInAllow, None)
    );
    assert_eq!(by_name("51-values-65.yaml"), Expectation::OtherRule);
    assert_eq!(by_name("22-network-every-shape.yaml"), Expectation::Accept);
}
