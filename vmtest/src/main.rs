//! `vmtest`: boot a stock Debian kernel under qemu and run a command in it.
//!
//! Exit status: `run` exits with the guest command's status; `kernels` and
//! `matrix` exit 0 when every configuration passed and 1 otherwise; a
//! harness failure (download, boot, timeout) exits 125, which no command
//! status is mistaken for in practice (the convention `git bisect run` uses).

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

/// Exit status for failures of the harness itself rather than of the command.
const HARNESS_FAILURE: u8 = 125;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    match cli::dispatch(args.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vmtest: error: {e:#}");
            ExitCode::from(HARNESS_FAILURE)
        }
    }
}
