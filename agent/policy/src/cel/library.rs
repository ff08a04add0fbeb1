//! Library functions the evaluator runs itself rather than through the
//! `cel` context: the cel-go string and list extensions, the Kubernetes
//! list functions and sets, and `json.unmarshal` — the ones policies use
//! most. A call through the context converts every argument and the result
//! between `cel::Value` and the `cel` crate's boxed values (most of the
//! time such a call takes); here the arguments are used as they are.
//!
//! The semantics are cel-go's (indices in code points, Go's `strings`
//! functions for `replace` and `split`), checked by the differential
//! corpus; each function returns `None` for argument types it does not
//! cover, and the evaluator then calls the library's own.

use ::cel::objects::KeyRef;
use ::cel::{ExecutionError, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// A library function implemented here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lib {
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Reverse,
    Flatten,
    Slice,
    IsSorted,
    SetsContains,
    SetsIntersects,
    SetsEquivalent,
    JsonUnmarshal,
}

impl Lib {
    /// The function for a call of `name` (as the checker resolved it) with
    /// `n` arguments, the receiver counted.
    pub(crate) fn of(name: &str, method: bool, n: usize) -> Option<Lib> {
        Some(match (name, method, n) {
            ("charAt", true, 2) => Lib::CharAt,
            ("indexOf", true, 2 | 3) => Lib::IndexOf,
            ("lastIndexOf", true, 2 | 3) => Lib::LastIndexOf,
            ("lowerAscii", true, 1) => Lib::LowerAscii,
            ("upperAscii", true, 1) => Lib::UpperAscii,
            ("replace", true, 3 | 4) => Lib::Replace,
            ("split", true, 2 | 3) => Lib::Split,
            ("substring", true, 2 | 3) => Lib::Substring,
            ("trim", true, 1) => Lib::Trim,
            ("join", true, 1 | 2) => Lib::Join,
            ("reverse", true, 1) => Lib::Reverse,
            ("flatten", true, 1 | 2) => Lib::Flatten,
            ("slice", true, 3) => Lib::Slice,
            ("isSorted", true, 1) => Lib::IsSorted,
            ("sets.contains", false, 2) => Lib::SetsContains,
            ("sets.intersects", false, 2) => Lib::SetsIntersects,
            ("sets.equivalent", false, 2) => Lib::SetsEquivalent,
            ("json.unmarshal", false, 1) => Lib::JsonUnmarshal,
            _ => return None,
        })
    }

    /// Its name, as the cost model knows it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Lib::CharAt => "charAt",
            Lib::IndexOf => "indexOf",
            Lib::LastIndexOf => "lastIndexOf",
            Lib::LowerAscii => "lowerAscii",
            Lib::UpperAscii => "upperAscii",
            Lib::Replace => "replace",
            Lib::Split => "split",
            Lib::Substring => "substring",
            Lib::Trim => "trim",
            Lib::Join => "join",
            Lib::Reverse => "reverse",
            Lib::Flatten => "flatten",
            Lib::Slice => "slice",
            Lib::IsSorted => "isSorted",
            // Linear here (hashed) for strings and ints; the library's,
            // quadratic, for anything else.
            Lib::SetsContains => "sets.contains",
            Lib::SetsIntersects => "sets.intersects",
            Lib::SetsEquivalent => "sets.equivalent",
            Lib::JsonUnmarshal => "json.unmarshal",
        }
    }
}

fn string(v: Value) -> Arc<String> {
    match v {
        Value::String(s) => s,
        _ => Arc::new(String::new()),
    }
}

fn err(function: &str, message: impl ToString) -> Option<Result<Value, ExecutionError>> {
    Some(Err(ExecutionError::function_error(function, message)))
}

fn int(i: usize) -> Value {
    Value::Int(i64::try_from(i).unwrap_or(i64::MAX))
}

