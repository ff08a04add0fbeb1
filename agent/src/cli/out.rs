//! Standard output for the subcommands, where a failed write is a value,
//! not a panic.
//!
//! `print!` panics when a write fails, and Rust ignores SIGPIPE, so
//! `kyverno-runtime crd --all | head -1` used to end in a panic message
//! once `head` had closed the pipe, and `> /dev/full` in another. Every
//! subcommand writes its output through [`out!`](crate::out) and
//! [`outln!`](crate::outln) instead, which return a [`StdoutError`];
//! `main` turns it into the conventional ending with [`StdoutError::exit`]:
//!
//! - the reader went away (`EPIPE`): nothing on stderr, exit status 141,
//!   what a shell shows for a process SIGPIPE ended (128 + 13), so
//!   `set -o pipefail` sees the same status as with any Unix filter;
//! - any other failure (`ENOSPC` on `/dev/full`, `EIO`): one line on
//!   stderr naming it, exit status 1.
//!
//! The daemon is not concerned: it writes nothing to stdout (its logs go to
//! stderr, through `tracing`, which drops what it cannot write).

use std::io::Write as _;
use std::process::ExitCode;

/// The exit status after the reader of standard output went away: what a
/// shell reports for a process ended by SIGPIPE.
pub const BROKEN_PIPE_STATUS: u8 = 128 + 13;

/// Writing to standard output failed.
#[derive(Debug, thiserror::Error)]
#[error("writing to standard output: {0}")]
pub struct StdoutError(#[source] pub std::io::Error);

impl StdoutError {
    /// Ends the command as described in the module docs, returning the
    /// status to exit with.
    pub fn exit(&self) -> ExitCode {
        if self.0.kind() == std::io::ErrorKind::BrokenPipe {
            return ExitCode::from(BROKEN_PIPE_STATUS);
        }
        // stderr may be closed too: nothing more can be said then.
        let _ = writeln!(std::io::stderr(), "error: {self}");
        ExitCode::FAILURE
    }
}

/// Writes formatted text to standard output (see [`out!`](crate::out)).
pub fn write_fmt(args: std::fmt::Arguments<'_>) -> Result<(), StdoutError> {
    std::io::stdout()
        .lock()
        .write_fmt(args)
        .map_err(StdoutError)
}

/// Writes bytes to standard output.
pub fn write_all(bytes: &[u8]) -> Result<(), StdoutError> {
    std::io::stdout()
        .lock()
        .write_all(bytes)
        .map_err(StdoutError)
}

/// Flushes standard output: what is still buffered is written now, so a
/// failure is reported rather than lost when the process exits.
pub fn flush() -> Result<(), StdoutError> {
    std::io::stdout().lock().flush().map_err(StdoutError)
}

/// `print!` that returns `Result<(), StdoutError>` instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!($($arg)*))
    };
}

/// `println!` that returns `Result<(), StdoutError>` instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::cli::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}
