//! The evaluator: a checked expression compiled once into a tree of
//! [`Node`]s and run over `cel::Value`s, with a cost budget.
//!
//! Why not `cel::Value::resolve`: the `cel` crate's interpreter keeps every
//! intermediate value as a `Box<dyn Val>` and converts to and from `Value`
//! at each function call, so reading a field of a list copies the list,
//! and its `map` and `filter` copy their accumulator on every element (the
//! square of the list's length). It also resolves every name through a
//! chain of string-keyed maps and has no way to stop an evaluation that
//! runs too long. Here:
//!
//! - values are `cel::Value`s throughout (lists, maps and strings behind an
//!   `Arc`, so reading one is a reference count);
//! - names are resolved when the program is built: a comprehension variable
//!   is a slot of the frame, anything else a slot of the caller's
//!   activation ([`Program::globals`]), a type name a constant;
//! - a macro's accumulator is appended to in place;
//! - operators, macros and the hot standard functions (`size`, `contains`,
//!   `startsWith`, `endsWith`, `matches` with its regex compiled once when
//!   the pattern is a literal, conversions to `string` and `bool`, `type`,
//!   `dyn`, `lists.range`) run here with cel-go's semantics; every other
//!   library function is called through the `cel` [`Context`] the caller
//!   hands in, where `kube-cel` registered it (its arguments already
//!   evaluated, bound by a resolver);
//! - every step is charged to a [`Budget`] (see [`cost`]), and an
//!   evaluation that spends it stops with [`EvalError::CostExceeded`].
//!
//! Errors are values in one place, as in cel-go: a macro's accumulator may
//! hold an error that a later element absorbs (`[0, 1].all(x, 1 / x > 1)`
//! is `false`), and `&&`/`||` absorb an error on either side that the other
//! side decides.
//!
//! [`cost`]: super::cost

use super::cost::{complexity, Complexity};
use super::decls::Env;
use super::eval::{units, EvalError, MAX_RANGE, MAX_RESULT_UNITS};
use super::library::{self, Lib};
use super::CheckedExpr;
use ::cel::common::ast::{
    operators as op, CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue,
};
use ::cel::context::VariableResolver;
use ::cel::objects::{Key, KeyRef, Map, Opaque};
use ::cel::{Context, ExecutionError, Value};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// What an evaluation may spend, in cost units (see [`super::cost`]), and
/// what it has spent.
#[derive(Clone, Debug)]
pub struct Budget {
    limit: u64,
    spent: u64,
}

impl Budget {
    /// A budget of `limit` units.
    pub fn new(limit: u64) -> Self {
        Budget { limit, spent: 0 }
    }

    /// Units spent so far.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn charge(&mut self, units: u64) -> Result<(), Stop> {
        self.spent = self.spent.saturating_add(units);
        if self.spent > self.limit {
            Err(Stop::Budget)
        } else {
            Ok(())
        }
    }
}

/// Why a node stopped: an error (a value cel-go would carry on with) or a
/// spent budget (which ends the evaluation).
enum Stop {
    Error(ExecutionError),
    Budget,
}

impl From<ExecutionError> for Stop {
    fn from(e: ExecutionError) -> Self {
        Stop::Error(e)
    }
}

type Eval = Result<Value, Stop>;

/// A CEL type as a value: what `type(x)` returns and a type name such as
/// `int` denotes.
#[derive(Debug, PartialEq, Eq)]
pub struct TypeValue(pub &'static str);

impl Opaque for TypeValue {
    fn runtime_type_name(&self) -> &str {
        "type"
    }
}

/// The type names an expression may use as values.
const TYPE_NAMES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "google.protobuf.Duration",
    "google.protobuf.Timestamp",
];

fn type_name(name: &str) -> Option<&'static str> {
    TYPE_NAMES.iter().copied().find(|t| *t == name)
}

/// The name of a value's type, as `type(x)` reports it.
fn type_of(v: &Value) -> Value {
    let name = match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Function(..) => "function",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Duration(_) => "google.protobuf.Duration",
        Value::Timestamp(_) => "google.protobuf.Timestamp",
        Value::Null => "null_type",
        Value::Opaque(o) => {
            if o.downcast_ref::<TypeValue>().is_some() {
                "type"
            } else {
                return Value::Opaque(Arc::new(OpaqueType(o.runtime_type_name().to_string())));
            }
        }
    };
    Value::Opaque(Arc::new(TypeValue(name)))
}

/// The type of a library's opaque value (`net.IP`, …).
#[derive(Debug, PartialEq, Eq)]
struct OpaqueType(String);

impl Opaque for OpaqueType {
    fn runtime_type_name(&self) -> &str {
        "type"
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Lt,
    Le,
    Gt,
    Ge,
}

/// A function run here rather than through the `cel` context.
#[derive(Clone, Debug)]
pub(crate) enum Builtin {
    Size,
    Contains,
    StartsWith,
    EndsWith,
    /// The regex, compiled when the program was built if the pattern is a
    /// literal (`None`: compile at each call).
    Matches(Option<Arc<regex::Regex>>),
    Dyn,
    Type,
    ToString,
    ToBool,
    ListsRange,
    /// `list.sum()`, checked (kube-cel's adds unchecked).
    Sum,
    /// `list.distinct()` in linear time for strings, ints, uints and
    /// bools (kube-cel's compares every pair).
    Distinct,
    /// `s.find(re)`: the first match or `""`; the regex compiled once when
    /// it is a literal (kube-cel compiles it at every call).
    Find(Option<Arc<regex::Regex>>),
    /// `s.findAll(re[, n])`: every match, or the first `n` (`n < 0`: all).
    FindAll(Option<Arc<regex::Regex>>),
    /// A library function implemented in [`super::library`].
    Lib(Lib),
}

impl Builtin {
    /// The function's name, as the cost model knows it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Builtin::Size => "size",
            Builtin::Contains => "contains",
            Builtin::StartsWith => "startsWith",
            Builtin::EndsWith => "endsWith",
            Builtin::Matches(_) => "matches",
            Builtin::Dyn => "dyn",
            Builtin::Type => "type",
            Builtin::ToString => "string",
            Builtin::ToBool => "bool",
            Builtin::ListsRange => "lists.range",
            Builtin::Sum => "sum",
            Builtin::Distinct => "distinct",
            Builtin::Find(_) => "find",
            Builtin::FindAll(_) => "findAll",
            Builtin::Lib(l) => l.name(),
        }
    }
}

