//! Tier 2+3: the daemon on the host, with a real pod cgroup, against the
//! real API server: a network deny is enforced on loopback traffic and the
//! refusal reaches all three outputs — the pod's Report, a Kubernetes Event
//! and the reference collector over mutual TLS (`kyverno-runtime
//! collector`, certificates made by openssl in the test).
//!
//! Needs root (a cgroup v2 directory, a bpffs mount, cgroup_skb programs)
//! and `--features kube-tests`; the host's kernel refuses LSM programs, so
//! only network is enforced here (open/exec are proven in the VM tier).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::host::HostPod;
use common::pki::certificates;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const NODE: &str = "host-egress-node";
const NS: &str = "host-egress";

/// Tries a TCP connection from inside `cgroup`; true if it connected.
fn connects_from(cgroup: &Path, addr: &str) -> bool {
    common::host::connects_within(cgroup, addr, "2")
}

#[test]
fn a_network_deny_on_the_host_reaches_the_report_an_event_and_the_collector() {
    let cluster = cluster();
    let dir = tempdir();
    certificates(dir.path());

    // The collector, on a free port.
    let out_file = dir.path().join("findings.jsonl");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut collector = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["collector", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-ca")
        .arg(dir.path().join("ca.crt"))
        .arg("--tls-cert")
        .arg(dir.path().join("server.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("server.key"))
        .arg("--output")
        .arg(&out_file)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();

    // The pod: its object and status, its container cgroup (cgroupfs,
    // containerd) and a bpffs of the test's own for the pins.
    namespace(cluster, NS, "team: host");
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: host-deny-net\nspec:\n  mode: enforce\n  podSelector: {matchLabels: {app: host-web}}\n  behaviors:\n  - network: {deny: {values: [\"127.0.0.2/32\"]}}\n",
    );
    force_delete_pod(cluster, NS, "host-web");
    let id = "5e".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "host-web",
        NODE,
        "app: host-web",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;

    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed = open.local_addr().unwrap().to_string();
    assert!(
        connects_from(container, &target),
        "reachable before the daemon runs"
    );

    let ca = dir.path().join("ca.crt");
    let cert = dir.path().join("client.crt");
    let key = dir.path().join("client.key");
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--report-interval",
            "1s",
            "--events-enabled=true",
            "--pin-dir",
            pins.to_str().unwrap(),
            "--push-target",
            &format!("127.0.0.1:{port}"),
            "--push-tls-ca",
            ca.to_str().unwrap(),
            "--push-tls-cert",
            cert.to_str().unwrap(),
            "--push-tls-key",
            key.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    wait_for("the deny to take effect", Duration::from_secs(30), || {
        (!connects_from(container, &target)).then_some(())
    });
    assert!(
        connects_from(container, &allowed),
        "an address no policy denies"
    );
    println!(
        "{target} dropped from {}, {allowed} reachable",
        container.display()
    );

    let report = wait_for("the Report", Duration::from_secs(30), || {
        let r = get_json(cluster, &["report", "kyverno-runtime-host-web", "-n", NS])?;
        r["results"]
            .as_array()?
            .iter()
            .any(|x| {
                x["policy"] == "host-deny-net"
                    && x["properties"]["target"] == "127.0.0.2"
                    && x["properties"]["enforced"] == "true"
            })
            .then_some(r)
    });
    println!("report results: {}", report["results"]);
    let event = wait_for("the PolicyViolation Event", Duration::from_secs(30), || {
        let list = get_json(cluster, &["events.v1.events.k8s.io", "-n", NS])?;
        list["items"]
            .as_array()?
            .iter()
            .find(|e| e["reason"] == "PolicyViolation" && e["regarding"]["name"] == "host-web")
            .cloned()
    });
    println!("event: {}", event["note"]);
    let line = wait_for(
        "the finding at the collector",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&out_file).ok()?;
            text.lines()
                .find(|l| l.contains("host-deny-net") && l.contains("127.0.0.2"))
                .map(str::to_string)
        },
    );
    println!("collector: {line}");
    let (status, took, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    println!("daemon stopped in {took:?}");
    // The pins outlive the daemon: the destination stays dropped.
    assert!(
        !connects_from(container, &target),
        "dropped with no daemon running"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &collector.id().to_string()])
        .status();
    let _ = collector.wait();
    cluster
        .kubectl_ok(&["delete", "rpol", "host-deny-net"])
        .unwrap();
    force_delete_pod(cluster, NS, "host-web");
    drop(listener);
    drop(open);
}

/// Data sources all the way to the kernel: an enforce policy's network
/// deny list is a ConfigMap's (`resource.get`) plus a loopback server's
/// (`http.get`). The destinations they name are dropped from the pod's
/// cgroup; when both change, with no change to the policy, the next
/// `evaluationInterval` moves the drops to the new destinations.
#[test]
fn a_deny_list_from_a_configmap_and_an_http_server_follows_them_into_the_kernel() {
    const NODE: &str = "host-data-node";
    const NS: &str = "host-data";
    let cluster = cluster();
    let dir = tempdir();
    // Four destinations; the data names two of them at a time.
    let listeners: Vec<std::net::TcpListener> = (3..=6)
        .map(|i| std::net::TcpListener::bind(format!("127.0.0.{i}:0")).unwrap())
        .collect();
    let addr = |i: usize| listeners[i - 3].local_addr().unwrap().to_string();

    namespace(cluster, NS, "team: data");
    let configmap = |cidrs: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: deny-list\n  namespace: {NS}\ndata:\n  cidrs: \"{cidrs}\"\n")
    };
    apply(cluster, &configmap("127.0.0.3/32"));
    let server = ListServer::start(r#"{"cidrs": ["127.0.0.5/32"]}"#);
    apply(
        cluster,
        &format!(
            r#"apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: host-data-net
spec:
  mode: enforce
  evaluationInterval: 2s
  podSelector: {{matchLabels: {{app: host-data}}}}
  behaviors:
  - network:
      deny:
        expression: "resource.get('v1', 'configmaps', '{NS}', 'deny-list').data.cidrs.split(',') + http.get('http://{}/cidrs').body.cidrs.map(c, string(c))"
"#,
            server.addr
        ),
    );
    force_delete_pod(cluster, NS, "data-web");
    let id = "6d".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "data-web",
        NODE,
        "app: host-data",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;
    for i in 3..=6 {
        assert!(
            connects_from(container, &addr(i)),
            "{} reachable before the daemon runs",
            addr(i)
        );
    }

    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            // The data source is a loopback server (internal: refused unless allowed).
            "--data-http-allow",
            "127.0.0.0/8",
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    // What connects from the pod: true for each of .3, .4, .5, .6.
    let reachable = |container: &Path| -> Vec<bool> {
        (3..=6)
            .map(|i| connects_from(container, &addr(i)))
            .collect()
    };
    let first = wait_for(
        "the ConfigMap's and the server's destinations dropped",
        Duration::from_secs(30),
        || {
            let r = reachable(container);
            (r == [false, true, false, true]).then_some(r)
        },
    );
    println!("from the ConfigMap 127.0.0.3/32 and the server 127.0.0.5/32: reachable .3 .4 .5 .6 = {first:?}");

    // Both sources change; the policy does not.
    let changed = std::time::Instant::now();
    apply(cluster, &configmap("127.0.0.4/32"));
    server.serve(r#"{"cidrs": ["127.0.0.6/32"]}"#);
    let second = wait_for(
        "the drops to follow the data",
        Duration::from_secs(20),
        || {
            let r = reachable(container);
            (r == [true, false, true, false]).then_some(r)
        },
    );
    println!(
        "{:?} after the change, from the ConfigMap 127.0.0.4/32 and the server 127.0.0.6/32: reachable .3 .4 .5 .6 = {second:?}",
        changed.elapsed()
    );
    let s = shard(cluster, "host-data-net", NODE).unwrap();
    assert_eq!(s["podsMatched"], true, "{s}");
    println!("shard: {s}");

    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "rpol", "host-data-net"])
        .unwrap();
    force_delete_pod(cluster, NS, "data-web");
}

/// Sends one UDP datagram to each of `count` distinct loopback addresses
/// (127.1.0.0 upwards) from inside `cgroup`, as fast as perl can: each is
/// a new key of the egress observation map. Returns how long it took.
fn datagrams_to_distinct_addresses(cgroup: &Path, count: u32) -> Duration {
    let sender = format!(
        r#"use Socket; socket(my $s, PF_INET, SOCK_DGRAM, 0) or die "socket: $!";
for my $i (0 .. {last}) {{
  my $a = pack("C4", 127, 1 + ($i >> 16), ($i >> 8) & 255, $i & 255);
  send($s, "x", 0, pack_sockaddr_in(9, $a)) or die "send: $!";
}}"#,
        last = count - 1
    );
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec perl -e '{sender}'",
        cgroup.display()
    );
    let started = std::time::Instant::now();
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "sender: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed()
}

