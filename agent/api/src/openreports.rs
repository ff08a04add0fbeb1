//! OpenReports `Report` and `ClusterReport` (`openreports.io/v1alpha1`).
//!
//! These are the types the reporter writes: a namespaced `Report` (short
//! name `reps`) for findings about workloads in one namespace, and a
//! cluster-scoped `ClusterReport` (short name `creps`) for findings with no
//! namespace. They mirror the upstream Go types of
//! `github.com/openreports/reports-api` field for field, and the CRDs
//! generated from them ([`report_crd`], [`cluster_report_crd`]) are checked
//! against the upstream CRD manifests by `tests/openreports_compat.rs`.
//!
//! # No `spec`
//!
//! Upstream reports are not spec/status shaped: `source`, `scope`,
//! `scopeSelector`, `configuration`, `summary` and `results` sit at the top
//! level of the object, beside `metadata`. kube's `#[kube(no_spec)]` models
//! exactly that: the derived struct ([`ReportFields`], [`ClusterReportFields`])
//! is still held in the root's `spec` field on the Rust side (so
//! `Report::new(name, fields)`, `HasSpec` and `kube::Api<Report>` work as for
//! any custom resource), but it is `#[serde(flatten)]`ed, so its properties
//! sit at the root both on the wire and in the generated schema:
//!
//! ```
//! use kyverno_runtime_api::openreports::{Report, ReportFields};
//!
//! let report = Report::new("pod-web", ReportFields {
//!     source: Some("kyverno-runtime".into()),
//!     ..ReportFields::default()
//! });
//! let json = serde_json::to_value(&report)?;
//! assert_eq!(json["apiVersion"], "openreports.io/v1alpha1");
//! assert_eq!(json["source"], "kyverno-runtime");
//! assert!(json.get("spec").is_none());
//! # Ok::<(), serde_json::Error>(())
//! ```
//!
//! # Schema fidelity
//!
//! Where the schemas that schemars and k8s-openapi produce differ from what
//! controller-gen wrote upstream, the fields override them, so the generated
//! CRDs validate what upstream validates and merge as upstream merges:
//!
//! - Go `int` counts are `type: integer` without a `format`; the Rust side
//!   uses `i64`, Go's `int` on 64-bit platforms.
//! - `ObjectReference` and `LabelSelector` are atomic maps
//!   (`x-kubernetes-map-type: atomic`), and a selector's `matchExpressions`
//!   and `values` atomic lists, as in upstream's schema (k8s-openapi's
//!   schemas leave these markers out).
//! - Optional fields are not `nullable` and no field has a schema `default`,
//!   as upstream (see `match_upstream`): an unset option is left out, never
//!   written as `null`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, CustomResourceExt};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The top-level fields of a namespaced OpenReports [`Report`].
///
/// Held in `Report::spec`, but serialized at the root of the object (see the
/// [module docs](self)). Every field is optional, as upstream.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "openreports.io",
    version = "v1alpha1",
    kind = "Report",
    plural = "reports",
    singular = "report",
    shortname = "reps",
    namespaced,
    no_spec,
    derive = "PartialEq",
    derive = "Default",
    doc = "Policy results about resources in one namespace (OpenReports).",
    // The JSON form of `printcolumn`: the nested form trips clippy's
    // duplicated_attributes on the repeated `type_ = "integer"`.
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".scope.kind","priority":1}"#,
    printcolumn = r#"{"name":"Name","type":"string","jsonPath":".scope.name","priority":1}"#,
    printcolumn = r#"{"name":"Pass","type":"integer","jsonPath":".summary.pass"}"#,
    printcolumn = r#"{"name":"Fail","type":"integer","jsonPath":".summary.fail"}"#,
    printcolumn = r#"{"name":"Warn","type":"integer","jsonPath":".summary.warn"}"#,
    printcolumn = r#"{"name":"Error","type":"integer","jsonPath":".summary.error"}"#,
    printcolumn = r#"{"name":"Skip","type":"integer","jsonPath":".summary.skip"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = match_upstream)]
pub struct ReportFields {
    /// The engine or scanner that produced every result in this report,
    /// unless a result names its own source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,

    /// The one object the results are about (a Pod, a Deployment, a Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_object_reference")]
    pub scope: Option<ObjectReference>,

