//! What an Event says: built from a finding's redaction or from a
//! sanitized condition, and nothing else.

use crate::name::{self, Key};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_report::{sanitize, Behavior, Decision, Finding};
use kyverno_runtime_status::types as condition;
use kyverno_runtime_status::PolicyRef;
use std::time::SystemTime;

/// The reason of a finding's Event when the kernel refused the operation
/// (an enforce-mode policy).
pub const REASON_VIOLATION: &str = "PolicyViolation";
/// The reason of a finding's Event when a monitor-mode policy says the
/// operation, which was allowed, would have been denied.
pub const REASON_WOULD_VIOLATE: &str = "PolicyWouldViolate";
/// The reason of a policy error's Event (`Applied` or `TargetsValid` went
/// `False`).
pub const REASON_ERROR: &str = "PolicyError";

/// The action of an enforced finding's Event.
pub const ACTION_ENFORCE: &str = "Enforce";
/// The action of a monitor-mode finding's Event.
pub const ACTION_OBSERVE: &str = "Observe";
/// The action of an `Applied=False` Event.
pub const ACTION_APPLY: &str = "Apply";
/// The action of a `TargetsValid=False` Event.
pub const ACTION_VALIDATE_TARGETS: &str = "ValidateTargets";

/// The type of every Event this crate writes.
pub const TYPE_WARNING: &str = "Warning";

/// Where the Events about a cluster-scoped object (a RuntimePolicy) go:
/// the API server accepts such an Event only in `default` (or
/// `kube-system`), and `kubectl events` looks for it there.
pub const CLUSTER_SCOPED_NAMESPACE: &str = "default";

/// The longest note the API server accepts, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;

/// Who writes the Events.
#[derive(Debug, Clone)]
pub(crate) struct Reporting {
    pub controller: String,
    pub instance: String,
}

/// One Event to create, or to add to if its cause fired before.
#[derive(Debug, Clone)]
pub(crate) struct Emission {
    /// The Event as created (name and namespace set).
    pub event: Event,
    /// Occurrences it adds to an existing Event's series.
    pub occurrences: i32,
    /// The latest of them.
    pub observed: MicroTime,
}

impl Emission {
    pub(crate) fn name(&self) -> &str {
        self.event.metadata.name.as_deref().unwrap_or_default()
    }

    pub(crate) fn namespace(&self) -> &str {
        self.event.metadata.namespace.as_deref().unwrap_or_default()
    }
}

fn micro(t: SystemTime) -> MicroTime {
    MicroTime(Timestamp::try_from(t).unwrap_or_else(|_| Timestamp::now()))
}

fn clamp(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `note` cut to [`MAX_NOTE_BYTES`] on a character boundary, ending in `…`.
fn bound_note(note: String) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note;
    }
    let room = MAX_NOTE_BYTES - '…'.len_utf8();
    let mut end = room;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

/// The note of a finding's Event, from its redaction only.
fn finding_note(r: &Finding) -> String {
    let mut detail = Vec::new();
    if let Some(container) = &r.pod.container {
        detail.push(format!("container {container}"));
    }
    match r.decision {
        Some(Decision::Denied) => detail.push("an explicit deny entry matched".into()),
        Some(Decision::DefaultDenied) => detail.push("denied by default".into()),
        None => {}
    }
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", detail.join(", "))
    };
    let policy = &r.policy;
    let target = &r.target;
    if r.behavior == Behavior::Dns {
        return format!(
            "resolved unexpected DNS name {target}, not expected by RuntimePolicy {policy}{detail}"
        );
    }
    let what = match r.behavior {
        Behavior::Exec => format!("exec of {target}"),
        Behavior::Open => format!("open of {target}"),
        // The egress counters count packets, as the Report's countUnit says.
        Behavior::Network => format!("packets to {target}"),
        Behavior::Protocol => format!("use of protocol {target}"),
        Behavior::Dns => format!("DNS query for {target}"),
    };
    if r.enforced {
        format!("RuntimePolicy {policy} denied {what}{detail}")
    } else {
        format!("RuntimePolicy {policy} (monitor mode) would have denied {what}{detail}")
    }
}

