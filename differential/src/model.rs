//! The specification's decision rule, executable: written from the text of
//! the design (`shared/spec/000`, cited by line) and #33, not from the
//! compiler's or the managers' code, so that a layer that drifts from the
//! text disagrees with it.
//!
//! Decisions taken where the text is silent, with the reason:
//!
//! - Several behaviors of one kind in one policy are one behavior whose
//!   lists are their union (the text unions "every matching policy's
//!   entries" across policies, spec line 103; a policy is no less a union
//!   of its own behaviors, and #33 made the product agree).
//! - An explicit deny beside `"*"` in one deny list stays an explicit deny
//!   (#33: `"*"` beside other deny values is accepted and each is enforced).
//! - A value the model's universe holds is always valid: invalid values
//!   are refused before any layer programs them, which is not what this
//!   model checks.

use std::collections::BTreeSet;
use std::net::IpAddr;

/// A policy's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Observes and reports what enforce would refuse.
    Monitor,
    /// Refuses, and reports what it refused.
    Enforce,
}

/// A behavior's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Egress destinations: addresses and CIDRs.
    Network,
    /// Opened file paths.
    Open,
    /// Executed file paths.
    Exec,
    /// Classified application protocols.
    Protocol,
    /// DNS question names (monitor only).
    Dns,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [
        Kind::Network,
        Kind::Open,
        Kind::Exec,
        Kind::Protocol,
        Kind::Dns,
    ];

    /// The spec's name of the kind.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Network => "network",
            Kind::Open => "open",
            Kind::Exec => "exec",
            Kind::Protocol => "protocol",
            Kind::Dns => "dns",
        }
    }
}

/// One behavior after CEL evaluation: its values as written, `"*"` kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Behavior {
    /// Its kind.
    pub kind: Kind,
    /// `allow.values`.
    pub allow: Vec<String>,
    /// `deny.values`, `"*"` included.
    pub deny: Vec<String>,
}

/// One policy as the model needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Its name (findings name it).
    pub name: String,
    /// Its mode.
    pub mode: Mode,
    /// Whether its selector selects the pod the event comes from.
    pub selects: bool,
    /// Its behaviors, in spec order.
    pub behaviors: Vec<Behavior>,
}

/// What a pod did.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A connection to an address.
    Connect(IpAddr),
    /// An open of a path.
    Open(String),
    /// An exec of a path.
    Exec(String),
    /// A flow the classifier named `protocol` (with the TLS ALPN, if any).
    Protocol {
        /// The classification: `ssh`, `tls`, `http/1.1`, ..., or
        /// `unclassified`.
        protocol: &'static str,
        /// The ALPN of a TLS ClientHello.
        alpn: Option<&'static str>,
    },
    /// A DNS question.
    Dns(String),
}

impl Event {
    /// The behavior kind that judges it.
    pub fn kind(&self) -> Kind {
        match self {
            Event::Connect(_) => Kind::Network,
            Event::Open(_) => Kind::Open,
            Event::Exec(_) => Kind::Exec,
            Event::Protocol { .. } => Kind::Protocol,
            Event::Dns(_) => Kind::Dns,
        }
    }
}

/// Which list decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// An explicit deny matched.
    Denied,
    /// Nothing allowed it under a default deny.
    DefaultDenied,
    /// A dns name outside the expected set (no deny matched).
    Unexpected,
    /// A dns name reported by `deny: ["*"]`, the discovery form.
    Discovered,
}

impl Decision {
    /// The decision as a Report's `decision` property carries it: only a
    /// list that refuses (or would) is named; a dns name reported by
    /// discovery or as unexpected carries none (spec line 320: a dns
    /// finding is advisory, never "would have been denied"), so both read
    /// as [`Decision::Unexpected`] here.
    pub fn reported(self) -> Decision {
        match self {
            Decision::Discovered => Decision::Unexpected,
            d => d,
        }
    }
}

