//! The host end of a [`HostForward`](crate::HostForward).
//!
//! qemu's user-mode network (`guestfwd=tcp:10.0.2.100:PORT-cmd:…`) spawns a
//! program for every TCP connection the guest opens to a forwarded address,
//! with the connection as its stdin, stdout *and stderr* (one socket). That
//! program is `vmtest-relay 127.0.0.1:HOSTPORT` ([`main`]): it connects to the
//! host port and copies bytes both ways. One process per connection is what
//! lets a guest hold several connections at once (a Kubernetes client keeps
//! a watch open while it sends requests); a chardev forward would carry only
//! one.
//!
//! Because stderr is the guest's stream, the relay never writes to it: it is
//! pointed at `/dev/null`, or at the file named by `VMTEST_RELAY_LOG` (the
//! relay inherits qemu's, hence the harness's, environment) for debugging.
//!
//! ## Finding the program
//!
//! The relay must be a program of its own: most users of this library are
//! test harnesses, whose `main` belongs to libtest and cannot be re-executed
//! as a relay. [`locate`] looks, in order, at the path the spec names
//! ([`VmSpec::relay`](crate::VmSpec::relay)), `$VMTEST_RELAY`, `vmtest-relay`
//! beside the current executable and in its parent directory (cargo puts test
//! binaries in `target/<profile>/deps/`, bins one level up), then `$PATH`.
//! `cargo build -p vmtest` builds it; vmtest's own tests use
//! `CARGO_BIN_EXE_vmtest-relay`.

use std::fs::File;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::error::{Error, Result};

/// The relay program's file name.
pub const RELAY_BIN: &str = "vmtest-relay";
/// Environment variable naming the relay program explicitly.
pub const RELAY_ENV: &str = "VMTEST_RELAY";
/// Environment variable naming a file the relay appends its errors to.
pub const RELAY_LOG_ENV: &str = "VMTEST_RELAY_LOG";

/// How often a relay whose guest side stopped sending checks whether the
/// guest connection is gone altogether.
const HANGUP_CHECK: Duration = Duration::from_millis(200);

/// Finds the relay program (see the module documentation for the order):
/// `explicit`, `$VMTEST_RELAY`, beside the current executable or one
/// directory up, `$PATH`.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    let env = std::env::var_os(RELAY_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let exe = std::env::current_exe().ok();
    let path = std::env::var_os("PATH").unwrap_or_default();
    locate_in(
        explicit,
        env.as_deref(),
        exe.as_deref(),
        std::env::split_paths(&path),
    )
}

