//! A finding as an OpenReports result, and back.
//!
//! [`report_result`] is the one place a [`Finding`] becomes a
//! [`ReportResult`]. It starts from the finding's [redaction](Finding::redact)
//! and emits a fixed, closed set of property keys ([`property::ALL`]); every
//! text value passes through [`sanitize`] on the way in. The values that are
//! not text (a count, a boolean, a timestamp we format, the fingerprint we
//! compute) are formatted from typed fields and cannot carry user input; the
//! fingerprint is 64 hex digits, which `sanitize` would mask as key
//! material, so it is the one value that does not pass through it.

use crate::finding::{Behavior, Finding, Fingerprint, PodIdentity};
use crate::owners::NamedOwner;
use crate::sanitize::sanitize;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff;
use kyverno_runtime_api::openreports::{PolicyResult, ReportResult, Timestamp};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The `source` of every result and Report this crate writes.
pub const SOURCE: &str = "kyverno-runtime";

/// The property keys of a result: a closed set.
///
/// Adding one is a deliberate change to what leaves the daemon: widen
/// [`ALL`](property::ALL) and the chokepoint tests with it.
pub mod property {
    /// The behavior (`network`, `exec`, `open`, `protocol`, `dns`).
    pub const BEHAVIOR: &str = "behavior";
    /// What the kernel saw (sanitized).
    pub const TARGET: &str = "target";
    /// `"true"`: the kernel refused; `"false"`: monitor mode would deny.
    pub const ENFORCED: &str = "enforced";
    /// Occurrences, summed over every flush; [`COUNT_UNIT`] says what one
    /// occurrence is.
    pub const COUNT: &str = "count";
    /// What `count` counts: `packets` (network), `flows` (protocol),
    /// `queries` (dns), `execs`, `opens`.
    pub const COUNT_UNIT: &str = "countUnit";
    /// The earliest occurrence, RFC 3339 in whole seconds (UTC).
    pub const FIRST_TIMESTAMP: &str = "firstTimestamp";
    /// The latest occurrence, RFC 3339 in whole seconds (UTC).
    pub const LAST_TIMESTAMP: &str = "lastTimestamp";
    /// The container, when known.
    pub const CONTAINER: &str = "container";
    /// The RuntimePolicy's uid.
    pub const POLICY_UID: &str = "policyUID";
    /// The finding's fingerprint: what merging across flushes keys on.
    pub const FINGERPRINT: &str = "fingerprint";
    /// Which list matched (`denied`, `default-denied`), when known.
    pub const DECISION: &str = "decision";
    /// A DNS finding's queried name (the same as `target`; the name the
    /// original writer gave it).
    pub const DNS_NAME: &str = "dnsName";
    /// A network finding's Service and domain values the destination is
    /// known under (comma-separated): why an address the policy does not
    /// spell out matched it.
    pub const MATCHED: &str = "matched";
    /// The pod owner's kind, when it has one: its controller, or, for a
    /// ReplicaSet a Deployment controls, `Deployment`. With
    /// [`OWNER_VERIFIED`] `"true"` it is the owner the API verified;
    /// otherwise it is what the pod's ownerReferences claim (which whoever
    /// creates the pod controls), a ReplicaSet named with the pod's
    /// pod-template-hash read as its Deployment.
    pub const OWNER_KIND: &str = "ownerKind";
    /// The pod owner's name, when it has one; verified or claimed, as
    /// `ownerKind`.
    pub const OWNER_NAME: &str = "ownerName";
    /// The pid of the latest occurrence's process, when the kernel named it.
    pub const PID: &str = "pid";
    /// Its `comm`.
    pub const COMM: &str = "comm";
    /// A traced exec's arguments, each sanitized, joined by spaces.
    pub const ARGV: &str = "argv";

    /// On a pod's result, when the pod names an owner: `"true"` when its
    /// controller chain was verified through the API (the finding stayed
    /// on the pod because the policy does not roll up to that kind), and
    /// `ownerKind`/`ownerName` then name the verified owner; `"false"` when
    /// it was not (the owner does not exist with that uid, does not select
    /// the pod, or is of a kind that is not resolved).
    pub const OWNER_VERIFIED: &str = "ownerVerified";
    /// On a controller's result: how many distinct pods it was seen on
    /// (the result's `resources` list the most recent of them).
    pub const POD_COUNT: &str = "podCount";

