//! The OpenReports types against upstream.
//!
//! The CRDs generated from our types are compared, structurally, with the
//! upstream CRD manifests in `shared/reference/openreports/` (beside the
//! repository, so `../../../shared/` from this crate): names, scope, printer
//! columns, and every schema keyword at every path except documentation.
//! The only differences tolerated are listed in [`ALLOWED`], each with its
//! reason. The types' wire format is checked by round trips.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource as _;
use kyverno_runtime_api::openreports::{
    cluster_report_crd, report_crd, ClusterReport, PolicyResult, Report, ReportFields,
    ReportResult, ReportSummary, Severity, Timestamp,
};
use serde_json::{json, Value};

mod every_field;
use every_field::every_field;

// --- the reference ----------------------------------------------------------

/// Where the upstream manifests are: `shared/` sits beside the repository.
fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/openreports")
}

fn upstream(file: &str) -> anyhow::Result<Value> {
    let path = reference_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the upstream CRD {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

// --- the structural diff ----------------------------------------------------

/// One difference between upstream's manifest and ours.
#[derive(Debug, Clone, PartialEq)]
struct Diff {
    /// Segments joined by `/`; a schema property is one segment,
    /// `properties.<name>`, so it never reads as a keyword.
    path: String,
    /// Upstream's value, `None` where upstream has nothing.
    upstream: Option<Value>,
    /// Ours, `None` where we have nothing.
    ours: Option<Value>,
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<Value>| match v {
            None => "(absent)".to_string(),
            Some(v) => v.to_string(),
        };
        write!(
            f,
            "{}: upstream {}, ours {}",
            self.path,
            show(&self.upstream),
            show(&self.ours)
        )
    }
}

/// Keywords whose arrays are sets: order carries no meaning.
const SET_KEYWORDS: [&str; 4] = ["required", "enum", "shortNames", "categories"];

/// Every difference between `upstream` and `ours`, recursively.
fn diff(upstream: &Value, ours: &Value) -> Vec<Diff> {
    let mut out = Vec::new();
    walk(&mut Vec::new(), Some(upstream), Some(ours), &mut out);
    out
}

fn walk(
    path: &mut Vec<String>,
    upstream: Option<&Value>,
    ours: Option<&Value>,
    out: &mut Vec<Diff>,
) {
    let mut report = |path: &[String], upstream: Option<&Value>, ours: Option<&Value>| {
        out.push(Diff {
            path: path.join("/"),
            upstream: upstream.cloned(),
            ours: ours.cloned(),
        })
    };
    match (upstream, ours) {
        (None, None) => {}
        (Some(Value::Object(u)), Some(Value::Object(o))) => {
            let keys: BTreeSet<&String> = u.keys().chain(o.keys()).collect();
            for key in keys {
                match (key.as_str(), u.get(key), o.get(key)) {
                    ("properties", Some(Value::Object(up)), Some(Value::Object(op))) => {
                        let names: BTreeSet<&String> = up.keys().chain(op.keys()).collect();
                        for name in names {
                            path.push(format!("properties.{name}"));
                            walk(path, up.get(name), op.get(name), out);
                            path.pop();
                        }
                    }
                    (_, u, o) => {
                        path.push(key.clone());
                        walk(path, u, o, out);
                        path.pop();
                    }
                }
            }
        }
        (Some(Value::Array(u)), Some(Value::Array(o)))
            if path
                .last()
                .is_some_and(|k| SET_KEYWORDS.contains(&k.as_str())) =>
        {
            // Report each missing or extra member on its own.
            for v in u.iter().filter(|v| !o.contains(v)) {
                report(path, Some(v), None);
            }
            for v in o.iter().filter(|v| !u.contains(v)) {
                report(path, None, Some(v));
            }
        }
        (Some(Value::Array(u)), Some(Value::Array(o))) => {
            for i in 0..u.len().max(o.len()) {
                path.push(format!("[{i}]"));
                walk(path, u.get(i), o.get(i), out);
                path.pop();
            }
        }
        (u, o) if u == o => {}
        (u, o) => report(path, u, o),
    }
}

/// A difference from upstream made on purpose.
struct Allowed {
    /// `/`-separated segments; `*` matches one segment, `**` any number.
    path: &'static str,
    why: &'static str,
}

const SCHEMA: &str = "spec/versions/[0]/schema/openAPIV3Schema";

/// The deliberate differences, for both kinds. Every entry must still be
/// needed: one that matches nothing fails the test, so the list stays true.
const ALLOWED: &[Allowed] = &[
    Allowed {
        path: "spec/versions/[0]/schema/openAPIV3Schema/**/description",
        why: "documentation, in our own words: upstream's text is not copied",
    },
    Allowed {
        path: "spec/versions/[0]/schema/openAPIV3Schema/title",
        why: "schemars names the root schema; an annotation, not validation",
    },
    Allowed {
        path: "spec/versions/[0]/schema/openAPIV3Schema/properties.apiVersion",
        why: "kube leaves out the fields every object has; the API server \
              validates apiVersion, kind and metadata itself and never prunes them",
    },
    Allowed {
        path: "spec/versions/[0]/schema/openAPIV3Schema/properties.kind",
        why: "as apiVersion",
    },
    Allowed {
        path: "spec/versions/[0]/schema/openAPIV3Schema/properties.metadata",
        why: "as apiVersion (upstream's is a bare `type: object`)",
    },
    Allowed {
        path: "metadata/annotations",
        why: "controller-gen stamps its own version; ours comes from kube",
    },
    Allowed {
        path: "spec/names/listKind",
        why: "kube leaves it out and the API server defaults it to `<kind>List`, \
              upstream's value (checked in assert_matches_upstream)",
    },
    Allowed {
        path: "spec/versions/[0]/subresources",
        why: "upstream writes `{}`, kube nothing: either way no status or scale subresource",
    },
];

fn glob_match(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (None, None) => true,
        (Some((&"**", rest)), _) => {
            glob_match(rest, path) || (!path.is_empty() && glob_match(pattern, &path[1..]))
        }
        (Some((p, prest)), Some((s, srest))) => (*p == "*" || p == s) && glob_match(prest, srest),
        _ => false,
    }
}

