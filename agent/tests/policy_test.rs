//! `kyverno-runtime policy test`: the example passes; a wrong expectation,
//! a broken recording, an event no pod claims and a policy that does not
//! compile each fail, with the difference printed and a failing exit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn policy_test(paths: &[&Path]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "test"])
        .args(paths)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.success(), format!("{stdout}{stderr}"))
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policy-test")
}

/// A copy of the example with its test file replaced by `test`.
fn variant(test: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        example().join("policies.yaml"),
        dir.path().join("policies.yaml"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("events")).unwrap();
    for f in ["exec.jsonl", "metadata.jsonl", "quiet.jsonl"] {
        std::fs::copy(
            example().join("events").join(f),
            dir.path().join("events").join(f),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("kyverno-runtime-test.yaml"), test).unwrap();
    dir
}

const HEAD: &str = r#"
policies: [policies.yaml]
namespaces:
  shop: {team: payments}
  tools: {}
pods:
- {namespace: shop, name: web-0, labels: {app: web}, containers: {app: 101}}
- {namespace: shop, name: db-0, labels: {app: db}, containers: {db: 201}}
- {namespace: tools, name: debug, labels: {app: web}, containers: {shell: 301}}
"#;

#[test]
fn the_example_passes_every_case() {
    let (ok, out) = policy_test(&[&example()]);
    assert!(ok, "{out}");
    assert!(
        out.contains("  pass  an unexpected exec is reported, the pod's own programs and health checks are not  (6 events, 2 findings)\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "  pass  the metadata endpoint is refused for the payments team only  (4 events, 2 findings)\n"
        ),
        "{out}"
    );
    assert!(
        out.ends_with("1 test, 3 cases: 3 passed, 0 failed\n"),
        "{out}"
    );
    assert!(
        !out.contains("kernel refused"),
        "the monitor's log lines stay out of the output: {out}"
    );
}

#[test]
fn a_wrong_expectation_fails_with_the_difference() {
    let dir = variant(&format!(
        "{HEAD}cases:\n\
         - name: wrong count, a missing and an unexpected finding\n  \
           events: events/metadata.jsonl\n  \
           expect:\n  \
           - {{policy: no-metadata-endpoint, behavior: network, target: 169.254.169.254, enforced: true, count: 3, pod: shop/web-0}}\n  \
           - {{policy: no-metadata-endpoint, behavior: network, target: 169.254.169.254, enforced: true, count: 1, pod: tools/debug}}\n\
         - name: still right\n  \
           events: events/quiet.jsonl\n"
    ));
    let (ok, out) = policy_test(&[dir.path()]);
    assert!(!ok, "a failing case must fail the command: {out}");
    let want = "  FAIL  wrong count, a missing and an unexpected finding  (4 events, 2 findings)\n\
        \x20       count:      no-metadata-endpoint network 169.254.169.254 enforced=true pod=shop/web-0: expected 3, found 2\n\
        \x20       missing:    no-metadata-endpoint network 169.254.169.254 enforced=true pod=tools/debug count=1\n\
        \x20       unexpected: no-metadata-endpoint network 169.254.169.254 enforced=true pod=shop/db-0 count=1\n\
        \x20 pass  still right  (3 events, 0 findings)\n";
    assert!(out.contains(want), "want:\n{want}\ngot:\n{out}");
    assert!(
        out.ends_with("1 test, 2 cases: 1 passed, 1 failed\n"),
        "{out}"
    );
}

#[test]
fn a_bad_line_and_an_unattributed_event_fail_their_case() {
    let dir = variant(&format!(
        "{HEAD}cases:\n\
         - name: broken recording\n  \
           events: events/broken.jsonl\n"
    ));
    std::fs::write(
        dir.path().join("events/broken.jsonl"),
        "{\"cgroup\":101,\"facts\":{\"kind\":\"open\",\"path\":\"/etc/hosts\"}}\n\
         {\"cgroup\":999,\"facts\":{\"kind\":\"open\",\"path\":\"/etc/hosts\"}}\n\
         \n\
         {\"cgroup\":101,\"facts\":{\"kind\":\"protocol\",\"protocol\":\"gopher\"}}\n",
    )
    .unwrap();
    let (ok, out) = policy_test(&[dir.path()]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("  FAIL  broken recording  (2 events, 0 findings)\n"),
        "{out}"
    );
    assert!(
        out.contains("events/broken.jsonl:4: unknown protocol \"gopher\" (known: unclassified, ssh, tls, http/2, http/1.1, quic, dns)"),
        "{out}"
    );
    assert!(
        out.contains(
            "events/broken.jsonl: line 2 attributed to no declared pod (by pod, cgroup or podUid)"
        ),
        "{out}"
    );
}

#[test]
fn a_policy_that_does_not_compile_fails_the_test() {
    let dir = variant(&format!(
        "{HEAD}cases:\n- name: never runs\n  events: events/quiet.jsonl\n"
    ));
    std::fs::write(
        dir.path().join("policies.yaml"),
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata: {name: typed}\n\
         spec:\n  behaviors:\n  - open: {deny: {expression: \"1 + 2\"}}\n",
    )
    .unwrap();
    let (ok, out) = policy_test(&[dir.path()]);
    assert!(!ok, "{out}");
    assert!(out.contains(": ERROR\n"), "{out}");
    assert!(
        out.contains("policy typed: spec.behaviors[0].open.deny.expression: expression has type int; a behavior expression must be list(string)"),
        "{out}"
    );
    assert!(
        out.ends_with("1 test, 1 case: 0 passed, 1 failed\n"),
        "{out}"
    );
}

#[test]
fn a_path_without_tests_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = policy_test(&[dir.path()]);
    assert!(!ok);
    assert!(out.contains("no kyverno-runtime-test.yaml under"), "{out}");
}

/// A test from an untrusted directory cannot read outside it: `..`, an
/// absolute path and a link leading out are each refused by name, and no
/// error shows a byte of the file they point at.
#[test]
fn a_test_reads_nothing_outside_its_directory_and_shows_no_content() {
    let outer = tempfile::tempdir().unwrap();
    let token = outer.path().join("token");
    std::fs::write(&token, "ghp_SECRETTOKEN123\n").unwrap();
    let dir = outer.path().join("a/b");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("../../token", dir.join("linked.jsonl")).unwrap();
    std::fs::write(
        dir.join("kyverno-runtime-test.yaml"),
        format!(
            "policies: [../../token, {}]\n\
             cases:\n\
             - {{name: up, events: ../../token}}\n\
             - {{name: link, events: linked.jsonl}}\n",
            token.display()
        ),
    )
    .unwrap();
    let (ok, out) = policy_test(&[&dir]);
    assert!(!ok, "{out}");
    assert!(!out.contains("SECRET"), "{out}");
    assert!(
        out.contains(
            "../../token: a .. component; a test reads only files under its own directory"
        ),
        "{out}"
    );
    assert!(out.contains("token: an absolute path;"), "{out}");

    // The policies are fine now: the cases run, and each is refused.
    std::fs::write(dir.join("p.yaml"), "").unwrap();
    std::fs::write(
        dir.join("kyverno-runtime-test.yaml"),
        "policies: [p.yaml]\n\
         cases:\n\
         - {name: up, events: ../../token}\n\
         - {name: link, events: linked.jsonl}\n",
    )
    .unwrap();
    let (ok, out) = policy_test(&[&dir]);
    assert!(!ok, "{out}");
    assert!(!out.contains("SECRET"), "{out}");
    assert!(
        out.contains("linked.jsonl: resolves outside the test's directory"),
        "{out}"
    );

    // A file the test may read, whose content is not what was expected:
    // the error says where and what, not what the file holds.
    std::fs::copy(&token, dir.join("p.yaml")).unwrap();
    std::fs::copy(&token, dir.join("events.jsonl")).unwrap();
    std::fs::write(
        dir.join("kyverno-runtime-test.yaml"),
        "policies: [p.yaml]\ncases: [{name: c, events: events.jsonl}]\n",
    )
    .unwrap();
    let (ok, out) = policy_test(&[&dir]);
    assert!(!ok, "{out}");
    assert!(!out.contains("SECRET"), "{out}");
    assert!(
        out.contains("p.yaml: document 1: not a RuntimePolicy: invalid type: string \"…\""),
        "{out}"
    );
    let (ok, out) = policy_test(&[&token]);
    assert!(!ok, "{out}");
    assert!(!out.contains("SECRET"), "{out}");
    assert!(
        out.contains("ERROR not a test: invalid type: string \"…\", expected struct TestFile"),
        "{out}"
    );
}

/// [`policy_test`] that gives up after `limit`, killing the command: a walk
/// that followed links would otherwise run (and grow) until memory ran out.
fn policy_test_within(paths: &[&Path], limit: std::time::Duration) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "test"])
        .args(paths)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("policy test {paths:?} still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.success(), format!("{stdout}{stderr}"))
}

