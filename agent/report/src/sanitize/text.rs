//! The text rules: what [`sanitize`](super::sanitize) masks in any string,
//! and [`sanitize_argv`](super::sanitize_argv) in every argument.
//!
//! In order (each rule sees what the previous left):
//!
//! 1. the userinfo of a URL (`scheme://user:pass@host` → `scheme://***@host`);
//! 2. token shapes ([`tokens`](super::tokens): `ghp_***`, `AKIA***`,
//!    `eyJ***`, a private key block to the end);
//! 3. `key=value` and `key: value` whose key names a secret (see
//!    [`names`](super::names)), keeping an auth scheme (`Authorization:
//!    Bearer ***`); a cookie's value is its whole `;`-separated list;
//! 4. `--flag value` whose flag names a secret;
//! 5. a bare `Bearer <token>`;
//! 6. long runs that look random (see [`looks_random`]);
//! 7. a password before `@host` without a scheme (`app:pw@db:5432` →
//!    `app:***@db:5432`; not an image digest `name:tag@sha256:...`).
//!
//! A URL's userinfo goes before `key: value` so its `user:pass` is not read
//! as a key and value; random runs go after the rules that keep context
//! (the key, the scheme, a token's prefix), so those win. The password
//! before `@host` goes last: its end is the first `/`, quote or space, and
//! an earlier rule masking a value with a `/` in it (`token=a/b`) must not
//! make a second pass find a longer password than the first did.

use super::names::{classify, reads_as_key_file, Form, Secrecy};
use super::tokens::Tokens;
use super::MASK;
use regex::{Captures, Regex};
use std::borrow::Cow;

/// A run at least this long may be masked as random-looking.
const RANDOM_RUN_MIN: usize = 32;

/// A value: quoted (an unclosed quote runs to the end, the safe reading of
/// truncated input) or bare up to whitespace, a quote or a separator.
const VALUE: &str = r#""[^"]*"?|'[^']*'?|[^\s"'&;,]+"#;

/// An auth scheme kept in front of a masked value.
const SCHEME: &str = r"(?P<scheme>(?i:bearer|basic|digest|token|negotiate)\s+)?";

/// The compiled text rules.
pub(super) struct Patterns {
    /// `scheme://userinfo@`: the userinfo goes, whatever it holds (a bare
    /// token works as userinfo as well as `user:password` does).
    userinfo: Regex,
    /// Token shapes.
    tokens: Tokens,
    /// `user:password@` without a scheme, before a host.
    bare_userinfo: Regex,
    /// `key=value`, `key: value`, `"key": "value"`: a candidate, kept or
    /// masked by the key's [`classify`].
    key_value: Regex,
    /// `--flag value`, `-flag value`: a candidate, kept or masked by the
    /// flag's name. Only at the start or after whitespace, so
    /// `my-auth-service started` is not read as a flag. The next word is
    /// masked even if it looks like another flag: a password may start
    /// with `-`, and masking a flag by mistake leaks nothing.
    flag: Regex,
    /// A bare `Bearer <token68>` (a header value without its name).
    bearer: Regex,
    /// Candidate runs for [`looks_random`]: the base64, base64url and hex
    /// alphabets (no `.`, so a file name's extension ends a run).
    run: Regex,
}