fn allowed_by(entry: &Allowed, d: &Diff) -> bool {
    let pattern: Vec<&str> = entry.path.split('/').collect();
    let path: Vec<&str> = d.path.split('/').collect();
    glob_match(&pattern, &path)
}

/// Fails with every difference not in [`ALLOWED`], and every entry of
/// [`ALLOWED`] that no difference needs.
fn assert_matches_upstream(ours: &CustomResourceDefinition, file: &str) -> anyhow::Result<()> {
    let upstream = upstream(file)?;
    let ours = serde_json::to_value(ours)?;

    // The one allowed difference with a condition: listKind may be left
    // to the API server only because its default is upstream's value.
    let kind = upstream.pointer("/spec/names/kind").and_then(Value::as_str);
    let list_kind = upstream
        .pointer("/spec/names/listKind")
        .and_then(Value::as_str);
    assert_eq!(
        list_kind.map(str::to_owned),
        kind.map(|k| format!("{k}List")),
        "{file}: upstream's listKind is not the API server's default"
    );

    let diffs = diff(&upstream, &ours);
    let unexpected: Vec<String> = diffs
        .iter()
        .filter(|d| !ALLOWED.iter().any(|a| allowed_by(a, d)))
        .map(ToString::to_string)
        .collect();
    let unused: Vec<String> = ALLOWED
        .iter()
        .filter(|a| !diffs.iter().any(|d| allowed_by(a, d)))
        .map(|a| format!("{} ({})", a.path, a.why))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{file}: {} difference(s) from upstream:\n  {}",
        unexpected.len(),
        unexpected.join("\n  ")
    );
    assert!(
        unused.is_empty(),
        "{file}: allowed differences that no longer occur:\n  {}",
        unused.join("\n  ")
    );
    Ok(())
}

