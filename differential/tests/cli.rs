//! The `differential` program as CI and a person run it: its table, its
//! exit codes, and a seed that replays a run.
// A test harness: a panic is the failure report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::{Command, Output};

fn differential(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_differential"))
        .args(args)
        .output()
        .expect("running differential")
}

/// `differential` on `cases` cases of both userspace drivers with `seed`,
/// one thread (so the cases drawn depend on the seed alone).
fn userspace_run(cases: u64, seed: u64) -> Output {
    differential(&[
        "--cases",
        &cases.to_string(),
        "--drivers",
        "userspace,sequences",
        "--seed",
        &seed.to_string(),
        "--threads",
        "1",
    ])
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The table's lines and the shapes below them, without the seconds
/// column (the only part a replay may change) and the seed's line.
fn without_seconds(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with("seed "))
        .map(|l| {
            let mut words: Vec<&str> = l.split_whitespace().collect();
            if words
                .first()
                .is_some_and(|w| *w == "userspace" || *w == "sequences")
            {
                words.pop();
            }
            words.join(" ")
        })
        .collect()
}

#[test]
fn a_small_run_prints_a_line_per_driver_and_passes() {
    let out = userspace_run(300, 7);
    let text = stdout(&out);
    assert!(out.status.success(), "exit {:?}:\n{text}", out.status);
    let header: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["driver", "kernel", "cases", "disagreements", "seconds"]
    );
    for driver in ["userspace", "sequences"] {
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with(driver))
            .unwrap_or_else(|| panic!("no {driver} line in:\n{text}"))
            .split_whitespace()
            .collect();
        // driver, kernel ("-": no kernel), cases (at least those asked
        // for: sequences count each step), disagreements, seconds.
        assert_eq!(row[1], "-", "{row:?}");
        assert!(row[2].parse::<u64>().unwrap() >= 300, "{row:?}");
        assert_eq!(row[3], "0", "{row:?}");
    }
    assert!(text.contains("\nseed 7\n"), "{text}");
    assert!(text.ends_with("2 passed, 0 failed\n"), "{text}");
}

#[test]
fn the_printed_seed_replays_the_same_cases() {
    let first = stdout(&userspace_run(200, 11));
    let again = stdout(&userspace_run(200, 11));
    assert_eq!(without_seconds(&first), without_seconds(&again));
    let other = stdout(&userspace_run(200, 12));
    assert_ne!(
        without_seconds(&first),
        without_seconds(&other),
        "another seed drew the same cases"
    );
}

#[test]
fn an_unknown_driver_is_refused_with_exit_code_2() {
    let out = differential(&["--cases", "10", "--drivers", "userspce"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown driver \"userspce\""), "{err}");
    assert!(
        err.contains("userspace, sequences"),
        "the known drivers are listed: {err}"
    );
}