impl Patterns {
    pub(super) fn compile() -> Option<Patterns> {
        Some(Patterns {
            userinfo: Regex::new(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s@]+@").ok()?,
            tokens: Tokens::compile()?,
            bare_userinfo: Regex::new(r#"(?P<user>[A-Za-z0-9._%+\-]+):(?P<pass>[^\s/"'@]+)@"#)
                .ok()?,
            key_value: Regex::new(&format!(
                r#"(?P<key>[A-Za-z0-9_.\-]+)(?P<sep>["']?\s*[=:]\s*){SCHEME}(?P<value>{VALUE})"#
            ))
            .ok()?,
            flag: Regex::new(&format!(
                r"(?P<lead>^|\s)(?P<key>--?[A-Za-z0-9_.\-]+)(?P<sep>\s+){SCHEME}(?P<value>{VALUE})"
            ))
            .ok()?,
            bearer: Regex::new(r"(?i)\b(?P<scheme>bearer)\s+[a-z0-9._~+/\-]+=*").ok()?,
            run: Regex::new(r"[A-Za-z0-9+/=_\-]{32,}").ok()?,
        })
    }

    /// Every text rule, in order.
    pub(super) fn mask(&self, input: &str) -> String {
        let s = self
            .userinfo
            .replace_all(input, |c: &Captures<'_>| format!("{}{MASK}@", &c[1]));
        let s = self.tokens.mask(&s);
        let s = self.key_values(&s);
        let s = self.flags(&s);
        let s = self
            .bearer
            .replace_all(&s, |c: &Captures<'_>| format!("{} {MASK}", &c["scheme"]));
        let s = self
            .run
            .replace_all(&s, |c: &Captures<'_>| mask_run(&c[0]).into_owned());
        self.bare_userinfo(&s)
    }

    fn bare_userinfo(&self, input: &str) -> String {
        scan(&self.bare_userinfo, input, |c| {
            let keep = Step::Keep {
                resume: c.name("pass").map_or(0, |m| m.start()),
            };
            let Some(m) = c.get(0) else {
                return keep;
            };
            let after = &input[m.end()..];
            let host_len = host_length(after);
            let host = &after[..host_len];
            let digest = matches!(host, "sha256" | "sha512" | "sha384" | "sha1")
                && after[host_len..].starts_with(':');
            if host_len == 0 || digest || c["user"].eq_ignore_ascii_case("mailto") {
                // No host, an image reference `name:tag@sha256:...`, an
                // address: the scan goes on after the user.
                return keep;
            }
            if c["pass"].chars().all(|ch| ch == '*' || ch == ':') {
                // Masked already (`***`, or `***:***` where a random run
                // before it was masked).
                return keep;
            }
            // A password with `@` in it (`u:p@ss@db`): through the last `@`
            // of the word, so no part of it is taken for the host.
            let word_end = after
                .find(|ch: char| ch.is_whitespace() || matches!(ch, '/' | '"' | '\''))
                .unwrap_or(after.len());
            let end = match after[..word_end].rfind('@') {
                Some(at) if host_length(&after[at + 1..]) > 0 => m.end() + at + 1,
                _ => m.end(),
            };
            Step::Replace {
                with: format!("{}:{MASK}@", &c["user"]),
                end: Some(end),
            }
        })
    }

    fn key_values(&self, input: &str) -> String {
        scan(&self.key_value, input, |c| {
            let key = &c["key"];
            let sep = &c["sep"];
            let value = &c["value"];
            let form = if sep.contains('=') {
                Form::Assignment
            } else {
                Form::Colon
            };
            // `PWD=/srv/app` is the shell's working directory, not the
            // ODBC `Pwd=` password.
            let working_directory = key == "PWD" && value.starts_with('/');
            let class = classify(key);
            let key_file = class == Secrecy::KeyLike && reads_as_key_file(value);
            if !class.masks(form) || working_directory || key_file {
                // Go on after the separator: the value may hold a secret
                // key of its own (`--from-literal=password=x`).
                return Step::Keep {
                    resume: c.name("sep").map_or(0, |m| m.end()),
                };
            }
            let scheme = c.name("scheme").map_or("", |m| m.as_str());
            let end = is_cookie(key).then(|| value_end_of_list(input, c));
            Step::Replace {
                with: format!("{key}{sep}{scheme}{}", masked_value(c)),
                end,
            }
        })
    }

    fn flags(&self, input: &str) -> String {
        scan(&self.flag, input, |c| {
            let class = classify(&c["key"]);
            if class == Secrecy::Plain
                || (class == Secrecy::KeyLike && reads_as_key_file(&c["value"]))
            {
                return Step::Keep {
                    resume: c.name("key").map_or(0, |m| m.end()),
                };
            }
            let scheme = c.name("scheme").map_or("", |m| m.as_str());
            Step::Replace {
                with: format!(
                    "{}{}{}{scheme}{}",
                    &c["lead"],
                    &c["key"],
                    &c["sep"],
                    masked_value(c)
                ),
                end: None,
            }
        })
    }
}

/// How long the host name or `[address]` at the start of `text` is.
fn host_length(text: &str) -> usize {
    if let Some(rest) = text.strip_prefix('[') {
        return match rest.find(']') {
            Some(close)
                if rest[..close]
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.')) =>
            {
                close + 2
            }
            _ => 0,
        };
    }
    text.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.')))
        .unwrap_or(text.len())
}

/// Whether a key names a cookie (`Cookie`, `Set-Cookie`, `--cookie`),
/// whose value is a `;`-separated list masked whole.
fn is_cookie(key: &str) -> bool {
    key.to_ascii_lowercase().contains("cookie")
}

/// Where a cookie list that starts at the match's value ends: a quoted
/// value at its closing quote; a bare one after every further `; pair`
/// (`a=b; c=d`), so what follows the list (a URL) stays.
fn value_end_of_list(input: &str, c: &Captures<'_>) -> usize {
    let Some(value) = c.name("value") else {
        return input.len();
    };
    let mut end = value.end();
    if value.as_str().starts_with(['"', '\'']) {
        return end;
    }
    while let Some(rest) = input[end..].strip_prefix(';') {
        let pair = rest.trim_start();
        let len = pair
            .find(|ch: char| ch.is_whitespace() || matches!(ch, '"' | '\'' | ';' | ','))
            .unwrap_or(pair.len());
        if len == 0 {
            // A trailing `;`: nothing more of the list.
            break;
        }
        end = input.len() - pair.len() + len;
    }
    end
}

/// What [`scan`]'s decision does with a match.
pub(super) enum Step {
    /// Keep the text up to `resume` (inside the match, after its start)
    /// and look for the next match from there.
    Keep { resume: usize },
    /// Replace the match (through `end` when given, else the match's end)
    /// by `with`.
    Replace { with: String, end: Option<usize> },
}

/// `re`'s matches, left to right, each kept or replaced by `decide`.
/// Unlike `replace_all`, a kept match is searched again from inside
/// itself, so `a=password=x` finds `password=x` after keeping `a=`.
pub(super) fn scan(
    re: &Regex,
    input: &str,
    mut decide: impl FnMut(&Captures<'_>) -> Step,
) -> String {
    let mut out = String::with_capacity(input.len());
    let mut pos = 0;
    while pos <= input.len() {
        let Some(c) = re.captures_at(input, pos) else {
            break;
        };
        let Some(m) = c.get(0) else {
            break;
        };
        match decide(&c) {
            Step::Keep { resume } => {
                // Always move forward, on a character boundary.
                let mut next = resume.max(m.start() + 1);
                while next < input.len() && !input.is_char_boundary(next) {
                    next += 1;
                }
                let next = next.min(input.len());
                out.push_str(&input[pos..next]);
                if next == input.len() {
                    pos = next;
                    break;
                }
                pos = next;
            }
            Step::Replace { with, end } => {
                let end = end.unwrap_or(m.end()).max(m.end()).min(input.len());
                out.push_str(&input[pos..m.start()]);
                out.push_str(&with);
                if end == m.start() {
                    // An empty match: step over one character.
                    match input[end..].chars().next() {
                        Some(ch) => {
                            out.push(ch);
                            pos = end + ch.len_utf8();
                        }
                        None => {
                            pos = end;
                            break;
                        }
                    }
                } else {
                    pos = end;
                }
            }
        }
    }
    if pos < input.len() {
        out.push_str(&input[pos..]);
    }
    out
}

/// The mask for a matched value, keeping its quotes: `"***"` in place of a
/// quoted value keeps JSON and shell text well-formed, and is what makes
/// masking idempotent (a bare `***` right before the `}` that followed the
/// closing quote would read as a value `***}` the next time).
fn masked_value(c: &Captures<'_>) -> &'static str {
    match c.name("value").map(|m| m.as_str().as_bytes().first()) {
        Some(Some(b'"')) => "\"***\"",
        Some(Some(b'\'')) => "'***'",
        _ => MASK,
    }
}

/// A run from `Patterns::run`: a path (leading `/`) is judged segment by segment,
/// so a long path is not masked whole for one random-looking component;
/// anything else is judged whole, so a base64 token containing `/` is not
/// split into innocent-looking pieces.
fn mask_run(run: &str) -> Cow<'_, str> {
    if run.starts_with('/') {
        if !run.split('/').any(looks_random) {
            return Cow::Borrowed(run);
        }
        let segments: Vec<&str> = run
            .split('/')
            .map(|seg| if looks_random(seg) { MASK } else { seg })
            .collect();
        Cow::Owned(segments.join("/"))
    } else if looks_random(run) {
        Cow::Borrowed(MASK)
    } else {
        Cow::Borrowed(run)
    }
}

/// Whether a run of at least 32 characters reads as key material: all hex
/// digits (a hex key or digest), or upper case, lower case and digits
/// together (base64 and most vendor tokens). A single-case word with digits
/// (`x86_64-linux-gnu`, a UUID, a DNS name) is not.
fn looks_random(run: &str) -> bool {
    if run.len() < RANDOM_RUN_MIN {
        return false;
    }
    if run.bytes().all(|b| b.is_ascii_hexdigit()) {
        return true;
    }
    let upper = run.bytes().any(|b| b.is_ascii_uppercase());
    let lower = run.bytes().any(|b| b.is_ascii_lowercase());
    let digit = run.bytes().any(|b| b.is_ascii_digit());
    upper && lower && digit
}