/// The Event for a flushed finding: `redacted` is the finding's
/// [redaction](Finding::redact), `count` its merged occurrences (at
/// least 1). Its name is its pod's (and container's), its policy's and its
/// reason's: every finding of one policy on one container of one pod,
/// whatever its target, adds to one Event.
pub(crate) fn for_finding(redacted: &Finding, count: u64, reporting: &Reporting) -> Emission {
    let (reason, action) = if redacted.enforced {
        (REASON_VIOLATION, ACTION_ENFORCE)
    } else {
        (REASON_WOULD_VIOLATE, ACTION_OBSERVE)
    };
    let pod = &redacted.pod;
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        // The convention for an Event about one container of a pod.
        field_path: pod
            .container
            .as_ref()
            .map(|c| format!("spec.containers{{{c}}}")),
        ..ObjectReference::default()
    };
    let related = (!redacted.policy.is_empty()).then(|| {
        policy_reference(
            &redacted.policy,
            (!redacted.policy_uid.is_empty()).then_some(redacted.policy_uid.as_str()),
        )
    });
    let note = bound_note(finding_note(redacted));
    let identity = name::identity(&Key {
        reason,
        action,
        type_: TYPE_WARNING,
        regarding: &regarding,
        related: related.as_ref(),
    });
    let name = name::join(&pod.name, &identity, reason);
    let first = micro(redacted.first_observed);
    let last = micro(redacted.last_observed.max(redacted.first_observed));
    let occurrences = clamp(count.max(1));
    build(
        name,
        pod.namespace.clone(),
        reason,
        action,
        note,
        regarding,
        related,
        reporting,
        first,
        last,
        occurrences,
    )
}

/// The reason `Applied` carries when the policy has no mode (set by the
/// status crate's derivation, which has no constant for it).
const NO_MODE: &str = "NoMode";

/// Whether a condition's message says what the policy's spec alone says:
/// a compile error or a missing mode, known before any node looked at a
/// pod, a Service or fetched data.
fn message_is_spec_only(condition: &Condition) -> bool {
    condition.type_ == condition::APPLIED
        && [condition::COMPILE_FAILED, NO_MODE].contains(&condition.reason.as_str())
}

/// The note of a policy error. The Event lives in `default`, which people
/// who may read no other namespace can read, while the condition's
/// message can quote what nodes saw in every namespace (the gates'
/// messages name unresolved and protected pods, Services, nodes, and with
/// `--show-data-values` fetched data): only a spec-only message is quoted
/// (an allowlist, so a new reason stays out until it is known safe), and
/// otherwise the reader is pointed at the policy's status, which is where
/// the detail is and which only readers of RuntimePolicies can read.
fn condition_note(condition: &Condition) -> String {
    let type_ = &condition.type_;
    let reason = sanitize(&condition.reason);
    let reason = if reason.is_empty() {
        "no reason given".to_string()
    } else {
        reason
    };
    if message_is_spec_only(condition) && !condition.message.is_empty() {
        format!(
            "{type_} is False: {reason}: {}",
            sanitize(&condition.message)
        )
    } else {
        format!("{type_} is False: {reason} (the detail is in the RuntimePolicy's status)")
    }
}

/// The Event for a persisted condition change, when it is one this crate
/// reports: `Applied` or `TargetsValid` with status `False`. Its reason and
/// message (which can quote policy content, through compiler errors) pass
/// through [`sanitize`].
pub(crate) fn for_condition(
    policy: &PolicyRef,
    condition: &Condition,
    reporting: &Reporting,
) -> Option<Emission> {
    let action = match condition.type_.as_str() {
        condition::APPLIED => ACTION_APPLY,
        condition::TARGETS_VALID => ACTION_VALIDATE_TARGETS,
        _ => return None,
    };
    if condition.status != "False" {
        return None;
    }
    // The type is one of the two constants above, not user input.
    let note = bound_note(condition_note(condition));
    let regarding = policy_reference(&policy.name, policy.uid.as_deref());
    let identity = name::identity(&Key {
        reason: REASON_ERROR,
        action,
        type_: TYPE_WARNING,
        regarding: &regarding,
        related: None,
    });
    let name = name::join(&policy.name, &identity, REASON_ERROR);
    let now = MicroTime(Timestamp::now());
    Some(build(
        name,
        CLUSTER_SCOPED_NAMESPACE.into(),
        REASON_ERROR,
        action,
        note,
        regarding,
        None,
        reporting,
        now.clone(),
        now,
        1,
    ))
}