/// The kernel's observation losses reach /metrics: a monitored pod sends
/// one datagram to each of 40,000 destinations, far more than the egress
/// observation map's 16,384 keys hold between two drains. What went past
/// the pod's share of the map is `events_dropped_total{source=
/// "egress-observe",reason="over_share"}` (issue 37: so that it evicts no
/// other pod's counts), what the LRU map still evicted (keys made while a
/// drain ran) `reason="evicted"`, and with what the drains read they
/// account for every datagram exactly: nothing lost silently, nothing
/// counted twice.
#[test]
fn an_overflowing_observation_map_is_counted_in_metrics() {
    const NODE: &str = "host-lost-node";
    const NS: &str = "host-lost";
    const SENT: u32 = 40_000;
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, NS, "team: lost");
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: host-lost-net\nspec:\n  mode: monitor\n  podSelector: {matchLabels: {app: host-lost}}\n  behaviors:\n  - network: {deny: {values: [\"10.255.255.255/32\"]}}\n",
    );
    force_delete_pod(cluster, NS, "lost-web");
    let id = "7e".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "lost-web",
        NODE,
        "app: host-lost",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let metrics = free_loopback();
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            &metrics.to_string(),
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--reports-enabled=false",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    let ingested = |text: &str| {
        series_sum(
            text,
            &["events_ingested_total", "source=\"egress-observe\""],
        )
    };
    let over_share = |text: &str| {
        series_sum(
            text,
            &[
                "events_dropped_total",
                "source=\"egress-observe\"",
                "reason=\"over_share\"",
            ],
        )
    };
    // Not counted, either way.
    let evicted = |text: &str| {
        series_sum(
            text,
            &[
                "events_dropped_total",
                "source=\"egress-observe\"",
                "reason=\"evicted\"",
            ],
        ) + over_share(text)
    };
    // The pod is observed once a datagram of its shows up.
    let before = wait_for("the pod observed", Duration::from_secs(30), || {
        datagrams_to_distinct_addresses(&pod.container, 1);
        std::thread::sleep(Duration::from_millis(1500));
        let text = scrape(metrics)?;
        (ingested(&text) > 0).then_some(text)
    });
    let (ingested_before, evicted_before) = (ingested(&before), evicted(&before));
    assert_eq!(evicted_before, 0, "nothing evicted yet");

    let took = datagrams_to_distinct_addresses(&pod.container, SENT);
    let after = wait_for(
        "every datagram read or counted as evicted",
        Duration::from_secs(30),
        || {
            let text = scrape(metrics)?;
            let accounted = ingested(&text) - ingested_before + evicted(&text) - evicted_before;
            (accounted >= u64::from(SENT)).then_some(text)
        },
    );
    // A further drain changes nothing: no late overcount.
    std::thread::sleep(Duration::from_millis(2500));
    let last = scrape(metrics).unwrap();
    let read = ingested(&last) - ingested_before;
    let lost = evicted(&last) - evicted_before;
    let past_share = over_share(&last) - over_share(&before);
    println!(
        "{SENT} datagrams to distinct destinations in {took:?}: {read} read by the drains, {lost} not counted: {past_share} past the pod's share of the 16384-key map (reason=\"over_share\"), {} evicted (reason=\"evicted\")",
        lost - past_share
    );
    assert_eq!(ingested(&after), ingested(&last));
    assert_eq!(read + lost, u64::from(SENT), "each datagram exactly once");
    assert!(
        past_share > 0,
        "the pod went past its share, and that was counted"
    );
    for line in last.lines().filter(|l| l.contains("egress-observe")) {
        println!("{line}");
    }

    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster
        .kubectl_ok(&["delete", "rpol", "host-lost-net"])
        .unwrap();
    force_delete_pod(cluster, NS, "lost-web");
}

