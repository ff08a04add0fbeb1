//! The checker: one type per AST node, following cel-go's `checker.go`.

use super::decls::{Env, Overload, Signature};
use super::render::{detect_macro, operator_symbol, render};
use super::types::{most_general, Subst, Type};
use super::{suggest, CheckError, CheckErrorKind};
use ::cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, SelectExpr,
};

/// Deepest AST nesting checked; deeper expressions are refused rather than
/// risk the stack.
pub const MAX_DEPTH: usize = 128;

pub(crate) struct Checker<'e> {
    env: &'e Env,
    subs: Subst,
    scopes: Vec<(String, Type)>,
    /// Comprehensions being checked, innermost last: a node the macro
    /// expander generated is reported as the macro call the user wrote.
    macros: Vec<String>,
    fresh: usize,
    depth: usize,
    too_deep: bool,
    pub(crate) errors: Vec<CheckError>,
}

impl<'e> Checker<'e> {
    pub(crate) fn new(env: &'e Env) -> Self {
        Checker {
            env,
            subs: Subst::default(),
            scopes: Vec::new(),
            macros: Vec::new(),
            fresh: 0,
            depth: 0,
            too_deep: false,
            errors: Vec::new(),
        }
    }

    /// The type of `e`, with type variables left unbound replaced by `dyn`
    /// (cel-go's output type).
    pub(crate) fn check_root(&mut self, e: &IdedExpr) -> Type {
        let t = self.check(e);
        self.subs.apply(&t, true)
    }

    fn error(&mut self, e: &IdedExpr, kind: CheckErrorKind) {
        let mut expr = render(e);
        if expr.contains("@result") {
            if let Some(m) = self.macros.last() {
                expr = m.clone();
            }
        }
        self.errors.push(CheckError {
            origin: None,
            expr,
            kind,
        });
    }

    fn fresh_var(&mut self) -> Type {
        self.fresh += 1;
        Type::TypeParam(format!("_var{}", self.fresh))
    }

    fn check(&mut self, e: &IdedExpr) -> Type {
        if self.depth >= MAX_DEPTH {
            if !self.too_deep {
                self.too_deep = true;
                self.error(e, CheckErrorKind::TooDeep { max: MAX_DEPTH });
            }
            return Type::Error;
        }
        self.depth += 1;
        let t = self.check_inner(e);
        self.depth -= 1;
        t
    }