/// One finding a drain must report.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Finding {
    /// The policy.
    pub policy: String,
    /// The behavior.
    pub kind: Kind,
    /// The kernel refused it (enforce) or not (monitor's would-deny, dns).
    pub enforced: bool,
    /// Which list decided.
    pub decision: Decision,
}

/// The model's answer for one event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the kernel refuses it.
    pub refused: bool,
    /// The findings, as a set (their order is not part of the rule).
    pub findings: BTreeSet<Finding>,
}

/// The cluster the pod runs in, as far as the rule reads it: each
/// Service's addresses (its ClusterIPs and its endpoints), and what the
/// pod's own DNS answers gave each domain.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// (namespace, name, addresses) of each Service.
    pub services: Vec<(String, String, Vec<IpAddr>)>,
    /// (name, addresses) of each domain the pod resolved, the answers
    /// unexpired; the name lowercase without a trailing dot. An address
    /// is answered for one name at most: the kernel knows a learned
    /// address by the latest name that gave it (docs/network-names.md).
    pub domains: Vec<(String, Vec<IpAddr>)>,
}

impl Cluster {
    /// The addresses of the Service a network value names, if it names
    /// one: `<name>.<namespace>.svc`, with or without `.cluster.local`.
    fn service(&self, value: &str) -> Option<&[IpAddr]> {
        let short = value.strip_suffix(".cluster.local").unwrap_or(value);
        let (name, namespace) = short.strip_suffix(".svc")?.split_once('.')?;
        self.services
            .iter()
            .find(|(ns, n, _)| ns == namespace && n == name)
            .map(|(_, _, a)| a.as_slice())
    }

    /// The addresses the pod's answers gave the domain a network value
    /// names, if it names a domain the pod resolved (compared lowercase
    /// without the trailing dot).
    fn domain(&self, value: &str) -> Option<&[IpAddr]> {
        let name = value.trim_end_matches('.').to_ascii_lowercase();
        self.domains
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a.as_slice())
    }
}

/// One policy's lists of one kind: its behaviors of that kind unioned.
#[derive(Clone, Debug, Default)]
struct Lists {
    allow: Vec<String>,
    deny: Vec<String>,
    star: bool,
}

fn lists(policy: &Policy, kind: Kind) -> Option<Lists> {
    let mut out: Option<Lists> = None;
    for b in policy.behaviors.iter().filter(|b| b.kind == kind) {
        let l = out.get_or_insert_with(Lists::default);
        l.allow.extend(b.allow.iter().cloned());
        for v in &b.deny {
            if v == "*" {
                l.star = true;
            } else {
                l.deny.push(v.clone());
            }
        }
    }
    out
}

