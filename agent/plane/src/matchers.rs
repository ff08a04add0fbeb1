//! One policy's evaluated lists of one behavior, compiled for matching
//! events. Each matcher says which of the policy's lists match an event
//! ([`Matches`]); what that decides is the specification's rule, defined
//! once in [`kyverno_runtime_policy::rule`]: an explicit deny wins (also
//! beside a default deny), then an explicit allow, then the default deny
//! (`"*"` in deny), else the operation is unmatched and allowed. The dns
//! behavior is the exception: its allow list is the expected set
//! ([`NameMatcher`], the advisory finding).
//!
//! Values are parsed once, when a policy is (re)evaluated; a value the
//! parser refuses matches nothing here, as it programs nothing in the
//! kernel (the managers report it in TargetsValid / the rules conditions).

use kyverno_runtime_enforce::dns::{NameMatcher, NameVerdict};
use kyverno_runtime_enforce::openexec::BehaviorLists;
use kyverno_runtime_policy::compile::EvaluationResult;
use kyverno_runtime_policy::rule::{decide, Decision, Matches};
use kyverno_runtime_policy::values::{
    parse_network, parse_protocol, BehaviorKind, NetworkTarget, ProtocolTarget, ProtocolToken,
};
use std::collections::HashSet;
use std::net::IpAddr;

/// Open and exec: exact absolute paths, as the kernel's keys are.
#[derive(Clone, Debug, Default)]
pub struct PathMatcher {
    deny: HashSet<String>,
    allow: HashSet<String>,
    default_deny: bool,
}

impl PathMatcher {
    /// Compiles a behavior's lists.
    pub fn compile(lists: &BehaviorLists) -> Self {
        PathMatcher {
            deny: lists.explicit_denies().map(str::to_owned).collect(),
            allow: lists.allow.iter().cloned().collect(),
            default_deny: lists.default_deny(),
        }
    }

    /// Which lists match an open or exec of `path` (empty: unresolved,
    /// which matches no entry, so only a default deny refuses it).
    pub fn matches(&self, path: &str) -> Matches {
        let known = !path.is_empty();
        Matches {
            deny: known && self.deny.contains(path),
            allow: known && self.allow.contains(path),
            default_deny: self.default_deny,
        }
    }

    /// The decision on an open or exec of `path`, this policy alone.
    pub fn judge(&self, path: &str) -> Decision {
        decide([self.matches(path)])
    }
}

/// Network: addresses and CIDRs of any length; Service and domain values
/// match an event whose destination is known under that name for the pod
/// (a Service's ClusterIPs and endpoints, a domain's addresses from the
/// pod's own DNS answers: the addresses the kernel holds for the value).
#[derive(Clone, Debug, Default)]
pub struct NetMatcher {
    deny: Vec<NetworkTarget>,
    allow: Vec<NetworkTarget>,
    deny_names: HashSet<String>,
    allow_names: HashSet<String>,
    default_deny: bool,
}

impl NetMatcher {
    /// Compiles a behavior's lists.
    pub fn compile(lists: &BehaviorLists) -> Self {
        let mut m = NetMatcher {
            default_deny: lists.default_deny(),
            ..NetMatcher::default()
        };
        let field = &lists.field;
        for (values, addrs, names) in [
            (&lists.deny, &mut m.deny, &mut m.deny_names),
            (&lists.allow, &mut m.allow, &mut m.allow_names),
        ] {
            for v in values {
                match parse_network(v, field) {
                    Ok(t @ (NetworkTarget::Ip(_) | NetworkTarget::Cidr(_))) => addrs.push(t),
                    Ok(NetworkTarget::Domain(d)) => {
                        // As the kernel's names are: lowercase, no
                        // trailing dot.
                        names.insert(d.trim_end_matches('.').to_ascii_lowercase());
                    }
                    Ok(t @ NetworkTarget::Service { .. }) => {
                        names.insert(t.to_string());
                    }
                    Ok(NetworkTarget::Any) | Err(_) => {}
                }
            }
        }
        m
    }

    /// Which lists match packets to `dest`, known under `names` (Service
    /// and domain values, see [`crate::event::Facts::Net`]).
    pub fn matches(&self, dest: IpAddr, names: &[String]) -> Matches {
        let named = |list: &HashSet<String>| names.iter().any(|n| list.contains(n));
        Matches {
            deny: self.deny.iter().any(|t| t.contains_addr(dest)) || named(&self.deny_names),
            allow: self.allow.iter().any(|t| t.contains_addr(dest)) || named(&self.allow_names),
            default_deny: self.default_deny,
        }
    }

    /// Which of `names` (the destination's Service and domain names) this
    /// policy's values name, on either list: what a finding says the
    /// destination matched as.
    pub fn named(&self, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|n| self.deny_names.contains(*n) || self.allow_names.contains(*n))
            .cloned()
            .collect()
    }

    /// The decision on packets to `dest`, this policy alone.
    pub fn judge(&self, dest: IpAddr, names: &[String]) -> Decision {
        decide([self.matches(dest, names)])
    }
}

