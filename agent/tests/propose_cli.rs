//! `kyverno-runtime propose` from files: a Report file and the collector's
//! JSON lines become a policy that `policy check` accepts, in monitor mode
//! and switched to enforce; what cannot be proposed is refused with the
//! reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
}

fn run(args: &[&str]) -> (Output, String, String) {
    let out = bin().args(args).output().unwrap();
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    (out, stdout, stderr)
}

fn check(path: &Path) -> String {
    let (out, stdout, _) = run(&["policy", "check", path.to_str().unwrap()]);
    assert!(out.status.success(), "{stdout}");
    stdout
}

/// A Report as the reporter writes one for a Deployment (trimmed to what
/// propose reads), with a finding refused by an enforce policy and one
/// from another tool.
const REPORT: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: openreports.io/v1alpha1
  kind: Report
  metadata: {name: kyverno-runtime-deployment.web, namespace: shop}
  source: kyverno-runtime
  scope: {apiVersion: apps/v1, kind: Deployment, name: web, namespace: shop, uid: 5f1c}
  results:
  - {policy: discover-web, rule: exec, source: kyverno-runtime, result: fail,
     properties: {behavior: exec, target: /usr/local/bin/shop, enforced: "false", count: "12"}}
  - {policy: discover-web, rule: open, source: kyverno-runtime, result: fail,
     properties: {behavior: open, target: /etc/shop/config.json, enforced: "false", count: "12"}}
  - {policy: discover-web, rule: open, source: kyverno-runtime, result: fail,
     properties: {behavior: open, target: /etc/shop/once.txt, enforced: "false", count: "1"}}
  - {policy: discover-web, rule: network, source: kyverno-runtime, result: fail,
     properties: {behavior: network, target: 10.96.0.10, enforced: "false", count: "30"}}
  - {policy: discover-web, rule: network, source: kyverno-runtime, result: fail,
     properties: {behavior: network, target: 10.96.4.2, enforced: "false", count: "8"}}
  - {policy: discover-web, rule: protocol, source: kyverno-runtime, result: fail,
     properties: {behavior: protocol, target: http/1.1, enforced: "false", count: "5"}}
  - {policy: discover-web, rule: dns, source: kyverno-runtime, result: warn,
     properties: {behavior: dns, target: inventory.shop.svc.cluster.local, enforced: "false", count: "5"}}
  - {policy: no-nc, rule: exec, source: kyverno-runtime, result: fail,
     properties: {behavior: exec, target: /usr/bin/nc, enforced: "true", count: "2"}}
  - {policy: cve-scan, source: trivy, result: fail}
"#;

