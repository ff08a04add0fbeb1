//! The value parsers: one per behavior kind, each turning a value string of
//! a RuntimePolicy (a literal from `values`, or an element of an
//! `expression`'s result) into a typed target, or into a [`ValueError`]
//! that names the field, the value and the [`Reason`].
//!
//! They agree with the admission rules the CRD carries for each value kind
//! (`kyverno_runtime_api::runtimepolicy`): whatever the API server refuses,
//! these refuse too (the agreement test replays every admission manifest),
//! and they are stricter in the few places CEL cannot afford to be (label
//! lengths and hyphens, path length in bytes rather than characters), so a
//! value that only an expression produces gets the checks a literal does.
//!
//! `"*"` parses as the `Any` target of every kind, as the CRD's value rules
//! accept it; where it may stand (alone, in deny) is a property of the
//! whole list, checked by [`check_star`]. [`parse_values`] does both for a
//! list and reports every failure, not only the first.

mod dns;
mod error;
mod field_path;
mod hostname;
mod network;
mod numeric;
mod path;
mod protocol;
mod warning;

pub use dns::{parse_dns, DnsPattern};
pub use error::{Reason, ValueError};
pub use field_path::{BehaviorKind, FieldPath, RuleSide};
pub use hostname::{validate_hostname, Underscore};
pub use network::{parse_network, parse_network_in, Cidr, NetworkTarget, DEFAULT_CLUSTER_DOMAIN};
pub use path::{parse_path, AbsPath, PathTarget, PATH_KEY_LEN};
pub use protocol::{parse_protocol, ProtocolTarget, ProtocolToken};
pub use warning::{warn_value, warn_values, Note, ValueWarning};

/// The value that, in a deny list, makes a behavior default deny (in `dns`,
/// alone, the discovery form).
pub const STAR: &str = "*";