/// Protocol tokens, `tls/<alpn>` included.
#[derive(Clone, Debug, Default)]
pub struct ProtocolMatcher {
    deny: Vec<ProtocolToken>,
    allow: Vec<ProtocolToken>,
    default_deny: bool,
}

/// Whether a flow classified `protocol` (with `alpn`) is what `token`
/// names: `tls/<alpn>` needs that ALPN, `tls` any.
pub fn token_matches(token: &ProtocolToken, protocol: &str, alpn: Option<&str>) -> bool {
    match token {
        ProtocolToken::Tls { alpn: Some(want) } => protocol == "tls" && alpn == Some(want.as_str()),
        other => protocol == other.to_string(),
    }
}

impl ProtocolMatcher {
    /// Compiles a behavior's lists.
    pub fn compile(lists: &BehaviorLists) -> Self {
        let mut m = ProtocolMatcher {
            default_deny: lists.default_deny(),
            ..ProtocolMatcher::default()
        };
        for (values, out) in [(&lists.deny, &mut m.deny), (&lists.allow, &mut m.allow)] {
            for v in values {
                if let Ok(ProtocolTarget::Token(t)) = parse_protocol(v, &lists.field) {
                    out.push(t);
                }
            }
        }
        m
    }

    /// Which lists match a flow classified `protocol` (with `alpn`).
    pub fn matches(&self, protocol: &str, alpn: Option<&str>) -> Matches {
        let any = |ts: &[ProtocolToken]| ts.iter().any(|t| token_matches(t, protocol, alpn));
        Matches {
            deny: any(&self.deny),
            allow: any(&self.allow),
            default_deny: self.default_deny,
        }
    }

    /// The decision on a flow classified `protocol`, this policy alone.
    pub fn judge(&self, protocol: &str, alpn: Option<&str>) -> Decision {
        decide([self.matches(protocol, alpn)])
    }
}

/// Every behavior of one policy, compiled.
#[derive(Clone, Debug, Default)]
pub struct Behaviors {
    /// The open behavior.
    pub open: Option<PathMatcher>,
    /// The exec behavior.
    pub exec: Option<PathMatcher>,
    /// The network behavior.
    pub net: Option<NetMatcher>,
    /// The protocol behavior.
    pub protocol: Option<ProtocolMatcher>,
    /// The dns behavior (`None` also when it is inert).
    pub dns: Option<NameMatcher>,
}

impl Behaviors {
    /// Compiles every behavior of an evaluation.
    pub fn compile(result: &EvaluationResult) -> Self {
        let lists = |k| BehaviorLists::merge(result, k);
        Behaviors {
            open: lists(BehaviorKind::Open).map(|l| PathMatcher::compile(&l)),
            exec: lists(BehaviorKind::Exec).map(|l| PathMatcher::compile(&l)),
            net: lists(BehaviorKind::Network).map(|l| NetMatcher::compile(&l)),
            protocol: lists(BehaviorKind::Protocol).map(|l| ProtocolMatcher::compile(&l)),
            dns: lists(BehaviorKind::Dns).and_then(|l| NameMatcher::compile(&l).0),
        }
    }
}

/// The dns verdict, re-exported for the monitor.
pub type DnsVerdict = NameVerdict;

#[cfg(test)]
mod tests {
    use super::*;
    use kyverno_runtime_policy::values::FieldPath;
    use rstest::rstest;