/// One node of a compiled expression.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    Const(Value),
    Global(usize),
    Local(usize),
    Select {
        operand: Box<Node>,
        field: Arc<String>,
        test: bool,
    },
    Index(Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    NotStrictlyFalse(Box<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
    Neg(Box<Node>),
    Arith(Arith, Box<Node>, Box<Node>),
    /// `accu + rhs` in a macro's step: the accumulator is moved out of its
    /// slot and appended to in place.
    AccuAdd {
        slot: usize,
        rhs: Box<Node>,
    },
    Eq(Box<Node>, Box<Node>),
    Ne(Box<Node>, Box<Node>),
    Cmp(Cmp, Box<Node>, Box<Node>),
    In(Box<Node>, Box<Node>),
    List(Vec<Node>),
    Map(Vec<(Node, Node)>),
    /// A function run here; `args` has the receiver first for a method.
    /// `fallback` is the library call for argument types the builtin does
    /// not cover.
    Builtin {
        f: Builtin,
        args: Vec<Node>,
        fallback: Option<Box<Delegated>>,
    },
    /// A library function, called through the `cel` context.
    Call {
        call: Box<Delegated>,
        args: Vec<Node>,
    },
    Comprehension(Box<Comprehension>),
    /// Something that fails when reached (a construct the checker refuses;
    /// kept so that a program is total).
    Fail(&'static str),
}

/// A library call made through the `cel` context: the function's name as
/// the checker resolved it and the call expression the context resolves,
/// its receiver and arguments replaced by names [`Bound`] answers.
#[derive(Clone, Debug)]
pub(crate) struct Delegated {
    pub(crate) name: String,
    pub(crate) method: bool,
    /// Per argument (receiver first): bound by name (`false`: a literal
    /// left in the expression, not evaluated here).
    bind: Vec<bool>,
    expr: IdedExpr,
}

#[derive(Clone, Debug)]
pub(crate) struct Comprehension {
    pub(crate) range: Node,
    pub(crate) iter: usize,
    pub(crate) iter2: Option<usize>,
    pub(crate) accu: usize,
    pub(crate) init: Node,
    pub(crate) cond: Node,
    /// The condition is the literal `true` (map, filter, exists_one): an
    /// error in the accumulator can never be absorbed, so it ends the loop.
    pub(crate) cond_true: bool,
    pub(crate) step: Node,
    pub(crate) result: Node,
}

/// A checked expression compiled for evaluation.
#[derive(Clone, Debug)]
pub struct Program {
    pub(crate) root: Node,
    globals: Vec<String>,
    locals: usize,
}

/// Names the receiver and arguments of a delegated call are bound to.
const THIS: &str = "@t";
const ARGS: [&str; 8] = ["@0", "@1", "@2", "@3", "@4", "@5", "@6", "@7"];

impl Program {
    /// Compiles `expr`, checked in `env`. A call node whose id is a key of
    /// `substitutions` reads the global of that name instead of calling
    /// (how a data source's prefetched result is bound).
    pub fn new(expr: &CheckedExpr, env: &Env, substitutions: &HashMap<u64, String>) -> Program {
        let mut b = Builder {
            env,
            substitutions,
            globals: Vec::new(),
            scopes: Vec::new(),
            max_locals: 0,
            accu: None,
        };
        let root = b.build(&expr.ast);
        Program {
            root,
            globals: b.globals,
            locals: b.max_locals,
        }
    }

    /// The free names the program reads, in the order [`Program::run`]
    /// takes their values.
    pub fn globals(&self) -> &[String] {
        &self.globals
    }

    /// Evaluates the program. `globals` holds a value per
    /// [`Program::globals`] (`None`: not bound, an error if reached);
    /// `functions` is the context library functions are called through
    /// ([`super::eval::policy_context`] or one with more functions);
    /// `budget` is charged for every step.
    ///
    /// A panic inside a library function is contained, and a result larger
    /// than [`MAX_RESULT_UNITS`] refused.
    pub fn run(
        &self,
        globals: &[Option<Value>],
        functions: &Context<'_>,
        budget: &mut Budget,
    ) -> Result<Value, EvalError> {
        let limit = budget.limit;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut frame = Frame {
                names: &self.globals,
                globals,
                locals: if self.locals == 0 {
                    Vec::new()
                } else {
                    vec![Ok(Value::Null); self.locals]
                },
                functions,
                budget: &mut *budget,
            };
            frame.eval(&self.root)
        }));
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
            Ok(Err(Stop::Error(e))) => Err(EvalError::Execution(e)),
            Ok(Err(Stop::Budget)) => Err(EvalError::CostExceeded { budget: limit }),
            Err(_) => Err(EvalError::Panicked),
        }
    }
}

struct Builder<'e> {
    env: &'e Env,
    substitutions: &'e HashMap<u64, String>,
    globals: Vec<String>,
    /// Comprehension variables in scope, innermost last, with their slot.
    scopes: Vec<(String, usize)>,
    max_locals: usize,
    /// The accumulator slot of the comprehension whose step is being built.
    accu: Option<usize>,
}

fn boxed(n: Node) -> Box<Node> {
    Box::new(n)
}

/// `a.b.c` for a chain of selects on an identifier.
pub(crate) fn qualified_name(e: &IdedExpr) -> Option<String> {
    let mut parts = Vec::new();
    let mut cur = e;
    loop {
        match &cur.expr {
            Expr::Ident(n) => {
                parts.push(n.as_str());
                break;
            }
            Expr::Select(s) if !s.test => {
                parts.push(s.field.as_str());
                cur = &s.operand;
            }
            _ => return None,
        }
        if parts.len() > 16 {
            return None;
        }
    }
    parts.reverse();
    Some(parts.join("."))
}

