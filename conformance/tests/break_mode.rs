//! The suite can fail: `--break` flips one expected outcome of an
//! enforcement rule (network-deny's step 3: a UDP datagram to 127.0.20.1
//! is refused with EPERM, now expected delivered), and a real run on the
//! host as a node
//! of the local API server must then exit 1 and say, in the matrix and in
//! the JSON, which scenario on which node saw what instead.
//!
//! Needs root and the local control plane (`eval "$(ci/kube-up)"`, or
//! the fixture starts one), and the daemon built beside this test
//! (`cargo build -p kyverno-runtime`): a nested cargo would wait for the
//! lock this test's cargo holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

/// `target/debug/kyverno-runtime`, next to this test's `deps/` directory.
fn daemon() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = debug.join("kyverno-runtime");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build -p kyverno-runtime first",
        bin.display()
    );
    bin
}

#[test]
fn a_flipped_enforcement_outcome_fails_the_run_readably() {
    // The fixture exports KUBECONFIG for the runner (started with ci/kube-up
    // when the environment names no control plane).
    let cluster = kyverno_runtime_testkube::LocalCluster::get().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.json");
    let junit = dir.path().join("results.xml");
    let out = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["--kernels", "none", "--host", "--scenario", "network-deny"])
        .args(["--break", "network-deny:3"])
        .arg("--daemon-bin")
        .arg(daemon())
        .arg("--json")
        .arg(&json)
        .arg("--junit")
        .arg(&junit)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("KRT_KUBE_BIN", &cluster.bin)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the run must fail");

    // The header says what was flipped; the matrix shows the cell; the
    // failure line names scenario, node, kernel, step, expected, observed.
    assert!(
        stdout.contains("--break: network-deny step 3: expected dropped, now delivered"),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("network-deny "))
        .expect("the scenario's row");
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["network-deny", "FAIL"]
    );
    let failure = stdout
        .lines()
        .find(|l| l.starts_with("FAIL network-deny on host"))
        .expect("the failure line");
    assert!(
        failure.contains(
            "step 3 (connect udp 127.0.20.1:5353 in network-deny/web, flipped by --break): \
             expected delivered, observed dropped (the kernel refused the send: EPERM)"
        ),
        "{failure}"
    );
    assert!(failure.contains("(host, kernel "), "{failure}");

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results["passed"], false);
    let cell = results["run"]["nodes"][0]["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["scenario"] == "network-deny")
        .unwrap()
        .clone();
    assert_eq!(cell["verdict"], "fail");
    assert!(cell["difference"]
        .as_str()
        .unwrap()
        .contains("expected delivered, observed dropped"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("<failure message=\"step 3 (connect udp 127.0.20.1:5353"),
        "{xml}"
    );
}