/// [`locate`] with its inputs injected, so the order is testable.
fn locate_in(
    explicit: Option<&Path>,
    env: Option<&Path>,
    exe: Option<&Path>,
    path: impl Iterator<Item = PathBuf>,
) -> Result<PathBuf> {
    // A path given explicitly is used or refused, never replaced by a guess.
    if let Some(p) = explicit.or(env) {
        return if is_executable(p) {
            Ok(p.to_owned())
        } else {
            Err(Error::RelayNotFound {
                name: RELAY_BIN,
                searched: vec![p.to_owned()],
            })
        };
    }
    let mut searched = Vec::new();
    let beside = exe
        .and_then(Path::parent)
        .into_iter()
        .flat_map(|dir| std::iter::once(dir.to_owned()).chain(dir.parent().map(Path::to_owned)));
    for dir in beside.chain(path) {
        let candidate = dir.join(RELAY_BIN);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
        searched.push(candidate);
    }
    Err(Error::RelayNotFound {
        name: RELAY_BIN,
        searched,
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The entry point of `vmtest-relay ADDR`: relays stdin/stdout to `ADDR`.
/// Exits 0 when the connection ended, 1 when `ADDR` could not be reached
/// (the guest then sees its connection closed), 2 on a usage error.
pub fn main() -> ExitCode {
    quiet_stderr();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr] = args.as_slice() else {
        eprintln!("usage: {RELAY_BIN} HOST:PORT (run by qemu, one process per guest connection)");
        return ExitCode::from(2);
    };
    let Ok(target) = addr.parse::<SocketAddr>() else {
        eprintln!("{RELAY_BIN}: not an address: {addr:?}");
        return ExitCode::from(2);
    };
    match relay(target) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{RELAY_BIN}: {target}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Points stderr away from the guest's stream: at `$VMTEST_RELAY_LOG`, else
/// at `/dev/null`. If neither opens, stderr stays as it is; nothing is
/// written to it before this point and the relay writes to it only on errors.
fn quiet_stderr() {
    let sink = std::env::var_os(RELAY_LOG_ENV)
        .filter(|v| !v.is_empty())
        .and_then(|p| File::options().create(true).append(true).open(p).ok())
        .or_else(|| File::options().write(true).open("/dev/null").ok());
    if let Some(sink) = sink {
        let _ = nix::unistd::dup2_stderr(sink);
    }
}

/// Which direction of the relay finished.
enum Finished {
    /// The guest stopped sending (EOF on stdin).
    FromGuest,
    /// The host port stopped sending.
    ToGuest,
}

/// Connects to `target` and copies stdin to it and its replies to stdout,
/// passing each direction's end on as a half-close, until both directions
/// ended or the guest connection is gone altogether.
pub fn relay(target: SocketAddr) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    // Requests are small and latency-bound; do not hold them back.
    let _ = server.set_nodelay(true);
    // Owned duplicates of fds 0 and 1, used unbuffered: std's stdout is
    // line-buffered, which would hold back a reply that does not end in \n.
    let guest_in = File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let guest_out: OwnedFd = io::stdout().as_fd().try_clone_to_owned()?;
    let (done, finished) = mpsc::channel();

    let to_guest = {
        let mut server = server.try_clone()?;
        let mut out = File::from(guest_out.try_clone()?);
        let done = done.clone();
        move || {
            let _ = io::copy(&mut server, &mut out);
            // Under qemu stdout is a socket: a half-close makes slirp send
            // the guest a FIN. Anything else (a pipe) just stays open.
            let _ = UnixStream::from(OwnedFd::from(out)).shutdown(Shutdown::Write);
            let _ = done.send(Finished::ToGuest);
        }
    };
    let from_guest = {
        let mut guest_in = guest_in;
        let server = server.try_clone()?;
        move || {
            let _ = io::copy(&mut guest_in, &mut &server);
            let _ = server.shutdown(Shutdown::Write);
            let _ = done.send(Finished::FromGuest);
        }
    };
    thread::spawn(to_guest);
    thread::spawn(from_guest);

    let mut guest_done = false;
    let mut open = 2;
    loop {
        let event = if guest_done {
            finished.recv_timeout(HANGUP_CHECK)
        } else {
            finished
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
        };
        match event {
            Ok(Finished::FromGuest) => {
                guest_done = true;
                open -= 1;
            }
            Ok(Finished::ToGuest) => open -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
        if open == 0 {
            return Ok(());
        }
        // The guest stopped sending: either a half-close that still waits
        // for replies, or the connection (or qemu) is gone and the host
        // port may never close its end (a watch). Only the second shows
        // as a hangup; checked only now, so every byte the guest sent has
        // been forwarded before the process exits.
        if guest_done && hung_up(&guest_out) {
            return Ok(());
        }
    }
}

/// Whether `fd` reports a hangup or error (peer gone, both directions shut).
fn hung_up(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Ok(_) => false,
        // poll failing on a valid fd does not happen; treat it as gone
        // rather than spin.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn locate_order() {
        let dir = tempfile::tempdir().unwrap();
        let deps = dir.path().join("debug/deps");
        std::fs::create_dir_all(&deps).unwrap();
        let exe = deps.join("boot-0123");
        let up = dir.path().join("debug").join(RELAY_BIN);
        std::fs::write(&up, "").unwrap();
        // Not executable yet: not a candidate.
        let err = locate_in(None, None, Some(&exe), std::iter::empty()).unwrap_err();
        match err {
            Error::RelayNotFound { searched, .. } => {
                assert_eq!(searched, vec![deps.join(RELAY_BIN), up.clone()])
            }
            other => panic!("{other}"),
        }
        std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate_in(None, None, Some(&exe), std::iter::empty()).unwrap(),
            up
        );
        // An explicit path wins, and a wrong one is an error, not a guess.
        let other = dir.path().join("other");
        std::fs::write(&other, "").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate_in(Some(&other), Some(&up), Some(&exe), std::iter::empty()).unwrap(),
            other
        );
        assert_eq!(
            locate_in(None, Some(&other), Some(&exe), std::iter::empty()).unwrap(),
            other
        );
        assert!(locate_in(
            Some(&dir.path().join("nope")),
            None,
            Some(&exe),
            std::iter::empty()
        )
        .is_err());
        // $PATH last.
        let bin = tempfile::tempdir().unwrap();
        let on_path = bin.path().join(RELAY_BIN);
        std::fs::write(&on_path, "").unwrap();
        std::fs::set_permissions(&on_path, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate_in(None, None, None, std::iter::once(bin.path().to_owned())).unwrap(),
            on_path
        );
    }
}