fn literal(l: &LiteralValue) -> Value {
    match l {
        LiteralValue::Boolean(b) => Value::Bool(*b.inner()),
        LiteralValue::Bytes(b) => Value::Bytes(Arc::new(b.inner().to_vec())),
        LiteralValue::Double(d) => Value::Float(*d.inner()),
        LiteralValue::Int(i) => Value::Int(*i.inner()),
        LiteralValue::Null => Value::Null,
        LiteralValue::String(s) => Value::String(Arc::new(s.inner().to_string())),
        LiteralValue::UInt(u) => Value::UInt(*u.inner()),
    }
}

fn ident(name: &str) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Ident(name.to_string()),
    }
}

impl Builder<'_> {
    fn local(&self, name: &str) -> Option<usize> {
        self.scopes
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, slot)| *slot)
    }

    fn global(&mut self, name: &str) -> usize {
        match self.globals.iter().position(|g| g == name) {
            Some(i) => i,
            None => {
                self.globals.push(name.to_string());
                self.globals.len() - 1
            }
        }
    }

    fn push_local(&mut self, name: &str) -> usize {
        let slot = self.scopes.len();
        self.scopes.push((name.to_string(), slot));
        self.max_locals = self.max_locals.max(self.scopes.len());
        slot
    }

    fn build(&mut self, e: &IdedExpr) -> Node {
        match &e.expr {
            Expr::Unspecified => Node::Fail("an empty expression"),
            Expr::Literal(l) => Node::Const(literal(l)),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(s) => {
                if !s.test {
                    if let Some(q) = qualified_name(e) {
                        let root = q.split('.').next().unwrap_or_default();
                        if self.local(root).is_none() {
                            if let Some(t) = type_name(&q) {
                                return Node::Const(Value::Opaque(Arc::new(TypeValue(t))));
                            }
                        }
                    }
                }
                Node::Select {
                    operand: boxed(self.build(&s.operand)),
                    field: Arc::new(s.field.clone()),
                    test: s.test,
                }
            }
            Expr::List(l) => Node::List(l.elements.iter().map(|x| self.build(x)).collect()),
            Expr::Map(m) => Node::Map(
                m.entries
                    .iter()
                    .filter_map(|entry| match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            Some((self.build(&me.key), self.build(&me.value)))
                        }
                        EntryExpr::StructField(_) => None,
                    })
                    .collect(),
            ),
            Expr::Struct(_) => Node::Fail("object construction"),
            Expr::Call(c) => self.call(e, c),
            Expr::Comprehension(c) => self.comprehension(c),
        }
    }

    fn ident(&mut self, name: &str) -> Node {
        if let Some(slot) = self.local(name) {
            return Node::Local(slot);
        }
        if let Some(t) = type_name(name) {
            return Node::Const(Value::Opaque(Arc::new(TypeValue(t))));
        }
        Node::Global(self.global(name))
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Node {
        let range = self.build(&c.iter_range);
        let init = self.build(&c.accu_init);
        let depth = self.scopes.len();
        let accu = self.push_local(&c.accu_var);
        let iter = self.push_local(&c.iter_var);
        let iter2 = c.iter_var2.as_deref().map(|v| self.push_local(v));
        let cond_true = matches!(
            &c.loop_cond.expr,
            Expr::Literal(LiteralValue::Boolean(b)) if *b.inner()
        );
        let cond = self.build(&c.loop_cond);
        let outer = self.accu.replace(accu);
        let step = self.build(&c.loop_step);
        self.accu = outer;
        // The result sees the accumulator, not the iteration variables.
        self.scopes.truncate(depth + 1);
        let saved = self.accu.take();
        let result = self.build(&c.result);
        self.accu = saved;
        self.scopes.truncate(depth);
        Node::Comprehension(Box::new(Comprehension {
            range,
            iter,
            iter2,
            accu,
            init,
            cond,
            cond_true,
            step,
            result,
        }))
    }

    fn call(&mut self, e: &IdedExpr, c: &CallExpr) -> Node {
        if let Some(name) = self.substitutions.get(&e.id) {
            return Node::Global(self.global(name));
        }
        if c.target.is_none() {
            let a = &c.args;
            let name = c.func_name.as_str();
            match (name, a.len()) {
                (op::CONDITIONAL, 3) => {
                    return Node::Cond(
                        boxed(self.build(&a[0])),
                        boxed(self.build(&a[1])),
                        boxed(self.build(&a[2])),
                    )
                }
                (op::LOGICAL_AND, 2) => {
                    return Node::And(boxed(self.build(&a[0])), boxed(self.build(&a[1])))
                }
                (op::LOGICAL_OR, 2) => {
                    return Node::Or(boxed(self.build(&a[0])), boxed(self.build(&a[1])))
                }
                (op::LOGICAL_NOT, 1) => return Node::Not(boxed(self.build(&a[0]))),
                (op::NOT_STRICTLY_FALSE, 1) => {
                    return Node::NotStrictlyFalse(boxed(self.build(&a[0])))
                }
                (op::NEGATE, 1) => return Node::Neg(boxed(self.build(&a[0]))),
                (op::ADD, 2) => {
                    if let (Some(accu), Expr::Ident(n)) = (self.accu, &a[0].expr) {
                        if self.local(n) == Some(accu) {
                            return Node::AccuAdd {
                                slot: accu,
                                rhs: boxed(self.build(&a[1])),
                            };
                        }
                    }
                    return self.arith(Arith::Add, a);
                }
                (op::SUBSTRACT, 2) => return self.arith(Arith::Sub, a),
                (op::MULTIPLY, 2) => return self.arith(Arith::Mul, a),
                (op::DIVIDE, 2) => return self.arith(Arith::Div, a),
                (op::MODULO, 2) => return self.arith(Arith::Rem, a),
                (op::EQUALS, 2) => {
                    return Node::Eq(boxed(self.build(&a[0])), boxed(self.build(&a[1])))
                }
                (op::NOT_EQUALS, 2) => {
                    return Node::Ne(boxed(self.build(&a[0])), boxed(self.build(&a[1])))
                }
                (op::LESS, 2) => return self.cmp(Cmp::Lt, a),
                (op::LESS_EQUALS, 2) => return self.cmp(Cmp::Le, a),
                (op::GREATER, 2) => return self.cmp(Cmp::Gt, a),
                (op::GREATER_EQUALS, 2) => return self.cmp(Cmp::Ge, a),
                (op::IN, 2) => return Node::In(boxed(self.build(&a[0])), boxed(self.build(&a[1]))),
                (op::INDEX, 2) => {
                    return Node::Index(boxed(self.build(&a[0])), boxed(self.build(&a[1])))
                }
                (op::OPT_INDEX | op::OPT_SELECT, _) => return Node::Fail("optional types"),
                _ => {}
            }
        }
        // `ns.fn(args)` naming a declared global function (`sets.contains`)
        // rather than a method on a variable `ns`: the checker's rule.
        if let Some(target) = &c.target {
            if let Some(q) = qualified_name(target) {
                let root = q.split('.').next().unwrap_or_default();
                let full = format!("{q}.{}", c.func_name);
                let is_method = self
                    .env
                    .functions
                    .get(&c.func_name)
                    .is_some_and(|os| os.iter().any(|o| o.receiver));
                let root_is_var = self.local(root).is_some() || self.env.variable(root).is_some();
                if !root_is_var && (self.env.has_function(&full) || !is_method) {
                    let args: Vec<Node> = c.args.iter().map(|x| self.build(x)).collect();
                    return self.function(&full, false, args, c.args.iter().collect());
                }
            }
        }
        let mut args = Vec::with_capacity(c.args.len() + 1);
        if let Some(t) = &c.target {
            args.push(self.build(t));
        }
        args.extend(c.args.iter().map(|x| self.build(x)));
        let written = c
            .target
            .as_deref()
            .into_iter()
            .chain(c.args.iter())
            .collect();
        self.function(&c.func_name, c.target.is_some(), args, written)
    }

    fn arith(&mut self, op: Arith, a: &[IdedExpr]) -> Node {
        Node::Arith(op, boxed(self.build(&a[0])), boxed(self.build(&a[1])))
    }

    fn cmp(&mut self, op: Cmp, a: &[IdedExpr]) -> Node {
        Node::Cmp(op, boxed(self.build(&a[0])), boxed(self.build(&a[1])))
    }

    /// A function call: a builtin where there is one for this name and
    /// style, else a call through the `cel` context. `args` holds the
    /// receiver first for a method; `written` the same as written (a
    /// literal regex is compiled now, a literal argument of a library call
    /// stays in its call expression).
    fn function(
        &mut self,
        name: &str,
        method: bool,
        args: Vec<Node>,
        written: Vec<&IdedExpr>,
    ) -> Node {
        let n = args.len();
        let literal_regex = |e: Option<&&IdedExpr>| match e.map(|e| &e.expr) {
            Some(Expr::Literal(LiteralValue::String(s))) => {
                regex::Regex::new(s.inner()).ok().map(Arc::new)
            }
            _ => None,
        };
        let builtin = match (name, method, n) {
            ("size", _, 1) => Some(Builtin::Size),
            ("contains", true, 2) => Some(Builtin::Contains),
            ("startsWith", true, 2) => Some(Builtin::StartsWith),
            ("endsWith", true, 2) => Some(Builtin::EndsWith),
            // The pattern is the last argument in both call styles.
            ("matches", _, 2) => Some(Builtin::Matches(literal_regex(written.last()))),
            ("find", true, 2) => Some(Builtin::Find(literal_regex(written.get(1)))),
            ("findAll", true, 2 | 3) => Some(Builtin::FindAll(literal_regex(written.get(1)))),
            ("dyn", false, 1) => Some(Builtin::Dyn),
            ("type", false, 1) => Some(Builtin::Type),
            ("string", false, 1) => Some(Builtin::ToString),
            ("bool", false, 1) => Some(Builtin::ToBool),
            ("lists.range", false, 1) => Some(Builtin::ListsRange),
            ("sum", true, 1) => Some(Builtin::Sum),
            ("distinct", true, 1) => Some(Builtin::Distinct),
            _ => Lib::of(name, method, n).map(Builtin::Lib),
        };
        // The call expression the context resolves: each argument a name
        // the resolver answers, or, where `inline` allows, the literal as
        // written (no binding, no conversion).
        let delegated = |name: &str, inline: bool| {
            if n > ARGS.len() + usize::from(method) {
                return None;
            }
            let mut bind = Vec::with_capacity(n);
            let mut exprs = Vec::with_capacity(n);
            let mut k = 0;
            for (i, w) in written.iter().enumerate() {
                if inline && matches!(w.expr, Expr::Literal(_)) {
                    bind.push(false);
                    exprs.push((*w).clone());
                } else if method && i == 0 {
                    bind.push(true);
                    exprs.push(ident(THIS));
                } else {
                    bind.push(true);
                    exprs.push(ident(ARGS[k]));
                    k += 1;
                }
            }
            let target = if method {
                Some(Box::new(exprs.remove(0)))
            } else {
                None
            };
            let expr = IdedExpr {
                id: 0,
                expr: Expr::Call(CallExpr {
                    func_name: name.to_string(),
                    target,
                    args: exprs,
                }),
            };
            Some(Box::new(Delegated {
                name: name.to_string(),
                method,
                bind,
                expr,
            }))
        };
        match builtin {
            Some(f) => Node::Builtin {
                f,
                args,
                fallback: delegated(name, false),
            },
            None => match delegated(name, true) {
                Some(call) => Node::Call { call, args },
                None => Node::Fail("a call with more than 8 arguments"),
            },
        }
    }
}

