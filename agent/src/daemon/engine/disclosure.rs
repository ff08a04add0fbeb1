//! What of a policy's fetched data may be shown where operators and other
//! readers look (issue 37, finding 3: the confused deputy).
//!
//! A policy author can make the daemon read what its service account can
//! read (`resource.list('v1', 'pods', '')` holds every pod's environment).
//! If the values it computed from that data were quoted back, in a status
//! condition when they cannot be programmed, in a CEL error, or in the log
//! line that says the lists changed, the author would read them through
//! the daemon. So for a policy that reads data sources, unless the operator
//! opts in (`--show-data-values`, the chart's
//! `daemon.dataSources.showValues`):
//!
//! - a refused value its author did not write as a literal is shown as
//!   [`HIDDEN`], with its field and the rule it broke;
//! - an expression's evaluation error is summarised: its field, and that
//!   the error is hidden (a CEL error may quote the value it failed on).
//!   Fetch failures and missing data say only which source failed and are
//!   kept;
//! - the log line for changed lists gives their sizes, not their values.
//!
//! A policy that reads no data source shows everything: each value is
//! then one its author wrote, or computed from what it wrote.

use kyverno_runtime_enforce::dns::DnsRejection;
use kyverno_runtime_enforce::egress::EgressRejection;
use kyverno_runtime_enforce::protocol::ProtocolRejection;
use kyverno_runtime_policy::compile::{CompiledPolicy, EvaluateError, EvaluationResult};
use kyverno_runtime_policy::values::ValueError;
use std::collections::BTreeSet;
use std::fmt::Display;

/// What a hidden value reads as.
pub const HIDDEN: &str = "<a value computed from fetched data>";

/// What one policy may show of its values.
#[derive(Debug, Default)]
pub struct Disclosure {
    /// Values shown as they are (the spec's literals), when any are hidden.
    shown: Option<BTreeSet<String>>,
}

impl Disclosure {
    /// For `compiled`: hides what it computed from data unless `show`.
    pub fn of(compiled: &CompiledPolicy, show: bool) -> Self {
        if show || compiled.sources().is_empty() {
            return Self::default();
        }
        Self {
            shown: Some(
                compiled
                    .literal_values()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            ),
        }
    }

    /// Whether values computed from data are hidden.
    pub fn hides(&self) -> bool {
        self.shown.is_some()
    }

    /// The message of a refused value, the value hidden when it must be.
    pub fn rejection<R: Refused>(&self, r: &R) -> String {
        match &self.shown {
            Some(shown) if !shown.contains(r.value()) => {
                let mut r = r.clone();
                *r.value_mut() = HIDDEN.to_owned();
                r.to_string()
            }
            _ => r.to_string(),
        }
    }

    /// The message of an evaluation error, summarised when it may quote
    /// fetched data.
    pub fn evaluate_error(&self, e: &EvaluateError) -> String {
        match (self.hides(), e) {
            (true, EvaluateError::Expression { path, .. }) => format!(
                "{path}: the expression failed over fetched data (the error is hidden: it may \
                 quote the data; the daemon's --show-data-values shows it)"
            ),
            _ => e.to_string(),
        }
    }

    /// A policy's evaluated lists in one bounded line: their values, or
    /// only their sizes when values are hidden.
    pub fn lists(&self, result: &EvaluationResult, values: impl Fn(&[String]) -> String) -> String {
        let list = |v: &[String]| {
            if self.hides() {
                format!("{} value(s)", v.len())
            } else {
                values(v)
            }
        };
        result
            .behaviors
            .iter()
            .map(|b| {
                format!(
                    "behaviors[{}].{}: allow {} deny {}{}",
                    b.index,
                    b.kind,
                    list(&b.allow),
                    list(&b.deny),
                    if b.default_deny {
                        " (default deny)"
                    } else {
                        ""
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A refused value with its field and reason (each behavior's rejection
/// type).
pub trait Refused: Clone + Display {
    /// The value as computed.
    fn value(&self) -> &str;
    /// The value, to replace.
    fn value_mut(&mut self) -> &mut String;
}

macro_rules! refused {
    ($($t:ty),*) => {$(
        impl Refused for $t {
            fn value(&self) -> &str {
                &self.value
            }
            fn value_mut(&mut self) -> &mut String {
                &mut self.value
            }
        }
    )*};
}

refused!(ValueError, EgressRejection, ProtocolRejection, DnsRejection);

#[cfg(test)]
mod tests {
    use super::*;
    use kyverno_runtime_api::runtimepolicy::RuntimePolicySpec;

    fn compiled(spec: serde_json::Value) -> CompiledPolicy {
        let spec: RuntimePolicySpec =
            serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
        CompiledPolicy::compile(&spec).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn refused(value: &str) -> EgressRejection {
        EgressRejection {
            path: "spec.behaviors[0].network.deny".into(),
            value: value.into(),
            reason: kyverno_runtime_enforce::egress::RejectReason::Invalid(
                kyverno_runtime_policy::values::Reason::Empty,
            ),
        }
    }

    #[test]
    fn a_value_computed_from_fetched_data_is_hidden_and_a_literal_is_not() {
        let reads = compiled(serde_json::json!({"mode": "monitor", "behaviors": [
            {"network": {"deny": {"values": ["not an address"],
             "expression": "resource.list('v1', 'pods', '').items.map(p, string(p.metadata.name))"}}}]}));
        let d = Disclosure::of(&reads, false);
        let secret = d.rejection(&refused("DB_PASSWORD=hunter2"));
        assert!(!secret.contains("hunter2"), "{secret}");
        assert!(secret.contains(HIDDEN), "{secret}");
        assert!(
            secret.contains("spec.behaviors[0].network.deny"),
            "{secret}"
        );
        let literal = d.rejection(&refused("not an address"));
        assert!(literal.contains("not an address"), "{literal}");
        // The operator opted in; a policy reading no data shows all.
        let shown = Disclosure::of(&reads, true).rejection(&refused("DB_PASSWORD=hunter2"));
        assert!(shown.contains("hunter2"), "{shown}");
        let plain = compiled(serde_json::json!({"mode": "monitor", "behaviors": [
            {"network": {"deny": {"expression": "['a' + 'b']"}}}]}));
        assert!(!Disclosure::of(&plain, false).hides());
    }
}
