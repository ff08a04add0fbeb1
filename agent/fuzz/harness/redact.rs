//! Fuzzes the redaction chokepoint (`kyverno_runtime_report::sanitize` and
//! `sanitize_argv`), which every string of a finding passes through.
//!
//! Invariants beyond "no panic":
//! - idempotent: redacting redacted text changes nothing (what lets a
//!   finding be redacted at submission and again when a result is built);
//! - bounded: at most `MAX_CHARS` characters, no control character;
//! - a secret planted in a form the documented rule covers (`password=X`
//!   inside arbitrary text; `--password X` inside an arbitrary argv) never
//!   comes out, whatever surrounds it.
//!
//! The input is text; `\0` separates argv elements for the argv half.

use kyverno_runtime_report::{sanitize, sanitize_argv, MAX_CHARS};

/// The planted secret. Its snowman appears nowhere else (inputs holding one
/// skip the planted checks), so a snowman in the output is the secret, or
/// a piece of it, leaking.
const SECRET: &str = "Zq7\u{2603}vN3x";
const MARK: char = '\u{2603}';

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    let once = sanitize(text);
    assert_eq!(sanitize(&once), once, "not idempotent on {text:?}");
    bounded(&once, text);

    let argv: Vec<String> = text.split('\0').map(str::to_string).collect();
    let masked = sanitize_argv(&argv);
    assert_eq!(masked.len(), argv.len());
    assert_eq!(
        sanitize_argv(&masked),
        masked,
        "argv not idempotent on {argv:?}"
    );
    for a in &masked {
        bounded(a, text);
    }

    if text.contains(MARK) {
        return;
    }
    let (head, tail) = text.split_at(
        text.char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(i, _)| i),
    );
    let planted = format!("{head} password={SECRET} {tail}");
    let out = sanitize(&planted);
    assert!(
        !out.contains(MARK),
        "the planted secret survived: {planted:?} -> {out:?}"
    );

    let mut argv: Vec<String> = head.split('\0').map(str::to_string).collect();
    argv.push("--password".to_string());
    argv.push(SECRET.to_string());
    argv.extend(tail.split('\0').map(str::to_string));
    let out = sanitize_argv(&argv);
    assert!(
        !out.iter().any(|a| a.contains(MARK)),
        "the planted secret survived: {argv:?} -> {out:?}"
    );
}

fn bounded(out: &str, input: &str) {
    assert!(
        out.chars().count() <= MAX_CHARS,
        "{} characters from {input:?}",
        out.chars().count()
    );
    assert!(
        !out.chars().any(char::is_control),
        "a control character in {out:?} from {input:?}"
    );
}
