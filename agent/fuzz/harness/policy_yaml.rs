//! Fuzzes the policy loader as `policy check` runs it: a YAML stream split
//! into documents, each reviewed as the API server would (the generated
//! CRD's schema and validation rules, `kyverno_runtime_policy::admission`),
//! read as a `RuntimePolicy`, compiled, evaluated with no data, and every
//! resulting value parsed by its behavior's parser.
//!
//! Invariants beyond "no panic":
//! - an object the review accepts, as the server would store it, reads as
//!   a `RuntimePolicy` (what the API server stores, the daemon can load);
//! - a policy that deserializes serializes back to YAML that deserializes
//!   to an equal policy (nothing is lost or reinterpreted by the loader);
//! - every compile and evaluation error names its field (`spec.` or
//!   `metadata.`) and shows none of a parser's internals.

use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_policy::admission::Admission;
use kyverno_runtime_policy::cel::eval::shared_policy_context;
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_policy::sources::DataSet;
use kyverno_runtime_policy::values::{
    parse_dns, parse_network, parse_path, parse_protocol, BehaviorKind, FieldPath, RuleSide,
};
use serde::Deserialize;

// harness/common.rs, which the including crate declares as `common`.
use crate::common::{core, BUDGET};

/// Documents read from one input: enough for multi-document files, few
/// enough that one input stays one test.
const MAX_DOCUMENTS: usize = 8;

/// What a parser's internals look like in a message.
const INTERNALS: &[&str] = &[
    "ContextAll",
    "OtherError",
    "ParseError {",
    "<EOF>",
    "NUM_INT",
];

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for document in serde_yaml::Deserializer::from_str(text).take(MAX_DOCUMENTS) {
        // After a syntax error the stream repeats it forever: stop at the
        // first, as the loader must.
        let Ok(value) = serde_yaml::Value::deserialize(document) else {
            return;
        };
        // The server stores the reviewed object (nulls it does not allow
        // dropped, defaults applied), not the file: that is what must load.
        let stored = serde_json::to_value(&value)
            .ok()
            .map(|json| admission().review(&json))
            .filter(|review| review.accepted())
            .and_then(|review| review.object);
        if let Some(stored) = stored {
            if let Err(e) = serde_json::from_value::<RuntimePolicy>(stored) {
                panic!("the review accepts what the loader cannot read: {e}");
            }
        }
        let Ok(policy) = serde_yaml::from_value::<RuntimePolicy>(value) else {
            continue;
        };
        round_trips(&policy);
        compile_and_evaluate(&policy, text);
    }
}

/// The reviewer of the generated CRD, built once.
fn admission() -> &'static Admission {
    static ADMISSION: std::sync::OnceLock<Admission> = std::sync::OnceLock::new();
    ADMISSION.get_or_init(|| {
        Admission::runtime_policy().unwrap_or_else(|e| panic!("the generated CRD: {e}"))
    })
}

fn round_trips(policy: &RuntimePolicy) {
    let yaml = serde_yaml::to_string(policy).unwrap_or_else(|e| panic!("serializing: {e}"));
    let again: RuntimePolicy = serde_yaml::from_str(&yaml)
        .unwrap_or_else(|e| panic!("reading back what was written: {e}\n{yaml}"));
    assert_eq!(
        again.spec, policy.spec,
        "the spec changed on a round trip:\n{yaml}"
    );
    assert_eq!(
        again.metadata, policy.metadata,
        "metadata changed on a round trip:\n{yaml}"
    );
}

/// `input`: the document's text; an internal it spells itself may be
/// quoted back.
fn names_its_field(message: &str, input: &str) {
    assert!(
        message.starts_with("spec.") || message.starts_with("metadata."),
        "an error that names no field: {message}"
    );
    for internal in INTERNALS.iter().filter(|i| !input.contains(core(i))) {
        assert!(!message.contains(internal), "{internal} in: {message}");
    }
}

fn compile_and_evaluate(policy: &RuntimePolicy, input: &str) {
    let compiled = match CompiledPolicy::compile(&policy.spec) {
        Ok(c) => c,
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal with no error");
            for e in errors {
                names_its_field(&e.to_string(), input);
            }
            return;
        }
    };
    let partial = compiled.evaluate_partial(shared_policy_context(), &DataSet::new(), BUDGET);
    for e in &partial.errors {
        names_its_field(&e.to_string(), input);
    }
    for b in &partial.result.behaviors {
        for (side, values) in [(RuleSide::Allow, &b.allow), (RuleSide::Deny, &b.deny)] {
            let path = FieldPath::values(b.index, b.kind, side);
            for v in values {
                let _ = match b.kind {
                    BehaviorKind::Network => parse_network(v, &path).map(|t| t.to_string()),
                    BehaviorKind::Open | BehaviorKind::Exec => {
                        parse_path(v, &path).map(|t| t.to_string())
                    }
                    BehaviorKind::Protocol => parse_protocol(v, &path).map(|t| t.to_string()),
                    BehaviorKind::Dns => parse_dns(v, &path).map(|t| t.to_string()),
                };
            }
        }
    }
}