    /// Every key a result may carry.
    pub const ALL: [&str; 20] = [
        BEHAVIOR,
        TARGET,
        ENFORCED,
        COUNT,
        COUNT_UNIT,
        FIRST_TIMESTAMP,
        LAST_TIMESTAMP,
        CONTAINER,
        POLICY_UID,
        FINGERPRINT,
        DECISION,
        DNS_NAME,
        MATCHED,
        OWNER_KIND,
        OWNER_NAME,
        PID,
        COMM,
        ARGV,
        OWNER_VERIFIED,
        POD_COUNT,
    ];
}

/// How many pods a controller's result lists in `resources`, the most
/// recently seen first; `podCount` has the exact number.
pub const MAX_PODS_LISTED: usize = 10;

/// How a finding is graded: `warn` for a DNS name outside the expected set
/// (an advisory finding: there is no enforcing form of it), `fail` for
/// everything else, refused and would-deny alike; the `enforced` property
/// tells those two apart.
pub fn outcome(behavior: Behavior) -> PolicyResult {
    match behavior {
        Behavior::Dns => PolicyResult::Warn,
        _ => PolicyResult::Fail,
    }
}

/// The Report result for a finding: source `kyverno-runtime`, the policy,
/// the behavior as rule, [`outcome`], scored, a sanitized message, the last
/// occurrence as timestamp, the pod as the one resource, and the closed
/// [`property`] set.
///
/// It starts from the finding's [redaction](Finding::redact), so a raw
/// finding cannot bypass the chokepoint, and every text property passes
/// through [`sanitize`] again. The fingerprint is the one value that does
/// not: it is our own digest, 64 hex digits that `sanitize` would mask as
/// key material.
pub fn report_result(finding: &Finding) -> ReportResult {
    pod_result(finding, None)
}

/// What the API said about the owner a pod names, for its own Report's
/// results ([`property::OWNER_VERIFIED`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OwnerMark {
    /// The chain verified: the results name this owner.
    Verified(NamedOwner),
    /// It did not: the results keep what the finding claims.
    Unverified,
}

/// [`report_result`], with the pod's owner verification when it names an
/// owner ([`property::OWNER_VERIFIED`]).
pub(crate) fn pod_result(finding: &Finding, mark: Option<&OwnerMark>) -> ReportResult {
    let redacted = finding.clone().redact();
    let fingerprint = redacted.fingerprint_of_redacted();
    // Exhaustive: a field added to Finding must be decided here too.
    let Finding {
        policy,
        policy_uid,
        behavior,
        pod,
        target,
        enforced,
        decision,
        count,
        first_observed,
        last_observed,
        process,
        matched,
    } = redacted;
    let pod_ref = pod_reference(&pod);
    let PodIdentity {
        namespace: _,
        name: _,
        uid: _,
        container,
        owner_kind,
        owner_name,
    } = pod;

    let mut properties = BTreeMap::new();
    let mut text = |key: &'static str, value: &str| {
        properties.insert(key.to_string(), sanitize(value));
    };
    text(property::BEHAVIOR, behavior.as_str());
    text(property::TARGET, &target);
    text(property::ENFORCED, if enforced { "true" } else { "false" });
    text(property::COUNT, &count.to_string());
    text(property::COUNT_UNIT, behavior.count_unit());
    text(property::FIRST_TIMESTAMP, &rfc3339(first_observed));
    text(property::LAST_TIMESTAMP, &rfc3339(last_observed));
    text(property::POLICY_UID, &policy_uid);
    if let Some(container) = &container {
        text(property::CONTAINER, container);
    }
    if let Some(decision) = decision {
        text(property::DECISION, decision.as_str());
    }
    if behavior == Behavior::Dns {
        text(property::DNS_NAME, &target);
    }
    if !matched.is_empty() {
        text(property::MATCHED, &matched.join(","));
    }
    let (owner_kind, owner_name) = match mark {
        Some(OwnerMark::Verified(owner)) => (Some(owner.kind.clone()), Some(owner.name.clone())),
        _ => (owner_kind, owner_name),
    };
    if let Some(kind) = &owner_kind {
        text(property::OWNER_KIND, kind);
    }
    if let Some(name) = &owner_name {
        text(property::OWNER_NAME, name);
    }
    if let Some(crate::finding::Process { pid, comm, argv }) = &process {
        text(property::PID, &pid.to_string());
        text(property::COMM, comm);
        if !argv.is_empty() {
            text(property::ARGV, &argv.join(" "));
        }
    }
    if let Some(mark) = mark {
        let verified = matches!(mark, OwnerMark::Verified(_));
        text(
            property::OWNER_VERIFIED,
            if verified { "true" } else { "false" },
        );
    }
    // Our own digest: hex, no user input, and masked by `sanitize` as if
    // it were a key.
    properties.insert(property::FINGERPRINT.to_string(), fingerprint.to_string());

    ReportResult {
        source: Some(SOURCE.to_string()),
        policy: policy.clone(),
        rule: Some(behavior.as_str().to_string()),
        timestamp: Some(whole_seconds(last_observed)),
        result: Some(outcome(behavior)),
        scored: Some(true),
        resources: Some(vec![pod_ref]),
        message: Some(sanitize(&message(behavior, enforced, &target, &policy))),
        properties: Some(properties),
        ..ReportResult::default()
    }
}

