//! Tier 3: the daemon binary against the real local API server (ci/kube-up).
//!
//! It runs on the host, where open/exec enforcement is refused by the
//! kernel (MACHINE.md), so these tests are about the daemon's wiring:
//! watches, status shards, shutdown, cgroup resolution reporting. The
//! kernel side is proven in the VM tier.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

fn policy(name: &str, app: &str) -> String {
    format!(
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {name}\nspec:\n  mode: enforce\n  podSelector: {{matchLabels: {{app: {app}}}}}\n  behaviors:\n  - exec: {{deny: {{values: [\"/usr/bin/curl\"]}}}}\n  - network: {{deny: {{values: [\"10.0.0.0/8\"]}}}}\n"
    )
}

fn shard<'a>(rp: &'a serde_json::Value, node: &str) -> Option<&'a serde_json::Value> {
    rp["status"]["nodes"]
        .as_array()?
        .iter()
        .find(|s| s["nodeName"] == node)
}

/// SIGTERM while policies are still arriving: the daemon writes its final
/// status shards and exits 0 within 10 s. The status interval is an hour,
/// so every shard found afterwards was written by the final flush.
#[test]
fn sigterm_during_load_flushes_status_and_exits_within_10s() {
    let cluster = cluster();
    let node = "sigterm-node";
    let names: Vec<String> = (0..40).map(|i| format!("sigterm-{i:02}")).collect();
    for name in &names[..20] {
        apply(cluster, &policy(name, "web"));
    }
    let dir = tempdir();
    let pins = dir.path().join("pins");
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1h",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    // Load: the other half lands while the daemon is shutting down.
    let (tx, rx) = std::sync::mpsc::channel();
    let more = names[20..].to_vec();
    let applier = std::thread::spawn(move || {
        for (i, name) in more.iter().enumerate() {
            apply(cluster, &policy(name, "web"));
            if i == 4 {
                tx.send(()).unwrap();
            }
        }
    });
    rx.recv().unwrap();
    let (status, took, log) = daemon.terminate(Duration::from_secs(15));
    applier.join().unwrap();
    println!("exit {status} after {took:?}");
    assert!(
        status.success(),
        "exit status {status}:\n{}",
        log.join("\n")
    );
    assert!(took < Duration::from_secs(10), "took {took:?} to stop");
    for name in &names[..20] {
        let rp = get_json(cluster, &["rpol", name]).unwrap();
        let s = shard(&rp, node)
            .unwrap_or_else(|| panic!("{name}: no shard for {node} after shutdown: {rp}"));
        assert_eq!(s["enforcementAvailable"], false, "{name}: {s}");
        assert!(s["message"].as_str().unwrap().contains("exec:"), "{s}");
    }
    for name in &names {
        cluster
            .kubectl_ok(&["delete", "rpol", name, "--wait=false"])
            .unwrap();
    }
}

/// A Running pod whose container cgroup cannot be found is reported: in
/// the shard of every policy selecting it (count and name) and in the
/// pods_unresolved metric. Found again once its status changes to a
/// container that exists.
#[test]
fn an_unresolvable_container_is_reported_in_the_shard_and_the_metric() {
    let cluster = cluster();
    let node = "unresolved-node";
    let ns = "unresolved-ns";
    namespace(cluster, ns, "team: a");
    apply(cluster, &policy("unresolved-policy", "lost"));
    let dir = tempdir();
    let cgroot = dir.path().join("cgroup");
    std::fs::create_dir_all(cgroot.join("kubepods")).unwrap();
    // Marks the directory as a cgroup v2 root, which is what gives
    // containers a cgroup id.
    std::fs::write(cgroot.join("cgroup.controllers"), "cpu memory\n").unwrap();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "127.0.0.1:19391",
            "--status-interval",
            "1s",
            "--pin-dir",
            dir.path().join("pins").to_str().unwrap(),
            "--cgroup-root",
            cgroot.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let uid = running_pod(
        cluster,
        ns,
        "lost-pod",
        node,
        "app: lost",
        &format!("containerd://{id}"),
    );
    let s = wait_for(
        "the unresolved pod in the shard",
        Duration::from_secs(20),
        || {
            let rp = get_json(cluster, &["rpol", "unresolved-policy"])?;
            let s = shard(&rp, node)?.clone();
            (s["unresolvedPodCount"] == 1).then_some(s)
        },
    );
    println!("shard: {s}");
    assert_eq!(s["unresolvedPods"][0]["pod"], format!("{ns}/lost-pod"));
    assert_eq!(s["unresolvedPods"][0]["containers"], 1);
    assert_eq!(s["podsMatched"], true);
    let metric = wait_for("pods_unresolved 1", Duration::from_secs(10), || {
        let body = http_get("127.0.0.1:19391", "/metrics")?;
        body.lines()
            .find(|l| l.starts_with("nirmata_runtime_pods_unresolved "))
            .filter(|l| l.ends_with(" 1"))
            .map(str::to_string)
    });
    println!("{metric}");
    // The kubelet reports the container's cgroup now exists: resolved.
    let pod_dir = cgroot.join(format!("kubepods/besteffort/pod{uid}/{id}"));
    std::fs::create_dir_all(&pod_dir).unwrap();
    cluster
        .kubectl_ok(&["label", "pod", "lost-pod", "-n", ns, "touched=yes"])
        .unwrap();
    wait_for("the pod resolved", Duration::from_secs(20), || {
        let rp = get_json(cluster, &["rpol", "unresolved-policy"])?;
        let s = shard(&rp, node)?;
        s.get("unresolvedPodCount").is_none().then_some(())
    });
    wait_for("pods_unresolved 0", Duration::from_secs(10), || {
        let body = http_get("127.0.0.1:19391", "/metrics")?;
        body.lines()
            .any(|l| l == "nirmata_runtime_pods_unresolved 0")
            .then_some(())
    });
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "ns", ns, "--wait=false"])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "rpol", "unresolved-policy"])
        .unwrap();
}