#[test]
fn report_crd_matches_upstream() -> anyhow::Result<()> {
    assert_matches_upstream(&report_crd(), "openreports.io_reports.yaml")
}

#[test]
fn cluster_report_crd_matches_upstream() -> anyhow::Result<()> {
    assert_matches_upstream(&cluster_report_crd(), "openreports.io_clusterreports.yaml")
}

#[test]
fn report_crd_is_the_derived_crd() {
    use kube::CustomResourceExt as _;
    assert_eq!(report_crd(), Report::crd());
    assert_eq!(cluster_report_crd(), ClusterReport::crd());
}

#[test]
fn resource_names_match_the_crds() {
    assert_eq!(Report::api_version(&()), "openreports.io/v1alpha1");
    assert_eq!(Report::plural(&()), "reports");
    assert_eq!(ClusterReport::kind(&()), "ClusterReport");
    assert_eq!(ClusterReport::plural(&()), "clusterreports");
}

/// The diff must see what it is meant to see, or an empty list proves
/// nothing.
#[test]
fn diff_reports_each_kind_of_difference() {
    let upstream = json!({
        "type": "object",
        "required": ["a", "b"],
        "properties": {
            "a": { "type": "integer", "format": "int32", "description": "up" },
            "b": { "type": "string", "enum": ["x", "y"] },
            "gone": { "type": "string" },
            "list": { "type": "array", "items": { "type": "string" } },
        },
    });
    let ours = json!({
        "type": "object",
        "required": ["b", "a"],
        "properties": {
            "a": { "type": "integer", "description": "ours" },
            "b": { "type": "string", "enum": ["y", "z"] },
            "new": { "type": "boolean" },
            "list": { "type": "array", "items": { "type": "integer" } },
        },
    });
    let got: Vec<String> = diff(&upstream, &ours)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            r#"properties.a/description: upstream "up", ours "ours""#,
            r#"properties.a/format: upstream "int32", ours (absent)"#,
            r#"properties.b/enum: upstream "x", ours (absent)"#,
            r#"properties.b/enum: upstream (absent), ours "z""#,
            r#"properties.gone: upstream {"type":"string"}, ours (absent)"#,
            r#"properties.list/items/type: upstream "string", ours "integer""#,
            r#"properties.new: upstream (absent), ours {"type":"boolean"}"#,
        ]
    );
    let description = Diff {
        path: format!("{SCHEMA}/properties.results/items/description"),
        upstream: None,
        ours: None,
    };
    let property_named_description = Diff {
        path: format!("{SCHEMA}/properties.description"),
        upstream: None,
        ours: None,
    };
    assert!(allowed_by(&ALLOWED[0], &description));
    assert!(!ALLOWED
        .iter()
        .any(|a| allowed_by(a, &property_named_description)));
}

// --- the wire format --------------------------------------------------------

/// Schema paths (below the root) that `value` leaves unset: with none,
/// the value exercises every field of the schema.
fn unset_fields(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            match value.get(name) {
                None | Some(Value::Null) => out.push(format!("{path}.{name}")),
                Some(v) => unset_fields(sub, v, &format!("{path}.{name}"), out),
            }
        }
    }
    if let (Some(items), Some(values)) = (schema.get("items"), value.as_array()) {
        if values.is_empty() {
            out.push(format!("{path}[]"));
        }
        for v in values {
            unset_fields(items, v, &format!("{path}[]"), out);
        }
    }
    if let (Some(_), Some(map)) = (schema.get("additionalProperties"), value.as_object()) {
        if map.is_empty() {
            out.push(format!("{path}{{}}"));
        }
    }
}

fn schema_of(crd: &CustomResourceDefinition) -> anyhow::Result<Value> {
    let version = crd.spec.versions.first().context("a CRD version")?;
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    Ok(serde_json::to_value(schema.context("a schema")?)?)
}

