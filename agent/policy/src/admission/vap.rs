//! A ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`) bound
//! with `validationActions: [Deny]`, evaluated on a create as the API
//! server's admission plugin does: the policy applies when a
//! `matchConstraints.resourceRules` entry names the resource and CREATE
//! (and no exclude rule does) and every `matchConditions` expression is
//! true; its `variables` are evaluated in order; the first false
//! `validations` expression denies with its `messageExpression`, its
//! `message`, or `failed expression: <expression>`. An expression that
//! fails to evaluate denies under `failurePolicy: Fail` (the default).
//!
//! What this does not interpret (`paramKind`, an `objectSelector`,
//! `auditAnnotations` that could fail) is refused when the policy is read.

use super::path::FieldPath;
use super::rules::{object_budget, to_cel};
use super::schema::Schema;
use super::{ErrorKind, FieldError, SetupError};
use crate::cel::eval::shared_policy_context;
use crate::cel::program::{Budget, Program};
use crate::cel::{self, Env, ObjectType, Type};
use ::cel::objects::{Key, Map};
use ::cel::Value;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
struct Expr {
    source: String,
    program: Program,
}

#[derive(Debug)]
struct Validation {
    expr: Expr,
    message: Option<String>,
    message_expression: Option<Expr>,
}

#[derive(Debug)]
struct ResourceRule {
    groups: Vec<String>,
    versions: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
}

/// A ValidatingAdmissionPolicy, compiled.
#[derive(Debug)]
pub struct AdmissionPolicy {
    name: String,
    rules: Vec<ResourceRule>,
    excludes: Vec<ResourceRule>,
    conditions: Vec<Expr>,
    variables: Vec<(String, Expr)>,
    validations: Vec<Validation>,
    fail_closed: bool,
}

fn strings(v: Option<&Json>) -> Vec<String> {
    v.and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn resource_rules(v: Option<&Json>) -> Vec<ResourceRule> {
    v.and_then(Json::as_array)
        .into_iter()
        .flatten()
        .map(|r| ResourceRule {
            groups: strings(r.get("apiGroups")),
            versions: strings(r.get("apiVersions")),
            operations: strings(r.get("operations")),
            resources: strings(r.get("resources")),
        })
        .collect()
}

impl ResourceRule {
    fn matches(&self, group: &str, version: &str, resource: &str) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        any(&self.groups, group)
            && any(&self.versions, version)
            && any(&self.operations, "CREATE")
            && any(&self.resources, resource)
    }
}