/// A minimal HTTP/1.0 GET over loopback (no client crate for one request).
fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// A component that fails is fatal: with its metrics port taken, the
/// daemon stops every task and exits non-zero, naming the failure, rather
/// than running without the endpoint its liveness probe needs.
#[test]
fn a_failing_component_shuts_the_daemon_down() {
    let cluster = cluster();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempdir();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            &addr,
            "--pin-dir",
            dir.path().join("pins").to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", "fatal-node"),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    let status = daemon.wait_exit(Duration::from_secs(30));
    let log = daemon.log().join("\n");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("a daemon task failed") && log.contains(&addr),
        "{log}"
    );
    println!(
        "{}",
        daemon
            .log()
            .iter()
            .find(|l| l.contains("a daemon task failed"))
            .unwrap()
    );
}

/// Waits for a log line after the first `skip` lines that contains every
/// needle, and returns it.
fn wait_line(daemon: &mut Daemon, skip: usize, needles: &[&str], timeout: Duration) -> String {
    wait_for(&format!("a log line with {needles:?}"), timeout, || {
        daemon
            .log()
            .into_iter()
            .skip(skip)
            .find(|l| needles.iter().all(|n| l.contains(n)))
    })
}

/// `resource.get` against the API server (a ConfigMap) and `http.get`
/// against a loopback server, fetched before each evaluation: a change to
/// either changes the policy's evaluated lists at the next
/// `evaluationInterval`, without a spec change (the engine logs the lists
/// whenever data changes them); a failed fetch is an evaluation error
/// naming the field, and the last good lists stay. That the kernel follows
/// is `daemon_host_egress.rs`'s data-source test.
#[test]
fn data_sources_change_the_lists_at_the_next_evaluation_interval() {
    let cluster = cluster();
    let node = "data-node";
    namespace(cluster, "policy-data", "purpose: data");
    let configmap = |hosts: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: egress-deny\n  namespace: policy-data\ndata:\n  hosts: \"{hosts}\"\n"
        )
    };
    apply(cluster, &configmap("blocked-a.example"));
    let server = ListServer::start(r#"{"paths": ["/usr/bin/tool-a"]}"#);
    let url = format!("http://{}/paths", server.addr);
    apply(
        cluster,
        &format!(
            r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: data-driven
spec:
  mode: monitor
  evaluationInterval: 2s
  behaviors:
  - network:
      deny:
        values: ["10.0.0.0/8"]
        expression: "resource.get('v1', 'configmaps', 'policy-data', 'egress-deny').data.hosts.split(',')"
  - exec:
      deny:
        expression: "http.get('{url}').body.paths.map(p, string(p))"
"#
        ),
    );
    let dir = tempdir();
    let mut daemon = Daemon::start(
        &[
            // The data source is a loopback server (internal: refused unless allowed).
            "--data-http-allow",
            "127.0.0.0/8",
            // The lists are read from the log: shown (hidden by default).
            "--show-data-values",
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            dir.path().join("pins").to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    // First evaluation: the lists come from the ConfigMap and the server.
    let first = wait_line(
        &mut daemon,
        0,
        &[
            "policy=data-driven",
            "its lists changed",
            "blocked-a.example",
            "/usr/bin/tool-a",
        ],
        Duration::from_secs(30),
    );
    println!("{first}");
    assert!(
        first.contains("deny [10.0.0.0/8, blocked-a.example]"),
        "{first}"
    );

    // Change both sources; no spec change: the next interval picks it up.
    let mark = daemon.log().len();
    let changed_at = std::time::Instant::now();
    apply(cluster, &configmap("blocked-b.example,blocked-c.example"));
    server.serve(r#"{"paths": ["/usr/bin/tool-b"]}"#);
    let second = wait_line(
        &mut daemon,
        mark,
        &[
            "policy=data-driven",
            "its lists changed",
            "blocked-b.example",
            "/usr/bin/tool-b",
        ],
        Duration::from_secs(15),
    );
    println!("after {:?}: {second}", changed_at.elapsed());
    assert!(
        second.contains("deny [10.0.0.0/8, blocked-b.example, blocked-c.example]"),
        "{second}"
    );
    assert!(!second.contains("blocked-a.example"), "{second}");

    // A failing source: an evaluation error naming the field and the call,
    // and the last good lists stay (no new lists).
    let mark = daemon.log().len();
    server.fail();
    let failed = wait_line(
        &mut daemon,
        mark,
        &[
            "policy evaluation failed",
            "spec.behaviors[1].exec.deny.expression: http.get(",
            "failed: request failed",
        ],
        Duration::from_secs(15),
    );
    println!("{failed}");
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<String> = daemon.log().into_iter().skip(mark).collect();
    assert!(
        !after
            .iter()
            .any(|l| l.contains("policy=data-driven") && l.contains("its lists changed")),
        "the lists changed while a source was failing:\n{}",
        after.join("\n")
    );

    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "rpol", "data-driven"])
        .unwrap();
    cluster
        .kubectl_ok(&["delete", "ns", "policy-data", "--wait=false"])
        .unwrap();
}

/// TargetsValid, ExecRulesValid and OpenRulesValid in the policy's status,
/// as the daemon writes them: False naming the values no backend can
/// program (here from expressions, which admission cannot check), True for
/// a behavior whose values all parse. This host cannot load the open/exec
/// programs, and still gives the answer a node that can would give: every
/// node writes these conditions verbatim, so they must not depend on the
/// node.
#[test]
fn the_spec_conditions_name_rejected_values_on_every_node() {
    let cluster = cluster();
    let node = "spec-conditions-node";
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: spec-conditions\nspec:\n  mode: enforce\n  podSelector: {matchLabels: {app: spec}}\n  behaviors:\n  - network: {deny: {expression: \"['10.0.0.300', '10.0.0.1']\"}}\n  - exec: {deny: {expression: \"['bin/sh', '/bin/sh']\"}}\n  - open: {deny: {values: [\"/etc/shadow\"]}}\n",
    );
    let dir = tempdir();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            dir.path().join("pins").to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    let conditions = wait_for(
        "the spec-level conditions in status",
        Duration::from_secs(20),
        || {
            let rp = get_json(cluster, &["rpol", "spec-conditions"])?;
            shard(&rp, node)?;
            let conditions = rp["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .any(|c| c["type"] == "ExecRulesValid")
                .then_some(conditions)
        },
    );
    let find = |type_: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
    };
    let targets = find("TargetsValid");
    println!("TargetsValid: {} {}", targets["status"], targets["message"]);
    assert_eq!(targets["status"], "False");
    assert_eq!(targets["reason"], "ValuesRejected");
    assert!(
        targets["message"].as_str().is_some_and(
            |m| m.contains("spec.behaviors[0].network.deny") && m.contains("10.0.0.300")
        ),
        "{targets}"
    );
    let exec = find("ExecRulesValid");
    println!("ExecRulesValid: {} {}", exec["status"], exec["message"]);
    assert_eq!(exec["status"], "False");
    assert!(
        exec["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.behaviors[1].exec.deny") && m.contains("bin/sh")),
        "{exec}"
    );
    let open = find("OpenRulesValid");
    assert_eq!(
        (&open["status"], &open["reason"]),
        (&serde_json::json!("True"), &serde_json::json!("Valid"))
    );
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "rpol", "spec-conditions"])
        .unwrap();
}

