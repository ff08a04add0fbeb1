//! The redaction chokepoint's one function, [`sanitize`].
//!
//! Every string that leaves the daemon as part of a finding (a Report
//! result, a pushed finding, an Event note, a log line) passes through
//! here. It is not configurable on purpose: an option that weakens it would
//! be an option someone turns on.
//!
//! What it does, in order, and why in that order:
//!
//! 1. **Control and invisible characters.** C0/C1 controls and the Unicode
//!    line and paragraph separators become a space, so a value cannot
//!    forge a second log line or a second row in a viewer; zero-width and
//!    bidirectional formatting characters are deleted, so they can neither
//!    reorder what a reader sees nor split a keyword (`pass\u{200B}word=`)
//!    to slip past step 3. This runs first, so a tab between `--password`
//!    and its value is the whitespace the flag rule looks for.
//! 2. **A pre-cut** of pathological input at [`PRE_CUT_CHARS`], trimmed
//!    back to the last whitespace so no secret is cut in half into a
//!    fragment too short to be recognized. The regexes are linear-time, so
//!    this bounds work, not correctness.
//! 3. **Masking**, each match replaced by `***`: the userinfo of a URL
//!    (`scheme://user:pass@host` → `scheme://***@host`); `key=value` and
//!    `key: value` whose key names a secret (`password`, `token`,
//!    `api_key`, `auth`, ...), keeping an auth scheme (`Authorization:
//!    Bearer ***`); a `--flag value` whose flag names a secret; a bare
//!    `Bearer <token>`; and long runs that look random (see
//!    [`looks_random`]).
//! 4. **Truncation** to [`MAX_CHARS`] characters, on a character boundary,
//!    ending in `…`. Last, so masking saw the whole value: truncating first
//!    could cut `token=abc` before the `=` and leave `abc` unrecognized.
//!
//! `sanitize` is idempotent (`sanitize(sanitize(x)) == sanitize(x)`), which
//! is what lets a finding be redacted at submission and its values pass
//! through `sanitize` again when a result is built, with the same outcome
//! and the same fingerprint.
//!
//! It errs toward masking: a mixed-case path segment of 32 characters with
//! a digit reads as a token and is masked. A lost path segment costs a
//! reader a guess; a leaked token costs a credential.

use regex::{Captures, Regex};
use std::borrow::Cow;
use std::sync::LazyLock;

/// At most this many characters come out of [`sanitize`] (the `…` included).
pub const MAX_CHARS: usize = 256;

/// Input beyond this many characters is cut before masking. Masking shrinks
/// a 32-character run to 3 characters at most ~9:1 everywhere except a
/// masked `key=value`, so what the cut could expose lies far past
/// [`MAX_CHARS`]; the trim back to whitespace covers the one exception.
pub const PRE_CUT_CHARS: usize = 16 * 1024;

/// What a masked secret reads as.
pub const MASK: &str = "***";

/// A run at least this long may be masked as random-looking.
const RANDOM_RUN_MIN: usize = 32;

/// Key words that make a key, flag or header name a secret.
const SECRET_WORDS: &str =
    r"pass(?:word)?|passwd|secret|token|api[_-]?key|auth|credential|private[_-]?key";

/// A value: quoted (an unclosed quote runs to the end, the safe reading of
/// truncated input) or bare up to whitespace, a quote or a separator.
const VALUE: &str = r#""[^"]*"?|'[^']*'?|[^\s"'&;,]+"#;

/// The compiled masking rules.
struct Patterns {
    /// `scheme://userinfo@`: the userinfo goes, whatever it holds (a bare
    /// token works as userinfo as well as `user:password` does).
    userinfo: Regex,
    /// `key=value`, `key: value`, `"key": "value"`, with an optional auth
    /// scheme kept in front of the masked value.
    key_value: Regex,
    /// `--password hunter2`, `-token abc`: a flag naming a secret, then its
    /// value after whitespace. Only at the start or after whitespace, so
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
    fn compile() -> Option<Patterns> {
        let scheme = r"(?P<scheme>(?:bearer|basic|digest|token)\s+)?";
        let key = format!(r"[a-z0-9_.\-]*(?:{SECRET_WORDS})[a-z0-9_.\-]*");
        Some(Patterns {
            userinfo: Regex::new(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s@]+@").ok()?,
            key_value: Regex::new(&format!(
                r#"(?i)(?P<key>{key})(?P<sep>["']?\s*[=:]\s*){scheme}(?P<value>{VALUE})"#
            ))
            .ok()?,
            flag: Regex::new(&format!(
                r"(?i)(?P<lead>^|\s)(?P<key>--?{key})(?P<sep>\s+){scheme}(?P<value>{VALUE})"
            ))
            .ok()?,
            bearer: Regex::new(r"(?i)\b(?P<scheme>bearer)\s+[a-z0-9._~+/\-]+=*").ok()?,
            run: Regex::new(r"[A-Za-z0-9+/=_\-]{32,}").ok()?,
        })
    }
}

