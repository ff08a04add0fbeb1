//! `vmtest matrix`: run a command on every kernel × LSM mode.

use std::process::ExitCode;

use clap::Args;
use vmtest::{render_json, render_table, run_matrix_with, Cache, KernelSeries, LsmMode};

use super::WorkloadArgs;

/// Arguments of `vmtest matrix`.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Kernel series, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5.10,6.1,6.12,7.x", value_parser = super::series_arg)]
    pub kernels: Vec<KernelSeries>,

    /// LSM modes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "bpf,nobpf", value_parser = super::lsm_arg)]
    pub lsm: Vec<LsmMode>,

    /// Print the outcomes as JSON on stdout (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,

    /// Print each configuration's command output and, on failure, its error.
    #[arg(long)]
    pub show_output: bool,

    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// Runs the matrix; exits 1 if any configuration failed or its command
/// exited non-zero.
pub fn exec(args: MatrixArgs) -> anyhow::Result<ExitCode> {
    let cache = Cache::from_env()?;
    let total = args.kernels.len() * args.lsm.len();
    let mut done = 0;
    let entries = run_matrix_with(
        &cache,
        &args.kernels,
        &args.lsm,
        &args.workload.workload(),
        |e| {
            done += 1;
            let verdict = match &e.result {
                Ok(o) => format!("exit {} in {:.1}s", o.exit_code, o.duration.as_secs_f64()),
                Err(err) => err.label().to_owned(),
            };
            tracing::info!("[{done}/{total}] {} {}: {verdict}", e.series, e.lsm);
        },
    );
    if args.show_output {
        for e in &entries {
            println!("=== {} {} ===", e.series, e.lsm);
            match &e.result {
                Ok(o) => print!("{}", o.output),
                Err(err) => println!("{err}"),
            }
        }
    }
    let table = render_table(&entries);
    if args.json {
        eprint!("{table}");
        println!("{}", render_json(&entries)?);
    } else {
        print!("{table}");
        // Errors in full below the table: the table only has room for the kind.
        for e in entries.iter().filter(|e| e.result.is_err()) {
            if let Err(err) = &e.result {
                eprintln!("\n{} {}: {err}", e.series, e.lsm);
            }
        }
    }
    Ok(if entries.iter().all(|e| e.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
