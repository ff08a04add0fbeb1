//! Why a value was refused.

use super::FieldPath;
use kyverno_runtime_api::runtimepolicy::{MAX_ALPN_LEN, MAX_HOSTNAME_LEN};
use std::net::Ipv4Addr;

/// A refused value: where it is, what it is, and which rule it breaks.
///
/// Its message is one line, `<path>: "<value>" <reason>`, with the value
/// quoted and escaped (a value from an expression can hold anything) and
/// cut at [`ValueError::SHOWN_CHARS`] characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {} {reason}", shown(.value))]
pub struct ValueError {
    /// The field path, such as `spec.behaviors[0].network.deny.values[1]`.
    pub path: String,
    /// The value as written.
    pub value: String,
    /// The rule it breaks.
    pub reason: Reason,
}

impl ValueError {
    /// Longest prefix of the value a message shows.
    pub const SHOWN_CHARS: usize = 128;

    /// A refusal of `value` at `path`.
    pub fn new(path: &FieldPath, value: &str, reason: Reason) -> Self {
        ValueError {
            path: path.as_str().to_string(),
            value: value.to_string(),
            reason,
        }
    }
}

/// The value quoted and escaped on one line, cut to a bounded length.
pub(super) fn shown(value: &str) -> String {
    match value.char_indices().nth(ValueError::SHOWN_CHARS) {
        Some((cut, _)) => format!("{:?}...", &value[..cut]),
        None => format!("{value:?}"),
    }
}

