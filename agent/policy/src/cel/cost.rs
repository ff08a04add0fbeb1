//! The cost model: what an evaluation is charged at run time, and the
//! estimate of it made when a policy compiles.
//!
//! Units, as cel-go counts them (so the API server's budgets read the same
//! here): every operator, name, field selection, index and function call
//! costs 1; a list or map literal 1 plus its size; a macro 1 per element
//! besides its predicate or transform; traversing a value costs a tenth of
//! a string's or bytes' length and a list's or map's element count, charged
//! to the functions that traverse their arguments (all of them, by default,
//! and every result too); `==` on lists and maps their size; `x in list`
//! the list's length; concatenation its result's traversal. Functions that
//! compare every element with every other are charged the product of their
//! lists' lengths (`distinct()`, `sets.contains`, `sets.equivalent`,
//! `sets.intersects`, except on strings and ints, where they run in linear
//! time), before the call, so a quadratic call on a large list is stopped
//! rather than run.
//!
//! At run time ([`super::program`]) each policy evaluation has
//! [`super::eval::RUNTIME_COST_BUDGET`] units for all its variables and
//! expressions; spending it stops the evaluation with an error naming the
//! field, and the last good lists stay programmed.
//!
//! When a policy compiles, [`estimate`] bounds each expression's cost as a
//! polynomial in `n`, the size in bytes of the largest fetched data source
//! (the one thing not known then): any value read from a data source is
//! taken to be up to `n` long, with its parts adding up to at most `n`, so
//! a loop over a fetched list that does constant or element-sized work per
//! element is linear in `n`. An expression is refused when its estimate
//! grows faster than linearly with `n` (a loop over fetched data nested in
//! another over fetched data, `x in list` or a quadratic function on fetched
//! data inside a loop over it), or when its cost without any data exceeds
//! [`STATIC_COST_LIMIT`] (the API server's limit on a rule's estimated
//! cost). Linear expressions over large data are bounded by the run-time
//! budget instead.

use super::program::{Builtin, Comprehension, Node, Program};
use ::cel::Value;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

/// Largest estimated cost of an expression over no fetched data (the API
/// server's `StaticEstimatedCostLimit`).
pub const STATIC_COST_LIMIT: f64 = 10_000_000.0;

/// How a library function's work grows with its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Complexity {
    /// Proportional to the arguments' traversal.
    Linear,
    /// The square of the first list's length (it compares every element
    /// with every other).
    SelfQuadratic,
    /// The product of the first two lists' lengths.
    Product,
}

/// How `name` (as the checker resolved it) grows when the library runs
/// it. (`distinct` and `sets.*` on strings and ints run here in linear
/// time and are not charged this; the estimate takes them to be linear,
/// and the run-time charge stops the quadratic case.)
pub(crate) fn complexity(name: &str) -> Complexity {
    match name {
        "distinct" => Complexity::SelfQuadratic,
        "sets.contains" | "sets.equivalent" | "sets.intersects" => Complexity::Product,
        _ => Complexity::Linear,
    }
}

/// A polynomial in `n` with non-negative coefficients: `c[0] + c[1]·n +
/// c[2]·n²`, every higher power counted in `c[2]` (only "more than
/// linear" matters).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Poly {
    c: [f64; 3],
}

impl Poly {
    /// Zero.
    pub const ZERO: Poly = Poly { c: [0.0; 3] };

    /// A constant.
    pub fn k(c: f64) -> Poly {
        Poly { c: [c, 0.0, 0.0] }
    }

    /// `n`.
    pub fn n() -> Poly {
        Poly { c: [0.0, 1.0, 0.0] }
    }

    /// The constant term: the cost with no fetched data.
    pub fn constant(&self) -> f64 {
        self.c[0]
    }

    /// The coefficient of `n`.
    pub fn linear(&self) -> f64 {
        self.c[1]
    }

    /// Whether it grows faster than linearly in `n`.
    pub fn superlinear(&self) -> bool {
        self.c[2] > 0.0
    }

    /// Its value at `n`.
    pub fn at(&self, n: f64) -> f64 {
        self.c[0] + self.c[1] * n + self.c[2] * n * n
    }

    fn add(self, o: Poly) -> Poly {
        Poly {
            c: [self.c[0] + o.c[0], self.c[1] + o.c[1], self.c[2] + o.c[2]],
        }
    }

