//! `differential [--cases N] [--seed S] [--drivers a,b] [--kernels K]`:
//! runs the drivers this machine can run and prints one line per driver
//! and kernel (`driver kernel cases disagreements seconds`), how often
//! each policy shape was generated, the seed, and `N passed, N failed`.
//! Exits 1 on any disagreement, after printing it shrunk.
//!
//! `--kernels` boots a `vmtest` guest per kernel and `lsm=` setting and
//! runs the open/exec driver in each (`differential guest`, through the
//! real kernel programs); `differential child` is that driver's pod
//! process.

use clap::Parser;
use differential::Run;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, ExitCode, Stdio};
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
    /// Drivers on this machine: userspace, sequences, egress-bpf,
    /// protocol-bpf, dns-bpf and their sequences egress-bpf-seq,
    /// protocol-bpf-seq, dns-bpf-seq (root);
    /// empty for none (only the kernels' driver).
    #[arg(long, value_delimiter = ',', default_value = "userspace,sequences")]
    drivers: Vec<String>,
    /// Threads for the userspace driver.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get() as u64))]
    threads: u64,
    /// Kernel series to boot for the open/exec driver, each with and
    /// without `bpf` in `lsm=` (e.g. 5.10,7.x; empty: none).
    #[arg(long, value_delimiter = ',')]
    kernels: Vec<String>,
    /// Cases per kernel configuration for the open/exec driver.
    #[arg(long, default_value_t = 5_000)]
    vm_cases: u64,
    /// Where a disagreement's replay scenario is written (default: beside
    /// this binary, in differential-scenarios/).
    #[arg(long)]
    scenarios_out: Option<std::path::PathBuf>,
}

/// The table's format.
fn line(driver: &str, kernel: &str, cases: u64, disagreements: u64, seconds: f64) -> String {
    format!("{driver:<16} {kernel:<28} {cases:>10} {disagreements:>14} {seconds:>8.1}")
}

/// Writes a disagreement's shrunk case as a conformance scenario and says
/// how to replay it on a real node.
fn write_scenario(run: &Run, seed: u64, out: Option<&std::path::Path>) {
    let Some((policies, events)) = &run.case else {
        return;
    };
    let name = format!("differential-{}-{}", run.driver, seed % 1_000_000);
    let why = format!(
        "the {} driver disagreed with the model (seed {seed}).",
        run.driver
    );
    let Some(scenario) = differential::scenario::scenario(
        &name,
        &why,
        &differential::universe::cluster(),
        policies,
        events,
    ) else {
        println!("  (no replay scenario: nothing of the case is expressible)");
        return;
    };
    let dir = match out {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("differential-scenarios")))
            .unwrap_or_else(|| std::env::temp_dir().join("differential-scenarios")),
    };
    match differential::scenario::write(&dir, &scenario) {
        Ok(path) => println!(
            "  replay on a real node: cargo run -p conformance -- --replay {} --host",
            path.display()
        ),
        Err(e) => println!("  (the replay scenario could not be written: {e})"),
    }
}

