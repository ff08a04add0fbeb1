//! Static type checking of RuntimePolicy CEL expressions.
//!
//! The `cel` crate parses and evaluates but does not type-check; cel-go
//! does, and the policy contract is cel-go's: a behavior or variable
//! expression must have the static type `list(string)`, a monitorFilter
//! expression `bool`, and anything typed `dyn` (what `json.unmarshal` and
//! `http.get(...).body` return) needs an explicit coercion such as
//! `.map(x, string(x))`. This module is that checker, over the AST the
//! `cel` 0.13 parser produces (macros already expanded into
//! comprehensions).
//!
//! - [`types`]: the type model ([`Type`]) and cel-go's assignability;
//! - [`decls`]: declarations ([`Env`]): the standard library, the cel-go
//!   and Kubernetes extension libraries, the Kyverno SDK functions and the
//!   monitorFilter `event` object;
//! - [`eval`]: the run-time half: the `cel` context with `kube-cel` and
//!   `json.unmarshal` (the library functions), and evaluation errors;
//! - [`program`]: the evaluator: a [`CheckedExpr`] compiled into a
//!   [`program::Program`] and run with a cost budget;
//! - [`check_list_of_strings`], [`check_bool`], [`check_variables`]: the
//!   entry points, which collect every error rather than stopping at the
//!   first.
//!
//! Variables: a variable may use the variables declared *before* it in
//! `spec.variables`, as `variables.<name>`; naming itself or a later one is
//! refused (so a cycle cannot be written). Behavior expressions see all of
//! them.
//!
//! Known deviations from cel-go: no protobuf message types (object
//! construction is refused); no optional types (`?.`, `[?_]`,
//! `optional.of`, `lists.first`); `format.*` named formats, two-variable
//! comprehensions and `sortBy` are not declared; the Kubernetes quantity
//! and semver `isGreaterThan`/`compareTo` are declared per type;
//! `math.sqrt` and the `math.bit*` functions are declared only for the
//! argument types kube-cel implements (double; int), so the others are
//! refused when a policy compiles rather than at every evaluation.
//! Every remaining difference the differential corpus finds is listed,
//! with its reason, in `tests/cel_differential.rs` (`KNOWN_DIFFERENCES`).
//! Sub-expressions are named by their rendering rather than a source
//! offset, because the parser keeps offsets only on parse errors.

mod check;
pub mod cost;
pub mod decls;
pub mod eval;
mod library;
pub mod program;
mod render;
mod syntax;
pub mod types;

pub use decls::{event_type, Env, Overload};
pub use types::{ObjectType, Type};

