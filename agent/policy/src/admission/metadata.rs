//! `metadata`: the ObjectMeta every resource has, decoded and validated as
//! the API server does on create (`GetObjectMetaWithOptions` under strict
//! field validation, then `ValidateObjectMetaAccessor` with
//! `NameIsDNSSubdomain`, as for every custom resource).
//!
//! ObjectMeta is Kubernetes' own type, not the CRD's, so its shape is
//! declared here once, in the same schema form the CRD's is read from, and
//! walked by the same code. Go's decoder takes `null` for any field as its
//! zero value, hence every node is nullable. Not checked: the syntax of
//! the timestamps and of `managedFields`, which the server overwrites or
//! rejects on its own terms.

use super::path::FieldPath;
use super::schema::{self, Schema};
use super::{ErrorKind, FieldError, SetupError};
use serde_json::{json, Value as Json};
use std::sync::LazyLock;

/// ObjectMeta's shape (k8s.io/apimachinery/pkg/apis/meta/v1).
fn object_meta_schema() -> Json {
    let string = json!({"type": "string", "nullable": true});
    let integer = json!({"type": "integer", "nullable": true});
    let boolean = json!({"type": "boolean", "nullable": true});
    let string_map =
        json!({"type": "object", "nullable": true, "additionalProperties": string.clone()});
    json!({
        "type": "object",
        "nullable": true,
        "properties": {
            "name": string, "generateName": string, "namespace": string, "selfLink": string,
            "uid": string, "resourceVersion": string, "creationTimestamp": string,
            "deletionTimestamp": string, "generation": integer,
            "deletionGracePeriodSeconds": integer,
            "labels": string_map, "annotations": string_map,
            "finalizers": {"type": "array", "nullable": true, "items": string},
            "ownerReferences": {"type": "array", "nullable": true, "items": {
                "type": "object", "nullable": true, "properties": {
                    "apiVersion": string, "kind": string, "name": string, "uid": string,
                    "controller": boolean, "blockOwnerDeletion": boolean,
                }
            }},
            "managedFields": {"type": "array", "nullable": true, "items": {
                "type": "object", "nullable": true, "properties": {
                    "manager": string, "operation": string, "apiVersion": string, "time": string,
                    "fieldsType": string, "subresource": string,
                    "fieldsV1": {"type": "object", "nullable": true,
                                 "x-kubernetes-preserve-unknown-fields": true},
                }
            }},
        }
    })
}

static OBJECT_META: LazyLock<Result<Schema, SetupError>> =
    LazyLock::new(|| Schema::read(&object_meta_schema(), "metadata", false));

/// Decodes `metadata` (unknown fields are removed and returned as paths;
/// a value of the wrong type is an error, as Go's decoder refuses it).
pub(crate) fn decode(metadata: &mut Json, unknown: &mut Vec<String>) -> Vec<FieldError> {
    let schema = match &*OBJECT_META {
        Ok(s) => s,
        Err(e) => return vec![FieldPath::of(&["metadata"]).error(ErrorKind::Decode(e.to_string()))],
    };
    let mut path = FieldPath::of(&["metadata"]);
    if !(metadata.is_object() || metadata.is_null()) {
        return vec![path.error(ErrorKind::Decode(format!(
            "cannot decode a {} as ObjectMeta",
            schema::json_type(metadata)
        )))];
    }
    let mut found = Vec::new();
    schema::prune_under(metadata, schema, &mut path, &mut found);
    found.sort();
    unknown.extend(found);
    let mut errs = Vec::new();
    schema::validate(metadata, schema, &mut path, &mut errs);
    errs.into_iter()
        .map(|e| match e.kind {
            ErrorKind::TypeInvalid { expected, found } => FieldError {
                kind: ErrorKind::Decode(format!("cannot decode a {found} as {expected}")),
                ..e
            },
            _ => e,
        })
        .collect()
}

/// The value of a string field of `metadata`, `""` when absent.
fn text<'m>(meta: &'m Json, field: &str) -> &'m str {
    meta.get(field).and_then(Json::as_str).unwrap_or("")
}

