//! What the API server answers to `kubectl apply` of a custom resource,
//! offline: the CRD's structural schema and its `x-kubernetes-validations`
//! rules, interpreted generically from the CRD itself (so a change to the
//! Rust types that generate it changes this answer with it), plus the
//! ValidatingAdmissionPolicies installed beside it.
//!
//! [`Admission::review`] runs, in the API server's order (kube-apiserver
//! 1.37, `apiextensions-apiserver`):
//!
//! 1. decoding under strict field validation (`kubectl apply`'s default):
//!    `metadata` decoded as ObjectMeta, every field the schema does not
//!    declare pruned and reported as an unknown field, non-nullable nulls
//!    dropped, `status` dropped (a create cannot set it), defaults applied;
//! 2. `apiVersion` and `kind`;
//! 3. ObjectMeta validation (name, labels, annotations, ...);
//! 4. the OpenAPI value validation: types, enums, lengths and counts,
//!    patterns, required fields, list types;
//! 5. the CEL rules, unless step 3 or 4 found a *blocking* error (a type,
//!    an enum, a missing field, a length or count bound), exactly as the
//!    server skips them ("some validation rules were not checked ...");
//! 6. the admission policies.
//!
//! Where the server would stop at the first failing step (unknown fields
//! end the request before validation), this goes on and reports the later
//! steps' errors too, so one run shows everything to fix; the verdict,
//! refused or not, is the same.

mod metadata;
mod path;
mod rules;
mod schema;
mod vap;

pub use vap::AdmissionPolicy;

use path::FieldPath;
use rules::Verdict;
use schema::Schema;
use serde_json::Value as Json;
use std::fmt;

/// Why an [`Admission`] could not be built: something in the CRD or an
/// admission policy that this module does not interpret, so that its
/// answer would not be the server's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The CRD itself.
    #[error("the CRD: {0}")]
    Crd(String),
    /// A schema node.
    #[error("the CRD's schema: {0}")]
    Schema(String),
    /// A validation rule our CEL cannot compile.
    #[error("the CRD's validation rule {0}")]
    Rule(String),
    /// An admission policy.
    #[error("admission policy {0}")]
    Policy(String),
}

/// What is wrong at a field, in the API server's vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorKind {
    /// A field the schema does not declare (refused under strict field
    /// validation).
    UnknownField,
    /// The object or its metadata cannot be decoded at all.
    Decode(String),
    /// A value of the wrong type.
    TypeInvalid {
        /// The schema's type.
        expected: String,
        /// The value's.
        found: &'static str,
    },
    /// A value outside the schema's enum.
    NotSupported {
        /// The value, as JSON.
        value: String,
        /// The enum, as JSON.
        supported: Vec<String>,
    },
    /// A required field is absent.
    Required(String),
    /// Longer than `maxLength`.
    TooLong {
        /// The bound.
        max: u64,
    },
    /// More items (or properties) than allowed.
    TooMany {
        /// How many there are.
        actual: usize,
        /// The bound.
        max: u64,
    },
    /// The same key twice in a list that is a map or a set.
    Duplicate(String),
    /// Any other refusal (a pattern, a minimum, a failed CEL rule).
    Invalid {
        /// The value shown (a scalar; `None` for objects and lists).
        value: Option<Json>,
        /// Why.
        detail: String,
    },
    /// Not allowed here.
    Forbidden(String),
    /// The CEL rules were skipped because of a blocking error.
    RulesNotChecked,
    /// A ValidatingAdmissionPolicy denied the request.
    Denied {
        /// The policy.
        policy: String,
        /// Its message.
        message: String,
    },
}

impl ErrorKind {
    /// Whether the API server skips the CEL rules after this error
    /// (`hasBlockingErr`).
    pub fn blocking(&self) -> bool {
        matches!(
            self,
            ErrorKind::TypeInvalid { .. }
                | ErrorKind::NotSupported { .. }
                | ErrorKind::Required(_)
                | ErrorKind::TooLong { .. }
                | ErrorKind::TooMany { .. }
        )
    }
}