    fn mul(self, o: Poly) -> Poly {
        let a = self.c;
        let b = o.c;
        Poly {
            c: [
                a[0] * b[0],
                a[0] * b[1] + a[1] * b[0],
                a[0] * b[2] + a[1] * b[1] + a[1] * b[2] + a[2] * b[0] + a[2] * b[1] + a[2] * b[2],
            ],
        }
    }

    fn scale(self, f: f64) -> Poly {
        Poly {
            c: [self.c[0] * f, self.c[1] * f, self.c[2] * f],
        }
    }

    /// Coefficient-wise maximum: at least either for every `n ≥ 0`.
    fn max(self, o: Poly) -> Poly {
        Poly {
            c: [
                self.c[0].max(o.c[0]),
                self.c[1].max(o.c[1]),
                self.c[2].max(o.c[2]),
            ],
        }
    }

    /// `self - o`, each coefficient clamped at zero.
    fn minus(self, o: Poly) -> Poly {
        Poly {
            c: [
                (self.c[0] - o.c[0]).max(0.0),
                (self.c[1] - o.c[1]).max(0.0),
                (self.c[2] - o.c[2]).max(0.0),
            ],
        }
    }
}

impl fmt::Display for Poly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.c;
        write!(f, "{a:.0}")?;
        if b > 0.0 {
            write!(f, " + {b:.1}·n")?;
        }
        if c > 0.0 {
            write!(f, " + {c:.2}·n²")?;
        }
        Ok(())
    }
}

/// The estimated size of a value: its length (a string's or bytes' length,
/// a list's or map's element count), the total size of everything in it,
/// and a bound on each element (`None`: any part is bounded by `total`).
#[derive(Clone, Debug)]
pub struct Size {
    len: Poly,
    total: Poly,
    elem: Option<Rc<Size>>,
}

impl Size {
    /// A scalar (or anything of constant size zero).
    pub fn scalar() -> Size {
        Size::blob(Poly::ZERO)
    }

    /// Anything whose length and parts add up to at most `total`: what a
    /// data source returns, with `total = n`.
    pub fn blob(total: Poly) -> Size {
        Size {
            len: total,
            total,
            elem: None,
        }
    }

    /// A fetched document.
    pub fn data() -> Size {
        Size::blob(Poly::n())
    }

    fn element(&self) -> Size {
        match &self.elem {
            Some(e) => (**e).clone(),
            None => Size::blob(self.total),
        }
    }

    fn join(&self, o: &Size) -> Size {
        let elem = match (&self.elem, &o.elem) {
            (Some(a), Some(b)) => Some(Rc::new(a.join(b))),
            _ => None,
        };
        Size {
            len: self.len.max(o.len),
            total: self.total.max(o.total),
            elem,
        }
    }

    fn of(v: &Value) -> Size {
        match v {
            Value::String(s) => Size::blob(Poly::k(s.len() as f64)),
            Value::Bytes(b) => Size::blob(Poly::k(b.len() as f64)),
            Value::List(l) => {
                let mut elem = None::<Size>;
                let mut total = Poly::k(l.len() as f64);
                for x in l.iter() {
                    let s = Size::of(x);
                    total = total.add(s.total);
                    elem = Some(match elem {
                        Some(e) => e.join(&s),
                        None => s,
                    });
                }
                Size {
                    len: Poly::k(l.len() as f64),
                    total,
                    elem: Some(Rc::new(elem.unwrap_or_else(Size::scalar))),
                }
            }
            Value::Map(m) => {
                let mut total = Poly::k(m.map.len() as f64);
                let mut elem = None::<Size>;
                for x in m.map.values() {
                    let s = Size::of(x);
                    total = total.add(s.total);
                    elem = Some(match elem {
                        Some(e) => e.join(&s),
                        None => s,
                    });
                }
                Size {
                    len: Poly::k(m.map.len() as f64),
                    total,
                    elem: Some(Rc::new(elem.unwrap_or_else(Size::scalar))),
                }
            }
            _ => Size::scalar(),
        }
    }

    /// What traversing it costs (see the module docs): its length, a tenth
    /// of it for text.
    fn traversal(&self, text: bool) -> Poly {
        if text {
            self.len.scale(0.1)
        } else {
            self.len
        }
    }
}

