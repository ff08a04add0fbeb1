//! The normalised wire form of a domain name, `struct domain_key` of
//! `bpf/include/dnsname.h`, and its conversions to and from text.
//!
//! A key is [`DOMAIN_KEY_LEN`] bytes: length-prefixed labels (1..=63 bytes
//! each) in wire order, ASCII letters lowercased, then the zero-length root
//! label and zero padding. The labels of a name may therefore take at most
//! `DOMAIN_KEY_LEN - 1` bytes. The root name is all zeroes.
//!
//! The text form is the presentation format of RFC 1035 section 5.1,
//! canonicalised: labels joined by `.` with no trailing dot (`"."` for the
//! root), a `.` or `\` inside a label escaped as `\.` / `\\`, and every byte
//! outside `!`..=`~` written as `\DDD` (three decimal digits). A label may
//! carry any octet on the wire; escaping keeps such a name reportable and
//! unambiguous instead of making it undecodable, and a hostname (letters,
//! digits, `-`, `_`) never needs an escape, so policy values compare as
//! plain strings.
//!
//! Everything here is pure and total: arbitrary bytes give an error, never a
//! panic.

use std::fmt::Write as _;

/// Bytes of a `struct domain_key`, the terminating root label included.
pub const DOMAIN_KEY_LEN: usize = 128;

/// Longest label (RFC 1035 section 2.3.4).
pub const LABEL_MAX: usize = 63;

/// A domain name in the kernel's normalised wire form.
pub type DomainKey = [u8; DOMAIN_KEY_LEN];

/// Why key bytes are not a name the kernel program could have written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not exactly [`DOMAIN_KEY_LEN`] bytes.
    #[error("domain key of {len} bytes, expected {DOMAIN_KEY_LEN}")]
    Width {
        /// The length given.
        len: usize,
    },
    /// A length byte over 63: a compression pointer or a reserved label
    /// type, which the kernel never records.
    #[error("byte {at}: label length {len} is over {LABEL_MAX}")]
    LabelTooLong {
        /// Offset of the length byte.
        at: usize,
        /// Its value.
        len: u8,
    },
    /// No root label within the key: a label runs past its end, or the
    /// labels fill it completely.
    #[error("no root label within the {DOMAIN_KEY_LEN}-byte key")]
    Unterminated,
    /// A non-zero byte after the root label: the kernel zero-pads.
    #[error("byte {at}: non-zero padding after the root label")]
    Padding {
        /// Offset of the first non-zero padding byte.
        at: usize,
    },
    /// An ASCII uppercase letter: the kernel lowercases names.
    #[error("byte {at}: uppercase letter in a name the kernel lowercases")]
    Uppercase {
        /// Offset of the letter.
        at: usize,
    },
}

/// Why a text name cannot be encoded into a [`DomainKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The empty string (the root is written `"."`).
    #[error("empty name (the root is \".\")")]
    Empty,
    /// Two dots in a row, or a leading dot.
    #[error("empty label")]
    EmptyLabel,
    /// A label of more than 63 bytes.
    #[error("label of {len} bytes is over {LABEL_MAX}")]
    LabelTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The labels need more than `DOMAIN_KEY_LEN - 1` bytes.
    #[error("name needs {len} bytes, more than the {DOMAIN_KEY_LEN}-byte key holds")]
    TooLong {
        /// Bytes the wire form needs, root label included.
        len: usize,
    },
    /// A `\` at the end, or `\DDD` over 255 or with fewer than three digits.
    #[error("bad escape")]
    BadEscape,
}

