//! `exec` and `open` values: absolute normalized paths.

use super::{FieldPath, Reason, ValueError, STAR};
use kyverno_runtime_api::runtimepolicy::MAX_PATH_LEN;
use std::fmt;

/// Width of the kernel's path key: the path and its NUL.
pub const PATH_KEY_LEN: usize = MAX_PATH_LEN + 1;

/// An absolute, normalized path that fits the kernel's path key: it
/// starts with `/`, has no empty (`//`), `.` or `..` segment and no
/// trailing `/` (except the root `/` itself), no `*` and no NUL, and is at
/// most `MAX_PATH_LEN` (255) bytes, so it is a path the kernel can report
/// and a value can match. It holds no control character (a newline or a
/// carriage return is a slip, usually from a data source's lines) and no
/// bidirectional control (it would display as another path), and does not
/// end in whitespace: each is a legal file name byte, and each is refused
/// because the value a person reads would not be the one compared.
///
/// Named `AbsPath` rather than `PathValue` so it does not shadow the CRD's
/// unvalidated `kyverno_runtime_api::runtimepolicy::PathValue` in code that
/// converts one into the other.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbsPath(String);

impl AbsPath {
    /// Validates `value` as an absolute normalized path.
    ///
    /// ```
    /// use kyverno_runtime_policy::values::{AbsPath, Reason};
    ///
    /// assert_eq!(AbsPath::parse("/usr/bin/curl").unwrap().as_str(), "/usr/bin/curl");
    /// assert_eq!(AbsPath::parse("/etc/../shadow"), Err(Reason::DotSegment));
    /// ```
    pub fn parse(value: &str) -> Result<AbsPath, Reason> {
        if value.is_empty() {
            return Err(Reason::Empty);
        }
        if value.contains('\0') {
            return Err(Reason::Nul);
        }
        if let Some(ch) = value.chars().find(|c| c.is_control()) {
            return Err(Reason::ControlChar { ch });
        }
        if let Some(ch) = value.chars().find(|&c| is_bidi_control(c)) {
            return Err(Reason::BidiControl { ch });
        }
        if let Some(ch) = value.chars().last().filter(|c| c.is_whitespace()) {
            return Err(Reason::TrailingWhitespace { ch });
        }
        if value.contains('*') {
            return Err(Reason::PathWildcard);
        }
        let Some(rest) = value.strip_prefix('/') else {
            return Err(Reason::NotAbsolute);
        };
        if value.len() > MAX_PATH_LEN {
            return Err(Reason::TooLong {
                len: value.len(),
                max: MAX_PATH_LEN,
            });
        }
        if !rest.is_empty() {
            let (body, trailing_slash) = match rest.strip_suffix('/') {
                Some(body) => (body, true),
                None => (rest, false),
            };
            for segment in body.split('/') {
                match segment {
                    "" => return Err(Reason::EmptySegment),
                    "." | ".." => return Err(Reason::DotSegment),
                    _ => {}
                }
            }
            if trailing_slash {
                return Err(Reason::TrailingSlash);
            }
        }
        Ok(AbsPath(value.to_string()))
    }

    /// The path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path as the kernel programs key it: its bytes, NUL-padded to
    /// [`PATH_KEY_LEN`] (there is always room for at least one NUL).
    pub fn kernel_key(&self) -> [u8; PATH_KEY_LEN] {
        let mut key = [0u8; PATH_KEY_LEN];
        for (k, b) in key.iter_mut().zip(self.0.as_bytes()) {
            *k = *b;
        }
        key
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The Unicode bidirectional controls (embeddings, overrides, isolates and
/// marks): they reorder how text displays, so a path holding one reads
/// differently on a screen from what the kernel compares.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// A parsed `exec` or `open` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathTarget {
    /// One path.
    Path(AbsPath),
    /// `"*"`: every path (meaningful alone in deny).
    Any,
}

/// The value as written: the path, or `*`.
impl fmt::Display for PathTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathTarget::Path(p) => p.fmt(f),
            PathTarget::Any => f.write_str(STAR),
        }
    }
}