    /// Selects the objects the results are about, when there are several;
    /// set at most one of `scope` and `scopeSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_label_selector")]
    pub scope_selector: Option<LabelSelector>,

    /// The contract between the writer and the readers of this report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ReportConfiguration>,

    /// Counts of the results by outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ReportSummary>,

    /// One entry per policy (and rule) evaluated against the scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<ReportResult>>,
}

/// The top-level fields of a cluster-scoped OpenReports [`ClusterReport`].
///
/// The same fields as [`ReportFields`] (the derive needs one struct per
/// kind); [`From`] converts between the two.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "openreports.io",
    version = "v1alpha1",
    kind = "ClusterReport",
    plural = "clusterreports",
    singular = "clusterreport",
    shortname = "creps",
    no_spec,
    derive = "PartialEq",
    derive = "Default",
    doc = "Policy results about cluster-scoped resources (OpenReports).",
    // The JSON form of `printcolumn`: the nested form trips clippy's
    // duplicated_attributes on the repeated `type_ = "integer"`.
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".scope.kind","priority":1}"#,
    printcolumn = r#"{"name":"Name","type":"string","jsonPath":".scope.name","priority":1}"#,
    printcolumn = r#"{"name":"Pass","type":"integer","jsonPath":".summary.pass"}"#,
    printcolumn = r#"{"name":"Fail","type":"integer","jsonPath":".summary.fail"}"#,
    printcolumn = r#"{"name":"Warn","type":"integer","jsonPath":".summary.warn"}"#,
    printcolumn = r#"{"name":"Error","type":"integer","jsonPath":".summary.error"}"#,
    printcolumn = r#"{"name":"Skip","type":"integer","jsonPath":".summary.skip"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = match_upstream)]
pub struct ClusterReportFields {
    /// The engine or scanner that produced every result in this report,
    /// unless a result names its own source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,

    /// The one object the results are about (a Pod, a Deployment, a Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_object_reference")]
    pub scope: Option<ObjectReference>,

    /// Selects the objects the results are about, when there are several;
    /// set at most one of `scope` and `scopeSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_label_selector")]
    pub scope_selector: Option<LabelSelector>,

    /// The contract between the writer and the readers of this report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ReportConfiguration>,

    /// Counts of the results by outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ReportSummary>,

    /// One entry per policy (and rule) evaluated against the scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<ReportResult>>,
}

impl From<ReportFields> for ClusterReportFields {
    fn from(f: ReportFields) -> Self {
        let ReportFields {
            source,
            scope,
            scope_selector,
            configuration,
            summary,
            results,
        } = f;
        Self {
            source,
            scope,
            scope_selector,
            configuration,
            summary,
            results,
        }
    }
}

impl From<ClusterReportFields> for ReportFields {
    fn from(f: ClusterReportFields) -> Self {
        let ClusterReportFields {
            source,
            scope,
            scope_selector,
            configuration,
            summary,
            results,
        } = f;
        Self {
            source,
            scope,
            scope_selector,
            configuration,
            summary,
            results,
        }
    }
}

/// The contract between a report's writer and its readers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportConfiguration {
    /// What the writer left out of the report.
    pub limits: Limits,
}

/// Bounds a writer promises to keep to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// At most this many results are in the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "go_int")]
    pub max_results: Option<i64>,

    /// Only results with one of these outcomes are in the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_filter: Option<Vec<PolicyResult>>,
}

/// Counts of a report's results by outcome.
///
/// The counts are always written, zeros included (as the Go type does, so
/// `kubectl get reps` shows `0`, not `<none>`), and a missing count reads
/// as zero.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    /// Results whose policy requirements were met.
    #[serde(default)]
    #[schemars(schema_with = "go_int")]
    pub pass: i64,
    /// Results whose policy requirements were not met.
    #[serde(default)]
    #[schemars(schema_with = "go_int")]
    pub fail: i64,
    /// Results of unscored policies whose requirements were not met.
    #[serde(default)]
    #[schemars(schema_with = "go_int")]
    pub warn: i64,
    /// Results whose policy could not be evaluated.
    #[serde(default)]
    #[schemars(schema_with = "go_int")]
    pub error: i64,
    /// Results whose policy was not selected for evaluation.
    #[serde(default)]
    #[schemars(schema_with = "go_int")]
    pub skip: i64,
}

