//! Recorded events: [`Event`] as JSON, one object per line.
//!
//! [`RecordedEvent`] mirrors [`Event`] field for field (and [`PodRef`],
//! [`ProcessInfo`], [`Facts`] and [`KernelVerdict`] inside it), so that
//! what the plane saw can be written down, kept, and fed back through the
//! same attribution and monitor (`kyverno-runtime policy test`). The schema
//! is documented for people in `docs/recorded-events.md`:
//!
//! ```json
//! {"source":"exec-trace","time":"2026-01-02T03:04:05Z","cgroup":42,
//!  "process":{"pid":4242,"comm":"sh"},"count":1,"kernel":"allowed",
//!  "facts":{"kind":"exec","filename":"/usr/bin/curl","argv":["curl","-sS"]}}
//! ```
//!
//! Everything but `facts` may be left out: `source` reads as
//! [`RECORDED_SOURCE`], `time` as the moment the line is read, `count` as
//! 1, and no cgroup, pod uid, process, kernel verdict or pod. A line that
//! does not parse, or names a source or protocol the plane does not know,
//! is refused with its line number: nothing in a recording is skipped
//! silently.

use crate::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use k8s_openapi::jiff;
use kyverno_runtime_bpf::protocol::Protocol;
use kyverno_runtime_enforce::protocol::protocol_token;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

/// The source of a recorded event that names none.
pub const RECORDED_SOURCE: &str = "recorded";

/// The sources an event may name: the daemon's (the names its status and
/// metrics use) and [`RECORDED_SOURCE`]. `Event::source` is a `&'static
/// str` (a metric label), so a recorded name is one of these, not an
/// allocation per line.
pub const KNOWN_SOURCES: [&str; 6] = [
    "openexec-observe",
    "openexec-denials",
    "exec-trace",
    "egress-observe",
    "dnsquery",
    RECORDED_SOURCE,
];

/// Why a recorded event was refused.
///
/// Its own enum rather than variants of [`SourceError`](crate::SourceError),
/// which is a source's failure reason as status shows it: this is an input
/// error, reported to whoever wrote the recording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The line is not JSON of the schema.
    #[error("not a recorded event: {0}")]
    Json(String),
    /// A source no part of the plane has.
    #[error("unknown source {0:?} (known: {known})", known = KNOWN_SOURCES.join(", "))]
    UnknownSource(String),
    /// A protocol the classifier cannot produce.
    #[error("unknown protocol {0:?} (known: {known})", known = known_protocols().join(", "))]
    UnknownProtocol(String),
    /// `time` is not an RFC 3339 instant.
    #[error("time {0:?} is not an RFC 3339 time such as 2026-01-02T03:04:05Z")]
    Time(String),
    /// `count` is 0: an event stands for at least one occurrence.
    #[error("count must be at least 1")]
    ZeroCount,
}

/// The kernel's decision, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordedVerdict {
    /// [`KernelVerdict::Allowed`].
    Allowed,
    /// [`KernelVerdict::Denied`].
    Denied,
    /// [`KernelVerdict::DefaultDenied`].
    DefaultDenied,
}

impl From<KernelVerdict> for RecordedVerdict {
    fn from(v: KernelVerdict) -> Self {
        match v {
            KernelVerdict::Allowed => RecordedVerdict::Allowed,
            KernelVerdict::Denied => RecordedVerdict::Denied,
            KernelVerdict::DefaultDenied => RecordedVerdict::DefaultDenied,
        }
    }
}

impl From<RecordedVerdict> for KernelVerdict {
    fn from(v: RecordedVerdict) -> Self {
        match v {
            RecordedVerdict::Allowed => KernelVerdict::Allowed,
            RecordedVerdict::Denied => KernelVerdict::Denied,
            RecordedVerdict::DefaultDenied => KernelVerdict::DefaultDenied,
        }
    }
}

/// [`ProcessInfo`], as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedProcess {
    /// Thread-group id, as the node sees it.
    pub pid: u32,
    /// `comm`.
    #[serde(default)]
    pub comm: String,
}

/// [`Facts`], as recorded: `kind` says which.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RecordedFacts {
    /// [`Facts::Open`].
    Open {
        /// The path as the kernel resolved it (empty: unresolved).
        path: String,
    },
    /// [`Facts::Exec`].
    Exec {
        /// The executed file.
        filename: String,
        /// The arguments, when traced.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        argv: Vec<String>,
    },
    /// [`Facts::Net`].
    Net {
        /// The destination address.
        dest: IpAddr,
        /// The destination port, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        /// The network values naming the destination (Services, the
        /// domain it was learned under), when known.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        names: Vec<String>,
        /// One name, as recordings before `names` wrote it; read into
        /// `names`, never written.
        #[serde(default, skip_serializing)]
        domain: Option<String>,
    },
    /// [`Facts::Dns`].
    Dns {
        /// The queried name, lowercase, without the trailing dot.
        qname: String,
    },
    /// [`Facts::Protocol`].
    Protocol {
        /// The classifier's token (`ssh`, `tls`, `http/1.1`, `http/2`,
        /// `quic`, `dns`, `unclassified`).
        protocol: String,
        /// For `tls`, the first ALPN offered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alpn: Option<String>,
    },
}

