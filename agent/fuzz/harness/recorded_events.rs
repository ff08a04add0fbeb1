//! Fuzzes `policy test`'s recorded events (JSON lines,
//! `docs/recorded-events.md`): `kyverno_runtime_plane::record::parse_lines`,
//! the decoding the command runs on each events file.
//!
//! Invariants beyond "no panic":
//! - an event that parses writes (`to_line`) a line that parses to an event
//!   writing the same line: recording and replaying lose nothing;
//! - a refused line's error is one line of text (no raw newline from the
//!   input), so `policy test` output cannot be forged.

use kyverno_runtime_plane::record::{parse_line, parse_lines, to_line};

/// One input: returns when it is not this target's kind of input,
/// panics when an invariant above does not hold.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for (number, parsed) in parse_lines(text) {
        match parsed {
            Ok(event) => {
                let line = to_line(&event);
                let again = parse_line(&line).unwrap_or_else(|e| {
                    panic!("line {number}: wrote {line}, which is refused: {e}")
                });
                assert_eq!(to_line(&again), line, "line {number}");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(
                    !message.contains(['\n', '\r']),
                    "line {number}: {message:?}"
                );
            }
        }
    }
}
