//! Conversions between the wire messages ([`proto`](crate::proto)) and the
//! domain [`Finding`], kept apart so that neither shape leaks into the
//! other.
//!
//! Sending: [`encode`] takes a finding that has been through
//! [`Finding::redact`] (the sink does that first, before the finding is
//! queued). Receiving: [`ReceivedFinding`] validates a message field by
//! field, and [`CollectedFinding`] is the collector's JSON line, built from
//! the received finding's redaction again, so a collector fed by an older
//! or foreign client still writes nothing unscrubbed.

use crate::error::{Error, Result};
use crate::proto;
use kyverno_runtime_report::{
    sanitize, Behavior, Decision, Finding, Fingerprint, PodIdentity, Process,
};
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

fn behavior_to_wire(b: Behavior) -> proto::Behavior {
    match b {
        Behavior::Network => proto::Behavior::Network,
        Behavior::Exec => proto::Behavior::Exec,
        Behavior::Open => proto::Behavior::Open,
        Behavior::Protocol => proto::Behavior::Protocol,
        Behavior::Dns => proto::Behavior::Dns,
    }
}

fn decision_to_wire(d: Option<Decision>) -> proto::Decision {
    match d {
        None => proto::Decision::Unspecified,
        Some(Decision::Denied) => proto::Decision::Denied,
        Some(Decision::DefaultDenied) => proto::Decision::DefaultDenied,
    }
}

/// The wire message of a **redacted** finding observed on `node`.
///
/// Destructures the finding exhaustively, like `Finding::redact`, so a
/// field added to `Finding` does not compile until the wire has decided
/// about it.
pub(crate) fn encode(redacted: Finding, node: &str) -> proto::Finding {
    let fingerprint = redacted.fingerprint().to_string();
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
    let PodIdentity {
        namespace,
        name,
        uid,
        container,
        owner_kind,
        owner_name,
    } = pod;
    proto::Finding {
        policy,
        policy_uid,
        behavior: behavior_to_wire(behavior) as i32,
        pod: Some(proto::PodIdentity {
            namespace,
            name,
            uid,
            container,
            owner_kind,
            owner_name,
        }),
        target,
        enforced,
        decision: decision_to_wire(decision) as i32,
        count,
        first_observed: Some(first_observed.into()),
        last_observed: Some(last_observed.into()),
        fingerprint,
        node: node.to_owned(),
        process: process.map(|Process { pid, comm, argv }| proto::Process { pid, comm, argv }),
        matched,
    }
}

/// A validated wire message: the finding, and what the wire adds to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedFinding {
    /// The node whose daemon sent it, as the daemon says (the collector
    /// does not verify it against the client certificate).
    pub node: String,
    /// The fingerprint the daemon computed.
    pub fingerprint: Fingerprint,
    /// The finding, as received (not redacted again).
    pub finding: Finding,
}

fn timestamp(field: &'static str, ts: Option<prost_types::Timestamp>) -> Result<SystemTime> {
    let ts = ts.ok_or(Error::MissingField { field })?;
    SystemTime::try_from(ts).map_err(|source| Error::Timestamp { field, source })
}

impl TryFrom<proto::Finding> for ReceivedFinding {
    type Error = Error;