/// `ValidateObjectMetaAccessor` on create for a cluster-scoped resource
/// (the namespace is cleared before, so it is not checked).
pub(crate) fn validate(meta: &Json) -> Vec<FieldError> {
    let at = FieldPath::of(&["metadata"]);
    let mut errs = Vec::new();
    let generate = text(meta, "generateName");
    let mut name = text(meta, "name").to_owned();
    if !generate.is_empty() {
        for msg in dns1123_subdomain(&mask_trailing_dash(generate)) {
            errs.push(
                at.child("generateName")
                    .invalid(Some(Json::String(generate.into())), msg),
            );
        }
        if name.is_empty() {
            // What the server's name generator makes of it (a base of at
            // most 58 characters and 5 random ones).
            name = format!("{}abcde", generate.chars().take(58).collect::<String>());
        }
    }
    if name.is_empty() {
        errs.push(at.child("name").error(ErrorKind::Required(
            "name or generateName is required".into(),
        )));
    } else {
        for msg in dns1123_subdomain(&name) {
            errs.push(
                at.child("name")
                    .invalid(Some(Json::String(name.clone())), msg),
            );
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Json::as_object) {
        for (k, v) in labels {
            for msg in qualified_name(k) {
                errs.push(
                    at.child("labels")
                        .invalid(Some(Json::String(k.clone())), msg),
                );
            }
            let v = v.as_str().unwrap_or("");
            for msg in label_value(v) {
                errs.push(
                    at.child("labels")
                        .invalid(Some(Json::String(v.into())), msg),
                );
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Json::as_object) {
        let mut size = 0usize;
        for (k, v) in annotations {
            for msg in qualified_name(&k.to_lowercase()) {
                errs.push(
                    at.child("annotations")
                        .invalid(Some(Json::String(k.clone())), msg),
                );
            }
            size = size
                .saturating_add(k.len())
                .saturating_add(v.as_str().map_or(0, str::len));
        }
        if size > TOTAL_ANNOTATION_SIZE {
            errs.push(at.child("annotations").error(ErrorKind::TooLong {
                max: TOTAL_ANNOTATION_SIZE as u64,
            }));
        }
    }
    if let Some(finalizers) = meta.get("finalizers").and_then(Json::as_array) {
        for f in finalizers.iter().filter_map(Json::as_str) {
            for msg in qualified_name(f) {
                errs.push(
                    at.child("finalizers")
                        .invalid(Some(Json::String(f.into())), msg),
                );
            }
        }
    }
    if let Some(owners) = meta.get("ownerReferences").and_then(Json::as_array) {
        let mut controllers = 0;
        for (i, o) in owners.iter().enumerate() {
            let mut p = at.child("ownerReferences");
            p.push_index(i);
            for field in ["apiVersion", "kind", "name", "uid"] {
                if text(o, field).is_empty() {
                    errs.push(
                        p.child(field)
                            .error(ErrorKind::Required("must not be empty".into())),
                    );
                }
            }
            if o.get("controller").and_then(Json::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(at.child("ownerReferences").invalid(
                None,
                "Only one reference can have Controller set to true".into(),
            ));
        }
    }
    errs
}

/// Most bytes all annotations of an object may hold together.
const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

static SUBDOMAIN: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").ok()
});
static QUALIFIED: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").ok());

fn matches(re: &LazyLock<Option<regex::Regex>>, s: &str) -> bool {
    re.as_ref().is_some_and(|re| re.is_match(s))
}

fn mask_trailing_dash(s: &str) -> String {
    match s.strip_suffix('-') {
        Some(base) if s.len() > 1 => format!("{base}a"),
        _ => s.to_owned(),
    }
}

/// `IsDNS1123Subdomain`.
fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".into());
    }
    if !matches(&SUBDOMAIN, s) {
        errs.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')".into());
    }
    errs
}

/// `IsQualifiedName`: an optional DNS subdomain prefix and `/`, then a
/// name of at most 63 alphanumerics, `-`, `_` or `.`.
fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return vec!["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'".into()];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    }
    if !name.is_empty() && !matches(&QUALIFIED, name) {
        errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 characters of the qualified
/// name's alphabet.
fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".into());
    }
    if !s.is_empty() && !matches(&QUALIFIED, s) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    errs
}