/// A controller's result for the findings of its pods: what
/// [`report_result`] writes for one pod (from `finding`: the newest
/// details, the summed `count` and the widened window), except that it is
/// keyed by the controller's `fingerprint`, lists the pods it was seen on
/// in `resources` (at most [`MAX_PODS_LISTED`], as given), and counts them
/// all in [`property::POD_COUNT`]. The pod's owner properties are left
/// out: the Report's scope is the owner, verified.
///
/// The same chokepoint as [`report_result`]: it starts from the finding's
/// redaction and every text value passes through [`sanitize`]; the pods
/// come from redacted findings.
pub(crate) fn controller_result(
    finding: &Finding,
    fingerprint: Fingerprint,
    pods: &[ObjectReference],
    pod_count: u64,
) -> ReportResult {
    let mut result = pod_result(finding, None);
    if let Some(properties) = result.properties.as_mut() {
        properties.remove(property::OWNER_KIND);
        properties.remove(property::OWNER_NAME);
        properties.insert(property::POD_COUNT.to_string(), pod_count.to_string());
        properties.insert(property::FINGERPRINT.to_string(), fingerprint.to_string());
    }
    result.resources = Some(
        pods.iter()
            .take(MAX_PODS_LISTED)
            .map(|p| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: p.namespace.as_deref().map(sanitize),
                name: p.name.as_deref().map(sanitize),
                uid: p.uid.as_deref().map(sanitize),
                ..ObjectReference::default()
            })
            .collect(),
    );
    result
}

/// The pods a stored controller result lists, and how many it counts
/// (the listed ones when `podCount` is absent or does not parse).
pub(crate) fn stored_pods(result: &ReportResult) -> (Vec<ObjectReference>, u64) {
    let pods: Vec<ObjectReference> = result
        .resources
        .iter()
        .flatten()
        .filter(|r| r.kind.as_deref() == Some("Pod") && r.uid.is_some())
        .cloned()
        .collect();
    let count = result
        .properties
        .as_ref()
        .and_then(|p| p.get(property::POD_COUNT))
        .and_then(|c| c.parse().ok())
        .unwrap_or(pods.len() as u64);
    let listed = pods.len() as u64;
    (pods, count.max(listed))
}

/// The human-readable line of a result. A network count is of packets
/// (the egress counters count packets, not connections), so the line
/// speaks of packets.
fn message(behavior: Behavior, enforced: bool, target: &str, policy: &str) -> String {
    let (what, were) = match behavior {
        Behavior::Network => (format!("packets to {target}"), "were"),
        Behavior::Exec => (format!("exec of {target}"), "was"),
        Behavior::Open => (format!("open of {target}"), "was"),
        Behavior::Protocol => (format!("use of protocol {target}"), "was"),
        Behavior::Dns => {
            return format!(
                "resolved unexpected DNS name {target}, not expected by policy {policy}"
            )
        }
    };
    if enforced {
        format!("{what} {were} denied by the kernel (policy {policy})")
    } else {
        format!("{what} would have been denied by policy {policy} (monitor mode)")
    }
}

/// The reference to a pod, as a Report's `scope` and a result's `resources`.
pub fn pod_reference(pod: &PodIdentity) -> ObjectReference {
    object_reference(&pod.namespace, &pod.name, &pod.uid)
}

pub(crate) fn object_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    typed_reference("v1", "Pod", namespace, name, uid)
}

