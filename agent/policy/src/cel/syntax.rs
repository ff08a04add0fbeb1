//! Parse errors in words.
//!
//! The `cel` parser reports what its ANTLR machinery says: token sets by
//! grammar name (`NUM_INT`, `'<EOF>'`), follow-up errors of its tree visitor
//! after a syntax error (`No \`ConditionalAndContextAll\`!`, `Incomplete
//! \`IndexContext\`!`), and its recursion limit as the `Debug` text of an
//! ANTLR error (`OtherError(ParseError { ... })`). None of that helps the
//! person who wrote the policy, so this module turns each error into a
//! sentence about the expression: what was found, what was expected, where.

use ::cel::parser::ParseError;

/// What one parse error says, in words.
#[derive(Debug, PartialEq)]
pub(crate) enum Wording {
    /// The expression nests deeper than the parser's limit.
    TooDeep,
    /// A follow-up of an earlier syntax error, naming parser internals: drop.
    Internal,
    /// A message for the user.
    Message(String),
}

/// At most this many parse errors are shown for one expression: the later
/// ones are usually the parser's attempts to recover from the first.
pub(crate) const MAX_SHOWN: usize = 3;

/// Words for one error of the `cel` parser.
pub(crate) fn word(e: &ParseError) -> Wording {
    let msg = e.msg.as_str();
    if msg.contains("Recursion limit of") {
        return Wording::TooDeep;
    }
    // The visitor's reports on a tree ANTLR left incomplete (they follow a
    // syntax error), and the placeholder of an aborted parse.
    if (msg.starts_with("No `") || msg.starts_with("Incomplete ") || msg.starts_with("Unknown `"))
        && msg.ends_with('!')
        || msg == "UNKNOWN"
        || msg == "unsupported ident kind"
    {
        return Wording::Internal;
    }
    let at = format!("line {}, column {}", e.pos.0, e.pos.1);
    let text = match msg.strip_prefix("Syntax error: ") {
        Some(antlr) => antlr_words(antlr),
        None => msg.to_string(),
    };
    Wording::Message(format!("{at}: {text}"))
}

/// Rewrites ANTLR's standard messages; anything else is kept as it is.
fn antlr_words(msg: &str) -> String {
    for prefix in ["mismatched input ", "extraneous input "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.split_once(" expecting ") {
                return format!(
                    "found {} where {} was expected",
                    token(found),
                    expected_words(expected)
                );
            }
        }
    }
    if let Some(found) = msg.strip_prefix("no viable alternative at input ") {
        return format!("cannot make sense of {}", token(found));
    }
    if let Some(rest) = msg.strip_prefix("missing ") {
        if let Some((missing, at)) = rest.split_once(" at ") {
            return format!("{} is missing before {}", token(missing), token(at));
        }
    }
    if let Some(found) = msg.strip_prefix("token recognition error at: ") {
        return format!(
            "{} is not valid CEL (an unclosed quote, a bad escape, or a character CEL does not use)",
            token(found)
        );
    }
    msg.to_string()
}

/// A token as ANTLR quotes it (`'=='`, `''abc'` for the text `'abc`), for
/// a sentence: in backticks, control characters escaped.
fn token(t: &str) -> String {
    if t == "'<EOF>'" || t == "<EOF>" {
        return "the end of the expression".to_string();
    }
    if let Some((_, words)) = TOKEN_NAMES.iter().find(|(name, _)| *name == t) {
        return (*words).to_string();
    }
    let text = t
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(t);
    format!("`{}`", escape_controls(text))
}

/// ANTLR's names of the CEL grammar's token classes.
const TOKEN_NAMES: &[(&str, &str)] = &[
    ("NUM_INT", "an integer"),
    ("NUM_UINT", "an unsigned integer"),
    ("NUM_FLOAT", "a number"),
    ("STRING", "a string"),
    ("BYTES", "a bytes literal"),
    ("IDENTIFIER", "a name"),
    ("ESC_IDENTIFIER", "a name in backticks"),
    ("WHITESPACE", "a space"),
    ("COMMENT", "a comment"),
];

