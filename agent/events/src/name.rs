//! Event names: deterministic, so a repeat of a cause finds its Event.
//!
//! A name is `<prefix>.<identity>.<reason>`:
//!
//! - `prefix` is for humans: the pod's name for a finding, the policy's
//!   for a policy error, mapped to what a name may hold and cut to
//!   [`MAX_PREFIX_LEN`] characters.
//! - `identity` is 16 hex digits of a SHA-256 over what the Event is
//!   about, its key: `regarding` (the pod and container, or the
//!   policy), `related` (the policy a finding is about), reason, action
//!   and type. That is the key client-go's `events.k8s.io/v1` recorder
//!   correlates by, and the fields the API server will not let an update
//!   change except the note.
//! - `reason` is the Event's reason, lowercased.
//!
//! The note is deliberately not part of the name (issue 38): a pod that
//! trips one policy on a new target every flush, or a policy error whose
//! message changes, would otherwise create a new object each time. One
//! Event per (object, reason) keeps the note of its first occurrence (the
//! note is immutable in `events.k8s.io/v1`) and counts the rest in its
//! series; the pod's Report lists every target.
//!
//! The last part is never hexadecimal, so a name can never be a kubelet's
//! `<pod>.<hex>`, and the whole is at most 63 + 1 + 16 + 1 + 18 = 99
//! characters, a valid DNS-1123 subdomain (what the API server requires of
//! an Event's name) whatever the input.

use k8s_openapi::api::core::v1::ObjectReference;
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

/// What an Event is about: everything its name is derived from. Each is
/// immutable in `events.k8s.io/v1`, so one Event cannot be about two keys.
pub(crate) struct Key<'a> {
    pub reason: &'a str,
    pub action: &'a str,
    pub type_: &'a str,
    pub regarding: &'a ObjectReference,
    pub related: Option<&'a ObjectReference>,
}

/// The identity part: 16 hex digits over a [`Key`].
pub(crate) fn identity(key: &Key<'_>) -> String {
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
    let regarding = reference(Some(key.regarding));
    let related = reference(key.related);
    let d = digest(
        "kyverno-runtime event key v2",
        [
            key.reason,
            key.action,
            key.type_,
            if key.related.is_some() { "related" } else { "" },
        ]
        .into_iter()
        .chain(regarding)
        .chain(related),
    );
    hex(&d[..8])
}

/// `<prefix>.<identity>.<reason>`; `reason` is one of this crate's
/// constants (letters only), lowercased.
pub(crate) fn join(prefix_source: &str, identity: &str, reason: &str) -> String {
    format!(
        "{}.{identity}.{}",
        prefix(prefix_source),
        reason.to_ascii_lowercase()
    )
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

    fn pod(uid: &str, container: Option<&str>) -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("shop".into()),
            name: Some("web-0".into()),
            uid: Some(uid.into()),
            field_path: container.map(|c| format!("spec.containers{{{c}}}")),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn identities_are_sixteen_hex_digits_over_the_key() {
        let regarding = pod("u1", Some("app"));
        let key = |regarding, reason, related| Key {
            reason,
            action: "Enforce",
            type_: "Warning",
            regarding,
            related,
        };
        let id = identity(&key(&regarding, "PolicyViolation", None));
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, identity(&key(&regarding, "PolicyViolation", None)));
        let (other_pod, other_container, no_container, policy) = (
            pod("u2", Some("app")),
            pod("u1", Some("side")),
            pod("u1", None),
            pod("u3", None),
        );
        for other in [
            identity(&key(&other_pod, "PolicyViolation", None)),
            identity(&key(&other_container, "PolicyViolation", None)),
            identity(&key(&no_container, "PolicyViolation", None)),
            identity(&key(&regarding, "PolicyWouldViolate", None)),
            identity(&key(&regarding, "PolicyViolation", Some(&policy))),
        ] {
            assert_ne!(other, id);
        }
        // Length-prefixed: the split between parts matters.
        let split = |name: &str, uid: &str| ObjectReference {
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        };
        let (ab, a) = (split("ab", "c"), split("a", "bc"));
        assert_ne!(
            identity(&key(&ab, "R", None)),
            identity(&key(&a, "R", None))
        );
        let name = join("web-0", &id, "PolicyWouldViolate");
        assert_eq!(name, format!("web-0.{id}.policywouldviolate"));
        assert!(is_valid_event_name(&name));
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
