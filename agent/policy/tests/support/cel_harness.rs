//! The Rust side of the cel-go differential test, shared by
//! `tests/cel_differential.rs` and `benches/cel_corpus.rs` (both include
//! this file by path, so the benchmark times exactly what the test checks).
//!
//! The corpus (`tests/cel_corpus/*.yaml`) is read in byte order of file
//! name, the order `ci/cel-oracle` hands the files to the Go oracle. Values
//! are compared in the canonical JSON shape `oracle/main.go` (`encode`)
//! defines, errors by class.

#![allow(dead_code)] // each includer uses a different part

use kyverno_runtime_policy::cel::eval::{evaluate, EvalError};
use kyverno_runtime_policy::cel::program::{Budget, Program};
use kyverno_runtime_policy::cel::{check, CheckErrorKind, CheckedExpr, Env, Type};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Value};

/// A typed variable of a case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Var {
    /// Its type, in the corpus syntax (`list(string)`).
    #[serde(rename = "type")]
    pub ty: String,
    /// Its value.
    pub value: serde_yaml::Value,
}

/// One corpus case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Case {
    /// Unique name.
    pub name: String,
    /// The expression.
    pub expr: String,
    /// Its variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, Var>,
}

/// What one implementation says about a case: a golden line.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Outcome {
    /// The checked type.
    #[serde(rename = "type", default)]
    pub ty: Option<String>,
    /// The class of the check error.
    #[serde(default)]
    pub check_error: Option<String>,
    /// The value, canonical JSON.
    #[serde(default)]
    pub value: Option<serde_json::Value>,
    /// The class of the evaluation error.
    #[serde(default)]
    pub eval_error: Option<String>,
    /// A message for a reader, never compared.
    #[serde(default)]
    pub detail: Option<String>,
}

/// A golden line.
#[derive(Clone, Debug, Deserialize)]
pub struct Golden {
    /// The case.
    pub name: String,
    /// cel-go's outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// `agent/policy/tests/cel_corpus`.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cel_corpus")
}

/// Every case, in the oracle's order.
pub fn load_corpus() -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap_or_else(|e| panic!("corpus dir: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut cs: Vec<Case> =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        cases.append(&mut cs);
    }
    cases
}

/// The committed cel-go output, by case name.
pub fn load_golden() -> BTreeMap<String, Outcome> {
    let path = corpus_dir().join("golden.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let g: Golden = serde_json::from_str(l).unwrap_or_else(|e| panic!("golden {l}: {e}"));
            let mut o = g.outcome;
            // `"value": null` is a null result, not an absent one.
            let raw: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("golden {l}: {e}"));
            if raw.get("value").is_some() && o.value.is_none() {
                o.value = Some(serde_json::Value::Null);
            }
            o.value = o.value.map(normalize);
            (g.name, o)
        })
        .collect()
}

/// Parses the corpus type syntax.
pub fn parse_type(s: &str) -> Type {
    fn go(s: &str) -> (Type, &str) {
        let s = s.trim_start();
        if let Some(rest) = s.strip_prefix("list(") {
            let (e, rest) = go(rest);
            let rest = rest
                .trim_start()
                .strip_prefix(')')
                .unwrap_or_else(|| panic!("type {s}"));
            return (Type::list(e), rest);
        }
        if let Some(rest) = s.strip_prefix("map(") {
            let (k, rest) = go(rest);
            let rest = rest
                .trim_start()
                .strip_prefix(',')
                .unwrap_or_else(|| panic!("type {s}"));
            let (v, rest) = go(rest);
            let rest = rest
                .trim_start()
                .strip_prefix(')')
                .unwrap_or_else(|| panic!("type {s}"));
            return (Type::map(k, v), rest);
        }
        let end = s.find([',', ')']).unwrap_or(s.len());
        let t = match s[..end].trim() {
            "string" => Type::String,
            "int" => Type::Int,
            "uint" => Type::Uint,
            "double" => Type::Double,
            "bool" => Type::Bool,
            "bytes" => Type::Bytes,
            "dyn" => Type::Dyn,
            "null" => Type::Null,
            other => panic!("unknown corpus type {other}"),
        };
        (t, &s[end..])
    }
    let (t, rest) = go(s);
    assert!(rest.trim().is_empty(), "trailing text in type {s}");
    t
}