/// Whether a network value names `dest`: the address itself, a CIDR
/// holding it (spec line 100: network values are addresses and CIDRs), a
/// Service one of whose addresses it is (#33: a Service value stands for
/// its ClusterIPs and endpoints), or a domain whose answer to the pod gave
/// it (#33: a domain stands for what the pod's own answers gave it).
fn network_matches(cluster: &Cluster, value: &str, dest: IpAddr) -> bool {
    if let Some(addrs) = cluster.service(value).or_else(|| cluster.domain(value)) {
        return addrs.contains(&dest);
    }
    let (addr, len) = match value.split_once('/') {
        Some((a, l)) => (a, l.parse::<u32>().ok()),
        None => (value, None),
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    match (addr, dest) {
        (IpAddr::V4(a), IpAddr::V4(d)) => {
            let len = len.unwrap_or(32).min(32);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(d) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(d)) => {
            let len = len.unwrap_or(128).min(128);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(d) & mask
        }
        _ => false,
    }
}

/// Whether a protocol token names a flow: `tls/<alpn>` needs that ALPN,
/// `tls` any TLS flow; `unclassified` is matched by no value (spec line
/// 100: only a default deny covers it).
fn protocol_matches(value: &str, protocol: &str, alpn: Option<&str>) -> bool {
    match value.strip_prefix("tls/") {
        Some(want) => protocol == "tls" && alpn == Some(want),
        None => value == protocol && protocol != "unclassified",
    }
}

/// A dns value in the matcher's form: lowercase, no trailing dot (spec
/// line 320).
fn dns_form(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a dns value names `qname`: equal, or a `*.` wildcard naming a
/// strict subdomain, never the apex nor a name that only ends like it
/// (spec line 320).
fn dns_matches(value: &str, qname: &str) -> bool {
    let value = dns_form(value);
    let qname = dns_form(qname);
    match value.strip_prefix("*.") {
        Some(apex) => qname.ends_with(&format!(".{apex}")),
        None => value == qname,
    }
}

/// Whether a value of `kind` names the event.
fn matches(cluster: &Cluster, kind: Kind, value: &str, event: &Event) -> bool {
    match (kind, event) {
        (Kind::Network, Event::Connect(dest)) => network_matches(cluster, value, *dest),
        // Exact absolute paths: the kernel keys on the resolved path.
        (Kind::Open, Event::Open(p)) | (Kind::Exec, Event::Exec(p)) => value == p,
        (Kind::Protocol, Event::Protocol { protocol, alpn }) => {
            protocol_matches(value, protocol, *alpn)
        }
        (Kind::Dns, Event::Dns(q)) => dns_matches(value, q),
        _ => false,
    }
}

/// One policy's verdict on an event, judged alone (what a monitor policy
/// reports, spec line 296): an explicit deny matches; under a default deny
/// anything no allow names matches; else nothing.
fn judge_alone(cluster: &Cluster, l: &Lists, kind: Kind, event: &Event) -> Option<Decision> {
    let any = |vs: &[String]| vs.iter().any(|v| matches(cluster, kind, v, event));
    if any(&l.deny) {
        Some(Decision::Denied)
    } else if any(&l.allow) {
        None
    } else if l.star {
        Some(Decision::DefaultDenied)
    } else {
        None
    }
}

/// The name matcher (spec lines 312-318): `deny: ["*"]` or a deny match
/// reports; else an empty expected set, or a match in it, does not; else
/// the name is unexpected. A behavior with nothing on either side is
/// inert.
fn judge_name(l: &Lists, event: &Event) -> Option<Decision> {
    if l.allow.is_empty() && l.deny.is_empty() && !l.star {
        return None;
    }
    if l.star {
        return Some(Decision::Discovered);
    }
    if l.deny
        .iter()
        .any(|v| matches(&Cluster::default(), Kind::Dns, v, event))
    {
        return Some(Decision::Denied);
    }
    if l.allow.is_empty()
        || l.allow
            .iter()
            .any(|v| matches(&Cluster::default(), Kind::Dns, v, event))
    {
        return None;
    }
    Some(Decision::Unexpected)
}

/// The rule for one event from a pod, over every policy (selecting or not).
///
/// Enforcement (spec line 174, #33): over the enforce policies that select
/// the pod and have a behavior of the event's kind, an explicit deny
/// anywhere refuses; else an explicit allow anywhere lets it through; else
/// a default deny anywhere refuses; else it goes through. The order of
/// policies does not matter. Monitor policies never refuse.
///
/// Findings (spec lines 294-296, 320; #33 point 5): each selecting monitor
/// policy whose own lists would refuse the event reports it (not
/// enforced); a refusal is reported by the enforce policies whose explicit
/// deny matched, or, when none did, by those whose default deny refused
/// it; a dns question is reported by each selecting policy whose name
/// matcher says so (never enforced).
pub fn decide(policies: &[Policy], event: &Event) -> Outcome {
    decide_in(&Cluster::default(), policies, event)
}

/// [`decide`] in `cluster` (its Services).
///
/// An exec opens its binary before it executes it, and the open is judged
/// by the open lists (README, "Open and exec": both backends refuse the
/// same operations; the specification's Known Gaps name the fallback that
/// did not, and this project closed it): an exec of `p` is first an open
/// of `p`, with that open's findings, and is refused there if the open
/// lists refuse it (the exec lists then never see it); else it is judged
/// by the exec lists.
pub fn decide_in(cluster: &Cluster, policies: &[Policy], event: &Event) -> Outcome {
    if let Event::Exec(p) = event {
        let open = decide_one(cluster, policies, &Event::Open(p.clone()));
        if open.refused {
            return open;
        }
        let mut exec = decide_one(cluster, policies, event);
        exec.findings.extend(open.findings);
        return exec;
    }
    decide_one(cluster, policies, event)
}

/// The rule for one event on one chain (the lists of its kind).
fn decide_one(cluster: &Cluster, policies: &[Policy], event: &Event) -> Outcome {
    let kind = event.kind();
    let mut out = Outcome::default();
    let selecting = policies.iter().filter(|p| p.selects);
    if kind == Kind::Dns {
        for p in selecting {
            if let Some(decision) = lists(p, kind).and_then(|l| judge_name(&l, event)) {
                out.findings.insert(Finding {
                    policy: p.name.clone(),
                    kind,
                    enforced: false,
                    decision,
                });
            }
        }
        return out;
    }
    let mut denied_by = Vec::new();
    let mut default_denied_by = Vec::new();
    let mut allowed = false;
    for p in selecting {
        let Some(l) = lists(p, kind) else { continue };
        match p.mode {
            Mode::Monitor => {
                if let Some(decision) = judge_alone(cluster, &l, kind, event) {
                    out.findings.insert(Finding {
                        policy: p.name.clone(),
                        kind,
                        enforced: false,
                        decision,
                    });
                }
            }
            Mode::Enforce => {
                let any = |vs: &[String]| vs.iter().any(|v| matches(cluster, kind, v, event));
                if any(&l.deny) {
                    denied_by.push(p.name.clone());
                } else if any(&l.allow) {
                    allowed = true;
                } else if l.star {
                    default_denied_by.push(p.name.clone());
                }
            }
        }
    }
    let (refused_by, decision) = if !denied_by.is_empty() {
        (denied_by, Decision::Denied)
    } else if !allowed && !default_denied_by.is_empty() {
        (default_denied_by, Decision::DefaultDenied)
    } else {
        (Vec::new(), Decision::Denied)
    };
    out.refused = !refused_by.is_empty();
    for policy in refused_by {
        out.findings.insert(Finding {
            policy,
            kind,
            enforced: true,
            decision,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(kind: Kind, allow: &[&str], deny: &[&str]) -> Behavior {
        Behavior {
            kind,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn p(name: &str, mode: Mode, behaviors: Vec<Behavior>) -> Policy {
        Policy {
            name: name.into(),
            mode,
            selects: true,
            behaviors,
        }
    }

    fn exec(path: &str) -> Event {
        Event::Exec(path.into())
    }

    #[test]
    fn the_precedence_is_explicit_deny_then_allow_then_default_deny() {
        use Mode::Enforce as E;
        // #33's example: A default deny, B allows curl, C denies it.
        let a = p("a", E, vec![b(Kind::Exec, &[], &["*"])]);
        let bb = p("b", E, vec![b(Kind::Exec, &["/usr/bin/curl"], &[])]);
        let c = p("c", E, vec![b(Kind::Exec, &[], &["/usr/bin/curl"])]);
        let o = decide(&[a.clone(), bb.clone(), c.clone()], &exec("/usr/bin/curl"));
        assert!(o.refused);
        assert_eq!(
            o.findings
                .iter()
                .map(|f| f.policy.as_str())
                .collect::<Vec<_>>(),
            ["c"],
            "only the explicit deny is blamed"
        );
        let o = decide(&[a.clone(), bb.clone()], &exec("/usr/bin/curl"));
        assert!(!o.refused, "an allow lifts another policy's default deny");
        let o = decide(&[bb, a], &exec("/bin/sh"));
        assert!(o.refused);
        assert_eq!(
            o.findings.iter().next().map(|f| f.decision),
            Some(Decision::DefaultDenied)
        );
    }

    #[test]
    fn an_explicit_deny_beside_a_star_wins_over_the_same_policys_allow() {
        let one = p(
            "one",
            Mode::Enforce,
            vec![
                b(Kind::Network, &["10.50.0.0/16"], &["*"]),
                b(Kind::Network, &[], &["10.50.0.9"]),
            ],
        );
        let at = |a: &str| Event::Connect(a.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])));
        assert!(decide(std::slice::from_ref(&one), &at("10.50.0.9")).refused);
        assert!(!decide(std::slice::from_ref(&one), &at("10.50.0.8")).refused);
        assert!(decide(&[one], &at("10.51.0.1")).refused);
    }

    #[test]
    fn a_domain_value_names_what_the_pods_answers_gave_it() {
        let cluster = Cluster {
            services: Vec::new(),
            domains: vec![("evil.example".into(), vec![IpAddr::from([10, 50, 0, 2])])],
        };
        let at = |a: [u8; 4]| Event::Connect(IpAddr::from(a));
        // Written as users do: case and a trailing dot.
        let enforce = p(
            "e",
            Mode::Enforce,
            vec![b(Kind::Network, &["10.0.0.0/8"], &["Evil.Example."])],
        );
        let monitor = p(
            "m",
            Mode::Monitor,
            vec![b(Kind::Network, &[], &["evil.example"])],
        );
        let o = decide_in(
            &cluster,
            &[enforce.clone(), monitor.clone()],
            &at([10, 50, 0, 2]),
        );
        assert!(o.refused, "the deny of the name beats the /8 allow");
        assert_eq!(o.findings.len(), 2, "{o:?}");
        let o = decide_in(&cluster, &[enforce, monitor], &at([10, 50, 0, 3]));
        assert!(
            !o.refused && o.findings.is_empty(),
            "no answer gave it: {o:?}"
        );
        // A name the pod never resolved names nothing.
        let unresolved = p(
            "u",
            Mode::Enforce,
            vec![b(Kind::Network, &[], &["good.example"])],
        );
        assert!(!decide_in(&cluster, &[unresolved], &at([10, 50, 0, 2])).refused);
    }

    #[test]
    fn monitor_never_refuses_and_reports_alone() {
        let m = p("m", Mode::Monitor, vec![b(Kind::Open, &[], &["*"])]);
        let e = p(
            "e",
            Mode::Enforce,
            vec![b(Kind::Open, &["/etc/hosts"], &[])],
        );
        let o = decide(&[m, e], &Event::Open("/etc/hosts".into()));
        assert!(!o.refused);
        assert_eq!(o.findings.len(), 1, "the monitor judges alone: {o:?}");
    }

    #[test]
    fn names_follow_the_name_matcher() {
        let d =
            |allow: &[&str], deny: &[&str]| p("d", Mode::Monitor, vec![b(Kind::Dns, allow, deny)]);
        let q = |n: &str| Event::Dns(n.into());
        let found = |pol: Policy, n: &str| {
            decide(&[pol], &q(n))
                .findings
                .into_iter()
                .next()
                .map(|f| f.decision)
        };
        assert_eq!(found(d(&["*.example.com"], &[]), "a.example.com"), None);
        assert_eq!(
            found(d(&["*.example.com"], &[]), "example.com"),
            Some(Decision::Unexpected)
        );
        assert_eq!(
            found(d(&["*.example.com"], &[]), "evilexample.com"),
            Some(Decision::Unexpected)
        );
        assert_eq!(
            found(d(&["example.com"], &["*"]), "example.com"),
            Some(Decision::Discovered)
        );
        assert_eq!(
            found(d(&["example.com"], &["example.com"]), "example.com"),
            Some(Decision::Denied)
        );
        assert_eq!(found(d(&[], &[]), "anything.org"), None, "inert");
        assert_eq!(found(d(&["EXAMPLE.com."], &[]), "example.com"), None);
    }

    #[test]
    fn protocols_match_by_token_and_alpn() {
        assert!(protocol_matches("tls", "tls", Some("h2")));
        assert!(protocol_matches("tls/h2", "tls", Some("h2")));
        assert!(!protocol_matches("tls/h2", "tls", None));
        assert!(!protocol_matches("unclassified", "unclassified", None));
    }
}