fn policy_reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(RuntimePolicy::api_version(&()).into_owned()),
        kind: Some(RuntimePolicy::kind(&()).into_owned()),
        name: Some(name.to_string()),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn build(
    name: String,
    namespace: String,
    reason: &str,
    action: &str,
    note: String,
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    reporting: &Reporting,
    first: MicroTime,
    last: MicroTime,
    occurrences: i32,
) -> Emission {
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        event_time: Some(first),
        reason: Some(reason.into()),
        action: Some(action.into()),
        type_: Some(TYPE_WARNING.into()),
        note: Some(note),
        regarding: Some(regarding),
        related,
        reporting_controller: Some(reporting.controller.clone()),
        reporting_instance: Some(reporting.instance.clone()),
        // A series needs at least two occurrences.
        series: (occurrences >= 2).then(|| EventSeries {
            count: occurrences,
            last_observed_time: last.clone(),
        }),
        ..Event::default()
    };
    Emission {
        event,
        occurrences,
        observed: last,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::name::is_valid_event_name;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kyverno_runtime_report::PodIdentity;
    use std::time::{Duration, UNIX_EPOCH};

    fn reporting() -> Reporting {
        Reporting {
            controller: "kyverno-runtime".into(),
            instance: "node-a".into(),
        }
    }

    fn finding() -> Finding {
        let f = kyverno_runtime_report::fixtures::finding();
        Finding {
            pod: PodIdentity {
                owner_kind: None,
                owner_name: None,
                ..f.pod
            },
            first_observed: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            last_observed: UNIX_EPOCH + Duration::from_secs(1_700_000_010),
            ..f
        }
    }

    fn emit(f: &Finding, count: u64) -> Emission {
        for_finding(&f.clone().redact(), count, &reporting())
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::now()),
            observed_generation: None,
        }
    }

    fn policy() -> PolicyRef {
        PolicyRef {
            name: "no-curl".into(),
            uid: Some("11111111-2222-3333-4444-555555555555".into()),
        }
    }

    #[test]
    fn an_enforced_finding() {
        let e = emit(&finding(), 1);
        let ev = &e.event;
        assert_eq!(ev.reason.as_deref(), Some(REASON_VIOLATION));
        assert_eq!(ev.action.as_deref(), Some(ACTION_ENFORCE));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(e.namespace(), "shop");
        let regarding = ev.regarding.as_ref().unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.name.as_deref(), Some("web-0"));
        assert_eq!(
            regarding.uid.as_deref(),
            Some("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        );
        assert_eq!(
            regarding.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        let related = ev.related.as_ref().unwrap();
        assert_eq!(related.kind.as_deref(), Some("RuntimePolicy"));
        assert_eq!(
            related.api_version.as_deref(),
            Some("runtime.nirmata.io/v1alpha1")
        );
        assert_eq!(
            ev.note.as_deref(),
            Some(
                "RuntimePolicy no-curl denied exec of /usr/bin/curl \
                 (container app, an explicit deny entry matched)"
            )
        );
        assert!(ev.series.is_none(), "one occurrence is no series");
        assert_eq!(ev.reporting_instance.as_deref(), Some("node-a"));
        let name = e.name();
        assert!(name.starts_with("web-0."), "{name}");
        assert!(name.ends_with(".policyviolation"), "{name}");
        assert!(is_valid_event_name(name), "{name}");
    }

    #[test]
    fn a_monitor_finding_and_a_dns_finding() {
        let mut f = finding();
        f.enforced = false;
        f.decision = None;
        f.pod.container = None;
        let e = emit(&f, 3);
        assert_eq!(e.event.reason.as_deref(), Some(REASON_WOULD_VIOLATE));
        assert_eq!(e.event.action.as_deref(), Some(ACTION_OBSERVE));
        assert_eq!(
            e.event.note.as_deref(),
            Some("RuntimePolicy no-curl (monitor mode) would have denied exec of /usr/bin/curl")
        );
        assert!(e.event.regarding.as_ref().unwrap().field_path.is_none());
        let series = e.event.series.as_ref().unwrap();
        assert_eq!(series.count, 3);
        assert_eq!(e.occurrences, 3);

        f.behavior = Behavior::Dns;
        f.target = "evil.example.com".into();
        let e = emit(&f, 1);
        assert_eq!(
            e.event.note.as_deref(),
            Some(
                "resolved unexpected DNS name evil.example.com, \
                 not expected by RuntimePolicy no-curl"
            )
        );
    }

    #[test]
    fn secrets_never_reach_a_note_or_a_name() {
        let mut f = finding();
        f.target = "/usr/bin/curl --password=hunter2 -H 'Authorization: Bearer abc.def.ghi'".into();
        let e = emit(&f, 1);
        let text = serde_json::to_string(&e.event).unwrap();
        for secret in ["hunter2", "abc.def.ghi", "abc.def", "def.ghi"] {
            assert!(!text.contains(secret), "{secret}: {text}");
        }
        let note = e.event.note.unwrap();
        assert!(note.contains("--password=***"), "{note}");
        assert!(note.contains("Bearer ***"), "{note}");
    }

    #[test]
    fn notes_are_bounded_in_bytes() {
        let mut f = finding();
        // Multi-byte characters: sanitize bounds characters, a note is
        // bounded in bytes.
        f.target = "日日日日 ".repeat(1000);
        f.policy = "日日日日 ".repeat(1000);
        f.pod.container = Some("日日日日 ".repeat(1000));
        let e = emit(&f, 1);
        let note = e.event.note.unwrap();
        assert!(note.len() <= MAX_NOTE_BYTES, "{}", note.len());
        assert!(note.ends_with('…'), "{note}");
        assert_eq!(bound_note("short".into()), "short");
        let exact = "x".repeat(MAX_NOTE_BYTES);
        assert_eq!(bound_note(exact.clone()), exact);
    }

    #[test]
    fn finding_names_are_deterministic() {
        let f = finding();
        let name = emit(&f, 1).name().to_string();
        // Not part of the cause: counts and times.
        let mut g = f.clone();
        g.count = 40;
        g.first_observed = UNIX_EPOCH;
        g.last_observed = UNIX_EPOCH + Duration::from_secs(5);
        assert_eq!(emit(&g, 40).name(), name);
        // The raw finding and its redaction name the same Event.
        assert_eq!(emit(&f.clone().redact(), 1).name(), name);
    }

    #[test]
    fn finding_names_are_valid_for_any_pod_name() {
        for pod in [
            "a".to_string(),
            "a".repeat(253),
            format!("{}.{}", "a".repeat(100), "b".repeat(100)),
            "web.v1-0".into(),
            format!("{}-{}", "x".repeat(62), "y"),
        ] {
            let mut f = finding();
            f.pod.name = pod;
            let e = emit(&f, 1);
            let name = e.name();
            assert!(name.len() <= 253, "{name}");
            assert!(is_valid_event_name(name), "{name}");
            assert!(name.split('.').count() >= 3, "{name}");
        }
    }

    #[test]
    fn only_applied_or_targets_valid_going_false_is_an_error() {
        let r = reporting();
        for (type_, status) in [
            ("Applied", "True"),
            ("Applied", "Unknown"),
            ("TargetsValid", "True"),
            ("PodsMatched", "False"),
            ("EnforcementAvailable", "False"),
            ("ExecRulesValid", "False"),
        ] {
            assert!(
                for_condition(&policy(), &condition(type_, status, "R", "m"), &r).is_none(),
                "{type_}={status}"
            );
        }
        let e = for_condition(
            &policy(),
            &condition("Applied", "False", "CompileFailed", "bad expression"),
            &r,
        )
        .unwrap();
        assert_eq!(e.event.reason.as_deref(), Some(REASON_ERROR));
        assert_eq!(e.event.action.as_deref(), Some(ACTION_APPLY));
        assert_eq!(e.namespace(), "default");
        assert_eq!(
            e.event.note.as_deref(),
            Some("Applied is False: CompileFailed: bad expression")
        );
        let regarding = e.event.regarding.as_ref().unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("RuntimePolicy"));
        assert_eq!(regarding.namespace, None);
        assert_eq!(
            regarding.uid.as_deref(),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert!(e.event.related.is_none());
        assert!(is_valid_event_name(e.name()), "{}", e.name());
        assert!(e.name().starts_with("no-curl."), "{}", e.name());

        let t = for_condition(
            &policy(),
            &condition("TargetsValid", "False", "RejectedTarget", "::1: IPv6"),
            &r,
        )
        .unwrap();
        assert_eq!(t.event.action.as_deref(), Some(ACTION_VALIDATE_TARGETS));
        assert_ne!(t.name(), e.name());
    }

    #[test]
    fn policy_error_names_follow_uid_and_type() {
        let r = reporting();
        let name =
            |p: &PolicyRef, c: &Condition| for_condition(p, c, &r).unwrap().name().to_string();
        let c = condition("Applied", "False", "CompileFailed", "bad");
        let n = name(&policy(), &c);
        assert_eq!(name(&policy(), &c), n, "deterministic");
        let mut later = c.clone();
        later.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        assert_eq!(name(&policy(), &later), n, "the time is not the cause");
        let mut other = policy();
        other.uid = Some("99999999-2222-3333-4444-555555555555".into());
        assert_ne!(name(&other, &c), n, "a recreated policy is another object");
        let changed = condition("Applied", "False", "CompileFailed", "worse");
        assert_eq!(
            name(&policy(), &changed),
            n,
            "a changed message adds to the same Event"
        );
        let no_uid = PolicyRef {
            name: "no-curl".into(),
            uid: None,
        };
        assert!(is_valid_event_name(&name(&no_uid, &c)));
    }

    /// Issue 38 (11): one Event per (object, reason). What the note says
    /// (the target, the behavior, the decision) is not part of the name, so
    /// a pod that violates a policy on a new target every flush adds to one
    /// Event's series instead of creating an object each time.
    #[test]
    fn one_event_per_object_and_reason_whatever_the_note() {
        let f = finding();
        let name = emit(&f, 1).name().to_string();
        for change in [
            |f: &mut Finding| f.target = "/usr/bin/wget".into(),
            |f: &mut Finding| f.target = "/tmp/random-0123".into(),
            |f: &mut Finding| f.behavior = Behavior::Open,
            |f: &mut Finding| f.decision = Some(Decision::DefaultDenied),
        ] {
            let mut g = f.clone();
            change(&mut g);
            let e = emit(&g, 1);
            assert_ne!(e.event.note, emit(&f, 1).event.note, "another note");
            assert_eq!(e.name(), name, "the same object and reason");
        }
        // Another object (pod, container, related policy) or reason: its own.
        let mut names = std::collections::BTreeSet::from([name.clone()]);
        for change in [
            |f: &mut Finding| f.policy = "other".into(),
            |f: &mut Finding| f.pod.uid = "ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            |f: &mut Finding| f.enforced = false,
            |f: &mut Finding| f.pod.container = Some("sidecar".into()),
        ] {
            let mut g = f.clone();
            change(&mut g);
            let other = emit(&g, 1);
            assert!(is_valid_event_name(other.name()), "{}", other.name());
            assert!(names.insert(other.name().to_string()), "{}", other.name());
        }
        // A policy error whose message changed: the same Event.
        let r = reporting();
        let first = condition("Applied", "False", "CompileFailed", "bad");
        let later = condition("Applied", "False", "CompileFailed", "worse");
        let a = for_condition(&policy(), &first, &r).unwrap();
        let b = for_condition(&policy(), &later, &r).unwrap();
        assert_ne!(a.event.note, b.event.note);
        assert_eq!(a.name(), b.name());
    }

    /// Issue 38 (11): a RuntimePolicy's Event lives in `default`, which
    /// readers of no other namespace may read: it must not carry what
    /// a node saw in other namespaces (the gates' messages name pods and
    /// Services), only what the policy's spec alone says.
    #[test]
    fn a_default_namespace_note_names_no_pod_of_another_namespace() {
        let r = reporting();
        for (type_, reason, message) in [
            (
                "Applied",
                "EnforcementAvailable",
                "unavailable on node-a (1 matching pod(s) with containers whose cgroup \
                 was not found (first: shop/web-0 app: no cgroup))",
            ),
            (
                "Applied",
                "ObservationAvailable",
                "unavailable on node-a (2 selected pod(s) in protected namespaces are not \
                 enforced (first: kube-system/coredns-7d9; protected: kube-system))",
            ),
            (
                "Applied",
                "EnforcementAvailable",
                "unavailable on node-a (network: Services without addresses yet: shop/web-0)",
            ),
            (
                "TargetsValid",
                "ValuesRejected",
                "1 value(s) not programmed: shop/web-0 (10.1.2.3)",
            ),
        ] {
            let c = condition(type_, "False", reason, message);
            let e = for_condition(&policy(), &c, &r).unwrap();
            assert_eq!(e.namespace(), CLUSTER_SCOPED_NAMESPACE);
            let text = serde_json::to_string(&e.event).unwrap();
            for leak in ["web-0", "coredns-7d9", "shop/", "kube-system/"] {
                assert!(!text.contains(leak), "{leak}: {text}");
            }
            let note = e.event.note.unwrap();
            assert!(
                note.starts_with(&format!("{type_} is False: {reason}")),
                "{note}"
            );
        }
        // What the spec alone says (a compile error) is still quoted.
        let c = condition("Applied", "False", "CompileFailed", "undeclared reference");
        let note = for_condition(&policy(), &c, &r)
            .unwrap()
            .event
            .note
            .unwrap();
        assert_eq!(
            note,
            "Applied is False: CompileFailed: undeclared reference"
        );
    }

    #[test]
    fn condition_text_is_sanitized() {
        let c = condition(
            "Applied",
            "False",
            "CompileFailed",
            "expression token=abc123 failed\nforged line",
        );
        let e = for_condition(&policy(), &c, &reporting()).unwrap();
        let note = e.event.note.unwrap();
        assert!(!note.contains("abc123"), "{note}");
        assert!(!note.contains('\n'), "{note}");
        assert!(note.starts_with("Applied is False: CompileFailed: expression token=***"));
    }
}