/// A YAML value as a CEL value of type `ty`; `dyn` keeps JSON's typing
/// (numbers are doubles), as the oracle does.
pub fn to_value(ty: &Type, v: &serde_yaml::Value) -> Value {
    use serde_yaml::Value as Y;
    match (ty, v) {
        (Type::Int, Y::Number(n)) => Value::Int(n.as_i64().unwrap_or_else(|| panic!("int {n}"))),
        (Type::Uint, Y::Number(n)) => Value::UInt(n.as_u64().unwrap_or_else(|| panic!("uint {n}"))),
        (Type::Double | Type::Dyn, Y::Number(n)) => {
            Value::Float(n.as_f64().unwrap_or_else(|| panic!("double {n}")))
        }
        (_, Y::String(s)) => Value::String(Arc::new(s.clone())),
        (_, Y::Bool(b)) => Value::Bool(*b),
        (_, Y::Null) => Value::Null,
        (t, Y::Sequence(xs)) => {
            let elem = match t {
                Type::List(e) => (**e).clone(),
                _ => Type::Dyn,
            };
            Value::List(Arc::new(xs.iter().map(|x| to_value(&elem, x)).collect()))
        }
        (t, Y::Mapping(m)) => {
            let val = match t {
                Type::Map(_, v) => (**v).clone(),
                _ => Type::Dyn,
            };
            let map = m
                .iter()
                .map(|(k, v)| {
                    let k = k.as_str().unwrap_or_else(|| panic!("map key {k:?}"));
                    (Key::String(Arc::new(k.to_string())), to_value(&val, v))
                })
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
        (t, v) => panic!("cannot read {v:?} as {t}"),
    }
}

/// The class of a check error, in the oracle's vocabulary
/// (`oracle/main.go`: `checkClass`).
pub fn check_class(kind: &CheckErrorKind) -> &'static str {
    match kind {
        CheckErrorKind::Parse(_) => "syntax",
        CheckErrorKind::UnknownIdent { .. } | CheckErrorKind::UnknownFunction { .. } => {
            "undeclared"
        }
        // cel-go checks the operands of && and || against bool directly
        // ("expected type 'bool'") rather than through overloads.
        CheckErrorKind::NoMatchingOverload { name, .. } if name == "&&" || name == "||" => {
            "type_mismatch"
        }
        // cel-go refuses a non-bool macro predicate through the operator
        // the macro expands to: && or || for all and exists, a ternary
        // (an overload) for exists_one, filter and map's filter.
        CheckErrorKind::PredicateNotBool { macro_name, .. } => match *macro_name {
            "all" | "exists" => "type_mismatch",
            _ => "no_matching_overload",
        },
        CheckErrorKind::WrongCallStyle { .. }
        | CheckErrorKind::WrongArity { .. }
        | CheckErrorKind::NoMatchingOverload { .. } => "no_matching_overload",
        CheckErrorKind::UnknownField { .. } | CheckErrorKind::UnavailableField { .. } => {
            "undefined_field"
        }
        CheckErrorKind::NoFields { .. } => "no_fields",
        CheckErrorKind::NotARange { .. } => "not_a_range",
        CheckErrorKind::TypeMismatch { .. } => "type_mismatch",
        CheckErrorKind::Unsupported(_) => "unsupported",
        _ => "other",
    }
}

/// A case compiled on the Rust side: its checked expression, its program
/// and variable values, or its check-error outcome.
pub struct Compiled {
    /// The checked expression.
    pub checked: CheckedExpr,
    /// The program the evaluator runs.
    pub program: Program,
    /// The variables, by name.
    pub vars: Vec<(String, Value)>,
}

/// The budget of one case's evaluation (the policy default).
pub const BUDGET: u64 = kyverno_runtime_policy::cel::eval::RUNTIME_COST_BUDGET;

/// The environment of a case: [`Env::policy`] plus its variables.
pub fn case_env(base: &Env, case: &Case) -> Env {
    let mut env = base.clone();
    for (name, v) in &case.vars {
        env.add_variable(name.clone(), parse_type(&v.ty));
    }
    env
}

/// Parses, checks and plans a case (the Rust "compile" phase).
pub fn compile(env: &Env, case: &Case) -> Result<Compiled, Box<Outcome>> {
    match check(&case.expr, env) {
        Ok(checked) => Ok(Compiled {
            program: Program::new(&checked, env, &Default::default()),
            checked,
            vars: case
                .vars
                .iter()
                .map(|(n, v)| (n.clone(), to_value(&parse_type(&v.ty), &v.value)))
                .collect(),
        }),
        Err(errs) => Err(Box::new(Outcome {
            check_error: Some(
                errs.first()
                    .map_or("other", |e| check_class(&e.kind))
                    .to_string(),
            ),
            detail: errs.first().map(ToString::to_string),
            ..Outcome::default()
        })),
    }
}

/// Evaluates a compiled case: its variables bound to the program's names,
/// library functions called through `ctx`.
pub fn eval(ctx: &Context<'_>, c: &Compiled) -> Result<Value, EvalError> {
    let globals: Vec<Option<Value>> = c
        .program
        .globals()
        .iter()
        .map(|g| c.vars.iter().find(|(n, _)| n == g).map(|(_, v)| v.clone()))
        .collect();
    c.program.run(&globals, ctx, &mut Budget::new(BUDGET))
}