/// A directory walk follows no link: two links back to the directory (a
/// walk that followed them would visit 2^40 paths) end at once, and a
/// linked test file is reported, not run.
#[test]
fn a_walk_follows_no_link() {
    let dir = variant(&format!(
        "{HEAD}cases:\n- name: quiet\n  events: events/quiet.jsonl\n"
    ));
    std::os::unix::fs::symlink(".", dir.path().join("loop-a")).unwrap();
    std::os::unix::fs::symlink("..", dir.path().join("events/loop-b")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir(elsewhere.path().join("linked")).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("kyverno-runtime-test.yaml"),
        elsewhere.path().join("linked/kyverno-runtime-test.yaml"),
    )
    .unwrap();
    let limit = std::time::Duration::from_secs(30);
    let (ok, out) = policy_test_within(&[dir.path()], limit);
    assert!(ok, "{out}");
    assert!(
        out.ends_with("1 test, 1 case: 1 passed, 0 failed\n"),
        "{out}"
    );
    let (ok, out) = policy_test_within(&[elsewhere.path()], limit);
    assert!(!ok, "{out}");
    assert!(
        out.contains("linked/kyverno-runtime-test.yaml: ERROR a symbolic link: a directory walk follows none"),
        "{out}"
    );
}

/// Counts come from the recording: two events of `count: u64::MAX` add up
/// to u64::MAX (saturating), not to a panic.
#[test]
fn counts_from_a_recording_saturate() {
    let dir = variant(&format!(
        "{HEAD}cases:\n\
         - name: huge\n  \
           events: events/huge.jsonl\n  \
           expect:\n  \
           - {{policy: web-exec, behavior: exec, target: /usr/bin/curl, count: 18446744073709551615, pod: shop/web-0}}\n"
    ));
    let line = "{\"count\":18446744073709551615,\"cgroup\":101,\"facts\":{\"kind\":\"exec\",\"filename\":\"/usr/bin/curl\"}}\n";
    std::fs::write(dir.path().join("events/huge.jsonl"), line.repeat(2)).unwrap();
    let (ok, out) = policy_test(&[dir.path()]);
    assert!(ok, "{out}");
    assert!(!out.contains("panicked"), "{out}");
    assert!(
        out.contains("  pass  huge  (2 events, 1 finding)\n"),
        "{out}"
    );
}
