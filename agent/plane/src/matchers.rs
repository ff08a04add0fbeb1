//! One policy's evaluated lists of one behavior, compiled for matching
//! events with the semantics the kernel applies: an explicit deny wins,
//! then an explicit allow, then the default deny (`deny: ["*"]`), else the
//! operation is unmatched and allowed. The dns behavior is the exception:
//! its allow list is the expected set ([`NameMatcher`], the advisory
//! finding).
//!
//! Values are parsed once, when a policy is (re)evaluated; a value the
//! parser refuses matches nothing here, as it programs nothing in the
//! kernel (the managers report it in TargetsValid / the rules conditions).

use kyverno_runtime_enforce::dns::{NameMatcher, NameVerdict};
use kyverno_runtime_enforce::openexec::BehaviorLists;
use kyverno_runtime_policy::compile::EvaluationResult;
use kyverno_runtime_policy::values::{
    parse_network, parse_protocol, BehaviorKind, FieldPath, NetworkTarget, ProtocolTarget,
    ProtocolToken,
};
use std::collections::HashSet;
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

/// The merged lists of every behavior of `kind` in an evaluation (a policy
/// may repeat a kind): allows and denies unioned, default deny if any says
/// so. `None` when the policy has no behavior of that kind.
pub fn merged_lists(result: &EvaluationResult, kind: BehaviorKind) -> Option<BehaviorLists> {
    let mut entries = result.behaviors.iter().filter(|b| b.kind == kind);
    let first = entries.next()?;
    let mut lists = BehaviorLists {
        field: FieldPath::spec()
            .field("behaviors")
            .index(first.index)
            .field(kind.as_str()),
        allow: Vec::new(),
        deny: Vec::new(),
    };
    let mut default_deny = false;
    for b in std::iter::once(first).chain(entries) {
        for v in &b.allow {
            if !lists.allow.contains(v) {
                lists.allow.push(v.clone());
            }
        }
        for v in &b.deny {
            if !lists.deny.contains(v) {
                lists.deny.push(v.clone());
            }
        }
        default_deny |= b.default_deny;
    }
    if default_deny {
        // "*" stands alone in a deny list.
        lists.deny = vec!["*".to_string()];
    }
    Some(lists)
}

fn is_default_deny(lists: &BehaviorLists) -> bool {
    lists.deny.len() == 1 && lists.deny[0] == "*"
}

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
        let default_deny = is_default_deny(lists);
        PathMatcher {
            deny: if default_deny {
                HashSet::new()
            } else {
                lists.deny.iter().cloned().collect()
            },
            allow: lists.allow.iter().cloned().collect(),
            default_deny,
        }
    }

    /// The verdict on an open or exec of `path` (empty: unresolved, which
    /// only a default deny refuses).
    pub fn judge(&self, path: &str) -> Verdict {
        if path.is_empty() {
            return if self.default_deny {
                Verdict::DefaultDenied
            } else {
                Verdict::Allowed
            };
        }
        if self.deny.contains(path) {
            Verdict::Denied
        } else if self.allow.contains(path) {
            Verdict::Allowed
        } else if self.default_deny {
            Verdict::DefaultDenied
        } else {
            Verdict::Allowed
        }
    }
}