/// The receiver and arguments of a delegated call, by the names its call
/// expression uses.
struct Bound {
    this: Option<Value>,
    args: Vec<Value>,
}

impl VariableResolver for Bound {
    fn resolve(&self, name: &str) -> Option<Value> {
        if name == THIS {
            return self.this.clone();
        }
        let i = ARGS.iter().position(|a| *a == name)?;
        self.args.get(i).cloned()
    }
}

/// What a library function costs beyond traversing its arguments (see
/// [`super::cost::complexity`]).
fn extra_work(name: &str, args: &[Value]) -> u64 {
    let len = |i: usize| args.get(i).map_or(0, traversal);
    match complexity(name) {
        Complexity::Linear => 0,
        Complexity::SelfQuadratic => len(0).saturating_mul(len(0)),
        Complexity::Product => len(0).saturating_mul(len(1)),
    }
}

/// The units a value costs to traverse: a tenth of a string's or bytes'
/// length, a list's or map's element count (cel-go's factors).
pub(crate) fn traversal(v: &Value) -> u64 {
    let n = match v {
        Value::String(s) => s.len() / 10,
        Value::Bytes(b) => b.len() / 10,
        Value::List(l) => l.len(),
        Value::Map(m) => m.map.len(),
        _ => 0,
    };
    n as u64
}