/// [`PodRef`], as recorded (without its index-internal `version`).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid (empty: unknown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The owner's kind. **Unverified**, as [`PodRef::owner_kind`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    /// The owner's name. **Unverified**.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_name: Option<String>,
    /// The containers by cgroup id (JSON object keys are strings: `"42"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub containers: BTreeMap<u64, String>,
    /// The containers' runtime ids by container name
    /// (`{"app": "containerd://…"}`).
    #[serde(
        default,
        rename = "containerIDs",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub container_ids: BTreeMap<String, String>,
    /// The node it runs on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// Its service account.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account: String,
}

impl From<&PodRef> for RecordedPod {
    fn from(p: &PodRef) -> Self {
        RecordedPod {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            labels: p.labels.clone(),
            owner_kind: p.owner_kind.clone(),
            owner_name: p.owner_name.clone(),
            containers: p.containers.clone(),
            container_ids: p.container_ids.clone(),
            node_name: p.node_name.clone(),
            service_account: p.service_account.clone(),
        }
    }
}

impl From<RecordedPod> for PodRef {
    fn from(p: RecordedPod) -> Self {
        PodRef {
            namespace: p.namespace,
            name: p.name,
            uid: p.uid,
            labels: p.labels,
            owner_kind: p.owner_kind,
            owner_name: p.owner_name,
            containers: p.containers,
            container_ids: p.container_ids,
            node_name: p.node_name,
            service_account: p.service_account,
            version: 0,
        }
    }
}

/// [`Event`], as recorded; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedEvent {
    /// One of [`KNOWN_SOURCES`]; absent: [`RECORDED_SOURCE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// When it happened, RFC 3339; absent: when the line is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The cgroup (v2 id) the operation came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<u64>,
    /// The pod uid, when the source knew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The process of a per-occurrence record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<RecordedProcess>,
    /// Occurrences this event stands for (at least 1; absent: 1).
    #[serde(default = "one")]
    pub count: u64,
    /// The kernel's decision, when an enforcing program reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<RecordedVerdict>,
    /// What was observed.
    pub facts: RecordedFacts,
    /// The pod, when the event was recorded after attribution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<RecordedPod>,
}

fn one() -> u64 {
    1
}

/// The protocol tokens the classifier produces.
pub fn known_protocols() -> Vec<&'static str> {
    Protocol::ALL.into_iter().map(protocol_token).collect()
}

fn intern_source(name: Option<&str>) -> Result<&'static str, RecordError> {
    let name = name.unwrap_or(RECORDED_SOURCE);
    KNOWN_SOURCES
        .into_iter()
        .find(|s| *s == name)
        .ok_or_else(|| RecordError::UnknownSource(name.to_string()))
}

fn intern_protocol(token: &str) -> Result<&'static str, RecordError> {
    Protocol::ALL
        .into_iter()
        .map(protocol_token)
        .find(|p| *p == token)
        .ok_or_else(|| RecordError::UnknownProtocol(token.to_string()))
}

/// Formats a time as RFC 3339 in UTC, to the nanosecond it carries; a time
/// outside jiff's range (years -9999 to 9999) is left out.
fn format_time(t: SystemTime) -> Option<String> {
    jiff::Timestamp::try_from(t).ok().map(|ts| ts.to_string())
}

impl From<&Event> for RecordedEvent {
    fn from(e: &Event) -> Self {
        let facts = match &e.facts {
            Facts::Open { path } => RecordedFacts::Open { path: path.clone() },
            Facts::Exec { filename, argv } => RecordedFacts::Exec {
                filename: filename.clone(),
                argv: argv.clone(),
            },
            Facts::Net { dest, port, names } => RecordedFacts::Net {
                dest: *dest,
                port: *port,
                names: names.clone(),
                domain: None,
            },
            Facts::Dns { qname } => RecordedFacts::Dns {
                qname: qname.clone(),
            },
            Facts::Protocol { protocol, alpn } => RecordedFacts::Protocol {
                protocol: (*protocol).to_string(),
                alpn: alpn.clone(),
            },
        };
        RecordedEvent {
            source: Some(e.source.to_string()),
            time: format_time(e.time),
            cgroup: e.cgroup,
            pod_uid: e.pod_uid.as_deref().map(str::to_string),
            process: e.process.as_ref().map(|p| RecordedProcess {
                pid: p.pid,
                comm: p.comm.clone(),
            }),
            count: e.count,
            kernel: e.kernel.map(RecordedVerdict::from),
            facts,
            pod: e.pod.as_deref().map(RecordedPod::from),
        }
    }
}

