//! The CEL type model and cel-go's assignability rules over it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// A CEL type, as the checker assigns it to an expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    /// `bool`.
    Bool,
    /// `int` (64-bit signed).
    Int,
    /// `uint` (64-bit unsigned).
    Uint,
    /// `double`.
    Double,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// `null_type`.
    Null,
    /// `google.protobuf.Duration`.
    Duration,
    /// `google.protobuf.Timestamp`.
    Timestamp,
    /// `list(T)`.
    List(Box<Type>),
    /// `map(K, V)`.
    Map(Box<Type>, Box<Type>),
    /// A declared object type with typed fields (`event`, `variables`).
    Object(Arc<ObjectType>),
    /// `dyn`: known only at evaluation time.
    Dyn,
    /// A type parameter of a generic overload, or a fresh type variable.
    TypeParam(String),
    /// `type`: the type of a type value (`type(x)`).
    Type,
    /// The type of an expression that failed to check; assignable to
    /// anything so that one mistake is reported once.
    Error,
    /// An opaque library type (`net.IP`, `net.CIDR`, `kubernetes.URL`, …).
    Opaque(&'static str),
}

/// An object type: a name and its fields.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ObjectType {
    /// The type's name, used in messages (`event`, `event.exec`).
    pub name: String,
    /// The fields and their types.
    pub fields: BTreeMap<String, Type>,
    /// Names that are not fields here but are known, with the reason they
    /// cannot be used (a later variable, say); a better error than
    /// "unknown field".
    pub unavailable: BTreeMap<String, String>,
}

impl ObjectType {
    /// An object type with these fields.
    pub fn new<I, S>(name: impl Into<String>, fields: I) -> Self
    where
        I: IntoIterator<Item = (S, Type)>,
        S: Into<String>,
    {
        ObjectType {
            name: name.into(),
            fields: fields.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            unavailable: BTreeMap::new(),
        }
    }
}

impl Type {
    /// `list(elem)`.
    pub fn list(elem: Type) -> Type {
        Type::List(Box::new(elem))
    }

    /// `map(key, value)`.
    pub fn map(key: Type, value: Type) -> Type {
        Type::Map(Box::new(key), Box::new(value))
    }

    /// A type parameter named `name`.
    pub fn param(name: &str) -> Type {
        Type::TypeParam(name.to_string())
    }

    /// An object type.
    pub fn object(object: ObjectType) -> Type {
        Type::Object(Arc::new(object))
    }

    /// Whether this is `dyn` or the error type.
    pub fn is_dyn_or_error(&self) -> bool {
        matches!(self, Type::Dyn | Type::Error)
    }

    /// Exact equality, as cel-go's `IsExactType`: `list(dyn)` is not
    /// `list(string)`.
    pub fn is_exact(&self, other: &Type) -> bool {
        self == other
    }

    /// Whether this type mentions no type parameter.
    fn is_ground(&self) -> bool {
        match self {
            Type::TypeParam(_) => false,
            Type::List(e) => e.is_ground(),
            Type::Map(k, v) => k.is_ground() && v.is_ground(),
            _ => true,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Bool => f.write_str("bool"),
            Type::Int => f.write_str("int"),
            Type::Uint => f.write_str("uint"),
            Type::Double => f.write_str("double"),
            Type::String => f.write_str("string"),
            Type::Bytes => f.write_str("bytes"),
            Type::Null => f.write_str("null_type"),
            Type::Duration => f.write_str("google.protobuf.Duration"),
            Type::Timestamp => f.write_str("google.protobuf.Timestamp"),
            Type::List(e) => write!(f, "list({e})"),
            Type::Map(k, v) => write!(f, "map({k}, {v})"),
            Type::Object(o) => f.write_str(&o.name),
            Type::Dyn => f.write_str("dyn"),
            Type::TypeParam(p) => f.write_str(p),
            Type::Type => f.write_str("type"),
            Type::Error => f.write_str("*error*"),
            Type::Opaque(n) => f.write_str(n),
        }
    }
}

/// Type-variable bindings made while checking one expression (cel-go's
/// `mapping`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Subst {
    bound: HashMap<String, Type>,
}

impl Subst {
    /// `t` with every bound variable replaced; unbound variables are kept
    /// unless `free_to_dyn`, in which case they become `dyn`.
    pub(crate) fn apply(&self, t: &Type, free_to_dyn: bool) -> Type {
        self.apply_depth(t, free_to_dyn, 0)
    }

