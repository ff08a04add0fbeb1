//! `kyverno-runtime cleanup`: removes every BPF pin the daemon left, which
//! detaches its programs. The daemon runs the same code itself when it
//! finds at shutdown that its DaemonSet was deleted (an uninstall).

use anyhow::Context as _;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Flags of `kyverno-runtime cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The daemon's pin directory (its --pin-dir).
    #[arg(
        long,
        env = "KRT_PIN_DIR",
        default_value = "/sys/fs/bpf/kyverno-runtime"
    )]
    pub pin_dir: PathBuf,
}

/// Removes `pin_dir` and everything under it; a missing directory is
/// already clean.
pub fn remove_pins(pin_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(pin_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Runs the subcommand.
pub fn run(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    let existed = args.pin_dir.exists();
    remove_pins(&args.pin_dir).with_context(|| format!("removing {}", args.pin_dir.display()))?;
    if existed {
        crate::outln!(
            "removed {} (programs detach once no process holds them)",
            args.pin_dir.display()
        )?;
    } else {
        crate::outln!(
            "{} does not exist: nothing to remove",
            args.pin_dir.display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