/// A reference to an object of any kind.
pub(crate) fn typed_reference(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

/// What merging needs from a stored result this crate wrote.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredStats {
    pub fingerprint: Fingerprint,
    pub count: u64,
    pub first: Option<SystemTime>,
    pub last: Option<SystemTime>,
}

/// Reads back the merge keys of a stored result; `None` for a result
/// without a fingerprint (not ours). A count or time that does not parse
/// reads as absent: the next write replaces it with this flush's.
pub(crate) fn stored_stats(result: &ReportResult) -> Option<StoredStats> {
    let props = result.properties.as_ref()?;
    let fingerprint = Fingerprint::from_hex(props.get(property::FINGERPRINT)?)?;
    let time = |key| props.get(key).and_then(|s| parse_rfc3339(s));
    Some(StoredStats {
        fingerprint,
        count: props
            .get(property::COUNT)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        first: time(property::FIRST_TIMESTAMP),
        last: time(property::LAST_TIMESTAMP),
    })
}

/// When a stored result last happened, for keeping the most recent:
/// `lastTimestamp`, else the result's `timestamp`, else the epoch.
pub(crate) fn last_seen(result: &ReportResult) -> SystemTime {
    result
        .properties
        .as_ref()
        .and_then(|p| p.get(property::LAST_TIMESTAMP))
        .and_then(|s| parse_rfc3339(s))
        .or_else(|| result.timestamp.map(system_time))
        .unwrap_or(UNIX_EPOCH)
}

/// Seconds since the epoch, rounded down (also before it).
fn epoch_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() > 0 {
                whole.saturating_neg().saturating_sub(1)
            } else {
                whole.saturating_neg()
            }
        }
    }
}

/// RFC 3339 in whole seconds, UTC (`2026-01-02T03:04:05Z`), as Kubernetes
/// writes times. A time outside jiff's range (years -9999 to 9999) clamps
/// to its edge.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = epoch_seconds(t).clamp(
        jiff::Timestamp::MIN.as_second(),
        jiff::Timestamp::MAX.as_second(),
    );
    jiff::Timestamp::from_second(secs)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Parses an RFC 3339 time, to the whole second.
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let ts: jiff::Timestamp = s.parse().ok()?;
    Some(from_epoch_seconds(ts.as_second()))
}