    fn lists(allow: &[&str], deny: &[&str]) -> BehaviorLists {
        BehaviorLists {
            field: FieldPath::spec(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[rstest]
    #[case(&[], &["/bin/sh"], "/bin/sh", Decision::Denied)]
    #[case(&[], &["/bin/sh"], "/bin/bash", Decision::Unmatched)]
    #[case(&["/bin/sh"], &["*"], "/bin/sh", Decision::Allowed)]
    #[case(&["/bin/sh"], &["*"], "/bin/bash", Decision::DefaultDenied)]
    #[case(&["/bin/sh"], &["/bin/sh"], "/bin/sh", Decision::Denied)]
    #[case(&[], &["/bin"], "/bin/sh", Decision::Unmatched)]
    #[case(&[], &["*"], "", Decision::DefaultDenied)]
    #[case(&[], &["/bin/sh"], "", Decision::Unmatched)]
    #[case(&["/bin/sh"], &["*", "/bin/sh"], "/bin/sh", Decision::Denied)]
    #[case(&["/bin/bash"], &["*", "/bin/sh"], "/bin/sh", Decision::Denied)]
    #[case(&["/bin/bash"], &["/bin/sh", "*"], "/bin/bash", Decision::Allowed)]
    #[case(&["/bin/bash"], &["*", "/bin/sh"], "/bin/ls", Decision::DefaultDenied)]
    fn paths(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] want: Decision,
    ) {
        assert_eq!(
            PathMatcher::compile(&lists(allow, deny)).judge(target),
            want
        );
    }

    #[rstest]
    #[case(&[], &["10.0.0.0/8"], "10.1.2.3", None, Decision::Denied)]
    #[case(&[], &["10.0.0.0/8"], "11.0.0.1", None, Decision::Unmatched)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.1", None, Decision::Allowed)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.2", None, Decision::DefaultDenied)]
    #[case(&[], &["fd00::/64"], "fd00::1", None, Decision::Denied)]
    #[case(&[], &["fd00::/64"], "fd01::1", None, Decision::Unmatched)]
    #[case(&[], &["example.com"], "93.184.216.34", None, Decision::Unmatched)]
    #[case(&[], &["example.com"], "93.184.216.34", Some("example.com"), Decision::Denied)]
    #[case(&["example.com"], &["*"], "93.184.216.34", Some("example.com"), Decision::Allowed)]
    #[case(&[], &["not an address"], "10.0.0.1", None, Decision::Unmatched)]
    #[case(&["10.50.0.0/16"], &["*", "10.50.0.9"], "10.50.0.9", None, Decision::Denied)]
    #[case(&["10.50.0.0/16"], &["*", "10.50.0.9"], "10.50.0.8", None, Decision::Allowed)]
    #[case(&["10.50.0.0/16"], &["*", "10.50.0.9"], "10.51.0.1", None, Decision::DefaultDenied)]
    #[case(&["fd00::/64"], &["*", "fd00::9"], "fd00::9", None, Decision::Denied)]
    #[case(&["fd00::/64"], &["*", "fd00::9"], "fd00::8", None, Decision::Allowed)]
    #[case(&["fd00::/64"], &["*", "example.com"], "fd00::8", Some("example.com"), Decision::Denied)]
    #[case(&["api.prod.svc"], &["*"], "10.96.0.10", Some("api.prod.svc"), Decision::Allowed)]
    #[case(&["api.prod.svc.cluster.local"], &["*"], "10.96.0.10", Some("api.prod.svc"), Decision::Allowed)]
    #[case(&["api.prod.svc"], &["*"], "10.96.0.10", None, Decision::DefaultDenied)]
    #[case(&[], &["GitHub.COM."], "140.82.112.3", Some("github.com"), Decision::Denied)]
    fn addresses(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] domain: Option<&str>,
        #[case] want: Decision,
    ) {
        let ip: IpAddr = target.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        assert_eq!(
            NetMatcher::compile(&lists(allow, deny))
                .judge(ip, &Vec::from_iter(domain.map(String::from))),
            want
        );
    }

    #[rstest]
    #[case(&[], &["ssh"], "ssh", None, Decision::Denied)]
    #[case(&[], &["ssh"], "tls", None, Decision::Unmatched)]
    #[case(&["tls/h2"], &["*"], "tls", Some("h2"), Decision::Allowed)]
    #[case(&["tls/h2"], &["*"], "tls", Some("http/1.1"), Decision::DefaultDenied)]
    #[case(&["tls"], &["*"], "tls", None, Decision::Allowed)]
    #[case(&[], &["*"], "unclassified", None, Decision::DefaultDenied)]
    #[case(&[], &["tls/h2"], "tls", None, Decision::Unmatched)]
    #[case(&["tls"], &["*", "tls/h2"], "tls", Some("h2"), Decision::Denied)]
    #[case(&["tls"], &["*", "tls/h2"], "tls", Some("http/1.1"), Decision::Allowed)]
    #[case(&["tls"], &["*", "ssh"], "ssh", None, Decision::Denied)]
    #[case(&["tls"], &["*", "ssh"], "quic", None, Decision::DefaultDenied)]
    fn protocols(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] protocol: &str,
        #[case] alpn: Option<&str>,
        #[case] want: Decision,
    ) {
        assert_eq!(
            ProtocolMatcher::compile(&lists(allow, deny)).judge(protocol, alpn),
            want
        );
    }

    #[test]
    fn repeated_behaviors_of_a_kind_union_and_keep_explicit_denies() {
        use kyverno_runtime_policy::compile::EvaluatedBehavior;
        let b = |index, allow: &[&str], deny: &[&str], dd| EvaluatedBehavior {
            index,
            kind: BehaviorKind::Exec,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            default_deny: dd,
        };
        let r = EvaluationResult {
            behaviors: vec![
                b(0, &["/a"], &["/x"], false),
                b(3, &["/b", "/x"], &[], true),
            ],
        };
        let l = BehaviorLists::merge(&r, BehaviorKind::Exec).unwrap_or_else(|| lists(&[], &[]));
        assert_eq!(l.allow, ["/a", "/b", "/x"]);
        assert_eq!(l.deny, ["*", "/x"]);
        assert_eq!(l.field.as_str(), "spec.behaviors[0].exec");
        assert!(BehaviorLists::merge(&r, BehaviorKind::Open).is_none());
        // The explicit deny of the first behavior wins over the second's
        // allow of the same path, under the second's default deny.
        let m = PathMatcher::compile(&l);
        assert_eq!(m.judge("/x"), Decision::Denied);
        assert_eq!(m.judge("/a"), Decision::Allowed);
        assert_eq!(m.judge("/c"), Decision::DefaultDenied);
    }
}
