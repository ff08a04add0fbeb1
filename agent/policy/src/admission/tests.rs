//! The review of RuntimePolicies against the generated CRD: each refusal
//! of the issue (#24 §2) and what the API server does with nulls,
//! defaults and unknown fields (each case measured against kube-apiserver
//! 1.37 with `kubectl apply --dry-run=server`).

use super::*;
use serde_json::json;

fn admission() -> Admission {
    Admission::runtime_policy().unwrap_or_else(|e| panic!("the CRD reads: {e}"))
}

fn policy(spec: Json) -> Json {
    json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1",
        "kind": "RuntimePolicy",
        "metadata": {"name": "p"},
        "spec": spec,
    })
}

fn errors(object: Json) -> Vec<String> {
    admission()
        .review(&object)
        .errors
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_valid_policy_is_accepted_and_defaulted() {
    let review = admission().review(&policy(json!({
        "podSelector": {"matchLabels": {"app": "web"}},
        "evaluationInterval": "30s",
        "variables": [{"name": "shells", "expression": "['/bin/sh']"}],
        "behaviors": [
            {"exec": {"deny": {"values": ["/bin/sh"], "expression": "variables.shells"}}},
            {"network": {"allow": {"values": ["10.0.0.0/8", "example.com"]}, "deny": {"values": ["*"]}}},
        ],
    })));
    assert!(review.accepted(), "{:?}", review.errors);
    let object = review.object.unwrap_or_default();
    assert_eq!(object["spec"]["mode"], "monitor");
}

#[test]
fn each_refusal_of_the_issue_is_found_with_its_path() {
    let cases: &[(Json, &str)] = &[
        (json!({"podSelecter": {}}), r#"unknown field "spec.podSelecter""#),
        (json!({"behaviours": []}), r#"unknown field "spec.behaviours""#),
        (
            json!({"behaviors": [{"exec": {"deny": {"values": ["/a"]}}, "open": {}}]}),
            "spec.behaviors[0]: Invalid value: exactly one of network, exec, open, protocol, or dns must be specified",
        ),
        (
            json!({"mode": "enforce"}),
            "spec: Invalid value: an enforce-mode policy must state the pods it applies to",
        ),
        (
            json!({"behaviors": [{"exec": {"deny": {"values": (0..65).map(|i| format!("/b/{i}")).collect::<Vec<_>>()}}}]}),
            "spec.behaviors[0].exec.deny.values: Too many: 65: must have at most 64 items",
        ),
        (json!({"evaluationInterval": "-5s"}), r#"not "-5s""#),
        (json!({"evaluationInterval": "0s"}), r#"not "0s""#),
        (json!({"evaluationInterval": "banana"}), r#"not "banana""#),
        (json!({"evaluationInterval": "1ns"}), r#"not "1ns""#),
        (
            json!({"variables": [{"name": "a-b", "expression": "['x']"}]}),
            "spec.variables[0].name: Invalid value: \"a-b\": a variable name must be a CEL identifier",
        ),
        (
            json!({"mode": 3}),
            r#"spec.mode: Invalid value: "integer": spec.mode in body must be of type string: "integer""#,
        ),
        (
            json!({"mode": "enforced"}),
            r#"spec.mode: Unsupported value: "enforced": supported values: "monitor", "enforce""#,
        ),
        (
            json!({"variables": [{"name": "a", "expression": "['x']"}, {"name": "a", "expression": "['y']"}]}),
            r#"spec.variables[1]: Duplicate value: {"name":"a"}"#,
        ),
    ];
    for (spec, want) in cases {
        let got = errors(policy(spec.clone()));
        assert!(
            got.iter().any(|e| e.contains(want)),
            "{spec}: want {want:?}, got {got:#?}"
        );
    }
}

#[test]
fn nulls_and_missing_fields_as_the_server_treats_them() {
    // A non-nullable field without a default: null is as if absent.
    assert_eq!(
        errors(policy(json!({"evaluationInterval": null}))),
        Vec::<String>::new()
    );
    // A nullable one stays null, and a rule's has() is false for it; an
    // enum without null refuses it.
    assert_eq!(
        errors(policy(json!({"podSelector": null}))),
        Vec::<String>::new()
    );
    let got = errors(policy(json!({"mode": null})));
    assert_eq!(
        got[0],
        r#"spec.mode: Unsupported value: null: supported values: "monitor", "enforce""#
    );
    let got = errors(policy(json!({"mode": "enforce", "podSelector": null})));
    assert!(
        got.iter()
            .any(|e| e.contains("must state the pods it applies to")),
        "{got:?}"
    );
    // A null item fails its type, and the rules do not run.
    let got = errors(policy(json!({"behaviors": [null]})));
    assert_eq!(got, [
        r#"spec.behaviors[0]: Invalid value: "null": spec.behaviors[0] in body must be of type object: "null""#,
        "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
    ]);
    // spec: null is spec absent.
    let got = errors(policy(Json::Null));
    assert_eq!(got[0], "spec: Required value");
    // Status cannot be set on create: its types do not matter, its
    // unknown fields still do (strict decoding comes first).
    let mut p = policy(json!({}));
    p["status"] = json!({"nodes": 3});
    assert_eq!(errors(p.clone()), Vec::<String>::new());
    p["status"] = json!({"foo": 1});
    assert_eq!(errors(p), [r#"unknown field "status.foo""#]);
}

#[test]
fn type_metadata_and_the_object_itself() {
    let mut p = policy(json!({}));
    p["kind"] = json!("RuntimePolicyy");
    assert_eq!(
        errors(p),
        [r#"kind: Invalid value: "RuntimePolicyy": must be RuntimePolicy"#]
    );
    let mut p = policy(json!({}));
    p["apiVersion"] = json!("runtime.nirmata.io/v1");
    assert!(errors(p)[0].starts_with("apiVersion: Invalid value"));
    let mut p = policy(json!({}));
    p["metadata"] = json!({"name": "X_y", "foo": 1, "labels": {"a b": "c"}});
    let got = errors(p);
    assert!(
        got.contains(&r#"unknown field "metadata.foo""#.to_string()),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|e| e.starts_with(r#"metadata.name: Invalid value: "X_y""#)),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|e| e.starts_with(r#"metadata.labels: Invalid value: "a b""#)),
        "{got:?}"
    );
    let mut p = policy(json!({}));
    p["metadata"] = json!({});
    assert!(errors(p)[0].starts_with("metadata.name: Required value"));
    assert!(errors(json!([]))[0].contains("not an object"));
}
