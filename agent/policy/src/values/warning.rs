//! Values that parse but do not mean what they seem to: accepted (the API
//! server accepts them too), and named in a warning wherever the policy's
//! answer is read (`policy check`, the daemon's log and the spec
//! conditions of the status).

use super::error::shown;
use super::{
    parse_network, parse_path, BehaviorKind, Cidr, FieldPath, NetworkTarget, PathTarget, STAR,
};
use std::fmt;

/// A value that is accepted but cannot match as written, or was normalized.
///
/// Its message is one line, `<path>: "<value>" <note>`, the value quoted
/// and escaped as a [`ValueError`](super::ValueError)'s is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueWarning {
    /// The list's field (`spec.behaviors[1].network.deny`) or the value's.
    pub path: String,
    /// The value as written.
    pub value: String,
    /// What is the matter.
    pub note: Note,
}

impl fmt::Display for ValueWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {}", self.path, shown(&self.value), self.note)
    }
}

/// What a [`ValueWarning`] is about: one variant per rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Note {
    /// A CIDR with host bits set (`10.0.0.1/8`). Normalized: the API
    /// server's `isCIDR` admits it, and the Go original's `net.ParseCIDR`
    /// reads it as its network too, so refusing it would break policies
    /// both accept; but what is programmed is the network, which is rarely
    /// what a reader of `10.0.0.1/8` expects.
    #[error("has host bits set: it is the network {network}, which is what is programmed and matched; write {network}, or the one address alone")]
    HostBits {
        /// The network it denotes.
        network: Cidr,
    },
    /// An `exec` or `open` path through a link the kernel resolves before
    /// the hook sees the path (`/proc/self/exe`, `/dev/stdin`): the hooks
    /// compare the resolved path of the file, so this one never matches.
    #[error("goes through {link}, a link the kernel resolves before the exec or open hook sees the path (the hook compares the file's resolved path), so it never matches: name the file it leads to")]
    ResolvedLink {
        /// The link it goes through.
        link: &'static str,
    },
}

impl Note {
    /// A stable snake_case name for the variant, for metric labels and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Note::HostBits { .. } => "host_bits",
            Note::ResolvedLink { .. } => "resolved_link",
        }
    }
}