impl TryFrom<RecordedEvent> for Event {
    type Error = RecordError;

    fn try_from(r: RecordedEvent) -> Result<Self, RecordError> {
        let source = intern_source(r.source.as_deref())?;
        if r.count == 0 {
            return Err(RecordError::ZeroCount);
        }
        let time = match &r.time {
            None => SystemTime::now(),
            Some(t) => t
                .parse::<jiff::Timestamp>()
                .map(SystemTime::from)
                .map_err(|_| RecordError::Time(t.clone()))?,
        };
        let facts = match r.facts {
            RecordedFacts::Open { path } => Facts::Open { path },
            RecordedFacts::Exec { filename, argv } => Facts::Exec { filename, argv },
            RecordedFacts::Net {
                dest,
                port,
                mut names,
                domain,
            } => {
                if let Some(d) = domain {
                    if !names.contains(&d) {
                        names.insert(0, d);
                    }
                }
                Facts::Net { dest, port, names }
            }
            RecordedFacts::Dns { qname } => Facts::Dns { qname },
            RecordedFacts::Protocol { protocol, alpn } => Facts::Protocol {
                protocol: intern_protocol(&protocol)?,
                alpn,
            },
        };
        Ok(Event {
            source,
            time,
            cgroup: r.cgroup,
            pod_uid: r.pod_uid.map(Arc::from),
            process: r.process.map(|p| ProcessInfo {
                pid: p.pid,
                comm: p.comm,
            }),
            count: r.count,
            kernel: r.kernel.map(KernelVerdict::from),
            facts,
            pod: r.pod.map(|p| Arc::new(PodRef::from(p))),
        })
    }
}

/// One JSON line as an event.
pub fn parse_line(line: &str) -> Result<Event, RecordError> {
    let recorded: RecordedEvent =
        serde_json::from_str(line).map_err(|e| RecordError::Json(one_line(&e.to_string())))?;
    Event::try_from(recorded)
}

/// Longest JSON error message kept (serde_json quotes an unknown field's
/// name, which the line can make as long as it likes).
const MAX_JSON_ERROR_CHARS: usize = 300;

/// A decoder's message as one line of bounded length: control characters
/// escaped (a JSON `\n` in an unknown field's name is a real newline by the
/// time serde_json quotes it), so a recording cannot forge lines of
/// `policy test` output.
fn one_line(message: &str) -> String {
    let mut out = String::new();
    for (i, c) in message.chars().enumerate() {
        if i == MAX_JSON_ERROR_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Every event of a JSON-lines text, each with its line number (from 1);
/// blank lines are skipped, and a line that is not an event is an error
/// with its number, after the events before it.
pub fn parse_lines(text: &str) -> impl Iterator<Item = (usize, Result<Event, RecordError>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, parse_line(l)))
}