/// The data sizes a program's names have, for [`estimate`].
pub struct Inputs<'a> {
    /// The estimated result size of each variable, by name.
    pub variables: &'a HashMap<String, Size>,
}

/// The estimated cost of a program and the size of its result.
#[derive(Clone, Debug)]
pub struct Estimate {
    /// The cost, in `n`.
    pub cost: Poly,
    /// The result's size.
    pub size: Size,
}

/// Estimates `program`'s cost; see the module docs.
pub fn estimate(program: &Program, inputs: &Inputs<'_>) -> Estimate {
    let mut e = Estimator {
        globals: program.globals(),
        inputs,
        locals: HashMap::new(),
    };
    let (cost, size) = e.node(&program.root);
    Estimate { cost, size }
}

/// Why an estimate is refused, if it is.
pub fn refusal(cost: &Poly) -> Option<String> {
    if cost.superlinear() {
        return Some(format!(
            "its estimated cost ({cost}, n the size of the fetched data) grows faster than the data: a loop over fetched data nested in another loop over it, or `in` on fetched data inside such a loop; index the data once (a variable) or restructure the expression"
        ));
    }
    if cost.constant() > STATIC_COST_LIMIT {
        return Some(format!(
            "its estimated cost ({cost}) exceeds the limit of {STATIC_COST_LIMIT:.0} even without any fetched data"
        ));
    }
    None
}

struct Estimator<'a> {
    globals: &'a [String],
    inputs: &'a Inputs<'a>,
    locals: HashMap<usize, Size>,
}

fn text(s: &Size) -> bool {
    // A size with no element structure of its own, a blob, may be text.
    s.elem.is_none()
}