struct Frame<'a, 'c> {
    names: &'a [String],
    globals: &'a [Option<Value>],
    locals: Vec<Result<Value, ExecutionError>>,
    functions: &'a Context<'c>,
    budget: &'a mut Budget,
}

fn no_overload() -> Stop {
    Stop::Error(ExecutionError::NoSuchOverload)
}

fn as_bool(v: Eval) -> Result<bool, Stop> {
    match v? {
        Value::Bool(b) => Ok(b),
        _ => Err(no_overload()),
    }
}

/// A value as a map key, for `in` and indexing.
fn key_of(v: &Value) -> Option<KeyRef<'_>> {
    match v {
        Value::Int(i) => Some(KeyRef::Int(*i)),
        Value::UInt(u) => Some(KeyRef::Uint(*u)),
        Value::Bool(b) => Some(KeyRef::Bool(*b)),
        Value::String(s) => Some(KeyRef::String(s.as_str())),
        _ => None,
    }
}

/// Looks a key up, numeric keys by value across int, uint and an integral
/// double (cel-go's heterogeneous key equality).
fn map_get<'m>(m: &'m Map, key: &Value) -> Option<&'m Value> {
    match key {
        Value::Float(f) if f.fract() == 0.0 && f.is_finite() => {
            let as_int = *f as i64;
            m.get(&KeyRef::Int(as_int)).filter(|_| as_int as f64 == *f)
        }
        _ => m.get(&key_of(key)?),
    }
}

fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Float(f) => f.to_string(),
        other => format!("{other:?}"),
    }
}

/// cel-go's ordering: same-type for every ordered type, by value across
/// int, uint and double. `Ok(None)`: a NaN, which orders nothing.
fn compare(a: &Value, b: &Value) -> Result<Option<Ordering>, Stop> {
    let numeric = |v: &Value| matches!(v, Value::Int(_) | Value::UInt(_) | Value::Float(_));
    match (a, b) {
        (Value::Bytes(x), Value::Bytes(y)) => Ok(Some(x.cmp(y))),
        (Value::String(_), Value::String(_))
        | (Value::Bool(_), Value::Bool(_))
        | (Value::Duration(_), Value::Duration(_))
        | (Value::Timestamp(_), Value::Timestamp(_)) => Ok(a.partial_cmp(b)),
        _ if numeric(a) && numeric(b) => Ok(a.partial_cmp(b)),
        _ => Err(no_overload()),
    }
}

fn list_index(items: &[Value], idx: &Value) -> Eval {
    let i: Option<i64> = match idx {
        Value::Int(i) => Some(*i),
        Value::UInt(u) => i64::try_from(*u).ok(),
        Value::Float(f) if f.fract() == 0.0 && f.is_finite() => Some(*f as i64),
        Value::Float(_) => return Err(no_overload()),
        _ => return Err(no_overload()),
    };
    i.and_then(|i| usize::try_from(i).ok())
        .and_then(|i| items.get(i))
        .cloned()
        .ok_or_else(|| Stop::Error(ExecutionError::IndexOutOfBounds(idx.clone())))
}

impl Frame<'_, '_> {
    fn charge(&mut self, units: u64) -> Result<(), Stop> {
        self.budget.charge(units)
    }