/// Why a value was refused: one variant per rule, so callers (conditions,
/// metrics via [`Reason::label`], tests) can tell them apart without
/// reading messages. Each message reads after the quoted value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Reason {
    // ---- every kind ----
    /// The empty string.
    #[error("is empty")]
    Empty,
    /// Longer than the kind allows: [`MAX_HOSTNAME_LEN`] for names and
    /// network values, `MAX_PATH_LEN` for paths. Counted in bytes.
    #[error("is {len} bytes long, more than the {max} allowed")]
    TooLong {
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `"*"` in a `dns` deny list with other values (dns only: elsewhere
    /// it stands beside explicit denies).
    #[error("in a dns deny list must be the only value: alone it reports every name")]
    StarNotAlone,
    /// `"*"` in an allow list.
    #[error("is only meaningful in deny, where it makes the behavior default-deny; it is refused in allow")]
    StarInAllow,

    // ---- hostnames (network domains and Service names, dns values) ----
    /// A leading dot, or two dots in a row.
    #[error("has an empty label (a leading dot or two dots in a row)")]
    EmptyLabel,
    /// A label longer than 63 characters (RFC 1035).
    #[error("has a label of {len} characters; a label holds at most 63")]
    LabelTooLong {
        /// The label's length.
        len: usize,
    },
    /// A label starting or ending with `-` (RFC 1123).
    #[error("has a label starting or ending with a hyphen")]
    LabelHyphen,
    /// A character a hostname label may not hold.
    #[error("contains {ch:?}: a hostname label holds letters, digits and hyphens (and _ in a dns value; an internationalized name is written in its xn-- form)")]
    InvalidChar {
        /// The first offending character.
        ch: char,
    },

    // ---- network ----
    /// Only digits and dots, but not a dotted-decimal IPv4 address
    /// (`10.0.0.300`, `1.2.3`, `010.0.0.1`).
    #[error("is only digits and dots, so it must be an IPv4 address: four decimal numbers 0 to 255 without leading zeros")]
    BadIpv4,
    /// Contains `:` (and no `/`), but is not an IPv6 address.
    #[error(
        "contains ':', so it must be an IPv6 address (a port or URL is not a destination value)"
    )]
    BadIpv6,
    /// An IPv6 zone id (`fe80::1%eth0`).
    #[error("carries an IPv6 zone id, which names a link on one host, not a destination")]
    ZoneId,
    /// An IPv4-mapped IPv6 address or CIDR (`::ffff:10.0.0.1`).
    #[error("is an IPv4-mapped IPv6 address: write the IPv4 form ({ipv4}), which is what the kernel sees on the wire")]
    Ipv4Mapped {
        /// The IPv4 address it maps.
        ipv4: Ipv4Addr,
    },
    /// Numbers and dots that are not dotted decimal but that the C
    /// library's `inet_aton` reads as an address (`127.1`, `0177.0.0.1`,
    /// `0x7f.0.0.1`, `2130706433`): a program given this name connects to
    /// that address without asking DNS.
    #[error("is IPv4 shorthand: the C library (inet_aton, as curl, ping and getaddrinfo use it) reads it as {ipv4} and connects there without a DNS lookup; write {ipv4}, the form an address is matched in")]
    Ipv4Shorthand {
        /// The address it stands for.
        ipv4: Ipv4Addr,
    },
    /// Numbers (decimal, octal or `0x` hex) and dots, with a hex part, that
    /// are not an address either (`0x100.0.0.1`): such a name is never
    /// looked up in DNS (no domain ends in a number).
    #[error("is numbers and dots (decimal, octal or 0x hex), which is read as an IPv4 address, not a name, and is not a valid one: write the address in dotted decimal")]
    NumericName,
    /// A CIDR whose part before `/` is not an address.
    #[error("is not a CIDR: the part before / must be an IPv4 or IPv6 address")]
    BadCidrAddress,
    /// A CIDR whose prefix length is not a decimal in range.
    #[error("is not a CIDR: the prefix length must be a decimal number from 0 to {max} without leading zeros")]
    BadPrefixLen {
        /// The address family's width: 32 or 128.
        max: u8,
    },
    /// A wildcard in a network value other than `"*"` alone.
    #[error("has a wildcard: network values take no wildcards, since a destination must resolve to addresses the kernel can hold (\"*\" alone in deny is the default deny)")]
    NetworkWildcard,

    // ---- dns ----
    /// An address where a dns name is expected.
    #[error("is an address, not a name (a dns value that is only numbers and dots, decimal, octal or 0x hex as inet_aton reads them, or contains ':', is refused: no program asks DNS for it)")]
    DnsAddress,
    /// A `*` anywhere but as the whole leftmost label.
    #[error("has a misplaced wildcard: a wildcard may only be the whole leftmost label, followed by a name, as in *.example.com")]
    WildcardPlacement,

    // ---- protocol ----
    /// Not one of the protocol tokens.
    #[error("is not a protocol token: ssh, tls, tls/<alpn>, dns, http/1.1, http/2 or quic")]
    UnknownProtocol,
    /// `unclassified`: what the classifier reports for traffic matching no
    /// signature, not something a policy can name.
    #[error("is observation vocabulary (traffic matching no signature), not a policy value: only a default deny covers it")]
    Unclassified,
    /// `tls/` with nothing after it.
    #[error("has an empty ALPN: write tls for any TLS flow, or tls/<alpn>")]
    EmptyAlpn,
    /// An ALPN longer than the classifier's key.
    #[error("has an ALPN of {len} bytes; the classifier's ALPN key holds at most {MAX_ALPN_LEN}")]
    AlpnTooLong {
        /// The ALPN's length in bytes.
        len: usize,
    },
    /// An ALPN character outside printable ASCII, or a space or `*`.
    #[error("has {ch:?} in its ALPN: an ALPN here is printable ASCII without space or *")]
    AlpnChar {
        /// The first offending character.
        ch: char,
    },

    // ---- exec and open paths ----
    /// Does not start with `/`.
    #[error("is not an absolute path: it must start with /")]
    NotAbsolute,
    /// Contains `//`.
    #[error("contains //: the kernel reports normalized paths, so it could never match")]
    EmptySegment,
    /// Contains a `.` or `..` segment.
    #[error(
        "contains a . or .. segment: the kernel reports normalized paths, so it could never match"
    )]
    DotSegment,
    /// Ends with `/` (other than the root itself).
    #[error("ends with /: the kernel reports normalized paths, so it could never match")]
    TrailingSlash,
    /// Contains `*`.
    #[error("contains *: paths are literal, not globs (\"*\" alone in deny is the default deny)")]
    PathWildcard,
    /// Contains a NUL byte.
    #[error("contains a NUL byte, which no path can hold")]
    Nul,
    /// Contains a control character (newline, tab, escape, DEL, C1).
    #[error("contains the control character U+{:04X}: a value is read by people, and a control character hides what it is (a newline or a carriage return from a data source is the usual slip)", u32::from(*.ch))]
    ControlChar {
        /// The first one.
        ch: char,
    },
    /// Contains a Unicode bidirectional control (U+202E and its kin).
    #[error("contains the bidirectional control U+{:04X}, which makes the path display differently from what the kernel compares", u32::from(*.ch))]
    BidiControl {
        /// The first one.
        ch: char,
    },
    /// Ends with whitespace.
    #[error("ends with whitespace (U+{:04X}): a quoting slip, almost always, and the kernel compares it as part of the name", u32::from(*.ch))]
    TrailingWhitespace {
        /// The last character.
        ch: char,
    },
}

