//! Reading the files and standard input a subcommand is given, bounded.
//!
//! Every file a person or a script hands the CLI (policies, `--data`,
//! recorded events, Reports, collector lines) goes through [`read_text`]:
//! at most [`MAX_INPUT_BYTES`] are read, so `/dev/zero`, a FIFO that never
//! ends or a mistaken multi-gigabyte file fails at once with a clear
//! message instead of filling memory, and the bytes must be UTF-8.

use std::io::Read;
use std::path::Path;

/// The most bytes one input may hold: 16 MiB, far above any policy, event
/// recording or Report a person writes (a 5,000-entry network list is
/// about 100 KiB), small enough to hold in memory several times over.
pub const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

/// Why an input could not be read. Its display names the input (a path,
/// or "standard input") and never quotes the content.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Opening or reading failed.
    // The I/O error is shown in this message rather than as a `source`:
    // printed as an error chain it would otherwise appear twice.
    #[error("{name}: {error}")]
    Io {
        /// The input's name.
        name: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// More than the bound: not read to its end.
    #[error(
        "{name}: larger than {limit} bytes (the limit for one input); nothing was read past it"
    )]
    TooLarge {
        /// The input's name.
        name: String,
        /// The bound that was passed.
        limit: u64,
    },
    /// Not UTF-8 text.
    #[error("{name}: not UTF-8 text (invalid byte at offset {offset})")]
    NotText {
        /// The input's name.
        name: String,
        /// The offset of the first byte that is not UTF-8.
        offset: usize,
    },
}

