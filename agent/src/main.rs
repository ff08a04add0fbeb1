//! The `kyverno-runtime` binary: the node daemon and its command-line tools.
//!
//! This file only parses arguments, sets up logging and dispatches to one
//! module per subcommand under `cli/`.

mod cli;
mod daemon;

use clap::Parser;

fn main() -> std::process::ExitCode {
    use std::io::Write as _;
    // Launched by the container runtime as the startup gate (an NRI
    // plugin the daemon installed), not run as a command.
    if let Some(connection) = kyverno_runtime_nri::gate::launched_by_runtime() {
        return daemon::run_as_gate(connection);
    }
    let args = cli::Cli::parse();
    cli::init_logging(&args.log);
    let result = cli::run(args).and_then(|code| Ok(cli::out::flush().map(|()| code)?));
    match result {
        Ok(code) => code,
        Err(err) => {
            // A closed or full stdout ends the command as a Unix filter
            // ends (cli::out), not with the generic error line.
            if let Some(e) = err
                .chain()
                .find_map(|e| e.downcast_ref::<cli::out::StdoutError>())
            {
                return e.exit();
            }
            // stderr may be closed too: nothing more can be said then.
            let _ = writeln!(std::io::stderr(), "error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
