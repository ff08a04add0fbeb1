//! The crate's one error type.
//!
//! Every failure a caller may want to tell apart (a kernel that cannot be
//! downloaded, a guest that panics, a boot that runs out of time) is its own
//! variant, so the matrix can report each configuration precisely and the
//! conformance suite can match on the kind. [`Error::label`] gives a stable,
//! short name per variant for tables and metric labels.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use crate::kernel::KernelSeries;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while resolving a kernel, building an
/// initramfs or booting a guest.
// Clone (hence the Arc'd sources) so one resolution failure can be reported
// for every configuration of the matrix that needed that kernel.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A kernel series name that is not one of `5.10`, `6.1`, `6.12`, `7.x`.
    #[error("unknown kernel series {0:?} (expected one of 5.10, 6.1, 6.12, 7.x)")]
    UnknownSeries(String),

    /// An LSM mode name that is not `bpf` or `nobpf`.
    #[error("unknown LSM mode {0:?} (expected bpf or nobpf)")]
    UnknownLsmMode(String),

    /// An accelerator name (from `VMTEST_ACCEL`) that is not `tcg` or `kvm`.
    #[error("unknown accelerator {0:?} (expected tcg or kvm)")]
    UnknownAccel(String),

    /// A `--file` argument that is not `HOST:GUEST` with an absolute guest path.
    #[error("bad file mapping {0:?}: expected HOST:GUEST with an absolute GUEST path")]
    BadFileMapping(String),

    /// A host forward that is not `GUEST:HOST` (or one port), ports 1 to 65535.
    #[error("bad host forward {0:?}: expected GUEST_PORT:HOST_PORT or PORT")]
    BadForward(String),

    /// Neither `$KRT_CACHE_DIR`, `$XDG_CACHE_HOME` nor `$HOME` is set.
    #[error("no cache directory: set KRT_CACHE_DIR, XDG_CACHE_HOME or HOME")]
    NoCacheDir,

    /// The machine's apt configuration names no main Debian archive to
    /// borrow the mirror URI from.
    #[error("no Debian mirror found in the machine's apt configuration (looked in {searched:?}); set VMTEST_MIRROR")]
    NoMirror {
        /// The files that were read.
        searched: Vec<PathBuf>,
    },

    /// An apt step (update, download) failed; `apt_tail` is the end of its output.
    #[error("downloading kernel {series}: {step} failed: {status}\n{apt_tail}")]
    Download {
        /// The series being resolved.
        series: KernelSeries,
        /// What was being done, e.g. `apt-get update (bullseye)`.
        step: String,
        /// How the tool exited.
        status: String,
        /// The last lines of the tool's stdout and stderr.
        apt_tail: String,
    },

    /// The suite's package lists hold no package matching the series pattern.
    #[error("kernel {series}: no package matching {pattern} in suite {suite}")]
    NoKernelPackage {
        /// The series being resolved.
        series: KernelSeries,
        /// The suite searched.
        suite: String,
        /// The package-name pattern searched for.
        pattern: String,
    },

    /// Neither the image package nor any package it depends on ships a vmlinuz.
    #[error(
        "kernel {series}: no vmlinuz in {package} or in the packages it depends on ({tried:?})"
    )]
    NoVmlinuz {
        /// The series being resolved.
        series: KernelSeries,
        /// The image package that was resolved.
        package: String,
        /// Every package that was downloaded and searched.
        tried: Vec<String>,
    },

    /// `ldd` reports a library that the host does not have.
    #[error("{binary}: shared library {library} not found by ldd")]
    MissingLibrary {
        /// The binary that needs it.
        binary: PathBuf,
        /// The library's soname.
        library: String,
    },

    /// A helper tool (apt-cache, dpkg-deb, cpio, ldd, qemu) could not be run
    /// or exited with an error.
    #[error("{tool} failed: {status}\n{output_tail}")]
    Tool {
        /// The command line that was run, shortened to its program and first args.
        tool: String,
        /// How it exited, or why it could not start.
        status: String,
        /// The last lines of its output.
        output_tail: String,
    },

    /// A file-system operation failed.
    #[error("{context}: {path}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Arc<io::Error>,
    },

    /// A cache metadata file could not be read or written as JSON.
    #[error("kernel metadata {path}: {source}")]
    Metadata {
        /// The metadata file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Arc<serde_json::Error>,
    },

    /// The guest did not finish before the per-boot timeout; qemu was killed.
    #[error(
        "guest timed out after {:.0?}; qemu killed\n--- console tail ---\n{console_tail}",
        timeout
    )]
    Timeout {
        /// The timeout that expired.
        timeout: Duration,
        /// The last lines of the kernel console.
        console_tail: String,
        /// The command's output so far.
        output: String,
    },

    /// The guest kernel panicked (the console contains `Kernel panic`).
    #[error("kernel panic: {panic_line}\n--- console tail ---\n{console_tail}")]
    KernelPanic {
        /// The console line that reported the panic.
        panic_line: String,
        /// The last lines of the kernel console.
        console_tail: String,
    },

    /// The guest's init could not set up its environment (a required mount
    /// failed) and reported so on the console.
    #[error("guest setup failed: {step}\n--- console tail ---\n{console_tail}")]
    GuestSetup {
        /// What failed, as reported by the init script.
        step: String,
        /// The last lines of the kernel console.
        console_tail: String,
    },

    /// qemu exited without the guest printing its exit sentinel.
    #[error("no sentinel: qemu exited ({status}) before the guest reported an exit status\n--- qemu stderr ---\n{stderr_tail}\n--- console tail ---\n{console_tail}")]
    NoSentinel {
        /// qemu's exit status.
        status: String,
        /// The last lines of qemu's own stderr.
        stderr_tail: String,
        /// The last lines of the kernel console.
        console_tail: String,
    },

    /// The guest needs a NIC (it has host forwards) and the kernel's driver
    /// modules could not be provided: the package holding them is missing
    /// and cannot be downloaded, or a module is neither built in nor shipped.
    #[error("kernel {kernel}: cannot provide the kernel modules: {message}")]
    KernelModules {
        /// The kernel release.
        kernel: String,
        /// What is missing, and where it was looked for.
        message: String,
    },

    /// The guest has host forwards and no `vmtest-relay` program was found
    /// for qemu to run per connection.
    #[error("no {name} program for host forwards (looked at {searched:?}); build it with `cargo build -p vmtest --bin {name}` or set VMTEST_RELAY")]
    RelayNotFound {
        /// The program's name.
        name: &'static str,
        /// The paths that were tried.
        searched: Vec<PathBuf>,
    },

    /// KVM was forced (`VMTEST_ACCEL=kvm`) or probed, and qemu reported a
    /// KVM internal error.
    #[error("KVM failure: {message}")]
    Kvm {
        /// The first KVM error line qemu printed.
        message: String,
    },
}

