//! `dns` values: question names a pod is expected (or reported) to resolve.

use super::numeric::numeric_looking;
use super::{digits_and_dots, validate_hostname, FieldPath, Reason, Underscore, ValueError, STAR};
use kyverno_runtime_api::runtimepolicy::MAX_HOSTNAME_LEN;
use std::fmt;

/// A parsed `dns` value, matched against observed question names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DnsPattern {
    /// One name, lowercase, without a trailing dot.
    Exact(String),
    /// `*.<name>`, stored as `.<name>` (lowercase, no trailing dot): the
    /// leading dot is what confines it to subdomains, as the
    /// specification's `newNameMatcher` does, so `*.example.com` matches
    /// `a.example.com` and `a.b.example.com` but neither the apex
    /// `example.com` nor `evilexample.com`.
    Subdomains(String),
    /// `"*"`: every name.
    Any,
}

impl DnsPattern {
    /// Whether the observed question name `qname` is matched: without
    /// case, and ignoring one trailing dot on `qname` (the kernel reports
    /// names lowercased; a caller need not rely on it).
    pub fn matches(&self, qname: &str) -> bool {
        let qname = qname.strip_suffix('.').unwrap_or(qname);
        match self {
            DnsPattern::Exact(name) => qname.eq_ignore_ascii_case(name),
            DnsPattern::Subdomains(suffix) => {
                let Some(cut) = qname.len().checked_sub(suffix.len()) else {
                    return false;
                };
                // Compare bytes: `cut` need not be a char boundary of an
                // arbitrary qname, and the suffix is ASCII.
                let (head, tail) = qname.as_bytes().split_at(cut);
                tail.eq_ignore_ascii_case(suffix.as_bytes())
                    && !head.is_empty()
                    && !head.ends_with(b".")
            }
            DnsPattern::Any => true,
        }
    }
}

/// The value in normalized form, which [`parse_dns`] reads back to an equal
/// pattern (`*.example.com`, `example.com`, `*`).
impl fmt::Display for DnsPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsPattern::Exact(name) => f.write_str(name),
            DnsPattern::Subdomains(suffix) => write!(f, "*{suffix}"),
            DnsPattern::Any => f.write_str(STAR),
        }
    }
}

/// Parses a `dns` value: a host name, a left wildcard `*.<name>`, or `"*"`
/// ([`DnsPattern::Any`]).
///
/// Names are validated by the same [`validate_hostname`] as network
/// domains, with `_` allowed in labels (`_sip._tcp.example.com`: SRV-style
/// names are queried though never connected to), and lowercased without
/// their trailing dot. A wildcard may only be the whole leftmost label
/// followed by a name: `foo.*.example.com`, `*foo.example.com` and `*.`
/// are refused. An address is not a name: a value that is only digits and
/// dots, numbers as `inet_aton` reads them (`0x7f.0.0.1`: the C library
/// connects to it without a question), or contains `:` is refused, as at
/// admission (`1.0.0.127.in-addr.arpa` is a name). The value as written is at most `MAX_HOSTNAME_LEN` (253)
/// bytes, wildcard and trailing dot included.
pub fn parse_dns(value: &str, path: &FieldPath) -> Result<DnsPattern, ValueError> {
    classify(value).map_err(|reason| ValueError::new(path, value, reason))
}