/// The name an input is shown under: `-` is standard input.
pub fn input_name(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Reads `path` (`-`: standard input) as UTF-8 text of at most
/// [`MAX_INPUT_BYTES`].
pub fn read_text(path: &Path) -> Result<String, InputError> {
    read_text_bounded(path, MAX_INPUT_BYTES)
}

/// [`read_text`] with another bound (tests).
pub fn read_text_bounded(path: &Path, limit: u64) -> Result<String, InputError> {
    let name = input_name(path);
    let io = |error| InputError::Io {
        name: name.clone(),
        error,
    };
    let bytes = if path == Path::new("-") {
        read_at_most(std::io::stdin().lock(), limit).map_err(io)?
    } else {
        read_at_most(std::fs::File::open(path).map_err(io)?, limit).map_err(io)?
    };
    let Some(bytes) = bytes else {
        return Err(InputError::TooLarge { name, limit });
    };
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        name,
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Checks the kubeconfig files the kube client is about to read (each
/// path of `KUBECONFIG`, else `~/.kube/config`, as `kube::Config::infer`
/// looks for them): each that exists must be a regular file of at most
/// [`MAX_INPUT_BYTES`]. The client reads them itself, unbounded, so a
/// `KUBECONFIG=/dev/zero` would otherwise read until memory ran out.
pub fn check_kubeconfig() -> Result<(), InputError> {
    let paths: Vec<std::path::PathBuf> = match std::env::var_os("KUBECONFIG") {
        Some(list) => std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        None => std::env::var_os("HOME")
            .map(|home| std::path::Path::new(&home).join(".kube/config"))
            .into_iter()
            .collect(),
    };
    for path in paths {
        let name = format!("kubeconfig {}", path.display());
        let Ok(meta) = std::fs::metadata(&path) else {
            // Missing: the client says so (or falls back to in-cluster).
            continue;
        };
        if !meta.is_file() {
            return Err(InputError::Io {
                name,
                error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
            });
        }
        if meta.len() > MAX_INPUT_BYTES {
            return Err(InputError::TooLarge {
                name,
                limit: MAX_INPUT_BYTES,
            });
        }
    }
    Ok(())
}

/// Reads an input already open (`name` is how errors show it) as UTF-8
/// text of at most [`MAX_INPUT_BYTES`].
pub fn read_text_from(name: &str, reader: impl Read) -> Result<String, InputError> {
    let bytes = read_at_most(reader, MAX_INPUT_BYTES).map_err(|error| InputError::Io {
        name: name.to_owned(),
        error,
    })?;
    let Some(bytes) = bytes else {
        return Err(InputError::TooLarge {
            name: name.to_owned(),
            limit: MAX_INPUT_BYTES,
        });
    };
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        name: name.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// A parser's error message (serde's, YAML's, JSON's) without the input
/// it quotes: every double-quoted string (`invalid type: string "..."`,
/// `duplicate entry with key "..."`) and every back-quoted scalar (an
/// integer, float, character, boolean or enum variant) becomes `…`. What
/// stays says what was expected and where (line, column, field names), so
/// the message still helps whoever wrote the file; what goes is anything a
/// file the reader should not have shown could have put there (a token
/// read by mistake prints as `string "…"`, not as itself).
pub fn content_free(message: &str) -> String {
    const SCALARS: [&str; 5] = [
        "integer ",
        "floating point ",
        "character ",
        "boolean ",
        "variant ",
    ];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(['"', '`']) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let quote = if from.starts_with('"') { '"' } else { '`' };
        let body = &from[1..];
        // The closing quote: serde writes a string with Rust's escapes
        // (`\"` inside), a back-quoted scalar has none.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if quote == '"' && !escaped => escaped = true,
                c if c == quote && !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else {
            // Unbalanced: nothing after it can be told apart from input.
            out.push(quote);
            out.push('…');
            return out;
        };
        let redact = quote == '"' || SCALARS.iter().any(|s| out.ends_with(s));
        out.push(quote);
        if redact {
            out.push('…');
        } else {
            out.push_str(&body[..end]);
        }
        out.push(quote);
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Reads at most `limit` bytes; `None` when there were more.
fn read_at_most(reader: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_input_fails_at_the_bound() {
        // /dev/zero never ends: the read stops one byte past the bound.
        let err = read_text_bounded(Path::new("/dev/zero"), 4096)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("/dev/zero: larger than 4096 bytes (the limit for one input); nothing was read past it")
        );
    }

    #[test]
    fn text_at_the_bound_is_read_and_bytes_that_are_not_utf8_are_named() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, "abcd").unwrap_or_else(|e| panic!("write: {e}"));
        assert_eq!(read_text_bounded(&file, 4).ok().as_deref(), Some("abcd"));
        assert!(matches!(
            read_text_bounded(&file, 3),
            Err(InputError::TooLarge { limit: 3, .. })
        ));
        std::fs::write(&file, b"ok\xff secret").unwrap_or_else(|e| panic!("write: {e}"));
        let err = read_text(&file)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.ends_with("not UTF-8 text (invalid byte at offset 2)"),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn a_parser_message_keeps_its_shape_and_loses_the_input() {
        let cases = [
            (
                "invalid type: string \"ghp_SECRET\", expected struct TestFile",
                "invalid type: string \"…\", expected struct TestFile",
            ),
            (
                "invalid type: string \"a\\\"b\", expected u64 at line 3 column 9",
                "invalid type: string \"…\", expected u64 at line 3 column 9",
            ),
            (
                "unknown field `polices`, expected one of `name`, `policies`",
                "unknown field `polices`, expected one of `name`, `policies`",
            ),
            (
                "unknown variant `hunter2`, expected `monitor` or `enforce`",
                "unknown variant `…`, expected `monitor` or `enforce`",
            ),
            (
                "invalid value: integer `123456`, expected u8",
                "invalid value: integer `…`, expected u8",
            ),
            (
                "duplicate entry with key \"pw\" at line 2",
                "duplicate entry with key \"…\" at line 2",
            ),
            (
                "invalid type: string \"unclosed",
                "invalid type: string \"…",
            ),
            (
                "expected value at line 1 column 1",
                "expected value at line 1 column 1",
            ),
        ];
        for (message, want) in cases {
            assert_eq!(content_free(message), want, "{message}");
        }
    }

    #[test]
    fn an_open_reader_is_bounded_too() {
        let err = read_text_from("events", std::io::repeat(b'a'))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("events: larger than 16777216 bytes (the limit for one input); nothing was read past it")
        );
        assert_eq!(read_text_from("x", &b"ok"[..]).ok().as_deref(), Some("ok"));
    }

    #[test]
    fn a_missing_file_names_the_path() {
        let err = read_text(Path::new("/nonexistent/krt-input"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("/nonexistent/krt-input: "), "{err}");
        // As main prints it (an error chain): the reason once, not twice.
        let chain = read_text(Path::new("/nonexistent/krt-input"))
            .map_err(anyhow::Error::from)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert_eq!(
            chain,
            "/nonexistent/krt-input: No such file or directory (os error 2)"
        );
    }
}
