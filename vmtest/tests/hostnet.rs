//! A guest reaching a port on the host's loopback through a
//! [`HostForward`], and nothing else (feature `vm-tests`, like boot.rs).
//!
//! Run with
//! `cargo test -p vmtest --features vm-tests -- --test-threads=1`.

// Helpers outside #[test] fns panic too: in a test file a panic is the report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use vmtest::{resolve_kernel, run, Cache, GuestExpose, HostForward, KernelSeries, LsmMode, VmSpec};

/// Connections the guest opens at once.
const CONNECTIONS: usize = 3;
/// The port the guest connects to on 10.0.2.100 (deliberately not the host's).
const GUEST_PORT: u16 = 6443;

/// A line server on 127.0.0.1: each connection sends one line and gets one
/// reply, but only once `CONNECTIONS` connections are open at the same time,
/// so the replies prove the forward carries concurrent connections (a
/// serialising forward would leave every reply saying `alone`).
fn start_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let waiting = Arc::new((Mutex::new(0usize), Condvar::new()));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let waiting = Arc::clone(&waiting);
            std::thread::spawn(move || serve(conn, &waiting));
        }
    });
    port
}

fn serve(mut conn: TcpStream, waiting: &(Mutex<usize>, Condvar)) {
    let mut line = String::new();
    if BufReader::new(conn.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap_or(0)
        == 0
    {
        return; // a probe that sent nothing
    }
    let (count, cv) = waiting;
    let mut n = count.lock().unwrap();
    *n += 1;
    cv.notify_all();
    let (n, timeout) = cv
        .wait_timeout_while(n, Duration::from_secs(60), |n| *n < CONNECTIONS)
        .unwrap();
    let together = if timeout.timed_out() {
        "alone".to_owned()
    } else {
        format!("{} open at once", *n)
    };
    drop(n);
    let _ = writeln!(conn, "reply to {} ({together})", line.trim());
}

#[test]
fn guest_reaches_host_loopback_port_and_nothing_else() {
    let host_port = start_server();
    let cache = Cache::from_env().expect("cache dir");
    let kernel = resolve_kernel(KernelSeries::V6_12, &cache).expect("resolve 6.12");
    let g = GUEST_PORT;
    let script = format!(
        r#"
for i in 1 2 3; do
  (echo "hello $i" | nc 10.0.2.100 {g} >/tmp/reply$i 2>&1) &
done
wait
cat /tmp/reply1 /tmp/reply2 /tmp/reply3
probe() {{
  if nc -w 3 "$1" "$2" </dev/null >/dev/null 2>&1; then echo "$1:$2 reachable"; else echo "$1:$2 blocked"; fi
}}
probe 10.0.2.100 {other}
probe 10.0.2.2 {host_port}
probe 10.0.2.3 53
probe 1.1.1.1 80
"#,
        other = g + 1,
    );
    let mut spec = VmSpec::new(kernel, LsmMode::Bpf, vec!["sh".into(), "-c".into(), script]);
    spec.host_forwards = vec![HostForward::new(g, host_port)];
    spec.relay = Some(PathBuf::from(env!("CARGO_BIN_EXE_vmtest-relay")));
    // A guest that itself fails (a panic, a hang) is booted once more, as
    // `vmtest matrix --retries 1` does; the crash is printed. Seen once
    // under TCG: a panic in inet_ehashfn from an interrupt, on a boot that
    // passed three times in a row after.
    let out = match run(&spec) {
        Err(e) if e.is_guest_failure() => {
            eprintln!("the guest failed, booting it once more: {e:?}");
            run(&spec).expect("boot (retried once)")
        }
        other => other.expect("boot"),
    };
    eprintln!(
        "guest output ({:.2} s):\n{}",
        out.duration.as_secs_f64(),
        out.output
    );
    assert_eq!(out.exit_code, 0, "console:\n{}", out.console);
    for i in 1..=CONNECTIONS {
        let want = format!("reply to hello {i} ({CONNECTIONS} open at once)\n");
        assert!(
            out.output.contains(&want),
            "missing {want:?}:\n{}",
            out.output
        );
    }
    // restrict=on: the forward's address on another port, the gateway (which
    // without restrict=on is the host's loopback, where our server listens),
    // slirp's DNS and the outside world are all out of reach.
    for blocked in [
        format!("10.0.2.100:{} blocked", g + 1),
        format!("10.0.2.2:{host_port} blocked"),
        "10.0.2.3:53 blocked".to_owned(),
        "1.1.1.1:80 blocked".to_owned(),
    ] {
        assert!(
            out.output.contains(&blocked),
            "{blocked:?}:\n{}",
            out.output
        );
    }
}

#[test]
fn host_reaches_guest_port_through_expose_and_kernel_modules_load() {
    // The other direction, what a kubelet in a guest needs: the host
    // connects to a loopback port, the guest's listener answers (slirp shows
    // it the host as its gateway, which it reaches without a default
    // route). And a module asked for by name (bridge, with its llc and stp)
    // is loaded before the command: the guest makes a bridge.
    let cache = Cache::from_env().expect("cache dir");
    let kernel = resolve_kernel(KernelSeries::V6_12, &cache).expect("resolve 6.12");
    let host_port = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let script = r#"
ip link add krt-test0 type bridge && echo "bridge made"
echo "guest answers" | nc -l -p 8080 >/tmp/got
echo "guest got: $(cat /tmp/got)"
"#;
    let mut spec = VmSpec::new(
        kernel,
        LsmMode::Bpf,
        vec!["sh".into(), "-c".into(), script.into()],
    );
    spec.exposes = vec![format!("127.0.0.1:{host_port}:8080")
        .parse::<GuestExpose>()
        .unwrap()];
    spec.modules = vec!["bridge".into()];
    spec.relay = Some(PathBuf::from(env!("CARGO_BIN_EXE_vmtest-relay")));
    let guest = std::thread::spawn(move || run(&spec));
    // qemu listens from its start, the guest's nc only once booted: until
    // then a connection is accepted and closed with nothing said.
    let mut reply = String::new();
    for _ in 0..240 {
        if let Ok(mut conn) = TcpStream::connect(("127.0.0.1", host_port)) {
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = writeln!(conn, "host says hi");
            let _ = BufReader::new(conn).read_line(&mut reply);
            if !reply.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = guest.join().unwrap().expect("boot");
    eprintln!("guest output:\n{}", out.output);
    assert_eq!(reply, "guest answers\n");
    assert_eq!(out.exit_code, 0, "console:\n{}", out.console);
    assert!(out.output.contains("bridge made\n"), "{}", out.output);
    assert!(
        out.output.contains("guest got: host says hi\n"),
        "{}",
        out.output
    );
}

#[test]
fn missing_kernel_package_is_a_clear_error() {
    // A kernel whose cache holds no packages, and lists that know none: the
    // NIC modules cannot be had, and the error says where they were sought
    // (before any qemu is started).
    let dir = tempfile::tempdir().unwrap();
    let kernel = vmtest::Kernel {
        series: KernelSeries::V6_12,
        version: "6.12.0-0-cloud-amd64".into(),
        package: "linux-image-6.12.0-0-cloud-amd64".into(),
        package_version: "6.12.0-0".into(),
        vmlinuz: dir.path().join("kernels/6.12.0-0-cloud-amd64/vmlinuz"),
    };
    std::fs::create_dir_all(kernel.vmlinuz.parent().unwrap()).unwrap();
    let mut spec = VmSpec::new(kernel, LsmMode::Bpf, vec!["true".into()]);
    spec.host_forwards = vec![HostForward::new(80, 80)];
    match vmtest::run_with_accel(&spec, vmtest::Accel::Tcg) {
        Err(e @ vmtest::Error::KernelModules { .. }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(
                msg.contains("linux-image-6.12.0-0-cloud-amd64_6.12.0-0_amd64.deb (missing"),
                "{msg}"
            );
        }
        other => panic!("expected a kernel modules error, got {other:?}"),
    }
}