impl Estimator<'_> {
    fn global(&self, i: usize) -> Option<&str> {
        self.globals.get(i).map(String::as_str)
    }

    fn node(&mut self, n: &Node) -> (Poly, Size) {
        let one = Poly::k(1.0);
        match n {
            Node::Const(v) => (Poly::ZERO, Size::of(v)),
            // A data source's result, or a name bound by whoever evaluates
            // (taken to be as large as fetched data).
            Node::Global(_) => (one, Size::data()),
            Node::Local(slot) => (
                one,
                self.locals.get(slot).cloned().unwrap_or_else(Size::data),
            ),
            Node::Select { operand, field, .. } => {
                if let Node::Global(i) = &**operand {
                    if self.global(*i) == Some("variables") {
                        let size = self
                            .inputs
                            .variables
                            .get(field.as_str())
                            .cloned()
                            .unwrap_or_else(Size::data);
                        return (Poly::k(2.0), size);
                    }
                }
                let (c, s) = self.node(operand);
                (c.add(one), s.element())
            }
            Node::Index(c, i) => {
                let (cc, cs) = self.node(c);
                let (ci, _) = self.node(i);
                (one.add(cc).add(ci), cs.element())
            }
            Node::And(a, b) | Node::Or(a, b) => {
                let (ca, _) = self.node(a);
                let (cb, _) = self.node(b);
                (one.add(ca).add(cb), Size::scalar())
            }
            Node::Not(x) | Node::NotStrictlyFalse(x) | Node::Neg(x) => {
                let (c, _) = self.node(x);
                (one.add(c), Size::scalar())
            }
            Node::Cond(c, t, f) => {
                let (cc, _) = self.node(c);
                let (ct, st) = self.node(t);
                let (cf, sf) = self.node(f);
                (one.add(cc).add(ct.max(cf)), st.join(&sf))
            }
            Node::Arith(op, l, r) => {
                let (cl, sl) = self.node(l);
                let (cr, sr) = self.node(r);
                let mut cost = one.add(cl).add(cr);
                if *op == super::program::Arith::Add {
                    let size = Size {
                        len: sl.len.add(sr.len),
                        total: sl.total.add(sr.total),
                        elem: match (&sl.elem, &sr.elem) {
                            (Some(a), Some(b)) => Some(Rc::new(a.join(b))),
                            _ => None,
                        },
                    };
                    cost = cost.add(size.traversal(text(&size)));
                    return (cost, size);
                }
                (cost, Size::scalar())
            }
            Node::AccuAdd { slot, rhs } => {
                let (cr, sr) = self.node(rhs);
                let accu = self.locals.get(slot).cloned().unwrap_or_else(Size::scalar);
                (one.add(cr).add(sr.traversal(text(&sr))), accu.join(&sr))
            }
            Node::Eq(l, r) | Node::Ne(l, r) => {
                let (cl, sl) = self.node(l);
                let (cr, sr) = self.node(r);
                let t = sl.traversal(false).max(sr.traversal(false));
                (one.add(cl).add(cr).add(t), Size::scalar())
            }
            Node::Cmp(_, l, r) => {
                let (cl, _) = self.node(l);
                let (cr, _) = self.node(r);
                (one.add(cl).add(cr), Size::scalar())
            }
            Node::In(x, c) => {
                let (cx, _) = self.node(x);
                let (cc, sc) = self.node(c);
                (one.add(cx).add(cc).add(sc.len), Size::scalar())
            }
            Node::List(xs) => {
                let mut cost = Poly::k(1.0 + xs.len() as f64);
                let mut total = Poly::k(xs.len() as f64);
                let mut elem: Option<Size> = None;
                for x in xs {
                    let (c, s) = self.node(x);
                    cost = cost.add(c);
                    total = total.add(s.total);
                    elem = Some(match elem {
                        Some(e) => e.join(&s),
                        None => s,
                    });
                }
                let size = Size {
                    len: Poly::k(xs.len() as f64),
                    total,
                    elem: Some(Rc::new(elem.unwrap_or_else(Size::scalar))),
                };
                (cost, size)
            }
            Node::Map(entries) => {
                let mut cost = Poly::k(1.0 + entries.len() as f64);
                let mut total = Poly::k(entries.len() as f64);
                let mut elem: Option<Size> = None;
                for (k, v) in entries {
                    let (ck, sk) = self.node(k);
                    let (cv, sv) = self.node(v);
                    cost = cost.add(ck).add(cv);
                    total = total.add(sk.total).add(sv.total);
                    elem = Some(match elem {
                        Some(e) => e.join(&sv),
                        None => sv,
                    });
                }
                let size = Size {
                    len: Poly::k(entries.len() as f64),
                    total,
                    elem: Some(Rc::new(elem.unwrap_or_else(Size::scalar))),
                };
                (cost, size)
            }
            Node::Builtin { f, args, .. } => {
                let (cost, sizes) = self.args(args);
                let name = f.name();
                let range = match (f, args.first()) {
                    (Builtin::ListsRange, Some(Node::Const(Value::Int(k)))) => Some(*k),
                    _ => None,
                };
                self.call(name, cost, &sizes, range)
            }
            Node::Call { call, args } => {
                let (cost, sizes) = self.args(args);
                self.call(&call.name, cost, &sizes, None)
            }
            Node::Comprehension(c) => self.comprehension(c),
            Node::Fail(_) => (one, Size::scalar()),
        }
    }

    fn args(&mut self, args: &[Node]) -> (Poly, Vec<Size>) {
        let mut cost = Poly::k(1.0);
        let mut sizes = Vec::with_capacity(args.len());
        for a in args {
            let (c, s) = self.node(a);
            cost = cost.add(c);
            sizes.push(s);
        }
        (cost, sizes)
    }

    /// A call's cost (its arguments' already in `cost`) and result size.
    fn call(&mut self, name: &str, cost: Poly, args: &[Size], range: Option<i64>) -> (Poly, Size) {
        let traversal = args
            .iter()
            .fold(Poly::ZERO, |acc, s| acc.add(s.traversal(text(s))));
        let first = args.first().cloned().unwrap_or_else(Size::scalar);
        let work = match complexity(name) {
            // Run here in linear time on strings and ints (distinct also
            // on uints and bools); the quadratic library fallback is
            // charged when it runs.
            _ if name == "distinct" || name.starts_with("sets.") => traversal,
            Complexity::Linear => traversal,
            Complexity::SelfQuadratic => first.len.mul(first.len).add(traversal),
            Complexity::Product => {
                let second = args.get(1).cloned().unwrap_or_else(Size::scalar);
                first.len.mul(second.len).add(traversal)
            }
        };
        let sum_total = args.iter().fold(Poly::ZERO, |acc, s| acc.add(s.total));
        let scalar = Size::scalar;
        let size = match name {
            "size" | "contains" | "startsWith" | "endsWith" | "matches" | "type" | "bool"
            | "int" | "uint" | "double" | "indexOf" | "lastIndexOf" | "isSorted" | "sum"
            | "min" | "max" | "sets.contains" | "sets.equivalent" | "sets.intersects"
            | "duration" | "timestamp" | "ip" | "cidr" | "url" | "quantity" | "semver" | "isIP"
            | "isCIDR" | "isURL" | "isQuantity" | "isSemver" => scalar(),
            "string" => Size::blob(first.total.max(Poly::k(32.0))),
            "dyn" => first.clone(),
            "lists.range" => {
                let k = range.map_or(super::eval::MAX_RANGE, |k| {
                    k.clamp(0, super::eval::MAX_RANGE)
                });
                Size {
                    len: Poly::k(k as f64),
                    total: Poly::k(k as f64),
                    elem: Some(Rc::new(scalar())),
                }
            }
            "split" => Size {
                len: first.len.add(Poly::k(1.0)),
                total: first.total.add(first.len).add(Poly::k(1.0)),
                elem: Some(Rc::new(Size::blob(first.len))),
            },
            "replace" => {
                // Each match may be replaced by the whole replacement.
                let with = args.get(2).map_or(Poly::ZERO, |s| s.len);
                Size::blob(first.len.add(first.len.mul(with)))
            }
            "join" => Size::blob(
                first
                    .total
                    .add(first.len.mul(args.get(1).map_or(Poly::ZERO, |s| s.len))),
            ),
            "distinct" | "sort" | "reverse" | "slice" => first.clone(),
            _ => Size::blob(sum_total),
        };
        let out = size.traversal(text(&size));
        (cost.add(work).add(out), size)
    }

    fn comprehension(&mut self, c: &Comprehension) -> (Poly, Size) {
        let (cr, range) = self.node(&c.range);
        let (ci, init) = self.node(&c.init);
        let len = range.len;
        // Per element: the condition and the step, with the iteration
        // variable bound to a given element size.
        let per = |this: &mut Self, elem: Size| -> (Poly, Size) {
            this.locals.insert(c.iter, elem.clone());
            if let Some(slot) = c.iter2 {
                this.locals.insert(slot, elem);
            }
            this.locals.insert(c.accu, init.clone());
            let (cc, _) = if c.cond_true {
                (Poly::ZERO, Size::scalar())
            } else {
                this.node(&c.cond)
            };
            let (cs, step) = this.node(&c.step);
            (Poly::k(1.0).add(cc).add(cs), step)
        };
        let (p0, s0) = per(self, Size::scalar());
        // Amortized: the elements' sizes add up to the range's total.
        let (pt, st) = per(self, Size::blob(range.total));
        let amortized = len.mul(p0).add(pt.minus(p0));
        // Per element: each element at most the element bound.
        let (pe, se) = per(self, range.element());
        let bounded = len.mul(pe);
        let reference = 1_048_576.0;
        let use_amortized = if amortized.superlinear() == bounded.superlinear() {
            amortized.at(reference) <= bounded.at(reference)
        } else {
            !amortized.superlinear()
        };
        // What the accumulator grows to (a map's or filter's list): per
        // element, what the step appends.
        let appends = matches!(&c.init, Node::List(xs) if xs.is_empty());
        let (loop_cost, result_size) = if use_amortized {
            let (a0, at) = (s0.element(), st.element());
            let size = if appends {
                Size {
                    len,
                    total: len
                        .mul(Poly::k(1.0).add(a0.total))
                        .add(at.total.minus(a0.total)),
                    elem: Some(Rc::new(a0.join(&at))),
                }
            } else {
                st.join(&s0)
            };
            (amortized, size)
        } else {
            let added = se.element();
            let size = if appends {
                Size {
                    len,
                    total: len.mul(Poly::k(1.0).add(added.total)),
                    elem: Some(Rc::new(added)),
                }
            } else {
                se
            };
            (bounded, size)
        };
        self.locals.insert(c.accu, result_size);
        let (cres, res) = self.node(&c.result);
        self.locals.remove(&c.accu);
        self.locals.remove(&c.iter);
        if let Some(slot) = c.iter2 {
            self.locals.remove(&slot);
        }
        (Poly::k(1.0).add(cr).add(ci).add(loop_cost).add(cres), res)
    }
}
