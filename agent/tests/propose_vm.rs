//! Tier 4: from observation to enforcement, end to end, in a VM node.
//!
//! The guest (a 6.12 kernel with `bpf` in `lsm=`, joined to the local API
//! server on the host, see `vmnode`) plays the kubelet and the controllers
//! of a Deployment `shop/shop-web` (its ReplicaSet and one pod in a
//! container cgroup) and runs the real daemon. Then:
//!
//! 1. Before any policy, the workload and four extra actions all succeed.
//! 2. Discovery: a monitor policy denying everything for every behavior
//!    selects the workload, which runs until the Deployment's Report holds
//!    what it does.
//! 3. `kyverno-runtime propose -n shop pod/<the pod>` (taken up to the
//!    Deployment) writes the policy, which `policy check` accepts.
//! 4. The discovery policy goes, the proposal is applied with its mode
//!    switched to enforce (its dns companion stays monitor), and the extra
//!    actions are refused: an exec and an open (EPERM), a connection to
//!    another address (dropped), an ssh flow to the allowed address (its
//!    data dropped).
//! 5. The workload runs to completion: every open, exec, connection, HTTP
//!    request and DNS question it made during discovery goes through. The
//!    Report then holds refusals of the extras only, and no finding about
//!    anything the workload did, enforced or advisory.
//!
//! `propose_vm` on the host; `propose_vm guest` inside.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod vmnode;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kyverno_runtime_api::openreports::{Report, ReportResult};
use kyverno_runtime_api::runtimepolicy::{RuntimePolicy, RuntimePolicyMode};
use serde::Deserialize as _;
use std::collections::BTreeSet;
use std::io::Read as _;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vmnode::{run_child, run_ops, wait_for, wait_until, Daemon, Guest, Outcome};

const NS: &str = "shop";
const DEPLOYMENT: &str = "shop-web";
const REPLICASET: &str = "shop-web-5d8f7c9b4";
const POD: &str = "shop-web-5d8f7c9b4-x7k2p";
const REPORT: &str = "kyverno-runtime-deployment.shop-web";
const DISCOVERY: &str = "discover-shop-web";
const PROPOSED: &str = "shop-web";
const PROPOSED_DNS: &str = "shop-web-dns";

const WORKER: &str = "/usr/local/bin/shop-worker";
const CONFIG: &str = "/etc/shop/config.json";
const CATALOG: &str = "/etc/shop/catalog.txt";
const INVENTORY: &str = "127.0.0.2:8080";
const QUESTION: &str = "inventory.shop.example";

const FORBIDDEN: &str = "/usr/local/bin/forbidden";
const SECRET: &str = "/etc/shop/secret";
const ELSEWHERE: &str = "127.0.0.5:8080";

/// What the workload does, in one process in the pod's cgroup.
const WORKLOAD: [(&str, &str); 5] = [
    ("open", CONFIG),
    ("open", CATALOG),
    ("exec", WORKER),
    ("dns", QUESTION),
    ("http", INVENTORY),
];

/// The findings discovery must have seen before proposing: (behavior,
/// target).
const DISCOVERED: [(&str, &str); 9] = [
    ("exec", WORKER),
    ("open", WORKER),
    ("open", CONFIG),
    ("open", CATALOG),
    ("network", "127.0.0.2"),
    ("network", "127.0.0.1"),
    ("protocol", "http/1.1"),
    ("protocol", "dns"),
    ("dns", QUESTION),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("guest") => guest(),
        Some("child") => vmnode::child(&args[1..]),
        // `cargo test` passes libtest flags: the host half.
        _ => host(),
    }
}

fn host() -> ExitCode {
    let cluster = vmnode::apply_crds();
    if vmnode::boot_node(cluster, &["guest"]) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What arrived at a listener: the first bytes of each connection, or
/// each datagram.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Vec<u8>>>>);

impl Received {
    fn any(&self, needle: &[u8]) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.windows(needle.len()).any(|w| w == needle))
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// A TCP listener keeping what each connection sent (until it closes or
/// 2 s pass).
fn tcp_listener(addr: &str) -> Received {
    let received = Received::default();
    let listener = std::net::TcpListener::bind(addr).unwrap();
    let sink = received.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                if !buf.is_empty() {
                    sink.0.lock().unwrap().push(buf);
                }
            });
        }
    });
    received
}

/// A UDP resolver that keeps the questions (and answers none).
fn resolver() -> Received {
    let received = Received::default();
    let socket = std::net::UdpSocket::bind("127.0.0.1:53").unwrap();
    let sink = received.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, _)) = socket.recv_from(&mut buf) {
            sink.0.lock().unwrap().push(buf[..n].to_vec());
        }
    });
    received
}