fn classify(value: &str) -> Result<DnsPattern, Reason> {
    if value == STAR {
        return Ok(DnsPattern::Any);
    }
    if value.is_empty() {
        return Err(Reason::Empty);
    }
    if value.len() > MAX_HOSTNAME_LEN {
        return Err(Reason::hostname_too_long(value.len()));
    }
    if value.contains(':') || digits_and_dots(value) || numeric_looking(value) {
        return Err(Reason::DnsAddress);
    }
    match value.strip_prefix("*.") {
        Some(base) if base.is_empty() || base == "." || base.contains('*') => {
            Err(Reason::WildcardPlacement)
        }
        Some(base) => Ok(DnsPattern::Subdomains(format!(
            ".{}",
            validate_hostname(base, Underscore::Allowed)?
        ))),
        None if value.contains('*') => Err(Reason::WildcardPlacement),
        None => Ok(DnsPattern::Exact(validate_hostname(
            value,
            Underscore::Allowed,
        )?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(value: &str) -> Result<DnsPattern, Reason> {
        parse_dns(value, &FieldPath::spec()).map_err(|e| e.reason)
    }

    fn exact(s: &str) -> DnsPattern {
        DnsPattern::Exact(s.into())
    }

    fn sub(s: &str) -> DnsPattern {
        DnsPattern::Subdomains(s.into())
    }

    #[rstest]
    #[case::name("example.com", exact("example.com"))]
    #[case::uppercase("API.Example.COM", exact("api.example.com"))]
    #[case::trailing_dot("example.com.", exact("example.com"))]
    #[case::srv("_sip._tcp.example.com", exact("_sip._tcp.example.com"))]
    #[case::reverse("1.0.0.127.in-addr.arpa", exact("1.0.0.127.in-addr.arpa"))]
    #[case::hex_label_in_a_name("0xcafe.example", exact("0xcafe.example"))]
    #[case::single_label("localhost", exact("localhost"))]
    #[case::wildcard("*.example.com", sub(".example.com"))]
    #[case::wildcard_deep("*.openai.azure.com", sub(".openai.azure.com"))]
    #[case::wildcard_uppercase("*.EXAMPLE.com.", sub(".example.com"))]
    #[case::wildcard_tld("*.com", sub(".com"))]
    #[case::wildcard_over_digits("*.10.0.0.1", sub(".10.0.0.1"))]
    #[case::star("*", DnsPattern::Any)]
    fn accepts(#[case] value: &str, #[case] want: DnsPattern) {
        assert_eq!(parse(value), Ok(want));
    }

    #[rstest]
    #[case::empty("", Reason::Empty)]
    #[case::ipv4("10.0.0.1", Reason::DnsAddress)]
    #[case::ipv4_absolute("10.0.0.1.", Reason::DnsAddress)]
    #[case::not_quite_ipv4("1.2.3", Reason::DnsAddress)]
    #[case::hex_ipv4("0x7f.0.0.1", Reason::DnsAddress)]
    #[case::hex_word("0x7f000001.", Reason::DnsAddress)]
    #[case::ipv6("::1", Reason::DnsAddress)]
    #[case::ipv6_full("2001:db8::1", Reason::DnsAddress)]
    #[case::host_and_port("example.com:53", Reason::DnsAddress)]
    #[case::wildcard_in_middle("foo.*.example.com", Reason::WildcardPlacement)]
    #[case::partial_wildcard("*foo.example.com", Reason::WildcardPlacement)]
    #[case::wildcard_suffix("foo*.example.com", Reason::WildcardPlacement)]
    #[case::right_wildcard("example.*", Reason::WildcardPlacement)]
    #[case::two_wildcards("*.*.example.com", Reason::WildcardPlacement)]
    #[case::double_star("**.example.com", Reason::WildcardPlacement)]
    #[case::wildcard_alone_with_dot("*.", Reason::WildcardPlacement)]
    #[case::wildcard_dot_dot("*..", Reason::WildcardPlacement)]
    #[case::wildcard_then_empty_label("*..example.com", Reason::EmptyLabel)]
    #[case::double_dot("a..example.com", Reason::EmptyLabel)]
    #[case::leading_dot(".example.com", Reason::EmptyLabel)]
    #[case::hyphen("-a.example.com", Reason::LabelHyphen)]
    #[case::slash("example.com/x", Reason::InvalidChar { ch: '/' })]
    #[case::unicode("bücher.example", Reason::InvalidChar { ch: 'ü' })]
    fn rejects(#[case] value: &str, #[case] want: Reason) {
        assert_eq!(parse(value), Err(want));
    }

    #[test]
    fn labels_and_lengths_are_the_shared_hostname_rules() {
        let label63 = "a".repeat(63);
        assert!(parse(&format!("*.{label63}.com")).is_ok());
        assert_eq!(
            parse(&format!("*.{label63}a.com")),
            Err(Reason::LabelTooLong { len: 64 })
        );
        // "*." + (MAX_HOSTNAME_LEN - 2) bytes is the written bound.
        let name = |n: usize| format!("{}b", "a.".repeat((n - 1) / 2));
        let rest = MAX_HOSTNAME_LEN - 2;
        let rest = if rest % 2 == 1 { rest } else { rest - 1 };
        assert!(parse(&format!("*.{}", name(rest))).is_ok());
        let over = format!(
            "*.{}",
            name(rest) + &"c".repeat(MAX_HOSTNAME_LEN - rest - 1)
        );
        assert_eq!(over.len(), MAX_HOSTNAME_LEN + 1);
        assert_eq!(
            parse(&over),
            Err(Reason::TooLong {
                len: MAX_HOSTNAME_LEN + 1,
                max: MAX_HOSTNAME_LEN
            })
        );
    }

    #[rstest]
    #[case::exact("example.com", "example.com", true)]
    #[case::exact_case("example.com", "EXAMPLE.com", true)]
    #[case::exact_absolute("example.com", "example.com.", true)]
    #[case::exact_not_sub("example.com", "a.example.com", false)]
    #[case::exact_not_other("example.com", "example.org", false)]
    #[case::sub_one("*.example.com", "a.example.com", true)]
    #[case::sub_two("*.example.com", "a.b.example.com", true)]
    #[case::sub_case("*.example.com", "A.Example.COM", true)]
    #[case::sub_absolute("*.example.com", "a.example.com.", true)]
    #[case::sub_not_apex("*.example.com", "example.com", false)]
    #[case::sub_not_apex_absolute("*.example.com", "example.com.", false)]
    #[case::sub_not_lookalike("*.example.com", "evilexample.com", false)]
    #[case::sub_not_bare_suffix("*.example.com", ".example.com", false)]
    #[case::sub_not_empty_label("*.example.com", "a..example.com", false)]
    #[case::sub_not_shorter("*.example.com", "com", false)]
    #[case::sub_not_parent_suffix("*.example.com", "a.example.com.evil", false)]
    #[case::sub_non_ascii_qname("*.example.com", "ü.example.com", true)]
    #[case::sub_cut_inside_a_char("*.ab", "éab", false)]
    #[case::any("*", "anything.at.all", true)]
    #[case::any_empty("*", "", true)]
    fn matching(#[case] pattern: &str, #[case] qname: &str, #[case] want: bool) {
        assert_eq!(
            parse(pattern).unwrap().matches(qname),
            want,
            "{pattern} ~ {qname}"
        );
    }

    #[rstest]
    #[case("*.Example.COM.", "*.example.com")]
    #[case("_SIP._tcp.example.com", "_sip._tcp.example.com")]
    #[case("*", "*")]
    fn display_is_the_normalized_value(#[case] value: &str, #[case] shown: &str) {
        let p = parse(value).unwrap();
        assert_eq!(p.to_string(), shown);
        assert_eq!(parse(shown), Ok(p));
    }
}