/// Decodes a key into its canonical text form, checking every invariant
/// the kernel program guarantees (label lengths, termination within the
/// key, zero padding, lowercase).
pub fn decode_key(key: &[u8]) -> Result<String, NameError> {
    if key.len() != DOMAIN_KEY_LEN {
        return Err(NameError::Width { len: key.len() });
    }
    let mut out = String::new();
    let mut at = 0;
    loop {
        // The root label must sit inside the key.
        let Some(&len) = key.get(at) else {
            return Err(NameError::Unterminated);
        };
        if len == 0 {
            break;
        }
        if usize::from(len) > LABEL_MAX {
            return Err(NameError::LabelTooLong { at, len });
        }
        let start = at + 1;
        let end = start + usize::from(len);
        // `end` is the next length byte, which must exist too.
        let Some(label) = key.get(start..end).filter(|_| end < DOMAIN_KEY_LEN) else {
            return Err(NameError::Unterminated);
        };
        if let Some(i) = label.iter().position(u8::is_ascii_uppercase) {
            return Err(NameError::Uppercase { at: start + i });
        }
        if !out.is_empty() {
            out.push('.');
        }
        escape_label(label, &mut out);
        at = end;
    }
    if let Some(i) = key[at..].iter().position(|&b| b != 0) {
        return Err(NameError::Padding { at: at + i });
    }
    if out.is_empty() {
        out.push('.');
    }
    Ok(out)
}

/// Appends `label` in presentation form.
fn escape_label(label: &[u8], out: &mut String) {
    for &b in label {
        match b {
            b'.' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b'!'..=b'~' => out.push(char::from(b)),
            // Writing to a String cannot fail.
            _ => {
                let _ = write!(out, "\\{b:03}");
            }
        }
    }
}

/// Encodes a name in presentation form (a trailing dot is allowed, `"."`
/// is the root, `\.`, `\\`, `\X` and `\DDD` escapes are understood) into
/// the kernel's key, lowercasing ASCII letters.
///
/// The inverse of [`decode_key`]: `encode_name(&decode_key(k)?)` gives `k`
/// back for every key the kernel can write. This is also how a policy-named
/// domain becomes the egress filter's `egress_domains` key, which the DNS
/// answer snooper matches answered names against.
pub fn encode_name(name: &str) -> Result<DomainKey, EncodeError> {
    if name.is_empty() {
        return Err(EncodeError::Empty);
    }
    let mut key = [0u8; DOMAIN_KEY_LEN];
    if name == "." {
        return Ok(key);
    }
    let bytes = name.as_bytes();
    let mut labels: Vec<Vec<u8>> = vec![Vec::new()];
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        i += 1;
        let byte = match b {
            b'.' => {
                labels.push(Vec::new());
                continue;
            }
            b'\\' => {
                let (byte, used) = unescape(&bytes[i..]).ok_or(EncodeError::BadEscape)?;
                i += used;
                byte
            }
            _ => b,
        };
        if let Some(label) = labels.last_mut() {
            label.push(byte.to_ascii_lowercase());
        }
    }
    // One trailing dot (an absolute name) leaves an empty last label.
    if labels.len() > 1 && labels.last().is_some_and(Vec::is_empty) {
        labels.pop();
    }
    let need = labels.iter().map(|l| 1 + l.len()).sum::<usize>() + 1;
    let mut at = 0;
    for label in &labels {
        if label.is_empty() {
            return Err(EncodeError::EmptyLabel);
        }
        if label.len() > LABEL_MAX {
            return Err(EncodeError::LabelTooLong { len: label.len() });
        }
        if need > DOMAIN_KEY_LEN {
            return Err(EncodeError::TooLong { len: need });
        }
        // The lengths were checked: at + 1 + len < need <= DOMAIN_KEY_LEN.
        key[at] = label.len() as u8;
        key[at + 1..at + 1 + label.len()].copy_from_slice(label);
        at += 1 + label.len();
    }
    Ok(key)
}