/// A DNS name as it is on the wire (length-prefixed labels).
fn wire_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out
}

fn target(r: &ReportResult) -> String {
    r.properties
        .as_ref()
        .and_then(|p| p.get("target").cloned())
        .unwrap_or_default()
}

fn row(r: &ReportResult) -> String {
    let p = r.properties.clone().unwrap_or_default();
    format!(
        "{:<18} {:<9} {:<26} enforced={:<5} count={}",
        r.policy,
        r.rule.clone().unwrap_or_default(),
        target(r),
        p.get("enforced").cloned().unwrap_or_default(),
        p.get("count").cloned().unwrap_or_default()
    )
}

fn guest() -> ExitCode {
    let g = Guest::connect();
    let started = Instant::now();
    let at = || format!("[{:>5.1}s]", started.elapsed().as_secs_f64());

    // The workload's files and programs (busybox copies), and what it
    // talks to: an inventory service, a resolver, and another service.
    std::fs::create_dir_all("/usr/local/bin").unwrap();
    std::fs::create_dir_all("/etc/shop").unwrap();
    for p in [WORKER, FORBIDDEN] {
        std::fs::copy("/bin/busybox", p).unwrap();
    }
    for (p, text) in [(CONFIG, "{}"), (CATALOG, "apples"), (SECRET, "hunter2")] {
        std::fs::write(p, text).unwrap();
    }
    let inventory = tcp_listener(INVENTORY);
    let _elsewhere = tcp_listener(ELSEWHERE);
    let questions = resolver();

    // A previous run's policies, pod and Report must not answer for this
    // one.
    let policies = g.all::<RuntimePolicy>();
    for p in [DISCOVERY, PROPOSED, PROPOSED_DNS] {
        let _ = g.rt.block_on(policies.delete(p, &DeleteParams::default()));
    }
    let pods = g.ns::<Pod>(NS);
    let reports = g.ns::<Report>(NS);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = g.rt.block_on(pods.delete(POD, &now));
    let _ =
        g.rt.block_on(reports.delete(REPORT, &DeleteParams::default()));
    wait_until(
        "the previous run's objects to be gone",
        Duration::from_secs(30),
        || {
            let gone = g.rt.block_on(pods.get_opt(POD)).ok()?.is_none()
                && g.rt.block_on(reports.get_opt(REPORT)).ok()?.is_none();
            gone.then_some(())
        },
    );

    // The node, and the Deployment's objects as its controllers would
    // write them.
    g.register_node();
    g.namespace(NS, serde_json::json!({}));
    let labels = serde_json::json!({"app": "shop", "tier": "web"});
    let template = |labels: &serde_json::Value| {
        serde_json::json!({"metadata": {"labels": labels},
                           "spec": {"containers": [{"name": "app", "image": "busybox"}]}})
    };
    let deploy = g.ssa(
        &g.ns::<Deployment>(NS),
        DEPLOYMENT,
        serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DEPLOYMENT},
        "spec": {"selector": {"matchLabels": labels}, "template": template(&labels)}}),
    );
    let mut rs_labels = labels.clone();
    rs_labels["pod-template-hash"] = "5d8f7c9b4".into();
    let rs = g.ssa(&g.ns::<ReplicaSet>(NS), REPLICASET, serde_json::json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": REPLICASET, "labels": rs_labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT,
                                          "uid": deploy.metadata.uid, "controller": true}]},
        "spec": {"selector": {"matchLabels": rs_labels}, "template": template(&rs_labels)}}));
    let procs = g.run_pod(
        NS,
        POD,
        serde_json::json!({"labels": rs_labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": REPLICASET,
                                 "uid": rs.metadata.uid, "controller": true}]}),
        &"5eb0c4d2".repeat(8),
    );
    println!(
        "{} pod {NS}/{POD} (Deployment {DEPLOYMENT}) running in {}",
        at(),
        procs.parent().unwrap().display()
    );

    let extras = [
        ("exec", FORBIDDEN),
        ("open", SECRET),
        ("connect", ELSEWHERE),
    ];
    assert_eq!(
        run_ops(&procs, &WORKLOAD),
        Outcome::Done,
        "the workload, before any policy"
    );
    for (op, t) in extras {
        assert_eq!(
            run_child(&procs, op, t),
            Outcome::Done,
            "{op} {t}, before any policy"
        );
    }
    assert_eq!(run_child(&procs, "ssh", INVENTORY), Outcome::Done);
    wait_until(
        "the ssh banner, before any policy",
        Duration::from_secs(10),
        || inventory.any(b"SSH-2.0").then_some(()),
    );
    println!("{} before any policy: the workload and the extra actions (exec {FORBIDDEN}, open {SECRET}, connect {ELSEWHERE}, ssh to {INVENTORY}) all succeed", at());

    // ---- discovery --------------------------------------------------------
    let discovery: RuntimePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
        "metadata": {"name": DISCOVERY},
        "spec": {"mode": "monitor", "podSelector": {"matchLabels": {"app": "shop"}},
                 "behaviors": [{"exec": {"deny": {"values": ["*"]}}}, {"open": {"deny": {"values": ["*"]}}},
                               {"network": {"deny": {"values": ["*"]}}}, {"protocol": {"deny": {"values": ["*"]}}},
                               {"dns": {"deny": {"values": ["*"]}}}]}}))
    .unwrap();
    g.ssa(
        &policies,
        DISCOVERY,
        serde_json::to_value(&discovery).unwrap(),
    );
    println!("{} $ kubectl apply -f {DISCOVERY}.yaml   (monitor, deny [\"*\"] for exec, open, network, protocol, dns)", at());
    let mut daemon = Daemon::start();
    daemon.wait_log("pods on this node listed", Duration::from_secs(120));
    let mut last_run: Option<Instant> = None;
    let mut runs = 0;
    let results = wait_until(
        "the discovery findings in the Deployment's Report",
        Duration::from_secs(180),
        || {
            // Again every few seconds until the policy is programmed and its
            // findings flushed.
            if last_run.is_none_or(|t| t.elapsed() > Duration::from_secs(3)) {
                assert_eq!(
                    run_ops(&procs, &WORKLOAD),
                    Outcome::Done,
                    "monitor mode refuses nothing"
                );
                last_run = Some(Instant::now());
                runs += 1;
            }
            let r = g.rt.block_on(reports.get_opt(REPORT)).ok()??;
            let results = r.spec.results.unwrap_or_default();
            let seen: BTreeSet<(String, String)> = results
                .iter()
                .filter(|r| r.policy == DISCOVERY)
                .map(|r| (r.rule.clone().unwrap_or_default(), target(r)))
                .collect();
            DISCOVERED
                .iter()
                .all(|(b, t)| seen.contains(&(b.to_string(), t.to_string())))
                .then_some(results)
        },
    );
    // One more drain and flush, so nothing of the last run is missing.
    std::thread::sleep(Duration::from_secs(5));
    let results =
        g.rt.block_on(reports.get_opt(REPORT))
            .unwrap()
            .and_then(|r| r.spec.results)
            .unwrap_or(results);
    println!(
        "{} the workload ran {runs} time(s) under {DISCOVERY}; Report {NS}/{REPORT}:",
        at()
    );
    for r in results.iter().filter(|r| r.policy == DISCOVERY) {
        println!("         {}", row(r));
    }

    // ---- propose ----------------------------------------------------------
    let out = Command::new("/bin/kyverno-runtime")
        .args([
            "propose",
            "-n",
            NS,
            &format!("pod/{POD}"),
            "--name",
            PROPOSED,
            "-o",
            "/tmp/proposed.yaml",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "propose failed:\n{stderr}");
    let yaml = std::fs::read_to_string("/tmp/proposed.yaml").unwrap();
    println!(
        "{} $ kyverno-runtime propose -n {NS} pod/{POD} --name {PROPOSED} -o proposed.yaml",
        at()
    );
    for line in stderr.lines() {
        println!("         {line}");
    }
    println!("--- proposed.yaml\n{yaml}---");
    let out = Command::new("/bin/kyverno-runtime")
        .args(["policy", "check", "/tmp/proposed.yaml"])
        .output()
        .unwrap();
    let checked = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "policy check refused the proposal:\n{checked}"
    );
    println!(
        "{} $ kyverno-runtime policy check proposed.yaml\n         {}",
        at(),
        checked.lines().last().unwrap_or_default()
    );
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        if !v.is_null() {
            docs.push(serde_yaml::from_value::<RuntimePolicy>(v).unwrap());
        }
    }
    let names: Vec<_> = docs
        .iter()
        .map(|d| d.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, [PROPOSED, PROPOSED_DNS]);
    let spec = serde_json::to_value(&docs[0].spec).unwrap();
    assert_eq!(
        spec["podSelector"],
        serde_json::json!({"matchLabels": labels}),
        "the Deployment's pod template labels"
    );

    // ---- enforce ----------------------------------------------------------
    g.rt.block_on(policies.delete(DISCOVERY, &DeleteParams::default()))
        .unwrap();
    docs[0].spec.mode = Some(RuntimePolicyMode::Enforce);
    for d in &docs {
        let name = d.metadata.name.clone().unwrap();
        g.ssa(&policies, &name, serde_json::to_value(d).unwrap());
    }
    println!("{} $ kubectl delete rpol {DISCOVERY}; kubectl apply -f proposed.yaml   ({PROPOSED} switched to enforce, {PROPOSED_DNS} stays monitor)", at());
    wait_until(
        "the extra actions to be refused",
        Duration::from_secs(120),
        || {
            let refused = extras
                .iter()
                .all(|(op, t)| run_child(&procs, op, t) == Outcome::Refused);
            // An ssh flow to the inventory's (allowed) address: its first data
            // segment is dropped, so the banner never arrives.
            inventory.clear();
            assert_eq!(
                run_ops(&procs, &[("ssh", INVENTORY)]),
                Outcome::Done,
                "the connection is allowed"
            );
            std::thread::sleep(Duration::from_millis(1500));
            let ssh_arrived = inventory.any(b"SSH-2.0");
            inventory.clear();
            (refused && !ssh_arrived).then_some(())
        },
    );
    println!("{} refused: exec {FORBIDDEN} (EPERM), open {SECRET} (EPERM), connect {ELSEWHERE} (dropped), ssh to {INVENTORY} (data dropped)", at());

    inventory.clear();
    questions.clear();
    assert_eq!(
        run_ops(&procs, &WORKLOAD),
        Outcome::Done,
        "the workload runs to completion under the proposed policy"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        inventory.any(b"GET /inventory HTTP/1.1"),
        "the HTTP request reached the inventory"
    );
    assert!(
        questions.any(&wire_name(QUESTION)),
        "the DNS question reached the resolver"
    );
    println!("{} the workload ran to completion: {CONFIG} and {CATALOG} read, {WORKER} run, {QUESTION} asked, GET /inventory delivered", at());

    // The Report: the extras' refusals, nothing about what the workload did.
    let workload_targets: BTreeSet<&str> = DISCOVERED.iter().map(|(_, t)| *t).collect();
    let results = wait_for(
        "the refusals in the Report",
        Duration::from_secs(90),
        || {
            let r = match g.rt.block_on(reports.get_opt(REPORT)) {
                Ok(Some(r)) => r,
                Ok(None) => return Err(format!("no Report {NS}/{REPORT}")),
                Err(e) => return Err(format!("reading Report {NS}/{REPORT}: {e}")),
            };
            let results = r.spec.results.unwrap_or_default();
            let mut missing: Vec<String> = [FORBIDDEN, SECRET, "127.0.0.5", "ssh"]
                .into_iter()
                .filter(|t| {
                    !results
                        .iter()
                        .any(|r| r.policy == PROPOSED && target(r) == *t)
                })
                .map(|t| format!("no {PROPOSED} result for {t}"))
                .collect();
            if results.iter().any(|r| r.policy == DISCOVERY) {
                missing.push(format!("{DISCOVERY} results still there"));
            }
            if missing.is_empty() {
                return Ok(results);
            }
            let rows: Vec<String> = results.iter().map(row).collect();
            Err(format!(
                "{}\nthe Report:\n{}\nthe daemon's log, its end:\n{}",
                missing.join("\n"),
                rows.join("\n"),
                daemon.tail(40)
            ))
        },
    );
    // A flush after the workload's run, so a refusal of it would be here.
    std::thread::sleep(Duration::from_secs(5));
    let results =
        g.rt.block_on(reports.get_opt(REPORT))
            .unwrap()
            .and_then(|r| r.spec.results)
            .unwrap_or(results);
    println!("{} Report {NS}/{REPORT}:", at());
    for r in &results {
        println!("         {}", row(r));
    }
    for r in &results {
        assert!(
            r.policy == PROPOSED,
            "only the enforce policy reports (no dns finding: the name was expected): {}",
            row(r)
        );
        let t = target(r);
        assert!(
            !workload_targets.contains(t.as_str()),
            "a refusal of something the workload did: {}",
            row(r)
        );
        assert_eq!(
            r.properties
                .as_ref()
                .and_then(|p| p.get("enforced"))
                .map(String::as_str),
            Some("true"),
            "{}",
            row(r)
        );
    }
    // Every refusal named its policy, the first ones too: they came while
    // the proposal was still being programmed (the monitor had it staged).
    let metrics = vmnode::metrics();
    assert!(metrics.contains(" 200 OK"), "/metrics: {metrics}");
    let unattributed: Vec<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("unattributed_kernel_deny"))
        .collect();
    assert!(
        unattributed.iter().all(|l| l.ends_with(" 0")),
        "refusals no policy explained: {unattributed:?}"
    );
    println!(
        "{} /metrics: no refusal unattributed ({})",
        at(),
        unattributed.first().copied().unwrap_or("no such series")
    );
    let (took, _) = daemon.terminate();
    println!("{} daemon stopped in {took:?}", at());
    ExitCode::SUCCESS
}