#[test]
fn report_with_every_field_round_trips() -> anyhow::Result<()> {
    let mut report = Report::new("pod-web-0", every_field());
    report.metadata = ObjectMeta {
        name: Some("pod-web-0".into()),
        namespace: Some("shop".into()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".into(),
            "kyverno-runtime".into(),
        )])),
        ..ObjectMeta::default()
    };

    let json = serde_json::to_value(&report)?;
    let mut unset = Vec::new();
    unset_fields(&schema_of(&report_crd())?, &json, "", &mut unset);
    assert!(unset.is_empty(), "fields left unset: {unset:?}");

    // Not spec-shaped: the fields sit beside metadata.
    assert_eq!(json["apiVersion"], "openreports.io/v1alpha1");
    assert_eq!(json["kind"], "Report");
    assert!(json.get("spec").is_none(), "{json}");
    assert_eq!(
        json["results"][0]["timestamp"],
        json!({"seconds": 1_700_000_000, "nanos": 123_456_789})
    );
    assert_eq!(json["results"][0]["severity"], "high");

    let back: Report = serde_json::from_value(json)?;
    assert_eq!(back, report);
    Ok(())
}

#[test]
fn cluster_report_with_every_field_round_trips() -> anyhow::Result<()> {
    let report = ClusterReport::new("node-a", every_field().into());

    let json = serde_json::to_value(&report)?;
    let mut unset = Vec::new();
    unset_fields(&schema_of(&cluster_report_crd())?, &json, "", &mut unset);
    assert!(unset.is_empty(), "fields left unset: {unset:?}");
    assert_eq!(json["kind"], "ClusterReport");
    assert!(json.get("spec").is_none(), "{json}");

    let back: ClusterReport = serde_json::from_value(json)?;
    assert_eq!(back, report);
    assert_eq!(ReportFields::from(back.spec), every_field());
    Ok(())
}

#[test]
fn unset_fields_are_left_out() -> anyhow::Result<()> {
    let json = serde_json::to_value(Report::new("empty", ReportFields::default()))?;
    assert_eq!(
        json,
        json!({
            "apiVersion": "openreports.io/v1alpha1",
            "kind": "Report",
            "metadata": { "name": "empty" },
        })
    );
    let result = serde_json::to_value(ReportResult {
        policy: "p".into(),
        ..ReportResult::default()
    })?;
    assert_eq!(result, json!({ "policy": "p" }));
    Ok(())
}

/// A report as the Go types serialize it: `source` always written, even
/// empty; counts always written; a zero timestamp rather than none.
#[test]
fn reads_a_report_as_the_go_types_write_it() -> anyhow::Result<()> {
    let report: Report = serde_json::from_value(json!({
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "Report",
        "metadata": { "name": "r", "namespace": "shop", "creationTimestamp": "2025-01-02T03:04:05Z" },
        "source": "",
        "summary": { "pass": 0, "fail": 1, "warn": 0, "error": 0, "skip": 0 },
        "configuration": { "limits": { "maxResults": 0 } },
        "results": [{
            "source": "",
            "policy": "require-labels",
            "result": "fail",
            "severity": "critical",
            "timestamp": { "seconds": 0, "nanos": 0 },
            "properties": { "k": "v" },
        }],
    }))?;
    assert_eq!(report.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(report.spec.summary.map(|s| s.fail), Some(1));
    let result = &report.spec.results.as_deref().unwrap_or_default()[0];
    assert_eq!(result.result, Some(PolicyResult::Fail));
    assert_eq!(result.severity, Some(Severity::Critical));
    assert_eq!(result.timestamp, Some(Timestamp::default()));

    // A summary with counts left out reads as zeros.
    let summary: ReportSummary = serde_json::from_value(json!({ "fail": 2 }))?;
    assert_eq!(
        summary,
        ReportSummary {
            fail: 2,
            ..ReportSummary::default()
        }
    );
    Ok(())
}

#[test]
fn values_outside_upstream_enums_are_rejected() {
    for bad in [
        json!({ "policy": "p", "result": "PASS" }),
        json!({ "policy": "p", "severity": "urgent" }),
    ] {
        assert!(
            serde_json::from_value::<ReportResult>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    assert!(
        serde_json::from_value::<ReportResult>(json!({ "rule": "r" })).is_err(),
        "policy is required"
    );
}
