//! Tier 3: the RuntimePolicy CRD against a real kube-apiserver and etcd.
//!
//! Every manifest in `tests/admission/` states what the server must do with
//! it in its header (`# expect: accept` or `# expect: reject` followed by one
//! `# message:` line per substring the error must contain). Each is applied
//! with the real kubectl (`--dry-run=server`, so admission, schema
//! validation, the CEL rules and strict field validation all run, and
//! nothing is left behind). Other tests create real objects to read the
//! defaulted mode and the printer columns back.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_testkube::{repo_root, LocalCluster};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Installs the committed CRDs once per test process and waits until the
/// server serves them. Installing is itself a test: the server refuses a
/// CRD whose CEL rules exceed its cost budget.
fn cluster() -> &'static LocalCluster {
    static READY: OnceLock<()> = OnceLock::new();
    let cluster = LocalCluster::get().expect("local control plane (ci/kube-up)");
    READY.get_or_init(|| {
        let crds = repo_root().join("charts/kyverno-runtime/crds");
        cluster
            .kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                crds.to_str().unwrap(),
            ])
            .expect("the API server accepts the committed CRDs");
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/runtimepolicies.runtime.nirmata.io",
            ])
            .expect("RuntimePolicy CRD established");
    });
    cluster
}

struct Case {
    file: PathBuf,
    accept: bool,
    messages: Vec<String>,
}

fn cases() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/admission");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let mut accept = None;
            let mut messages = Vec::new();
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("# expect: ") {
                    accept = Some(match v.trim() {
                        "accept" => true,
                        "reject" => false,
                        other => panic!("{}: unknown expectation {other:?}", file.display()),
                    });
                } else if let Some(m) = line.strip_prefix("# message: ") {
                    messages.push(m.to_string());
                }
            }
            let accept =
                accept.unwrap_or_else(|| panic!("{}: no `# expect:` line", file.display()));
            assert!(
                accept || !messages.is_empty(),
                "{}: a reject case must name its message",
                file.display()
            );
            Case {
                file,
                accept,
                messages,
            }
        })
        .collect()
}

#[test]
fn every_manifest_is_accepted_or_refused_as_it_says() {
    let cluster = cluster();
    let cases = cases();
    assert!(
        cases.len() >= 30,
        "the issue asks for at least 30 manifests, found {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let out = cluster
            .kubectl_output(&[
                "apply",
                "--dry-run=server",
                "-f",
                case.file.to_str().unwrap(),
            ])
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match (case.accept, out.status.success()) {
            (true, true) => println!("ok      accept  {name}"),
            (false, false) => {
                let missing: Vec<&String> = case
                    .messages
                    .iter()
                    .filter(|m| !stderr.contains(m.as_str()))
                    .collect();
                if missing.is_empty() {
                    println!("ok      reject  {name}: {}", stderr.trim());
                } else {
                    failures.push(format!(
                        "{name}: refused, but the error lacks {missing:?}:\n  {}",
                        stderr.trim()
                    ));
                }
            }
            (true, false) => failures.push(format!(
                "{name}: must be accepted, was refused:\n  {}",
                stderr.trim()
            )),
            (false, true) => failures.push(format!(
                "{name}: must be refused ({:?}), was accepted",
                case.messages
            )),
        }
    }
    println!("{} manifests, {} failures", cases.len(), failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn apply_stdin(cluster: &LocalCluster, manifest: &str) {
    if let Err(e) = cluster.kubectl_stdin(&["apply", "-f", "-"], manifest) {
        panic!("apply failed: {e}");
    }
}

#[test]
fn an_omitted_mode_reads_back_as_monitor() {
    let cluster = cluster();
    apply_stdin(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: adm-default-mode
spec:
  behaviors:
  - exec:
      deny:
        values: [/bin/sh]
",
    );
    let mode = cluster
        .kubectl_ok(&[
            "get",
            "rpol",
            "adm-default-mode",
            "-o",
            "jsonpath={.spec.mode}",
        ])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "rpol", "adm-default-mode"])
        .unwrap();
    assert_eq!(mode, "monitor");
}

#[test]
fn kubectl_get_rpol_shows_mode_applied_reason_age() {
    let cluster = cluster();
    apply_stdin(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: adm-columns
spec:
  mode: enforce
  podSelector: {matchLabels: {app: web}}
  behaviors:
  - exec:
      deny:
        values: [/bin/sh]
",
    );
    // Status is written through the status subresource, as the daemon does.
    let patch = r#"{"status":{"conditions":[{"type":"Applied","status":"False","reason":"PodsMatched","message":"no node has a matching pod","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    cluster
        .kubectl_ok(&[
            "patch",
            "rpol",
            "adm-columns",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ])
        .unwrap();
    let table = cluster.kubectl_ok(&["get", "rpol", "adm-columns"]).unwrap();
    cluster
        .kubectl_ok(&["delete", "rpol", "adm-columns"])
        .unwrap();
    println!("{table}");
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "MODE", "APPLIED", "REASON", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["adm-columns", "enforce", "False", "PodsMatched"]
    );
}

