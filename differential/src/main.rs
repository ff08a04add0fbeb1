//! `differential [--cases N] [--seed S] [--drivers a,b]`: runs the drivers
//! this machine can run and prints one line per driver (`driver kernel
//! cases disagreements`), the seed, and `N passed, N failed`. Exits 1 on
//! any disagreement, after printing it shrunk.

use clap::Parser;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "The specification's rule checked against the product on generated cases")]
struct Args {
    /// Cases per driver: (policy set, event) pairs.
    #[arg(long, default_value_t = 1_000_000)]
    cases: u64,
    /// The seed (default: from the clock, printed so a run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// Which drivers: userspace, sequences.
    #[arg(long, value_delimiter = ',', default_value = "userspace,sequences")]
    drivers: Vec<String>,
    /// Threads for the userspace driver.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get() as u64))]
    threads: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!(
        "{:<12} {:<8} {:>10} {:>14} {:>8}",
        "driver", "kernel", "cases", "disagreements", "seconds"
    );
    let (mut passed, mut failed) = (0, 0);
    for driver in &args.drivers {
        let started = Instant::now();
        let run = match driver.as_str() {
            "userspace" => differential::userspace(args.cases, seed, args.threads),
            "sequences" => differential::sequences(args.cases, seed),
            other => {
                eprintln!("unknown driver {other:?} (userspace, sequences)");
                return ExitCode::from(2);
            }
        };
        let disagreements = u8::from(run.disagreement.is_some());
        println!(
            "{:<12} {:<8} {:>10} {:>14} {:>8.1}",
            run.driver,
            "-",
            run.cases,
            disagreements,
            started.elapsed().as_secs_f64()
        );
        for line in run.shapes.lines() {
            println!("    {line}");
        }
        match run.disagreement {
            Some(d) => {
                failed += 1;
                println!("  disagreement (shrunk):\n{d}");
            }
            None => passed += 1,
        }
    }
    println!("seed {seed}");
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