/// A policy author cannot read through the daemon what it fetched (issue
/// 37, finding 3): a value computed from a ConfigMap that cannot be
/// programmed is named in the status by its field and reason but not
/// quoted, a CEL error over the data is summarised, and the lists log line
/// gives sizes; with `--show-data-values` the operator sees the value.
#[test]
fn fetched_data_is_not_quoted_into_status_errors_or_logs() {
    const SECRET: &str = "hunter2";
    let cluster = cluster();
    namespace(cluster, "policy-leak", "purpose: leak");
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leaky\n  namespace: policy-leak\ndata:\n  env: \"DB_PASSWORD={SECRET} x,10.9.0.0/16\"\n  n: \"{SECRET}\"\n"
        ),
    );
    let run = |extra: &[&str]| {
        // Fresh objects: no status of an earlier run.
        let _ = cluster.kubectl_output(&["delete", "rpol", "leaky", "leaky-error"]);
        // One policy whose computed value cannot be programmed, one whose
        // expression fails over the data.
        apply(
            cluster,
            r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: leaky
spec:
  mode: monitor
  evaluationInterval: 2s
  behaviors:
  - network:
      deny:
        values: ["10.8.0.0/16"]
        expression: "resource.get('v1', 'configmaps', 'policy-leak', 'leaky').data.env.split(',')"
"#,
        );
        apply(
            cluster,
            r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: leaky-error
spec:
  mode: monitor
  evaluationInterval: 2s
  behaviors:
  - exec:
      deny:
        expression: "[string(int(resource.get('v1', 'configmaps', 'policy-leak', 'leaky').data.n))]"
"#,
        );
        let dir = tempdir();
        let pins = dir.path().join("pins");
        let mut args = vec![
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            pins.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut daemon = Daemon::start(
            &args,
            &[
                ("NODE_NAME", "leak-node"),
                ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
            ],
        );
        let status = wait_for(
            "the refused value and the error in the status",
            Duration::from_secs(30),
            || {
                let values = get_json(cluster, &["rpol", "leaky"])?["status"].to_string();
                let error = get_json(cluster, &["rpol", "leaky-error"])?["status"].to_string();
                (values.contains("spec.behaviors[0].network.deny")
                    && error.contains("spec.behaviors[0].exec.deny.expression"))
                .then(|| format!("{values}\n{error}"))
            },
        );
        // The lists line comes with the first evaluation.
        let lists = wait_line(
            &mut daemon,
            0,
            &["policy=leaky", "its lists changed"],
            Duration::from_secs(15),
        );
        let (s, _, log) = daemon.terminate(Duration::from_secs(15));
        assert!(s.success(), "{}", log.join("\n"));
        (status, lists, log.join("\n"))
    };

    let (status, lists, log) = run(&[]);
    println!("hidden: lists line {lists}");
    assert!(
        !status.contains(SECRET),
        "the status quotes fetched data: {status}"
    );
    assert!(!log.contains(SECRET), "the log quotes fetched data");
    assert!(
        status.contains("<a value computed from fetched data>"),
        "{status}"
    );
    assert!(
        status.contains("the expression failed over fetched data"),
        "{status}"
    );
    assert!(lists.contains("deny 3 value(s)"), "{lists}");

    let (status, _, _) = run(&["--show-data-values"]);
    assert!(status.contains(SECRET), "opted in: {status}");
    cluster
        .kubectl_ok(&["delete", "rpol", "leaky", "leaky-error"])
        .unwrap();
}

