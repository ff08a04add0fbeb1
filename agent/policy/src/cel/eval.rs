//! Evaluation of checked expressions: the runtime half of the environment
//! [`super::Env`] declares.
//!
//! The `cel` crate evaluates and `kube-cel` supplies the cel-go extension
//! and Kubernetes libraries at run time; this module adds the Kyverno SDK's
//! `json.unmarshal` and runs every evaluation guarded, so a panic inside a
//! library binding reached from a policy becomes an [`EvalError`] rather
//! than a dead daemon.

use ::cel::extractors::This;
use ::cel::objects::{Key, Map};
use ::cel::{Context, ExecutionError, FunctionContext, ResolveResult, Value};
use kube_cel::KubeCelExt;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, LazyLock};

use super::CheckedExpr;

/// What one policy evaluation may spend, in the cost units of
/// [`super::program`]: every variable and expression together. The API
/// server's budget for the rules of one object (`RuntimeCELCostBudget`).
pub const RUNTIME_COST_BUDGET: u64 = 10_000_000;

/// Most elements (list items, map entries, string and bytes bytes counted
/// per 1 KiB) a result may hold; larger results are refused rather than
/// handed to a kernel map or a report.
pub const MAX_RESULT_UNITS: usize = 1 << 16;

/// Why an evaluation failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The expression failed at run time (a missing key, a division by
    /// zero, a library function refusing its argument).
    #[error("evaluation failed: {0}")]
    Execution(#[from] ExecutionError),
    /// A library binding panicked; the panic was contained.
    #[error("evaluation failed: a library function failed on this input")]
    Panicked,
    /// The result is larger than [`MAX_RESULT_UNITS`].
    #[error("the result is too large: more than {max} elements")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The evaluation spent its cost budget and was stopped.
    #[error("evaluation stopped: it spent its cost budget of {budget} units (see the cost model in the policy reference)")]
    CostExceeded {
        /// The budget.
        budget: u64,
    },
}

impl EvalError {
    /// The coarse class of the error, the vocabulary the differential test
    /// against cel-go compares (the two implementations word their
    /// messages differently, so only the class is comparable).
    pub fn class(&self) -> &'static str {
        match self {
            EvalError::Execution(e) => match e {
                ExecutionError::NoSuchKey(_) => "no_such_key",
                ExecutionError::DivisionByZero(_) => "division_by_zero",
                ExecutionError::RemainderByZero(_) => "modulus_by_zero",
                ExecutionError::IndexOutOfBounds(_) => "index_out_of_range",
                ExecutionError::Overflow(..) => "overflow",
                ExecutionError::NoSuchOverload
                | ExecutionError::UnsupportedBinaryOperator(..)
                | ExecutionError::UnsupportedUnaryOperator(..)
                | ExecutionError::ValuesNotComparable(..)
                | ExecutionError::UnsupportedTargetType { .. }
                | ExecutionError::NotSupportedAsMethod { .. }
                | ExecutionError::UnexpectedType { .. } => "no_such_overload",
                // kube-cel reports these through function errors; the
                // message is all there is to classify them by.
                ExecutionError::FunctionError { function, message } => {
                    let m = message.to_ascii_lowercase();
                    if m.contains("overflow") {
                        "overflow"
                    } else if m.contains("out of range") && function != "slice" {
                        // cel-go's slice reports a bad range as an invalid
                        // argument, its charAt and substring as a range error.
                        "index_out_of_range"
                    } else if m.contains("cannot convert") {
                        "no_such_overload"
                    } else {
                        "invalid_argument"
                    }
                }
                _ => "invalid_argument",
            },
            EvalError::Panicked | EvalError::TooLarge { .. } | EvalError::CostExceeded { .. } => {
                "invalid_argument"
            }
        }
    }
}

/// The run-time functions of [`super::Env::base`]: the `cel` standard
/// library plus everything `kube-cel` registers.
pub fn base_context() -> Context<'static> {
    let mut ctx = Context::default();
    ctx.register_all();
    // The checker declares these and the `cel` crate lacks them (or, for
    // size, counts bytes where CEL counts code points).
    ctx.add_function("dyn", identity);
    ctx.add_function("bool", to_bool);
    ctx.add_function("size", size);
    ctx.add_function("lists.range", lists_range);
    ctx
}

/// Largest `lists.range` argument evaluated. kube-cel's allocates the
/// whole range first (`lists.range(1000000000000)` would exhaust memory),
/// and the `cel` crate's map and filter copy their accumulator per element,
/// so their cost grows with the square of the range (8000 elements take
/// seconds in a debug build).
pub const MAX_RANGE: i64 = 4096;

/// `lists.range(n)`: `[0, 1, ..., n-1]`, for `0 <= n <= MAX_RANGE`.
fn lists_range(n: i64) -> ResolveResult {
    if n < 0 {
        return Err(ExecutionError::function_error(
            "lists.range",
            "range argument must be non-negative",
        ));
    }
    if n > MAX_RANGE {
        return Err(ExecutionError::function_error(
            "lists.range",
            format!("lists.range({n}) is refused: at most {MAX_RANGE} elements"),
        ));
    }
    Ok(Value::List(Arc::new((0..n).map(Value::Int).collect())))
}

