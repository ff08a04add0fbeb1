//! The name of a pod's Report (`kyverno-runtime-<podName>`) and of a
//! controller's (`kyverno-runtime-<kind>.<name>`).

use crate::autogen::ControllerKind;
use sha2::{Digest, Sha256};

/// What every Report name starts with.
pub const REPORT_NAME_PREFIX: &str = "kyverno-runtime-";

/// The longest Report name: a DNS-1123 label. A Report is a custom resource,
/// whose names may be subdomains of up to 253 characters, but a label is
/// what can also be used as a label value (to select the Report of a pod)
/// and what the original writer produced.
pub const MAX_REPORT_NAME_LEN: usize = 63;

/// Hex digits of the pod name's SHA-256 in a shortened name: 64 bits, so
/// that no one can search out a second pod name with the same suffix (32
/// bits, as before issue 38, took minutes) and take its Report.
const HASH_LEN: usize = 16;

/// The Report name for a pod: `kyverno-runtime-<podName>` when that is a
/// DNS-1123 label of at most 63 characters that does not itself end the
/// way a shortened name does (`-` and 16 hex digits).
///
/// Otherwise (a long pod name, one with dots, which a subdomain allows and
/// a label does not, or one shaped like a shortened name) the name is
/// mapped to `[a-z0-9-]`, cut so that `-<16 hex digits>` of the pod name's
/// SHA-256 fits, and suffixed with them. So the mapping is injective as far
/// as SHA-256 is: a kept name never looks shortened (issue 38: the pod
/// `web-v1-<hash of "web.v1">` took `web.v1`'s Report), and two shortened
/// names are equal only if their pod names' hashes are. The suffix is
/// computed from the pod name alone, so the name is the same on every
/// flush and every node.
pub fn report_name(pod_name: &str) -> String {
    let mapped = map_to_label(pod_name);
    let altered = mapped != pod_name;
    bounded(format!("{REPORT_NAME_PREFIX}{mapped}"), altered, pod_name)
}

/// The Report name for a controller's roll-up:
/// `kyverno-runtime-<kind>.<name>` (`kyverno-runtime-deployment.web`),
/// shortened and hash-suffixed as [`report_name`] does when it would be
/// longer than 63 characters or the name had to be mapped.
///
/// The dot is what keeps it apart from every pod's Report: a pod Report's
/// name never has one (pod names are mapped to `[a-z0-9-]`), so a pod
/// named `deployment-web` cannot take the Deployment `web`'s Report. The
/// shortened form keeps the dot too: the kind and the dot come first and
/// are never cut. The hash is over the kind and the name, so the same
/// controller gets the same name on every node.
pub fn controller_report_name(kind: ControllerKind, name: &str) -> String {
    let mapped = map_to_label(name);
    let altered = mapped != name;
    let kind_lower = kind.as_str().to_ascii_lowercase();
    bounded(
        format!("{REPORT_NAME_PREFIX}{kind_lower}.{mapped}"),
        altered,
        &format!("{}/{name}", kind.as_str()),
    )
}