impl ReportSummary {
    /// Adds one result with the given outcome to the counts.
    pub fn count(&mut self, result: PolicyResult) {
        let slot = match result {
            PolicyResult::Pass => &mut self.pass,
            PolicyResult::Fail => &mut self.fail,
            PolicyResult::Warn => &mut self.warn,
            PolicyResult::Error => &mut self.error,
            PolicyResult::Skip => &mut self.skip,
        };
        *slot = slot.saturating_add(1);
    }
}

/// One policy (or rule) evaluated against a report's scope or subjects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportResult {
    /// The engine or scanner that produced this result; overrides the
    /// report's own `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,

    /// The policy's name or identifier. The only required field.
    pub policy: String,

    /// The rule's name or identifier within the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,

    /// A grouping of policies, free-form (for example `Runtime Security`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,

    /// How critical a failing result is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,

    /// When the result was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<Timestamp>,

    /// The outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<PolicyResult>,

    /// Whether the result counts toward a score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored: Option<bool>,

    /// The objects checked (Go field `Subjects`, JSON `resources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_object_reference_list")]
    pub resources: Option<Vec<ObjectReference>>,

    /// Selects the objects checked, instead of listing them in
    /// `resources`; with neither, the result is about the report's scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "atomic_label_selector")]
    pub resource_selector: Option<LabelSelector>,

    /// A short human-readable explanation (Go field `Description`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Free-form details, string to string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<BTreeMap<String, String>>,
}

/// The outcome of a policy result.
///
/// Also the values of a status filter: upstream's `Result` and
/// `StatusFilter` share them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyResult {
    /// The policy's requirements are met.
    Pass,
    /// The policy's requirements are not met.
    Fail,
    /// The requirements of an unscored policy are not met.
    Warn,
    /// The policy could not be evaluated.
    Error,
    /// The policy was not selected for evaluation.
    Skip,
}

/// How critical a result is.
///
/// Ordered from least to most critical, `Info < Low < Medium < High <
/// Critical`, as upstream's `SeverityLevel`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Informational.
    Info,
    /// Low.
    Low,
    /// Medium.
    Medium,
    /// High.
    High,
    /// Critical.
    Critical,
}

/// A point in time as seconds and nanoseconds since the Unix epoch (the
/// apimachinery `metav1.Timestamp`, an object, not an RFC 3339 string).
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Timestamp {
    /// Whole seconds since 1970-01-01T00:00:00Z (negative before it).
    pub seconds: i64,
    /// Nanoseconds past `seconds`, from 0 to 999999999 (also before the
    /// epoch).
    pub nanos: i32,
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        let (after, d) = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (true, d),
            Err(e) => (false, e.duration()),
        };
        let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        // subsec_nanos() < 1e9, so it fits an i32.
        let nanos = i32::try_from(d.subsec_nanos()).unwrap_or(0);
        match (after, nanos) {
            (true, _) => Self {
                seconds: secs,
                nanos,
            },
            (false, 0) => Self {
                seconds: -secs,
                nanos: 0,
            },
            (false, _) => Self {
                seconds: -secs - 1,
                nanos: 1_000_000_000 - nanos,
            },
        }
    }
}

/// The CRD of [`Report`] (`reports.openreports.io`), as upstream's.
pub fn report_crd() -> CustomResourceDefinition {
    Report::crd()
}

/// The CRD of [`ClusterReport`] (`clusterreports.openreports.io`), as
/// upstream's.
pub fn cluster_report_crd() -> CustomResourceDefinition {
    ClusterReport::crd()
}

// --- schema overrides -------------------------------------------------------
//
// A field with `schema_with` needs `#[serde(default)]` to stay optional:
// schemars cannot see the `Option` through the override and would list the
// field as `required`. (Every optional field carries it, for uniformity.)

/// A Go `int`: `type: integer` with no `format` (schemars would say int64).
fn go_int(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({ "type": "integer" })
}

/// `ObjectReference` as an atomic map, as upstream marks it.
fn atomic_object_reference(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<ObjectReference>();
    schema.insert("x-kubernetes-map-type".into(), "atomic".into());
    schema
}

