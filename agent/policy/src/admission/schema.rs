//! A CRD version's structural schema, read generically from its
//! `openAPIV3Schema`, and the API server's decoding and validation passes
//! over an object: pruning (unknown fields), dropping non-nullable nulls,
//! defaulting, and the OpenAPI value validation (types, enums, bounds,
//! patterns, required, list types).
//!
//! Each pass follows its counterpart in kube-apiserver 1.37
//! (`apiextensions-apiserver/pkg/apiserver/schema/{pruning,defaulting}`,
//! `.../apiserver/validation`, `.../schema/listtype`): the order of the
//! passes, which nulls go, which errors block the CEL rules.

use super::path::FieldPath;
use super::rules::{self, Rule};
use super::{ErrorKind, FieldError, SetupError};
use crate::cel::{ObjectType, Type};
use serde_json::{Map, Value as Json};
use std::collections::{BTreeMap, HashSet};

/// What `additionalProperties` says.
#[derive(Debug, Default)]
pub(crate) enum Additional {
    /// Absent or `false`: no other keys.
    #[default]
    None,
    /// `true`: any other key, any value.
    Any,
    /// Other keys, each value under this schema.
    Schema(Box<Schema>),
}

/// One node of a structural schema.
#[derive(Debug, Default)]
pub(crate) struct Schema {
    pub(crate) ty: Option<String>,
    pub(crate) nullable: bool,
    pub(crate) default: Option<Json>,
    pub(crate) properties: BTreeMap<String, Schema>,
    pub(crate) additional: Additional,
    pub(crate) items: Option<Box<Schema>>,
    pub(crate) required: Vec<String>,
    pub(crate) enumeration: Option<Vec<Json>>,
    pub(crate) max_length: Option<u64>,
    pub(crate) min_length: Option<u64>,
    pub(crate) max_items: Option<u64>,
    pub(crate) min_items: Option<u64>,
    pub(crate) max_properties: Option<u64>,
    pub(crate) min_properties: Option<u64>,
    pub(crate) maximum: Option<(f64, bool)>,
    pub(crate) minimum: Option<(f64, bool)>,
    pub(crate) multiple_of: Option<f64>,
    pub(crate) pattern: Option<(String, regex::Regex)>,
    pub(crate) preserve_unknown: bool,
    pub(crate) int_or_string: bool,
    pub(crate) embedded: bool,
    pub(crate) list_type: Option<String>,
    pub(crate) list_map_keys: Vec<String>,
    pub(crate) rules: Vec<Rule>,
}

/// Keywords a structural schema may carry that this module does not
/// interpret: refused when the schema is read, so that a CRD change that
/// needs them fails a test here instead of passing unchecked.
const UNINTERPRETED: &[&str] = &[
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "uniqueItems",
    "x-kubernetes-map-type",
];