/// Parses an `exec` or `open` value: an [`AbsPath`], or `"*"`
/// ([`PathTarget::Any`]).
///
/// The length bound is in bytes, the kernel key's unit (the CRD's
/// `maxLength` counts characters; see the crate's agreement tests).
pub fn parse_path(value: &str, path: &FieldPath) -> Result<PathTarget, ValueError> {
    if value == STAR {
        return Ok(PathTarget::Any);
    }
    AbsPath::parse(value)
        .map(PathTarget::Path)
        .map_err(|reason| ValueError::new(path, value, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(value: &str) -> Result<PathTarget, Reason> {
        parse_path(value, &FieldPath::spec()).map_err(|e| e.reason)
    }

    #[rstest]
    #[case::binary("/usr/bin/curl")]
    #[case::root("/")]
    #[case::one_segment("/bin")]
    #[case::hidden("/.hidden")]
    #[case::dotdot_prefix("/..hidden")]
    #[case::three_dots("/etc/...")]
    #[case::dot_inside("/etc/a.b/c..d")]
    #[case::proc("/proc/self/mem")]
    #[case::spaces_and_unicode("/srv/my files/café")]
    #[case::inner_nbsp("/srv/a\u{A0}b")]
    #[case::right_to_left_script("/srv/שלום")]
    #[case::zero_width_joiner("/srv/👩\u{200D}💻")]
    fn accepts(#[case] value: &str) {
        assert_eq!(
            parse(value),
            Ok(PathTarget::Path(AbsPath(value.to_string())))
        );
    }

    #[rstest]
    #[case::empty("", Reason::Empty)]
    #[case::relative("curl", Reason::NotAbsolute)]
    #[case::dot_relative("./curl", Reason::NotAbsolute)]
    #[case::tilde("~/bin", Reason::NotAbsolute)]
    #[case::dot_dot("/etc/../shadow", Reason::DotSegment)]
    #[case::dot("/etc/./shadow", Reason::DotSegment)]
    #[case::leading_dot_segment("/./etc", Reason::DotSegment)]
    #[case::trailing_dot("/etc/.", Reason::DotSegment)]
    #[case::trailing_dot_dot("/etc/..", Reason::DotSegment)]
    #[case::root_dot("/.", Reason::DotSegment)]
    #[case::root_dot_dot("/..", Reason::DotSegment)]
    #[case::trailing_slash("/etc/", Reason::TrailingSlash)]
    #[case::double_slash("/etc//passwd", Reason::EmptySegment)]
    #[case::leading_double_slash("//etc", Reason::EmptySegment)]
    #[case::only_slashes("//", Reason::EmptySegment)]
    #[case::double_trailing_slash("/etc//", Reason::EmptySegment)]
    #[case::glob("/etc/*", Reason::PathWildcard)]
    #[case::glob_relative("*.sh", Reason::PathWildcard)]
    #[case::nul("/etc/pass\0wd", Reason::Nul)]
    #[case::newline("/tmp/a\nb", Reason::ControlChar { ch: '\n' })]
    #[case::carriage_return("/bin/sh\r", Reason::ControlChar { ch: '\r' })]
    #[case::tab("/bin/\tsh", Reason::ControlChar { ch: '\t' })]
    #[case::escape("/bin/\u{1b}[0msh", Reason::ControlChar { ch: '\u{1b}' })]
    #[case::delete("/bin/sh\u{7f}", Reason::ControlChar { ch: '\u{7f}' })]
    #[case::c1("/bin/\u{85}sh", Reason::ControlChar { ch: '\u{85}' })]
    #[case::right_to_left_override("/tmp/x\u{202E}hs.exe", Reason::BidiControl { ch: '\u{202E}' })]
    #[case::isolate("/tmp/\u{2066}a\u{2069}", Reason::BidiControl { ch: '\u{2066}' })]
    #[case::mark("/tmp/a\u{200F}", Reason::BidiControl { ch: '\u{200F}' })]
    #[case::arabic_mark("/tmp/a\u{061C}b", Reason::BidiControl { ch: '\u{061C}' })]
    #[case::trailing_space("/etc/passwd ", Reason::TrailingWhitespace { ch: ' ' })]
    #[case::trailing_nbsp("/etc/passwd\u{A0}", Reason::TrailingWhitespace { ch: '\u{A0}' })]
    #[case::trailing_ideographic_space("/bin/sh\u{3000}", Reason::TrailingWhitespace { ch: '\u{3000}' })]
    fn rejects(#[case] value: &str, #[case] want: Reason) {
        assert_eq!(parse(value), Err(want));
    }

    #[test]
    fn a_path_fits_the_kernel_key_at_255_bytes_not_256() {
        let longest = format!("/{}", "a".repeat(MAX_PATH_LEN - 1));
        assert_eq!(longest.len(), 255);
        let PathTarget::Path(p) = parse(&longest).unwrap() else {
            panic!("not a path")
        };
        let key = p.kernel_key();
        assert_eq!(&key[..255], longest.as_bytes());
        assert_eq!(key[255], 0);

        let too_long = format!("/{}", "a".repeat(MAX_PATH_LEN));
        assert_eq!(
            parse(&too_long),
            Err(Reason::TooLong { len: 256, max: 255 })
        );
    }

    #[test]
    fn the_bound_is_bytes_not_characters() {
        // 1 + 2 * 127 = 255 bytes in 128 characters: fits.
        assert!(parse(&format!("/{}", "é".repeat(127))).is_ok());
        // 1 + 2 * 128 = 257 bytes in 129 characters: the CRD's maxLength
        // (characters) admits it, the kernel key cannot hold it.
        assert_eq!(
            parse(&format!("/{}", "é".repeat(128))),
            Err(Reason::TooLong { len: 257, max: 255 })
        );
    }

    #[test]
    fn the_key_of_the_root_is_a_slash_and_nuls() {
        let key = AbsPath::parse("/").unwrap().kernel_key();
        assert_eq!(key[0], b'/');
        assert!(key[1..].iter().all(|&b| b == 0));
    }
}