/// `name` mapped to `[a-z0-9-]`: lowercase kept, uppercase lowered, the
/// rest (dots included) a dash.
fn map_to_label(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// Whether `name` ends as a shortened name does: `-` and [`HASH_LEN`]
/// lowercase hex digits.
fn looks_shortened(name: &str) -> bool {
    let Some(cut) = name.len().checked_sub(HASH_LEN + 1) else {
        return false;
    };
    name.get(cut..).is_some_and(|tail| {
        tail.starts_with('-')
            && tail[1..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `full` if it can stand as is; otherwise cut to leave room for `-` and
/// [`HASH_LEN`] hex digits of `hashed`'s SHA-256, and suffixed with them.
fn bounded(full: String, altered: bool, hashed: &str) -> String {
    if !altered
        && full.len() <= MAX_REPORT_NAME_LEN
        && full.ends_with(|c: char| c.is_ascii_alphanumeric())
        && !looks_shortened(&full)
    {
        return full;
    }
    let digest = Sha256::digest(hashed.as_bytes());
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
    let head = head.trim_end_matches(['-', '.']);
    format!("{head}-{hash}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::finding::{is_dns1123_label, is_dns1123_subdomain};

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
        // The first 16 hex digits of sha256(pod), computed independently with
        // Python's hashlib; a change would orphan every shortened Report.
        let pod = "checkout-service-canary-7d9f8b6c5d-x2x9z-with-a-long-suffix";
        assert_eq!(
            report_name(pod),
            "kyverno-runtime-checkout-service-canary-7d9f8b-20de816b1018ac9e"
        );
        assert_eq!(report_name(pod), report_name(pod));
    }

    /// Issue 38: pairs of pod names built to collide. Each kept name that
    /// is shaped like a shortened one is shortened itself, so no pod can
    /// take another's Report by spelling out its shortened name.
    #[test]
    fn names_built_to_collide_get_two_reports() {
        let shortened = |pod: &str| report_name(pod)[REPORT_NAME_PREFIX.len()..].to_owned();
        let mut pairs: Vec<(String, String)> = Vec::new();
        for pod in [
            "web.v1",
            "WEB",
            "a_b",
            &"x".repeat(70),
            &format!("{}.y", "x".repeat(40)),
        ] {
            // The pod whose own name is exactly what `pod` maps to.
            pairs.push((pod.to_owned(), shortened(pod)));
        }
        // A name with the suffix shape but another hash, and one without
        // the dash.
        pairs.push(("web-v1".into(), format!("web-v1-{}", "0".repeat(HASH_LEN))));
        pairs.push(("web-v1".into(), format!("web-v1{}", "a".repeat(HASH_LEN))));
        for (a, b) in &pairs {
            assert_ne!(a, b);
            assert_ne!(report_name(a), report_name(b), "{a:?} and {b:?}");
            assert!(is_dns1123_label(&report_name(b)), "{b:?}");
        }
        // Ordinary names are kept, generated suffixes of other shapes too.
        for pod in ["web-7d9f8b6c5d-x2x9z", "db-0", "job-28391760-abcde"] {
            assert_eq!(report_name(pod), format!("{REPORT_NAME_PREFIX}{pod}"));
        }
        // The same for controllers.
        let c = controller_report_name(ControllerKind::Deployment, "web.v1");
        let tail = c
            .strip_prefix("kyverno-runtime-deployment.")
            .expect("the kind and dot are kept");
        assert_ne!(controller_report_name(ControllerKind::Deployment, tail), c);
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

    #[test]
    fn controller_reports_are_named_by_kind_and_name() {
        assert_eq!(
            controller_report_name(ControllerKind::Deployment, "web"),
            "kyverno-runtime-deployment.web"
        );
        assert_eq!(
            controller_report_name(ControllerKind::CronJob, "nightly"),
            "kyverno-runtime-cronjob.nightly"
        );
        // Kinds tell apart controllers of the same name.
        assert_ne!(
            controller_report_name(ControllerKind::Job, "x"),
            controller_report_name(ControllerKind::CronJob, "x")
        );
    }

    #[test]
    fn a_pod_report_never_takes_a_controller_report_name() {
        for (kind, name) in [
            (ControllerKind::Deployment, "web"),
            (ControllerKind::StatefulSet, &"s".repeat(70)),
            (ControllerKind::Job, "a.b"),
        ] {
            let controller = controller_report_name(kind, name);
            assert!(controller.contains('.'), "{controller}");
            // The pod whose name spells out the controller's Report.
            let lookalike = format!("{}-{name}", kind.as_str().to_ascii_lowercase());
            assert!(!report_name(&lookalike).contains('.'));
            assert!(!report_name(&format!("{}.{name}", kind.as_str())).contains('.'));
        }
    }

    #[test]
    fn long_and_dotted_controller_names_are_hashed_and_keep_the_kind() {
        let long = "a".repeat(80);
        let name = controller_report_name(ControllerKind::StatefulSet, &long);
        assert_eq!(name.len(), 63, "{name}");
        assert!(
            name.starts_with("kyverno-runtime-statefulset.aaaa"),
            "{name}"
        );
        assert_ne!(
            name,
            controller_report_name(ControllerKind::StatefulSet, &"a".repeat(81))
        );
        assert_ne!(
            name,
            controller_report_name(ControllerKind::DaemonSet, &long)[..],
            "the hash covers the kind"
        );
        let dotted = controller_report_name(ControllerKind::Deployment, "web.v1");
        assert!(
            dotted.starts_with("kyverno-runtime-deployment.web-v1-"),
            "{dotted}"
        );
        assert_ne!(
            dotted,
            controller_report_name(ControllerKind::Deployment, "web-v1")
        );
        for n in [long.as_str(), "web.v1", "x", &"ab.".repeat(80)] {
            for kind in ControllerKind::ALL {
                let name = controller_report_name(kind, n);
                assert!(name.len() <= MAX_REPORT_NAME_LEN, "{name}");
                assert!(is_dns1123_subdomain(&name), "{name}");
                assert!(!name.contains("-.") && !name.contains(".-"), "{name}");
            }
        }
    }
}
