//! `x-kubernetes-validations` rules: compiled once with our CEL checker
//! (the environment the API server gives CRD rules: the base libraries and
//! `self` typed from the schema), evaluated on each value with our CEL
//! evaluator.
//!
//! What happens on create follows `apiextensions-apiserver/pkg/apiserver/
//! schema/cel/validation.go` (kube-apiserver 1.37): a rule that reads
//! `oldSelf` is a transition rule and does not run on create; a rule runs
//! only where its value is present and not null; the message is the
//! `messageExpression`'s result when that evaluates to a non-empty
//! single-line string, else `message`, else `failed rule: <rule>`; one
//! cost budget covers every rule of the object.

use super::schema::{Additional, Schema};
use super::SetupError;
use crate::cel::eval::{shared_policy_context, EvalError};
use crate::cel::program::{Budget, Program};
use crate::cel::{self, Env, Type};
use ::cel::objects::{Key, Map};
use ::cel::Value;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::sync::Arc;

/// One compiled rule.
#[derive(Debug)]
pub(crate) struct Rule {
    pub(crate) source: String,
    message: Option<String>,
    message_expression: Option<Program>,
    pub(crate) reason: Option<String>,
    pub(crate) field_path: Option<String>,
    program: Program,
    uses_old_self: bool,
}

/// How one rule judged one value.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The rule holds, or does not run here.
    Pass,
    /// The rule is false: the message to report.
    Fail(String),
    /// The rule could not be evaluated: the error to report.
    Error(String),
    /// The object's cost budget is spent: no further rules run.
    OutOfBudget,
}

/// The environment CRD rules are checked in: the base libraries, `self`
/// and `oldSelf`.
fn rule_env(self_type: &Type) -> Env {
    let mut env = Env::base();
    env.add_variable("self", self_type.clone());
    env.add_variable("oldSelf", self_type.clone());
    env
}

impl Rule {
    /// Compiles one entry of `x-kubernetes-validations`.
    pub(crate) fn compile(json: &Json, self_type: &Type, at: &str) -> Result<Rule, SetupError> {
        let text = |k: &str| json.get(k).and_then(Json::as_str).map(str::to_owned);
        let Some(source) = text("rule") else {
            return Err(SetupError::Rule(format!("{at}: no `rule`")));
        };
        if json.get("optionalOldSelf").and_then(Json::as_bool) == Some(true) {
            return Err(SetupError::Rule(format!(
                "{at}: optionalOldSelf is not interpreted by policy check"
            )));
        }
        let env = rule_env(self_type);
        let compile = |src: &str, want: Type| -> Result<Program, SetupError> {
            let checked = cel::check(src, &env).map_err(|errs| {
                let errs: Vec<String> = errs.iter().map(ToString::to_string).collect();
                SetupError::Rule(format!("{at}: `{src}`: {}", errs.join("; ")))
            })?;
            if !(checked.ty.is_exact(&want) || checked.ty == Type::Dyn) {
                return Err(SetupError::Rule(format!(
                    "{at}: `{src}` has type {}, not {want}",
                    checked.ty
                )));
            }
            Ok(Program::new(&checked, &env, &HashMap::new()))
        };
        let program = compile(&source, Type::Bool)?;
        let message_expression = match text("messageExpression") {
            Some(m) => Some(compile(&m, Type::String)?),
            None => None,
        };
        let uses_old_self = program.globals().iter().any(|g| g == "oldSelf");
        Ok(Rule {
            source,
            message: text("message"),
            message_expression,
            reason: text("reason"),
            field_path: text("fieldPath"),
            program,
            uses_old_self,
        })
    }

    /// `message`, or the rule itself: what the server names a rule by.
    fn name(&self) -> &str {
        self.message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(self.source.trim())
    }

    /// Judges `this` (the value at the rule's node) on create.
    pub(crate) fn judge(&self, this: &Value, budget: &mut Budget) -> Verdict {
        if self.uses_old_self {
            return Verdict::Pass;
        }
        match run(&self.program, this, budget) {
            Ok(Value::Bool(true)) => Verdict::Pass,
            Ok(Value::Bool(false)) => Verdict::Fail(self.message(this, budget)),
            Ok(other) => Verdict::Error(format!(
                "rule evaluated to {}, not a bool: {}",
                cel::eval::type_name(&other),
                self.name()
            )),
            Err(EvalError::CostExceeded { .. }) => Verdict::OutOfBudget,
            Err(e) => Verdict::Error(format!("{e} evaluating rule: {}", self.name())),
        }
    }

