//! monitorFilter: a policy's `bool` predicates over the `event` object,
//! applied where a monitor-mode finding is formed.
//!
//! The expressions were type-checked at compile time against the `event`
//! schema ([`kyverno_runtime_policy::cel::event_type`]); here they are
//! evaluated against [`event_value`], the same shape built from an
//! [`Event`], field for field the Go original's (`NewFilterActivation`):
//! `kind`, `time`, `comm`, `pid`, `count`, `kernelDenied`, `wouldDeny`,
//! `pod` (namespace, name, uid, container, containerID, ownerKind,
//! ownerName, nodeName, serviceAccount, labels), and the one object of its
//! kind (`open`, `exec`, `net`, `dns`, `protocol`), whose presence is the
//! `has()` guard. As there, a value the event does not know is the empty
//! one (`""`, `0`): a counter has no process, so its `comm` is `""` and its
//! `pid` 0. Ours besides: `cgroupId` and `net.destPort`, present only when
//! known (`has()` tells).
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
use std::time::{SystemTime, UNIX_EPOCH};

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

/// `t` as a CEL timestamp (UTC). A time before the epoch or past what a
/// timestamp holds reads as the epoch: an event's time is its arrival or
/// drain, so neither happens.
fn timestamp(t: SystemTime) -> Value {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let at = i64::try_from(since.as_secs())
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, since.subsec_nanos()))
        .unwrap_or_default();
    Value::Timestamp(at.fixed_offset())
}

/// The `event` object of `event`, attributed to `pod`. `would_deny` is the
/// monitor's counterfactual, set by the caller as the Go original's monitor
/// sets it: on a monitor policy's finding, never on a dns one.
pub fn event_value(event: &Event, pod: &PodRef, would_deny: bool) -> Value {
    let labels: HashMap<Key, Value> = pod
        .labels
        .iter()
        .map(|(k, v)| (Key::String(Arc::new(k.clone())), s(v)))
        .collect();
    // The container of the event's cgroup; "" when the cgroup is not one
    // of the pod's (a pod-uid or PID attribution knows no container).
    let container = event
        .cgroup
        .and_then(|c| pod.containers.get(&c))
        .map(String::as_str)
        .unwrap_or_default();
    let container_id = pod
        .container_ids
        .get(container)
        .map(String::as_str)
        .unwrap_or_default();
    let (comm, pid) = match &event.process {
        Some(p) => (p.comm.as_str(), i64::from(p.pid)),
        None => ("", 0),
    };
    let mut fields = vec![
        ("kind", s(event.kind().as_str())),
        ("time", timestamp(event.time)),
        ("comm", s(comm)),
        ("pid", Value::Int(pid)),
        (
            "count",
            Value::Int(i64::try_from(event.count).unwrap_or(i64::MAX)),
        ),
        ("kernelDenied", Value::Bool(event.kernel_denied())),
        ("wouldDeny", Value::Bool(would_deny)),
        (
            "pod",
            map(vec![
                ("namespace", s(&pod.namespace)),
                ("name", s(&pod.name)),
                ("uid", s(&pod.uid)),
                ("container", s(container)),
                ("containerID", s(container_id)),
                (
                    "ownerKind",
                    s(pod.owner_kind.as_deref().unwrap_or_default()),
                ),
                (
                    "ownerName",
                    s(pod.owner_name.as_deref().unwrap_or_default()),
                ),
                ("nodeName", s(&pod.node_name)),
                ("serviceAccount", s(&pod.service_account)),
                (
                    "labels",
                    Value::Map(Map {
                        map: Arc::new(labels),
                    }),
                ),
            ]),
        ),
    ];
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
            // The filter API has one name: the first known, "" for none.
            let domain = names.first().map(String::as_str).unwrap_or_default();
            let mut net = vec![("destIP", s(&dest.to_string())), ("domain", s(domain))];
            if let Some(p) = port {
                net.push(("destPort", Value::Int(i64::from(*p))));
            }
            ("net", map(net))
        }
        Facts::Dns { qname } => ("dns", map(vec![("qname", s(qname))])),
        Facts::Protocol { protocol, alpn } => (
            "protocol",
            map(vec![
                ("protocol", s(protocol)),
                ("alpn", s(alpn.as_deref().unwrap_or_default())),
            ]),
        ),
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