use ::cel::common::ast::IdedExpr;
use ::cel::parser::Parser;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Longest expression accepted (the CRD's bound, checked again here so a
/// hand-made object cannot hand the parser anything larger).
pub const MAX_SOURCE_LEN: usize = kyverno_runtime_api::runtimepolicy::MAX_EXPRESSION_LEN;

/// Deepest nesting the parser accepts.
const PARSER_MAX_DEPTH: u16 = 64;

/// One reason an expression was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}{kind} (in `{expr}`)", origin.as_deref().map(|o| format!("{o}: ")).unwrap_or_default())]
pub struct CheckError {
    /// Where the expression came from (`variables.a`), when known.
    pub origin: Option<String>,
    /// The offending sub-expression, rendered.
    pub expr: String,
    /// What is wrong with it.
    pub kind: CheckErrorKind,
}

/// What is wrong with a sub-expression.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CheckErrorKind {
    /// The source did not parse.
    #[error("syntax error: {0}")]
    Parse(String),
    /// The parser or checker could not run (a panic inside the parser, or
    /// no thread to run on).
    #[error("the expression could not be checked: {0}")]
    Internal(String),
    /// The source is longer than [`MAX_SOURCE_LEN`].
    #[error("expression is {len} bytes long; at most {max} are accepted")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Nesting deeper than the checker walks.
    #[error("expression nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// A construct the checker does not support.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// An undeclared identifier.
    #[error("unknown identifier {name}{}", did_you_mean(suggestions))]
    UnknownIdent {
        /// The identifier.
        name: String,
        /// Close declared names.
        suggestions: Vec<String>,
    },
    /// An undeclared function.
    #[error("unknown {} {name}{}", if *method { "method" } else { "function" }, did_you_mean(suggestions))]
    UnknownFunction {
        /// The function.
        name: String,
        /// Called as a method.
        method: bool,
        /// Close declared names.
        suggestions: Vec<String>,
    },
    /// A global function called as a method or the other way round.
    #[error("{}", call_style(name, *method))]
    WrongCallStyle {
        /// The function.
        name: String,
        /// It was called as a method.
        method: bool,
    },
    /// No overload takes this many arguments.
    #[error("{name} takes no {got} argument(s); its overloads are: {}", candidates.join("; "))]
    WrongArity {
        /// The function.
        name: String,
        /// Arguments given (excluding a receiver).
        got: usize,
        /// The declared overloads.
        candidates: Vec<String>,
    },
    /// No overload accepts these argument types.
    #[error("no overload of {name} takes ({}); candidates: {}", types_list(args), candidates.join("; "))]
    NoMatchingOverload {
        /// The function.
        name: String,
        /// Argument types (receiver first).
        args: Vec<Type>,
        /// The overloads of that arity.
        candidates: Vec<String>,
    },
    /// A field an object type does not have.
    #[error("{object} has no field {field}; valid fields: {}", valid.join(", "))]
    UnknownField {
        /// The object type.
        object: String,
        /// The field.
        field: String,
        /// Its fields.
        valid: Vec<String>,
    },
    /// A known name that is not usable here.
    #[error("{object}.{field} is not available here: {reason}")]
    UnavailableField {
        /// The object type.
        object: String,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// Field selection on a type that has no fields.
    #[error("type {ty} has no fields")]
    NoFields {
        /// The operand's type.
        ty: Type,
    },
    /// A comprehension over something that is not a list or map.
    #[error("type {ty} cannot be iterated: a macro's range must be a list or a map")]
    NotARange {
        /// The range's type.
        ty: Type,
    },
    /// A macro predicate that is not bool.
    #[error("the predicate of {macro_name}() must be bool, not {found}")]
    PredicateNotBool {
        /// The macro.
        macro_name: &'static str,
        /// The predicate's type.
        found: Type,
    },
    /// A sub-expression of the wrong type.
    #[error("expected {expected}, found {found}")]
    TypeMismatch {
        /// Wanted.
        expected: Type,
        /// Found.
        found: Type,
    },
    /// The whole expression has the wrong type.
    #[error("expression has type {found}; {what} must be {required}{}", hint.as_deref().map(|h| format!(": {h}")).unwrap_or_default())]
    WrongResultType {
        /// Its type.
        found: Type,
        /// The type required.
        required: Type,
        /// What kind of expression it is ("a behavior expression").
        what: &'static str,
        /// How to fix it.
        hint: Option<String>,
    },
    /// A variable name declared twice.
    #[error("variable {0} is declared more than once")]
    DuplicateVariable(String),
}

fn call_style(name: &str, method: bool) -> String {
    if method {
        format!("{name} is a global function, not a method: call it as {name}(x, ...)")
    } else {
        format!("{name} is a method: call it as x.{name}(...)")
    }
}

fn did_you_mean(s: &[String]) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", s.join(", "))
    }
}

fn types_list(ts: &[Type]) -> String {
    ts.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A type-checked expression.
#[derive(Clone, Debug)]
pub struct CheckedExpr {
    /// The source as written.
    pub source: String,
    /// The parsed expression (macros expanded).
    pub ast: IdedExpr,
    /// Its static type.
    pub ty: Type,
}

/// What a checked expression is for, which decides its required type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A behavior's allow/deny expression: `list(string)`.
    Behavior,
    /// A `spec.variables` expression: any type, which is then the type of
    /// `variables.<name>` (the Go original's compiler registers each
    /// variable with its expression's output type, and its documented
    /// examples rely on it: a variable holding a fetched JSON document,
    /// converted where a behavior uses it). The behavior using it must
    /// still be `list(string)`.
    Variable,
    /// A monitorFilter expression: `bool`.
    MonitorFilter,
}

impl Purpose {
    fn what(self) -> &'static str {
        match self {
            Purpose::Behavior => "a behavior expression",
            Purpose::Variable => "a variable",
            Purpose::MonitorFilter => "a monitorFilter expression",
        }
    }

    /// The type an expression for this purpose must have; `None`: any.
    pub fn required(self) -> Option<Type> {
        match self {
            Purpose::Behavior => Some(Type::list(Type::String)),
            Purpose::Variable => None,
            Purpose::MonitorFilter => Some(Type::Bool),
        }
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what())
    }
}

