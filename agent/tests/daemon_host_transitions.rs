//! Tier 2+3: the daemon's state transitions on the host's kernel, with a
//! real pod cgroup and the real API server (#36): what the kernel holds
//! across a restart while a policy's data source is slow or down, and
//! across edits that fail to evaluate or compile. Each step is read back
//! from the kernel by traffic from the pod's cgroup, probed continuously
//! where the claim is "never a gap".
//!
//! Needs root (a cgroup v2 directory, a bpffs mount, cgroup_skb programs)
//! and `--features kube-tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::host::HostPod;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Tries a TCP connection from inside `cgroup`; true if it connected.
/// Loopback answers in microseconds, so half a second tells a dropped SYN
/// from a delivered one.
fn connects_from(cgroup: &Path, addr: &str) -> bool {
    common::host::connects_within(cgroup, addr, "0.5")
}

/// Probes `addr` from `cgroup` until `until` returns true (checked between
/// probes, at least once after `at_least`), asserting every probe was
/// refused; returns how many there were.
fn refused_throughout(
    what: &str,
    cgroup: &Path,
    addr: &str,
    at_least: Duration,
    mut until: impl FnMut() -> bool,
) -> usize {
    let start = Instant::now();
    let mut probes = 0;
    loop {
        assert!(
            !connects_from(cgroup, addr),
            "{what}: {addr} delivered after {:?} ({probes} probes refused before)",
            start.elapsed()
        );
        probes += 1;
        if start.elapsed() >= at_least && until() {
            return probes;
        }
        assert!(
            start.elapsed() < at_least + Duration::from_secs(60),
            "{what}: still waiting after {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_restart_keeps_a_data_driven_policys_pins_while_its_source_is_slow_or_down() {
    const NODE: &str = "host-restart-data-node";
    const NS: &str = "host-restart-data";
    const POLICY: &str = "host-restart-data";
    let cluster = cluster();
    let dir = tempdir();
    let listeners: Vec<std::net::TcpListener> = (7..=8)
        .map(|i| std::net::TcpListener::bind(format!("127.0.0.{i}:0")).unwrap())
        .collect();
    let addr = |i: usize| listeners[i - 7].local_addr().unwrap().to_string();
    namespace(cluster, NS, "team: restart-data");
    let server = ListServer::start(r#"{"cidrs": ["127.0.0.7/32"]}"#);
    apply(
        cluster,
        &format!(
            r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: {POLICY}
spec:
  mode: enforce
  evaluationInterval: 2s
  podSelector: {{matchLabels: {{app: {POLICY}}}}}
  behaviors:
  - network:
      deny:
        expression: "http.get('http://{}/cidrs').body.cidrs.map(c, string(c))"
"#,
            server.addr
        ),
    );
    force_delete_pod(cluster, NS, "restart-web");
    let id = "5a".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "restart-web",
        NODE,
        &format!("app: {POLICY}"),
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;

    let mut daemon = host_daemon(cluster, NODE, &pod, "");
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    wait_for(
        "the server's 127.0.0.7 refused",
        Duration::from_secs(30),
        || {
            (!connects_from(container, &addr(7)) && connects_from(container, &addr(8)))
                .then_some(())
        },
    );
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    assert!(
        !connects_from(container, &addr(7)),
        "pinned while no daemon runs"
    );

    // Down: every fetch fails, so the new daemon cannot evaluate the
    // policy. Its pins must outlive the reconcile, and several intervals.
    server.fail();
    let daemon = host_daemon(cluster, NODE, &pod, "");
    let mut listed = false;
    let probes = refused_throughout(
        "the source down across a restart",
        container,
        &addr(7),
        Duration::from_secs(10),
        || {
            listed = listed
                || daemon
                    .log()
                    .iter()
                    .any(|l| l.contains("pods on this node listed"));
            listed
        },
    );
    let log = daemon.log();
    assert!(
        log.iter()
            .any(|l| l.contains("policies not evaluated yet keep what a previous daemon pinned")),
        "{}",
        log.join("\n")
    );
    let s = wait_for("the shard to say why", Duration::from_secs(20), || {
        let s = shard(cluster, POLICY, NODE)?;
        s["message"]
            .as_str()?
            .contains("evaluation failed")
            .then_some(s)
    });
    println!("source down: 127.0.0.7 refused on all {probes} probes over 10 s after the restart; shard: {s}");

    // Back, with other data: the evaluation replaces what was adopted.
    server.serve(r#"{"cidrs": ["127.0.0.8/32"]}"#);
    wait_for("the new data in force", Duration::from_secs(30), || {
        (connects_from(container, &addr(7)) && !connects_from(container, &addr(8))).then_some(())
    });
    println!("source back with 127.0.0.8/32: .7 delivered, .8 refused");
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());

    // Slow: each answer takes 6 s (the fetch allows 10), so the first
    // evaluation after the restart lands well after the reconcile.
    server.delay(Duration::from_secs(6));
    let restarted = Instant::now();
    let daemon = host_daemon(cluster, NODE, &pod, "");
    let probes = refused_throughout(
        "the source slow across a restart",
        container,
        &addr(8),
        Duration::from_secs(4),
        || {
            daemon
                .log()
                .iter()
                .any(|l| l.contains("data sources fetched"))
        },
    );
    println!(
        "source slow: 127.0.0.8 refused on all {probes} probes until the data arrived {:?} after the restart",
        restarted.elapsed()
    );
    assert!(!connects_from(container, &addr(8)));
    assert!(connects_from(container, &addr(7)));

    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster.kubectl_ok(&["delete", "rpol", POLICY]).unwrap();
    force_delete_pod(cluster, NS, "restart-web");
}

#[test]
fn a_failed_edit_takes_its_mode_and_keeps_the_last_good_lists_attributed() {
    const NODE: &str = "host-edit-node";
    const NS: &str = "host-edit";
    const POLICY: &str = "host-edit";
    let cluster = cluster();
    let dir = tempdir();
    let listener = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
    let denied = listener.local_addr().unwrap().to_string();
    namespace(cluster, NS, "team: edit");
    let manifest = |mode: &str, deny: &str| {
        format!(
            "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {POLICY}\nspec:\n  mode: {mode}\n  podSelector: {{matchLabels: {{app: {POLICY}}}}}\n  behaviors:\n  - network: {{deny: {deny}}}\n"
        )
    };
    apply(
        cluster,
        &manifest("enforce", "{values: [\"127.0.0.9/32\"]}"),
    );
    force_delete_pod(cluster, NS, "edit-web");
    let id = "5b".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "edit-web",
        NODE,
        &format!("app: {POLICY}"),
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;
    let metrics = free_loopback();
    let mut daemon = host_daemon(cluster, NODE, &pod, &metrics.to_string());
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    wait_for("127.0.0.9 refused", Duration::from_secs(30), || {
        (!connects_from(container, &denied)).then_some(())
    });
    let findings = |text: &str| {
        series_sum(
            text,
            &["findings_emitted_total", &format!("policy=\"{POLICY}\"")],
        )
    };
    let unattributed = |text: &str| {
        series_sum(
            text,
            &[
                "events_dropped_total",
                "reason=\"unattributed_kernel_deny\"",
            ],
        )
    };

    // An edit whose deny fails to evaluate, still enforce: the last good
    // list stays in force, and its refusals stay the policy's.
    apply(
        cluster,
        &manifest("enforce", "{expression: \"[string(int('x'))]\"}"),
    );
    let s = wait_for(
        "the shard to name what is in force",
        Duration::from_secs(20),
        || {
            let s = shard(cluster, POLICY, NODE)?;
            s["message"]
            .as_str()?
            .contains("the last good lists stay in force for spec.behaviors[0].network (generation 1)")
            .then_some(s)
        },
    );
    println!("failed evaluation, enforce: shard {s}");
    let before = scrape(metrics).unwrap();
    for _ in 0..3 {
        assert!(
            !connects_from(container, &denied),
            "the last good deny holds"
        );
    }
    let after = wait_for("the refusals attributed", Duration::from_secs(20), || {
        let text = scrape(metrics)?;
        (findings(&text) > findings(&before)).then_some(text)
    });
    assert_eq!(
        unattributed(&after),
        unattributed(&before),
        "no refusal left unexplained"
    );
    println!(
        "refusals by the last good list: findings {} -> {}, unattributed {} -> {}",
        findings(&before),
        findings(&after),
        unattributed(&before),
        unattributed(&after)
    );

    // The operator's lever: monitor, with the deny still failing. The
    // mode takes effect at once; the monitor judges by the last good list.
    apply(
        cluster,
        &manifest("monitor", "{expression: \"[string(int('y'))]\"}"),
    );
    wait_for(
        "127.0.0.9 delivered under monitor",
        Duration::from_secs(20),
        || connects_from(container, &denied).then_some(()),
    );
    let before = scrape(metrics).unwrap();
    assert!(connects_from(container, &denied));
    let after = wait_for("a would-deny finding", Duration::from_secs(20), || {
        let text = scrape(metrics)?;
        (findings(&text) > findings(&before)).then_some(text)
    });
    // The status writer batches: the shard follows the data plane within
    // its flush interval, not at once.
    let s = wait_for(
        "the shard to report monitor's observation",
        Duration::from_secs(20),
        || {
            let s = shard(cluster, POLICY, NODE)?;
            (!s["observationAvailable"].is_null()).then_some(s)
        },
    );
    assert_eq!(s["observationAvailable"], false, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap_or_default()
            .contains("(generation 1)"),
        "{s}"
    );
    println!(
        "failed evaluation, monitor: delivered; findings {} -> {}; shard {s}",
        findings(&before),
        findings(&after)
    );

    // A spec that does not compile (no admission webhook runs here to
    // refuse it): its mode still applies, enforce again, over the last
    // good list.
    apply(cluster, &manifest("enforce", "{expression: \"1 + 2\"}"));
    wait_for("127.0.0.9 refused again", Duration::from_secs(20), || {
        (!connects_from(container, &denied)).then_some(())
    });
    let s = wait_for("the shard to say so", Duration::from_secs(20), || {
        let s = shard(cluster, POLICY, NODE)?;
        (s["message"].as_str()?
            == "the spec did not compile; the last good lists stay in force for spec.behaviors[0].network (generation 1)")
            .then_some(s)
    });
    println!("a spec that does not compile, enforce: refused; shard {s}");
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster.kubectl_ok(&["delete", "rpol", POLICY]).unwrap();
    force_delete_pod(cluster, NS, "edit-web");
}
