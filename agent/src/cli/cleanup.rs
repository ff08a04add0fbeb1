//! `kyverno-runtime cleanup`: removes the BPF pins the daemon left, which
//! detaches its programs. The daemon runs the same code itself when it
//! finds at shutdown that its DaemonSet was deleted (an uninstall).
//!
//! It removes only what the daemon's pin layout names, in a directory the
//! daemon marked as its own (`kyverno_runtime_bpf::pins`): anything else
//! there is kept and named. A directory that is not on a bpffs, is a mount
//! root, is a symlink or carries no marker is refused before anything is
//! touched (exit status 2).

use clap::Args;
use kyverno_runtime_bpf::pins::{self, PinError, Removal};
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `kyverno-runtime cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The daemon's pin directory (its --pin-dir; the chart sets
    /// KRT_PIN_DIR in the daemon's container, so inside it no flag is
    /// needed).
    #[arg(long, env = "KRT_PIN_DIR", default_value = pins::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

/// The exit status of a refusal: nothing was touched.
pub const REFUSED: u8 = 2;

/// Runs the subcommand: 0 when the pins are gone (foreign entries may be
/// kept, and are named), 1 when one of ours could not be removed, 2 when
/// the directory is refused.
pub fn run(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    match pins::remove(&args.pin_dir) {
        Ok(removal) => report(&removal),
        Err(e @ PinError::Refused { .. }) => {
            eprintln!("error: {e}; nothing was removed");
            Ok(ExitCode::from(REFUSED))
        }
        Err(e) => Err(e.into()),
    }
}

/// Prints what `removal` did: a summary line, then one line per entry
/// kept (stdout) and per failure (stderr).
fn report(removal: &Removal) -> anyhow::Result<ExitCode> {
    if removal.absent {
        crate::outln!("{removal}")?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!("{removal} (programs detach once no process holds them)")?;
    for kept in &removal.kept {
        crate::outln!("{kept}")?;
    }
    crate::cli::out::flush()?;
    for failed in &removal.failed {
        eprintln!("error: {failed}");
    }
    Ok(if removal.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use kyverno_runtime_bpf::pins::DEFAULT_PIN_DIR;

    /// `cleanup` with no flag in the chart's container cleans what its
    /// daemon pinned only if the chart's default and the binary's agree
    /// (the chart passes it as KRT_PIN_DIR, which both read).
    #[test]
    fn the_default_pin_dir_is_the_charts() {
        let values = include_str!("../../../charts/kyverno-runtime/values.yaml");
        let chart = values
            .lines()
            .find_map(|l| l.trim().strip_prefix("pinDir: "))
            .unwrap_or_else(|| panic!("no daemon.pinDir in values.yaml"));
        assert_eq!(chart, DEFAULT_PIN_DIR);
        let template = include_str!("../../../charts/kyverno-runtime/templates/daemonset.yaml");
        assert!(
            template.contains("- name: KRT_PIN_DIR\n              value: {{ $d.pinDir | quote }}")
        );
    }
}
