//! Generated inputs: no parser panics on any string, what parses
//! round-trips through `Display`, and no parser is looser than the CRD's
//! CEL rule for its kind (transcribed below from
//! `kyverno_runtime_api::runtimepolicy`).

// A panic in a test helper is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_api::runtimepolicy::{MAX_ALPN_LEN, MAX_HOSTNAME_LEN, MAX_PATH_LEN};
use kyverno_runtime_policy::values::{
    parse_dns, parse_network, parse_path, parse_protocol, DnsPattern, FieldPath, NetworkTarget,
    PathTarget, Reason,
};
use std::collections::BTreeMap;

/// splitmix64: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

/// Fragments that sit on the parsers' decision boundaries.
const FRAGMENTS: &[&str] = &[
    "a",
    "Z",
    "q",
    "0",
    "1",
    "9",
    "255",
    "256",
    "300",
    "010",
    ".",
    "..",
    "-",
    "_",
    "*",
    "*.",
    "/",
    "//",
    "/.",
    "/..",
    ":",
    "::",
    "%",
    "ffff",
    "db8",
    "fe80",
    "svc",
    "cluster",
    "local",
    "tls/",
    "tls",
    "ssh",
    "http/1.1",
    "http/2",
    "quic",
    "dns",
    "unclassified",
    "h2",
    " ",
    "\t",
    "\n",
    "\0",
    "é",
    "ü",
    "\u{7f}",
    "😀",
    "xn--",
    "1e100",
    "/32",
    "/0",
    "/129",
    "+",
    "!",
    "~",
    "\"",
    "\\",
    // Numbers inet_aton reads, and the characters paths refuse.
    "0x",
    "0X7f",
    "0177",
    "\r",
    "\u{85}",
    "\u{A0}",
    "\u{3000}",
    "\u{202E}",
    "\u{2066}",
];

fn fragments(rng: &mut Rng) -> String {
    let n = rng.below(12);
    (0..n).map(|_| rng.pick(FRAGMENTS)).collect()
}

/// Labels of 0 to 70 characters from a hostname-ish alphabet, sometimes
/// wildcarded, sometimes absolute: this is where label and length rules bite.
fn name_like(rng: &mut Rng) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCZ0123456789----__";
    let labels = 1 + rng.below(6);
    let long = rng.below(4) == 0;
    let mut s = String::new();
    if rng.below(4) == 0 {
        s.push_str("*.");
    }
    for i in 0..labels {
        if i > 0 {
            s.push('.');
        }
        let len = if long { rng.below(71) } else { rng.below(8) };
        for _ in 0..len {
            s.push(CHARS[rng.below(CHARS.len())] as char);
        }
    }
    if rng.below(4) == 0 {
        s.push('.');
    }
    s
}

