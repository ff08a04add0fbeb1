//! `kyverno-runtime policy check`: the daemon's compile, evaluate and
//! value parsing, offline, with every error's field path and a failing
//! exit status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn check(files: &[&Path]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "check"])
        .args(files)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn the_example_policies_check_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (ok, out) = check(&[
        &root.join("examples/deny-exec.yaml"),
        &root.join("examples/watch-egress.yaml"),
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains(
            "spec.behaviors[0].exec\n    allow: (none)\n    deny:  /usr/local/bin/forbidden\n  ok"
        ),
        "{out}"
    );
    assert!(out.contains("2 policies checked, 0 with errors"), "{out}");
}

#[test]
fn every_error_is_printed_with_its_path_and_the_exit_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: mixed}
spec:
  mode: enforce
  podSelector: {matchLabels: {app: web}}
  variables:
  - name: extra
    expression: "['10.1.0.0/16']"
  behaviors:
  - network:
      deny:
        values: ["10.0.0.0/8", "fd00::/64", "example.com", "api.prod.svc", "10.0.0.300"]
        expression: "variables.extra"
  - exec: {deny: {values: ["/bin/../sh"]}}
---
apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: typed}
spec:
  behaviors:
  - open: {deny: {expression: "1 + 2"}}
---
apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: dns-enforce}
spec:
  mode: enforce
  podSelector: {}
  behaviors:
  - dns: {deny: {values: ["example.com"]}}
"#,
    )
    .unwrap();
    let (ok, out) = check(&[&file]);
    println!("{out}");
    assert!(!ok);
    // Literals and the expression's result are unioned.
    assert!(
        out.contains(
            "deny:  10.0.0.0/8, fd00::/64, example.com, api.prod.svc, 10.0.0.300, 10.1.0.0/16"
        ),
        "{out}"
    );
    // A domain and a Service are destinations the daemon resolves; the
    // address that is none is refused.
    assert!(
        out.contains("Services (each node programs their addresses from the API): api.prod.svc"),
        "{out}"
    );
    assert!(!out.contains(r#""example.com" is not programmed"#), "{out}");
    assert!(
        out.contains(r#"error: spec.behaviors[0].network.deny: "10.0.0.300" is not programmed"#),
        "{out}"
    );
    assert!(
        out.contains(r#"error: spec.behaviors[1].exec.deny: "/bin/../sh""#),
        "{out}"
    );
    assert!(out.contains("error: spec.behaviors[0].open.deny.expression: expression has type int; a behavior expression must be list(string)"), "{out}");
    assert!(
        out.contains("policy dns-enforce (mode enforce)\n  error: "),
        "{out}"
    );
    assert!(out.contains("3 policies checked, 3 with errors"), "{out}");
}