fn whole(source: &str, kind: CheckErrorKind) -> Vec<CheckError> {
    vec![CheckError {
        origin: None,
        expr: syntax::shown(source),
        kind,
    }]
}

/// Parses `source`, turning a panic inside the parser into an error. Deep
/// chains recurse deeply: call only on a [`CHECK_STACK`] thread.
fn parse(source: &str) -> Result<IdedExpr, Vec<CheckError>> {
    if source.len() > MAX_SOURCE_LEN {
        return Err(whole(
            source,
            CheckErrorKind::TooLong {
                len: source.len(),
                max: MAX_SOURCE_LEN,
            },
        ));
    }
    let parsed = catch_unwind(AssertUnwindSafe(|| {
        Parser::new()
            .max_recursion_depth(PARSER_MAX_DEPTH)
            .parse(source)
    }));
    match parsed {
        Ok(Ok(ast)) => Ok(ast),
        Ok(Err(errs)) => Err(parse_errors(source, &errs.errors)),
        Err(_) => Err(whole(
            source,
            CheckErrorKind::Internal("the parser failed on this input".to_string()),
        )),
    }
}

/// The parser's errors as the user reads them (see [`syntax`]): nesting
/// past the limit is [`CheckErrorKind::TooDeep`]; the parser's follow-up
/// reports naming its internals are dropped; at most
/// [`syntax::MAX_SHOWN`] different messages, first by position.
fn parse_errors(source: &str, errors: &[::cel::parser::ParseError]) -> Vec<CheckError> {
    let mut messages: Vec<String> = Vec::new();
    for e in errors {
        match syntax::word(e) {
            syntax::Wording::TooDeep => {
                return whole(
                    source,
                    CheckErrorKind::TooDeep {
                        max: usize::from(PARSER_MAX_DEPTH),
                    },
                )
            }
            syntax::Wording::Internal => {}
            syntax::Wording::Message(m) => {
                if !messages.contains(&m) {
                    messages.push(m);
                }
            }
        }
    }
    if messages.is_empty() {
        messages.push("the expression is incomplete".to_string());
    }
    messages
        .into_iter()
        .take(syntax::MAX_SHOWN)
        .map(|m| CheckError {
            origin: None,
            expr: syntax::shown(source),
            kind: CheckErrorKind::Parse(m.chars().take(300).collect()),
        })
        .collect()
}

/// Stack of the thread that parses and checks: the parser recurses once
/// per link of a member or operator chain, which the parser's own limit
/// does not count, so a [`MAX_SOURCE_LEN`] chain needs more than a default
/// thread's stack (the hostile-input tests, each as long as allowed, pass
/// with 12 MiB in a debug build and overflow 4 MiB). Only touched pages
/// are committed.
const CHECK_STACK: usize = 64 << 20;

/// Parses and checks `source`, returning its type whatever it is.
///
/// Runs on its own thread with a 64 MiB stack, so no input can
/// overflow the caller's; an expression nested deeper than the checker's
/// limit is refused (and dropped on that thread).
pub fn check(source: &str, env: &Env) -> Result<CheckedExpr, Vec<CheckError>> {
    let worker = std::thread::Builder::new()
        .name("cel-check".into())
        .stack_size(CHECK_STACK);
    let spawned = std::thread::scope(|s| {
        worker
            .spawn_scoped(s, || check_here(source, env))
            .map(|h| h.join())
    });
    match spawned {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(whole(
            source,
            CheckErrorKind::Internal("the checker failed on this input".to_string()),
        )),
        Err(e) => Err(whole(
            source,
            CheckErrorKind::Internal(format!("cannot start the checker thread: {e}")),
        )),
    }
}

fn check_here(source: &str, env: &Env) -> Result<CheckedExpr, Vec<CheckError>> {
    let ast = parse(source)?;
    let mut checker = check::Checker::new(env);
    let ty = checker.check_root(&ast);
    if !checker.errors.is_empty() {
        return Err(checker.errors);
    }
    Ok(CheckedExpr {
        source: source.to_string(),
        ast,
        ty,
    })
}