    fn eval(&mut self, n: &Node) -> Eval {
        match n {
            Node::Const(v) => Ok(v.clone()),
            Node::Global(i) => {
                self.charge(1)?;
                match self.globals.get(*i) {
                    Some(Some(v)) => Ok(v.clone()),
                    _ => Err(Stop::Error(ExecutionError::UndeclaredReference(Arc::new(
                        self.names.get(*i).cloned().unwrap_or_default(),
                    )))),
                }
            }
            Node::Local(i) => {
                self.charge(1)?;
                match self.locals.get(*i) {
                    Some(Ok(v)) => Ok(v.clone()),
                    Some(Err(e)) => Err(Stop::Error(e.clone())),
                    None => Err(no_overload()),
                }
            }
            Node::Select {
                operand,
                field,
                test,
            } => {
                self.charge(1)?;
                let v = self.eval(operand)?;
                match &v {
                    Value::Map(m) => {
                        let key = KeyRef::String(field.as_str());
                        if *test {
                            Ok(Value::Bool(m.get(&key).is_some()))
                        } else {
                            m.get(&key).cloned().ok_or_else(|| {
                                Stop::Error(ExecutionError::NoSuchKey(field.clone()))
                            })
                        }
                    }
                    _ => Err(no_overload()),
                }
            }
            Node::Index(container, idx) => {
                self.charge(1)?;
                let c = self.eval(container)?;
                let i = self.eval(idx)?;
                match &c {
                    Value::List(items) => list_index(items, &i),
                    Value::Map(m) => match (key_of(&i), &i) {
                        (None, Value::Float(_)) | (Some(_), _) => {
                            map_get(m, &i).cloned().ok_or_else(|| {
                                Stop::Error(ExecutionError::NoSuchKey(Arc::new(key_text(&i))))
                            })
                        }
                        _ => Err(no_overload()),
                    },
                    _ => Err(no_overload()),
                }
            }
            Node::And(l, r) => {
                self.charge(1)?;
                match self.eval(l) {
                    Ok(Value::Bool(false)) => Ok(Value::Bool(false)),
                    Ok(Value::Bool(true)) => Ok(Value::Bool(as_bool(self.eval(r))?)),
                    Err(Stop::Budget) => Err(Stop::Budget),
                    left => match self.eval(r) {
                        Ok(Value::Bool(false)) => Ok(Value::Bool(false)),
                        Err(Stop::Budget) => Err(Stop::Budget),
                        _ => Err(left.err().unwrap_or_else(no_overload)),
                    },
                }
            }
            Node::Or(l, r) => {
                self.charge(1)?;
                match self.eval(l) {
                    Ok(Value::Bool(true)) => Ok(Value::Bool(true)),
                    Ok(Value::Bool(false)) => Ok(Value::Bool(as_bool(self.eval(r))?)),
                    Err(Stop::Budget) => Err(Stop::Budget),
                    left => match self.eval(r) {
                        Ok(Value::Bool(true)) => Ok(Value::Bool(true)),
                        Err(Stop::Budget) => Err(Stop::Budget),
                        _ => Err(left.err().unwrap_or_else(no_overload)),
                    },
                }
            }
            Node::Not(x) => {
                self.charge(1)?;
                Ok(Value::Bool(!as_bool(self.eval(x))?))
            }
            Node::NotStrictlyFalse(x) => {
                self.charge(1)?;
                match self.eval(x) {
                    Ok(Value::Bool(b)) => Ok(Value::Bool(b)),
                    Err(Stop::Budget) => Err(Stop::Budget),
                    _ => Ok(Value::Bool(true)),
                }
            }
            Node::Cond(c, t, f) => {
                self.charge(1)?;
                if as_bool(self.eval(c))? {
                    self.eval(t)
                } else {
                    self.eval(f)
                }
            }
            Node::Neg(x) => {
                self.charge(1)?;
                match self.eval(x)? {
                    Value::Int(i) => i.checked_neg().map(Value::Int).ok_or_else(|| {
                        Stop::Error(ExecutionError::Overflow(
                            "negate",
                            Value::Int(i),
                            Value::Null,
                        ))
                    }),
                    Value::Float(f) => Ok(Value::Float(-f)),
                    _ => Err(no_overload()),
                }
            }
            Node::Arith(o, l, r) => {
                self.charge(1)?;
                let l = self.eval(l)?;
                let r = self.eval(r)?;
                self.arith(*o, l, r)
            }
            Node::AccuAdd { slot, rhs } => {
                self.charge(1)?;
                // `accu + [x, ...]`, the macros' step: push the elements
                // (charged as the list literal would be) without building
                // the one-element list.
                if let Node::List(xs) = &**rhs {
                    self.charge(1 + 2 * xs.len() as u64)?;
                    // The accumulator is out of its slot while the elements
                    // are evaluated: they cannot name it (`@result` is not
                    // a name a user can write).
                    let accu = match self.locals.get_mut(*slot) {
                        Some(accu) => std::mem::replace(accu, Ok(Value::Null))?,
                        None => return Err(no_overload()),
                    };
                    return match accu {
                        Value::List(mut l) => {
                            let list = Arc::make_mut(&mut l);
                            for x in xs {
                                list.push(self.eval(x)?);
                            }
                            Ok(Value::List(l))
                        }
                        other => {
                            let mut items = Vec::with_capacity(xs.len());
                            for x in xs {
                                items.push(self.eval(x)?);
                            }
                            (other + Value::List(Arc::new(items))).map_err(Stop::Error)
                        }
                    };
                }
                let r = self.eval(rhs)?;
                let l = match self.locals.get_mut(*slot) {
                    Some(accu) => std::mem::replace(accu, Ok(Value::Null))?,
                    None => return Err(no_overload()),
                };
                // Appending is linear in what is appended, not in the
                // accumulator.
                self.charge(traversal(&r))?;
                (l + r).map_err(Stop::Error)
            }
            Node::Eq(l, r) => {
                self.charge(1)?;
                let (l, r) = (self.eval(l)?, self.eval(r)?);
                self.charge(traversal(&l).min(traversal(&r)))?;
                Ok(Value::Bool(l == r))
            }
            Node::Ne(l, r) => {
                self.charge(1)?;
                let (l, r) = (self.eval(l)?, self.eval(r)?);
                self.charge(traversal(&l).min(traversal(&r)))?;
                Ok(Value::Bool(l != r))
            }
            Node::Cmp(o, l, r) => {
                self.charge(1)?;
                let (l, r) = (self.eval(l)?, self.eval(r)?);
                let ord = compare(&l, &r)?;
                Ok(Value::Bool(match (o, ord) {
                    (_, None) => false,
                    (Cmp::Lt, Some(o)) => o == Ordering::Less,
                    (Cmp::Le, Some(o)) => o != Ordering::Greater,
                    (Cmp::Gt, Some(o)) => o == Ordering::Greater,
                    (Cmp::Ge, Some(o)) => o != Ordering::Less,
                }))
            }
            Node::In(x, c) => {
                self.charge(1)?;
                let x = self.eval(x)?;
                let c = self.eval(c)?;
                match &c {
                    Value::List(items) => {
                        self.charge(items.len() as u64)?;
                        Ok(Value::Bool(items.contains(&x)))
                    }
                    Value::Map(m) => match &x {
                        Value::Float(_) => Ok(Value::Bool(map_get(m, &x).is_some())),
                        _ if key_of(&x).is_some() => Ok(Value::Bool(map_get(m, &x).is_some())),
                        _ => Err(no_overload()),
                    },
                    _ => Err(no_overload()),
                }
            }
            Node::List(xs) => {
                self.charge(1 + xs.len() as u64)?;
                let mut out = Vec::with_capacity(xs.len());
                for x in xs {
                    out.push(self.eval(x)?);
                }
                Ok(Value::List(Arc::new(out)))
            }
            Node::Map(entries) => {
                self.charge(1 + entries.len() as u64)?;
                let mut out = HashMap::with_capacity(entries.len());
                for (k, v) in entries {
                    let k = self.eval(k)?;
                    let key = match k {
                        Value::Int(i) => Key::Int(i),
                        Value::UInt(u) => Key::Uint(u),
                        Value::Bool(b) => Key::Bool(b),
                        Value::String(s) => Key::String(s),
                        _ => return Err(no_overload()),
                    };
                    let v = self.eval(v)?;
                    out.insert(key, v);
                }
                Ok(Value::Map(Map { map: Arc::new(out) }))
            }
            Node::Builtin { f, args, fallback } => {
                self.charge(1)?;
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.eval(a)?);
                }
                let cost: u64 = vals.iter().map(traversal).sum();
                self.charge(cost)?;
                match builtin(f, &vals) {
                    Some(r) => {
                        let r = r.map_err(Stop::Error)?;
                        self.charge(traversal(&r))?;
                        Ok(r)
                    }
                    None => match fallback {
                        Some(call) => {
                            self.charge(extra_work(&call.name, &vals))?;
                            self.delegate(call, vals)
                        }
                        None => Err(no_overload()),
                    },
                }
            }
            Node::Call { call, args } => {
                self.charge(1)?;
                let mut vals = Vec::new();
                for (a, bind) in args.iter().zip(&call.bind) {
                    if *bind {
                        vals.push(self.eval(a)?);
                    } else if let Node::Const(v) = a {
                        // Charged as if evaluated (for its traversal).
                        self.charge(traversal(v))?;
                    }
                }
                let cost: u64 = vals.iter().map(traversal).sum();
                self.charge(cost)?;
                // Charged before the call: a quadratic library function on
                // a large list is refused rather than run.
                self.charge(extra_work(&call.name, &vals))?;
                self.delegate(call, vals)
            }
            Node::Comprehension(c) => self.comprehension(c),
            Node::Fail(what) => Err(Stop::Error(ExecutionError::function_error(
                "evaluate",
                format!("{what} is not supported"),
            ))),
        }
    }

    fn arith(&mut self, o: Arith, l: Value, r: Value) -> Eval {
        if o == Arith::Add {
            self.charge(traversal(&l) + traversal(&r))?;
        }
        let result = match (o, l, r) {
            // The `cel` crate's `+` has no bytes overload.
            (Arith::Add, Value::Bytes(mut a), Value::Bytes(b)) => {
                Arc::make_mut(&mut a).extend_from_slice(&b);
                Ok(Value::Bytes(a))
            }
            (o, l, r) => match o {
                Arith::Add => l + r,
                Arith::Sub => l - r,
                Arith::Mul => l * r,
                Arith::Div => l / r,
                Arith::Rem => l % r,
            },
        };
        result.map_err(Stop::Error)
    }

    /// Calls a library function; `vals` are the bound arguments, the
    /// receiver first when it is bound.
    fn delegate(&mut self, call: &Delegated, mut vals: Vec<Value>) -> Eval {
        let result = if vals.is_empty() {
            Value::resolve(&call.expr, self.functions)
        } else {
            let this = if call.method && call.bind.first() == Some(&true) {
                Some(vals.remove(0))
            } else {
                None
            };
            let bound = Bound { this, args: vals };
            let mut scope = self.functions.new_inner_scope();
            scope.set_variable_resolver(&bound);
            Value::resolve(&call.expr, &scope)
        }
        .map_err(Stop::Error)?;
        self.charge(traversal(&result))?;
        Ok(result)
    }

    fn comprehension(&mut self, c: &Comprehension) -> Eval {
        self.charge(1)?;
        let range = self.eval(&c.range)?;
        let init = self.eval(&c.init)?;
        self.set(c.accu, Ok(init));
        let outcome = match &range {
            Value::List(items) => {
                let mut out = Ok(());
                for (i, item) in items.iter().enumerate() {
                    let (first, second) = match c.iter2 {
                        // Two variables over a list: the index and the element.
                        Some(_) => (Value::Int(i as i64), Some(item.clone())),
                        None => (item.clone(), None),
                    };
                    match self.iteration(c, first, second) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            out = Err(e);
                            break;
                        }
                    }
                }
                out
            }
            Value::Map(m) => {
                let mut out = Ok(());
                for (k, v) in m.map.iter() {
                    let second = c.iter2.map(|_| v.clone());
                    match self.iteration(c, Value::from(k), second) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            out = Err(e);
                            break;
                        }
                    }
                }
                out
            }
            _ => Err(no_overload()),
        };
        let result = outcome.and_then(|()| self.eval(&c.result));
        // Release the accumulator (it may be large) before returning.
        self.set(c.accu, Ok(Value::Null));
        result
    }

    fn set(&mut self, slot: usize, v: Result<Value, ExecutionError>) {
        if let Some(s) = self.locals.get_mut(slot) {
            *s = v;
        }
    }

    /// One iteration; `Ok(false)` ends the loop.
    fn iteration(
        &mut self,
        c: &Comprehension,
        first: Value,
        second: Option<Value>,
    ) -> Result<bool, Stop> {
        self.charge(1)?;
        if !c.cond_true && !as_bool(self.eval(&c.cond))? {
            return Ok(false);
        }
        self.set(c.iter, Ok(first));
        if let (Some(slot), Some(v)) = (c.iter2, second) {
            self.set(slot, Ok(v));
        }
        match self.eval(&c.step) {
            Ok(v) => self.set(c.accu, Ok(v)),
            Err(Stop::Error(e)) if !c.cond_true => self.set(c.accu, Err(e)),
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}

/// A builtin on evaluated arguments; `None` when it does not cover these
/// argument types (the library function is called instead).
fn builtin(f: &Builtin, args: &[Value]) -> Option<Result<Value, ExecutionError>> {
    let string = |i: usize| match args.get(i) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    match f {
        Builtin::Size => {
            let n = match args.first()? {
                Value::String(s) => s.chars().count(),
                Value::Bytes(b) => b.len(),
                Value::List(l) => l.len(),
                Value::Map(m) => m.map.len(),
                _ => return None,
            };
            Some(Ok(Value::Int(i64::try_from(n).unwrap_or(i64::MAX))))
        }
        Builtin::Contains => Some(Ok(Value::Bool(string(0)?.contains(string(1)?)))),
        Builtin::StartsWith => Some(Ok(Value::Bool(string(0)?.starts_with(string(1)?)))),
        Builtin::EndsWith => Some(Ok(Value::Bool(string(0)?.ends_with(string(1)?)))),
        Builtin::Matches(compiled) => {
            let s = string(0)?;
            let re = match compiled {
                Some(re) => re.clone(),
                None => match regex::Regex::new(string(1)?) {
                    Ok(re) => Arc::new(re),
                    Err(e) => return Some(Err(ExecutionError::function_error("matches", e))),
                },
            };
            Some(Ok(Value::Bool(re.is_match(s))))
        }
        Builtin::Find(compiled) | Builtin::FindAll(compiled) => {
            let s = string(0)?;
            let name = if matches!(f, Builtin::Find(_)) {
                "find"
            } else {
                "findAll"
            };
            let re = match compiled {
                Some(re) => re.clone(),
                None => match regex::Regex::new(string(1)?) {
                    Ok(re) => Arc::new(re),
                    Err(e) => {
                        return Some(Err(ExecutionError::function_error(
                            name,
                            format!("invalid regex: {e}"),
                        )))
                    }
                },
            };
            if matches!(f, Builtin::Find(_)) {
                let found = re.find(s).map(|m| m.as_str()).unwrap_or_default();
                return Some(Ok(Value::String(Arc::new(found.to_string()))));
            }
            let limit = match args.get(2) {
                None => usize::MAX,
                Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
                Some(_) => return None,
            };
            let all = re
                .find_iter(s)
                .take(limit)
                .map(|m| Value::String(Arc::new(m.as_str().to_string())))
                .collect();
            Some(Ok(Value::List(Arc::new(all))))
        }
        Builtin::Lib(l) => library::call(*l, args),
        Builtin::Dyn => Some(Ok(args.first()?.clone())),
        Builtin::Type => Some(Ok(type_of(args.first()?))),
        Builtin::ToString => match args.first()? {
            Value::String(s) => Some(Ok(Value::String(s.clone()))),
            Value::Bool(b) => Some(Ok(Value::String(Arc::new(b.to_string())))),
            Value::Int(i) => Some(Ok(Value::String(Arc::new(i.to_string())))),
            Value::UInt(u) => Some(Ok(Value::String(Arc::new(u.to_string())))),
            _ => None,
        },
        Builtin::ToBool => match args.first()? {
            Value::Bool(b) => Some(Ok(Value::Bool(*b))),
            Value::String(s) => Some(match s.as_str() {
                "1" | "t" | "true" | "TRUE" | "True" => Ok(Value::Bool(true)),
                "0" | "f" | "false" | "FALSE" | "False" => Ok(Value::Bool(false)),
                other => Err(ExecutionError::function_error(
                    "bool",
                    format!("type conversion error from string '{other}' to bool"),
                )),
            }),
            _ => None,
        },
        Builtin::ListsRange => match args.first()? {
            Value::Int(n) if *n < 0 => Some(Err(ExecutionError::function_error(
                "lists.range",
                "range argument must be non-negative",
            ))),
            Value::Int(n) if *n > MAX_RANGE => Some(Err(ExecutionError::function_error(
                "lists.range",
                format!("lists.range({n}) is refused: at most {MAX_RANGE} elements"),
            ))),
            Value::Int(n) => Some(Ok(Value::List(Arc::new((0..*n).map(Value::Int).collect())))),
            _ => None,
        },
        Builtin::Sum => {
            let Value::List(items) = args.first()? else {
                return None;
            };
            let overflow = |a: Value, b: Value| ExecutionError::Overflow("sum", a, b);
            match items.first() {
                None | Some(Value::Int(_)) => {
                    let mut total: i64 = 0;
                    for x in items.iter() {
                        let Value::Int(x) = x else { return None };
                        match total.checked_add(*x) {
                            Some(t) => total = t,
                            None => return Some(Err(overflow(Value::Int(total), Value::Int(*x)))),
                        }
                    }
                    Some(Ok(Value::Int(total)))
                }
                Some(Value::UInt(_)) => {
                    let mut total: u64 = 0;
                    for x in items.iter() {
                        let Value::UInt(x) = x else { return None };
                        match total.checked_add(*x) {
                            Some(t) => total = t,
                            None => {
                                return Some(Err(overflow(Value::UInt(total), Value::UInt(*x))))
                            }
                        }
                    }
                    Some(Ok(Value::UInt(total)))
                }
                Some(Value::Float(_)) => {
                    let mut total = 0.0;
                    for x in items.iter() {
                        let Value::Float(x) = x else { return None };
                        total += x;
                    }
                    Some(Ok(Value::Float(total)))
                }
                _ => None,
            }
        }
        Builtin::Distinct => {
            let Value::List(items) = args.first()? else {
                return None;
            };
            distinct(items).map(|l| Ok(Value::List(Arc::new(l))))
        }
    }
}

/// The distinct elements in first-seen order, for lists of one hashable
/// kind; `None` for anything else.
fn distinct(items: &[Value]) -> Option<Vec<Value>> {
    let mut seen: std::collections::HashSet<KeyRef<'_>> =
        std::collections::HashSet::with_capacity(items.len());
    let mut out = Vec::new();
    let kind = std::mem::discriminant(items.first()?);
    for x in items {
        if std::mem::discriminant(x) != kind {
            return None;
        }
        if seen.insert(key_of(x)?) {
            out.push(x.clone());
        }
    }
    Some(out)
}
