//! `vmtest-relay` on its own, the way qemu runs it: one socket as stdin,
//! stdout and stderr, the other end playing the guest. No VM needed.

// Helpers outside #[test] fns panic too: in a test file a panic is the report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts the relay to `port` with `guest`'s peer as stdin, stdout and stderr.
fn relay(port: u16) -> (Child, UnixStream) {
    let (guest, relay_end) = UnixStream::pair().unwrap();
    let fd = || Stdio::from(OwnedFd::from(relay_end.try_clone().unwrap()));
    let child = Command::new(env!("CARGO_BIN_EXE_vmtest-relay"))
        .arg(format!("127.0.0.1:{port}"))
        .env_remove("VMTEST_RELAY_LOG")
        .stdin(fd())
        .stdout(fd())
        .stderr(fd())
        .spawn()
        .unwrap();
    (child, guest)
}

fn wait(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("relay still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn half_close_request_then_reply() {
    // The server reads to EOF, so the reply only comes if the guest's
    // half-close is passed on; and the reply has no newline, so it only
    // arrives if the relay does not line-buffer.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = String::new();
        conn.read_to_string(&mut request).unwrap();
        conn.write_all(format!("got {request:?}").as_bytes())
            .unwrap();
    });
    let (mut child, mut guest) = relay(port);
    guest.write_all(b"hello\nworld").unwrap();
    guest.shutdown(Shutdown::Write).unwrap();
    let mut reply = String::new();
    guest.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "got \"hello\\nworld\"");
    server.join().unwrap();
    assert!(wait(&mut child, Duration::from_secs(10)).success());
}

#[test]
fn reply_without_newline_is_not_held_back() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(conn.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        conn.write_all(b"partial").unwrap();
        // Keep the connection open until the client has read.
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
    });
    let (mut child, mut guest) = relay(port);
    guest.write_all(b"ping\n").unwrap();
    guest
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 7];
    guest.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"partial");
    drop(guest);
    server.join().unwrap();
    assert!(wait(&mut child, Duration::from_secs(10)).success());
}

#[test]
fn exits_when_the_guest_goes_away_even_if_the_server_does_not() {
    // A watch: the server never closes. When the guest connection is gone
    // (qemu exited, or the guest closed), the relay must not linger.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(30));
        drop(conn);
    });
    let (mut child, mut guest) = relay(port);
    guest.write_all(b"GET /watch\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(guest);
    assert!(wait(&mut child, Duration::from_secs(5)).success());
    drop(server);
}

#[test]
fn unreachable_port_closes_the_guest_side_silently() {
    // A port nothing listens on: bind, note it, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (mut child, mut guest) = relay(port);
    let status = wait(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(1));
    // The error went to /dev/null, not into the guest's stream.
    guest
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    guest.read_to_end(&mut got).unwrap();
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
}

#[test]
fn errors_go_to_the_log_file_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("relay.log");
    let out = Command::new(env!("CARGO_BIN_EXE_vmtest-relay"))
        .arg("not-an-address")
        .env("VMTEST_RELAY_LOG", &log)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.is_empty());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("not an address"), "{text}");
}