/// Runs `f` on `args` (the receiver first), or `None` if these argument
/// types are not covered here.
pub(crate) fn call(f: Lib, args: &[Value]) -> Option<Result<Value, ExecutionError>> {
    let s = |i: usize| match args.get(i) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let n = |i: usize| match args.get(i) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let list = |i: usize| match args.get(i) {
        Some(Value::List(l)) => Some(l),
        _ => None,
    };
    match f {
        Lib::CharAt => {
            let (text, i) = (s(0)?, n(1)?);
            let len = text.chars().count();
            match usize::try_from(i) {
                Ok(i) if i <= len => Some(Ok(Value::String(Arc::new(
                    text.chars().nth(i).map(String::from).unwrap_or_default(),
                )))),
                _ => err("charAt", format!("index out of range: {i}")),
            }
        }
        Lib::IndexOf | Lib::LastIndexOf => {
            let (text, sub) = (s(0)?, s(1)?);
            let name = if f == Lib::IndexOf {
                "indexOf"
            } else {
                "lastIndexOf"
            };
            let runes: Vec<char> = text.chars().collect();
            let offset = match (args.len(), f) {
                (3, _) => n(2)?,
                (_, Lib::IndexOf) => 0,
                // lastIndexOf(sub): from the end; an empty sub is found at
                // the end, a longer one nowhere.
                _ if sub.is_empty() => return Some(Ok(int(runes.len()))),
                _ if text.len() < sub.len() => return Some(Ok(Value::Int(-1))),
                _ => i64::try_from(runes.len()).unwrap_or(i64::MAX) - 1,
            };
            let Ok(off) = usize::try_from(offset) else {
                return err(name, format!("index out of range: {offset}"));
            };
            if sub.is_empty() {
                // Found at the offset, clamped to the end.
                return Some(Ok(int(off.min(runes.len()))));
            }
            if off >= runes.len() {
                return Some(Ok(Value::Int(-1)));
            }
            let subs: Vec<char> = sub.chars().collect();
            let at = |i: usize| runes[i..].starts_with(&subs);
            let found = if f == Lib::IndexOf {
                (off..runes.len().saturating_sub(subs.len() - 1)).find(|&i| at(i))
            } else if subs.len() > runes.len() {
                None
            } else {
                (0..=off.min(runes.len() - subs.len()))
                    .rev()
                    .find(|&i| at(i))
            };
            Some(Ok(found.map_or(Value::Int(-1), int)))
        }
        Lib::LowerAscii => Some(Ok(Value::String(Arc::new(s(0)?.to_ascii_lowercase())))),
        Lib::UpperAscii => Some(Ok(Value::String(Arc::new(s(0)?.to_ascii_uppercase())))),
        Lib::Replace => {
            let (text, old, new) = (s(0)?, s(1)?, s(2)?);
            let limit = if args.len() == 4 { n(3)? } else { -1 };
            Some(Ok(Value::String(Arc::new(go_replace(
                text, old, new, limit,
            )))))
        }
        Lib::Split => {
            let (text, sep) = (s(0)?, s(1)?);
            let limit = if args.len() == 3 { n(2)? } else { -1 };
            let parts = go_split(text, sep, limit);
            Some(Ok(Value::List(Arc::new(
                parts
                    .into_iter()
                    .map(|p| Value::String(Arc::new(p.to_string())))
                    .collect(),
            ))))
        }
        Lib::Substring => {
            let text = s(0)?;
            let runes: Vec<char> = text.chars().collect();
            let start = n(1)?;
            let end = if args.len() == 3 {
                n(2)?
            } else {
                i64::try_from(runes.len()).unwrap_or(i64::MAX)
            };
            let len = runes.len();
            if start > end {
                return err(
                    "substring",
                    format!("invalid substring range. start: {start}, end: {end}"),
                );
            }
            let index = |i: i64| usize::try_from(i).ok().filter(|i| *i <= len);
            let Some(from) = index(start) else {
                return err("substring", format!("index out of range: {start}"));
            };
            let Some(to) = index(end) else {
                return err("substring", format!("index out of range: {end}"));
            };
            Some(Ok(Value::String(Arc::new(
                runes[from..to].iter().collect(),
            ))))
        }
        Lib::Trim => Some(Ok(Value::String(Arc::new(s(0)?.trim().to_string())))),
        Lib::Join => {
            let items = list(0)?;
            let sep = if args.len() == 2 { s(1)? } else { "" };
            let mut out = String::new();
            for (i, x) in items.iter().enumerate() {
                let Value::String(x) = x else { return None };
                if i > 0 {
                    out.push_str(sep);
                }
                out.push_str(x);
            }
            Some(Ok(Value::String(Arc::new(out))))
        }
        Lib::Reverse => match args.first()? {
            Value::String(t) => Some(Ok(Value::String(Arc::new(t.chars().rev().collect())))),
            Value::List(l) => Some(Ok(Value::List(Arc::new(l.iter().rev().cloned().collect())))),
            _ => None,
        },
        Lib::Flatten => {
            let items = list(0)?;
            let depth = if args.len() == 2 { n(1)? } else { 1 };
            if depth < 0 {
                return err("flatten", "level must be non-negative");
            }
            let mut out = Vec::with_capacity(items.len());
            flatten(items, depth, &mut out);
            Some(Ok(Value::List(Arc::new(out))))
        }
        Lib::Slice => {
            let items = list(0)?;
            let (start, end) = (n(1)?, n(2)?);
            if start < 0 || end < 0 {
                return err(
                    "slice",
                    format!("cannot slice({start}, {end}), negative indexes not supported"),
                );
            }
            if start > end {
                return err(
                    "slice",
                    format!("cannot slice({start}, {end}), start index must be less than or equal to end index"),
                );
            }
            let (from, to) = (
                usize::try_from(start).unwrap_or(usize::MAX),
                usize::try_from(end).unwrap_or(usize::MAX),
            );
            if to > items.len() {
                return err(
                    "slice",
                    format!(
                        "cannot slice({start}, {end}), list is length {}",
                        items.len()
                    ),
                );
            }
            Some(Ok(Value::List(Arc::new(items[from..to].to_vec()))))
        }
        Lib::IsSorted => {
            let items = list(0)?;
            let kind = items.first().map(std::mem::discriminant);
            let ordered = |v: &Value| {
                matches!(
                    v,
                    Value::Int(_) | Value::UInt(_) | Value::String(_) | Value::Bool(_)
                )
            };
            if items
                .iter()
                .any(|x| Some(std::mem::discriminant(x)) != kind || !ordered(x))
            {
                return None;
            }
            Some(Ok(Value::Bool(items.windows(2).all(|w| w[0] <= w[1]))))
        }
        Lib::SetsContains | Lib::SetsIntersects | Lib::SetsEquivalent => {
            let (a, b) = (keys(list(0)?)?, keys(list(1)?)?);
            let contains = |x: &HashSet<KeyRef<'_>>, y: &HashSet<KeyRef<'_>>| y.is_subset(x);
            Some(Ok(Value::Bool(match f {
                Lib::SetsContains => contains(&a, &b),
                Lib::SetsIntersects => !a.is_disjoint(&b),
                _ => contains(&a, &b) && contains(&b, &a),
            })))
        }
        Lib::JsonUnmarshal => {
            let text = string(args.first()?.clone());
            Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .map(|j| super::eval::json_to_value(&j))
                    .map_err(|e| ExecutionError::function_error("json.unmarshal", e)),
            )
        }
    }
}