/// A list of atomic `ObjectReference`s.
fn atomic_object_reference_list(generator: &mut SchemaGenerator) -> Schema {
    let items = atomic_object_reference(generator);
    schemars::json_schema!({ "type": "array", "items": items })
}

/// `LabelSelector` as an atomic map with atomic lists, as upstream marks it.
fn atomic_label_selector(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<LabelSelector>();
    schema.insert("x-kubernetes-map-type".into(), "atomic".into());
    if let Some(exprs) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("matchExpressions"))
    {
        set_atomic_list(exprs);
        if let Some(values) = exprs
            .get_mut("items")
            .and_then(|i| i.get_mut("properties"))
            .and_then(|p| p.get_mut("values"))
        {
            set_atomic_list(values);
        }
    }
    schema
}

fn set_atomic_list(list: &mut Value) {
    if let Some(obj) = list.as_object_mut() {
        obj.insert("x-kubernetes-list-type".into(), "atomic".into());
    }
}

/// Rewrites a derived schema into the shape controller-gen gives upstream's.
///
/// Applied to the fields of each kind, so it sees every schema below the
/// root, inlined. Two things differ from what schemars derives:
///
/// - An `Option<T>` field is `T` or `null` (`type: [T, "null"]`, or `anyOf`
///   with a `null` branch), which kube then marks `nullable: true`.
///   Upstream's schema declares nothing nullable, and we never write a
///   `null` (unset options are skipped), so the `null` alternative is
///   dropped: an optional field is one that is not `required`, as upstream.
/// - A `#[serde(default)]` field carries its `default` value. Upstream sets
///   no defaults, and a schema default would make the API server fill in
///   fields a writer left out, so defaults are dropped. (Reading still
///   defaults: that is serde's, not the server's.)
fn match_upstream(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut() {
        rewrite(obj);
    }
}

fn rewrite(schema: &mut serde_json::Map<String, Value>) {
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            schema.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(branches)) = schema.get_mut("anyOf") {
        branches.retain(|b| b.get("type").and_then(Value::as_str) != Some("null"));
        if let [Value::Object(only)] = branches.as_slice() {
            let only = only.clone();
            schema.remove("anyOf");
            for (k, v) in only {
                // The field's own keywords (its description) win over the type's.
                schema.entry(k).or_insert(v);
            }
        }
    }
    schema.remove("nullable");
    schema.remove("default");

    let subschemas = schema.iter_mut().flat_map(|(k, v)| -> Vec<&mut Value> {
        match (k.as_str(), v) {
            ("properties", Value::Object(props)) => props.values_mut().collect(),
            ("items" | "additionalProperties", v) => vec![v],
            ("anyOf" | "oneOf" | "allOf", Value::Array(branches)) => branches.iter_mut().collect(),
            _ => vec![],
        }
    });
    for sub in subschemas {
        if let Value::Object(obj) = sub {
            rewrite(obj);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamp_from_system_time_keeps_nanos_non_negative() {
        let after = UNIX_EPOCH + Duration::new(5, 250);
        assert_eq!(
            Timestamp::from(after),
            Timestamp {
                seconds: 5,
                nanos: 250
            }
        );
        let before = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(
            Timestamp::from(before),
            Timestamp {
                seconds: -2,
                nanos: 750_000_000
            }
        );
        let whole = UNIX_EPOCH - Duration::from_secs(3);
        assert_eq!(
            Timestamp::from(whole),
            Timestamp {
                seconds: -3,
                nanos: 0
            }
        );
    }

    #[test]
    fn summary_counts_each_outcome() {
        let mut s = ReportSummary::default();
        for r in [
            PolicyResult::Pass,
            PolicyResult::Fail,
            PolicyResult::Fail,
            PolicyResult::Skip,
        ] {
            s.count(r);
        }
        assert_eq!(
            s,
            ReportSummary {
                pass: 1,
                fail: 2,
                warn: 0,
                error: 0,
                skip: 1
            }
        );
    }

    #[test]
    fn severity_orders_from_info_to_critical() {
        assert!(Severity::Info < Severity::Low);
        assert!(Severity::High < Severity::Critical);
    }
}
