//! The fuzz harnesses of `agent/fuzz/harness` on stable, in every
//! `cargo test`: each replays its committed seeds and the inputs that once
//! crashed it (`agent/fuzz/seeds/<target>`, `agent/fuzz/regressions/<target>`),
//! then a fixed number of seeded mutations of them, with the same
//! invariants libFuzzer asserts. A regression that crashes a parser on or
//! near a known input fails the unit tier in seconds, without the nightly
//! toolchain; the coverage-guided runs are `ci/fuzz` (README, "Fuzzing").
//!
//! `KRT_FUZZ_MUTATIONS` sets the mutations per target (default 4,000) and
//! `KRT_FUZZ_SEED` the generator's seed (default 24, so CI replays the same
//! inputs and a failure is a regression, not luck).

#[path = "../fuzz/harness/cel_expr.rs"]
mod cel_expr;
#[path = "../fuzz/harness/collector_decode.rs"]
mod collector_decode;
#[path = "../fuzz/harness/common.rs"]
mod common;
#[path = "../fuzz/harness/policy_yaml.rs"]
mod policy_yaml;
#[path = "../fuzz/harness/recorded_events.rs"]
mod recorded_events;
#[path = "../fuzz/harness/redact.rs"]
mod redact;
#[path = "../fuzz/harness/values.rs"]
mod values;

use fastrand::Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Mutations per target when `KRT_FUZZ_MUTATIONS` is unset.
const DEFAULT_MUTATIONS: usize = 4_000;

/// Fragments a mutation may insert: the structure of the formats fed here
/// (YAML, CEL, JSON lines, argv), numbers at the edges, and text that once
/// broke parsers (deep nesting, NUL, a lone surrogate's replacement).
#[rustfmt::skip]
const FRAGMENTS: &[&[u8]] = &[
    b"{", b"}", b"[", b"]", b"(", b")", b"\"", b"'", b":", b": ", b",", b"\n", b"\n- ",
    b"  ", b"*", b"*.", b"/", b"\\", b"&a ", b"*a", b"!!", b"null", b"~", b"true", b"-1",
    b"0", b"9223372036854775807", b"18446744073709551616", b"1e308", b"0x", b".", b"..",
    b"::", b"/32", b"/129", b"has(", b"size(", b"matches(", b"&&", b"||", b"==", b"\0",
    b"--password", b"token=", b"\xef\xbf\xbd", b"[[[[[[[[[[[[[[[[", b"{{{{{{{{{{{{{{{{",
];

/// The committed inputs of `target`: its seeds, then its regressions.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = Vec::new();
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            match std::fs::read(&path) {
                Ok(bytes) => inputs.push((path, bytes)),
                Err(e) => panic!("{}: {e}", path.display()),
            }
        }
    }
    inputs
}

/// One to four of libFuzzer's kinds of mutation, applied to `input`:
/// change a byte, insert or erase a run, copy a run within the input,
/// splice in part of another input, insert a fragment of the format.
fn mutate(rng: &mut Rng, input: &[u8], corpus: &[(PathBuf, Vec<u8>)]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.usize(..4) {
        let at = rng.usize(..out.len() + 1);
        match rng.usize(..6) {
            0 if !out.is_empty() => {
                let i = rng.usize(..out.len());
                out[i] ^= 1 << rng.usize(..8);
            }
            1 => out.insert(at, rng.u8(..)),
            2 if !out.is_empty() => {
                let start = rng.usize(..out.len());
                let end = (start + 1 + rng.usize(..16)).min(out.len());
                out.drain(start..end);
            }
            3 if !out.is_empty() => {
                let start = rng.usize(..out.len());
                let end = (start + 1 + rng.usize(..64)).min(out.len());
                let run = out[start..end].to_vec();
                out.splice(at..at, run);
            }
            4 => {
                let other = &corpus[rng.usize(..corpus.len())].1;
                if !other.is_empty() {
                    let start = rng.usize(..other.len());
                    let end = (start + 1 + rng.usize(..128)).min(other.len());
                    out.splice(at..at, other[start..end].iter().copied());
                }
            }
            _ => {
                let fragment = FRAGMENTS[rng.usize(..FRAGMENTS.len())];
                out.splice(at..at, fragment.iter().copied());
            }
        }
    }
    out
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Runs `check` on every committed input of `target`, then on the seeded
/// mutations; on a panic, writes the input beside the other crash
/// artifacts and fails naming it.
fn fuzz(target: &str, check: fn(&[u8])) {
    let corpus = corpus(target);
    assert!(
        !corpus.is_empty(),
        "{target}: no seeds in agent/fuzz/seeds/{target}"
    );
    let mutations = env_number("KRT_FUZZ_MUTATIONS", DEFAULT_MUTATIONS as u64) as usize;
    let seed = env_number("KRT_FUZZ_SEED", 24);
    let mut rng = Rng::with_seed(seed);
    let inputs = corpus
        .iter()
        .map(|(path, bytes)| (path.display().to_string(), bytes.clone()))
        .chain((0..mutations).map(|n| {
            let base = &corpus[rng.usize(..corpus.len())].1;
            (
                format!("mutation {n} (seed {seed})"),
                mutate(&mut rng, base, &corpus),
            )
        }));
    let mut ran = 0;
    for (origin, input) in inputs {
        if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/artifacts")
                .join(target);
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| {
                    let path = dir.join(format!("crash-stable-{seed}-{ran}"));
                    std::fs::write(&path, &input).map(|()| path)
                })
                .map(|p| p.display().to_string())
                .unwrap_or_else(|e| format!("(not saved: {e})"));
            panic!(
                "{target}: {origin} crashed the harness (the panic is above); input saved to {saved}; \
                 replay with `cargo fuzz run {target} {saved}` in agent/fuzz"
            );
        }
        ran += 1;
    }
    println!(
        "{target}: {ran} inputs ({} committed, {mutations} mutations), no crash",
        corpus.len()
    );
}

#[test]
fn policy_yaml_seeds_and_mutations() {
    fuzz("policy_yaml", policy_yaml::fuzz_one);
}

#[test]
fn cel_expr_seeds_and_mutations() {
    fuzz("cel_expr", cel_expr::fuzz_one);
}

#[test]
fn values_seeds_and_mutations() {
    fuzz("values", values::fuzz_one);
}

#[test]
fn redact_seeds_and_mutations() {
    fuzz("redact", redact::fuzz_one);
}

#[test]
fn collector_decode_seeds_and_mutations() {
    fuzz("collector_decode", collector_decode::fuzz_one);
}

#[test]
fn recorded_events_seeds_and_mutations() {
    fuzz("recorded_events", recorded_events::fuzz_one);
}

#[test]
fn mutations_change_their_input_and_replay_from_the_seed() {
    let corpus = vec![(PathBuf::from("a"), b"kind: RuntimePolicy".to_vec())];
    let run = |seed| {
        let mut rng = Rng::with_seed(seed);
        (0..50)
            .map(|_| mutate(&mut rng, &corpus[0].1, &corpus))
            .collect::<Vec<_>>()
    };
    let first = run(7);
    assert_eq!(first, run(7), "the same seed gives the same mutations");
    assert!(
        first.iter().filter(|m| **m != corpus[0].1).count() > 40,
        "most mutations change the input"
    );
}
