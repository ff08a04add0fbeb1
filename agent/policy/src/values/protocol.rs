//! `protocol` values: application-protocol tokens of egress flows.

use super::{FieldPath, Reason, ValueError, STAR};
use kyverno_runtime_api::runtimepolicy::MAX_ALPN_LEN;
use std::fmt;
use std::str::FromStr;

/// What the egress classifier recognizes in a flow's first data segment,
/// by the token a policy names it with. A token names the outermost thing
/// recognized, not a security property.
///
/// `unclassified` (traffic matching no signature) is deliberately absent:
/// it is observation vocabulary, reported in findings and metrics, and
/// refused as a policy value ([`Reason::Unclassified`]), so only a default
/// deny covers it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolToken {
    /// `ssh`: an SSH banner.
    Ssh,
    /// `tls` (any ALPN, or none) or `tls/<alpn>`: a TLS record layer,
    /// with the first ALPN the ClientHello offers.
    Tls {
        /// The ALPN identifier as written (ALPN identifiers are
        /// case-sensitive byte strings): 1 to [`MAX_ALPN_LEN`] printable
        /// ASCII characters other than space and `*`.
        alpn: Option<String>,
    },
    /// `dns`: a cleartext DNS query.
    Dns,
    /// `http/1.1`: an HTTP/1 request line.
    Http1,
    /// `http/2`: the cleartext HTTP/2 connection preface.
    Http2,
    /// `quic`: a QUIC v1 long header.
    Quic,
}

/// The token, as written in a policy: `Display` and [`FromStr`] round-trip.
impl fmt::Display for ProtocolToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolToken::Ssh => f.write_str("ssh"),
            ProtocolToken::Tls { alpn: None } => f.write_str("tls"),
            ProtocolToken::Tls { alpn: Some(alpn) } => write!(f, "tls/{alpn}"),
            ProtocolToken::Dns => f.write_str("dns"),
            ProtocolToken::Http1 => f.write_str("http/1.1"),
            ProtocolToken::Http2 => f.write_str("http/2"),
            ProtocolToken::Quic => f.write_str("quic"),
        }
    }
}

/// Reads a token exactly as the CRD's rule does: the fixed tokens are
/// lowercase and compared exactly; an ALPN is kept as written.
impl FromStr for ProtocolToken {
    type Err = Reason;

    fn from_str(s: &str) -> Result<Self, Reason> {
        Ok(match s {
            "ssh" => ProtocolToken::Ssh,
            "tls" => ProtocolToken::Tls { alpn: None },
            "dns" => ProtocolToken::Dns,
            "http/1.1" => ProtocolToken::Http1,
            "http/2" => ProtocolToken::Http2,
            "quic" => ProtocolToken::Quic,
            "unclassified" => return Err(Reason::Unclassified),
            _ => match s.strip_prefix("tls/") {
                Some(alpn) => ProtocolToken::Tls {
                    alpn: Some(check_alpn(alpn)?.to_string()),
                },
                None => return Err(Reason::UnknownProtocol),
            },
        })
    }
}

fn check_alpn(alpn: &str) -> Result<&str, Reason> {
    if alpn.is_empty() {
        return Err(Reason::EmptyAlpn);
    }
    if alpn.len() > MAX_ALPN_LEN {
        return Err(Reason::AlpnTooLong { len: alpn.len() });
    }
    // `[!-)+-~]`: printable ASCII without space (0x20) and `*` (0x2a).
    if let Some(ch) = alpn.chars().find(|&c| !matches!(c, '!'..='~') || c == '*') {
        return Err(Reason::AlpnChar { ch });
    }
    Ok(alpn)
}

/// A parsed `protocol` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProtocolTarget {
    /// One protocol token.
    Token(ProtocolToken),
    /// `"*"`: every flow, `unclassified` included (meaningful alone in deny).
    Any,
}

/// The value as written: the token, or `*`.
impl fmt::Display for ProtocolTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolTarget::Token(t) => t.fmt(f),
            ProtocolTarget::Any => f.write_str(STAR),
        }
    }
}

