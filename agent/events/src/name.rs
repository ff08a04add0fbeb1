//! Event names: deterministic, so a repeat of a cause finds its Event.
//!
//! A name is `<prefix>.<identity>.<variant>`:
//!
//! - `prefix` is for humans: the pod's name for a finding, the policy's
//!   for a policy error, mapped to what a name may hold and cut to
//!   [`MAX_PREFIX_LEN`] characters.
//! - `identity` is 16 hex digits of what the Event is about: the first 16
//!   of the finding's [`Fingerprint`] (the identity the reporter
//!   deduplicates by, and the `fingerprint` property of the pod's Report
//!   result, so an Event leads to its result), or of a SHA-256 over the
//!   policy's uid and the condition type.
//! - `variant` is 8 hex digits of a SHA-256 over everything the API server
//!   will not let an update change: reason, action, type, note, regarding
//!   and related. In `events.k8s.io/v1` these are immutable (the server
//!   refuses `note: field is immutable`), so an Event can only be about
//!   one of them: a policy switched from monitor to enforce, a finding
//!   from another container, or a condition whose message changed is a
//!   distinct cause, and gets its own Event rather than a refused patch.
//!
//! Three dot-separated parts can never be a kubelet's `<pod>.<16 hex>`
//! name, and the whole is at most 63 + 1 + 16 + 1 + 8 = 89 characters, a
//! valid DNS-1123 subdomain (what the API server requires of an Event's
//! name) whatever the input.

use k8s_openapi::api::core::v1::ObjectReference;
use kyverno_runtime_report::Fingerprint;
use sha2::{Digest, Sha256};

/// The longest human-readable head of an Event name.
pub const MAX_PREFIX_LEN: usize = 63;

/// What a name starts with when its source maps to nothing.
pub const FALLBACK_PREFIX: &str = "kyverno-runtime";

/// Hashes length-prefixed parts behind a domain tag, so that no two part
/// lists hash the same bytes.
fn digest<'a>(tag: &str, parts: impl IntoIterator<Item = &'a str>) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(tag.as_bytes());
    hash.update([0u8]);
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `source` mapped to a DNS-1123 subdomain of at most [`MAX_PREFIX_LEN`]
/// characters: lowercased, anything but `[a-z0-9.-]` made a `-`, empty
/// parts dropped, every part trimmed to start and end alphanumeric.
pub(crate) fn prefix(source: &str) -> String {
    let mapped: String = source
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let joined = mapped
        .split('.')
        .map(|part| part.trim_matches('-'))
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    // ASCII only, so every byte index is a character boundary.
    let cut = joined.get(..MAX_PREFIX_LEN).unwrap_or(&joined);
    let cut = cut.trim_end_matches(['-', '.']);
    if cut.is_empty() {
        FALLBACK_PREFIX.to_string()
    } else {
        cut.to_string()
    }
}

/// The identity part of a finding's Event.
pub(crate) fn finding_identity(fingerprint: &Fingerprint) -> String {
    hex(&fingerprint.as_bytes()[..8])
}

/// The identity part of a policy error's Event: its policy (by uid, or by
/// name when the uid is unknown) and its condition type.
pub(crate) fn policy_identity(uid_or_name: &str, condition_type: &str) -> String {
    let d = digest(
        "kyverno-runtime policy error v1",
        [uid_or_name, condition_type],
    );
    hex(&d[..8])
}

/// What an Event says that an update cannot change.
pub(crate) struct Immutable<'a> {
    pub reason: &'a str,
    pub action: &'a str,
    pub type_: &'a str,
    pub note: &'a str,
    pub regarding: &'a ObjectReference,
    pub related: Option<&'a ObjectReference>,
}

/// The variant part: 8 hex digits over [`Immutable`].
pub(crate) fn variant(fields: &Immutable<'_>) -> String {
    fn reference(r: Option<&ObjectReference>) -> [&str; 6] {
        fn field(v: Option<&Option<String>>) -> &str {
            v.and_then(|s| s.as_deref()).unwrap_or("")
        }
        [
            field(r.map(|r| &r.api_version)),
            field(r.map(|r| &r.kind)),
            field(r.map(|r| &r.namespace)),
            field(r.map(|r| &r.name)),
            field(r.map(|r| &r.uid)),
            field(r.map(|r| &r.field_path)),
        ]
    }
    let regarding = reference(Some(fields.regarding));
    let related = reference(fields.related);
    let d = digest(
        "kyverno-runtime event v1",
        [
            fields.reason,
            fields.action,
            fields.type_,
            fields.note,
            if fields.related.is_some() {
                "related"
            } else {
                ""
            },
        ]
        .into_iter()
        .chain(regarding)
        .chain(related),
    );
    hex(&d[..4])
}

/// `<prefix>.<identity>.<variant>`.
pub(crate) fn join(prefix_source: &str, identity: &str, variant: &str) -> String {
    format!("{}.{identity}.{variant}", prefix(prefix_source))
}

/// A DNS-1123 subdomain as the API server validates object names: at most
/// 253 characters of dot-separated non-empty parts of `[a-z0-9-]`, each
/// alphanumeric at both ends.
pub fn is_valid_event_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn prefixes_are_valid_whatever_the_source() {
        for (source, want) in [
            ("web-0", "web-0"),
            ("Web_0", "web-0"),
            ("web.v1-0", "web.v1-0"),
            ("-a..b-", "a.b"),
            ("***", FALLBACK_PREFIX),
            ("", FALLBACK_PREFIX),
            ("ümlaut", "mlaut"),
            ("..--..", FALLBACK_PREFIX),
        ] {
            assert_eq!(prefix(source), want, "{source:?}");
        }
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(40));
        let p = prefix(&long);
        assert_eq!(p, "a".repeat(62), "cut, and a trailing dash trimmed");
        let dotted = format!("{}.{}", "a".repeat(62), "b".repeat(40));
        assert_eq!(prefix(&dotted), "a".repeat(62), "a trailing dot trimmed");
        for source in [long.as_str(), dotted.as_str(), "x", "-", "a\u{0}b", "A.B.C"] {
            let p = prefix(source);
            assert!(p.len() <= MAX_PREFIX_LEN && is_valid_event_name(&p), "{p}");
        }
    }

    #[test]
    fn identities_are_sixteen_hex_digits() {
        let id = policy_identity("11111111-2222-3333-4444-555555555555", "Applied");
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            id,
            policy_identity("11111111-2222-3333-4444-555555555555", "TargetsValid")
        );
        assert_ne!(id, policy_identity("other", "Applied"));
        // Length-prefixed: the split between parts matters.
        assert_ne!(policy_identity("ab", "c"), policy_identity("a", "bc"));
    }

    #[test]
    fn validity() {
        assert!(is_valid_event_name("web-0.0123456789abcdef.01234567"));
        assert!(!is_valid_event_name(""));
        assert!(!is_valid_event_name("a..b"));
        assert!(!is_valid_event_name("a.-b"));
        assert!(!is_valid_event_name("A"));
        assert!(!is_valid_event_name(&"a".repeat(254)));
        assert!(is_valid_event_name(&"a".repeat(253)));
    }
}