fn from_epoch_seconds(secs: i64) -> SystemTime {
    let d = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// A result timestamp in whole seconds, like the properties beside it.
pub(crate) fn whole_seconds(t: SystemTime) -> Timestamp {
    Timestamp {
        seconds: epoch_seconds(t),
        nanos: 0,
    }
}

/// The time of a result timestamp.
fn system_time(t: Timestamp) -> SystemTime {
    let base = from_epoch_seconds(t.seconds);
    match u32::try_from(t.nanos) {
        Ok(n) if n < 1_000_000_000 => base + Duration::from_nanos(u64::from(n)),
        _ => base,
    }
}

/// Rounds down to the whole second, as stored.
#[cfg(test)]
pub(crate) fn floor_second(t: SystemTime) -> SystemTime {
    from_epoch_seconds(epoch_seconds(t))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::finding::Decision;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn finding(behavior: Behavior, enforced: bool) -> Finding {
        Finding {
            policy: "no-curl".into(),
            policy_uid: "11111111-2222-3333-4444-555555555555".into(),
            behavior,
            pod: PodIdentity {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
                container: Some("app".into()),
                owner_kind: None,
                owner_name: None,
            },
            target: "/usr/bin/curl".into(),
            enforced,
            decision: Some(Decision::Denied),
            count: 3,
            first_observed: at(1_700_000_000),
            last_observed: at(1_700_000_060) + Duration::from_millis(999),
            process: None,
            matched: Vec::new(),
        }
    }

    #[test]
    fn an_enforced_exec_result() {
        let f = finding(Behavior::Exec, true);
        let r = report_result(&f);
        assert_eq!(r.source.as_deref(), Some(SOURCE));
        assert_eq!(r.policy, "no-curl");
        assert_eq!(r.rule.as_deref(), Some("exec"));
        assert_eq!(r.result, Some(PolicyResult::Fail));
        assert_eq!(r.scored, Some(true));
        assert_eq!(
            r.message.as_deref(),
            Some("exec of /usr/bin/curl was denied by the kernel (policy no-curl)")
        );
        assert_eq!(
            r.timestamp,
            Some(Timestamp {
                seconds: 1_700_000_060,
                nanos: 0
            })
        );
        let pod = &r.resources.as_ref().unwrap()[0];
        assert_eq!(pod.kind.as_deref(), Some("Pod"));
        assert_eq!(pod.api_version.as_deref(), Some("v1"));
        assert_eq!(pod.name.as_deref(), Some("web-0"));
        assert_eq!(pod.namespace.as_deref(), Some("shop"));
        let p = r.properties.unwrap();
        let get = |k: &str| p.get(k).map(String::as_str);
        assert_eq!(get(property::BEHAVIOR), Some("exec"));
        assert_eq!(get(property::TARGET), Some("/usr/bin/curl"));
        assert_eq!(get(property::ENFORCED), Some("true"));
        assert_eq!(get(property::COUNT), Some("3"));
        assert_eq!(get(property::FIRST_TIMESTAMP), Some("2023-11-14T22:13:20Z"));
        assert_eq!(get(property::LAST_TIMESTAMP), Some("2023-11-14T22:14:20Z"));
        assert_eq!(get(property::CONTAINER), Some("app"));
        assert_eq!(get(property::DECISION), Some("denied"));
        assert_eq!(
            get(property::POLICY_UID),
            Some("11111111-2222-3333-4444-555555555555")
        );
        assert_eq!(
            get(property::FINGERPRINT),
            Some(f.fingerprint().to_string().as_str())
        );
        assert_eq!(get(property::DNS_NAME), None);
    }

    #[test]
    fn the_process_of_the_latest_occurrence_is_a_property() {
        let mut f = finding(Behavior::Exec, false);
        let props = report_result(&f).properties.unwrap();
        assert!(!props.contains_key(property::PID) && !props.contains_key(property::ARGV));
        f.process = Some(crate::Process {
            pid: 4242,
            comm: "curl".into(),
            argv: vec!["curl".into(), "-u".into(), "admin:hunter2".into()],
        });
        let props = report_result(&f).properties.unwrap();
        assert_eq!(props[property::PID], "4242");
        assert_eq!(props[property::COMM], "curl");
        assert!(props[property::ARGV].starts_with("curl -u "), "{props:?}");
        assert!(!props[property::ARGV].contains("hunter2"), "{props:?}");
        f.process = Some(crate::Process {
            pid: 1,
            comm: "cat".into(),
            argv: Vec::new(),
        });
        let props = report_result(&f).properties.unwrap();
        assert_eq!(props[property::COMM], "cat");
        assert!(!props.contains_key(property::ARGV), "a refusal has no argv");
    }

    #[test]
    fn a_network_result_names_the_values_its_destination_matched_as() {
        let mut f = finding(Behavior::Network, true);
        f.target = "10.96.0.20".into();
        let props = report_result(&f).properties.unwrap_or_default();
        assert!(!props.contains_key(property::MATCHED), "none: no property");
        f.matched = vec!["db.prod.svc".into(), "db.example".into()];
        let props = report_result(&f).properties.unwrap_or_default();
        assert_eq!(props[property::MATCHED], "db.prod.svc,db.example");
    }

    /// Issue 38, point 9: a result says what its count counts, and a
    /// network result (a count of packets) does not call them connections.
    #[test]
    fn a_result_says_what_its_count_counts() {
        let unit = |b: Behavior| {
            let r = report_result(&finding(b, true));
            (
                r.properties.unwrap().get(property::COUNT_UNIT).cloned(),
                r.message.unwrap(),
            )
        };
        let (net_unit, net_message) = unit(Behavior::Network);
        assert_eq!(net_unit.as_deref(), Some("packets"));
        assert!(!net_message.contains("connection"), "{net_message}");
        assert_eq!(unit(Behavior::Exec).0.as_deref(), Some("execs"));
        assert_eq!(unit(Behavior::Open).0.as_deref(), Some("opens"));
        assert_eq!(unit(Behavior::Protocol).0.as_deref(), Some("flows"));
        assert_eq!(unit(Behavior::Dns).0.as_deref(), Some("queries"));
    }

    #[test]
    fn would_deny_is_a_fail_and_dns_a_warn() {
        let r = report_result(&finding(Behavior::Open, false));
        assert_eq!(r.result, Some(PolicyResult::Fail));
        assert_eq!(
            r.message.as_deref(),
            Some("open of /usr/bin/curl would have been denied by policy no-curl (monitor mode)")
        );
        assert_eq!(r.properties.unwrap()[property::ENFORCED], "false");

        let mut dns = finding(Behavior::Dns, false);
        dns.target = "evil.example.com".into();
        let r = report_result(&dns);
        assert_eq!(r.result, Some(PolicyResult::Warn));
        assert_eq!(
            r.message.as_deref(),
            Some("resolved unexpected DNS name evil.example.com, not expected by policy no-curl")
        );
        assert_eq!(
            r.properties.unwrap()[property::DNS_NAME],
            "evil.example.com"
        );
    }

    #[test]
    fn a_verified_owner_is_named_as_the_api_has_it_and_a_claim_as_claimed() {
        let mut f = finding(Behavior::Exec, true);
        f.pod.owner_kind = Some("ReplicaSet".into());
        f.pod.owner_name = Some("web-5d9".into());
        let owner = |mark: Option<&OwnerMark>| {
            let props = pod_result(&f, mark).properties.unwrap();
            (
                props[property::OWNER_KIND].clone(),
                props[property::OWNER_NAME].clone(),
                props.get(property::OWNER_VERIFIED).cloned(),
            )
        };
        let verified = OwnerMark::Verified(NamedOwner {
            kind: "Deployment".into(),
            name: "web".into(),
        });
        assert_eq!(
            owner(Some(&verified)),
            ("Deployment".into(), "web".into(), Some("true".into()))
        );
        assert_eq!(
            owner(Some(&OwnerMark::Unverified)),
            ("ReplicaSet".into(), "web-5d9".into(), Some("false".into()))
        );
        assert_eq!(owner(None), ("ReplicaSet".into(), "web-5d9".into(), None));
    }

    #[test]
    fn property_keys_are_the_closed_set() {
        for behavior in Behavior::ALL {
            let mut f = finding(behavior, true);
            f.pod.owner_kind = Some("Deployment".into());
            f.pod.owner_name = Some("web".into());
            let props = report_result(&f).properties.unwrap();
            for key in props.keys() {
                assert!(property::ALL.contains(&key.as_str()), "{key}");
            }
        }
        let verified = OwnerMark::Verified(NamedOwner {
            kind: "Deployment".into(),
            name: "web".into(),
        });
        for (mark, shown) in [(verified, "true"), (OwnerMark::Unverified, "false")] {
            let props = pod_result(&finding(Behavior::Exec, true), Some(&mark))
                .properties
                .unwrap();
            assert_eq!(props[property::OWNER_VERIFIED], shown);
            for key in props.keys() {
                assert!(property::ALL.contains(&key.as_str()), "{key}");
            }
        }
        let f = finding(Behavior::Exec, true);
        let controller = controller_result(&f, f.fingerprint(), &[pod_reference(&f.pod)], 7);
        let props = controller.properties.unwrap();
        assert_eq!(props[property::POD_COUNT], "7");
        for key in props.keys() {
            assert!(property::ALL.contains(&key.as_str()), "{key}");
        }
        let mut bare = finding(Behavior::Exec, true);
        bare.pod.container = None;
        bare.decision = None;
        let props = report_result(&bare).properties.unwrap();
        assert!(!props.contains_key(property::CONTAINER));
        assert!(!props.contains_key(property::DECISION));
    }

    #[test]
    fn stats_round_trip_through_a_result() {
        let f = finding(Behavior::Exec, true);
        let r = report_result(&f);
        let s = stored_stats(&r).unwrap();
        assert_eq!(s.fingerprint, f.fingerprint());
        assert_eq!(s.count, 3);
        assert_eq!(s.first, Some(at(1_700_000_000)));
        assert_eq!(s.last, Some(at(1_700_000_060)));
        assert_eq!(last_seen(&r), at(1_700_000_060));

        let foreign = ReportResult {
            policy: "other".into(),
            timestamp: Some(Timestamp {
                seconds: 5,
                nanos: 0,
            }),
            ..ReportResult::default()
        };
        assert_eq!(stored_stats(&foreign), None);
        assert_eq!(last_seen(&foreign), at(5));
    }

    #[test]
    fn times_before_the_epoch_round_down() {
        let t = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(rfc3339(t), "1969-12-31T23:59:58Z");
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(floor_second(t)));
    }
}
