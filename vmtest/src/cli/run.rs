//! `vmtest run`: boot one kernel, run a command, exit with its status.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use vmtest::{resolve_kernel, run, Cache, KernelSeries, LsmMode};

use super::WorkloadArgs;

/// Arguments of `vmtest run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kernel series: 5.10, 6.1, 6.12 or 7.x.
    #[arg(long, value_parser = super::series_arg)]
    pub kernel: KernelSeries,

    /// LSM mode: bpf (bpf in lsm=) or nobpf (left out).
    #[arg(long, default_value = "bpf", value_parser = super::lsm_arg)]
    pub lsm: LsmMode,

    /// Also print the guest's serial console (kernel log) to stderr.
    #[arg(long)]
    pub console: bool,

    /// Keep the run's files in DIR (console.log, output.log written as the
    /// command runs, qemu.log, qemu.pid): how a long-running guest, such as
    /// a Kubernetes node, is watched and stopped.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Prints the command's output byte-exact on stdout and returns its status.
pub fn exec(args: RunArgs) -> anyhow::Result<ExitCode> {
    let cache = Cache::from_env()?;
    let kernel = resolve_kernel(args.kernel, &cache)
        .with_context(|| format!("resolving kernel {}", args.kernel))?;
    let mut spec = args.workload.workload().spec(kernel, args.lsm);
    spec.run_dir = args.run_dir.clone();
    let outcome = run(&spec).with_context(|| {
        format!(
            "booting {} ({}, lsm {})",
            spec.kernel.version, args.kernel, args.lsm
        )
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&outcome.output_bytes)?;
    stdout.flush()?;
    if args.console {
        eprintln!("--- console ---\n{}", outcome.console);
    }
    tracing::info!(
        kernel = %spec.kernel.version,
        lsm = %args.lsm,
        guest_lsm = outcome.guest_lsm.as_deref().unwrap_or("?"),
        exit = outcome.exit_code,
        secs = format!("{:.2}", outcome.duration.as_secs_f64()),
        accel = %outcome.accel,
        "guest finished"
    );
    // Statuses outside 0..=255 cannot come from a shell; report them as 1.
    Ok(ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1)))
}
