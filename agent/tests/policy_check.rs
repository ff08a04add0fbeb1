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
        out.contains("policy dns-enforce (mode enforce)\n  refused by the API server (kubectl apply would fail):\n    spec: Invalid value: a dns behavior reports the names a workload resolves, it does not block them"),
        "{out}"
    );
    assert!(out.contains("3 policies checked, 3 with errors"), "{out}");
}

fn check_with(files: &[&Path], extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "check"])
        .args(extra)
        .args(files)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

const DATA_POLICY: &str = r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: data-driven}
spec:
  evaluationInterval: 1m
  behaviors:
  - network:
      deny:
        values: ["10.0.0.0/8"]
        expression: "resource.get('v1', 'configmaps', 'policy-data', 'egress').data.deny.split(',')"
      allow:
        expression: "http.get('https://lists.example/allow.json').body.cidrs.map(c, string(c))"
  - exec: {deny: {values: ["/usr/bin/nc"]}}
"#;

/// Without data, a policy reading data sources is not refused: the lists
/// that need no data are shown, and what needs live data is named.
#[test]
fn without_data_a_data_source_needs_live_data_and_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.yaml");
    std::fs::write(&file, DATA_POLICY).unwrap();
    let (ok, out) = check(&[&file]);
    println!("{out}");
    assert!(ok, "{out}");
    assert!(out.contains("  data: resource.get(\"v1\", \"configmaps\", \"policy-data\", \"egress\"): needs live data\n"), "{out}");
    assert!(
        out.contains("  data: http.get(\"https://lists.example/allow.json\"): needs live data\n"),
        "{out}"
    );
    assert!(out.contains("  spec.behaviors[0].network.allow.expression: needs live data: http.get(\"https://lists.example/allow.json\")"), "{out}");
    assert!(
        out.contains("  spec.behaviors[1].exec\n    allow: (none)\n    deny:  /usr/bin/nc\n"),
        "{out}"
    );
    assert!(
        out.contains("ok so far: needs live data to evaluate fully"),
        "{out}"
    );
    assert!(
        out.contains(
            "1 policy checked, 0 with errors, 1 needing live data (supply it with --data FILE)"
        ),
        "{out}"
    );
}

/// With `--data`, the policy is evaluated over the supplied results, and
/// their values are parsed like any others.
#[test]
fn with_data_the_lists_come_from_the_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.yaml");
    std::fs::write(&file, DATA_POLICY).unwrap();
    let data = dir.path().join("sources.yaml");
    std::fs::write(
        &data,
        r#"resources:
  - apiVersion: v1
    resource: configmaps
    namespace: policy-data
    name: egress
    object: {data: {deny: "192.168.7.0/24,example.org,10.0.0.300"}}
http:
  - url: https://lists.example/allow.json
    body: {cidrs: ["10.1.0.0/16"]}
"#,
    )
    .unwrap();
    let (ok, out) = check_with(&[&file], &["--data", data.to_str().unwrap()]);
    println!("{out}");
    assert!(!ok, "10.0.0.300 is refused: {out}");
    assert!(
        out.contains(
            "  data: resource.get(\"v1\", \"configmaps\", \"policy-data\", \"egress\"): supplied\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "    allow: 10.1.0.0/16\n    deny:  10.0.0.0/8, 192.168.7.0/24, example.org, 10.0.0.300\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(r#"error: spec.behaviors[0].network.deny: "10.0.0.300""#),
        "{out}"
    );
    // A failed fetch is an evaluation error with its field.
    std::fs::write(
        &data,
        r#"resources:
  - {apiVersion: v1, resource: configmaps, namespace: policy-data, name: egress, object: {data: {deny: "192.168.7.0/24"}}}
http:
  - {url: "https://lists.example/allow.json", error: "connection refused"}
"#,
    )
    .unwrap();
    let (ok, out) = check_with(&[&file], &["--data", data.to_str().unwrap()]);
    println!("{out}");
    assert!(!ok, "{out}");
    assert!(out.contains("  error: spec.behaviors[0].network.allow.expression: http.get(\"https://lists.example/allow.json\") failed: connection refused"), "{out}");
}

/// The checker's and the cost model's refusals, with their messages.
#[test]
fn data_source_and_cost_refusals_are_errors_with_their_fields() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: per-element-fetch}
spec:
  variables:
  - {name: names, expression: "['a', 'b']"}
  behaviors:
  - open: {deny: {expression: "variables.names.map(n, string(resource.get('v1', 'configmaps', 'd', n).data.path))"}}