    fn message(&self, this: &Value, budget: &mut Budget) -> String {
        if let Some(p) = &self.message_expression {
            if let Ok(Value::String(s)) = run(p, this, budget) {
                let s = s.trim();
                if !s.is_empty() && !s.contains('\n') && s.len() <= MAX_MESSAGE_BYTES {
                    return s.to_owned();
                }
            }
        }
        match self.message.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => m.to_owned(),
            _ => format!("failed rule: {}", self.source.trim()),
        }
    }
}

/// Longest messageExpression result used (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

fn run(program: &Program, this: &Value, budget: &mut Budget) -> Result<Value, EvalError> {
    let globals: Vec<Option<Value>> = program
        .globals()
        .iter()
        .map(|g| (g == "self").then(|| this.clone()))
        .collect();
    program.run(&globals, shared_policy_context(), budget)
}

/// The CEL reserved words a property name cannot be used as unescaped.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as CEL sees it (`Escape` of k8s.io/apiserver/pkg/cel):
/// a reserved word becomes `__word__`; `__`, `.`, `-` and `/` are spelled
/// `__underscores__`, `__dot__`, `__dash__`, `__slash__`; a name with any
/// other character, or starting with a digit, is not accessible (`None`).
pub(crate) fn escape(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// A JSON value as the CEL value `self` is at a node of this schema
/// (`UnstructuredToVal`): integers are ints where the schema says integer,
/// an object with declared properties has its names escaped and its null
/// fields absent (so `has()` is false for them), a map keeps its keys.
pub(crate) fn to_cel(v: &Json, s: Option<&Schema>) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            let integer = s.is_some_and(|s| s.ty.as_deref() == Some("integer") || s.int_or_string)
                || s.is_none_or(|s| s.ty.is_none());
            match (integer, n.as_i64()) {
                (true, Some(i)) => Value::Int(i),
                (true, None)
                    if n.as_f64()
                        .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.2e18) =>
                {
                    Value::Int(n.as_f64().map(|f| f as i64).unwrap_or_default())
                }
                _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            }
        }
        Json::String(t) => Value::String(Arc::new(t.clone())),
        Json::Array(items) => {
            let item = s.and_then(|s| s.items.as_deref());
            Value::List(Arc::new(items.iter().map(|v| to_cel(v, item)).collect()))
        }
        Json::Object(m) => {
            let object = s.is_some_and(|s| !s.properties.is_empty() || s.embedded);
            let mut out = HashMap::with_capacity(m.len());
            for (k, v) in m {
                if object {
                    if v.is_null() {
                        continue;
                    }
                    let (Some(name), Some(p)) = (escape(k), s.and_then(|s| s.properties.get(k)))
                    else {
                        continue;
                    };
                    out.insert(Key::String(Arc::new(name)), to_cel(v, Some(p)));
                } else {
                    let p = s.and_then(|s| match &s.additional {
                        Additional::Schema(a) => Some(a.as_ref()),
                        _ => None,
                    });
                    out.insert(Key::String(Arc::new(k.clone())), to_cel(v, p));
                }
            }
            Value::Map(Map { map: Arc::new(out) })
        }
    }
}

/// A fresh budget for one object's rules: the API server's
/// `RuntimeCELCostBudget`, in our evaluator's units.
pub(crate) fn object_budget() -> Budget {
    Budget::new(crate::cel::eval::RUNTIME_COST_BUDGET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn property_names_are_escaped_as_the_api_server_does() {
        assert_eq!(escape("podSelector").as_deref(), Some("podSelector"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(
            escape("a-b.c/d").as_deref(),
            Some("a__dash__b__dot__c__slash__d")
        );
        assert_eq!(escape("x__y").as_deref(), Some("x__underscores__y"));
        assert_eq!(escape("1a"), None);
        assert_eq!(escape("a b"), None);
    }
}