/// Network: addresses and CIDRs of any length; Service and domain names
/// match an event that carries the name it was learned under.
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
            default_deny: is_default_deny(lists),
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
                        names.insert(d);
                    }
                    Ok(t @ NetworkTarget::Service { .. }) => {
                        names.insert(t.to_string());
                    }
                    Ok(NetworkTarget::Any) | Err(_) => {}
                }
            }
        }
        if m.default_deny {
            m.deny.clear();
            m.deny_names.clear();
        }
        m
    }

    /// The verdict on packets to `dest`, learned under `domain` if known.
    pub fn judge(&self, dest: IpAddr, domain: Option<&str>) -> Verdict {
        let named = |names: &HashSet<String>| domain.is_some_and(|d| names.contains(d));
        if self.deny.iter().any(|t| t.contains_addr(dest)) || named(&self.deny_names) {
            Verdict::Denied
        } else if self.allow.iter().any(|t| t.contains_addr(dest)) || named(&self.allow_names) {
            Verdict::Allowed
        } else if self.default_deny {
            Verdict::DefaultDenied
        } else {
            Verdict::Allowed
        }
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
            default_deny: is_default_deny(lists),
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

    /// The verdict on a flow classified `protocol`.
    pub fn judge(&self, protocol: &str, alpn: Option<&str>) -> Verdict {
        let any = |ts: &[ProtocolToken]| ts.iter().any(|t| token_matches(t, protocol, alpn));
        if !self.default_deny && any(&self.deny) {
            Verdict::Denied
        } else if any(&self.allow) {
            Verdict::Allowed
        } else if self.default_deny {
            Verdict::DefaultDenied
        } else {
            Verdict::Allowed
        }
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
        let lists = |k| merged_lists(result, k);
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
    #[case(&[], &["*"], "", Verdict::DefaultDenied)]
    #[case(&[], &["/bin/sh"], "", Verdict::Allowed)]
    fn paths(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] want: Verdict,
    ) {
        assert_eq!(
            PathMatcher::compile(&lists(allow, deny)).judge(target),
            want
        );
    }

    #[rstest]
    #[case(&[], &["10.0.0.0/8"], "10.1.2.3", None, Verdict::Denied)]
    #[case(&[], &["10.0.0.0/8"], "11.0.0.1", None, Verdict::Allowed)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.1", None, Verdict::Allowed)]
    #[case(&["127.0.0.1"], &["*"], "127.0.0.2", None, Verdict::DefaultDenied)]
    #[case(&[], &["fd00::/64"], "fd00::1", None, Verdict::Denied)]
    #[case(&[], &["fd00::/64"], "fd01::1", None, Verdict::Allowed)]
    #[case(&[], &["example.com"], "93.184.216.34", None, Verdict::Allowed)]
    #[case(&[], &["example.com"], "93.184.216.34", Some("example.com"), Verdict::Denied)]
    #[case(&["example.com"], &["*"], "93.184.216.34", Some("example.com"), Verdict::Allowed)]
    #[case(&[], &["not an address"], "10.0.0.1", None, Verdict::Allowed)]
    fn addresses(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] target: &str,
        #[case] domain: Option<&str>,
        #[case] want: Verdict,
    ) {
        let ip: IpAddr = target.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        assert_eq!(
            NetMatcher::compile(&lists(allow, deny)).judge(ip, domain),
            want
        );
    }

    #[rstest]
    #[case(&[], &["ssh"], "ssh", None, Verdict::Denied)]
    #[case(&[], &["ssh"], "tls", None, Verdict::Allowed)]
    #[case(&["tls/h2"], &["*"], "tls", Some("h2"), Verdict::Allowed)]
    #[case(&["tls/h2"], &["*"], "tls", Some("http/1.1"), Verdict::DefaultDenied)]
    #[case(&["tls"], &["*"], "tls", None, Verdict::Allowed)]
    #[case(&[], &["*"], "unclassified", None, Verdict::DefaultDenied)]
    #[case(&[], &["tls/h2"], "tls", None, Verdict::Allowed)]
    fn protocols(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] protocol: &str,
        #[case] alpn: Option<&str>,
        #[case] want: Verdict,
    ) {
        assert_eq!(
            ProtocolMatcher::compile(&lists(allow, deny)).judge(protocol, alpn),
            want
        );
    }

    #[test]
    fn repeated_behaviors_of_a_kind_union_and_a_default_deny_dominates() {
        use kyverno_runtime_policy::compile::EvaluatedBehavior;
        let b = |index, allow: &[&str], deny: &[&str], dd| EvaluatedBehavior {
            index,
            kind: BehaviorKind::Exec,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            default_deny: dd,
        };
        let r = EvaluationResult {
            behaviors: vec![b(0, &["/a"], &["/x"], false), b(3, &["/b"], &[], true)],
        };
        let l = merged_lists(&r, BehaviorKind::Exec).unwrap_or_else(|| lists(&[], &[]));
        assert_eq!(l.allow, ["/a", "/b"]);
        assert_eq!(l.deny, ["*"]);
        assert_eq!(l.field.as_str(), "spec.behaviors[0].exec");
        assert!(merged_lists(&r, BehaviorKind::Open).is_none());
    }
}
