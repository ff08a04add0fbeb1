//! Command-line interface: global flags and one module per subcommand.

mod chart_policy;
pub mod cleanup;
mod collector;
mod confined;
mod crd;
pub(crate) mod go_flags;
pub mod input;
pub mod out;
mod policy;
mod policy_test;
mod probe;
mod propose;
mod yaml_docs;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

/// kyverno-runtime enforces and observes what pods do (file opens, program
/// execution, network egress, application protocol, DNS) with eBPF, driven by
/// the cluster-scoped RuntimePolicy resource.
#[derive(Debug, Parser)]
#[command(name = "kyverno-runtime", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Logging flags shared by every subcommand.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter in `tracing` env-filter syntax (for example `info,kyverno_runtime=debug`);
    /// a bare integer is the Go original's verbosity (0 info, 1 debug, 2 or more trace).
    #[arg(long, env = "KRT_LOG", default_value = "info", global = true)]
    pub log_level: String,
    /// klog's verbosity (`-v N`, `--v=N`), which DaemonSets written for
    /// Kubernetes components pass: overrides --log-level, mapped as its
    /// integers are. Hidden: --log-level is this binary's flag.
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        hide = true,
        allow_negative_numbers = true
    )]
    pub v: Option<i64>,
    /// Log line format.
    #[arg(long, env = "KRT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe what this kernel can do and print which backend serves each behavior.
    Probe(probe::ProbeArgs),
    /// Print the CustomResourceDefinitions generated from the API types.
    Crd(crd::CrdArgs),
    /// Run the node daemon: watch policies and this node's pods, enforce, report.
    Daemon(Box<go_flags::DaemonCommand>),
    /// Remove the BPF pins the daemon left (uninstall), detaching its programs; only its own,
    /// in a bpffs directory it marked.
    Cleanup(cleanup::CleanupArgs),
    /// Check RuntimePolicy files offline: the lists the daemon would program, or every error.
    Policy(policy::PolicyArgs),
    /// Run the reference collector of the push stream: mutual TLS, one JSON line per finding.
    Collector(collector::CollectorArgs),
    /// Propose a RuntimePolicy allowing what a workload was observed doing (from its
    /// monitor findings: Reports in the cluster, a Report file, or collector lines).
    Propose(propose::ProposeArgs),
}

/// Installs the global `tracing` subscriber; logs go to stderr so that
/// command output on stdout stays machine-readable.
pub fn init_logging(args: &LogArgs) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(go_flags::log_filter(&args.log_level, args.v))
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a person at a terminal; a log file or a
        // container log must stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Probe(args) => probe::run(args),
        Command::Crd(args) => crd::run(args),
        Command::Daemon(cmd) => crate::daemon::run(cmd.into_args()),
        Command::Cleanup(args) => cleanup::run(args),
        Command::Policy(args) => policy::run(args),
        Command::Collector(args) => collector::run(args),
        Command::Propose(args) => propose::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every daemon flag can be set from the environment (a DaemonSet's
    /// env or a systemd unit), and says so in `--help`.
    #[test]
    fn every_daemon_flag_has_an_environment_variable() {
        let cmd = Cli::command();
        let daemon = cmd
            .find_subcommand("daemon")
            .unwrap_or_else(|| panic!("no daemon subcommand"));
        let mut checked = 0;
        for arg in daemon.get_arguments() {
            let id = arg.get_id().as_str();
            // Hidden: the Go original's flags (cli/go_flags.rs), not this daemon's.
            if matches!(id, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            assert!(
                arg.get_env().is_some(),
                "--{id} has no environment variable"
            );
            assert!(arg.get_help().is_some(), "--{id} has no help text");
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} flags checked");
    }
}
