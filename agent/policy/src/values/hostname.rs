//! The one hostname validator the network and dns parsers share, so what a
//! hostname is cannot drift between them (the specification's single
//! `validHostname`).

use super::Reason;
use kyverno_runtime_api::runtimepolicy::MAX_HOSTNAME_LEN;

/// Longest label (RFC 1035 section 2.3.4).
const MAX_LABEL_LEN: usize = 63;

/// Whether `_` may appear in a label: dns values name SRV-style records
/// (`_sip._tcp.example.com`) that are looked up but never connected to, so
/// they allow it; network destinations are host names and do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Underscore {
    /// RFC 1123 host names: letters, digits and hyphens.
    Refused,
    /// DNS names as queried: `_` is a label character too.
    Allowed,
}

/// Validates an RFC 1123 host name and returns it in the form every
/// comparison uses: ASCII-lowercased, without its trailing dot.
///
/// A name is labels separated by dots, with one optional trailing dot (the
/// absolute form); each label is 1 to 63 letters, digits and hyphens (and
/// `_` with [`Underscore::Allowed`]), neither starting nor ending with a
/// hyphen; the name without its trailing dot is at most 253 bytes (RFC
/// 1035's 255-octet wire form). Letters are compared without case, so the
/// result is lowercase. Names of digits only (`1.2.3.4`) pass here: telling
/// an address from a name is the caller's rule, not a hostname's.
///
/// ```
/// use kyverno_runtime_policy::values::{validate_hostname, Underscore, Reason};
///
/// assert_eq!(validate_hostname("API.Example.com.", Underscore::Refused).unwrap(), "api.example.com");
/// assert_eq!(validate_hostname("_sip._tcp.example.com", Underscore::Refused),
///            Err(Reason::InvalidChar { ch: '_' }));
/// ```
pub fn validate_hostname(name: &str, underscore: Underscore) -> Result<String, Reason> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() {
        return Err(if name.is_empty() {
            Reason::Empty
        } else {
            Reason::EmptyLabel
        });
    }
    for label in bare.split('.') {
        check_label(label, underscore)?;
    }
    if bare.len() > MAX_HOSTNAME_LEN {
        return Err(Reason::hostname_too_long(bare.len()));
    }
    Ok(bare.to_ascii_lowercase())
}

fn check_label(label: &str, underscore: Underscore) -> Result<(), Reason> {
    if label.is_empty() {
        return Err(Reason::EmptyLabel);
    }
    let allowed = |c: char| {
        c.is_ascii_alphanumeric() || c == '-' || (c == '_' && underscore == Underscore::Allowed)
    };
    if let Some(ch) = label.chars().find(|&c| !allowed(c)) {
        return Err(Reason::InvalidChar { ch });
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(Reason::LabelHyphen);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(Reason::LabelTooLong { len: label.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::simple("example.com", "example.com")]
    #[case::one_label("localhost", "localhost")]
    #[case::single_char("a", "a")]
    #[case::uppercase_is_lowercased("API.Example.COM", "api.example.com")]
    #[case::trailing_dot_dropped("example.com.", "example.com")]
    #[case::digits("1.0.0.127.in-addr.arpa", "1.0.0.127.in-addr.arpa")]
    #[case::all_digit_labels_pass_here("10.0.0.1", "10.0.0.1")]
    #[case::inner_hyphens("a--b.x-y.com", "a--b.x-y.com")]
    #[case::punycode("xn--bcher-kva.example", "xn--bcher-kva.example")]
    fn accepts(#[case] name: &str, #[case] want: &str) {
        assert_eq!(
            validate_hostname(name, Underscore::Refused).as_deref(),
            Ok(want)
        );
        assert_eq!(
            validate_hostname(name, Underscore::Allowed).as_deref(),
            Ok(want)
        );
    }

    #[rstest]
    #[case::empty("", Reason::Empty)]
    #[case::only_a_dot(".", Reason::EmptyLabel)]
    #[case::leading_dot(".example.com", Reason::EmptyLabel)]
    #[case::double_dot("a..b", Reason::EmptyLabel)]
    #[case::two_trailing_dots("a..", Reason::EmptyLabel)]
    #[case::leading_hyphen("-a.com", Reason::LabelHyphen)]
    #[case::trailing_hyphen("a-.com", Reason::LabelHyphen)]
    #[case::inner_label_hyphen("a.-b.com", Reason::LabelHyphen)]
    #[case::underscore("_sip._tcp.example.com", Reason::InvalidChar { ch: '_' })]
    #[case::star("*.example.com", Reason::InvalidChar { ch: '*' })]
    #[case::space("a b.com", Reason::InvalidChar { ch: ' ' })]
    #[case::colon("a:80", Reason::InvalidChar { ch: ':' })]
    #[case::unicode("bücher.example", Reason::InvalidChar { ch: 'ü' })]
    #[case::nul("a\0.com", Reason::InvalidChar { ch: '\0' })]
    fn rejects(#[case] name: &str, #[case] want: Reason) {
        assert_eq!(validate_hostname(name, Underscore::Refused), Err(want));
    }

    #[test]
    fn underscore_is_a_label_character_when_allowed() {
        assert_eq!(
            validate_hostname("_sip._TCP.example.com", Underscore::Allowed).as_deref(),
            Ok("_sip._tcp.example.com")
        );
        assert_eq!(
            validate_hostname("_", Underscore::Allowed).as_deref(),
            Ok("_")
        );
        assert_eq!(
            validate_hostname("-_.com", Underscore::Allowed),
            Err(Reason::LabelHyphen)
        );
    }

    #[test]
    fn a_label_holds_63_characters_not_64() {
        let ok = format!("{}.com", "a".repeat(63));
        assert!(validate_hostname(&ok, Underscore::Refused).is_ok());
        let bad = format!("{}.com", "a".repeat(64));
        assert_eq!(
            validate_hostname(&bad, Underscore::Refused),
            Err(Reason::LabelTooLong { len: 64 })
        );
    }

    #[test]
    fn a_name_holds_max_hostname_len_bytes_and_no_more() {
        // Labels of one character: "a.a.….a" is exactly `n` bytes for odd `n`,
        // "a.….bb" for even `n`.
        let name = |n: usize| {
            if n % 2 == 1 {
                format!("{}a", "a.".repeat((n - 1) / 2))
            } else {
                format!("{}bb", "a.".repeat((n - 2) / 2))
            }
        };
        let ok = name(MAX_HOSTNAME_LEN);
        assert_eq!(ok.len(), MAX_HOSTNAME_LEN);
        assert_eq!(
            validate_hostname(&ok, Underscore::Refused).as_deref(),
            Ok(ok.as_str())
        );
        // The trailing dot of the absolute form is not counted here.
        assert!(validate_hostname(&format!("{ok}."), Underscore::Refused).is_ok());
        let bad = name(MAX_HOSTNAME_LEN + 1);
        assert_eq!(
            validate_hostname(&bad, Underscore::Refused),
            Err(Reason::TooLong {
                len: MAX_HOSTNAME_LEN + 1,
                max: MAX_HOSTNAME_LEN
            })
        );
    }
}