impl Schema {
    /// Reads a schema node (and its subtree) from its JSON form, compiling
    /// its CEL rules. `at` names the node in setup errors.
    pub(crate) fn read(json: &Json, at: &str, root: bool) -> Result<Schema, SetupError> {
        let Some(obj) = json.as_object() else {
            return Err(SetupError::Schema(format!("{at}: not a schema object")));
        };
        for k in UNINTERPRETED {
            if obj.contains_key(*k) {
                return Err(SetupError::Schema(format!(
                    "{at}: `{k}` is not interpreted by policy check"
                )));
            }
        }
        let string = |k: &str| obj.get(k).and_then(Json::as_str).map(str::to_owned);
        let uint = |k: &str| obj.get(k).and_then(Json::as_u64);
        let flag = |k: &str| obj.get(k).and_then(Json::as_bool).unwrap_or(false);
        let bound =
            |k: &str, excl: &str| obj.get(k).and_then(Json::as_f64).map(|v| (v, flag(excl)));
        let mut s = Schema {
            ty: string("type"),
            nullable: flag("nullable"),
            default: obj.get("default").cloned(),
            required: obj
                .get("required")
                .and_then(Json::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            enumeration: obj.get("enum").and_then(Json::as_array).cloned(),
            max_length: uint("maxLength"),
            min_length: uint("minLength"),
            max_items: uint("maxItems"),
            min_items: uint("minItems"),
            max_properties: uint("maxProperties"),
            min_properties: uint("minProperties"),
            maximum: bound("maximum", "exclusiveMaximum"),
            minimum: bound("minimum", "exclusiveMinimum"),
            multiple_of: obj.get("multipleOf").and_then(Json::as_f64),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            embedded: flag("x-kubernetes-embedded-resource"),
            list_type: string("x-kubernetes-list-type"),
            list_map_keys: obj
                .get("x-kubernetes-list-map-keys")
                .and_then(Json::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            ..Schema::default()
        };
        if let Some(p) = string("pattern") {
            let re = regex::Regex::new(&p)
                .map_err(|e| SetupError::Schema(format!("{at}: pattern {p:?}: {e}")))?;
            s.pattern = Some((p, re));
        }
        if let Some(props) = obj.get("properties").and_then(Json::as_object) {
            for (k, v) in props {
                s.properties
                    .insert(k.clone(), Schema::read(v, &format!("{at}.{k}"), false)?);
            }
        }
        match obj.get("additionalProperties") {
            Some(Json::Bool(true)) => s.additional = Additional::Any,
            Some(v @ Json::Object(_)) => {
                s.additional =
                    Additional::Schema(Box::new(Schema::read(v, &format!("{at}[*]"), false)?))
            }
            _ => {}
        }
        if let Some(items) = obj.get("items") {
            s.items = Some(Box::new(Schema::read(items, &format!("{at}[*]"), false)?));
        }
        if let Some(list) = obj.get("x-kubernetes-validations").and_then(Json::as_array) {
            let self_type = s.cel_type(at, root);
            for (i, rule) in list.iter().enumerate() {
                s.rules.push(Rule::compile(
                    rule,
                    &self_type,
                    &format!("{at}: x-kubernetes-validations[{i}]"),
                )?);
            }
        }
        Ok(s)
    }

    /// The CEL type `self` has at this node, as the API server derives it
    /// from the schema.
    pub(crate) fn cel_type(&self, name: &str, root: bool) -> Type {
        if self.int_or_string {
            return Type::Dyn;
        }
        match self.ty.as_deref() {
            // `date-time`, `duration` and `byte` strings are timestamps,
            // durations and bytes to the API server's CEL; this checker
            // keeps them strings (no schema here uses those formats with
            // a rule: SetupError would be better, but the status has
            // date-times and no rules).
            Some("string") => Type::String,
            Some("integer") => Type::Int,
            Some("number") => Type::Double,
            Some("boolean") => Type::Bool,
            Some("array") => Type::list(
                self.items
                    .as_ref()
                    .map(|i| i.cel_type(&format!("{name}[*]"), false))
                    .unwrap_or(Type::Dyn),
            ),
            Some("object") if !self.properties.is_empty() || self.embedded || root => {
                let mut fields: Vec<(String, Type)> = self
                    .properties
                    .iter()
                    .filter_map(|(k, p)| {
                        rules::escape(k).map(|e| (e, p.cel_type(&format!("{name}.{k}"), false)))
                    })
                    .collect();
                if self.embedded || root {
                    fields.push(("apiVersion".into(), Type::String));
                    fields.push(("kind".into(), Type::String));
                    fields.push(("metadata".into(), Type::map(Type::String, Type::Dyn)));
                }
                Type::object(ObjectType::new(name, fields))
            }
            Some("object") => match &self.additional {
                Additional::Schema(a) => {
                    Type::map(Type::String, a.cel_type(&format!("{name}[*]"), false))
                }
                _ => Type::map(Type::String, Type::Dyn),
            },
            _ => Type::Dyn,
        }
    }

    fn property(&self, key: &str) -> Option<&Schema> {
        self.properties.get(key).or(match &self.additional {
            Additional::Schema(a) => Some(a),
            _ => None,
        })
    }
}

/// The fields every resource carries beside its schema's.
const META_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// Removes the fields the schema does not declare and returns their paths,
/// sorted (`structuralpruning.PruneWithOptions`). At the resource root
/// `apiVersion`, `kind` and `metadata` are kept.
pub(crate) fn prune(object: &mut Json, schema: &Schema) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_at(
        object,
        Some(schema),
        &mut FieldPath::root(),
        true,
        &mut unknown,
    );
    unknown.sort();
    unknown
}

/// [`prune`] below `path` (not a resource root): `metadata`'s fields.
pub(crate) fn prune_under(
    object: &mut Json,
    schema: &Schema,
    path: &mut FieldPath,
    unknown: &mut Vec<String>,
) {
    prune_at(object, Some(schema), path, false, unknown);
}

fn prune_at(
    x: &mut Json,
    s: Option<&Schema>,
    path: &mut FieldPath,
    embedded: bool,
    unknown: &mut Vec<String>,
) {
    if let Some(s) = s.filter(|s| s.preserve_unknown) {
        return skip_prune(x, s, path, unknown);
    }
    match x {
        Json::Object(m) => {
            let Some(s) = s else {
                for k in std::mem::take(m).keys() {
                    unknown.push(path.key(k).to_string());
                }
                return;
            };
            let embedded = embedded || s.embedded;
            let mut drop = Vec::new();
            for (k, v) in m.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                match s.property(k) {
                    Some(p) => {
                        path.push_key(k);
                        prune_at(v, Some(p), path, false, unknown);
                        path.pop();
                    }
                    None if matches!(s.additional, Additional::Any) => {}
                    None => {
                        unknown.push(path.key(k).to_string());
                        drop.push(k.clone());
                    }
                }
            }
            for k in drop {
                m.remove(&k);
            }
        }
        Json::Array(items) => {
            let item = s.and_then(|s| s.items.as_deref());
            for (i, v) in items.iter_mut().enumerate() {
                path.push_index(i);
                prune_at(v, item, path, false, unknown);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Under `x-kubernetes-preserve-unknown-fields`: unknown keys stay, declared
/// ones are pruned below.
fn skip_prune(x: &mut Json, s: &Schema, path: &mut FieldPath, unknown: &mut Vec<String>) {
    match x {
        Json::Object(m) => {
            for (k, v) in m.iter_mut() {
                if s.embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(p) = s.property(k) {
                    path.push_key(k);
                    prune_at(v, Some(p), path, false, unknown);
                    path.pop();
                }
            }
        }
        Json::Array(items) => {
            if let Some(item) = s.items.as_deref() {
                for (i, v) in items.iter_mut().enumerate() {
                    path.push_index(i);
                    skip_prune(v, item, path, unknown);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}

/// Drops `null` values of fields that are neither nullable nor defaulted
/// (`PruneNonNullableNullsWithoutDefaults`): `evaluationInterval: null` is
/// as if absent. Nulls in lists stay (and fail the type check).
pub(crate) fn drop_nulls(x: &mut Json, s: Option<&Schema>) {
    match x {
        Json::Object(m) => {
            let mut drop = Vec::new();
            for (k, v) in m.iter_mut() {
                let p = s.and_then(|s| s.property(k));
                if v.is_null() && p.is_some_and(|p| !p.nullable && p.default.is_none()) {
                    drop.push(k.clone());
                } else {
                    drop_nulls(v, p);
                }
            }
            for k in drop {
                m.remove(&k);
            }
        }
        Json::Array(items) => {
            let item = s.and_then(|s| s.items.as_deref());
            for v in items {
                drop_nulls(v, item);
            }
        }
        _ => {}
    }
}

/// Applies `default`s to absent fields and to non-nullable nulls
/// (`structuraldefaulting.Default`).
pub(crate) fn default(x: &mut Json, s: &Schema) {
    match x {
        Json::Object(m) => {
            for (k, p) in &s.properties {
                let Some(d) = &p.default else { continue };
                match m.get(k) {
                    None => {
                        m.insert(k.clone(), d.clone());
                    }
                    Some(Json::Null) if !p.nullable => {
                        m.insert(k.clone(), d.clone());
                    }
                    _ => {}
                }
            }
            for (k, v) in m.iter_mut() {
                if let Some(p) = s.properties.get(k) {
                    default(v, p);
                } else if let Additional::Schema(a) = &s.additional {
                    if v.is_null() && !a.nullable {
                        if let Some(d) = &a.default {
                            *v = d.clone();
                        }
                    }
                    default(v, a);
                }
            }
        }
        Json::Array(items) => {
            if let Some(item) = s.items.as_deref() {
                for v in items {
                    if v.is_null() && !item.nullable {
                        if let Some(d) = &item.default {
                            *v = d.clone();
                        }
                    }
                    default(v, item);
                }
            }
        }
        _ => {}
    }
}

/// The OpenAPI type name of a JSON value, as the server's messages say it.
pub(crate) fn json_type(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

fn type_matches(ty: &str, v: &Json) -> bool {
    match (ty, v) {
        ("object", Json::Object(_))
        | ("array", Json::Array(_))
        | ("string", Json::String(_))
        | ("boolean", Json::Bool(_))
        | ("number", Json::Number(_)) => true,
        // A JSON number with no fraction is an integer (Go's json decodes
        // `1.0` as a float64 the validator accepts as integer).
        ("integer", Json::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// The value validation of one node and its subtree (go-openapi's
/// `SchemaValidator` as kube-apiserver maps its results to field errors).
pub(crate) fn validate(v: &Json, s: &Schema, path: &mut FieldPath, errs: &mut Vec<FieldError>) {
    let nullable_null = v.is_null() && s.nullable;
    if s.int_or_string {
        if !nullable_null && !matches!(v, Json::String(_)) && !type_matches("integer", v) {
            errs.push(path.error(ErrorKind::TypeInvalid {
                expected: "integer or string".into(),
                found: json_type(v),
            }));
        }
    } else if let Some(ty) = s.ty.as_deref() {
        if !nullable_null && !type_matches(ty, v) {
            errs.push(path.error(ErrorKind::TypeInvalid {
                expected: ty.into(),
                found: json_type(v),
            }));
        }
    }
    // A nullable null passes the type but not an enum without null
    // (`mode: null` is refused; client-side `kubectl apply` drops nulls
    // before sending, `kubectl create` and server-side apply do not).
    if let Some(values) = &s.enumeration {
        if !values.contains(v) {
            errs.push(path.error(ErrorKind::NotSupported {
                value: v.to_string(),
                supported: values.iter().map(|v| v.to_string()).collect(),
            }));
        }
    }
    match v {
        Json::String(text) => validate_string(text, s, path, errs),
        Json::Number(n) => validate_number(n.as_f64().unwrap_or(f64::NAN), s, path, errs),
        Json::Array(items) => {
            if let Some(max) = s.max_items {
                if items.len() as u64 > max {
                    errs.push(path.error(ErrorKind::TooMany {
                        actual: items.len(),
                        max,
                    }));
                }
            }
            if let Some(min) = s.min_items {
                if (items.len() as u64) < min {
                    errs.push(path.invalid(
                        None,
                        format!("{path} in body should have at least {min} items"),
                    ));
                }
            }
            if let Some(item) = s.items.as_deref() {
                for (i, v) in items.iter().enumerate() {
                    path.push_index(i);
                    validate(v, item, path, errs);
                    path.pop();
                }
            }
            list_type(items, s, path, errs);
        }
        Json::Object(m) if s.ty.as_deref() == Some("object") || s.ty.is_none() => {
            for r in &s.required {
                if !m.contains_key(r) {
                    errs.push(path.child(r).error(ErrorKind::Required(String::new())));
                }
            }
            if let Some(max) = s.max_properties {
                if m.len() as u64 > max {
                    errs.push(path.error(ErrorKind::TooMany {
                        actual: m.len(),
                        max,
                    }));
                }
            }
            if let Some(min) = s.min_properties {
                if (m.len() as u64) < min {
                    errs.push(path.invalid(
                        None,
                        format!("{path} in body should have at least {min} properties"),
                    ));
                }
            }
            for (k, v) in m {
                if let Some(p) = s.property(k) {
                    path.push_key(k);
                    validate(v, p, path, errs);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}

fn validate_string(text: &str, s: &Schema, path: &FieldPath, errs: &mut Vec<FieldError>) {
    // OpenAPI lengths count characters, not bytes.
    let len = text.chars().count() as u64;
    if let Some(max) = s.max_length {
        if len > max {
            errs.push(path.error(ErrorKind::TooLong { max }));
        }
    }
    if let Some(min) = s.min_length {
        if len < min {
            errs.push(path.invalid(
                Some(Json::String(text.to_owned())),
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
    }
    if let Some((p, re)) = &s.pattern {
        if !re.is_match(text) {
            errs.push(path.invalid(
                Some(Json::String(text.to_owned())),
                format!("{path} in body should match '{p}'"),
            ));
        }
    }
}

fn validate_number(n: f64, s: &Schema, path: &FieldPath, errs: &mut Vec<FieldError>) {
    if let Some((max, exclusive)) = s.maximum {
        if n > max || (exclusive && n == max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.push(path.invalid(None, format!("{path} in body should be {rel} {max}")));
        }
    }
    if let Some((min, exclusive)) = s.minimum {
        if n < min || (exclusive && n == min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.push(path.invalid(None, format!("{path} in body should be {rel} {min}")));
        }
    }
    if let Some(m) = s.multiple_of {
        if m != 0.0 && (n / m).fract() != 0.0 {
            errs.push(path.invalid(None, format!("{path} in body should be a multiple of {m}")));
        }
    }
}

/// `x-kubernetes-list-type: set` and `map`: no two items alike (a set) or
/// with the same keys (a map) (`structurallisttype.ValidateListSetsAndMaps`).
fn list_type(items: &[Json], s: &Schema, path: &mut FieldPath, errs: &mut Vec<FieldError>) {
    match s.list_type.as_deref() {
        Some("set") => {
            let mut seen = HashSet::new();
            for (i, v) in items.iter().enumerate() {
                if !seen.insert(v.to_string()) {
                    path.push_index(i);
                    errs.push(path.error(ErrorKind::Duplicate(v.to_string())));
                    path.pop();
                }
            }
        }
        Some("map") => {
            let item_schema = s.items.as_deref();
            let mut seen = HashSet::new();
            for (i, v) in items.iter().enumerate() {
                let Json::Object(m) = v else { continue };
                let mut key = Map::new();
                for k in &s.list_map_keys {
                    let value = m.get(k).cloned().or_else(|| {
                        item_schema
                            .and_then(|is| is.properties.get(k))
                            .and_then(|p| p.default.clone())
                    });
                    if let Some(value) = value {
                        key.insert(k.clone(), value);
                    }
                }
                let key = Json::Object(key).to_string();
                if !seen.insert(key.clone()) {
                    path.push_index(i);
                    errs.push(path.error(ErrorKind::Duplicate(key)));
                    path.pop();
                }
            }
        }
        _ => {}
    }
}
