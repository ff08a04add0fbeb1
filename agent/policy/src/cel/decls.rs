//! Declarations: the variables and function overloads an expression may use.
//!
//! [`Env::base`] is the standard library plus the cel-go extension
//! libraries and the Kubernetes libraries (what `newBaseEnv` registers);
//! [`Env::policy`] adds the Kyverno SDK's `resource`, `http` and `json` for
//! behavior and variable expressions; [`Env::monitor_filter`] adds the
//! `event` variable instead.

use super::types::{ObjectType, Type};
use std::collections::BTreeMap;
use std::fmt;

/// One signature of a function.
#[derive(Clone, Debug, PartialEq)]
pub struct Overload {
    /// Called as `target.name(args)` (the target is `params[0]`) rather
    /// than `name(args)`.
    pub receiver: bool,
    /// Parameter types, the receiver first for a receiver-style overload.
    pub params: Vec<Type>,
    /// Result type.
    pub result: Type,
}

impl Overload {
    /// The type parameters the signature mentions (`A`, `K`, `V`, …).
    pub(crate) fn type_params(&self) -> Vec<String> {
        fn walk(t: &Type, out: &mut Vec<String>) {
            match t {
                Type::TypeParam(p) if !out.contains(p) => out.push(p.clone()),
                Type::List(e) => walk(e, out),
                Type::Map(k, v) => {
                    walk(k, out);
                    walk(v, out);
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        for t in self.params.iter().chain(std::iter::once(&self.result)) {
            walk(t, &mut out);
        }
        out
    }

    /// The number of arguments excluding the receiver.
    pub(crate) fn arity(&self) -> usize {
        self.params.len() - usize::from(self.receiver)
    }
}

/// An overload shown as it would be written: `string.contains(string) -> bool`.
pub(crate) struct Signature<'a>(pub &'a str, pub &'a Overload);

impl fmt::Display for Signature<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Signature(name, o) = self;
        let join = |ts: &[Type]| {
            ts.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if o.receiver {
            let (recv, rest) = o.params.split_at(1);
            write!(f, "{}.{}({}) -> {}", join(recv), name, join(rest), o.result)
        } else {
            write!(f, "{}({}) -> {}", name, join(&o.params), o.result)
        }
    }
}

/// The declarations an expression is checked against.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub(crate) variables: BTreeMap<String, Type>,
    pub(crate) functions: BTreeMap<String, Vec<Overload>>,
}

/// Opaque type of `ip(...)`.
pub const IP: Type = Type::Opaque("net.IP");
/// Opaque type of `cidr(...)`.
pub const CIDR: Type = Type::Opaque("net.CIDR");
/// Opaque type of `url(...)`.
pub const URL: Type = Type::Opaque("kubernetes.URL");
/// Opaque type of `quantity(...)`.
pub const QUANTITY: Type = Type::Opaque("kubernetes.Quantity");
/// Opaque type of `semver(...)`.
pub const SEMVER: Type = Type::Opaque("kubernetes.Semver");

impl Env {
    /// No declarations at all.
    pub fn empty() -> Self {
        Env::default()
    }

    /// The standard library, the cel-go extension libraries and the
    /// Kubernetes CEL libraries: what a monitorFilter may use besides
    /// `event`.
    pub fn base() -> Self {
        let mut env = Env::default();
        // Type names are values of type `type`: `type(x) == string`.
        for t in [
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
        ] {
            env.add_variable(t, Type::Type);
        }
        standard(&mut env);
        extensions(&mut env);
        kubernetes(&mut env);
        env
    }

    /// [`Env::base`] plus the Kyverno SDK libraries (`resource.get`,
    /// `resource.list`, `http.get`, `json.unmarshal`): the environment of
    /// behavior and variable expressions.
    pub fn policy() -> Self {
        let mut env = Env::base();
        let obj = || Type::map(Type::String, Type::Dyn);
        env.global("resource.get", vec![Type::String; 4], obj());
        env.global("resource.list", vec![Type::String; 3], obj());
        env.global("http.get", vec![Type::String], obj());
        env.global("json.unmarshal", vec![Type::String], Type::Dyn);
        env
    }