/// Compiled once. The patterns are constants, so `None` (a pattern that
/// does not compile) is a bug the tests catch; should it ever ship,
/// [`sanitize`] fails closed and masks everything.
static PATTERNS: LazyLock<Option<Patterns>> = LazyLock::new(Patterns::compile);

/// [`sanitize`] for an argument vector, which also knows what a single
/// argument cannot tell: an argument after a flag that names a secret
/// (`--password`, `--token`, ...) is masked whole, and the password half of
/// `user:password` after a flag that takes credentials (`-u`, `--user`,
/// `--proxy-user`, as curl and wget spell them) is masked. Each argument is
/// sanitized on its own as well, so the result is idempotent like
/// [`sanitize`].
pub fn sanitize_argv(argv: &[String]) -> Vec<String> {
    static SECRET_FLAG: LazyLock<Option<Regex>> = LazyLock::new(|| {
        Regex::new(&format!(
            r"(?i)^--?[a-z0-9_.\-]*(?:{SECRET_WORDS})[a-z0-9_.\-]*$"
        ))
        .ok()
    });
    let mut out = Vec::with_capacity(argv.len());
    let mut previous: Option<&str> = None;
    for arg in argv {
        let after_secret_flag = previous.is_some_and(|p| match SECRET_FLAG.as_ref() {
            Some(re) => re.is_match(p),
            // Fail closed, as `sanitize` does.
            None => true,
        });
        let after_credentials_flag =
            previous.is_some_and(|p| matches!(p, "-u" | "--user" | "--proxy-user" | "-U"));
        let value = if after_secret_flag {
            MASK.to_string()
        } else if after_credentials_flag && arg.contains(':') {
            let user = arg.split(':').next().unwrap_or_default();
            sanitize(&format!("{user}:{MASK}"))
        } else {
            sanitize(arg)
        };
        out.push(value);
        previous = Some(arg);
    }
    out
}

/// Scrubs and bounds one string for output: control characters become
/// spaces and invisible formatting characters go; secret-looking material
/// is masked as `***` (URL userinfo, `key=value` and `--flag value` whose
/// key names a secret, `Bearer` tokens, long random-looking runs); and the
/// result is cut to [`MAX_CHARS`] characters ending in `…`. Idempotent,
/// not configurable, and never fails: the redaction chokepoint's one
/// function.
pub fn sanitize(input: &str) -> String {
    let cleaned = clean_characters(input);
    let cut = pre_cut(&cleaned);
    let masked = mask(cut);
    let (mut out, _) = truncate(masked);
    // Masked text can read differently a second time: a cut can end it
    // inside a mask or a run (`token=**…`, the hex head of a longer word),
    // and a mask can join what a rule needs (a masked `pass: value` that
    // leaves `s://u:pass:***;h@host`, a URL userinfo on the next pass;
    // found by agent/fuzz's redact target). Settle it: mask and cut again
    // until nothing changes, so `sanitize` stays idempotent. Two rounds
    // suffice in practice; a text that does not settle is masked whole
    // rather than guessed at.
    for _ in 0..4 {
        let (next, _) = truncate(mask(&out));
        if next == out {
            return out;
        }
        out = next;
    }
    MASK.to_string()
}

