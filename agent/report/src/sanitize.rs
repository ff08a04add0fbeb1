//! The redaction chokepoint: [`sanitize`] for any string, and
//! [`sanitize_argv`] for an exec's argument vector.
//!
//! Every string that leaves the daemon as part of a finding (a Report
//! result, a pushed finding, an Event note, a log line) passes through
//! here. It is not configurable on purpose: an option that weakens it would
//! be an option someone turns on. The rules a user can rely on are
//! documented, with one example per rule that a test runs, in
//! `docs/redaction.md`.
//!
//! What [`sanitize`] does, in order, and why in that order:
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
//! 3. **Masking**, each secret replaced by `***`: the text rules of
//!    `text` (URL userinfo, token shapes, `user:pass@host`, `key=value`
//!    and `Name: value` whose key names a secret, `--flag value`, `Bearer`
//!    tokens, long random-looking runs).
//! 4. **Truncation** to [`MAX_CHARS`] characters, on a character boundary,
//!    ending in `…`. Last, so masking saw the whole value: truncating first
//!    could cut `token=abc` before the `=` and leave `abc` unrecognized.
//!
//! [`sanitize_argv`] first applies the argv rules of `argv` (what the
//! position of an argument tells: the value after `--password`, `mysql
//! -p`, `curl -u user:pass`, the command inside `sh -c "..."`; see
//! `programs` and `shell`), then [`sanitize`] to each argument.
//!
//! Both are idempotent (`f(f(x)) == f(x)`), which is what lets a finding be
//! redacted at submission and its values pass through `sanitize` again
//! when a result is built, with the same outcome and the same fingerprint.
//!
//! They err toward masking: a mixed-case path segment of 32 characters
//! with a digit reads as a token and is masked. A lost path segment costs
//! a reader a guess; a leaked token costs a credential.

mod argv;
mod names;
mod programs;
mod shell;
mod text;
mod tokens;

#[cfg(any(test, feature = "redaction-cases"))]
pub mod cases;

#[cfg(test)]
mod tests;

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

/// Compiled once. The patterns are constants, so `None` (a pattern that
/// does not compile) is a bug the tests catch; should it ever ship,
/// [`sanitize`] fails closed and masks everything.
static PATTERNS: LazyLock<Option<text::Patterns>> = LazyLock::new(text::Patterns::compile);

/// How many rounds [`sanitize_argv`] takes to settle before it gives up and
/// masks every argument.
const SETTLE_ROUNDS: usize = 8;

/// [`sanitize`] for an argument vector, which also knows what a single
/// argument cannot tell: the value after a flag that names a secret
/// (`--password X`, `--key X`), program-specific flags (`mysql -pX`,
/// `sshpass -p X`, `docker login -p X`, `redis-cli -a X`, `openssl -k X`),
/// credentials (`curl -u user:***`), positional secrets (`htpasswd -b f u
/// ***`), and the same rules for each command of a shell command line
/// (`sh -c "mysql -p***"`). Each argument is then sanitized on its own, so
/// the result is idempotent like [`sanitize`]. The vector keeps its length.
pub fn sanitize_argv(argv: &[String]) -> Vec<String> {
    // Masking only ever adds masks, so rounds settle; the second round
    // sees what the first made of program names and values (a value that
    // named a program is `***` now) and is what makes the function
    // idempotent.
    let mut current: Vec<String> = argv
        .iter()
        .map(|a| pre_cut(&clean_characters(a)).to_string())
        .collect();
    for _ in 0..SETTLE_ROUNDS {
        let next: Vec<String> = argv::mask_words(&current, 0)
            .iter()
            .map(|a| sanitize(a))
            .collect();
        if next == current {
            return next;
        }
        current = next;
    }
    vec![MASK.to_string(); argv.len()]
}

/// [`sanitize`] for a text that may quote the arguments of `argv` (an
/// evaluator's error about the exec: `No such key: hunter2`): whatever
/// [`sanitize_argv`] masks in an argument is masked wherever the text
/// quotes it, whole or in part, and the text is then sanitized. A secret
/// that only its position in argv gives away (`mysql -p hunter2`) is a
/// plain word anywhere else.
pub fn sanitize_with_argv(text: &str, argv: &[String]) -> String {
    let redacted = sanitize_argv(argv);
    let mut secrets: Vec<String> = Vec::new();
    for (raw, red) in argv.iter().zip(&redacted) {
        let raw = clean_characters(raw);
        if &raw != red {
            secrets.extend(masked_parts(&raw, red));
        }
    }
    secrets.retain(|s| !s.trim().is_empty() && s != MASK);
    // Longest first, so a part inside a longer one does not split it.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    let mut out = clean_characters(text);
    for secret in &secrets {
        out = out.replace(secret.as_str(), MASK);
    }
    sanitize(&out)
}

/// What of `raw` its redaction `red` masked: the part between their
/// common prefix and suffix (everything that changed), and each span the
/// `***`s of `red` stand for when `red`'s other pieces are found in `raw`
/// in order.
fn masked_parts(raw: &str, red: &str) -> Vec<String> {
    let prefix: usize = raw
        .chars()
        .zip(red.chars())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a.len_utf8())
        .sum();
    let suffix: usize = raw[prefix..]
        .chars()
        .rev()
        .zip(red[prefix.min(red.len())..].chars().rev())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a.len_utf8())
        .sum();
    let mut parts = vec![raw[prefix..raw.len() - suffix].to_string()];
    let pieces: Vec<&str> = red.split(MASK).collect();
    let mut at = 0;
    for (i, piece) in pieces.iter().enumerate() {
        let found = if i == 0 {
            raw.starts_with(piece).then_some(0)
        } else {
            raw[at..].find(piece).map(|f| at + f)
        };
        let Some(found) = found else {
            break;
        };
        if i > 0 {
            parts.push(raw[at..found].to_string());
        }
        at = found + piece.len();
    }
    parts
}

/// Scrubs and bounds one string for output: control characters become
/// spaces and invisible formatting characters go; secret-looking material
/// is masked as `***` (URL userinfo, token shapes, `key=value` and
/// `--flag value` whose key names a secret, `Bearer` tokens, long
/// random-looking runs); and the result is cut to [`MAX_CHARS`] characters
/// ending in `…`. Idempotent, not configurable, and never fails: the
/// redaction chokepoint's one function for text.
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

/// Step 3: every text rule; everything masked if they failed to compile.
fn mask(input: &str) -> String {
    match PATTERNS.as_ref() {
        Some(p) => p.mask(input),
        None => MASK.to_string(),
    }
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
