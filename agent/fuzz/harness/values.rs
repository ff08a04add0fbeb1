//! Fuzzes each behavior's value parser (`kyverno_runtime_policy::values`):
//! the first byte picks the parser, the rest is the value.
//!
//! Invariants beyond "no panic":
//! - a value that parses renders (`Display`, the normalized form) to text
//!   that parses to an equal target, whose rendering is the same text;
//! - a target matches what it names: an address or CIDR contains its own
//!   address, a DNS name matches itself, `*.<name>` matches a subdomain of
//!   `<name>` and not `<name>` itself;
//! - hostname validation is idempotent;
//! - a refusal names the field it was given and is one line.

use kyverno_runtime_policy::values::{
    parse_dns, parse_network, parse_network_in, parse_path, parse_protocol, validate_hostname,
    BehaviorKind, DnsPattern, FieldPath, NetworkTarget, RuleSide, Underscore, ValueError,
};
use std::fmt::{Debug, Display};

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(value) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 7 {
        0 => {
            let path = FieldPath::values(0, BehaviorKind::Network, RuleSide::Deny);
            if let Some(t) = round_trip(value, &path, parse_network) {
                network_contains_itself(&t);
            }
        }
        1 => {
            // A cluster domain other than the default.
            let path = FieldPath::values(1, BehaviorKind::Network, RuleSide::Allow);
            let parse = |v: &str, p: &FieldPath| parse_network_in(v, p, "corp.example");
            if let Some(t) = round_trip(value, &path, parse) {
                network_contains_itself(&t);
            }
        }
        2 => {
            let path = FieldPath::values(2, BehaviorKind::Exec, RuleSide::Deny);
            round_trip(value, &path, parse_path);
        }
        3 => {
            let path = FieldPath::values(3, BehaviorKind::Protocol, RuleSide::Allow);
            round_trip(value, &path, parse_protocol);
        }
        4 => {
            let path = FieldPath::values(4, BehaviorKind::Dns, RuleSide::Deny);
            if let Some(t) = round_trip(value, &path, parse_dns) {
                dns_matches_what_it_names(&t);
            }
        }
        5 => hostname_is_idempotent(value, Underscore::Refused),
        _ => hostname_is_idempotent(value, Underscore::Allowed),
    }
}

/// Parses `value`; if it parses, its rendering must parse to an equal
/// target rendered the same way. A refusal must name `path` on one line.
fn round_trip<T, F>(value: &str, path: &FieldPath, parse: F) -> Option<T>
where
    T: PartialEq + Debug + Display,
    F: Fn(&str, &FieldPath) -> Result<T, ValueError>,
{
    match parse(value, path) {
        Ok(target) => {
            let shown = target.to_string();
            let again = parse(&shown, path).unwrap_or_else(|e| {
                panic!("{value:?} parsed as {target:?}, shown as {shown:?}, which is refused: {e}")
            });
            assert_eq!(again, target, "{value:?} shown as {shown:?}");
            assert_eq!(again.to_string(), shown, "{value:?}");
            Some(target)
        }
        Err(e) => {
            assert_eq!(e.path, path.as_str(), "{value:?}");
            let message = e.to_string();
            assert!(
                !message.contains(['\n', '\r']),
                "a message on two lines: {message:?}"
            );
            None
        }
    }
}

fn network_contains_itself(target: &NetworkTarget) {
    match target {
        NetworkTarget::Ip(a) => assert!(target.contains_addr(*a), "{target:?}"),
        NetworkTarget::Cidr(c) => assert!(c.contains(c.addr()), "{target:?}"),
        _ => {}
    }
}

fn dns_matches_what_it_names(pattern: &DnsPattern) {
    match pattern {
        DnsPattern::Exact(name) => {
            assert!(pattern.matches(name), "{pattern:?}");
            assert!(
                pattern.matches(&format!("{name}.")),
                "{pattern:?} with a trailing dot"
            );
        }
        DnsPattern::Subdomains(suffix) => {
            assert!(pattern.matches(&format!("a{suffix}")), "{pattern:?}");
            let apex = suffix.trim_start_matches('.');
            assert!(!pattern.matches(apex), "{pattern:?} matched its apex");
        }
        DnsPattern::Any => assert!(pattern.matches("example.com")),
    }
}

fn hostname_is_idempotent(name: &str, underscore: Underscore) {
    if let Ok(normal) = validate_hostname(name, underscore) {
        assert_eq!(
            validate_hostname(&normal, underscore).as_deref(),
            Ok(normal.as_str()),
            "{name:?}"
        );
    }
}