/// The uninstall path (#24 §1): once its DaemonSet is deleted, the daemon's
/// shutdown removes its own pins with `cleanup`'s code, and keeps, logs
/// and names a foreign pin left in its directory; the pin directory holds
/// nothing of the daemon's afterwards.
#[test]
fn an_uninstall_removes_only_the_daemons_pins_and_logs_what_it_kept() {
    const UNINSTALL_NS: &str = "host-uninstall";
    const DS: &str = "krt-uninstall";
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, UNINSTALL_NS, "team: host");
    // Its own DaemonSet, which the daemon watches (no controller runs it).
    apply(
        cluster,
        &format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: {DS}\n  namespace: {UNINSTALL_NS}\nspec:\n  selector: {{matchLabels: {{app: {DS}}}}}\n  template:\n    metadata: {{labels: {{app: {DS}}}}}\n    spec: {{containers: [{{name: daemon, image: kyverno-runtime}}]}}\n"
        ),
    );
    let pod = HostPod::new(dir.path(), "uid-uninstall", &"7a".repeat(32));
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &["--metrics-addr", "", "--pin-dir", pins.to_str().unwrap()],
        &[
            ("NODE_NAME", "host-uninstall-node"),
            ("POD_NAMESPACE", UNINSTALL_NS),
            ("DAEMONSET_NAME", DS),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(60));
    let maps = pins.join("egress/maps");
    assert!(
        maps.join("egress_meta").exists(),
        "the egress maps are pinned"
    );
    // Another tool's map among the daemon's.
    let foreign = maps.join("other_tool");
    kyverno_runtime_bpf::pins::testing::pin_map(&foreign, "other_tool").unwrap();
    cluster
        .kubectl_ok(&["delete", "daemonset", "-n", UNINSTALL_NS, DS])
        .unwrap();
    daemon.wait_log(
        "the daemon's DaemonSet was deleted",
        Duration::from_secs(30),
    );
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    let kept = log
        .iter()
        .find(|l| l.contains("uninstall: kept an entry of the pin directory"))
        .unwrap_or_else(|| panic!("nothing kept is logged:\n{}", log.join("\n")));
    assert!(
        kept.contains(&foreign.display().to_string())
            && kept.contains("not part of kyverno-runtime's pin layout"),
        "{kept}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("removed the daemon's pins, kept the rest")),
        "{}",
        log.join("\n")
    );
    // What is left: the foreign map and the directories holding it.
    let mut left = Vec::new();
    let mut stack = vec![pins.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            left.push(path.strip_prefix(&pins).unwrap().display().to_string());
        }
    }
    left.sort();
    assert_eq!(left, ["egress", "egress/maps", "egress/maps/other_tool"]);
}

