//! The YAML documents of a policy file, read as `kubectl apply` reads them.
//!
//! - A byte order mark at the start of the text or of a document (after a
//!   `---` line) is skipped, as kubectl's reader does; libyaml would take
//!   it for content.
//! - A syntax error ends the file (the patched serde_yaml stops its stream
//!   there) and always names its line and column: libyaml reports a
//!   character it refuses (NUL, another control character, a byte order
//!   mark inside the text) by byte offset only, so that offset is turned
//!   into a line and column here.
//! - Each document becomes the JSON kubectl would send ([`to_json`]).
//!
//! One difference remains: kubectl resolves plain scalars by YAML 1.1
//! (`yes`, `no`, `on`, `off`, `y` and `n` are booleans), serde_yaml by
//! YAML 1.2 (they are strings), and which a scalar was quoted is not kept.
//! A string field holding one of those words unquoted is refused by the
//! server as a boolean and read here as a string; README says to quote.

use std::fmt::Write as _;

/// The byte order mark.
const BOM: char = '\u{feff}';

/// `text` without the byte order marks kubectl skips.
fn strip_boms(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at_document_start = true;
    for line in text.split_inclusive('\n') {
        let line = if at_document_start {
            line.trim_start_matches(BOM)
        } else {
            line
        };
        at_document_start = line.trim_end() == "---" || line.trim_end().starts_with("--- ");
        out.push_str(line);
    }
    out
}

/// Whether libyaml reads `c` (its `IS_PRINTABLE`, less the byte order mark
/// it refuses inside the text).
fn yaml_printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        && c != BOM
}

/// A syntax error, with a line and column always.
#[derive(Debug)]
pub(crate) struct YamlError(String);

impl std::fmt::Display for YamlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn locate(text: &str, e: &serde_yaml::Error) -> YamlError {
    // libyaml's reader errors carry a byte offset ("at position 4"), its
    // scanner's and parser's a line and column.
    if e.to_string().contains(" at line ") {
        return YamlError(e.to_string());
    }
    let Some((offset, c)) = text.char_indices().find(|(_, c)| !yaml_printable(*c)) else {
        return YamlError(e.to_string());
    };
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let mut msg = format!("line {line} column {column}: character U+{:04X} ", c as u32);
    let _ = write!(
        msg,
        "is not allowed in YAML ({})",
        if c == BOM {
            "a byte order mark may only start a document"
        } else {
            "a control character"
        }
    );
    YamlError(msg)
}

/// Every document of `text`, parsed; the last is the syntax error when
/// there is one.
pub(crate) fn documents(text: &str) -> Vec<Result<serde_yaml::Value, YamlError>> {
    use serde::Deserialize as _;
    let text = strip_boms(text);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).map_err(|e| locate(&text, &e)))
        .collect()
}

/// A YAML document as the JSON `kubectl` sends: mapping keys that are
/// numbers or booleans become strings (as sigs.k8s.io/yaml does), a tag is
/// dropped; a value JSON cannot hold (`.inf`, `.nan`, a key that is a
/// collection) is an error naming where it is.
pub(crate) fn to_json(v: &serde_yaml::Value, at: &str) -> Result<serde_json::Value, String> {
    use serde_json::Value as Json;
    use serde_yaml::Value as Yaml;
    Ok(match v {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(*b),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Json::from(i)
            } else if let Some(u) = n.as_u64() {
                Json::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map(Json::Number)
                    .ok_or_else(|| format!("{}: {n} cannot be written in JSON", show_at(at)))?
            }
        }
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Sequence(items) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| to_json(v, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Number(n) => n.to_string(),
                    Yaml::Bool(b) => b.to_string(),
                    Yaml::Null => "null".to_owned(),
                    _ => return Err(format!("{}: a mapping key must be a scalar", show_at(at))),
                };
                let child = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                out.insert(key, to_json(v, &child)?);
            }
            Json::Object(out)
        }
        Yaml::Tagged(t) => to_json(&t.value, at)?,
    })
}

fn show_at(at: &str) -> &str {
    if at.is_empty() {
        "the document"
    } else {
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        documents(text)
            .into_iter()
            .filter_map(|d| d.err().map(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn a_syntax_error_is_one_error_with_its_line_and_column() {
        assert_eq!(
            errors("a: 1\nb: x\u{0}y\n"),
            ["line 2 column 5: character U+0000 is not allowed in YAML (a control character)"]
        );
        assert_eq!(
            errors("a: 1\nb: \u{1b}\n"),
            ["line 2 column 4: character U+001B is not allowed in YAML (a control character)"]
        );
        let unclosed = errors("a: {b: 1\n");
        assert_eq!(unclosed.len(), 1, "{unclosed:?}");
        assert!(unclosed[0].contains("at line 2 column 1"), "{unclosed:?}");
    }

    #[test]
    fn a_byte_order_mark_starting_a_document_is_skipped() {
        let docs = documents("\u{feff}a: 1\n---\n\u{feff}b: 2\n");
        assert_eq!(docs.len(), 2);
        assert!(docs.iter().all(Result::is_ok), "{docs:?}");
        // Inside a value it is content (libyaml and kubectl agree), and the
        // value is then whatever the schema makes of it.
        let docs = documents("a: b\u{feff}\n");
        assert_eq!(
            docs[0]
                .as_ref()
                .ok()
                .and_then(|v| v.get("a"))
                .and_then(|v| v.as_str()),
            Some("b\u{feff}")
        );
    }
}
