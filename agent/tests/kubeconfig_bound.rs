//! The kubeconfig the kube client reads is bounded as every other input:
//! `KUBECONFIG=/dev/zero` or a file over 16 MiB is refused at once, by
//! name, instead of read until memory runs out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `kyverno-runtime propose deployment/web` with `KUBECONFIG` set, killed
/// (and the test failed) if it has not ended within 30 s.
fn propose_with(kubeconfig: &std::path::Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["propose", "deployment/web"])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("still reading {} after 30 s", kubeconfig.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn an_endless_or_oversized_kubeconfig_is_refused_by_name() {
    let (code, stderr) = propose_with(std::path::Path::new("/dev/zero"));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr, "error: kubeconfig /dev/zero: not a regular file\n",
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("config");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(16 * 1024 * 1024 + 1)
        .unwrap();
    let (code, stderr) = propose_with(&big);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.ends_with("config: larger than 16777216 bytes (the limit for one input); nothing was read past it\n"),
        "{stderr}"
    );
}
