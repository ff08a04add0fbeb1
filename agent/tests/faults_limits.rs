//! Fault tier (issue 34, item 5, first part): a policy whose entries
//! exceed a kernel map's capacity.
//!
//! `egress_hosts` holds 2^18 host entries for the whole node. One enforce
//! policy denies 5 x 60,000 addresses (five behaviors, each read from a
//! loopback data source) for one pod: 300,000, more than fit. Beside it a
//! small enforce policy denies one address for another pod. What must be
//! true: the failure is said where an operator looks (the node's shard
//! names the full map, the log line names the policy, a metric counts it),
//! nothing is dropped silently, and the small policy is enforced as
//! before. The daemon's peak memory is printed beside the chart's limit.
//!
//! It found a quadratic merge of a kind's lists (`Vec::contains` per
//! value): with these 300,000 values the engine, and SIGTERM with it, was
//! held for minutes; now the failure is said within seconds.
//!
//! Needs root (cgroup v2, bpffs, cgroup_skb) and the local control plane
//! (`ci/kube-up`); run by `ci/faults` and `ci/test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::host::HostPod;
use common::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const NODE: &str = "faults-limits-node";
const NS: &str = "faults-limits";
const BIG: &str = "faults-limits-big";
const SMALL: &str = "faults-limits-small";
/// Behaviors of the big policy, and addresses each denies.
const BEHAVIORS: u32 = 5;
const PER_BEHAVIOR: u32 = 60_000;

/// The `i`th address of behavior `b`.
fn addr(b: u32, i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 64, 0, 0)) + b * (1 << 20) + i)
}

fn list(b: u32) -> String {
    let cidrs: Vec<String> = (0..PER_BEHAVIOR)
        .map(|i| format!("\"{}/32\"", addr(b, i)))
        .collect();
    format!("{{\"cidrs\": [{}]}}", cidrs.join(","))
}

/// `resources.limits.memory` of the chart's values, in MiB.
fn chart_memory_limit_mib() -> u64 {
    let values =
        std::fs::read_to_string(root().join("charts/kyverno-runtime/values.yaml")).unwrap();
    let mut in_limits = false;
    for line in values.lines() {
        let t = line.trim();
        if t.starts_with("limits:") {
            in_limits = true;
        } else if in_limits {
            if let Some(v) = t.strip_prefix("memory:") {
                return v.trim().trim_end_matches("Mi").parse().unwrap();
            }
        }
    }
    panic!("no resources.limits.memory in the chart's values");
}

