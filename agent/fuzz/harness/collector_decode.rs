//! Fuzzes what the reference collector does with each message a daemon
//! streams to it: protobuf decoding of a `Finding` (the generated
//! `kyverno_runtime_push::proto` types), field-by-field validation
//! (`ReceivedFinding::try_from`), and the JSON line it writes
//! (`CollectedFinding`, built from the finding's redaction).
//!
//! Invariants beyond "no panic":
//! - every string the collector writes is already redacted (a fixed point
//!   of `sanitize`), so a foreign or old client cannot get a secret into
//!   the output;
//! - the fingerprint is 64 lowercase hex digits;
//! - the JSON line reads back to the same `CollectedFinding`.
//!
//! (The gRPC length-prefix framing around each message is tonic's.)

use kyverno_runtime_push::{proto, CollectedFinding, ReceivedFinding};
use kyverno_runtime_report::sanitize;
use prost::Message;

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Ok(message) = proto::Finding::decode(data) else {
        return;
    };
    let Ok(received) = ReceivedFinding::try_from(message) else {
        return;
    };
    let line = CollectedFinding::from(received);
    let redacted = |s: &str| assert_eq!(sanitize(s), s, "unredacted in {line:?}");
    redacted(&line.node);
    redacted(&line.policy);
    redacted(&line.policy_uid);
    redacted(&line.target);
    redacted(&line.pod.namespace);
    redacted(&line.pod.name);
    redacted(&line.pod.uid);
    for s in [
        &line.pod.container,
        &line.pod.owner_kind,
        &line.pod.owner_name,
    ]
    .into_iter()
    .flatten()
    {
        redacted(s);
    }
    if let Some(p) = &line.process {
        redacted(&p.comm);
        p.argv.iter().for_each(|a| redacted(a));
    }
    assert!(
        line.fingerprint.len() == 64
            && line
                .fingerprint
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "fingerprint {:?}",
        line.fingerprint
    );
    let json = serde_json::to_string(&line).unwrap_or_else(|e| panic!("encoding {line:?}: {e}"));
    let again: CollectedFinding =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("reading back {json}: {e}"));
    assert_eq!(again, line);
}
