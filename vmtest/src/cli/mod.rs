//! Command-line interface: one module per subcommand; this one holds the
//! top-level parser and the arguments the subcommands share.

pub mod kernels;
pub mod matrix;
pub mod run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use vmtest::initramfs::{parse_env, parse_file_mapping};
use vmtest::{GuestExpose, HostForward, KernelSeries, LsmMode, Workload, DEFAULT_MEMORY_MIB};

/// Boot stock Debian kernels under qemu with a small initramfs and run a
/// command inside.
///
/// Kernels are downloaded once into $KRT_CACHE_DIR/vmtest (else
/// $XDG_CACHE_HOME/kyverno-runtime/vmtest, else
/// ~/.cache/kyverno-runtime/vmtest) through a private apt configuration that
/// borrows the machine's Debian mirror. VMTEST_ACCEL=tcg|kvm forces the
/// accelerator; otherwise KVM is used only if a probe boot under it works.
#[derive(Debug, Parser)]
#[command(name = "vmtest", version)]
pub struct Cli {
    /// Log filter for progress messages on stderr (tracing env-filter syntax).
    #[arg(long, global = true, env = "VMTEST_LOG", default_value = "info")]
    pub log: String,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resolve and download kernels, and print their versions.
    Kernels(kernels::KernelsArgs),
    /// Boot one kernel and run a command; exits with the command's status.
    Run(run::RunArgs),
    /// Run a command on every kernel × LSM mode and print a table.
    #[command(long_flag = "matrix")]
    Matrix(matrix::MatrixArgs),
}

/// Runs the chosen subcommand.
pub fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Kernels(a) => kernels::exec(a),
        Command::Run(a) => run::exec(a),
        Command::Matrix(a) => matrix::exec(a),
    }
}

pub(crate) fn series_arg(s: &str) -> Result<KernelSeries, vmtest::Error> {
    s.parse()
}

pub(crate) fn lsm_arg(s: &str) -> Result<LsmMode, vmtest::Error> {
    s.parse()
}

fn file_arg(s: &str) -> Result<(PathBuf, PathBuf), vmtest::Error> {
    parse_file_mapping(s)
}

fn forward_arg(s: &str) -> Result<HostForward, vmtest::Error> {
    s.parse()
}

fn expose_arg(s: &str) -> Result<GuestExpose, vmtest::Error> {
    s.parse()
}

fn env_arg(s: &str) -> Result<(String, String), String> {
    parse_env(s).ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// What to put in the guest and run there (shared by `run` and `matrix`).
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// A host binary to place at /bin/NAME, with the libraries ldd lists.
    #[arg(long = "bin", value_name = "PATH")]
    pub binaries: Vec<PathBuf>,

    /// A host file or directory to copy into the guest at GUEST (absolute).
    #[arg(long = "file", value_name = "HOST:GUEST", value_parser = file_arg)]
    pub files: Vec<(PathBuf, PathBuf)>,

    /// An environment variable for the command.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = env_arg)]
    pub env: Vec<(String, String)>,

    /// Hard timeout per boot in seconds; qemu is killed when it expires.
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    pub timeout: u64,

    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MEMORY_MIB)]
    pub memory: u32,

    /// An extra qemu argument (repeat for several).
    #[arg(long = "qemu-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub qemu_args: Vec<String>,

    /// Let the guest reach 127.0.0.1:HOST_PORT on the host by connecting to
    /// 10.0.2.100:GUEST_PORT (repeatable; PORT alone for both). Gives the
    /// guest a NIC that reaches nothing else; needs vmtest-relay beside this
    /// binary, on PATH or in $VMTEST_RELAY.
    #[arg(long = "forward", value_name = "GUEST_PORT:HOST_PORT", value_parser = forward_arg)]
    pub forwards: Vec<HostForward>,

    /// Let the host reach the guest's GUEST_PORT by connecting to
    /// HOST_ADDR:HOST_PORT (an address of the host's own; repeatable).
    /// Gives the guest a NIC, as --forward does.
    #[arg(long = "expose", value_name = "HOST_ADDR:HOST_PORT:GUEST_PORT", value_parser = expose_arg)]
    pub exposes: Vec<GuestExpose>,

    /// A kernel module to load (with its dependencies, from the kernel's
    /// package) before the command runs (repeatable).
    #[arg(long = "module", value_name = "NAME")]
    pub modules: Vec<String>,

    /// How many times `matrix` boots a configuration again when the guest
    /// itself failed (panic, hang, no sentinel); every retry is reported.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub retries: u32,

    /// The command to run in the guest, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl WorkloadArgs {
    /// The library's view of these arguments.
    pub fn workload(&self) -> Workload {
        Workload {
            binaries: self.binaries.clone(),
            files: self.files.clone(),
            env: self.env.clone(),
            command: self.command.clone(),
            timeout: Duration::from_secs(self.timeout),
            memory_mib: self.memory,
            extra_qemu_args: self.qemu_args.clone(),
            host_forwards: self.forwards.clone(),
            exposes: self.exposes.clone(),
            modules: self.modules.clone(),
            retries: self.retries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn matrix_alias_and_lists() {
        let cli = Cli::try_parse_from([
            "vmtest",
            "--matrix",
            "--kernels",
            "5.10,7.x",
            "--lsm",
            "nobpf",
            "--",
            "cat",
            "/x",
        ])
        .unwrap();
        let Command::Matrix(m) = cli.command else {
            panic!("not matrix");
        };
        assert_eq!(m.kernels, vec![KernelSeries::V5_10, KernelSeries::V7]);
        assert_eq!(m.lsm, vec![LsmMode::NoBpf]);
        assert_eq!(m.workload.command, vec!["cat", "/x"]);
    }

    #[test]
    fn run_args() {
        let cli = Cli::try_parse_from([
            "vmtest",
            "run",
            "--kernel",
            "6.1",
            "--lsm",
            "bpf",
            "--bin",
            "/bin/true",
            "--file",
            "a:/b",
            "--timeout",
            "5",
            "--forward",
            "6443:34567",
            "--forward",
            "80",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run");
        };
        assert_eq!(r.kernel, KernelSeries::V6_1);
        assert_eq!(
            r.workload.files,
            vec![(PathBuf::from("a"), PathBuf::from("/b"))]
        );
        assert_eq!(r.workload.workload().timeout, Duration::from_secs(5));
        assert_eq!(
            r.workload.workload().host_forwards,
            vec![HostForward::new(6443, 34567), HostForward::new(80, 80)]
        );
        assert!(Cli::try_parse_from([
            "vmtest",
            "run",
            "--kernel",
            "6.1",
            "--forward",
            "0:1",
            "--",
            "true"
        ])
        .is_err());
        assert!(Cli::try_parse_from(["vmtest", "run", "--kernel", "4.19", "--", "true"]).is_err());
        assert!(Cli::try_parse_from(["vmtest", "run", "--kernel", "6.1"]).is_err());
    }
}