/// One refusal, at a field path as the API server names it
/// (`spec.behaviors[0].network.deny.values[2]`; empty for the object).
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// The field.
    pub path: String,
    /// What is wrong.
    pub kind: ErrorKind,
}

fn show(v: &Json) -> String {
    match v {
        Json::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.path.is_empty() {
            "<object>"
        } else {
            &self.path
        };
        match &self.kind {
            ErrorKind::UnknownField => write!(f, "unknown field {:?}", self.path),
            ErrorKind::Decode(why) => write!(f, "{at}: {why}"),
            ErrorKind::TypeInvalid { expected, found } => write!(
                f,
                "{at}: Invalid value: {found:?}: {at} in body must be of type {expected}: {found:?}"
            ),
            ErrorKind::NotSupported { value, supported } => write!(
                f,
                "{at}: Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
            ErrorKind::Required(d) if d.is_empty() => write!(f, "{at}: Required value"),
            ErrorKind::Required(d) => write!(f, "{at}: Required value: {d}"),
            ErrorKind::TooLong { max } => {
                write!(f, "{at}: Too long: may not be more than {max} bytes")
            }
            ErrorKind::TooMany { actual, max } => {
                write!(f, "{at}: Too many: {actual}: must have at most {max} items")
            }
            ErrorKind::Duplicate(v) => write!(f, "{at}: Duplicate value: {v}"),
            ErrorKind::Invalid {
                value: Some(v),
                detail,
            } => write!(f, "{at}: Invalid value: {}: {detail}", show(v)),
            ErrorKind::Invalid {
                value: None,
                detail,
            } => write!(f, "{at}: Invalid value: {detail}"),
            ErrorKind::Forbidden(d) => write!(f, "{at}: Forbidden: {d}"),
            ErrorKind::RulesNotChecked => f.write_str(
                "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ),
            ErrorKind::Denied { policy, message } => {
                write!(f, "ValidatingAdmissionPolicy '{policy}' denied request: {message}")
            }
        }
    }
}

/// The answer to one object.
#[derive(Clone, Debug, Default)]
pub struct Review {
    /// Every refusal, in the order the server's steps find them.
    pub errors: Vec<FieldError>,
    /// The object as it would be stored (pruned, defaulted, no status),
    /// when it decoded at all.
    pub object: Option<Json>,
}

impl Review {
    /// Whether the server would accept the object.
    pub fn accepted(&self) -> bool {
        self.errors.is_empty()
    }

    /// Whether an error blocks the CEL rules (and makes the typed object
    /// unreliable for further checks).
    pub fn blocked(&self) -> bool {
        self.errors.iter().any(|e| {
            e.kind.blocking() || matches!(e.kind, ErrorKind::Decode(_) | ErrorKind::RulesNotChecked)
        })
    }
}

/// One served version of the CRD.
#[derive(Debug)]
struct Version {
    name: String,
    schema: Schema,
    status_subresource: bool,
}

/// A CRD (and the admission policies beside it), ready to review objects.
#[derive(Debug)]
pub struct Admission {
    group: String,
    kind: String,
    plural: String,
    versions: Vec<Version>,
    policies: Vec<AdmissionPolicy>,
}

impl Admission {
    /// Reads a CustomResourceDefinition (`apiextensions.k8s.io/v1`, as
    /// JSON): its group, kind and every served version's schema and rules.
    pub fn new(crd: &Json) -> Result<Admission, SetupError> {
        let spec = crd
            .get("spec")
            .ok_or_else(|| SetupError::Crd("no spec".into()))?;
        let text = |v: Option<&Json>, what: &str| {
            v.and_then(Json::as_str)
                .map(str::to_owned)
                .ok_or_else(|| SetupError::Crd(format!("no {what}")))
        };
        let group = text(spec.get("group"), "spec.group")?;
        let names = spec.get("names");
        let kind = text(names.and_then(|n| n.get("kind")), "spec.names.kind")?;
        let plural = text(names.and_then(|n| n.get("plural")), "spec.names.plural")?;
        if spec.get("scope").and_then(Json::as_str) != Some("Cluster") {
            return Err(SetupError::Crd(
                "only cluster-scoped resources are interpreted".into(),
            ));
        }
        let mut versions = Vec::new();
        for v in spec
            .get("versions")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
        {
            if v.get("served").and_then(Json::as_bool) != Some(true) {
                continue;
            }
            let name = text(v.get("name"), "a version's name")?;
            let schema = v
                .get("schema")
                .and_then(|s| s.get("openAPIV3Schema"))
                .ok_or_else(|| SetupError::Crd(format!("version {name}: no openAPIV3Schema")))?;
            versions.push(Version {
                schema: Schema::read(schema, "", true)?,
                status_subresource: v
                    .get("subresources")
                    .and_then(|s| s.get("status"))
                    .is_some(),
                name,
            });
        }
        if versions.is_empty() {
            return Err(SetupError::Crd("no served version".into()));
        }
        Ok(Admission {
            group,
            kind,
            plural,
            versions,
            policies: Vec::new(),
        })
    }

    /// The RuntimePolicy CRD, generated from the types in
    /// `kyverno_runtime_api` exactly as `kyverno-runtime crd` prints it.
    pub fn runtime_policy() -> Result<Admission, SetupError> {
        let crd = serde_json::to_value(kyverno_runtime_api::crd::runtime_policy())
            .map_err(|e| SetupError::Crd(e.to_string()))?;
        Admission::new(&crd)
    }

    /// Adds a ValidatingAdmissionPolicy (with its binding's `Deny` action)
    /// to what is checked after the schema.
    pub fn with_policy(mut self, policy: AdmissionPolicy) -> Admission {
        self.policies.push(policy);
        self
    }

    /// The served `apiVersion`s (`group/version`).
    pub fn api_versions(&self) -> Vec<String> {
        self.versions
            .iter()
            .map(|v| format!("{}/{}", self.group, v.name))
            .collect()
    }

    /// The API server's answer to creating `object` (a server-side dry run
    /// of `kubectl apply`).
    pub fn review(&self, object: &Json) -> Review {
        let mut review = Review::default();
        let errors = &mut review.errors;
        let root = FieldPath::root();
        if !object.is_object() {
            errors.push(root.error(ErrorKind::Decode(format!(
                "a {} is not an object: expected apiVersion, kind, metadata and spec",
                schema::json_type(object)
            ))));
            return review;
        }
        let mut object = object.clone();
        // 2 first: the type decides which schema decodes the object.
        let api_version = object
            .get("apiVersion")
            .and_then(Json::as_str)
            .unwrap_or("");
        let kind = object.get("kind").and_then(Json::as_str).unwrap_or("");
        let version = self
            .versions
            .iter()
            .find(|v| format!("{}/{}", self.group, v.name) == api_version);
        if kind != self.kind {
            errors.push(root.child("kind").invalid(
                Some(Json::String(kind.into())),
                format!("must be {}", self.kind),
            ));
        }
        let Some(version) = version else {
            errors.push(root.child("apiVersion").invalid(
                Some(Json::String(api_version.into())),
                format!("must be one of {}", self.api_versions().join(", ")),
            ));
            return review;
        };
        if !errors.is_empty() {
            return review;
        }
        // 1: decoding.
        let mut unknown = Vec::new();
        let mut decode_errors = Vec::new();
        if let Some(meta) = object.get_mut("metadata") {
            decode_errors = metadata::decode(meta, &mut unknown);
        }
        unknown.extend(schema::prune(&mut object, &version.schema));
        unknown.sort();
        errors.extend(unknown.iter().map(|p| FieldError {
            path: p.clone(),
            kind: ErrorKind::UnknownField,
        }));
        let decoded = decode_errors.is_empty();
        errors.extend(decode_errors);
        if !decoded {
            return review;
        }
        schema::drop_nulls(&mut object, Some(&version.schema));
        if let (true, Some(m)) = (version.status_subresource, object.as_object_mut()) {
            m.remove("status");
        }
        schema::default(&mut object, &version.schema);
        // 3 and 4.
        let meta = object.get("metadata").cloned().unwrap_or(Json::Null);
        errors.extend(metadata::validate(&meta));
        let mut path = FieldPath::root();
        if let Some(m) = object.as_object() {
            for (k, v) in m {
                if let Some(p) = version.schema.properties.get(k) {
                    path.push_key(k);
                    schema::validate(v, p, &mut path, errors);
                    path.pop();
                }
            }
            for r in &version.schema.required {
                if m.get(r).is_none_or(Json::is_null) {
                    errors.push(root.child(r).error(ErrorKind::Required(String::new())));
                }
            }
        }
        // 5.
        if errors.iter().any(|e| e.kind.blocking()) {
            errors.push(root.error(ErrorKind::RulesNotChecked));
        } else {
            let mut budget = rules::object_budget();
            validate_rules(
                &object,
                &version.schema,
                &mut FieldPath::root(),
                &mut budget,
                errors,
            );
        }
        // 6. The server admits only what passed 1 to 5; the policies are
        // still evaluated here when nothing blocked, so that their errors
        // show with the others.
        if !review.blocked() {
            for p in &self.policies {
                if let Some(e) = p.review(
                    &object,
                    &version.schema,
                    &self.group,
                    &version.name,
                    &self.plural,
                ) {
                    review.errors.push(e);
                }
            }
        }
        review.object = Some(object);
        review
    }
}

/// Step 5: every rule where its value is present and not null, top down,
/// until the budget is spent.
fn validate_rules(
    v: &Json,
    s: &Schema,
    path: &mut FieldPath,
    budget: &mut crate::cel::program::Budget,
    errs: &mut Vec<FieldError>,
) -> bool {
    if v.is_null() {
        return true;
    }
    if !s.rules.is_empty() {
        let this = rules::to_cel(v, Some(s));
        for rule in &s.rules {
            let at = match rule.field_path.as_deref() {
                Some(fp) => {
                    let mut p = path.clone();
                    for k in fp
                        .trim_start_matches('.')
                        .split('.')
                        .filter(|k| !k.is_empty())
                    {
                        p.push_key(k);
                    }
                    p
                }
                None => path.clone(),
            };
            let shown = match v {
                Json::Object(_) | Json::Array(_) => None,
                scalar => Some(scalar.clone()),
            };
            match rule.judge(&this, budget) {
                Verdict::Pass => {}
                Verdict::Fail(detail) => errs.push(at.error(match rule.reason.as_deref() {
                    Some("FieldValueForbidden") => ErrorKind::Forbidden(detail),
                    Some("FieldValueRequired") => ErrorKind::Required(detail),
                    Some("FieldValueDuplicate") => {
                        ErrorKind::Duplicate(shown.map(|v| show(&v)).unwrap_or_default())
                    }
                    _ => ErrorKind::Invalid {
                        value: shown,
                        detail,
                    },
                })),
                Verdict::Error(detail) => errs.push(path.error(ErrorKind::Invalid {
                    value: shown,
                    detail,
                })),
                Verdict::OutOfBudget => {
                    errs.push(path.invalid(None, "validation failed due to running out of cost budget, no further validation rules will be run".into()));
                    return false;
                }
            }
        }
    }
    match v {
        Json::Array(items) => {
            if let Some(item) = s.items.as_deref() {
                for (i, v) in items.iter().enumerate() {
                    path.push_index(i);
                    let go_on = validate_rules(v, item, path, budget, errs);
                    path.pop();
                    if !go_on {
                        return false;
                    }
                }
            }
        }
        Json::Object(m) => {
            for (k, v) in m {
                let p = s.properties.get(k).or(match &s.additional {
                    schema::Additional::Schema(a) => Some(a.as_ref()),
                    _ => None,
                });
                if let Some(p) = p {
                    path.push_key(k);
                    let go_on = validate_rules(v, p, path, budget, errs);
                    path.pop();
                    if !go_on {
                        return false;
                    }
                }
            }
        }
        _ => {}
    }
    true
}

#[cfg(test)]
mod tests;
