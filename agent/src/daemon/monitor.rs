//! Matching what the kernel counted against one policy's lists, with the
//! semantics the kernel applies: an explicit deny wins, then an explicit
//! allow, then the default deny (`deny: ["*"]`), else the operation is
//! unmatched and allowed.
//!
//! The kernel merges every bound policy into one decision; reporting needs
//! to know which policy (an enforce finding) or which policy would have
//! (a monitor finding), so each policy's own lists are judged here.

use kyverno_runtime_enforce::openexec::BehaviorLists;
use kyverno_runtime_policy::values::{parse_network, FieldPath, NetworkTarget};
use std::net::IpAddr;

/// One policy's verdict on one observed target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An explicit allow matched, or nothing matched and no default deny.
    Allowed,
    /// An explicit deny matched.
    Denied,
    /// Nothing matched under a default deny.
    DefaultDenied,
}

impl Verdict {
    /// Whether the policy denies (or would deny) the target.
    pub fn denies(self) -> bool {
        self != Verdict::Allowed
    }
}

/// The precedence over one policy's lists, for any value matcher.
pub fn judge(lists: &BehaviorLists, matches: impl Fn(&str) -> bool) -> Verdict {
    let default_deny = lists.deny.len() == 1 && lists.deny[0] == "*";
    if !default_deny && lists.deny.iter().any(|v| matches(v)) {
        return Verdict::Denied;
    }
    if lists.allow.iter().any(|v| matches(v)) {
        return Verdict::Allowed;
    }
    if default_deny {
        Verdict::DefaultDenied
    } else {
        Verdict::Allowed
    }
}

/// An open or exec of `path`: values are exact absolute paths, as the
/// kernel's keys are.
pub fn judge_path(lists: &BehaviorLists, path: &str) -> Verdict {
    judge(lists, |v| v == path)
}

/// A connection to `ip`: a value is an address or a CIDR of any length.
/// Names (Services, domains) are not resolved yet, so they match nothing,
/// as in the kernel (where they are rejected, and TargetsValid says so).
pub fn judge_ip(lists: &BehaviorLists, ip: IpAddr) -> Verdict {
    let field = FieldPath::spec();
    judge(lists, |v| match parse_network(v, &field) {
        Ok(t @ (NetworkTarget::Ip(_) | NetworkTarget::Cidr(_))) => t.contains_addr(ip),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn lists(allow: &[&str], deny: &[&str]) -> BehaviorLists {
        BehaviorLists {
            field: FieldPath::spec(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[rstest]
    #[case(&[], &["/bin/sh"], "/bin/sh", Verdict::Denied)]
    #[case(&[], &["/bin/sh"], "/bin/bash", Verdict::Allowed)]
    #[case(&["/bin/sh"], &["*"], "/bin/sh", Verdict::Allowed)]
    #[case(&["/bin/sh"], &["*"], "/bin/bash", Verdict::DefaultDenied)]
    #[case(&["/bin/sh"], &["/bin/sh"], "/bin/sh", Verdict::Denied)]
    #[case(&[], &["/bin"], "/bin/sh", Verdict::Allowed)]
    fn paths(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] want: Verdict,
    ) {
        assert_eq!(judge_path(&lists(allow, deny), target), want);
    }

    #[rstest]
    #[case(&[], &["10.0.0.0/8"], "10.1.2.3", Verdict::Denied)]
    #[case(&[], &["10.0.0.0/8"], "11.0.0.1", Verdict::Allowed)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.1", Verdict::Allowed)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.2", Verdict::DefaultDenied)]
    #[case(&[], &["fd00::/64"], "fd00::1", Verdict::Denied)]
    #[case(&[], &["example.com"], "93.184.216.34", Verdict::Allowed)]
    #[case(&[], &["not an address"], "10.0.0.1", Verdict::Allowed)]
    fn addresses(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] want: Verdict,
    ) {
        let ip: IpAddr = target.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        assert_eq!(judge_ip(&lists(allow, deny), ip), want);
    }
}