#[test]
fn a_policy_past_a_maps_capacity_is_said_and_the_rest_is_enforced() {
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, NS, "team: faults-limits");
    // Fresh objects: a status left by an earlier run must not answer.
    cluster
        .kubectl_ok(&["delete", "rpol", BIG, SMALL, "--ignore-not-found"])
        .unwrap();
    let servers: Vec<ListServer> = (0..BEHAVIORS)
        .map(|b| ListServer::start(&list(b)))
        .collect();
    let behaviors: String = servers
        .iter()
        .map(|s| {
            format!(
                "  - network:\n      deny:\n        expression: \"http.get('http://{}/cidrs').body.cidrs.map(c, string(c))\"\n",
                s.addr
            )
        })
        .collect();
    apply(
        cluster,
        &format!(
            "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {BIG}\nspec:\n  mode: enforce\n  evaluationInterval: 1h\n  podSelector: {{matchLabels: {{app: big}}}}\n  behaviors:\n{behaviors}"
        ),
    );
    let small_denied = std::net::TcpListener::bind("127.0.0.21:0").unwrap();
    let small_addr = small_denied.local_addr().unwrap();
    apply(
        cluster,
        &format!(
            "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {SMALL}\nspec:\n  mode: enforce\n  podSelector: {{matchLabels: {{app: small}}}}\n  behaviors:\n  - network: {{deny: {{values: [\"127.0.0.21/32\"]}}}}\n"
        ),
    );
    let mut pods = Vec::new();
    for (name, app, id) in [("big", "big", "7c"), ("small", "small", "7d")] {
        force_delete_pod(cluster, NS, name);
        let id = id.repeat(32);
        let uid = running_pod(
            cluster,
            NS,
            name,
            NODE,
            &format!("app: {app}"),
            &format!("containerd://{id}"),
        );
        pods.push(HostPod::new(&dir.path().join(name), &uid, &id));
    }
    let metrics = free_loopback();
    let start = Instant::now();
    let mut daemon = host_daemon(cluster, NODE, &pods[0], &metrics.to_string());
    daemon.wait_log("pods on this node listed", Duration::from_secs(60));
    let full = "map egress_hosts is full (262144 entries)";
    let big = wait_for("the big policy's shard", Duration::from_secs(120), || {
        let s = shard(cluster, BIG, NODE)?;
        s["message"].as_str()?.contains(full).then_some(s)
    });
    let said = start.elapsed();
    println!("after {said:.1?}: the shard says {:?}", big["message"]);
    assert_eq!(big["enforcementAvailable"], false, "{big}");
    let condition = |policy: &str, kind: &str| {
        get_json(cluster, &["rpol", policy]).and_then(|rp| {
            rp["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == kind)
                .cloned()
        })
    };
    let available = condition(BIG, "EnforcementAvailable").unwrap();
    println!(
        "EnforcementAvailable: {} ({})",
        available["status"], available["message"]
    );
    assert_eq!(available["status"], "False", "{available}");
    let line = daemon
        .log()
        .into_iter()
        .find(|l| {
            l.contains("programming the policy failed") && l.contains(BIG) && l.contains(full)
        })
        .expect("a log line naming the policy and the full map");
    println!("log: {line}");
    let text = scrape(metrics).unwrap();
    let counted = series_sum(
        &text,
        &[
            "nirmata_runtime_kernel_updates_failed_total{",
            "behavior=\"network\"",
            "reason=\"map_full\"",
        ],
    );
    println!("kernel_updates_failed_total{{behavior=network,reason=map_full}} {counted}");
    assert!(counted > 0, "no map_full counted");

    // The small policy, beside it, is enforced as before: its pod cannot
    // reach the address it denies and reaches another.
    let other = std::net::TcpListener::bind("127.0.0.22:0").unwrap();
    let other_addr = other.local_addr().unwrap();
    for l in [&small_denied, &other] {
        let l = l.try_clone().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                drop(c)
            }
        });
    }
    wait_for("the small policy's shard", Duration::from_secs(30), || {
        let s = shard(cluster, SMALL, NODE)?;
        (s["enforcementAvailable"] == true).then_some(())
    });
    let small = &pods[1].container;
    assert!(
        !host::connects_within(small, &small_addr.to_string(), "1"),
        "the small policy's denied address connected"
    );
    assert!(
        host::connects_within(small, &other_addr.to_string(), "1"),
        "the small policy's pod cannot reach an address it does not deny"
    );
    println!("the small policy: {small_addr} refused, {other_addr} reached");
    // Its peak resident set beside the chart's memory limit: measured and
    // printed, not asserted. 300,000 values are past the sizing the chart
    // documents (docs/chart.md, "Memory"), and this run is what that page
    // quotes for lists this long.
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    let limit_mib = chart_memory_limit_mib();
    println!(
        "peak resident set {} MiB (debug build), the chart's default limit {limit_mib} MiB",
        peak_kib / 1024
    );
    // And the engine is free: a SIGTERM is served in time.
    let (status, took, log) = daemon.terminate(Duration::from_secs(30));
    // The shared control plane serves later tiers: leave no policy whose
    // data sources are gone.
    cluster.kubectl_ok(&["delete", "rpol", BIG, SMALL]).unwrap();
    assert!(status.success(), "{}", log.join("\n"));
    println!("SIGTERM served in {took:.1?}");
}