/// Paths that are links the kernel always resolves: `/proc/self` and
/// `/proc/thread-self` (to the caller's `/proc/<pid>`), `/dev/fd` and the
/// standard streams (to `/proc/self/fd`), and under `/proc/<pid>` the magic
/// links to a process's executable, directories and open files.
fn resolved_link(path: &str) -> Option<&'static str> {
    const FIXED: [&str; 6] = [
        "/proc/self",
        "/proc/thread-self",
        "/dev/fd",
        "/dev/stdin",
        "/dev/stdout",
        "/dev/stderr",
    ];
    let under = |p: &str, link: &str| {
        p.strip_prefix(link)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if let Some(link) = FIXED.iter().find(|l| under(path, l)) {
        return Some(link);
    }
    // /proc/<pid>/{exe,cwd,root}, /proc/<pid>/fd/<n>, /proc/<pid>/map_files/...
    // and the same under a thread, /proc/<pid>/task/<tid>/...
    fn pid_dir(r: &str) -> Option<&str> {
        let (pid, tail) = r.split_once('/')?;
        (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(tail)
    }
    let mut rest = pid_dir(path.strip_prefix("/proc/")?)?;
    if let Some(task) = rest.strip_prefix("task/") {
        rest = pid_dir(task)?;
    }
    [
        ("exe", "/proc/<pid>/exe"),
        ("cwd", "/proc/<pid>/cwd"),
        ("root", "/proc/<pid>/root"),
        ("fd", "/proc/<pid>/fd"),
        ("map_files", "/proc/<pid>/map_files"),
    ]
    .into_iter()
    .find(|(name, _)| under(rest, name))
    .map(|(_, link)| link)
}

/// The warning for one value of `kind` at `path`, if any. A value that
/// does not parse has none (its error says what is wrong).
pub fn warn_value(kind: BehaviorKind, value: &str, path: &FieldPath) -> Option<ValueWarning> {
    if value == STAR {
        return None;
    }
    let note = match kind {
        BehaviorKind::Network => match parse_network(value, path).ok()? {
            NetworkTarget::Cidr(c) if c.had_host_bits() => Note::HostBits { network: c },
            _ => return None,
        },
        BehaviorKind::Exec | BehaviorKind::Open => match parse_path(value, path).ok()? {
            PathTarget::Path(p) => Note::ResolvedLink {
                link: resolved_link(p.as_str())?,
            },
            PathTarget::Any => return None,
        },
        BehaviorKind::Protocol | BehaviorKind::Dns => return None,
    };
    Some(ValueWarning {
        path: path.as_str().to_string(),
        value: value.to_string(),
        note,
    })
}

/// The warnings of one list of `kind`, each at `path` (the list's field).
pub fn warn_values<S: AsRef<str>>(
    kind: BehaviorKind,
    values: &[S],
    path: &FieldPath,
) -> Vec<ValueWarning> {
    values
        .iter()
        .filter_map(|v| warn_value(kind, v.as_ref(), path))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn note(kind: BehaviorKind, value: &str) -> Option<String> {
        warn_value(kind, value, &FieldPath::spec()).map(|w| w.note.to_string())
    }

    #[rstest]
    #[case("/proc/self/exe", "/proc/self")]
    #[case("/proc/self", "/proc/self")]
    #[case("/proc/self/status", "/proc/self")]
    #[case("/proc/thread-self/comm", "/proc/thread-self")]
    #[case("/dev/stdin", "/dev/stdin")]
    #[case("/dev/fd/0", "/dev/fd")]
    #[case("/proc/1/exe", "/proc/<pid>/exe")]
    #[case("/proc/42/root/etc/shadow", "/proc/<pid>/root")]
    #[case("/proc/42/fd/3", "/proc/<pid>/fd")]
    #[case("/proc/42/task/43/cwd", "/proc/<pid>/cwd")]
    #[case("/proc/42/map_files/7f-80", "/proc/<pid>/map_files")]
    fn a_path_through_a_resolved_link_is_named(#[case] path: &str, #[case] link: &str) {
        for kind in [BehaviorKind::Exec, BehaviorKind::Open] {
            let got = note(kind, path).unwrap_or_default();
            assert!(
                got.starts_with(&format!("goes through {link}, ")),
                "{path}: {got}"
            );
        }
    }

    #[rstest]
    #[case("/proc/selfish")]
    #[case("/proc/1/status")]
    #[case("/proc/1/exec")]
    #[case("/proc/sys/kernel/hostname")]
    #[case("/dev/fdx")]
    #[case("/usr/bin/curl")]
    #[case("*")]
    #[case("relative")]
    fn other_paths_are_quiet(#[case] path: &str) {
        assert_eq!(note(BehaviorKind::Open, path), None, "{path}");
    }

    #[test]
    fn host_bits_are_named_with_the_network() {
        let w = warn_value(
            BehaviorKind::Network,
            "10.0.0.1/8",
            &FieldPath::spec().field("deny"),
        );
        assert_eq!(
            w.map(|w| w.to_string()).as_deref(),
            Some("spec.deny: \"10.0.0.1/8\" has host bits set: it is the network 10.0.0.0/8, which is what is programmed and matched; write 10.0.0.0/8, or the one address alone")
        );
        for quiet in ["10.0.0.0/8", "10.0.0.1", "example.com", "*", "10.0.0.300"] {
            assert_eq!(note(BehaviorKind::Network, quiet), None, "{quiet}");
        }
        assert!(note(BehaviorKind::Network, "2001:db8::1/32").is_some());
        assert_eq!(note(BehaviorKind::Dns, "10.0.0.1/8"), None);
    }

    #[test]
    fn a_list_warns_per_value() {
        let w = warn_values(
            BehaviorKind::Exec,
            &["/bin/sh", "/proc/self/exe", "/dev/stdout"],
            &FieldPath::spec(),
        );
        assert_eq!(
            w.iter().map(|w| w.value.as_str()).collect::<Vec<_>>(),
            ["/proc/self/exe", "/dev/stdout"]
        );
        assert_eq!(w[0].note.label(), "resolved_link");
    }
}
