//! monitorFilter: a policy's `bool` predicates over the `event` object,
//! applied where a monitor-mode finding is formed.
//!
//! The expressions were type-checked at compile time against the `event`
//! schema ([`kyverno_runtime_policy::cel::event_type`]); here they are
//! evaluated against [`event_value`], the same shape built from an
//! [`Event`]: `kind`, `pod` (namespace, name, uid, labels), `comm`, `pid`,
//! `cgroupId`, `count`, and the one object of its kind (`open`, `exec`,
//! `net`, `dns`, `protocol`), whose presence is the `has()` guard. A field
//! the event does not know (a counter has no pid) is absent, so `has()`
//! tells.
//!
//! Expressions are ANDed in order and stop at the first `false`. An
//! evaluation error or a non-bool result does not suppress the finding: it
//! is reported anyway and counted in
//! `monitor_filter_eval_errors_total{policy,expression}`, because a broken
//! filter must not look like silence.

use crate::event::{Event, Facts, PodRef};
use cel::objects::{Key, Map};
use cel::{Context, Value};
use kyverno_runtime_policy::cel::eval::{base_context, evaluate};
use kyverno_runtime_policy::compile::CompiledFilter;
use std::collections::HashMap;
use std::sync::Arc;

fn s(v: &str) -> Value {
    Value::String(Arc::new(v.to_string()))
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let map: HashMap<Key, Value> = entries
        .into_iter()
        .map(|(k, v)| (Key::String(Arc::new(k.to_string())), v))
        .collect();
    Value::Map(Map { map: Arc::new(map) })
}

/// The `event` object of `event`, attributed to `pod`.
pub fn event_value(event: &Event, pod: &PodRef) -> Value {
    let labels: HashMap<Key, Value> = pod
        .labels
        .iter()
        .map(|(k, v)| (Key::String(Arc::new(k.clone())), s(v)))
        .collect();
    let mut fields = vec![
        ("kind", s(event.kind().as_str())),
        (
            "pod",
            map(vec![
                ("namespace", s(&pod.namespace)),
                ("name", s(&pod.name)),
                ("uid", s(&pod.uid)),
                (
                    "labels",
                    Value::Map(Map {
                        map: Arc::new(labels),
                    }),
                ),
            ]),
        ),
        ("count", Value::UInt(event.count)),
    ];
    if let Some(p) = &event.process {
        fields.push(("comm", s(&p.comm)));
        fields.push(("pid", Value::Int(i64::from(p.pid))));
    }
    if let Some(c) = event.cgroup {
        fields.push(("cgroupId", Value::UInt(c)));
    }
    let fact = match &event.facts {
        Facts::Open { path } => ("open", map(vec![("path", s(path))])),
        Facts::Exec { filename, argv } => (
            "exec",
            map(vec![
                ("filename", s(filename)),
                (
                    "argv",
                    Value::List(Arc::new(argv.iter().map(|a| s(a)).collect())),
                ),
            ]),
        ),
        Facts::Net { dest, port, names } => {
            let mut net = vec![("destIP", s(&dest.to_string()))];
            if let Some(p) = port {
                net.push(("destPort", Value::Int(i64::from(*p))));
            }
            // The filter API has one name: the first known.
            if let Some(d) = names.first() {
                net.push(("domain", s(d)));
            }
            ("net", map(net))
        }
        Facts::Dns { qname } => ("dns", map(vec![("qname", s(qname))])),
        Facts::Protocol { protocol, alpn } => {
            let mut p = vec![("protocol", s(protocol))];
            if let Some(a) = alpn {
                p.push(("alpn", s(a)));
            }
            ("protocol", map(p))
        }
    };
    fields.push(fact);
    map(fields)
}

/// Why a filter did not answer `true` or `false`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterError {
    /// The expression's name.
    pub expression: String,
    /// What went wrong.
    pub error: String,
}

/// Evaluates `filters` in order against `event` (built once, by the
/// caller) in `base`: `Ok(true)` when every one is true, `Ok(false)` at the
/// first false, and, for an expression that errors or is not a bool, the
/// error is collected and evaluation goes on as if it were true (the
/// finding is reported anyway).
pub fn passes(
    filters: &[CompiledFilter],
    base: &Context<'_>,
    event: &Value,
    errors: &mut Vec<FilterError>,
) -> bool {
    if filters.is_empty() {
        return true;
    }
    let mut scope = base.new_inner_scope();
    scope.add_variable_from_value("event", event.clone());
    for f in filters {
        match evaluate(&f.expr, &scope) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => return false,
            Ok(other) => errors.push(FilterError {
                expression: f.name.clone(),
                error: format!("the result is not a bool: {other:?}"),
            }),
            Err(e) => errors.push(FilterError {
                expression: f.name.clone(),
                error: e.to_string(),
            }),
        }
    }
    true
}

/// The run-time functions a monitorFilter may call: the base libraries,
/// without `resource`, `http` or `json` (affordable once per evaluation
/// interval, not once per kernel event).
pub fn filter_context() -> Context<'static> {
    base_context()
}