/// The byte an escape (after its `\`) stands for and how many bytes of
/// `rest` it used.
fn unescape(rest: &[u8]) -> Option<(u8, usize)> {
    let first = *rest.first()?;
    if !first.is_ascii_digit() {
        return Some((first, 1));
    }
    let digits = rest.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0u32, |v, d| v * 10 + u32::from(d - b'0'));
    u8::try_from(value).ok().map(|b| (b, 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(wire: &[u8]) -> DomainKey {
        let mut k = [0u8; DOMAIN_KEY_LEN];
        k[..wire.len()].copy_from_slice(wire);
        k
    }

    #[test]
    fn decodes_a_plain_name() {
        let k = key(b"\x03www\x07example\x03com\x00");
        assert_eq!(decode_key(&k).unwrap(), "www.example.com");
        assert_eq!(encode_name("www.example.com").unwrap(), k);
        assert_eq!(encode_name("WWW.Example.COM.").unwrap(), k);
    }

    #[test]
    fn root_is_all_zeroes() {
        assert_eq!(decode_key(&[0u8; DOMAIN_KEY_LEN]).unwrap(), ".");
        assert_eq!(encode_name(".").unwrap(), [0u8; DOMAIN_KEY_LEN]);
        assert_eq!(encode_name(""), Err(EncodeError::Empty));
    }

    #[test]
    fn odd_bytes_are_escaped_and_round_trip() {
        let k = key(b"\x05a.b\\\x20\x02\xff_\x00");
        let text = decode_key(&k).unwrap();
        assert_eq!(text, "a\\.b\\\\\\032.\\255_");
        assert_eq!(encode_name(&text).unwrap(), k);
    }

    #[test]
    fn the_widest_name_fills_127_bytes() {
        // 1 + 63 + 1 + 62 = 127 bytes of labels, then the root label in the
        // key's last byte.
        let name = format!("{}.{}", "a".repeat(63), "b".repeat(62));
        let k = encode_name(&name).unwrap();
        assert_eq!((k[126], k[127]), (b'b', 0));
        assert_eq!(decode_key(&k).unwrap(), name);
        let too_long = format!("{}.{}", "a".repeat(63), "b".repeat(63));
        assert_eq!(
            encode_name(&too_long),
            Err(EncodeError::TooLong { len: 129 })
        );
    }

    #[test]
    fn labels_filling_the_key_are_unterminated() {
        // 127 bytes of labels end exactly at the last byte: no root label.
        let mut k = [0u8; DOMAIN_KEY_LEN];
        k[0] = 63;
        k[1..64].fill(b'a');
        k[64] = 63;
        k[65..128].fill(b'b');
        assert_eq!(decode_key(&k), Err(NameError::Unterminated));
    }

    #[test]
    fn rejects_what_the_kernel_never_writes() {
        assert_eq!(
            decode_key(&key(b"\xc0\x0c")),
            Err(NameError::LabelTooLong { at: 0, len: 0xc0 })
        );
        assert_eq!(
            decode_key(&key(b"\x01a\x40")),
            Err(NameError::LabelTooLong { at: 2, len: 0x40 })
        );
        assert_eq!(
            decode_key(&key(b"\x03wWw\x00")),
            Err(NameError::Uppercase { at: 2 })
        );
        assert_eq!(
            decode_key(&key(b"\x01a\x00\x00\x01")),
            Err(NameError::Padding { at: 4 })
        );
        // A label that runs past the end of the key.
        let mut k = key(b"\x01a");
        k[2] = 60;
        k[63] = 60;
        k[124] = 60;
        assert_eq!(decode_key(&k), Err(NameError::Unterminated));
        let mut k = [b'a'; DOMAIN_KEY_LEN];
        k[0] = 63;
        k[64] = 63;
        assert_eq!(decode_key(&k), Err(NameError::Unterminated));
        assert_eq!(decode_key(&[0u8; 12]), Err(NameError::Width { len: 12 }));
    }

    #[test]
    fn encode_rejects_bad_names() {
        assert_eq!(encode_name("a..b"), Err(EncodeError::EmptyLabel));
        assert_eq!(encode_name(".a"), Err(EncodeError::EmptyLabel));
        assert_eq!(encode_name("a.."), Err(EncodeError::EmptyLabel));
        assert_eq!(
            encode_name(&"x".repeat(64)),
            Err(EncodeError::LabelTooLong { len: 64 })
        );
        assert_eq!(encode_name("a\\"), Err(EncodeError::BadEscape));
        assert_eq!(encode_name("a\\25"), Err(EncodeError::BadEscape));
        assert_eq!(encode_name("a\\256"), Err(EncodeError::BadEscape));
        assert_eq!(encode_name("a\\2x5"), Err(EncodeError::BadEscape));
        assert_eq!(encode_name("\\065").unwrap(), key(b"\x01a\x00"));
    }
}