    fn apply_depth(&self, t: &Type, free_to_dyn: bool, depth: usize) -> Type {
        // Bindings never form a cycle (occurs check), but bound the walk
        // anyway so a bug cannot become a stack overflow.
        if depth > 64 {
            return Type::Dyn;
        }
        match t {
            Type::TypeParam(p) => match self.bound.get(p) {
                Some(b) => self.apply_depth(b, free_to_dyn, depth + 1),
                None if free_to_dyn => Type::Dyn,
                None => t.clone(),
            },
            Type::List(e) => Type::list(self.apply_depth(e, free_to_dyn, depth + 1)),
            Type::Map(k, v) => Type::map(
                self.apply_depth(k, free_to_dyn, depth + 1),
                self.apply_depth(v, free_to_dyn, depth + 1),
            ),
            _ => t.clone(),
        }
    }

    fn occurs(&self, p: &str, t: &Type) -> bool {
        match self.apply(t, false) {
            Type::TypeParam(q) => q == p,
            Type::List(e) => self.occurs(p, &e),
            Type::Map(k, v) => self.occurs(p, &k) || self.occurs(p, &v),
            _ => false,
        }
    }

    /// Whether a value of type `actual` may stand where `expected` is
    /// wanted, binding type variables on the way (cel-go's
    /// `internalIsAssignable`). `dyn` and the error type are assignable in
    /// both directions; `null` only to nullable types.
    pub(crate) fn assignable(&mut self, expected: &Type, actual: &Type) -> bool {
        self.assignable_depth(expected, actual, 0)
    }

    fn assignable_depth(&mut self, t1: &Type, t2: &Type, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        if let Type::TypeParam(p2) = t2 {
            let (valid, has_sub) = self.substitute_var(t1, p2, depth);
            if valid {
                return true;
            }
            if has_sub {
                return false;
            }
        }
        if let Type::TypeParam(p1) = t1 {
            return self.substitute_var(t2, p1, depth).0;
        }
        if t1.is_dyn_or_error() || t2.is_dyn_or_error() {
            return true;
        }
        if *t1 == Type::Null {
            return nullable(t2);
        }
        if *t2 == Type::Null {
            return nullable(t1);
        }
        match (t1, t2) {
            (Type::List(a), Type::List(b)) => self.assignable_depth(a, b, depth + 1),
            (Type::Map(k1, v1), Type::Map(k2, v2)) => {
                self.assignable_depth(k1, k2, depth + 1) && self.assignable_depth(v1, v2, depth + 1)
            }
            (Type::Object(a), Type::Object(b)) => a.name == b.name,
            _ => t1 == t2,
        }
    }

    /// Whether `t` may be a substitution for variable `p`; returns
    /// `(valid, p_was_bound)`.
    fn substitute_var(&mut self, t: &Type, p: &str, depth: usize) -> (bool, bool) {
        if let Type::TypeParam(q) = t {
            if q == p {
                return (true, true);
            }
        }
        if let Some(sub) = self.bound.get(p).cloned() {
            if sub == *t {
                return (true, true);
            }
            if self.assignable_depth(t, &sub, depth + 1) {
                let general = most_general(t, &sub);
                if !self.occurs(p, &general) {
                    self.bound.insert(p.to_string(), general);
                }
                return (true, true);
            }
            return (false, true);
        }
        if !self.occurs(p, t) {
            self.bound.insert(p.to_string(), t.clone());
            return (true, false);
        }
        (false, false)
    }
}

fn nullable(t: &Type) -> bool {
    matches!(
        t,
        Type::Null | Type::Object(_) | Type::Opaque(_) | Type::Duration | Type::Timestamp
    )
}

/// The less specific of two compatible types (`dyn` over `string`).
pub(crate) fn most_general(a: &Type, b: &Type) -> Type {
    if less_specific(a, b) {
        a.clone()
    } else {
        b.clone()
    }
}

fn less_specific(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Dyn | Type::TypeParam(_), _) => true,
        (Type::List(x), Type::List(y)) => less_specific(x, y),
        (Type::Map(k1, v1), Type::Map(k2, v2)) => less_specific(k1, k2) && less_specific(v1, v2),
        _ => a == b && a.is_ground(),
    }
}
