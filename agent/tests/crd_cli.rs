//! `kyverno-runtime crd` prints exactly the committed CRD files.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn crd_cli(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .arg("crd")
        .args(args)
        .output()
        .expect("run kyverno-runtime crd");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn committed(name: &str) -> String {
    let dir = if name.starts_with("openreports") {
        "../charts/kyverno-runtime/files/openreports"
    } else {
        "../charts/kyverno-runtime/crds"
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn crd_prints_the_committed_runtime_policy_crd() {
    assert_eq!(
        crd_cli(&[]),
        committed("runtime.nirmata.io_runtimepolicies.yaml")
    );
}

#[test]
fn crd_all_prints_every_committed_crd() {
    let want = [
        "runtime.nirmata.io_runtimepolicies.yaml",
        "openreports.io_reports.yaml",
        "openreports.io_clusterreports.yaml",
    ]
    .map(committed)
    .join("---\n");
    assert_eq!(crd_cli(&["--all"]), want);
}