/// Evaluates a compiled case with the `cel` crate's interpreter in a child
/// scope of `ctx` (the baseline the benchmark compares with).
pub fn eval_cel_crate(ctx: &Context<'_>, c: &Compiled) -> Result<Value, EvalError> {
    let mut scope = ctx.new_inner_scope();
    for (n, v) in &c.vars {
        scope.add_variable_from_value(n.clone(), v.clone());
    }
    evaluate(&c.checked, &scope)
}

/// The whole Rust outcome of a case.
pub fn run(base: &Env, ctx: &Context<'_>, case: &Case) -> Outcome {
    let env = case_env(base, case);
    let c = match compile(&env, case) {
        Ok(c) => c,
        Err(o) => return *o,
    };
    let mut out = Outcome {
        ty: Some(cel_go_type_name(&c.checked.ty)),
        ..Outcome::default()
    };
    match eval(ctx, &c) {
        Ok(v) => out.value = Some(normalize(encode(&v))),
        Err(e) => {
            out.eval_error = Some(e.class().to_string());
            out.detail = Some(e.to_string());
        }
    }
    out
}

/// A type as cel-go's `FormatCELType` spells it: the checker's names are
/// the protobuf ones for duration and timestamp and `null_type` for null.
pub fn cel_go_type_name(t: &Type) -> String {
    t.to_string()
        .replace("google.protobuf.Duration", "duration")
        .replace("google.protobuf.Timestamp", "timestamp")
        .replace("null_type", "null")
}

/// The canonical JSON of a value (`oracle/main.go`: `encode`).
pub fn encode(v: &Value) -> serde_json::Value {
    use serde_json::{json, Value as J};
    let double = |f: f64| {
        if f.is_nan() {
            json!({"double": "NaN"})
        } else if f.is_infinite() {
            json!({"double": if f > 0.0 { "+Inf" } else { "-Inf" }})
        } else {
            json!({ "double": f })
        }
    };
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => json!(i),
        Value::UInt(u) => json!({ "uint": u }),
        Value::Float(f) => double(*f),
        Value::String(s) => J::String(s.to_string()),
        Value::Bytes(b) => {
            json!({ "bytes": base64_std(b) })
        }
        Value::List(xs) => J::Array(xs.iter().map(encode).collect()),
        Value::Map(m) => {
            let mut entries: Vec<(String, J)> = m
                .map
                .iter()
                .map(|(k, v)| {
                    let kj = match k {
                        Key::Int(i) => json!(i),
                        Key::Uint(u) => json!({ "uint": u }),
                        Key::Bool(b) => json!(b),
                        Key::String(s) => json!(s.as_str()),
                    };
                    (kj.to_string(), json!([kj, encode(v)]))
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            json!({ "map": entries.into_iter().map(|e| e.1).collect::<Vec<_>>() })
        }
        Value::Duration(d) => json!({ "duration_ns": d.num_nanoseconds() }),
        Value::Timestamp(t) => {
            // Go's RFC3339Nano: UTC, fractional seconds with trailing zeros
            // trimmed (chrono is not a dependency here, so by hand).
            let utc = t.naive_utc();
            let nanos = t.timestamp_subsec_nanos();
            let mut s = utc.format("%Y-%m-%dT%H:%M:%S").to_string();
            if nanos != 0 {
                let frac = format!("{nanos:09}");
                s.push('.');
                s.push_str(frac.trim_end_matches('0'));
            }
            s.push('Z');
            json!({ "timestamp": s })
        }
        Value::Opaque(o) => json!({ "opaque": o.runtime_type_name() }),
        Value::Function(name, _) => json!({ "function": name.as_str() }),
    }
}

/// Standard padded base64, as Go's `base64.StdEncoding`.
fn base64_std(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.len();
        let v = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= n {
                out.push(A[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Makes the numbers inside `{"double": n}` floats, so that Go's `1` and
/// Rust's `1.0` compare equal there (and only there: an int stays an int).
pub fn normalize(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::Object(m) => {
            if m.len() == 1 {
                if let Some(J::Number(n)) = m.get("double") {
                    let f = n.as_f64().unwrap_or(f64::NAN);
                    return serde_json::json!({ "double": f });
                }
            }
            J::Object(m.into_iter().map(|(k, v)| (k, normalize(v))).collect())
        }
        J::Array(xs) => J::Array(xs.into_iter().map(normalize).collect()),
        other => other,
    }
}

/// Whether the Rust outcome agrees with cel-go's: the same type or the
/// same check-error class, then the same value or the same evaluation-error
/// class. cel-go's `program` (a constant argument refused while planning,
/// e.g. a literal bad regex) is an evaluation error on the Rust side, where
/// nothing is planned ahead.
pub fn agrees(rust: &Outcome, go: &Outcome) -> bool {
    if go.check_error.is_some() || rust.check_error.is_some() {
        return go.check_error == rust.check_error;
    }
    if go.ty != rust.ty {
        return false;
    }
    match (&go.eval_error, &rust.eval_error) {
        (Some(g), Some(r)) => g == r || (g == "program" && r == "invalid_argument"),
        (None, None) => go.value == rust.value,
        _ => false,
    }
}
