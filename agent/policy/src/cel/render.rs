//! Turning a parsed sub-expression back into source-like text for error
//! messages: the `cel` 0.13 parser keeps offsets only for parse errors, so
//! a check error names the offending sub-expression by its rendering.

use ::cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use std::fmt::Write;

/// Longest rendering kept; longer ones end in `…`.
const MAX_LEN: usize = 120;
/// Deepest nesting rendered; deeper parts become `…`.
const MAX_DEPTH: usize = 24;

/// The macro a comprehension was expanded from, with its user-written parts.
pub(crate) enum Macro<'a> {
    /// `r.all(x, p)`.
    All(&'a IdedExpr),
    /// `r.exists(x, p)`.
    Exists(&'a IdedExpr),
    /// `r.exists_one(x, p)`.
    ExistsOne(&'a IdedExpr),
    /// `r.map(x, f)`.
    Map(&'a IdedExpr),
    /// `r.map(x, p, f)`.
    MapFilter(&'a IdedExpr, &'a IdedExpr),
    /// `r.filter(x, p)`.
    Filter(&'a IdedExpr),
}

impl<'a> Macro<'a> {
    /// The macro's name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Macro::All(_) => "all",
            Macro::Exists(_) => "exists",
            Macro::ExistsOne(_) => "exists_one",
            Macro::Map(_) | Macro::MapFilter(..) => "map",
            Macro::Filter(_) => "filter",
        }
    }

    /// The predicate, for the macros that have one.
    pub(crate) fn predicate(&self) -> Option<&'a IdedExpr> {
        match self {
            Macro::All(p)
            | Macro::Exists(p)
            | Macro::ExistsOne(p)
            | Macro::Filter(p)
            | Macro::MapFilter(p, _) => Some(*p),
            Macro::Map(_) => None,
        }
    }
}

fn call<'a>(e: &'a IdedExpr, name: &str) -> Option<&'a [IdedExpr]> {
    match &e.expr {
        Expr::Call(c) if c.func_name == name && c.target.is_none() => Some(&c.args),
        _ => None,
    }
}

fn single_list_elem(e: &IdedExpr) -> Option<&IdedExpr> {
    match &e.expr {
        Expr::List(l) if l.elements.len() == 1 => l.elements.first(),
        _ => None,
    }
}

/// Recognizes the shapes the parser's macro expanders produce.
pub(crate) fn detect_macro(c: &ComprehensionExpr) -> Option<Macro<'_>> {
    match &c.accu_init.expr {
        Expr::Literal(LiteralValue::Boolean(b)) => {
            let op = if *b.inner() { "_&&_" } else { "_||_" };
            let args = call(&c.loop_step, op)?;
            let p = args.get(1)?;
            Some(if *b.inner() {
                Macro::All(p)
            } else {
                Macro::Exists(p)
            })
        }
        Expr::Literal(LiteralValue::Int(_)) => {
            call(&c.loop_step, "_?_:_")?.first().map(Macro::ExistsOne)
        }
        Expr::List(_) => {
            if let Some(args) = call(&c.loop_step, "_+_") {
                return single_list_elem(args.get(1)?).map(Macro::Map);
            }
            let args = call(&c.loop_step, "_?_:_")?;
            let p = args.first()?;
            let add = call(args.get(1)?, "_+_")?;
            let f = single_list_elem(add.get(1)?)?;
            match &f.expr {
                Expr::Ident(v) if *v == c.iter_var => Some(Macro::Filter(p)),
                _ => Some(Macro::MapFilter(p, f)),
            }
        }
        _ => None,
    }
}

/// `e` as source-like text, truncated.
pub(crate) fn render(e: &IdedExpr) -> String {
    let mut out = String::new();
    write_expr(&mut out, e, 0);
    if out.chars().count() > MAX_LEN {
        let mut cut: String = out.chars().take(MAX_LEN).collect();
        cut.push('…');
        return cut;
    }
    out
}

/// The infix spelling of an operator function, if it is one.
pub(crate) fn operator_symbol(name: &str) -> Option<&'static str> {
    Some(match name {
        "_&&_" => "&&",
        "_||_" => "||",
        "_==_" => "==",
        "_!=_" => "!=",
        "_<_" => "<",
        "_<=_" => "<=",
        "_>_" => ">",
        "_>=_" => ">=",
        "_+_" => "+",
        "_-_" => "-",
        "_*_" => "*",
        "_/_" => "/",
        "_%_" => "%",
        "@in" => "in",
        _ => return None,
    })
}