/// The status writes the API server has served for RuntimePolicies
/// (`PUT`/`PATCH .../status`), from its own `apiserver_request_total`.
fn status_writes(cluster: &kyverno_runtime_testkube::LocalCluster) -> u64 {
    let metrics = cluster.kubectl_ok(&["get", "--raw", "/metrics"]).unwrap();
    ["verb=\"PUT\"", "verb=\"PATCH\""]
        .iter()
        .map(|verb| {
            series_sum(
                &metrics,
                &[
                    "apiserver_request_total{",
                    "resource=\"runtimepolicies\"",
                    "subresource=\"status\"",
                    verb,
                ],
            )
        })
        .sum()
}

/// Issue 38, point 2: a daemon whose policies and pods do not change
/// writes no status, flush after flush, by the API server's request
/// counts (it rewrote every policy every interval: its evaluation time
/// kept nanoseconds the stored copy does not). Its shard names the
/// generation it applied, and the conditions the generation they were
/// decided for.
#[test]
fn an_idle_daemon_writes_no_status() {
    let cluster = cluster();
    let node = "idle-status-node";
    let _ = cluster.kubectl_output(&["delete", "rpol", "idle-status", "--ignore-not-found"]);
    apply(cluster, &policy("idle-status", "idle"));
    let dir = tempdir();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            dir.path().join("pins").to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    let rp = wait_for("the daemon's shard", Duration::from_secs(20), || {
        let rp = get_json(cluster, &["rpol", "idle-status"])?;
        shard(&rp, node)?;
        Some(rp)
    });
    let own = shard(&rp, node).unwrap();
    assert_eq!(own["observedGeneration"], 1, "{own}");
    // A few flushes to settle what the first one left.
    std::thread::sleep(Duration::from_secs(3));
    let rp = get_json(cluster, &["rpol", "idle-status"]).unwrap();
    for c in rp["status"]["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], 1, "{c}");
    }
    let before = status_writes(cluster);
    std::thread::sleep(Duration::from_secs(6));
    let after = status_writes(cluster);
    println!(
        "an idle daemon flushing every 1 s for 6 s: {} status write(s) served by the API server",
        after - before
    );
    assert_eq!(after - before, 0, "an idle daemon wrote status");
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "rpol", "idle-status"])
        .unwrap();
}