/// Checks where `"*"` stands in one allow or deny list of a `kind`, as the
/// CRD's behavior rules do: it is refused in allow ([`Reason::StarInAllow`]);
/// in deny it makes the behavior default deny and may stand beside explicit
/// denies (which still win over any allow, [`crate::rule`]), except in `dns`,
/// where `deny: ["*"]` alone is the discovery form and `"*"` must be the only
/// value ([`Reason::StarNotAlone`]).
///
/// `path` is the list's path (`spec.behaviors[0].exec.deny.values`); the
/// error names the first offending `"*"` element (`...values[1]`);
/// [`misplaced_stars`] names every one.
pub fn check_star<S: AsRef<str>>(
    kind: BehaviorKind,
    values: &[S],
    path: &FieldPath,
    side: RuleSide,
) -> Result<(), ValueError> {
    match misplaced_stars(kind, values, path, side).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every `"*"` of one list that stands where it may not (see
/// [`check_star`]), in order.
pub fn misplaced_stars<S: AsRef<str>>(
    kind: BehaviorKind,
    values: &[S],
    path: &FieldPath,
    side: RuleSide,
) -> Vec<ValueError> {
    let reason = match side {
        RuleSide::Allow => Reason::StarInAllow,
        RuleSide::Deny if kind != BehaviorKind::Dns || values.len() == 1 => return Vec::new(),
        RuleSide::Deny => Reason::StarNotAlone,
    };
    values
        .iter()
        .enumerate()
        .filter(|(_, v)| v.as_ref() == STAR)
        .map(|(i, _)| ValueError::new(&path.index(i), STAR, reason.clone()))
        .collect()
}

/// Parses one value of `kind` at `path` with that kind's parser, keeping
/// only whether it is usable (the network parser assumes the
/// [`DEFAULT_CLUSTER_DOMAIN`], which decides only what a name is, never
/// whether it is valid).
pub fn check_value(kind: BehaviorKind, value: &str, path: &FieldPath) -> Result<(), ValueError> {
    match kind {
        BehaviorKind::Network => parse_network(value, path).map(drop),
        BehaviorKind::Exec | BehaviorKind::Open => parse_path(value, path).map(drop),
        BehaviorKind::Protocol => parse_protocol(value, path).map(drop),
        BehaviorKind::Dns => parse_dns(value, path).map(drop),
    }
}

/// Parses one allow or deny list: [`check_star`] over the list, then
/// `parse` on each value at `path[i]`. Returns every target, or every
/// failure (a condition should list all unusable values, not the first).
///
/// ```
/// use kyverno_runtime_policy::values::{parse_values, parse_network, BehaviorKind, FieldPath, RuleSide};
///
/// let path = FieldPath::values(0, BehaviorKind::Network, RuleSide::Deny);
/// let values = ["10.0.0.0/8", "10.0.0.300"];
/// let errors = parse_values(BehaviorKind::Network, &values, &path, RuleSide::Deny, parse_network)
///     .unwrap_err();
/// assert_eq!(errors[0].path, "spec.behaviors[0].network.deny.values[1]");
/// ```
pub fn parse_values<T, S, F>(
    kind: BehaviorKind,
    values: &[S],
    path: &FieldPath,
    side: RuleSide,
    parse: F,
) -> Result<Vec<T>, Vec<ValueError>>
where
    S: AsRef<str>,
    F: Fn(&str, &FieldPath) -> Result<T, ValueError>,
{
    let mut errors = misplaced_stars(kind, values, path, side);
    let mut targets = Vec::with_capacity(values.len());
    for (i, value) in values.iter().enumerate() {
        match parse(value.as_ref(), &path.index(i)) {
            Ok(target) => targets.push(target),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(targets)
    } else {
        Err(errors)
    }
}

/// `value` as it may be printed on a terminal or in a log line: as it is,
/// or quoted and escaped (`"/tmp/x\u{202e}hs"`) when it holds a control
/// or bidirectional control character, which would otherwise move the
/// cursor, end the line or reorder what the reader sees.
pub fn printable(value: &str) -> std::borrow::Cow<'_, str> {
    if value
        .chars()
        .any(|c| c.is_control() || path::is_bidi_control(c))
    {
        std::borrow::Cow::Owned(format!("{value:?}"))
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

/// Whether a value is made only of ASCII digits and dots: the shape the CRD
/// (`^[0-9.]+$`) reads as an IPv4 address rather than as a name.
fn digits_and_dots(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn deny() -> FieldPath {
        FieldPath::values(3, BehaviorKind::Exec, RuleSide::Deny)
    }

    fn allow() -> FieldPath {
        FieldPath::values(3, BehaviorKind::Exec, RuleSide::Allow)
    }

    #[rstest]
    #[case::no_star(BehaviorKind::Exec, &["/bin/sh", "/bin/bash"][..], RuleSide::Deny, None)]
    #[case::alone_in_deny(BehaviorKind::Exec, &["*"][..], RuleSide::Deny, None)]
    #[case::empty(BehaviorKind::Exec, &[][..], RuleSide::Allow, None)]
    #[case::beside_others_in_deny(BehaviorKind::Exec, &["/bin/sh", "*"][..], RuleSide::Deny, None)]
    #[case::twice_in_deny(BehaviorKind::Exec, &["*", "*"][..], RuleSide::Deny, None)]
    #[case::beside_others_in_network_deny(BehaviorKind::Network, &["*", "10.0.0.9"][..], RuleSide::Deny, None)]
    #[case::beside_others_in_protocol_deny(BehaviorKind::Protocol, &["ssh", "*"][..], RuleSide::Deny, None)]
    #[case::beside_others_in_open_deny(BehaviorKind::Open, &["*", "/etc/shadow"][..], RuleSide::Deny, None)]
    #[case::dns_alone_in_deny(BehaviorKind::Dns, &["*"][..], RuleSide::Deny, None)]
    #[case::dns_with_others_in_deny(BehaviorKind::Dns, &["evil.example", "*"][..], RuleSide::Deny, Some((1, Reason::StarNotAlone)))]
    #[case::dns_twice_in_deny(BehaviorKind::Dns, &["*", "*"][..], RuleSide::Deny, Some((0, Reason::StarNotAlone)))]
    #[case::alone_in_allow(BehaviorKind::Exec, &["*"][..], RuleSide::Allow, Some((0, Reason::StarInAllow)))]
    #[case::among_allow(BehaviorKind::Exec, &["/a", "*"][..], RuleSide::Allow, Some((1, Reason::StarInAllow)))]
    #[case::star_inside_a_value_is_not_star(BehaviorKind::Exec, &["/a", "*.sh"][..], RuleSide::Deny, None)]
    fn star_placement(
        #[case] kind: BehaviorKind,
        #[case] values: &[&str],
        #[case] side: RuleSide,
        #[case] expected: Option<(usize, Reason)>,
    ) {
        let path = FieldPath::values(3, kind, side);
        let got = check_star(kind, values, &path, side).err();
        let expected = expected.map(|(i, reason)| ValueError {
            path: format!(
                "spec.behaviors[3].{}.{}.values[{i}]",
                kind.as_str(),
                side.as_str()
            ),
            value: "*".into(),
            reason,
        });
        assert_eq!(got, expected);
    }

    #[test]
    fn a_value_is_printed_escaped_only_when_it_must_be() {
        assert_eq!(printable("/srv/my files/café"), "/srv/my files/café");
        assert_eq!(printable("/tmp/a\nb"), "\"/tmp/a\\nb\"");
        assert_eq!(printable("/tmp/x\u{202E}hs"), "\"/tmp/x\\u{202e}hs\"");
        assert_eq!(printable("\u{1b}[2J"), "\"\\u{1b}[2J\"");
    }

    #[test]
    fn every_misplaced_star_is_named() {
        let path = FieldPath::values(3, BehaviorKind::Dns, RuleSide::Deny);
        let got: Vec<_> = misplaced_stars(
            BehaviorKind::Dns,
            &["*", "evil.example", "*"],
            &path,
            RuleSide::Deny,
        )
        .into_iter()
        .map(|e| e.path)
        .collect();
        assert_eq!(
            got,
            [
                "spec.behaviors[3].dns.deny.values[0]",
                "spec.behaviors[3].dns.deny.values[2]"
            ]
        );
        let path = FieldPath::values(3, BehaviorKind::Exec, RuleSide::Allow);
        let got: Vec<_> = misplaced_stars(
            BehaviorKind::Exec,
            &["*", "/bin/sh", "*"],
            &path,
            RuleSide::Allow,
        )
        .into_iter()
        .map(|e| e.path)
        .collect();
        assert_eq!(
            got,
            [
                "spec.behaviors[3].exec.allow.values[0]",
                "spec.behaviors[3].exec.allow.values[2]"
            ]
        );
    }

    #[test]
    fn parse_values_reports_every_failure_in_order() {
        let errors = parse_values(
            BehaviorKind::Exec,
            &["*", "curl", "/bin/sh", "/etc/", "*"],
            &allow(),
            RuleSide::Allow,
            parse_path,
        )
        .unwrap_err();
        let got: Vec<_> = errors
            .iter()
            .map(|e| (e.path.as_str(), e.reason.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "spec.behaviors[3].exec.allow.values[0]",
                    Reason::StarInAllow
                ),
                (
                    "spec.behaviors[3].exec.allow.values[4]",
                    Reason::StarInAllow
                ),
                (
                    "spec.behaviors[3].exec.allow.values[1]",
                    Reason::NotAbsolute
                ),
                (
                    "spec.behaviors[3].exec.allow.values[3]",
                    Reason::TrailingSlash
                ),
            ]
        );
    }

    #[test]
    fn parse_values_returns_targets_in_order() {
        let got = parse_values(
            BehaviorKind::Exec,
            &["*", "/bin/sh"],
            &deny(),
            RuleSide::Deny,
            parse_path,
        )
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], PathTarget::Any);
        let got = parse_values(
            BehaviorKind::Protocol,
            &["ssh", "tls/h2"],
            &deny(),
            RuleSide::Deny,
            parse_protocol,
        )
        .unwrap();
        assert_eq!(got.len(), 2);
    }
}