/// A list of strings (or of ints) as a hash set; `None` for anything else
/// (numbers compare across int, uint and double, so only a list of one of
/// these two kinds hashes by value).
fn keys(items: &[Value]) -> Option<HashSet<KeyRef<'_>>> {
    let strings = items.iter().all(|x| matches!(x, Value::String(_)));
    let ints = items.iter().all(|x| matches!(x, Value::Int(_)));
    if !strings && !ints {
        return None;
    }
    Some(
        items
            .iter()
            .filter_map(|x| match x {
                Value::String(s) => Some(KeyRef::String(s.as_str())),
                Value::Int(i) => Some(KeyRef::Int(*i)),
                _ => None,
            })
            .collect(),
    )
}

fn flatten(items: &[Value], depth: i64, out: &mut Vec<Value>) {
    for x in items {
        match x {
            Value::List(inner) if depth > 0 => flatten(inner, depth - 1, out),
            other => out.push(other.clone()),
        }
    }
}

/// Go's `strings.Replace`: up to `n` replacements (`n < 0`: all); an
/// empty `old` matches before each code point and at the end.
fn go_replace(s: &str, old: &str, new: &str, n: i64) -> String {
    let limit = usize::try_from(n).unwrap_or(usize::MAX);
    if old == new || limit == 0 {
        return s.to_string();
    }
    if old.is_empty() {
        let mut out = String::with_capacity(s.len() + new.len() * (s.len() + 1));
        let mut done = 0;
        for c in s.chars() {
            if done < limit {
                out.push_str(new);
                done += 1;
            }
            out.push(c);
        }
        if done < limit {
            out.push_str(new);
        }
        return out;
    }
    s.replacen(old, new, limit)
}

/// Go's `strings.SplitN` (`n < 0`: every part; `n == 0`: none); an empty
/// separator splits into code points.
fn go_split<'a>(s: &'a str, sep: &str, n: i64) -> Vec<&'a str> {
    if n == 0 {
        return Vec::new();
    }
    let limit = usize::try_from(n).unwrap_or(usize::MAX);
    if sep.is_empty() {
        let mut out: Vec<&str> = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            if out.len() + 1 == limit {
                out.push(rest);
                return out;
            }
            let len = rest.chars().next().map_or(1, char::len_utf8);
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        return out;
    }
    s.splitn(limit, sep).collect()
}