impl AdmissionPolicy {
    /// Reads a ValidatingAdmissionPolicy (as JSON) whose binding denies;
    /// `object_type` is the CEL type of `object` (from the CRD's schema).
    pub fn new(policy: &Json, crd: &super::Admission) -> Result<AdmissionPolicy, SetupError> {
        let name = policy
            .pointer("/metadata/name")
            .and_then(Json::as_str)
            .unwrap_or("(unnamed)")
            .to_owned();
        let err = |why: String| SetupError::Policy(format!("{name}: {why}"));
        let spec = policy.get("spec").ok_or_else(|| err("no spec".into()))?;
        if spec.get("paramKind").is_some() {
            return Err(err("paramKind is not interpreted by policy check".into()));
        }
        let constraints = spec.get("matchConstraints");
        if constraints
            .and_then(|c| c.get("objectSelector"))
            .and_then(Json::as_object)
            .is_some_and(|o| !o.is_empty())
        {
            return Err(err(
                "an objectSelector is not interpreted by policy check".into()
            ));
        }
        let object_type = crd
            .versions
            .first()
            .map(|v| v.schema.cel_type("object", true))
            .unwrap_or(Type::Dyn);
        let mut env = Env::base();
        for v in ["object", "oldObject"] {
            env.add_variable(v, object_type.clone());
        }
        env.add_variable("request", Type::map(Type::String, Type::Dyn));
        env.add_variable("params", Type::Dyn);
        env.add_variable("namespaceObject", Type::Dyn);
        let compile = |src: &str, env: &Env, at: &str| -> Result<(Expr, Type), SetupError> {
            let checked = cel::check(src, env).map_err(|errs| {
                let errs: Vec<String> = errs.iter().map(ToString::to_string).collect();
                err(format!("{at}: `{src}`: {}", errs.join("; ")))
            })?;
            let ty = checked.ty.clone();
            Ok((
                Expr {
                    source: src.to_owned(),
                    program: Program::new(&checked, env, &HashMap::new()),
                },
                ty,
            ))
        };
        let mut variables = Vec::new();
        let mut declared = ObjectType::new("variables", Vec::<(String, Type)>::new());
        for (i, v) in spec
            .get("variables")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let (Some(vname), Some(src)) = (
                v.get("name").and_then(Json::as_str),
                v.get("expression").and_then(Json::as_str),
            ) else {
                return Err(err(format!(
                    "variables[{i}]: name and expression are required"
                )));
            };
            let mut local = env.clone();
            local.add_variable("variables", Type::object(declared.clone()));
            let (expr, ty) = compile(src, &local, &format!("variables[{i}]"))?;
            declared.fields.insert(vname.to_owned(), ty);
            variables.push((vname.to_owned(), expr));
        }
        env.add_variable("variables", Type::object(declared));
        let mut conditions = Vec::new();
        for (i, c) in spec
            .get("matchConditions")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let src = c.get("expression").and_then(Json::as_str).unwrap_or("");
            conditions.push(compile(src, &env, &format!("matchConditions[{i}]"))?.0);
        }
        let mut validations = Vec::new();
        for (i, v) in spec
            .get("validations")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let src = v.get("expression").and_then(Json::as_str).unwrap_or("");
            let expr = compile(src, &env, &format!("validations[{i}]"))?.0;
            let message_expression = match v.get("messageExpression").and_then(Json::as_str) {
                Some(m) => {
                    Some(compile(m, &env, &format!("validations[{i}].messageExpression"))?.0)
                }
                None => None,
            };
            validations.push(Validation {
                expr,
                message: v.get("message").and_then(Json::as_str).map(str::to_owned),
                message_expression,
            });
        }
        Ok(AdmissionPolicy {
            rules: resource_rules(constraints.and_then(|c| c.get("resourceRules"))),
            excludes: resource_rules(constraints.and_then(|c| c.get("excludeResourceRules"))),
            conditions,
            variables,
            validations,
            fail_closed: spec.get("failurePolicy").and_then(Json::as_str) != Some("Ignore"),
            name,
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Judges the create of `object` (decoded, defaulted): `Some` error
    /// when the policy denies it.
    pub(crate) fn review(
        &self,
        object: &Json,
        schema: &Schema,
        group: &str,
        version: &str,
        resource: &str,
    ) -> Option<FieldError> {
        if !self
            .rules
            .iter()
            .any(|r| r.matches(group, version, resource))
            || self
                .excludes
                .iter()
                .any(|r| r.matches(group, version, resource))
        {
            return None;
        }
        let deny = |message: String| {
            Some(FieldPath::root().error(ErrorKind::Denied {
                policy: self.name.clone(),
                message,
            }))
        };
        let object = root_value(object, schema);
        let request = Value::Map(Map {
            map: Arc::new(
                [("operation", "CREATE"), ("name", "")]
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            Key::String(Arc::new(k.into())),
                            Value::String(Arc::new(v.into())),
                        )
                    })
                    .collect(),
            ),
        });
        let mut budget = object_budget();
        let mut vars: HashMap<Key, Value> = HashMap::new();
        let run = |e: &Expr, vars: &HashMap<Key, Value>, budget: &mut Budget| {
            let globals: Vec<Option<Value>> = e
                .program
                .globals()
                .iter()
                .map(|g| match g.as_str() {
                    "object" => Some(object.clone()),
                    "oldObject" | "params" | "namespaceObject" => Some(Value::Null),
                    "request" => Some(request.clone()),
                    "variables" => Some(Value::Map(Map {
                        map: Arc::new(vars.clone()),
                    })),
                    _ => None,
                })
                .collect();
            e.program.run(&globals, shared_policy_context(), budget)
        };
        // Variables are lazy in the server: one that fails matters only if
        // read, so a failed one is left unbound (reading it then fails).
        for (name, e) in &self.variables {
            if let Ok(v) = run(e, &vars, &mut budget) {
                vars.insert(Key::String(Arc::new(name.clone())), v);
            }
        }
        for c in &self.conditions {
            match run(c, &vars, &mut budget) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return None,
                Ok(_) | Err(_) if self.fail_closed => {
                    return deny(format!("failed to evaluate match condition `{}`", c.source))
                }
                _ => return None,
            }
        }
        for v in &self.validations {
            match run(&v.expr, &vars, &mut budget) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let from_expression = v.message_expression.as_ref().and_then(|m| {
                        match run(m, &vars, &mut budget) {
                            Ok(Value::String(s)) if !s.trim().is_empty() => {
                                Some(s.trim().to_owned())
                            }
                            _ => None,
                        }
                    });
                    return deny(
                        from_expression
                            .or_else(|| v.message.clone())
                            .unwrap_or_else(|| format!("failed expression: {}", v.expr.source)),
                    );
                }
                Ok(_) | Err(_) if self.fail_closed => {
                    return deny(format!(
                        "expression '{}' could not be evaluated",
                        v.expr.source
                    ))
                }
                _ => {}
            }
        }
        None
    }
}

/// The object as the policy's `object` sees it: the schema's fields, and
/// `apiVersion`, `kind` and `metadata` as they are.
fn root_value(object: &Json, schema: &Schema) -> Value {
    let mut map: HashMap<Key, Value> = match to_cel(object, Some(schema)) {
        Value::Map(m) => (*m.map).clone(),
        _ => HashMap::new(),
    };
    for k in ["apiVersion", "kind", "metadata"] {
        if let Some(v) = object.get(k) {
            // The server decodes metadata into ObjectMeta, where a null
            // field is an absent one (`annotations: null` makes
            // `has(object.metadata.annotations)` false there).
            let v = match (k, v) {
                ("metadata", Json::Object(fields)) => Json::Object(
                    fields
                        .iter()
                        .filter(|(_, f)| !f.is_null())
                        .map(|(n, f)| (n.clone(), f.clone()))
                        .collect(),
                ),
                _ => v.clone(),
            };
            map.insert(Key::String(Arc::new(k.into())), to_cel(&v, None));
        }
    }
    Value::Map(Map { map: Arc::new(map) })
}