/// Checks `source` for `purpose`: its type must be exactly
/// [`Purpose::required`] where there is one (cel-go's `IsExactType`, so
/// `list(dyn)` and `dyn` are refused).
pub fn check_for(
    source: &str,
    env: &Env,
    purpose: Purpose,
) -> Result<CheckedExpr, Vec<CheckError>> {
    let checked = check(source, env)?;
    let Some(required) = purpose.required() else {
        return Ok(checked);
    };
    if checked.ty.is_exact(&required) {
        return Ok(checked);
    }
    let hint = match (&checked.ty, purpose) {
        (Type::Dyn, Purpose::MonitorFilter) => Some("coerce with bool(...) or compare it".into()),
        (Type::Dyn, _) => Some("coerce with .map(x, string(x))".into()),
        (Type::List(_), Purpose::Behavior) => {
            Some("convert the elements with .map(x, string(x))".into())
        }
        (Type::String, Purpose::Behavior) => Some("wrap a single value in a list: [...]".into()),
        _ => None,
    };
    Err(whole(
        source,
        CheckErrorKind::WrongResultType {
            found: checked.ty,
            required,
            what: purpose.what(),
            hint,
        },
    ))
}

/// Checks a behavior expression: it must be `list(string)`.
pub fn check_list_of_strings(source: &str, env: &Env) -> Result<CheckedExpr, Vec<CheckError>> {
    check_for(source, env, Purpose::Behavior)
}

/// Checks a monitorFilter expression: it must be `bool`.
pub fn check_bool(source: &str, env: &Env) -> Result<CheckedExpr, Vec<CheckError>> {
    check_for(source, env, Purpose::MonitorFilter)
}

/// `spec.variables`, checked.
#[derive(Clone, Debug)]
pub struct CheckedVariables {
    /// The environment behavior expressions are checked in: the input
    /// environment plus `variables`, an object with one field per variable.
    pub env: Env,
    /// Each variable, in declaration order.
    pub variables: Vec<(String, CheckedExpr)>,
}

/// Checks `spec.variables` in order against `env`: each must be
/// `list(string)` and may use `variables.<name>` of the ones declared
/// before it. Every variable is checked, and all errors are returned, each
/// naming its variable.
pub fn check_variables<'a, I>(variables: I, env: &Env) -> Result<CheckedVariables, Vec<CheckError>>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let vars: Vec<(&str, &str)> = variables.into_iter().collect();
    let mut errors = Vec::new();
    let mut object = ObjectType::new("variables", Vec::<(String, Type)>::new());
    let mut checked = Vec::new();
    for (i, (name, _)) in vars.iter().enumerate() {
        if vars[..i].iter().any(|(n, _)| n == name) {
            errors.push(CheckError {
                origin: Some(format!("variables.{name}")),
                expr: (*name).to_string(),
                kind: CheckErrorKind::DuplicateVariable((*name).to_string()),
            });
        }
    }
    for (i, (name, source)) in vars.iter().enumerate() {
        let mut scope = object.clone();
        scope.unavailable.insert(
            (*name).to_string(),
            "a variable cannot refer to itself".to_string(),
        );
        for (later, _) in &vars[i + 1..] {
            scope.unavailable.entry((*later).to_string()).or_insert_with(|| {
                format!("it is declared after {name}, and a variable may use only the variables declared before it")
            });
        }
        let mut local = env.clone();
        local.add_variable("variables", Type::object(scope));
        match check_for(source, &local, Purpose::Variable) {
            Ok(c) => {
                object.fields.insert((*name).to_string(), c.ty.clone());
                checked.push(((*name).to_string(), c));
            }
            Err(errs) => {
                object.unavailable.insert(
                    (*name).to_string(),
                    format!("{name} itself failed to check"),
                );
                errors.extend(errs.into_iter().map(|mut e| {
                    e.origin = Some(format!("variables.{name}"));
                    e
                }));
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut env = env.clone();
    env.add_variable("variables", Type::object(object));
    Ok(CheckedVariables {
        env,
        variables: checked,
    })
}

/// A sub-expression rendered as source-like text (for messages).
pub(crate) fn render_expr(e: &IdedExpr) -> String {
    render::render(e)
}

/// Up to three declared names close to `name` (edit distance, or the same
/// last segment of a qualified name: `unmarshal` suggests
/// `json.unmarshal`). Operator names are never suggested.
pub(crate) fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let limit = (name.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, &str)> = candidates
        .filter(|c| !c.starts_with('_') && !c.starts_with('@') && !c.ends_with('_'))
        .filter_map(|c| {
            let last = c.rsplit('.').next().unwrap_or(c);
            let d = levenshtein(name, c).min(if last == name {
                0
            } else {
                levenshtein(name, last) + 1
            });
            (d <= limit).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().flat_map(char::to_lowercase).collect();
    let b: Vec<char> = b.chars().flat_map(char::to_lowercase).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests;