---
apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: quadratic}
spec:
  variables:
  - {name: ips, expression: "http.get('https://lists.example/ips.json').body.map(x, string(x))"}
  behaviors:
  - network: {deny: {expression: "variables.ips.filter(ip, variables.ips.exists(o, o != ip && o.startsWith(ip)))"}}
---
apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata: {name: dyn-body}
spec:
  behaviors:
  - network: {deny: {expression: "http.get('https://lists.example/ips.json').body"}}
"#,
    )
    .unwrap();
    let (ok, out) = check(&[&file]);
    println!("{out}");
    assert!(!ok);
    assert!(out.contains("policy per-element-fetch (mode monitor)\n  error: spec.behaviors[0].open.deny.expression: resource.get: argument 4 (`n`) is not known before evaluation: it uses the macro variable n"), "{out}");
    assert!(out.contains("policy quadratic (mode monitor)\n  error: spec.behaviors[0].network.deny.expression: its estimated cost ("), "{out}");
    assert!(out.contains("grows faster than the data"), "{out}");
    assert!(out.contains("policy dyn-body (mode monitor)\n  error: spec.behaviors[0].network.deny.expression: expression has type dyn; a behavior expression must be list(string): coerce with .map(x, string(x))"), "{out}");
    assert!(out.contains("3 policies checked, 3 with errors"), "{out}");
}

/// Runs `policy check` on `text`, killed if it has not finished in 30 s
/// (today's main loops forever on a syntax error): exit status, stdout.
fn check_text(text: &[u8]) -> (Option<i32>, String, std::time::Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, text).unwrap();
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["policy", "check"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Read at most 64 KiB: an endless loop of errors must not fill memory.
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut out = Vec::new();
        let _ = stdout.take(64 * 1024).read_to_end(&mut out);
        out
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = String::from_utf8_lossy(&reader.join().unwrap())
        .replace(&format!("{}: ", file.display()), "");
    (status, out, started.elapsed())
}

/// #24 §2: a YAML syntax error is one error with its line and column, and
/// the exit is 1 at once (it printed "document 1, 2, 3 ..." forever).
#[test]
fn a_yaml_syntax_error_is_one_error_with_line_and_column() {
    let cases: &[(&[u8], &str)] = &[
        (b"a: {b: 1\n", "document 1: not YAML: did not find expected ',' or '}' at line 2 column 1"),
        (b"apiVersion: v1\nkind: a\x00b\n", "document 1: not YAML: line 2 column 8: character U+0000 is not allowed in YAML (a control character)"),
        (b"kind: \x07\n", "document 1: not YAML: line 1 column 7: character U+0007 is not allowed in YAML (a control character)"),
        (b"a: 1\n---\nb: [\n", "document 2: not YAML: did not find expected node content at line 4 column 1"),
    ];
    for (text, want) in cases {
        let (status, out, _) = check_text(text);
        assert_eq!(status, Some(1), "{out}");
        let errors: Vec<&str> = out.lines().filter(|l| l.contains("not YAML")).collect();
        assert_eq!(errors.len(), 1, "{out}");
        assert!(errors[0].starts_with(want), "{out}");
    }
    // A byte order mark starting the file or a document is skipped, as
    // kubectl does.
    let (status, out, _) = check_text(
        b"\xef\xbb\xbfapiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata: {name: a}\nspec: {}\n",
    );
    assert_eq!(status, Some(0), "{out}");
}

/// #24 §5: an empty file is an error, not "0 policies checked".
#[test]
fn an_empty_file_is_an_error() {
    for text in ["", "# only a comment\n", "---\n---\n"] {
        let (status, out, _) = check_text(text.as_bytes());
        assert_eq!(status, Some(1), "{text:?}: {out}");
        assert!(
            out.starts_with("error: no policy in it (the input is empty, or holds only comments and document markers)\n"),
            "{text:?}: {out}"
        );
    }
}

const HEAD: &str =
    "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata: {name: p}\n";

