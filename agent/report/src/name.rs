//! The name of a pod's Report: `kyverno-runtime-<podName>`.

use sha2::{Digest, Sha256};

/// What every Report name starts with.
pub const REPORT_NAME_PREFIX: &str = "kyverno-runtime-";

/// The longest Report name: a DNS-1123 label. A Report is a custom resource,
/// whose names may be subdomains of up to 253 characters, but a label is
/// what can also be used as a label value (to select the Report of a pod)
/// and what the original writer produced.
pub const MAX_REPORT_NAME_LEN: usize = 63;

/// Hex digits of the pod name's SHA-256 in a shortened name.
const HASH_LEN: usize = 8;

/// The Report name for a pod: `kyverno-runtime-<podName>` when that is a
/// DNS-1123 label of at most 63 characters.
///
/// Otherwise (a long pod name, or one with dots, which a subdomain allows
/// and a label does not) the name is mapped to `[a-z0-9-]`, cut so that
/// `-<8 hex digits>` of the pod name's SHA-256 fits, and suffixed with
/// them. The suffix is what keeps two pods whose names share the first 38
/// characters (`job-with-a-long-name-...-x7k2p`) or differ only in a dot
/// and a dash (`a.b`, `a-b`) on two Reports; it is computed from the pod
/// name alone, so the name is the same on every flush and every node.
pub fn report_name(pod_name: &str) -> String {
    let mapped: String = pod_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let full = format!("{REPORT_NAME_PREFIX}{mapped}");
    let altered = mapped != pod_name;
    if !altered && full.len() <= MAX_REPORT_NAME_LEN && full.ends_with(|c: char| c != '-') {
        return full;
    }
    let digest = Sha256::digest(pod_name.as_bytes());
    let hash: String = digest
        .iter()
        .take(HASH_LEN / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    // `full` is ASCII (the prefix and the mapping), so any byte index is a
    // character boundary.
    let room = MAX_REPORT_NAME_LEN - 1 - HASH_LEN;
    let head = full
        .get(..room.min(full.len()))
        .unwrap_or(REPORT_NAME_PREFIX);
    let head = head.trim_end_matches('-');
    format!("{head}-{hash}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::finding::is_dns1123_label;

    #[test]
    fn short_names_are_kept() {
        assert_eq!(report_name("web-0"), "kyverno-runtime-web-0");
    }

    #[test]
    fn the_63_character_boundary() {
        let fits = "a".repeat(MAX_REPORT_NAME_LEN - REPORT_NAME_PREFIX.len());
        let name = report_name(&fits);
        assert_eq!(name.len(), 63);
        assert_eq!(name, format!("{REPORT_NAME_PREFIX}{fits}"));

        let over = format!("{fits}b");
        let name = report_name(&over);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&format!("{REPORT_NAME_PREFIX}aaaa")));
        assert_ne!(name, report_name(&format!("{fits}c")), "hash tells apart");
        assert!(is_dns1123_label(&name), "{name}");
    }

    #[test]
    fn the_hash_suffix_is_stable() {
        // The first 8 hex digits of sha256(pod), computed independently with
        // Python's hashlib; a change would orphan every shortened Report.
        let pod = "checkout-service-canary-7d9f8b6c5d-x2x9z-with-a-long-suffix";
        assert_eq!(
            report_name(pod),
            "kyverno-runtime-checkout-service-canary-7d9f8b6c5d-x2x-20de816b"
        );
        assert_eq!(report_name(pod), report_name(pod));
    }

    #[test]
    fn dots_and_odd_characters_are_mapped_and_hashed() {
        let dotted = report_name("web.v1");
        let dashed = report_name("web-v1");
        assert_eq!(dashed, "kyverno-runtime-web-v1");
        assert_ne!(dotted, dashed);
        assert!(dotted.starts_with("kyverno-runtime-web-v1-"));
        for pod in ["web.v1", "WEB", "", "web-", "a_b", &"x.".repeat(120), "é"] {
            let name = report_name(pod);
            assert!(is_dns1123_label(&name), "{pod:?} -> {name:?}");
        }
    }

    #[test]
    fn the_cut_never_leaves_a_double_dash_before_the_hash() {
        let prefix_room = MAX_REPORT_NAME_LEN - 1 - HASH_LEN - REPORT_NAME_PREFIX.len();
        let pod = format!("{}-{}", "a".repeat(prefix_room - 1), "b".repeat(30));
        let name = report_name(&pod);
        assert!(!name.contains("--"), "{name}");
        assert!(is_dns1123_label(&name));
    }
}