    fn try_from(msg: proto::Finding) -> Result<Self> {
        let proto::Finding {
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
            fingerprint,
            node,
            process,
            matched,
        } = msg;
        let behavior = match proto::Behavior::try_from(behavior) {
            Ok(proto::Behavior::Network) => Behavior::Network,
            Ok(proto::Behavior::Exec) => Behavior::Exec,
            Ok(proto::Behavior::Open) => Behavior::Open,
            Ok(proto::Behavior::Protocol) => Behavior::Protocol,
            Ok(proto::Behavior::Dns) => Behavior::Dns,
            Ok(proto::Behavior::Unspecified) | Err(_) => {
                return Err(Error::UnknownEnum {
                    field: "behavior",
                    value: behavior,
                })
            }
        };
        let decision = match proto::Decision::try_from(decision) {
            Ok(proto::Decision::Unspecified) => None,
            Ok(proto::Decision::Denied) => Some(Decision::Denied),
            Ok(proto::Decision::DefaultDenied) => Some(Decision::DefaultDenied),
            Err(_) => {
                return Err(Error::UnknownEnum {
                    field: "decision",
                    value: decision,
                })
            }
        };
        let proto::PodIdentity {
            namespace,
            name,
            uid,
            container,
            owner_kind,
            owner_name,
        } = pod.ok_or(Error::MissingField { field: "pod" })?;
        let fingerprint = Fingerprint::from_hex(&fingerprint).ok_or(Error::Fingerprint)?;
        Ok(ReceivedFinding {
            node,
            fingerprint,
            finding: Finding {
                policy,
                policy_uid,
                behavior,
                pod: PodIdentity {
                    namespace,
                    name,
                    uid,
                    container,
                    owner_kind,
                    owner_name,
                },
                target,
                enforced,
                decision,
                count,
                first_observed: timestamp("first_observed", first_observed)?,
                last_observed: timestamp("last_observed", last_observed)?,
                process: process.map(|proto::Process { pid, comm, argv }| Process {
                    pid,
                    comm,
                    argv,
                }),
                matched,
            },
        })
    }
}

/// The pod of a [`CollectedFinding`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectedPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// The container, when attribution resolved one.
    pub container: Option<String>,
    /// The owner's kind. **Unverified** correlation metadata (read
    /// verbatim from the pod's first ownerReference, which whoever can
    /// create the pod can set): never a security boundary.
    pub owner_kind: Option<String>,
    /// The owner's name. **Unverified**, as `owner_kind`.
    pub owner_name: Option<String>,
}

/// One line of the reference collector's output: a received finding as
/// JSON, with stable camelCase field names (absent optional values are
/// `null`, never missing).
///
/// ```json
/// {"node":"node-a","policy":"no-shell","policyUid":"…","behavior":"exec",
///  "pod":{"namespace":"shop","name":"web-0","uid":"…","container":"app",
///         "ownerKind":"StatefulSet","ownerName":"web"},
///  "target":"/bin/sh","enforced":true,"decision":"denied","count":1,
///  "firstObserved":"2026-01-01T00:00:00Z","lastObserved":"2026-01-01T00:00:00Z",
///  "fingerprint":"48844a31…"}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectedFinding {
    /// The node whose daemon sent it (as the daemon says).
    pub node: String,
    /// The RuntimePolicy's name.
    pub policy: String,
    /// The RuntimePolicy's uid.
    pub policy_uid: String,
    /// `network`, `exec`, `open`, `protocol` or `dns`.
    pub behavior: String,
    /// The pod.
    pub pod: CollectedPod,
    /// What the kernel saw (redacted).
    pub target: String,
    /// Whether the kernel refused it (enforce mode) rather than a monitor
    /// policy flagging it.
    pub enforced: bool,
    /// `denied`, `default-denied`, or `null` when the daemon did not say.
    pub decision: Option<String>,
    /// How many occurrences this message reports.
    pub count: u64,
    /// The earliest occurrence, RFC 3339 in UTC.
    pub first_observed: String,
    /// The latest occurrence, RFC 3339 in UTC.
    pub last_observed: String,
    /// The finding's identity, 64 lowercase hex digits.
    pub fingerprint: String,
    /// The process of the latest occurrence, when the kernel named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<CollectedProcess>,
    /// The Service and domain values the destination matched as (a
    /// network finding; omitted when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<String>,
}

/// The process of a [`CollectedFinding`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectedProcess {
    /// Thread-group id, as the node sees it.
    pub pid: u32,
    /// The task's comm.
    pub comm: String,
    /// A traced exec's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
}

