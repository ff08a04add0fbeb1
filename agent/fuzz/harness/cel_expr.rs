//! Fuzzes CEL as a policy field feeds it: parse and type-check
//! (`cel::check`, the compiler's entry), then plan and run the checked
//! expression with a cost budget (`cel::program`), over the policy
//! environment plus a few bound variables of each kind.
//!
//! Invariants beyond "no panic":
//! - a refusal is one or more one-line messages that show none of the
//!   parser's internals (issue 24 §5) and no raw control character;
//! - the checker is sound at the top level: a value the program returns has
//!   the kind of the checked type (`int` evaluates to an int, `list(...)`
//!   to a list, ...);
//! - evaluation is deterministic: a second run returns the same outcome.

use cel::Value;
use kyverno_runtime_policy::cel::eval::shared_policy_context;
use kyverno_runtime_policy::cel::program::{Budget, Program};
use kyverno_runtime_policy::cel::{check, Env, Type};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

// harness/common.rs, which the including crate declares as `common`.
use crate::common::{core, BUDGET};

/// What a parser's internals look like in a message.
const INTERNALS: &[&str] = &[
    "ContextAll",
    "Context`!",
    "OtherError",
    "ParseError {",
    "Syntax error",
    "<EOF>",
    "NUM_INT",
    "IDENTIFIER",
];

/// The policy environment with a variable of each common type.
static ENV: LazyLock<Env> = LazyLock::new(|| {
    let mut env = Env::policy();
    env.add_variable("s", Type::String)
        .add_variable("i", Type::Int)
        .add_variable("b", Type::Bool)
        .add_variable("d", Type::Dyn)
        .add_variable("l", Type::list(Type::String))
        .add_variable("m", Type::map(Type::String, Type::Int));
    env
});

fn string(s: &str) -> Value {
    Value::String(Arc::new(s.to_string()))
}

/// The variables' values.
static VARS: LazyLock<HashMap<&'static str, Value>> = LazyLock::new(|| {
    HashMap::from([
        ("s", string("/bin/sh")),
        ("i", Value::Int(42)),
        ("b", Value::Bool(true)),
        ("d", Value::List(Arc::new(vec![Value::Int(1), string("a")]))),
        (
            "l",
            Value::List(Arc::new(vec![
                string("/usr/bin/curl"),
                string("10.0.0.0/8"),
            ])),
        ),
        (
            "m",
            Value::Map(cel::objects::Map {
                map: Arc::new(HashMap::from([(
                    cel::objects::Key::String(Arc::new("k".into())),
                    Value::Int(1),
                )])),
            }),
        ),
    ])
});

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let checked = match check(source, &ENV) {
        Ok(c) => c,
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal with no error");
            for e in errors {
                let message = e.to_string();
                assert!(
                    !message.contains(['\n', '\r']),
                    "a message on two lines: {message:?}"
                );
                assert!(
                    !message.chars().any(|c| c.is_control()),
                    "a raw control character in: {message:?}"
                );
                // (Unless the expression itself spells it.)
                for internal in INTERNALS.iter().filter(|i| !source.contains(core(i))) {
                    assert!(!message.contains(internal), "{internal} in: {message}");
                }
            }
            return;
        }
    };
    let program = Program::new(&checked, &ENV, &HashMap::new());
    let globals: Vec<Option<Value>> = program
        .globals()
        .iter()
        .map(|name| VARS.get(name.as_str()).cloned())
        .collect();
    let first = program.run(&globals, shared_policy_context(), &mut Budget::new(BUDGET));
    let second = program.run(&globals, shared_policy_context(), &mut Budget::new(BUDGET));
    match (&first, &second) {
        // Debug text as well: NaN is not equal to itself, even in a list.
        (Ok(a), Ok(b)) => assert!(
            a == b || format!("{a:?}") == format!("{b:?}"),
            "{source}: {a:?} then {b:?}"
        ),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{source}"),
        _ => panic!("{source}: {first:?} then {second:?}"),
    }
    if let Ok(value) = first {
        assert!(
            fits(&checked.ty, &value),
            "{source}: checked as {} but evaluated to {value:?}",
            checked.ty
        );
    }
}

/// Whether `v` has the kind of `ty` (top level only; `dyn`, type
/// parameters and objects accept anything).
fn fits(ty: &Type, v: &Value) -> bool {
    match ty {
        Type::Bool => matches!(v, Value::Bool(_)),
        Type::Int => matches!(v, Value::Int(_)),
        Type::Uint => matches!(v, Value::UInt(_)),
        Type::Double => matches!(v, Value::Float(_)),
        Type::String => matches!(v, Value::String(_)),
        Type::Bytes => matches!(v, Value::Bytes(_)),
        Type::Null => matches!(v, Value::Null),
        Type::Duration => matches!(v, Value::Duration(_)),
        Type::Timestamp => matches!(v, Value::Timestamp(_)),
        Type::List(_) => matches!(v, Value::List(_)),
        Type::Map(..) => matches!(v, Value::Map(_)),
        _ => true,
    }
}
