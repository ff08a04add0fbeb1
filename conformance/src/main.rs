//! `conformance`: runs the scenarios of `conformance/scenarios/` against
//! the real daemon on every configuration of the kernel matrix, each a
//! node of one local API server, and on the host as a restricted node.
//!
//! ```text
//! cargo run -p conformance -- --kernels 5.10,6.1,6.12,7.x --lsm bpf,nobpf --host
//! cargo run -p conformance -- --kernels 6.12 --lsm bpf --scenario exec-deny
//! cargo run -p conformance -- --list
//! ```
//!
//! The runner (this process, on the host) builds the daemon, starts or
//! finds the local control plane (`ci/kube-up`), boots each configuration
//! in `vmtest` with this same binary inside as `conformance node`, which
//! plays the kubelet, runs the daemon and the scenarios and prints one
//! result line per scenario; workload processes are `conformance child`.
//! The matrix table is printed at the end; `--junit` and `--json` write
//! the same results for machines. Exit status: 0 when every cell passed
//! (or does not apply, with its reason), 1 when any failed, 2 on a usage
//! or setup error.

mod child;
mod node;
mod real;
mod runner;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs the conformance scenarios on a kernel matrix and the host.
#[derive(Debug, Parser)]
#[command(name = "conformance", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: runner::RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inside a node: play the kubelet, run the daemon and the scenarios
    /// of a plan (what the runner boots each guest with).
    #[command(hide = true)]
    Node {
        /// The plan the runner wrote.
        #[arg(long)]
        plan: PathBuf,
    },
    /// A workload process: joins a container's cgroup and the workloads'
    /// network, performs one action and prints what happened.
    #[command(hide = true)]
    Child {
        /// The task, as JSON.
        task: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Child { task }) => return child::main(&task),
        Some(Command::Node { plan }) => node::main(&plan),
        None => runner::main(cli.run),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("conformance: {e:#}");
            ExitCode::from(2)
        }
    }
}