/// An event as one JSON line (no newline).
pub fn to_line(event: &Event) -> String {
    // A RecordedEvent is strings, numbers and maps with string keys:
    // serializing it cannot fail; an empty object would say so if it did.
    serde_json::to_string(&RecordedEvent::from(event)).unwrap_or_else(|_| "{}".to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn every_kind() -> Vec<Event> {
        let pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "uid-web-0".into(),
            labels: BTreeMap::from([("app".into(), "web".into())]),
            owner_kind: Some("Deployment".into()),
            owner_name: Some("web".into()),
            containers: BTreeMap::from([(42, "app".into())]),
            container_ids: BTreeMap::from([("app".into(), "containerd://abc".into())]),
            node_name: "node-1".into(),
            service_account: "web".into(),
            version: 0,
        });
        let facts = [
            Facts::Open {
                path: "/etc/hosts".into(),
            },
            Facts::Exec {
                filename: "/bin/sh".into(),
                argv: vec!["sh".into(), "-c".into(), "id".into()],
            },
            Facts::Net {
                dest: "fd00::1".parse().unwrap(),
                port: Some(443),
                names: vec!["api.example.com".into(), "api.prod.svc".into()],
            },
            Facts::Dns {
                qname: "www.example.com".into(),
            },
            Facts::Protocol {
                protocol: "tls",
                alpn: Some("h2".into()),
            },
        ];
        facts
            .into_iter()
            .enumerate()
            .map(|(i, facts)| Event {
                source: KNOWN_SOURCES[i],
                time: UNIX_EPOCH + Duration::new(1_767_323_045, 123_000_000),
                cgroup: Some(42),
                pod_uid: Some(Arc::from("uid-web-0")),
                process: Some(ProcessInfo {
                    pid: 7,
                    comm: "sh".into(),
                }),
                count: 3,
                kernel: Some(KernelVerdict::DefaultDenied),
                facts,
                pod: Some(pod.clone()),
            })
            .collect()
    }

    #[test]
    fn every_field_of_every_kind_round_trips() {
        for event in every_kind() {
            let line = to_line(&event);
            assert_eq!(parse_line(&line).unwrap(), event, "{line}");
        }
    }

    #[test]
    fn the_documented_line_reads() {
        let e = parse_line(
            r#"{"source":"exec-trace","time":"2026-01-02T03:04:05Z","cgroup":42,"process":{"pid":4242,"comm":"sh"},"count":1,"kernel":"allowed","facts":{"kind":"exec","filename":"/usr/bin/curl","argv":["curl","-sS"]}}"#,
        )
        .unwrap();
        assert_eq!(e.source, "exec-trace");
        assert_eq!(
            e.time,
            UNIX_EPOCH + Duration::from_secs(1_767_323_045),
            "2026-01-02T03:04:05Z"
        );
        assert_eq!(e.kernel, Some(KernelVerdict::Allowed));
        assert_eq!(e.facts.target(), "/usr/bin/curl");
        assert_eq!(e.process.unwrap().pid, 4242);
    }

    /// A recording from before `names` (one `domain`) still reads, into
    /// `names`; what is written is `names`.
    #[test]
    fn a_recorded_domain_reads_as_a_name() {
        let e = parse_line(
            r#"{"facts":{"kind":"net","dest":"10.0.0.1","domain":"api.example.com","names":["api.prod.svc"]}}"#,
        )
        .unwrap();
        let Facts::Net { names, .. } = &e.facts else {
            panic!("not net: {:?}", e.facts)
        };
        assert_eq!(names, &["api.example.com", "api.prod.svc"]);
        let line = to_line(&e);
        assert!(
            line.contains(r#""names":["api.example.com","api.prod.svc"]"#),
            "{line}"
        );
        assert!(!line.contains(r#""domain""#), "{line}");
    }

    #[test]
    fn only_the_facts_are_required() {
        let e = parse_line(r#"{"facts":{"kind":"net","dest":"10.0.0.1"}}"#).unwrap();
        assert_eq!(e.source, RECORDED_SOURCE);
        assert_eq!(e.count, 1);
        assert_eq!((e.cgroup, e.kernel, e.pod), (None, None, None));
        assert_eq!(e.facts.target(), "10.0.0.1");
    }

    #[test]
    fn bad_lines_say_why() {
        let err = |line: &str| parse_line(line).unwrap_err().to_string();
        assert!(
            err(r#"{"source":"ebpf","facts":{"kind":"dns","qname":"x"}}"#)
                .starts_with(r#"unknown source "ebpf" (known: openexec-observe,"#)
        );
        assert!(
            err(r#"{"facts":{"kind":"protocol","protocol":"ftp"}}"#).contains("unknown protocol \"ftp\" (known: unclassified, ssh, tls, http/2, http/1.1, quic, dns)"),
            "{}",
            err(r#"{"facts":{"kind":"protocol","protocol":"ftp"}}"#)
        );
        assert!(
            err(r#"{"time":"yesterday","facts":{"kind":"dns","qname":"x"}}"#)
                .contains("not an RFC 3339 time")
        );
        assert_eq!(
            err(r#"{"count":0,"facts":{"kind":"dns","qname":"x"}}"#),
            "count must be at least 1"
        );
        assert!(err(r#"{"facts":{"kind":"net","dest":"10.0.0.300"}}"#)
            .starts_with("not a recorded event:"));
        assert!(
            err(r#"{"facts":{"kind":"open","path":"/x"},"colour":"red"}"#).contains("colour"),
            "an unknown field is refused, not ignored"
        );
    }

    /// Found by the recorded_events fuzz target: an unknown field whose
    /// name holds an escaped newline came out as two lines of output.
    #[test]
    fn a_refusal_is_one_bounded_line() {
        let line = format!(
            r#"{{"facts":{{"kind":"dns","qname":"x"}},"a\nb{}":1}}"#,
            "c".repeat(5000)
        );
        let message = parse_line(&line).unwrap_err().to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains(r"a\nb"), "{message}");
        assert!(
            message.chars().count() < 400,
            "{} characters",
            message.chars().count()
        );
    }

    #[test]
    fn lines_are_numbered_and_blank_ones_skipped() {
        let text = "{\"facts\":{\"kind\":\"dns\",\"qname\":\"a\"}}\n\n  \nnot json\n";
        let got: Vec<(usize, bool)> = parse_lines(text).map(|(n, r)| (n, r.is_ok())).collect();
        assert_eq!(got, [(1, true), (4, false)]);
    }
}
