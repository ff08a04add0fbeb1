//! Kubernetes Events: the third output path, behind `--events-enabled`.
//!
//! A [`Recorder`] has two entry points, both on [`RecorderHandle`] (and on
//! the recorder itself):
//!
//! - [`finding_flushed`](RecorderHandle::finding_flushed) is the reporter's
//!   flush sink ([`ReporterOptions::on_flush`], see
//!   [`RecorderHandle::flush_sink`]), called once per deduplicated finding
//!   on every flush. It emits `PolicyViolation` for an enforced finding and
//!   `PolicyWouldViolate` for a monitor-mode one, regarding the pod.
//! - [`condition_changed`](RecorderHandle::condition_changed) is the status
//!   flush's condition callback (`FlushLoop::on_condition_changed`, see
//!   [`RecorderHandle::condition_callback`]). It emits `PolicyError` when
//!   `Applied` or `TargetsValid` goes `False`, regarding the RuntimePolicy,
//!   in `default` (where the Events of cluster-scoped objects live).
//!
//! Every Event is an `events.k8s.io/v1` Warning written directly through
//! the API. There is one Event per (object, reason) ([`name`] explains
//! how): per container of a pod, policy and reason for a finding, per
//! policy and condition type for a policy error. A create that meets
//! AlreadyExists is that object and reason again, so the stored Event's
//! series (count, lastObservedTime) is patched in place, as client-go's
//! recorder does. The note is not part of the name: it is immutable in
//! `events.k8s.io/v1`, so the Event keeps the note of its first occurrence,
//! and a new target or a changed message adds to the count instead of
//! creating an object (issue 38). The pod's Report lists every target.
//!
//! A policy error's Event is in `default`, where people who may read no
//! other namespace can read it: it quotes a condition's message only when
//! the message is the policy's spec alone (a compile error), never what
//! nodes saw in other namespaces (pods, Services).
//!
//! Only redacted values reach an Event: a finding's
//! [redaction](kyverno_runtime_report::Finding::redact), a condition's
//! reason and message through
//! [`sanitize`](kyverno_runtime_report::sanitize). The redaction
//! chokepoint is the report crate's; this crate adds no way around it.
//!
//! Writing never blocks a caller: causes wait in a bounded queue, which
//! [`Recorder::run`] writes with bounded retries. Each pod and each policy
//! has an Event [`Budget`] (a token bucket, over a bounded number of
//! tracked keys), so that one noisy pod or policy cannot flood the API
//! server. Nothing is lost silently: a cause over a budget, or meeting a
//! full queue, is dropped and counted by reason
//! (`events_dropped_total{source="events"}`, [`DropHook`]), and every
//! write's outcome is counted, each failure (a 403 from RBAC included) by
//! reason (`event_writes_total`, `event_writes_failed_total`,
//! [`WriteHook`]).
//!
//! [`ReporterOptions::on_flush`]: kyverno_runtime_report::ReporterOptions::on_flush

mod budget;
mod event;
pub mod name;
mod outcome;
mod recorder;

pub use budget::Budget;
pub use event::{
    ACTION_APPLY, ACTION_ENFORCE, ACTION_OBSERVE, ACTION_VALIDATE_TARGETS,
    CLUSTER_SCOPED_NAMESPACE, MAX_NOTE_BYTES, REASON_ERROR, REASON_VIOLATION, REASON_WOULD_VIOLATE,
    TYPE_WARNING,
};
pub use name::is_valid_event_name;
pub use outcome::{DropReason, WriteFailure, WriteResult};
pub use recorder::{
    DropHook, Recorder, RecorderHandle, RecorderOptions, WriteHook, REPORTING_CONTROLLER,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kyverno_runtime_report::Finding;
use kyverno_runtime_status::PolicyRef;

/// The name of the Event a flushed finding is recorded as (in its pod's
/// namespace), or `None` for a finding naming no addressable pod, which
/// gets no Event.
pub fn finding_event_name(finding: &Finding) -> Option<String> {
    let redacted = finding.clone().redact();
    if !redacted.pod.is_addressable() {
        return None;
    }
    let reporting = event::Reporting {
        controller: String::new(),
        instance: String::new(),
    };
    let emission = event::for_finding(&redacted, 1, &reporting);
    Some(emission.name().to_string())
}

/// The name of the Event a condition change is recorded as (in
/// [`CLUSTER_SCOPED_NAMESPACE`]), or `None` when the change is not a policy
/// error.
pub fn condition_event_name(policy: &PolicyRef, condition: &Condition) -> Option<String> {
    let reporting = event::Reporting {
        controller: String::new(),
        instance: String::new(),
    };
    event::for_condition(policy, condition, &reporting).map(|e| e.name().to_string())
}