/// Step 1: controls and line separators to a space, invisible formatting
/// characters deleted.
fn clean_characters(input: &str) -> String {
    input
        .chars()
        .filter(|&c| !is_invisible_format(c))
        .map(|c| {
            if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Zero-width and bidirectional formatting characters (Unicode `Cf`
/// characters that render as nothing or reorder text).
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}'              // soft hyphen
        | '\u{061C}'            // Arabic letter mark
        | '\u{180E}'            // Mongolian vowel separator
        | '\u{200B}'..='\u{200F}' // zero-width space/joiners, LRM, RLM
        | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
        | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
        | '\u{2066}'..='\u{2069}' // bidi isolates
        | '\u{FEFF}'            // zero-width no-break space
    )
}

/// Step 2: bounds the work on pathological input.
fn pre_cut(input: &str) -> &str {
    match input.char_indices().nth(PRE_CUT_CHARS) {
        None => input,
        Some((end, _)) => {
            let head = &input[..end];
            // Drop the word the cut went through: a secret cut in half
            // could be too short to be recognized.
            match head.rfind(char::is_whitespace) {
                Some(ws) => &head[..ws],
                None => "",
            }
        }
    }
}

/// Step 3: every masking rule, URL userinfo first (so its `user:pass` is
/// not read as a `key: value`), random-looking runs last (so the rules that
/// keep context, such as the key or the auth scheme, win).
fn mask(input: &str) -> String {
    let Some(p) = PATTERNS.as_ref() else {
        return MASK.to_string();
    };
    let scheme = |c: &Captures<'_>| c.name("scheme").map_or("", |m| m.as_str()).to_string();
    let s = p
        .userinfo
        .replace_all(input, |c: &Captures<'_>| format!("{}{MASK}@", &c[1]));
    let s = p.key_value.replace_all(&s, |c: &Captures<'_>| {
        format!("{}{}{}{}", &c["key"], &c["sep"], scheme(c), masked_value(c))
    });
    let s = p.flag.replace_all(&s, |c: &Captures<'_>| {
        format!(
            "{}{}{}{}{}",
            &c["lead"],
            &c["key"],
            &c["sep"],
            scheme(c),
            masked_value(c)
        )
    });
    let s = p
        .bearer
        .replace_all(&s, |c: &Captures<'_>| format!("{} {MASK}", &c["scheme"]));
    let s = p
        .run
        .replace_all(&s, |c: &Captures<'_>| mask_run(&c[0]).into_owned());
    s.into_owned()
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

/// Step 4: at most [`MAX_CHARS`] characters, the last one `…` if cut;
/// also says whether it cut.
fn truncate(s: String) -> (String, bool) {
    match s.char_indices().nth(MAX_CHARS) {
        None => (s, false),
        Some(_) => {
            let mut out: String = s.chars().take(MAX_CHARS - 1).collect();
            out.push('…');
            (out, true)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[track_caller]
    fn check(input: &str, want: &str) {
        assert_eq!(sanitize(input), want, "sanitize({input:?})");
        assert_eq!(sanitize(want), want, "idempotent on {want:?}");
    }

    #[test]
    fn the_patterns_compile() {
        assert!(PATTERNS.is_some());
    }

    /// Idempotence and bounds over many combinations of tricky fragments,
    /// including cuts at every position near the length limit.
    #[test]
    fn idempotent_and_bounded_on_mixed_input() {
        let fragments = [
            "token=",
            "--password ",
            "Authorization: Bearer ",
            "https://u:p@h/",
            "\"secret\": \"",
            "'",
            "}",
            " ",
            "\n",
            "\u{200B}",
            "é",
            "…",
            "***",
            "0123456789abcdef",
            "AbC9",
            "/usr/bin/",
            "=",
            ":",
            "-",
            "x",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ];
        // A small deterministic generator (xorshift): no test dependency,
        // and a failure reproduces.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let len = (next() % 120) as usize;
            let input: String = (0..len)
                .map(|_| fragments[(next() % fragments.len() as u64) as usize])
                .collect();
            let once = sanitize(&input);
            assert!(once.chars().count() <= MAX_CHARS, "{input:?}");
            assert!(!once.contains('\n'), "{input:?}");
            assert_eq!(sanitize(&once), once, "not idempotent on {input:?}");
        }
    }

    #[test]
    fn plain_values_pass_unchanged() {
        for s in [
            "/usr/bin/curl",
            "/usr/lib/x86_64-linux-gnu/libssl.so.3",
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "10.0.0.1",
            "api.openai.azure.com",
            "tcp",
            "web-7d9f8b6c5d-x2x9z",
            "8d3f0c2e-1b2a-4c3d-9e8f-0a1b2c3d4e5f",
            "exec of /bin/sh was denied by the kernel (policy no-shell)",
        ] {
            check(s, s);
        }
    }

    #[test]
    fn flags_naming_secrets_lose_their_values() {
        check(
            "mysql --password=hunter2 -h db",
            "mysql --password=*** -h db",
        );
        check(
            "mysql --password hunter2 -h db",
            "mysql --password *** -h db",
        );
        check("cli --token abc123 --verbose", "cli --token *** --verbose");
        check("cli --api-key=abc", "cli --api-key=***");
        check("cli --auth-token\tabc", "cli --auth-token ***");
        check(
            "cli --client-secret 'two words'",
            "cli --client-secret '***'",
        );
    }

    #[test]
    fn key_values_naming_secrets_lose_their_values() {
        check("DB_PASSWORD=hunter2 other=1", "DB_PASSWORD=*** other=1");
        check("github_token=ghp_x&page=2", "github_token=***&page=2");
        check(r#"{"password": "p w"}"#, r#"{"password": "***"}"#);
        check(r#"password="unclosed"#, r#"password="***""#);
        check("Private_Key: abc", "Private_Key: ***");
        check("credentials=a,b", "credentials=***,b");
        check("passwd=", "passwd=");
    }

    #[test]
    fn authorization_headers_keep_only_the_scheme() {
        check(
            "Authorization: Bearer eyJhbGciOi",
            "Authorization: Bearer ***",
        );
        check(
            "Authorization: Basic dXNlcjpwYXNz",
            "Authorization: Basic ***",
        );
        check("curl -H 'Bearer abc.def-ghi'", "curl -H 'Bearer ***'");
    }

    #[test]
    fn url_userinfo_is_masked() {
        check(
            "https://user:pass@example.com/x?y=1",
            "https://***@example.com/x?y=1",
        );
        check(
            "git clone https://ghp_token@github.com/o/r",
            "git clone https://***@github.com/o/r",
        );
        check("postgres://u:p@db:5432", "postgres://***@db:5432");
    }

    #[test]
    fn random_looking_runs_are_masked() {
        // AWS's documented example secret key: base64 with '/' inside.
        check("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", MASK);
        check(
            "curl -d 0123456789abcdef0123456789abcdef x",
            "curl -d *** x",
        );
        check(
            "/home/u/aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI/file",
            "/home/u/***/file",
        );
        // A JWT: its dot-separated parts are each masked.
        check(
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            "***.***.***",
        );
        // Single-case long runs are words, not keys.
        check(
            "/opt/verylongdirectorynamewithoutcapitals123/bin",
            "/opt/verylongdirectorynamewithoutcapitals123/bin",
        );
    }

    #[test]
    fn control_and_invisible_characters_cannot_forge_or_hide() {
        check("a\nb\rc\td\u{7}e", "a b c d e");
        check("line\u{2028}break", "line break");
        check("evil\u{202E}txt.exe", "eviltxt.exe");
        check("pass\u{200B}word=hunter2", "password=***");
    }

    #[test]
    fn long_values_are_bounded_on_a_char_boundary() {
        let long = "é".repeat(1000);
        let out = sanitize(&long);
        assert_eq!(out.chars().count(), MAX_CHARS);
        assert!(out.ends_with('…'));
        assert_eq!(sanitize(&out), out);
        // 'x', not 'a': a long run of hex digits is masked as key material.
        let exact = "x".repeat(MAX_CHARS);
        assert_eq!(sanitize(&exact), exact);
        let over = "x".repeat(MAX_CHARS + 1);
        assert_eq!(sanitize(&over).chars().count(), MAX_CHARS);
    }

    #[test]
    fn a_secret_is_masked_before_truncation_could_hide_its_key() {
        let input = format!("{} --password hunter2", "x ".repeat(200));
        assert!(!sanitize(&input).contains("hunter2"));
        let input = format!("--password {}", "hunter2".repeat(100));
        assert_eq!(sanitize(&input), "--password ***");
    }

    #[test]
    fn pathological_input_is_cut_without_leaving_a_fragment() {
        // A masked key=value shrinks 16 KiB to a few bytes; the pre-cut
        // must not leave half of the following token behind.
        let token = "AbCdEfGh12345678AbCdEfGh12345678AbCd";
        let pad = "a".repeat(PRE_CUT_CHARS - 20);
        let input = format!("token={pad} {token}");
        let out = sanitize(&input);
        assert!(!out.contains("AbCd"), "{out}");
        let single = "x".repeat(PRE_CUT_CHARS * 2);
        assert_eq!(sanitize(&single), "");
    }

    #[test]
    fn an_argv_masks_the_values_of_secret_flags_and_credentials() {
        let argv: Vec<String> = [
            "curl",
            "-u",
            "admin:hunter2",
            "--password",
            "hunter3",
            "--token=hunter4",
            "-H",
            "Authorization: Bearer hunter5",
            "sort",
            "-u",
            "file",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = super::sanitize_argv(&argv);
        let joined = out.join(" ");
        for secret in ["hunter2", "hunter3", "hunter4", "hunter5"] {
            assert!(!joined.contains(secret), "{secret}: {joined}");
        }
        assert_eq!(out[2], "admin:***");
        assert_eq!(out[4], "***");
        assert_eq!(out[10], "file", "-u without user:password is not masked");
        assert_eq!(super::sanitize_argv(&out), out, "idempotent");
    }
}
