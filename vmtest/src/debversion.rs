//! Debian version ordering (`dpkg --compare-versions`), so the newest kernel
//! package is chosen without shelling out once per pair.
//!
//! The algorithm is dpkg's `verrevcmp` (lib/dpkg/version.c): compare epoch
//! numerically, then upstream version and revision by alternating runs of
//! non-digits (where `~` sorts before everything, even the end of the string,
//! and letters sort before other characters) and digits (numerically).

use std::cmp::Ordering;

/// Compares two Debian version strings the way dpkg does.
pub fn compare(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| verrevcmp(ua, ub))
        .then_with(|| verrevcmp(ra, rb))
}

/// Splits `[epoch:]upstream[-revision]`; a missing or malformed epoch is 0.
fn split(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, rest)) if !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit()) => {
            (e.parse().unwrap_or(0), rest)
        }
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((up, rev)) => (epoch, up, rev),
        None => (epoch, rest, ""),
    }
}

/// dpkg's character weight for the non-digit runs.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(b'~') => -1,
        Some(c) => i32::from(c) + 256,
    }
}

fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let ac = order(a.get(i).copied());
            let bc = order(b.get(j).copied());
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::compare;
    use std::cmp::Ordering::{Equal, Greater, Less};

    #[test]
    fn dpkg_examples() {
        let cases = [
            ("6.1.176-1", "6.1.170-1", Greater),
            ("6.12.117-1", "6.12.107-1", Greater),
            ("6.12.90-1~bpo12+1", "6.12.90-1", Less),
            ("1.0~rc1", "1.0", Less),
            ("1.0", "1.0", Equal),
            ("1:0.1", "2.0", Greater),
            ("1.0a", "1.0", Greater),
            ("1.0a", "1.0+", Less),
            ("7.2.13-1", "7.10.1-1", Less),
            ("5.10.237-1", "5.10.226-1", Greater),
            ("1.001", "1.1", Equal),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare(a, b), want, "{a} vs {b}");
            assert_eq!(compare(b, a), want.reverse(), "{b} vs {a}");
        }
    }
}
