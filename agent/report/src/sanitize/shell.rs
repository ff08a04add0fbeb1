//! Shell command lines inside arguments (`sh -c "..."`, `su -c "..."`,
//! `ssh host "..."`, `kubectl exec pod -- sh -c "..."`): split into simple
//! commands and words as a POSIX shell does, so that the argv rules apply
//! to each command inside, and put back together with only the masked
//! words changed.
//!
//! The split follows the shell closely enough for redaction, not for
//! execution: single quotes, double quotes (with `\"`, `\\`, `\$`, `` \` ``
//! escapes), `$'...'`, backslashes; `;`, `&`, `|`, `(`, `)`, backticks and
//! `$(` end a command; `<` and `>` end a word. An unclosed quote runs to the
//! end (the safe reading of an argument the kernel cut). Expansions stay as
//! written: `-p"$PW"` is the word `-p$PW`.

use std::ops::Range;

/// One word of a command: its text after quote removal, and where it
/// stands in the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Word {
    pub text: String,
    pub span: Range<usize>,
}

/// The simple commands of `line`, each a non-empty list of words.
pub(super) fn commands(line: &str) -> Vec<Vec<Word>> {
    let mut commands = Vec::new();
    let mut command: Vec<Word> = Vec::new();
    let mut word: Option<Word> = None;
    let mut chars = line.char_indices().peekable();

    fn finish_word(word: &mut Option<Word>, command: &mut Vec<Word>) {
        if let Some(w) = word.take() {
            command.push(w);
        }
    }
    fn finish_command(
        word: &mut Option<Word>,
        command: &mut Vec<Word>,
        commands: &mut Vec<Vec<Word>>,
    ) {
        finish_word(word, command);
        if !command.is_empty() {
            commands.push(std::mem::take(command));
        }
    }
    /// The word being built, started at `at` if there is none.
    fn current(word: &mut Option<Word>, at: usize) -> &mut Word {
        word.get_or_insert_with(|| Word {
            text: String::new(),
            span: at..at,
        })
    }

    while let Some((i, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => finish_word(&mut word, &mut command),
            ';' | '&' | '|' | '(' | ')' | '`' => {
                finish_command(&mut word, &mut command, &mut commands);
            }
            '<' | '>' => finish_word(&mut word, &mut command),
            '$' if matches!(chars.peek(), Some((_, '('))) => {
                chars.next();
                finish_command(&mut word, &mut command, &mut commands);
            }
            '$' if matches!(chars.peek(), Some((_, '\''))) => {
                chars.next();
                let w = current(&mut word, i);
                let mut end = line.len();
                while let Some((j, q)) = chars.next() {
                    match q {
                        '\'' => {
                            end = j + 1;
                            break;
                        }
                        '\\' => {
                            if let Some((_, e)) = chars.next() {
                                w.text.push(e);
                            }
                        }
                        _ => w.text.push(q),
                    }
                }
                w.span.end = end;
            }
            '\'' => {
                let w = current(&mut word, i);
                let mut end = line.len();
                for (j, q) in chars.by_ref() {
                    if q == '\'' {
                        end = j + 1;
                        break;
                    }
                    w.text.push(q);
                }
                w.span.end = end;
            }
            '"' => {
                let w = current(&mut word, i);
                let mut end = line.len();
                while let Some((j, q)) = chars.next() {
                    match q {
                        '"' => {
                            end = j + 1;
                            break;
                        }
                        '\\' => match chars.peek() {
                            Some(&(_, e)) if matches!(e, '"' | '\\' | '$' | '`') => {
                                chars.next();
                                w.text.push(e);
                            }
                            _ => w.text.push('\\'),
                        },
                        _ => w.text.push(q),
                    }
                }
                w.span.end = end;
            }
            '\\' => {
                let w = current(&mut word, i);
                match chars.next() {
                    Some((j, e)) => {
                        w.text.push(e);
                        w.span.end = j + e.len_utf8();
                    }
                    None => w.span.end = i + 1,
                }
            }
            _ => {
                let w = current(&mut word, i);
                w.text.push(c);
                w.span.end = i + c.len_utf8();
            }
        }
    }
    finish_command(&mut word, &mut command, &mut commands);
    commands
}