    /// [`Env::base`] plus the `event` variable ([`event_type`]): the
    /// environment of monitorFilter expressions.
    pub fn monitor_filter() -> Self {
        let mut env = Env::base();
        env.add_variable("event", event_type());
        env
    }

    /// Declares (or redeclares) a variable.
    pub fn add_variable(&mut self, name: impl Into<String>, ty: Type) -> &mut Self {
        self.variables.insert(name.into(), ty);
        self
    }

    /// Declares an overload of a function.
    pub fn add_overload(&mut self, name: impl Into<String>, overload: Overload) -> &mut Self {
        self.functions
            .entry(name.into())
            .or_default()
            .push(overload);
        self
    }

    /// The declared type of a variable.
    pub fn variable(&self, name: &str) -> Option<&Type> {
        self.variables.get(name)
    }

    /// Whether a function of this name is declared.
    pub fn has_function(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    fn global(&mut self, name: &str, params: Vec<Type>, result: Type) {
        self.add_overload(
            name,
            Overload {
                receiver: false,
                params,
                result,
            },
        );
    }

    fn method(&mut self, name: &str, params: Vec<Type>, result: Type) {
        self.add_overload(
            name,
            Overload {
                receiver: true,
                params,
                result,
            },
        );
    }

    /// Both `name(args)` and `args[0].name(args[1..])`.
    fn both(&mut self, name: &str, params: Vec<Type>, result: Type) {
        self.global(name, params.clone(), result.clone());
        self.method(name, params, result);
    }
}

fn a() -> Type {
    Type::param("A")
}

fn la() -> Type {
    Type::list(a())
}

fn standard(env: &mut Env) {
    use Type::{Bool, Bytes, Double, Duration, Dyn, Int, String, Timestamp, Uint};
    let b = || Bool;
    // Logic.
    env.global("_&&_", vec![b(), b()], b());
    env.global("_||_", vec![b(), b()], b());
    env.global("!_", vec![b()], b());
    env.global("@not_strictly_false", vec![b()], b());
    env.global("_?_:_", vec![b(), a(), a()], a());
    // Equality and membership.
    env.global("_==_", vec![a(), a()], b());
    env.global("_!=_", vec![a(), a()], b());
    env.global("@in", vec![a(), la()], b());
    env.global("@in", vec![a(), Type::map(a(), Type::param("B"))], b());
    // Ordering: same-type, and cel-go's heterogeneous numeric comparisons.
    for op in ["_<_", "_<=_", "_>_", "_>=_"] {
        for t in [Bool, Int, Uint, Double, String, Bytes, Duration, Timestamp] {
            env.global(op, vec![t.clone(), t], b());
        }
        for (x, y) in [
            (Int, Uint),
            (Int, Double),
            (Uint, Int),
            (Uint, Double),
            (Double, Int),
            (Double, Uint),
        ] {
            env.global(op, vec![x, y], b());
        }
    }
    // Arithmetic.
    for t in [Int, Uint, Double, String, Bytes, Duration] {
        env.global("_+_", vec![t.clone(), t.clone()], t);
    }
    env.global("_+_", vec![la(), la()], la());
    env.global("_+_", vec![Timestamp, Duration], Timestamp);
    env.global("_+_", vec![Duration, Timestamp], Timestamp);
    for t in [Int, Uint, Double, Duration] {
        env.global("_-_", vec![t.clone(), t.clone()], t);
    }
    env.global("_-_", vec![Timestamp, Timestamp], Duration);
    env.global("_-_", vec![Timestamp, Duration], Timestamp);
    for op in ["_*_", "_/_"] {
        for t in [Int, Uint, Double] {
            env.global(op, vec![t.clone(), t.clone()], t);
        }
    }
    for t in [Int, Uint] {
        env.global("_%_", vec![t.clone(), t.clone()], t);
    }
    env.global("-_", vec![Int], Int);
    env.global("-_", vec![Double], Double);
    // Indexing.
    env.global("_[_]", vec![la(), Int], a());
    env.global(
        "_[_]",
        vec![
            Type::map(Type::param("K"), Type::param("V")),
            Type::param("K"),
        ],
        Type::param("V"),
    );
    // Size.
    for t in [String, Bytes, la(), Type::map(a(), Type::param("B"))] {
        env.both("size", vec![t], Int);
    }
    // Conversions.
    for t in [Int, Uint, Double, String, Timestamp, Duration] {
        env.global("int", vec![t], Int);
    }
    for t in [Int, Uint, Double, String] {
        env.global("uint", vec![t], Uint);
    }
    for t in [Int, Uint, Double, String] {
        env.global("double", vec![t], Double);
    }
    for t in [Int, Uint, Double, String, Bytes, Bool, Timestamp, Duration] {
        env.global("string", vec![t], String);
    }
    env.global("bool", vec![Bool], Bool);
    env.global("bool", vec![String], Bool);
    env.global("bytes", vec![Bytes], Bytes);
    env.global("bytes", vec![String], Bytes);
    env.global("duration", vec![Duration], Duration);
    env.global("duration", vec![String], Duration);
    env.global("timestamp", vec![Timestamp], Timestamp);
    env.global("timestamp", vec![String], Timestamp);
    env.global("timestamp", vec![Int], Timestamp);
    env.global("dyn", vec![a()], Dyn);
    env.global("type", vec![a()], Type::Type);
    // Strings.
    for f in ["contains", "startsWith", "endsWith", "matches"] {
        env.method(f, vec![String, String], b());
    }
    env.global("matches", vec![String, String], b());
    // Timestamp and duration accessors.
    for f in [
        "getFullYear",
        "getMonth",
        "getDayOfYear",
        "getDayOfMonth",
        "getDate",
        "getDayOfWeek",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    ] {
        env.method(f, vec![Timestamp], Int);
        env.method(f, vec![Timestamp, String], Int);
    }
    for f in ["getHours", "getMinutes", "getSeconds", "getMilliseconds"] {
        env.method(f, vec![Duration], Int);
    }
}

/// cel-go's ext.Strings, ext.Lists, ext.Sets, ext.Math, ext.Encoders.
fn extensions(env: &mut Env) {
    use Type::{Bool, Bytes, Double, Dyn, Int, String, Uint};
    let s = || String;
    let ls = || Type::list(String);
    // Strings.
    env.method("charAt", vec![s(), Int], s());
    for f in ["indexOf", "lastIndexOf"] {
        env.method(f, vec![s(), s()], Int);
        env.method(f, vec![s(), s(), Int], Int);
    }
    for f in ["lowerAscii", "upperAscii", "trim", "reverse"] {
        env.method(f, vec![s()], s());
    }
    env.method("replace", vec![s(), s(), s()], s());
    env.method("replace", vec![s(), s(), s(), Int], s());
    env.method("split", vec![s(), s()], ls());
    env.method("split", vec![s(), s(), Int], ls());
    env.method("substring", vec![s(), Int], s());
    env.method("substring", vec![s(), Int, Int], s());
    env.method("join", vec![ls()], s());
    env.method("join", vec![ls(), s()], s());
    env.method("format", vec![s(), Type::list(Dyn)], s());
    env.global("strings.quote", vec![s()], s());
    // Lists.
    env.method("slice", vec![la(), Int, Int], la());
    env.method("flatten", vec![Type::list(la())], la());
    env.method("flatten", vec![Type::list(Dyn), Int], Type::list(Dyn));
    for f in ["sort", "distinct", "reverse"] {
        env.method(f, vec![la()], la());
    }
    env.global("lists.range", vec![Int], Type::list(Int));
    // Sets.
    for f in ["sets.contains", "sets.equivalent", "sets.intersects"] {
        env.global(f, vec![la(), la()], Bool);
    }
    // Math.
    // cel-go's math.greatest/least are macros over numeric overloads: one
    // number is itself, two of the same type keep it, a mixed pair (or a
    // longer mixed argument list) is refused, and a list yields its element.
    for f in ["math.greatest", "math.least"] {
        let nums = [Int, Uint, Double];
        for t in nums.clone() {
            env.global(f, vec![t.clone()], t.clone());
            env.global(f, vec![Type::list(t.clone())], t.clone());
            for u in nums.clone() {
                let r = if t == u { t.clone() } else { Dyn };
                env.global(f, vec![t.clone(), u.clone()], r);
            }
            env.global(f, vec![t.clone(), t.clone(), t.clone()], t.clone());
        }
    }
    // cel-go also takes int and uint here; kube-cel's bindings take only
    // these, so the other overloads are left undeclared and refused when
    // the policy compiles instead of failing at every evaluation.
    env.global("math.sqrt", vec![Double], Double);
    for f in ["math.bitAnd", "math.bitOr", "math.bitXor"] {
        env.global(f, vec![Int, Int], Int);
    }
    env.global("math.bitNot", vec![Int], Int);
    for f in ["math.bitShiftLeft", "math.bitShiftRight"] {
        env.global(f, vec![Int, Int], Int);
    }
    for f in ["math.ceil", "math.floor", "math.round", "math.trunc"] {
        env.global(f, vec![Double], Double);
    }
    for t in [Int, Uint, Double] {
        env.global("math.abs", vec![t.clone()], t.clone());
        env.global("math.sign", vec![t.clone()], t);
    }
    for f in ["math.isInf", "math.isNaN", "math.isFinite"] {
        env.global(f, vec![Double], Bool);
    }
    // Encoders.
    env.global("base64.encode", vec![Bytes], s());
    env.global("base64.decode", vec![s()], Bytes);
}

/// k8s.io/apiserver/pkg/cel/library: Lists, Regex, URLs, IP, CIDR,
/// Quantity, Semver.
fn kubernetes(env: &mut Env) {
    use Type::{Bool, Double, Duration, Int, String, Uint};
    let s = || String;
    // Lists.
    env.method("isSorted", vec![la()], Bool);
    for t in [Int, Uint, Double, Duration] {
        env.method("sum", vec![Type::list(t.clone())], t);
    }
    env.method("min", vec![la()], a());
    env.method("max", vec![la()], a());
    env.method("indexOf", vec![la(), a()], Int);
    env.method("lastIndexOf", vec![la(), a()], Int);
    // Regex.
    env.method("find", vec![s(), s()], s());
    env.method("findAll", vec![s(), s()], Type::list(s()));
    env.method("findAll", vec![s(), s(), Int], Type::list(s()));
    // URLs.
    env.global("url", vec![s()], URL);
    env.global("isURL", vec![s()], Bool);
    for f in [
        "getScheme",
        "getHost",
        "getHostname",
        "getPort",
        "getEscapedPath",
    ] {
        env.method(f, vec![URL], s());
    }
    env.method("getQuery", vec![URL], Type::map(s(), Type::list(s())));
    // IP.
    env.global("ip", vec![s()], IP);
    env.global("isIP", vec![s()], Bool);
    env.global("ip.isCanonical", vec![s()], Bool);
    env.method("family", vec![IP], Int);
    for f in [
        "isUnspecified",
        "isLoopback",
        "isLinkLocalMulticast",
        "isLinkLocalUnicast",
        "isGlobalUnicast",
    ] {
        env.method(f, vec![IP], Bool);
    }
    env.global("string", vec![IP], s());
    // CIDR.
    env.global("cidr", vec![s()], CIDR);
    env.global("isCIDR", vec![s()], Bool);
    env.method("containsIP", vec![CIDR, IP], Bool);
    env.method("containsIP", vec![CIDR, s()], Bool);
    env.method("containsCIDR", vec![CIDR, CIDR], Bool);
    env.method("containsCIDR", vec![CIDR, s()], Bool);
    env.method("ip", vec![CIDR], IP);
    env.method("masked", vec![CIDR], CIDR);
    env.method("prefixLength", vec![CIDR], Int);
    env.global("string", vec![CIDR], s());
    // Quantity.
    env.global("quantity", vec![s()], QUANTITY);
    env.global("isQuantity", vec![s()], Bool);
    // No sign(): k8s.io/apiserver's Quantity library has none (kube-cel
    // adds one; declaring it would accept policies cel-go refuses).
    env.method("isInteger", vec![QUANTITY], Bool);
    env.method("asInteger", vec![QUANTITY], Int);
    env.method("asApproximateFloat", vec![QUANTITY], Double);
    for f in ["add", "sub"] {
        env.method(f, vec![QUANTITY, QUANTITY], QUANTITY);
        env.method(f, vec![QUANTITY, Int], QUANTITY);
    }
    // Semver.
    env.global("semver", vec![s()], SEMVER);
    // Only the one-argument forms: the normalizing (string, bool) forms
    // arrive with SemverLib version 1, and the reference environment uses
    // the library's default version.
    env.global("isSemver", vec![s()], Bool);
    for f in ["major", "minor", "patch"] {
        env.method(f, vec![SEMVER], Int);
    }
    // Shared by quantity and semver.
    for t in [QUANTITY, SEMVER] {
        env.method("isGreaterThan", vec![t.clone(), t.clone()], Bool);
        env.method("isLessThan", vec![t.clone(), t.clone()], Bool);
        env.method("compareTo", vec![t.clone(), t], Int);
    }
}

/// The `event` object a monitorFilter expression sees: the observation,
/// a discriminated union on `kind` (`net`, `dns`, `exec`, `open`,
/// `protocol`) whose per-kind fact is also the `has()` guard
/// (`has(event.exec)`). Every field of the Go original's `event`
/// (`pkg/compiler/monitorfilter.go`) is here with its type, so a Go
/// user's filter compiles unchanged; `cgroupId` and `net.destPort` are
/// ours.
pub fn event_type() -> Type {
    use Type::{Bool, Int, String, Timestamp, Uint};
    let obj = |name: &str, fields: Vec<(&str, Type)>| Type::object(ObjectType::new(name, fields));
    let pod = obj(
        "event.pod",
        vec![
            ("namespace", String),
            ("name", String),
            ("uid", String),
            ("container", String),
            ("containerID", String),
            ("ownerKind", String),
            ("ownerName", String),
            ("nodeName", String),
            ("serviceAccount", String),
            ("labels", Type::map(String, String)),
        ],
    );
    obj(
        "event",
        vec![
            ("kind", String),
            ("time", Timestamp),
            ("pod", pod),
            ("comm", String),
            ("pid", Int),
            ("cgroupId", Uint),
            // int, as in the Go original: `event.count == 3` must check.
            ("count", Int),
            ("kernelDenied", Bool),
            ("wouldDeny", Bool),
            ("open", obj("event.open", vec![("path", String)])),
            (
                "exec",
                obj(
                    "event.exec",
                    vec![("filename", String), ("argv", Type::list(String))],
                ),
            ),
            (
                "net",
                obj(
                    "event.net",
                    vec![("destIP", String), ("destPort", Int), ("domain", String)],
                ),
            ),
            ("dns", obj("event.dns", vec![("qname", String)])),
            (
                "protocol",
                obj(
                    "event.protocol",
                    vec![("protocol", String), ("alpn", String)],
                ),
            ),
        ],
    )
}