/// Issue 25, point 1: a backend the kernel can serve but whose load failed
/// is retried. The pin directory's parent is a plain directory of the
/// test's when the daemon starts (the claim refuses it: not a bpffs), so
/// network enforcement is unavailable and the shard and /metrics say why;
/// once the test mounts a bpffs there, the next retry loads the egress
/// filter, the deny is programmed into it and the pod's cgroup bound, and
/// a denied connect from that cgroup is dropped, with the daemon running
/// throughout.
#[test]
fn a_network_backend_that_failed_to_load_is_retried_until_it_loads() {
    const NODE: &str = "host-retry-node";
    const NS: &str = "host-retry";
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, NS, "team: retry");
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: host-retry-net\nspec:\n  mode: enforce\n  podSelector: {matchLabels: {app: host-retry}}\n  behaviors:\n  - network: {deny: {values: [\"127.0.0.9/32\"]}}\n",
    );
    force_delete_pod(cluster, NS, "host-retry");
    let id = "7a".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "host-retry",
        NODE,
        "app: host-retry",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::unmounted(dir.path(), &uid, &id);
    let container = &pod.container;
    let listener = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    assert!(connects_from(container, &target), "reachable at first");

    let metrics = free_loopback();
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            &metrics.to_string(),
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    let message = wait_for("the shard saying why", Duration::from_secs(30), || {
        let s = shard(cluster, "host-retry-net", NODE)?;
        (s["enforcementAvailable"] == false).then(|| s["message"].as_str().unwrap_or("").to_owned())
    });
    println!("before: {message}");
    let network = wait_for(
        "the backends entry saying why",
        Duration::from_secs(10),
        || {
            let s = shard(cluster, "host-retry-net", NODE)?;
            s["backends"]
                .as_array()?
                .iter()
                .find(|b| b["behavior"] == "network")
                .cloned()
        },
    );
    assert!(
        network["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("load failed (retrying): --pin-dir")),
        "{network}"
    );
    assert!(
        message.contains("network:") && message.contains("--pin-dir"),
        "{message}"
    );
    let text = scrape(metrics).unwrap();
    assert_eq!(
        series(&text, &["backend_available{", "behavior=\"network\""]),
        Some(0),
        "{text}"
    );
    assert!(
        series(
            &text,
            &[
                "backend_load_attempts_total{",
                "behavior=\"network\"",
                "result=\"failure\""
            ]
        )
        .is_some_and(|n| n >= 1),
        "{text}"
    );
    assert!(connects_from(container, &target), "nothing enforced yet");

    // The cause goes away: a bpffs in the test's own scratch directory.
    pod.mount_bpffs();
    daemon.wait_log("loaded after start", Duration::from_secs(30));
    wait_for("the deny to take effect", Duration::from_secs(15), || {
        (!connects_from(container, &target)).then_some(())
    });
    println!(
        "{target} dropped from {} after the retry",
        container.display()
    );
    let text = wait_for("the metrics to say so", Duration::from_secs(10), || {
        let text = scrape(metrics)?;
        (series(&text, &["backend_available{", "behavior=\"network\""]) == Some(1)).then_some(text)
    });
    assert_eq!(
        series(
            &text,
            &[
                "backend_load_attempts_total{",
                "behavior=\"network\"",
                "result=\"success\""
            ]
        ),
        Some(1),
        "{text}"
    );
    let after = wait_for(
        "the shard to say it is enforced",
        Duration::from_secs(30),
        || {
            let s = shard(cluster, "host-retry-net", NODE)?;
            (s["enforcementAvailable"] == true).then_some(s)
        },
    );
    println!("after: {after}");
    let network = after["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["behavior"] == "network"))
        .cloned()
        .unwrap();
    assert!(network["reason"].is_null(), "{network}");
    // One reason, logged once; its repeats only at debug.
    let log = daemon.log();
    let count = |needle: &str| log.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("failed to load: retrying with backoff"), 1);
    assert_eq!(count("for a new reason"), 0);
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "the daemon ran until told to stop");
    cluster
        .kubectl_ok(&["delete", "rpol", "host-retry-net"])
        .unwrap();
    force_delete_pod(cluster, NS, "host-retry");
    drop(listener);
}