/// `line` with each word whose text `mask` changes replaced by the masked
/// text, quoted so that the shell (and [`commands`]) would read it back as
/// that text. Everything else stays as written.
pub(super) fn mask_line(line: &str, mut mask: impl FnMut(&[String]) -> Vec<String>) -> String {
    let mut edits: Vec<(Range<usize>, String)> = Vec::new();
    for command in commands(line) {
        let texts: Vec<String> = command.iter().map(|w| w.text.clone()).collect();
        let masked = mask(&texts);
        for (word, new) in command.iter().zip(masked) {
            if new != word.text {
                let written = line.get(word.span.clone()).unwrap_or_default();
                edits.push((word.span.clone(), quote(written, &new)));
            }
        }
    }
    if edits.is_empty() {
        return line.to_string();
    }
    edits.sort_by_key(|(span, _)| span.start);
    let mut out = String::with_capacity(line.len());
    let mut pos = 0;
    for (span, text) in edits {
        if span.start < pos || span.end > line.len() {
            // Words never overlap; should they, the later edit is dropped
            // rather than the line garbled (the earlier one masked more).
            continue;
        }
        out.push_str(&line[pos..span.start]);
        out.push_str(&text);
        pos = span.end;
    }
    out.push_str(&line[pos..]);
    out
}

/// `text` written so that [`commands`] reads it back as one word: bare
/// when it holds nothing the shell treats specially, in the double quotes
/// it was written in when that suffices, else in single quotes.
fn quote(written: &str, text: &str) -> String {
    let special = |c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '\'' | '"' | '\\' | '$' | '`' | ';' | '&' | '|' | '<' | '>' | '(' | ')'
            )
    };
    if !text.is_empty() && !text.contains(special) {
        return text.to_string();
    }
    // Inside double quotes `$(...)` and backticks stay what they were (the
    // text came from inside the same quotes); only `"` and `\` would need
    // escapes.
    if written.starts_with('"') && !text.contains(['"', '\\']) {
        return format!("\"{text}\"");
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<Vec<String>> {
        commands(line)
            .into_iter()
            .map(|c| c.into_iter().map(|w| w.text).collect())
            .collect()
    }

    #[test]
    fn words_and_commands() {
        assert_eq!(
            texts(r#"mysql -uroot -p"a b" -e 'select 1' && curl -u bob:x http://h; echo $(id -u)"#),
            [
                vec!["mysql", "-uroot", "-pa b", "-e", "select 1"],
                vec!["curl", "-u", "bob:x", "http://h"],
                vec!["echo"],
                vec!["id", "-u"],
            ]
        );
        assert_eq!(
            texts(r"a\ b c>out 2>&1|d"),
            [vec!["a b", "c", "out", "2"], vec!["1"], vec!["d"]]
        );
        assert_eq!(
            texts(r#"x "a\"b\\c\d" $'e\'f'"#),
            [vec!["x", r#"a"b\c\d"#, "e'f"]]
        );
        assert_eq!(
            texts("unclosed 'quote runs"),
            [vec!["unclosed", "quote runs"]]
        );
        assert_eq!(texts("unclosed \"dq \\"), [vec!["unclosed", "dq \\"]]);
        assert!(texts("  ;; & ").is_empty());
    }

    #[test]
    fn spans_cover_the_written_word() {
        let line = r#"a -p"x y" 'q'"#;
        let c = commands(line);
        assert_eq!(&line[c[0][1].span.clone()], r#"-p"x y""#);
        assert_eq!(&line[c[0][2].span.clone()], "'q'");
    }

    #[test]
    fn only_masked_words_change() {
        let line = r#"mysql  -p"s3 cret" -h db ; echo 'hi there'"#;
        let out = mask_line(line, |w| {
            w.iter()
                .map(|t| {
                    if t.starts_with("-p") {
                        "-p***".into()
                    } else {
                        t.clone()
                    }
                })
                .collect()
        });
        assert_eq!(out, r#"mysql  -p*** -h db ; echo 'hi there'"#);
    }

    #[test]
    fn quoting_reads_back() {
        for (written, text) in [
            ("'x'", "a b"),
            ("\"x\"", "a b"),
            ("\"x\"", "a$b"),
            ("x", "it's"),
            ("x", ""),
            ("x", "***"),
        ] {
            let q = quote(written, text);
            assert_eq!(texts(&q), [vec![text.to_string()]], "{q}");
        }
    }
}