/// Prints a driver's run; returns whether it passed.
fn report(run: Run, kernel: &str, seconds: f64) -> bool {
    println!(
        "{}",
        line(
            run.driver,
            kernel,
            run.cases,
            u64::from(run.disagreement.is_some()),
            seconds
        )
    );
    for l in run.shapes.lines() {
        println!("    {l}");
    }
    match run.disagreement {
        Some(d) => {
            println!("  disagreement (shrunk):\n{d}");
            false
        }
        None => true,
    }
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some("child") {
        return differential::kernel_openexec::child(&raw[2..]);
    }
    if raw.get(1).map(String::as_str) == Some("guest") {
        return guest(&raw[2..]);
    }
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("{}", header());
    let (mut passed, mut failed) = (0, 0);
    let mut tally = |ok: bool| if ok { passed += 1 } else { failed += 1 };
    for driver in args.drivers.iter().filter(|d| !d.is_empty()) {
        let started = Instant::now();
        let run = match driver.as_str() {
            "userspace" => differential::userspace(args.cases, seed, args.threads),
            "sequences" => differential::sequences(args.cases, seed),
            "egress-bpf" => differential::kernel_egress::kernel_egress(args.cases, seed),
            "protocol-bpf" => differential::kernel_protocol::kernel_protocol(args.cases, seed),
            "dns-bpf" => differential::kernel_dns::kernel_dns(args.cases, seed),
            "egress-bpf-seq" => {
                differential::kernel_egress::kernel_egress_sequences(args.cases, seed)
            }
            "protocol-bpf-seq" => {
                differential::kernel_protocol::kernel_protocol_sequences(args.cases, seed)
            }
            "dns-bpf-seq" => differential::kernel_dns::kernel_dns_sequences(args.cases, seed),
            other => {
                eprintln!(
                    "unknown driver {other:?} (userspace, sequences, egress-bpf, protocol-bpf, \
                     dns-bpf, egress-bpf-seq, protocol-bpf-seq, dns-bpf-seq)"
                );
                return ExitCode::from(2);
            }
        };
        let kernel = if driver.ends_with("-bpf") || driver.ends_with("-bpf-seq") {
            host_kernel()
        } else {
            "-".into()
        };
        write_scenario(&run, seed, args.scenarios_out.as_deref());
        tally(report(run, &kernel, started.elapsed().as_secs_f64()));
    }
    if !args.kernels.is_empty() {
        match vms(&args.kernels, args.vm_cases, seed) {
            Ok(results) => {
                for ok in results {
                    tally(ok);
                }
            }
            Err(e) => {
                println!("openexec-vm: cannot run: {e}");
                tally(false);
            }
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

fn header() -> String {
    format!(
        "{:<16} {:<28} {:>10} {:>14} {:>8}",
        "driver", "kernel", "cases", "disagreements", "seconds"
    )
}

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("host {}", s.trim()))
        .unwrap_or_else(|_| "host".into())
}

/// In a guest: the open/exec driver. Prints its table line (the kernel
/// column is the release and the backend) prefixed `RESULT` for the host.
fn guest(args: &[String]) -> ExitCode {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (Some(cases), Some(seed)) = (value("--cases"), value("--seed")) else {
        eprintln!("guest: expected --cases N --seed S");
        return ExitCode::from(2);
    };
    let started = Instant::now();
    let (backend, runs) = differential::kernel_openexec::guest(cases, seed);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = format!("{} {backend}", release.trim());
    // Both runs share the boot: the time is the pair's.
    let seconds = started.elapsed().as_secs_f64();
    let mut ok = true;
    for run in runs {
        let disagreements = u64::from(run.disagreement.is_some());
        println!(
            "RESULT {}",
            line(run.driver, &kernel, run.cases, disagreements, seconds)
        );
        ok &= report(run, &kernel, seconds);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Boots each kernel with and without `bpf` in `lsm=` and runs the guest
/// driver; prints each configuration's line; returns pass/fail per line.
fn vms(kernels: &[String], cases: u64, seed: u64) -> Result<Vec<bool>, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = me.parent().ok_or("no directory of this binary")?;
    let vmtest = dir.join("vmtest");
    if !vmtest.exists() {
        return Err(format!("no {} (cargo build -p vmtest)", vmtest.display()));
    }
    let mut child = Command::new(vmtest)
        .args(["matrix", "--show-output", "--timeout", "900", "--kernels"])
        .arg(kernels.join(","))
        .arg("--bin")
        .arg(&me)
        .args(["--", "differential", "guest", "--cases"])
        .arg(cases.to_string())
        .args(["--seed", &seed.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("vmtest: {e}"))?;
    let mut results = Vec::new();
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            match l.trim_start().strip_prefix("RESULT ") {
                Some(row) => {
                    println!("{row}");
                    let disagreements = row
                        .split_whitespace()
                        .rev()
                        .nth(1)
                        .and_then(|d| d.parse::<u64>().ok());
                    results.push(disagreements == Some(0));
                }
                // The rest (the matrix table, a shrunk disagreement) as is.
                None => println!("    {l}"),
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    // Two lines (cases, sequences) per kernel and lsm= setting.
    let configs = kernels.len() * 2 * 2;
    if results.len() < configs {
        // A configuration that printed no line failed to run at all.
        results.extend(std::iter::repeat_n(false, configs - results.len()));
    }
    if !status.success() && results.iter().all(|ok| *ok) {
        results.push(false);
    }
    Ok(results)
}