#[test]
fn the_short_name_and_scope_are_the_originals() {
    let cluster = cluster();
    let out = cluster
        .kubectl_ok(&[
            "api-resources",
            "--api-group=runtime.nirmata.io",
            "--no-headers",
        ])
        .unwrap();
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        fields,
        [
            "runtimepolicies",
            "rpol",
            "runtime.nirmata.io/v1alpha1",
            "false",
            "RuntimePolicy"
        ]
    );
}

/// What the Go original's admission suite expects of one of its inputs.
enum GoVerdict {
    /// Accepted.
    Accept,
    /// Refused, the error containing each phrase.
    Reject(&'static [&'static str]),
}

/// The Go original's own admission tests (its chainsaw suites; inputs in
/// `tests/go-original-admission/`, see its README) get the verdict they
/// assert, with the phrases they match on (issue 30): a user's script that
/// matched the Go original's messages keeps working. One step differs on
/// purpose and is checked as ours.
#[test]
fn the_go_originals_admission_suite_gets_its_verdicts() {
    use GoVerdict::{Accept, Reject};
    const ONE_KIND: &[&str] =
        &["exactly one of network, exec, open, protocol, or dns must be specified"];
    let steps: &[(&str, GoVerdict)] = &[
        (
            "invalid-bad-mode.yaml",
            Reject(&["spec.mode", "Unsupported value", "audit"]),
        ),
        ("invalid-bad-two-kinds.yaml", Reject(ONE_KIND)),
        ("invalid-bad-zero-kinds.yaml", Reject(ONE_KIND)),
        ("invalid-bad-protocol-and-network.yaml", Reject(ONE_KIND)),
        (
            "invalid-bad-enforce-unscoped.yaml",
            Reject(&["an enforce-mode policy must state the pods it applies to"]),
        ),
        (
            "invalid-bad-unknown-field.yaml",
            Reject(&["workloadSelector"]),
        ),
        // Not type-checked at admission (the daemon's compiler says it in
        // status, and `policy check` before applying), as in the original.
        ("invalid-malformed-cel.yaml", Accept),
        ("dns-bad-dns-with-open.yaml", Reject(ONE_KIND)),
        ("dns-policy-dns-monitor.yaml", Accept),
        (
            "dns-bad-dns-enforce.yaml",
            Reject(&["it does not block them", "network behavior"]),
        ),
        (
            "monitorfilter-bad-monitorfilter-enforce.yaml",
            Reject(&[
                "a monitorFilter narrows what a monitor-mode policy reports",
                "never suppressed",
            ]),
        ),
        (
            "monitorfilter-bad-monitorfilter-empty.yaml",
            Reject(&["spec.monitorFilter.expressions"]),
        ),
        ("monitorfilter-policy-monitorfilter.yaml", Accept),
        ("valid-policy-minimal.yaml", Accept),
        ("valid-policy-enforce.yaml", Accept),
        ("valid-policy-namespace-selector.yaml", Accept),
        ("valid-policy-enforce-namespace-only.yaml", Accept),
        ("valid-policy-protocol.yaml", Accept),
        ("valid-policy-monitor.yaml", Accept),
        // The deliberate difference: the Go original accepts these three
        // value shapes and refuses them in its daemon; we refuse them here,
        // naming the field.
        (
            "dns-compiler-refused.yaml",
            Reject(&[
                "spec.behaviors[0].dns.allow.values[0]",
                "192.0.2.10",
                "api.*.example.com",
                "example.com.*",
            ]),
        ),
    ];
    let cluster = cluster();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go-original-admission");
    let on_disk = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "yaml")
        })
        .count();
    assert_eq!(on_disk, steps.len(), "every input has its step");
    let mut failures = Vec::new();
    for (file, verdict) in steps {
        let path = dir.join(file);
        let out = cluster
            .kubectl_output(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match (verdict, out.status.success()) {
            (Accept, true) => println!("agrees  accept  {file}"),
            (Reject(phrases), false) => {
                let missing: Vec<&&str> =
                    phrases.iter().filter(|p| !stderr.contains(**p)).collect();
                if missing.is_empty() && *file == "dns-compiler-refused.yaml" {
                    println!("differs reject  {file} (deliberate: the original accepts it)");
                } else if missing.is_empty() {
                    println!("agrees  reject  {file}");
                } else {
                    failures.push(format!("{file}: refused without {missing:?}: {stderr}"));
                }
            }
            (Accept, false) => failures.push(format!("{file}: refused: {stderr}")),
            (Reject(phrases), true) => {
                failures.push(format!("{file}: accepted, the suite expects {phrases:?}"))
            }
        }
    }
    println!(
        "{} steps of the Go original's admission suite, {} failures",
        steps.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