/// `dyn(x)`: a no-op at run time (it only widens the static type).
fn identity(This(v): This<Value>) -> ResolveResult {
    Ok(v)
}

/// `size`: code points of a string, bytes of bytes, entries of a list or
/// map (the `cel` crate's own counts a string's bytes).
fn size(ftx: &FunctionContext<'_, '_>, This(v): This<Value>) -> ResolveResult {
    let n = match &v {
        Value::String(s) => s.chars().count(),
        Value::Bytes(b) => b.len(),
        Value::List(l) => l.len(),
        Value::Map(m) => m.map.len(),
        _ => return Err(ftx.error(format!("cannot determine the size of {v:?}"))),
    };
    Ok(Value::Int(i64::try_from(n).unwrap_or(i64::MAX)))
}

/// `bool(bool)` and `bool(string)` with cel-go's spellings.
fn to_bool(ftx: &FunctionContext<'_, '_>, This(v): This<Value>) -> ResolveResult {
    match &v {
        Value::Bool(b) => Ok(Value::Bool(*b)),
        Value::String(s) => match s.as_str() {
            "1" | "t" | "true" | "TRUE" | "True" => Ok(Value::Bool(true)),
            "0" | "f" | "false" | "FALSE" | "False" => Ok(Value::Bool(false)),
            other => Err(ftx.error(format!(
                "type conversion error from string '{other}' to bool"
            ))),
        },
        _ => Err(ftx.error(format!("cannot convert {v:?} to bool"))),
    }
}

/// [`base_context`] plus `json.unmarshal`, the run-time functions of
/// [`super::Env::policy`] that need no cluster or network (`resource.*`
/// and `http.*` results are fetched before evaluation and bound as data).
pub fn policy_context() -> Context<'static> {
    let mut ctx = base_context();
    ctx.add_function("json.unmarshal", json_unmarshal);
    ctx
}

/// One [`policy_context`] for the process: registering the libraries
/// costs more than most evaluations, and the context is read-only.
pub fn shared_policy_context() -> &'static Context<'static> {
    static CONTEXT: LazyLock<Context<'static>> = LazyLock::new(policy_context);
    &CONTEXT
}

/// `json.unmarshal(string) -> dyn`, as the Kyverno SDK has it: numbers
/// become doubles (cel-go adapts Go's `float64`), objects maps with string
/// keys.
fn json_unmarshal(s: Arc<String>) -> ResolveResult {
    let parsed: serde_json::Value = serde_json::from_str(&s)
        .map_err(|e| ExecutionError::function_error("json.unmarshal", e))?;
    Ok(json_to_value(&parsed))
}

/// The CEL name of a value's type, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::Function(..) => "a function",
        Value::Int(_) => "an int",
        Value::UInt(_) => "a uint",
        Value::Float(_) => "a double",
        Value::String(_) => "a string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "a bool",
        Value::Duration(_) => "a duration",
        Value::Timestamp(_) => "a timestamp",
        Value::Opaque(_) => "an opaque value",
        Value::Null => "null",
    }
}

/// A JSON document as a CEL value, with every number a double.
pub fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(xs) => {
            Value::List(Arc::new(xs.iter().map(json_to_value).collect()))
        }
        serde_json::Value::Object(m) => {
            let map: HashMap<Key, Value> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_value(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// Evaluates a checked expression in `ctx` with the `cel` crate's own
/// interpreter, unbudgeted. Kept as the baseline the benchmark compares
/// [`super::program::Program`] with; policies are evaluated by the latter.
///
/// The expression's nesting is bounded by the checker, which bounds the
/// evaluator's recursion, so this runs on the caller's thread; a panic in a
/// library binding is caught, and an oversized result refused.
pub fn evaluate(expr: &CheckedExpr, ctx: &Context<'_>) -> Result<Value, EvalError> {
    let result = catch_unwind(AssertUnwindSafe(|| Value::resolve(&expr.ast, ctx)));
    match result {
        Ok(Ok(v)) => {
            if units(&v, MAX_RESULT_UNITS) > MAX_RESULT_UNITS {
                Err(EvalError::TooLarge {
                    max: MAX_RESULT_UNITS,
                })
            } else {
                Ok(v)
            }
        }
        Ok(Err(e)) => Err(EvalError::Execution(e)),
        Err(_) => Err(EvalError::Panicked),
    }
}

/// The size of `v` in [`MAX_RESULT_UNITS`] units, counting stopped once
/// past `limit` so a huge value costs no more than the limit to measure.
pub(crate) fn units(v: &Value, limit: usize) -> usize {
    match v {
        Value::String(s) => return s.len() / 1024,
        Value::Bytes(b) => return b.len() / 1024,
        Value::List(_) | Value::Map(_) => {}
        _ => return 0,
    }
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += match v {
            Value::List(xs) => {
                stack.extend(xs.iter());
                xs.len()
            }
            Value::Map(m) => {
                stack.extend(m.map.values());
                m.map.len()
            }
            Value::String(s) => s.len() / 1024,
            Value::Bytes(b) => b.len() / 1024,
            _ => 0,
        };
        if total > limit {
            break;
        }
    }
    total
}