impl Error {
    /// A short, stable name for the variant: table cells, metric labels,
    /// JSON `kind` fields.
    pub fn label(&self) -> &'static str {
        match self {
            Error::UnknownSeries(_) => "unknown series",
            Error::UnknownLsmMode(_) => "unknown lsm mode",
            Error::UnknownAccel(_) => "unknown accel",
            Error::BadFileMapping(_) => "bad file mapping",
            Error::BadForward(_) => "bad forward",
            Error::NoCacheDir => "no cache dir",
            Error::NoMirror { .. } => "no mirror",
            Error::Download { .. } => "download failed",
            Error::NoKernelPackage { .. } => "no kernel package",
            Error::NoVmlinuz { .. } => "no vmlinuz",
            Error::MissingLibrary { .. } => "missing library",
            Error::Tool { .. } => "tool failed",
            Error::Io { .. } => "io error",
            Error::Metadata { .. } => "metadata error",
            Error::Timeout { .. } => "timeout",
            Error::KernelPanic { .. } => "kernel panic",
            Error::GuestSetup { .. } => "guest setup failed",
            Error::NoSentinel { .. } => "no sentinel",
            Error::KernelModules { .. } => "no kernel modules",
            Error::RelayNotFound { .. } => "no relay",
            Error::Kvm { .. } => "kvm failure",
        }
    }

    /// Whether the guest itself failed (a panic, a hang, a boot that never
    /// reached the sentinel), as opposed to the harness or the download.
    pub fn is_guest_failure(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::KernelPanic { .. } | Error::NoSentinel { .. }
        )
    }

    /// Wraps an [`io::Error`] with what was being done and to which path.
    pub(crate) fn io(context: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    /// Wraps a JSON error for a cache metadata file.
    pub(crate) fn metadata(path: impl Into<PathBuf>, source: serde_json::Error) -> Self {
        Error::Metadata {
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

/// Formats an exit status for error messages (`exit 100`, `signal 9`).
pub(crate) fn describe_status(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "unknown status".to_owned(),
    }
}

/// The last `lines` lines of `text`, for error reports that must stay short.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    all[start..]
        .iter()
        .map(|l| l.trim_end_matches('\r'))
        .collect::<Vec<_>>()
        .join("\n")
}