fn write_operand(out: &mut String, e: &IdedExpr, depth: usize) {
    let compound = matches!(&e.expr, Expr::Call(c) if c.target.is_none()
        && (operator_symbol(&c.func_name).is_some() || c.func_name == "_?_:_"));
    if compound {
        out.push('(');
        write_expr(out, e, depth);
        out.push(')');
    } else {
        write_expr(out, e, depth);
    }
}

fn write_list(out: &mut String, es: &[IdedExpr], depth: usize) {
    for (i, e) in es.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_expr(out, e, depth);
    }
}

fn write_expr(out: &mut String, e: &IdedExpr, depth: usize) {
    if depth > MAX_DEPTH || out.len() > MAX_LEN * 2 {
        out.push('…');
        return;
    }
    let d = depth + 1;
    match &e.expr {
        Expr::Unspecified => out.push('?'),
        Expr::Ident(n) => out.push_str(n),
        Expr::Literal(l) => write_literal(out, l),
        Expr::Select(s) => {
            if s.test {
                out.push_str("has(");
            }
            write_operand(out, &s.operand, d);
            out.push('.');
            out.push_str(&s.field);
            if s.test {
                out.push(')');
            }
        }
        Expr::List(l) => {
            out.push('[');
            write_list(out, &l.elements, d);
            out.push(']');
        }
        Expr::Map(m) => {
            out.push('{');
            for (i, entry) in m.entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    write_expr(out, &me.key, d);
                    out.push_str(": ");
                    write_expr(out, &me.value, d);
                }
            }
            out.push('}');
        }
        Expr::Struct(s) => {
            out.push_str(&s.type_name);
            out.push_str("{…}");
        }
        Expr::Call(c) => {
            if let (Some(sym), None, [l, r]) =
                (operator_symbol(&c.func_name), &c.target, c.args.as_slice())
            {
                write_operand(out, l, d);
                let _ = write!(out, " {sym} ");
                write_operand(out, r, d);
                return;
            }
            match (c.func_name.as_str(), &c.target, c.args.as_slice()) {
                ("!_", None, [x]) => {
                    out.push('!');
                    write_operand(out, x, d);
                }
                ("-_", None, [x]) => {
                    out.push('-');
                    write_operand(out, x, d);
                }
                ("_?_:_", None, [c0, t, f]) => {
                    write_operand(out, c0, d);
                    out.push_str(" ? ");
                    write_operand(out, t, d);
                    out.push_str(" : ");
                    write_operand(out, f, d);
                }
                ("_[_]", None, [x, i]) => {
                    write_operand(out, x, d);
                    out.push('[');
                    write_expr(out, i, d);
                    out.push(']');
                }
                ("@not_strictly_false", None, [x]) => write_expr(out, x, d),
                (name, target, args) => {
                    if let Some(t) = target {
                        write_operand(out, t, d);
                        out.push('.');
                    }
                    out.push_str(name);
                    out.push('(');
                    write_list(out, args, d);
                    out.push(')');
                }
            }
        }
        Expr::Comprehension(c) => {
            write_operand(out, &c.iter_range, d);
            match detect_macro(c) {
                Some(m) => {
                    let _ = write!(out, ".{}({}, ", m.name(), c.iter_var);
                    match m {
                        Macro::MapFilter(p, f) => {
                            write_expr(out, p, d);
                            out.push_str(", ");
                            write_expr(out, f, d);
                        }
                        Macro::All(x)
                        | Macro::Exists(x)
                        | Macro::ExistsOne(x)
                        | Macro::Map(x)
                        | Macro::Filter(x) => write_expr(out, x, d),
                    }
                    out.push(')');
                }
                None => {
                    let _ = write!(out, ".<comprehension>({}, …)", c.iter_var);
                }
            }
        }
    }
}

fn write_literal(out: &mut String, l: &LiteralValue) {
    let _ = match l {
        LiteralValue::Boolean(b) => write!(out, "{}", b.inner()),
        LiteralValue::Int(i) => write!(out, "{}", i.inner()),
        LiteralValue::UInt(u) => write!(out, "{}u", u.inner()),
        LiteralValue::Double(f) => write!(out, "{:?}", f.inner()),
        LiteralValue::String(s) => write!(out, "{:?}", s.inner()),
        LiteralValue::Bytes(b) => write!(out, "b{:?}", String::from_utf8_lossy(b.inner())),
        LiteralValue::Null => write!(out, "null"),
    };
}