/// #24 §5: inputs that were super-linear are refused at once by a bound,
/// with a message naming it (100k-deep nesting took over 60 s, 32k
/// behaviors 39 s).
#[test]
fn deep_nesting_and_32k_behaviors_are_refused_by_a_bound_at_once() {
    let deep = format!(
        "{HEAD}spec: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let (status, out, took) = check_text(deep.as_bytes());
    println!("100k-deep nesting: {took:?}: {out}");
    assert_eq!(status, Some(1), "{out}");
    assert!(
        out.contains("document 1: not YAML: recursion limit exceeded at line 4 column "),
        "{out}"
    );
    let mut many = format!("{HEAD}spec:\n  behaviors:\n");
    for i in 0..32_768 {
        many.push_str(&format!("  - exec: {{deny: {{values: [/bin/x{i}]}}}}\n"));
    }
    let (status, out, took) = check_text(many.as_bytes());
    println!("32k behaviors: {took:?}: {out}");
    assert_eq!(status, Some(1), "{out}");
    assert!(
        out.contains("    spec.behaviors: Too many: 32768: must have at most 64 items\n"),
        "{out}"
    );
    assert!(
        out.contains("  not compiled: the errors above come first\n"),
        "{out}"
    );
}

/// #24 §5: errors name the field path, never a parser's internals
/// (`spec.mode: 3` said "expected a Value::Tagged enum").
#[test]
fn a_wrong_type_is_named_by_its_field_path() {
    let (status, out, _) = check_text(
        format!("{HEAD}spec: {{mode: 3, behaviors: [{{exec: {{deny: {{values: [1]}}}}}}]}}\n")
            .as_bytes(),
    );
    assert_eq!(status, Some(1), "{out}");
    assert!(out.contains(r#"spec.mode: Invalid value: "integer": spec.mode in body must be of type string: "integer""#), "{out}");
    assert!(
        out.contains(r#"spec.behaviors[0].exec.deny.values[0]: Invalid value: "integer""#),
        "{out}"
    );
    assert!(!out.contains("Value::"), "{out}");
}

/// #24 §2: what admission refuses, `policy check` refuses with the API
/// server's field paths; where the compiler has more to say, both show.
#[test]
fn admission_refusals_and_compiler_errors_both_show() {
    let (status, out, _) = check_text(
        format!(
            "{HEAD}spec:\n  podSelecter: {{}}\n  mode: enforce\n  evaluationInterval: 0s\n  behaviors:\n  - exec: {{deny: {{expression: '1 + 2'}}}}\n"
        )
        .as_bytes(),
    );
    println!("{out}");
    assert_eq!(status, Some(1), "{out}");
    assert!(
        out.contains("  refused by the API server (kubectl apply would fail):\n"),
        "{out}"
    );
    assert!(
        out.contains(r#"    unknown field "spec.podSelecter""#),
        "{out}"
    );
    assert!(
        out.contains(
            "    spec: Invalid value: an enforce-mode policy must state the pods it applies to"
        ),
        "{out}"
    );
    assert!(out.contains(r#"    spec.evaluationInterval: Invalid value: "0s": evaluationInterval must be a duration of at least 1s"#), "{out}");
    assert!(
        out.contains("  error: spec.behaviors[0].exec.deny.expression: expression has type int"),
        "{out}"
    );
}

/// An enforce policy whose namespaces include kube-system is told that it
/// does not enforce there (the chart's protection, docs/threat-model.md);
/// still accepted. A monitor policy, or one selecting other namespaces,
/// is not.
#[test]
fn an_enforce_policy_selecting_kube_system_is_warned_of_protection() {
    let dir = tempfile::tempdir().unwrap();
    let policy = |name: &str, mode: &str, namespaces: &str| {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {name}\nspec:\n  mode: {mode}\n  podSelector: {{matchLabels: {{app: web}}}}\n{namespaces}  behaviors:\n  - exec: {{deny: {{values: [/bin/sh]}}}}\n"
            ),
        )
        .unwrap();
        file
    };
    let warning = "warning: spec.namespaceSelector: selects kube-system";
    let (ok, out) = check(&[&policy("everywhere", "enforce", "")]);
    assert!(ok, "{out}");
    assert!(out.contains(warning), "{out}");
    for file in [
        policy("watching", "monitor", ""),
        policy(
            "shop",
            "enforce",
            "  namespaceSelector: {matchLabels: {team: shop}}\n",
        ),
    ] {
        let (ok, out) = check(&[&file]);
        assert!(ok, "{out}");
        assert!(!out.contains(warning), "{out}");
    }
}
