//! Tier 3 (`kube-tests`): a Report with every field set survives the real
//! API server (ci/kube-up) unchanged.

use kyverno_runtime_api::openreports::Report;

mod every_field;
use every_field::every_field;

/// A Report with every field set survives the real API server
/// (its schema, pruning and defaulting) unchanged.
#[test]
fn report_with_every_field_round_trips_through_the_api_server() -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::process::Stdio;

    let cluster = kyverno_runtime_testkube::LocalCluster::get()?;
    let crds =
        kyverno_runtime_testkube::repo_root().join("charts/kyverno-runtime/files/openreports");
    cluster.kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &crds.to_string_lossy(),
    ])?;
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/reports.openreports.io",
    ])?;
    let namespace = "krt-openreports-test";
    let _ = cluster.kubectl_output(&["create", "namespace", namespace])?;

    let mut report = Report::new("every-field", every_field());
    report.metadata.namespace = Some(namespace.into());
    let _ = cluster.kubectl_output(&[
        "delete",
        "report",
        "every-field",
        "-n",
        namespace,
        "--ignore-not-found",
    ])?;
    let mut child = cluster
        .kubectl()
        .args(["create", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&serde_json::to_vec(&report)?)?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "create: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let stored = cluster.kubectl_ok(&[
        "get",
        "report",
        "every-field",
        "-n",
        namespace,
        "-o",
        "json",
    ])?;
    let back: Report = serde_json::from_str(&stored)?;
    cluster.kubectl_ok(&["delete", "report", "every-field", "-n", namespace])?;
    assert_eq!(back.spec, report.spec, "the server changed the report");
    assert_eq!(back.metadata.name.as_deref(), Some("every-field"));
    Ok(())
}