/// Parses a `protocol` value: one of `ssh`, `tls`, `tls/<alpn>`, `dns`,
/// `http/1.1`, `http/2`, `quic` (see [`ProtocolToken`]), or `"*"`
/// ([`ProtocolTarget::Any`]). `unclassified` is refused with its own
/// reason; `tls/` needs an ALPN of 1 to 16 printable ASCII characters other
/// than space and `*`.
pub fn parse_protocol(value: &str, path: &FieldPath) -> Result<ProtocolTarget, ValueError> {
    if value == STAR {
        return Ok(ProtocolTarget::Any);
    }
    if value.is_empty() {
        return Err(ValueError::new(path, value, Reason::Empty));
    }
    value
        .parse()
        .map(ProtocolTarget::Token)
        .map_err(|reason| ValueError::new(path, value, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(value: &str) -> Result<ProtocolTarget, Reason> {
        parse_protocol(value, &FieldPath::spec()).map_err(|e| e.reason)
    }

    fn tls(alpn: &str) -> ProtocolTarget {
        ProtocolTarget::Token(ProtocolToken::Tls {
            alpn: Some(alpn.into()),
        })
    }

    #[rstest]
    #[case::ssh("ssh", ProtocolTarget::Token(ProtocolToken::Ssh))]
    #[case::tls("tls", ProtocolTarget::Token(ProtocolToken::Tls { alpn: None }))]
    #[case::tls_h2("tls/h2", tls("h2"))]
    #[case::tls_http11("tls/http/1.1", tls("http/1.1"))]
    #[case::tls_acme("tls/acme-tls/1", tls("acme-tls/1"))]
    #[case::tls_alpn_case_kept("tls/H2", tls("H2"))]
    #[case::tls_one_char("tls/x", tls("x"))]
    #[case::tls_16_chars("tls/aaaaaaaaaaaaaaaa", tls("aaaaaaaaaaaaaaaa"))]
    #[case::tls_punctuation("tls/!~+)", tls("!~+)"))]
    #[case::dns("dns", ProtocolTarget::Token(ProtocolToken::Dns))]
    #[case::http1("http/1.1", ProtocolTarget::Token(ProtocolToken::Http1))]
    #[case::http2("http/2", ProtocolTarget::Token(ProtocolToken::Http2))]
    #[case::quic("quic", ProtocolTarget::Token(ProtocolToken::Quic))]
    #[case::star("*", ProtocolTarget::Any)]
    fn accepts(#[case] value: &str, #[case] want: ProtocolTarget) {
        assert_eq!(parse(value), Ok(want.clone()));
        assert_eq!(want.to_string(), value, "Display round-trips");
    }

    #[rstest]
    #[case::empty("", Reason::Empty)]
    #[case::unknown("ftp", Reason::UnknownProtocol)]
    #[case::unclassified("unclassified", Reason::Unclassified)]
    #[case::uppercase("SSH", Reason::UnknownProtocol)]
    #[case::uppercase_tls("TLS/h2", Reason::UnknownProtocol)]
    #[case::http1_0("http/1.0", Reason::UnknownProtocol)]
    #[case::http_bare("http", Reason::UnknownProtocol)]
    #[case::http3("http/3", Reason::UnknownProtocol)]
    #[case::padded(" ssh", Reason::UnknownProtocol)]
    #[case::tls_empty_alpn("tls/", Reason::EmptyAlpn)]
    #[case::tls_17_chars("tls/aaaaaaaaaaaaaaaaa", Reason::AlpnTooLong { len: 17 })]
    #[case::tls_space("tls/h 2", Reason::AlpnChar { ch: ' ' })]
    #[case::tls_star("tls/*", Reason::AlpnChar { ch: '*' })]
    #[case::tls_tab("tls/h\t2", Reason::AlpnChar { ch: '\t' })]
    #[case::tls_del("tls/h\u{7f}", Reason::AlpnChar { ch: '\u{7f}' })]
    #[case::tls_non_ascii("tls/é", Reason::AlpnChar { ch: 'é' })]
    #[case::tls_nul("tls/\0", Reason::AlpnChar { ch: '\0' })]
    #[case::tls_no_slash("tlsh2", Reason::UnknownProtocol)]
    fn rejects(#[case] value: &str, #[case] want: Reason) {
        assert_eq!(parse(value), Err(want));
    }

    #[test]
    fn unclassified_is_named_as_observation_vocabulary() {
        let e = parse_protocol("unclassified", &FieldPath::spec()).unwrap_err();
        assert!(e.to_string().contains("observation vocabulary"), "{e}");
    }
}