#[test]
fn a_report_file_becomes_a_policy_that_checks_in_monitor_and_in_enforce() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.yaml");
    std::fs::write(&report, REPORT).unwrap();
    let policy = dir.path().join("web.yaml");
    let (out, _, stderr) = run(&[
        "propose",
        "--report-file",
        report.to_str().unwrap(),
        "--match-label",
        "app=web",
        "--open-min-count",
        "2",
        "--aggregate-ipv4",
        "16",
        "-o",
        policy.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    let yaml = std::fs::read_to_string(&policy).unwrap();
    for want in [
        "# RuntimePolicy proposed by `kyverno-runtime propose` for Deployment shop/web\n",
        "#   open /etc/shop/once.txt (seen 1): seen fewer than 2 times (--open-min-count)\n",
        "#   exec /usr/bin/nc (seen 2): refused by enforce policy no-nc: it did not happen, so it is not proposed\n",
        "#   network 10.96.0.0/21 stands for 10.96.0.10, 10.96.4.2 (aggregated); it also allows 2046 addresses never seen\n",
        "  name: web-observed\nspec:\n  mode: monitor\n",
        "      kubernetes.io/metadata.name: shop\n",
        "  name: web-observed-dns\n",
    ] {
        assert!(yaml.contains(want), "{want:?} not in\n{yaml}");
    }
    assert!(
        stderr.contains("1 result(s) not written by kyverno-runtime skipped"),
        "{stderr}"
    );
    assert!(
        stderr.contains("proposed web-observed and web-observed-dns for Deployment shop/web: 5 values allowed over 4 behavior entries, 2 left out"),
        "{stderr}"
    );
    let checked = check(&policy);
    for want in [
        "policy web-observed (mode monitor)\n",
        "  spec.behaviors[0].exec\n    allow: /usr/local/bin/shop\n    deny:  *\n",
        "  spec.behaviors[1].open\n    allow: /etc/shop/config.json\n    deny:  *\n",
        "  spec.behaviors[2].network\n    allow: 10.96.0.0/21\n    deny:  *\n",
        "  spec.behaviors[3].protocol\n    allow: http/1.1\n    deny:  *\n",
        "policy web-observed-dns (mode monitor)\n  spec.behaviors[0].dns\n    allow: inventory.shop.svc.cluster.local\n",
        "2 policies checked, 0 with errors",
    ] {
        assert!(checked.contains(want), "{want:?} not in\n{checked}");
    }
    // Switched to enforce (the main policy only: dns cannot enforce).
    std::fs::write(&policy, yaml.replacen("mode: monitor", "mode: enforce", 1)).unwrap();
    assert!(check(&policy).contains("policy web-observed (mode enforce)"));
}

#[test]
fn collector_lines_of_several_workloads_need_a_choice() {
    let line = |pod: &str, owner: &str, target: &str| {
        format!(
            r#"{{"node":"n1","policy":"discover","policyUid":"u","behavior":"exec","pod":{{"namespace":"shop","name":"{pod}","uid":"x","container":"app","ownerKind":"Deployment","ownerName":"{owner}"}},"target":"{target}","enforced":false,"decision":"default-denied","count":2,"firstObserved":"2026-01-01T00:00:00Z","lastObserved":"2026-01-01T00:00:00Z","fingerprint":"00"}}"#
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let lines = dir.path().join("findings.jsonl");
    std::fs::write(
        &lines,
        [
            line("web-a", "web", "/bin/sh"),
            line("web-b", "web", "/usr/local/bin/shop"),
            line("db-0", "db", "/usr/bin/postgres"),
        ]
        .join("\n"),
    )
    .unwrap();
    let file = lines.to_str().unwrap();
    let (out, _, stderr) = run(&[
        "propose",
        "--collector-file",
        file,
        "--match-label",
        "app=web",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the input has findings of 2 workloads: name one as KIND/NAME (deployment/db in shop, deployment/web in shop)"),
        "{stderr}"
    );
    let (out, yaml, stderr) = run(&[
        "propose",
        "deploy/web",
        "--collector-file",
        file,
        "--match-label",
        "app=web",
    ]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        yaml.contains(
            "      allow:\n        values:\n        - /bin/sh\n        - /usr/local/bin/shop\n"
        ),
        "{yaml}"
    );
    assert!(!yaml.contains("postgres"), "{yaml}");
}

#[test]
fn a_file_needs_the_pod_labels_and_a_bad_label_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.yaml");
    std::fs::write(&report, REPORT).unwrap();
    let file = report.to_str().unwrap();
    let (out, _, stderr) = run(&["propose", "--report-file", file]);
    assert!(!out.status.success());
    assert!(
        stderr.contains("a file does not say which labels Deployment shop/web's pods carry: pass --match-label KEY=VALUE"),
        "{stderr}"
    );
    let (out, stdout, stderr) = run(&[
        "propose",
        "--report-file",
        file,
        "--match-label",
        "app=we b",
    ]);
    assert!(!out.status.success());
    assert!(stdout.is_empty(), "nothing is written when the check fails");
    assert!(
        stderr.contains("the proposed policy does not check"),
        "{stderr}"
    );
}

#[test]
fn help_says_to_discover_first() {
    let (out, stdout, _) = run(&["propose", "--help"]);
    assert!(out.status.success());
    assert!(
        stdout.contains("A monitor finding exists only for what a policy would deny"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- exec: {deny: {values: [\"*\"]}}"),
        "{stdout}"
    );
}
