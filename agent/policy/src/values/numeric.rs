//! Names that are numbers: what the C library reads as an IPv4 address.
//!
//! `getaddrinfo` (glibc, musl) first tries the name as an address with
//! `inet_aton`, which reads far more than dotted decimal: `127.1`,
//! `0177.0.0.1` (octal), `0x7f.0.0.1` (hex) and `2130706433` are all
//! 127.0.0.1. Such a name is connected to directly, without a DNS question,
//! so as a network domain it would be resolved through DNS and never match
//! what the program reaches, and as a dns value it names a question no
//! program sends. The parsers refuse them, naming the address they stand
//! for when there is one.

use std::net::Ipv4Addr;

/// Whether every label of `value` (one trailing dot allowed) is a number as
/// `inet_aton` writes numbers: decimal digits (octal with a leading `0`), or
/// `0x` and hex digits. Such a value is read as an address or refused,
/// never looked up as a name.
pub(super) fn numeric_looking(value: &str) -> bool {
    let body = value.strip_suffix('.').unwrap_or(value);
    !body.is_empty()
        && body.split('.').all(|label| {
            let hex = label
                .strip_prefix("0x")
                .or_else(|| label.strip_prefix("0X"));
            match hex {
                Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
                None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
            }
        })
}

/// The address glibc's `inet_aton` reads `value` as, in the exact form
/// `getaddrinfo` uses (nothing after the number): one to four parts split
/// by dots, each decimal, octal (leading `0`) or hex (`0x`); every part
/// but the last is one byte, the last fills the bytes left (`a.b` is
/// `a` then 24 bits of `b`).
pub(super) fn inet_aton(value: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = value.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|p| aton_number(p))
        .collect::<Option<Vec<u32>>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|&n| n > 0xff) {
        return None;
    }
    // The last part holds what the leading parts left: 32, 24, 16 or 8 bits.
    let last_bits = 32 - 8 * leading.len() as u32;
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let mut word = *last;
    for (i, &n) in leading.iter().enumerate() {
        word |= n << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(word))
}

/// One part as `strtoul(part, _, 0)` reads it whole, at most 32 bits.
fn aton_number(part: &str) -> Option<u32> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    // from_str_radix would take a sign; strtoul after an isdigit check
    // does not.
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    // Each checked against glibc 2.36's inet_aton (Debian 12).
    #[rstest]
    #[case("127.0.0.1", Some("127.0.0.1"))]
    #[case("127.1", Some("127.0.0.1"))]
    #[case("127.0.1", Some("127.0.0.1"))]
    #[case("0177.0.0.1", Some("127.0.0.1"))]
    #[case("0x7f.0.0.1", Some("127.0.0.1"))]
    #[case("0X7F.0.0.0x1", Some("127.0.0.1"))]
    #[case("0x7f000001", Some("127.0.0.1"))]
    #[case("2130706433", Some("127.0.0.1"))]
    #[case("010.0.0.1", Some("8.0.0.1"))]
    #[case("1.2.3", Some("1.2.0.3"))]
    #[case("1.2.65535", Some("1.2.255.255"))]
    #[case("1.16777215", Some("1.255.255.255"))]
    #[case("0", Some("0.0.0.0"))]
    #[case("00", Some("0.0.0.0"))]
    #[case("4294967295", Some("255.255.255.255"))]
    #[case("4294967296", None)]
    #[case("1.2.65536", None)]
    #[case("256.1.1.1", None)]
    #[case("1.2.3.4.5", None)]
    #[case("1.2.3.4.", None)]
    #[case("08.1.1.1", None)]
    #[case("0x", None)]
    #[case("0x.1", None)]
    #[case("0xg", None)]
    #[case("+1", None)]
    #[case("1..2", None)]
    #[case("", None)]
    #[case(" 1", None)]
    #[case("0x00000000000000000001", Some("0.0.0.1"))]
    fn reads_as_inet_aton_does(#[case] value: &str, #[case] want: Option<&str>) {
        let want = want.map(|w| w.parse::<Ipv4Addr>().unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(inet_aton(value), want, "{value}");
    }

    #[rstest]
    #[case("0x7f.0.0.1", true)]
    #[case("0x7f.0.0.1.", true)]
    #[case("127.1", true)]
    #[case("0x", true)]
    #[case("0x100.0.0.1", true)]
    #[case("1.0.0.127.in-addr.arpa", false)]
    #[case("0xcafe.example", false)]
    #[case("deadbeef", false)]
    #[case("1e100.net", false)]
    #[case("x0.1", false)]
    #[case("1..2", false)]
    #[case(".", false)]
    fn numeric_looking_names(#[case] value: &str, #[case] want: bool) {
        assert_eq!(numeric_looking(value), want, "{value}");
    }
}