fn bytes_lossy(rng: &mut Rng) -> String {
    let n = rng.below(300);
    let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn long_path(rng: &mut Rng) -> String {
    let mut s = String::new();
    while s.len() < 250 + rng.below(10) {
        s.push('/');
        s.push_str(rng.pick(&["a", "bin", "é", ".", "..", "etc", ""]));
    }
    s
}

fn inputs() -> Vec<String> {
    let mut rng = Rng(0x6b79_7665_726e_6f21);
    let mut out: Vec<String> = Vec::new();
    for i in 0..60_000 {
        out.push(match i % 4 {
            0 => fragments(&mut rng),
            1 => name_like(&mut rng),
            2 => bytes_lossy(&mut rng),
            _ => long_path(&mut rng),
        });
    }
    out
}

#[test]
fn no_input_panics_and_what_parses_round_trips() {
    let path = FieldPath::spec().field("x").index(0);
    for s in inputs() {
        let s = s.as_str();
        match parse_network(s, &path) {
            Ok(t) => {
                let shown = t.to_string();
                assert_eq!(
                    parse_network(&shown, &path),
                    Ok(t.clone()),
                    "{s:?} -> {shown:?}"
                );
                if let NetworkTarget::Domain(d) = &t {
                    assert_eq!(*d, d.to_ascii_lowercase());
                    assert!(!d.ends_with('.'));
                }
            }
            Err(e) => {
                assert_eq!(e.path, path.as_str());
                assert_eq!(e.value, s);
                assert!(!e.to_string().contains('\n'), "{e}");
            }
        }
        match parse_dns(s, &path) {
            Ok(p) => {
                let shown = p.to_string();
                assert_eq!(
                    parse_dns(&shown, &path),
                    Ok(p.clone()),
                    "{s:?} -> {shown:?}"
                );
                match &p {
                    DnsPattern::Exact(n) => {
                        assert!(p.matches(n) && p.matches(&n.to_ascii_uppercase()));
                    }
                    DnsPattern::Subdomains(suffix) => {
                        assert!(p.matches(&format!("x{suffix}")));
                        assert!(!p.matches(&suffix[1..]), "the apex of {s:?}");
                    }
                    DnsPattern::Any => assert_eq!(s, "*"),
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
        match parse_protocol(s, &path) {
            Ok(t) => assert_eq!(t.to_string(), s),
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
        match parse_path(s, &path) {
            Ok(PathTarget::Path(p)) => {
                assert_eq!(p.as_str(), s);
                let key = p.kernel_key();
                assert_eq!(&key[..s.len()], s.as_bytes());
                assert!(key[s.len()..].iter().all(|&b| b == 0));
            }
            Ok(PathTarget::Any) => assert_eq!(s, "*"),
            Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
        }
        // Matching an arbitrary observed name against any pattern is total.
        for pattern in ["*.example.com", "*.a", "example.com", "*"] {
            let _ = parse_dns(pattern, &path).unwrap().matches(s);
        }
    }
}

// ---- the CRD's rules, transcribed ----
//
// `minLength: 1`, `maxLength` (counted in characters, as the API server's
// OpenAPI validation counts), then `self == '*' || (<rule>)`.

fn bounded(s: &str, max: usize) -> bool {
    !s.is_empty() && s.chars().count() <= max
}

fn digits_and_dots(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// `^L([.]L)*[.]?$` where `L` is `A([-A]{0,61}A)?` with `A` the given
/// label characters: one to 63 characters a label, no hyphen at either end.
fn name_regex(s: &str, edge: impl Fn(char) -> bool) -> bool {
    let body = s.strip_suffix('.').unwrap_or(s);
    body.split('.').all(|label| {
        let (Some(first), Some(last)) = (label.chars().next(), label.chars().last()) else {
            return false;
        };
        label.chars().count() <= 63
            && edge(first)
            && edge(last)
            && label.chars().all(|c| c == '-' || edge(c))
    })
}

/// `^(0[xX][0-9a-fA-F]*|[0-9]+)([.](0[xX][0-9a-fA-F]*|[0-9]+))*[.]?$`: the
/// numbers `inet_aton` reads, refused as names.
fn numeric_name(s: &str) -> bool {
    let body = s.strip_suffix('.').unwrap_or(s);
    !body.is_empty()
        && body.split('.').all(
            |l| match l.strip_prefix("0x").or_else(|| l.strip_prefix("0X")) {
                Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
                None => !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()),
            },
        )
}

/// The hostname branch of the network rules (the address branches need
/// Go's `netip`; the unit tests pin them case by case): the shape rule and
/// the numeric-name rule.
fn cel_network_name(s: &str) -> bool {
    name_regex(s, |c| c.is_ascii_alphanumeric()) && !numeric_name(s)
}

fn cel_dns(s: &str) -> bool {
    let rest = s.strip_prefix("*.").unwrap_or(s);
    !s.contains(':')
        && !digits_and_dots(s)
        && name_regex(rest, |c| c.is_ascii_alphanumeric() || c == '_')
        // The numeric-name rule: `!self.matches('^[0-9.]+$') && self.matches(N)`
        // refuses (digits and dots were refused above).
        && !numeric_name(s)
}

/// RE2's `\p{Z}`: the space, line and paragraph separators.
fn separator(c: char) -> bool {
    matches!(
        c,
        ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
    )
}

fn cel_path(s: &str) -> bool {
    s.starts_with('/')
        && (s == "/" || !s.ends_with('/'))
        && !s.contains("//")
        && !s.contains("/./")
        && !s.contains("/../")
        && !s.ends_with("/.")
        && !s.ends_with("/..")
        && !s.contains('*')
        && !s.contains('\0')
        && s.len() <= MAX_PATH_LEN
        // The three refusal rules: `\p{Cc}`, the bidi controls, `\p{Z}$`.
        && !s.chars().any(|c| matches!(c, '\0'..='\u{1F}' | '\u{7F}'..='\u{9F}'))
        && !s.chars().any(|c| {
            matches!(c, '\u{61C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        })
        && !s.chars().last().is_some_and(separator)
}

fn cel_protocol(s: &str) -> bool {
    ["ssh", "tls", "dns", "http/1.1", "http/2", "quic"].contains(&s)
        || s.strip_prefix("tls/").is_some_and(|alpn| {
            (1..=16).contains(&alpn.chars().count())
                && alpn.chars().all(|c| matches!(c, '!'..=')' | '+'..='~'))
        })
}

#[test]
fn the_parsers_and_the_crd_rules_agree_on_every_generated_value() {
    let path = FieldPath::spec();
    let mut admitted = BTreeMap::<&str, usize>::new();
    let inputs = inputs();
    for s in inputs.iter().map(String::as_str).chain(["*"]) {
        let network_name_branch = !s.contains('/') && !s.contains(':') && !digits_and_dots(s);
        let cases: [(&str, Option<bool>, Result<(), Reason>); 4] = [
            (
                "network",
                network_name_branch
                    .then(|| s == "*" || (bounded(s, MAX_HOSTNAME_LEN) && cel_network_name(s))),
                parse_network(s, &path).map(drop).map_err(|e| e.reason),
            ),
            (
                "dns",
                Some(s == "*" || (bounded(s, MAX_HOSTNAME_LEN) && cel_dns(s))),
                parse_dns(s, &path).map(drop).map_err(|e| e.reason),
            ),
            (
                "path",
                Some(s == "*" || (bounded(s, MAX_PATH_LEN) && cel_path(s))),
                parse_path(s, &path).map(drop).map_err(|e| e.reason),
            ),
            (
                "protocol",
                Some(s == "*" || (bounded(s, MAX_ALPN_LEN + 4) && cel_protocol(s))),
                parse_protocol(s, &path).map(drop).map_err(|e| e.reason),
            ),
        ];
        for (kind, cel, rust) in cases {
            let Some(cel) = cel else { continue };
            match (cel, rust) {
                (false, Ok(())) => panic!("{kind}: the CRD refuses {s:?} but it parses"),
                (true, Err(reason)) => {
                    panic!("{kind}: the CRD admits {s:?} but it is refused: {reason:?}")
                }
                (true, Ok(())) => *admitted.entry(kind).or_default() += 1,
                (false, Err(_)) => {}
            }
        }
    }
    eprintln!("admitted by both: {admitted:?}");
    // The generator reaches acceptance for every kind, so agreement is
    // tested on both sides of each rule.
    for kind in ["network", "dns", "path", "protocol"] {
        assert!(
            admitted.get(kind).is_some_and(|&n| n > 100),
            "{kind}: {admitted:?}"
        );
    }
}