/// Tokens that can start an operand.
const OPERAND_START: &[&str] = &[
    "'['",
    "'{'",
    "'('",
    "'.'",
    "'-'",
    "'!'",
    "'true'",
    "'false'",
    "'null'",
    "NUM_FLOAT",
    "NUM_INT",
    "NUM_UINT",
    "STRING",
    "BYTES",
    "IDENTIFIER",
    "ESC_IDENTIFIER",
    "'?'",
];

/// Tokens that continue an operand into a larger expression.
const OPERATORS: &[&str] = &[
    "'=='", "'!='", "'in'", "'<'", "'<='", "'>='", "'>'", "'&&'", "'||'", "'+'", "'-'", "'*'",
    "'/'", "'%'", "'?'", "'['", "'.'", "'('", "'.?'", "'[?'",
];

/// An expected-token set (`{'[', ',', IDENTIFIER}` or one token) in words:
/// the operand and operator classes are named as such, the rest listed.
fn expected_words(set: &str) -> String {
    let inner = set
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(set);
    // ANTLR names a token without fixed text by its grammar name.
    let mut tokens: Vec<&str> = inner.split(", ").map(str::trim).collect();
    let mut words = Vec::new();
    if tokens.contains(&"IDENTIFIER") {
        words.push("an operand (a name, a literal, or an expression in brackets)".to_string());
        tokens.retain(|t| !OPERAND_START.contains(t));
    }
    if tokens.contains(&"'=='") {
        words.push("an operator".to_string());
        tokens.retain(|t| !OPERATORS.contains(t));
    }
    words.extend(tokens.iter().filter(|t| !t.is_empty()).map(|t| token(t)));
    match words.len() {
        0 => "something else".to_string(),
        1 => words.remove(0),
        n => {
            let last = words.remove(n - 1);
            format!("{} or {last}", words.join(", "))
        }
    }
}

/// `source` as shown inside an error: its first 120 characters, with
/// control characters escaped so a message stays one readable line.
pub(crate) fn shown(source: &str) -> String {
    escape_controls(&source.chars().take(120).collect::<String>())
}

fn escape_controls(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(
        "mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
        "found the end of the expression where an operand (a name, a literal, or an expression in brackets) was expected"
    )]
    #[case(
        "mismatched input '<EOF>' expecting {']', ','}",
        "found the end of the expression where `]` or `,` was expected"
    )]
    #[case(
        "mismatched input '<EOF>' expecting {'==', '!=', 'in', '<', '<=', '>=', '>', '&&', '||', '[', '.', '-', ':', '+', '*', '/', '%'}",
        "found the end of the expression where an operator or `:` was expected"
    )]
    #[case(
        "extraneous input '2' expecting <EOF>",
        "found `2` where the end of the expression was expected"
    )]
    #[case("no viable alternative at input '..'", "cannot make sense of `..`")]
    #[case(
        "missing ')' at '<EOF>'",
        "`)` is missing before the end of the expression"
    )]
    #[case(
        "token recognition error at: ''abc'",
        "`'abc` is not valid CEL (an unclosed quote, a bad escape, or a character CEL does not use)"
    )]
    #[case("token recognition error at: '\u{0}'", "`\\u{0}` is not valid CEL (an unclosed quote, a bad escape, or a character CEL does not use)")]
    #[case(
        "mismatched input '(' expecting {'[', '{', '}', '(', '.', ',', '-', '!', '?', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER, ESC_IDENTIFIER}",
        "found `(` where an operand (a name, a literal, or an expression in brackets), `}` or `,` was expected"
    )]
    #[case(
        "mismatched input 'x' expecting ESC_IDENTIFIER",
        "found `x` where a name in backticks was expected"
    )]
    #[case("something new", "something new")]
    fn antlr_messages_in_words(#[case] antlr: &str, #[case] want: &str) {
        assert_eq!(antlr_words(antlr), want);
    }

    #[test]
    fn control_characters_are_escaped_when_shown() {
        assert_eq!(shown("a\nb\u{0}c\u{1b}[31m"), "a\\nb\\u{0}c\\u{1b}[31m");
        assert_eq!(shown(&"é".repeat(200)).chars().count(), 120);
    }
}
