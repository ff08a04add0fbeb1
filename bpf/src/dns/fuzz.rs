//! Fuzz-style tests of the record decoder: it must be total (no panic on
//! any bytes) and lossless (a record it accepts re-encodes to its own key),
//! which is what [`fuzz_decode_query`](super::fuzz_decode_query) checks.
//!
//! A small deterministic generator rather than a fuzzing dependency: the
//! cases are random bytes, well-formed records with random labels (any
//! octet, as the wire allows), and such records with a few bytes mutated,
//! so both the accepting and every rejecting path are reached.
//!
//! `KRT_DNS_FUZZ_CASES` sets the number of cases (default 20 000, well
//! under a second); `KRT_DNS_FUZZ_SECS` instead runs for that many seconds,
//! e.g. `KRT_DNS_FUZZ_SECS=600 cargo test -p kyverno-runtime-bpf --release
//! --lib dns::fuzz -- --nocapture` for a ten-minute run.
//! `KRT_DNS_FUZZ_SEED` changes the seed. A failure prints the seed and the
//! case's bytes.

use std::time::{Duration, Instant};

use super::name::{self, DOMAIN_KEY_LEN};
use super::{decode_query, fuzz_decode_query, RECORD_LEN};

/// xorshift64*: deterministic, fast, good enough to spread cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A record the kernel could write: random labels (lowercased octets),
/// at most `DOMAIN_KEY_LEN - 1` bytes of them, zero padded.
fn valid_record(rng: &mut Rng) -> Vec<u8> {
    let mut r = vec![0u8; RECORD_LEN];
    r[..8].copy_from_slice(&rng.next().to_ne_bytes());
    let mut at = 8;
    let end = 8 + DOMAIN_KEY_LEN - 1;
    for _ in 0..rng.below(8) {
        let room = end - at;
        if room < 2 {
            break;
        }
        let len = 1 + rng.below((room - 1).min(name::LABEL_MAX));
        r[at] = len as u8;
        for b in &mut r[at + 1..=at + len] {
            // Mostly hostname letters, sometimes any octet.
            *b = if rng.below(4) == 0 {
                rng.byte().to_ascii_lowercase()
            } else {
                b"abcdefghijklmnopqrstuvwxyz0123456789-_"[rng.below(38)]
            };
        }
        at += 1 + len;
    }
    r
}

fn one_case(rng: &mut Rng) -> Vec<u8> {
    match rng.below(3) {
        0 => {
            // Random bytes, usually of the record's length.
            let len = if rng.below(4) == 0 {
                rng.below(2 * RECORD_LEN)
            } else {
                RECORD_LEN
            };
            (0..len).map(|_| rng.byte()).collect()
        }
        1 => valid_record(rng),
        _ => {
            let mut r = valid_record(rng);
            for _ in 0..=rng.below(3) {
                let at = rng.below(r.len());
                r[at] = rng.byte();
            }
            r
        }
    }
}

#[test]
fn the_decoder_is_total_and_lossless() {
    let seed = env_u64("KRT_DNS_FUZZ_SEED").unwrap_or(0x6b72_745f_646e_7321);
    let deadline = env_u64("KRT_DNS_FUZZ_SECS").map(|s| Instant::now() + Duration::from_secs(s));
    let cases = env_u64("KRT_DNS_FUZZ_CASES").unwrap_or(20_000);
    let mut rng = Rng(seed | 1);
    let (mut ran, mut accepted) = (0u64, 0u64);
    loop {
        let done = match deadline {
            Some(d) => ran % 1024 == 0 && Instant::now() >= d,
            None => ran >= cases,
        };
        if done {
            break;
        }
        let case = one_case(&mut rng);
        let outcome = std::panic::catch_unwind(|| fuzz_decode_query(&case));
        assert!(
            outcome.is_ok(),
            "seed {seed:#x}, case {ran}: decoder failed on {case:02x?}"
        );
        accepted += u64::from(decode_query(&case).is_ok());
        ran += 1;
    }
    eprintln!("dns decoder fuzz: {ran} cases, {accepted} accepted, seed {seed:#x}");
    // The generator must reach the accepting path, or this proves little.
    assert!(
        ran < 100 || accepted > ran / 10,
        "{accepted} of {ran} accepted"
    );
}

#[test]
fn every_valid_record_round_trips() {
    let mut rng = Rng(7);
    for _ in 0..2_000 {
        let r = valid_record(&mut rng);
        let q = decode_query(&r).unwrap();
        assert_eq!(name::encode_name(&q.qname).unwrap()[..], r[8..], "{q:?}");
    }
}