    fn check_inner(&mut self, e: &IdedExpr) -> Type {
        match &e.expr {
            Expr::Unspecified => {
                self.error(e, CheckErrorKind::Unsupported("an empty expression"));
                Type::Error
            }
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Type::Bool,
                LiteralValue::Bytes(_) => Type::Bytes,
                LiteralValue::Double(_) => Type::Double,
                LiteralValue::Int(_) => Type::Int,
                LiteralValue::Null => Type::Null,
                LiteralValue::String(_) => Type::String,
                LiteralValue::UInt(_) => Type::Uint,
            },
            Expr::Ident(name) => self.check_ident(e, name),
            Expr::List(l) => {
                let mut elem: Option<Type> = None;
                for x in &l.elements {
                    let t = self.check(x);
                    elem = Some(self.join(elem, t));
                }
                let elem = match elem {
                    Some(t) => t,
                    None => self.fresh_var(),
                };
                Type::list(elem)
            }
            Expr::Map(m) => {
                let (mut key, mut val) = (None, None);
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            let k = self.check(&me.key);
                            key = Some(self.join(key, k));
                            let v = self.check(&me.value);
                            val = Some(self.join(val, v));
                        }
                        EntryExpr::StructField(_) => {
                            self.error(e, CheckErrorKind::Unsupported("a field in a map literal"));
                        }
                    }
                }
                let key = match key {
                    Some(t) => t,
                    None => self.fresh_var(),
                };
                let val = match val {
                    Some(t) => t,
                    None => self.fresh_var(),
                };
                Type::map(key, val)
            }
            Expr::Struct(_) => {
                self.error(
                    e,
                    CheckErrorKind::Unsupported(
                        "object construction (no message types are declared)",
                    ),
                );
                Type::Error
            }
            Expr::Select(s) => self.check_select(e, s),
            Expr::Call(c) => self.check_call(e, c),
            Expr::Comprehension(c) => self.check_comprehension(e, c),
        }
    }

    /// The element type of a list (or map key/value) literal after adding
    /// one more element: cel-go without homogeneous aggregate literals,
    /// so mixed elements make `dyn`.
    fn join(&mut self, prev: Option<Type>, cur: Type) -> Type {
        let Some(prev) = prev else { return cur };
        let mut trial = self.subs.clone();
        if trial.assignable(&prev, &cur) {
            self.subs = trial;
            most_general(&prev, &cur)
        } else {
            Type::Dyn
        }
    }

    fn lookup(&self, name: &str) -> Option<Type> {
        if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Some(t.clone());
        }
        self.env.variable(name).cloned()
    }

    fn check_ident(&mut self, e: &IdedExpr, name: &str) -> Type {
        if let Some(t) = self.lookup(name) {
            return t;
        }
        let names = self
            .scopes
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(self.env.variables.keys().map(String::as_str))
            .filter(|n| !n.starts_with('@'));
        let suggestions = suggest(name, names);
        self.error(
            e,
            CheckErrorKind::UnknownIdent {
                name: name.to_string(),
                suggestions,
            },
        );
        Type::Error
    }

    fn check_select(&mut self, e: &IdedExpr, s: &SelectExpr) -> Type {
        if !s.test {
            if let Some(q) = qualified_name(e) {
                if self
                    .scopes
                    .iter()
                    .all(|(n, _)| !q.starts_with(&format!("{n}.")))
                {
                    if let Some(t) = self.env.variable(&q) {
                        return t.clone();
                    }
                }
            }
        }
        let operand = self.check(&s.operand);
        let operand = self.subs.apply(&operand, false);
        let field_type = match &operand {
            Type::Object(o) => match o.fields.get(&s.field) {
                Some(t) => t.clone(),
                None => {
                    let kind = match o.unavailable.get(&s.field) {
                        Some(reason) => CheckErrorKind::UnavailableField {
                            object: o.name.clone(),
                            field: s.field.clone(),
                            reason: reason.clone(),
                        },
                        None => CheckErrorKind::UnknownField {
                            object: o.name.clone(),
                            field: s.field.clone(),
                            valid: o.fields.keys().cloned().collect(),
                        },
                    };
                    self.error(e, kind);
                    Type::Error
                }
            },
            Type::Map(_, v) => (**v).clone(),
            Type::TypeParam(_) => {
                self.subs.assignable(&Type::Dyn, &operand);
                Type::Dyn
            }
            t if t.is_dyn_or_error() => Type::Dyn,
            t => {
                self.error(e, CheckErrorKind::NoFields { ty: t.clone() });
                Type::Error
            }
        };
        if s.test {
            Type::Bool
        } else {
            field_type
        }
    }

    fn check_call(&mut self, e: &IdedExpr, c: &CallExpr) -> Type {
        // `ns.fn(args)` naming a declared global function (`json.unmarshal`,
        // `sets.contains`) rather than a method on a variable `ns`.
        if let Some(target) = &c.target {
            if let Some(q) = qualified_name(target) {
                let root = q.split('.').next().unwrap_or_default();
                let full = format!("{q}.{}", c.func_name);
                let is_method = self
                    .env
                    .functions
                    .get(&c.func_name)
                    .is_some_and(|os| os.iter().any(|o| o.receiver));
                if self.lookup(root).is_none() && (self.env.has_function(&full) || !is_method) {
                    let args: Vec<Type> = c.args.iter().map(|a| self.check(a)).collect();
                    return self.resolve(e, &full, None, args);
                }
            }
        }
        let receiver = c.target.as_ref().map(|t| self.check(t));
        let args: Vec<Type> = c.args.iter().map(|a| self.check(a)).collect();
        self.resolve(e, &c.func_name, receiver, args)
    }

    fn resolve(
        &mut self,
        e: &IdedExpr,
        name: &str,
        receiver: Option<Type>,
        args: Vec<Type>,
    ) -> Type {
        let env = self.env;
        let shown = operator_symbol(name).unwrap_or(name).to_string();
        let Some(overloads) = env.functions.get(name) else {
            let suggestions = suggest(name, env.functions.keys().map(String::as_str));
            self.error(
                e,
                CheckErrorKind::UnknownFunction {
                    name: name.to_string(),
                    method: receiver.is_some(),
                    suggestions,
                },
            );
            return Type::Error;
        };
        let style: Vec<&Overload> = overloads
            .iter()
            .filter(|o| o.receiver == receiver.is_some())
            .collect();
        if style.is_empty() {
            self.error(
                e,
                CheckErrorKind::WrongCallStyle {
                    name: shown,
                    method: receiver.is_some(),
                },
            );
            return Type::Error;
        }
        let candidates = |os: &[&Overload]| {
            os.iter()
                .map(|o| Signature(name, o).to_string())
                .collect::<Vec<_>>()
        };
        let arity: Vec<&Overload> = style
            .iter()
            .copied()
            .filter(|o| o.arity() == args.len())
            .collect();
        if arity.is_empty() {
            self.error(
                e,
                CheckErrorKind::WrongArity {
                    name: shown,
                    got: args.len(),
                    candidates: candidates(&style),
                },
            );
            return Type::Error;
        }
        let all_args: Vec<Type> = receiver.into_iter().chain(args).collect();
        let mut result: Option<Type> = None;
        for o in &arity {
            let renames: Vec<(String, Type)> = o
                .type_params()
                .into_iter()
                .map(|p| (p, self.fresh_var()))
                .collect();
            let inst = |t: &Type| instantiate(t, &renames);
            let mut trial = self.subs.clone();
            let ok = o
                .params
                .iter()
                .zip(&all_args)
                .all(|(p, a)| trial.assignable(&inst(p), a));
            if ok {
                self.subs = trial;
                let r = self.subs.apply(&inst(&o.result), false);
                result = Some(match result {
                    None => r,
                    Some(prev) if prev == r => prev,
                    Some(_) => Type::Dyn,
                });
            }
        }
        match result {
            Some(t) => t,
            None => {
                let args = all_args.iter().map(|t| self.subs.apply(t, true)).collect();
                self.error(
                    e,
                    CheckErrorKind::NoMatchingOverload {
                        name: shown,
                        args,
                        candidates: candidates(&arity),
                    },
                );
                Type::Error
            }
        }
    }

    fn check_comprehension(&mut self, e: &IdedExpr, c: &ComprehensionExpr) -> Type {
        let range = self.check(&c.iter_range);
        let accu = self.check(&c.accu_init);
        let range = self.subs.apply(&range, false);
        let (var, var2) = match &range {
            Type::List(elem) => (Type::Int, (**elem).clone()),
            Type::Map(k, v) => ((**k).clone(), (**v).clone()),
            Type::TypeParam(_) => {
                self.subs.assignable(&Type::Dyn, &range);
                (Type::Dyn, Type::Dyn)
            }
            t if t.is_dyn_or_error() => (Type::Dyn, Type::Dyn),
            t => {
                self.error(&c.iter_range, CheckErrorKind::NotARange { ty: t.clone() });
                (Type::Error, Type::Error)
            }
        };
        // One variable: a list yields its elements, a map its keys.
        let (var, var2) = match (&c.iter_var2, &range) {
            (None, Type::List(_)) => (var2, None),
            (None, _) => (var, None),
            (Some(_), _) => (var, Some(var2)),
        };
        let rendered = render(e);
        self.macros.push(rendered);
        let scopes = self.scopes.len();
        self.scopes.push((c.accu_var.clone(), accu.clone()));
        self.scopes.push((c.iter_var.clone(), var));
        if let (Some(name), Some(t)) = (&c.iter_var2, var2) {
            self.scopes.push((name.clone(), t));
        }
        // A macro's predicate must be bool; say so about the predicate the
        // user wrote rather than about the expanded step.
        let predicate_ok = match detect_macro(c).and_then(|m| m.predicate().map(|p| (m.name(), p)))
        {
            Some((name, p)) => {
                let saved = self.errors.len();
                let t = self.check(p);
                let t = self.subs.apply(&t, false);
                let mut trial = self.subs.clone();
                if self.errors.len() > saved {
                    false
                } else if trial.assignable(&Type::Bool, &t) {
                    self.subs = trial;
                    true
                } else {
                    self.error(
                        p,
                        CheckErrorKind::PredicateNotBool {
                            macro_name: name,
                            found: t,
                        },
                    );
                    false
                }
            }
            None => true,
        };
        let cond = self.check(&c.loop_cond);
        self.assert_type(&c.loop_cond, &Type::Bool, &cond);
        if predicate_ok {
            let step = self.check(&c.loop_step);
            self.assert_type(&c.loop_step, &accu, &step);
        }
        self.scopes.truncate(scopes + 1);
        let result = self.check(&c.result);
        self.scopes.truncate(scopes);
        self.macros.pop();
        self.subs.apply(&result, false)
    }

    fn assert_type(&mut self, e: &IdedExpr, expected: &Type, found: &Type) {
        let mut trial = self.subs.clone();
        if trial.assignable(expected, found) {
            self.subs = trial;
        } else {
            let expected = self.subs.apply(expected, true);
            let found = self.subs.apply(found, true);
            self.error(e, CheckErrorKind::TypeMismatch { expected, found });
        }
    }
}

/// `a.b.c` for a chain of selects on an identifier.
fn qualified_name(e: &IdedExpr) -> Option<String> {
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

fn instantiate(t: &Type, renames: &[(String, Type)]) -> Type {
    match t {
        Type::TypeParam(p) => renames
            .iter()
            .find(|(n, _)| n == p)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| t.clone()),
        Type::List(e) => Type::list(instantiate(e, renames)),
        Type::Map(k, v) => Type::map(instantiate(k, renames), instantiate(v, renames)),
        _ => t.clone(),
    }
}
