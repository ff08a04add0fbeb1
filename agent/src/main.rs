//! The `kyverno-runtime` binary: the node daemon and its command-line tools.
//!
//! This file only parses arguments, sets up logging and dispatches to one
//! module per subcommand under `cli/`.

mod cli;
mod daemon;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(&args.log);
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