impl Reason {
    /// A stable snake_case name for the variant, for metric labels and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Empty => "empty",
            Reason::TooLong { .. } => "too_long",
            Reason::StarNotAlone => "star_not_alone",
            Reason::StarInAllow => "star_in_allow",
            Reason::EmptyLabel => "empty_label",
            Reason::LabelTooLong { .. } => "label_too_long",
            Reason::LabelHyphen => "label_hyphen",
            Reason::InvalidChar { .. } => "invalid_char",
            Reason::BadIpv4 => "bad_ipv4",
            Reason::BadIpv6 => "bad_ipv6",
            Reason::ZoneId => "zone_id",
            Reason::Ipv4Mapped { .. } => "ipv4_mapped",
            Reason::Ipv4Shorthand { .. } => "ipv4_shorthand",
            Reason::NumericName => "numeric_name",
            Reason::BadCidrAddress => "bad_cidr_address",
            Reason::BadPrefixLen { .. } => "bad_prefix_len",
            Reason::NetworkWildcard => "network_wildcard",
            Reason::DnsAddress => "dns_address",
            Reason::WildcardPlacement => "wildcard_placement",
            Reason::UnknownProtocol => "unknown_protocol",
            Reason::Unclassified => "unclassified",
            Reason::EmptyAlpn => "empty_alpn",
            Reason::AlpnTooLong { .. } => "alpn_too_long",
            Reason::AlpnChar { .. } => "alpn_char",
            Reason::NotAbsolute => "not_absolute",
            Reason::EmptySegment => "empty_segment",
            Reason::DotSegment => "dot_segment",
            Reason::TrailingSlash => "trailing_slash",
            Reason::PathWildcard => "path_wildcard",
            Reason::Nul => "nul",
            Reason::ControlChar { .. } => "control_char",
            Reason::BidiControl { .. } => "bidi_control",
            Reason::TrailingWhitespace { .. } => "trailing_whitespace",
        }
    }

    /// The hostname bound, as a `TooLong`.
    pub(super) fn hostname_too_long(len: usize) -> Self {
        Reason::TooLong {
            len,
            max: MAX_HOSTNAME_LEN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{BehaviorKind, RuleSide};

    #[test]
    fn the_message_names_path_value_and_rule_on_one_line() {
        let path = FieldPath::values(0, BehaviorKind::Network, RuleSide::Deny).index(0);
        let e = ValueError::new(&path, "10.0.0.300", Reason::BadIpv4);
        assert_eq!(
            e.to_string(),
            "spec.behaviors[0].network.deny.values[0]: \"10.0.0.300\" is only digits and dots, \
             so it must be an IPv4 address: four decimal numbers 0 to 255 without leading zeros"
        );
        let path = FieldPath::values(0, BehaviorKind::Dns, RuleSide::Deny).index(0);
        let star = ValueError::new(&path, "*", Reason::StarNotAlone);
        assert_eq!(
            star.to_string(),
            "spec.behaviors[0].dns.deny.values[0]: \"*\" in a dns deny list must be the only \
             value: alone it reports every name"
        );
    }

    #[test]
    fn a_hostile_value_is_escaped_and_cut() {
        let path = FieldPath::spec();
        let value = format!("/a\nb\0{}", "é".repeat(500));
        let msg = ValueError::new(&path, &value, Reason::Nul).to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains("\\n") && msg.contains("\\0"), "{msg}");
        assert!(msg.chars().count() < 400, "{msg}");
        assert!(msg.contains("\"..."), "{msg}");
    }
}