impl From<ReceivedFinding> for CollectedFinding {
    fn from(received: ReceivedFinding) -> Self {
        let ReceivedFinding {
            node,
            fingerprint,
            finding,
        } = received;
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
        } = finding.redact();
        let PodIdentity {
            namespace,
            name,
            uid,
            container,
            owner_kind,
            owner_name,
        } = pod;
        let rfc3339 = |t: SystemTime| prost_types::Timestamp::from(t).to_string();
        CollectedFinding {
            node: sanitize(&node),
            policy,
            policy_uid,
            behavior: behavior.as_str().to_owned(),
            pod: CollectedPod {
                namespace,
                name,
                uid,
                container,
                owner_kind,
                owner_name,
            },
            target,
            enforced,
            decision: decision.map(|d| d.as_str().to_owned()),
            count,
            first_observed: rfc3339(first_observed),
            last_observed: rfc3339(last_observed),
            fingerprint: fingerprint.to_string(),
            process: process.map(|Process { pid, comm, argv }| CollectedProcess {
                pid,
                comm,
                argv,
            }),
            matched,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn finding() -> Finding {
        Finding {
            count: 3,
            last_observed: UNIX_EPOCH + Duration::new(200, 5),
            process: Some(Process {
                pid: 4242,
                comm: "curl".into(),
                argv: vec!["curl".into(), "-sS".into(), "http://example".into()],
            }),
            ..kyverno_runtime_report::fixtures::finding()
        }
    }

    #[test]
    fn a_finding_survives_the_wire() {
        let f = finding();
        let msg = encode(f.clone().redact(), "node-a");
        assert_eq!(msg.fingerprint, f.fingerprint().to_string());
        let back = ReceivedFinding::try_from(msg).unwrap();
        assert_eq!(back.finding, f);
        assert_eq!(back.node, "node-a");
        assert_eq!(back.fingerprint, f.fingerprint());
    }

    #[test]
    fn the_json_line_has_stable_camel_case_names() {
        let msg = encode(finding().redact(), "node-a");
        let line = CollectedFinding::from(ReceivedFinding::try_from(msg).unwrap());
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.starts_with(r#"{"node":"node-a","policy":"no-curl","#),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        // serde_json's map is sorted: compare as sorted sets.
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut want = [
            "node",
            "policy",
            "policyUid",
            "behavior",
            "pod",
            "target",
            "enforced",
            "decision",
            "count",
            "firstObserved",
            "lastObserved",
            "fingerprint",
            "process",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        let mut pod: Vec<&str> = json["pod"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        pod.sort_unstable();
        assert_eq!(
            pod,
            [
                "container",
                "name",
                "namespace",
                "ownerKind",
                "ownerName",
                "uid"
            ]
        );
        assert_eq!(json["behavior"], "exec");
        assert_eq!(json["decision"], "denied");
        assert_eq!(json["firstObserved"], "1970-01-01T00:01:40Z");
        assert_eq!(json["lastObserved"], "1970-01-01T00:03:20.000000005Z");
    }

    #[test]
    fn malformed_messages_are_refused_by_field() {
        let good = encode(finding().redact(), "n");
        type Break = fn(&mut proto::Finding);
        let cases: [(Break, &str); 5] = [
            (|m| m.behavior = 0, "behavior"),
            (|m| m.behavior = 99, "behavior"),
            (|m| m.decision = 7, "decision"),
            (|m| m.pod = None, "pod"),
            (|m| m.last_observed = None, "last_observed"),
        ];
        for (break_it, field) in cases {
            let mut m = good.clone();
            break_it(&mut m);
            let err = ReceivedFinding::try_from(m).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        let mut m = good;
        m.fingerprint = "abc".into();
        assert!(matches!(
            ReceivedFinding::try_from(m),
            Err(Error::Fingerprint)
        ));
    }

    #[test]
    fn the_collector_redacts_again() {
        let mut raw = finding();
        raw.target = "mysql --password=hunter2".into();
        // An older or foreign client that forgot to redact.
        let msg = encode(raw, "n");
        let line = CollectedFinding::from(ReceivedFinding::try_from(msg).unwrap());
        assert_eq!(line.target, "mysql --password=***");
    }
}
