//! Tier 2+3: the daemon on the host against the real API server, with a
//! real pod cgroup, and network values that name destinations:
//!
//! - a policy naming a cluster Service gets the Service's ClusterIP and
//!   EndpointSlice addresses into the pod's filter set, follows the
//!   EndpointSlice as it changes, and loses them when the Service is
//!   deleted. The set is read from the daemon's pinned maps while it runs
//!   (`EgressFilter::read_pinned_state`, which loads nothing);
//! - a policy allowing a domain under a default deny: a process in the pod
//!   resolves it through a resolver on loopback and connects to the
//!   answered address, while an address answered for another name stays
//!   dropped, and the snooper's counters reach /metrics.
//!
//! Needs root (a cgroup v2 directory, a bpffs mount, cgroup_skb programs)
//! and `--features kube-tests`. Service addresses are not loopback (the
//! API server refuses loopback endpoints), so this proves the programming,
//! not traffic: the kernel's use of set entries is proven with loopback
//! traffic elsewhere (egress_traffic, egress_host).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// The DNS message builder the BPF crate's tests use.
#[path = "../../bpf/tests/common/dnsmsg.rs"]
mod dnsmsg;

use common::host::HostPod;
use common::*;
use kyverno_runtime_bpf::egress::{EgressFilter, Prefix};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const NODE: &str = "host-services-node";
const NS: &str = "svc-names";

/// The allow prefixes and domains of `cgroup`'s set, as pinned now.
fn pinned_allow(pins: &Path, cgroup: u64) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let state = EgressFilter::read_pinned_state(pins).ok()?;
    let (set, _) = state.filters.get(&cgroup)?;
    let entries = state.sets.get(set).cloned().unwrap_or_default();
    Some((
        entries.allow.iter().map(Prefix::to_string).collect(),
        entries.domains.keys().map(ToString::to_string).collect(),
    ))
}

fn prefixes(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn shard_message(cluster: &kyverno_runtime_testkube::LocalCluster) -> Option<String> {
    let s = shard(cluster, "svc-allow", NODE)?;
    Some(s["message"].as_str().unwrap_or_default().to_string())
}

fn slice_manifest(name: &str, kind: &str, addresses: &[&str]) -> String {
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("  - addresses: [\"{a}\"]\n"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {NS}\n  labels: {{kubernetes.io/service-name: api}}\naddressType: {kind}\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n{}",
        endpoints.concat()
    )
}

#[test]
fn a_service_name_follows_the_service_and_its_endpoint_slices() {
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, NS, "team: svc");
    for kind in ["service", "endpointslice"] {
        let _ = cluster.kubectl_output(&["delete", kind, "--all", "-n", NS]);
    }
    apply(
        cluster,
        &format!("apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: svc-allow\nspec:\n  mode: enforce\n  podSelector: {{matchLabels: {{app: svc-web}}}}\n  behaviors:\n  - network:\n      allow: {{values: [\"api.{NS}.svc\", \"allowed.test\"]}}\n      deny: {{values: [\"*\"]}}\n"),
    );
    force_delete_pod(cluster, NS, "svc-web");
    let id = "5f".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "svc-web",
        NODE,
        "app: svc-web",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let cgroup = pod.cgroup_id();

    let pins = pod.pins();
    let egress_pins = pins.join("egress");
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
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
    daemon.wait_log(
        "Services and EndpointSlices listed",
        Duration::from_secs(30),
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));

    // No Service yet: the set holds the domain and nothing for the
    // Service, and the shard says which name is unresolved.
    let (allow, domains) = wait_for("the pod's set", Duration::from_secs(20), || {
        pinned_allow(&egress_pins, cgroup)
    });
    assert!(allow.is_empty(), "{allow:?}");
    assert_eq!(domains, prefixes(&["allowed.test"]));
    let message = wait_for(
        "the unresolved Service in the shard",
        Duration::from_secs(20),
        || shard_message(cluster).filter(|m| m.contains(&format!("api.{NS}.svc"))),
    );
    println!("shard before the Service exists: {message}");

    // The Service (a fixed ClusterIP in the server's range) and two
    // EndpointSlices, IPv4 and IPv6.
    let started = Instant::now();
    apply(
        cluster,
        &format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: api\n  namespace: {NS}\nspec:\n  clusterIP: 10.96.7.7\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n"),
    );
    apply(
        cluster,
        &slice_manifest("api-v4", "IPv4", &["10.244.1.7", "10.244.2.8"]),
    );
    apply(cluster, &slice_manifest("api-v6", "IPv6", &["fd00:244::7"]));
    let want = prefixes(&[
        "10.96.7.7/32",
        "10.244.1.7/32",
        "10.244.2.8/32",
        "fd00:244::7/128",
    ]);
    wait_for(
        "the Service's addresses in the set",
        Duration::from_secs(20),
        || pinned_allow(&egress_pins, cgroup).filter(|(a, _)| *a == want),
    );
    println!(
        "ClusterIP and endpoints programmed {:?} after the apply",
        started.elapsed()
    );
    wait_for(
        "the shard without the unresolved name",
        Duration::from_secs(20),
        || {
            shard_message(cluster)
                .filter(|m| !m.contains("Services without addresses"))
                .map(|_| ())
        },
    );

    // An endpoint replaced: the set follows by diff.
    let changed = Instant::now();
    apply(
        cluster,
        &slice_manifest("api-v4", "IPv4", &["10.244.1.7", "10.244.3.9"]),
    );
    let want = prefixes(&[
        "10.96.7.7/32",
        "10.244.1.7/32",
        "10.244.3.9/32",
        "fd00:244::7/128",
    ]);
    wait_for(
        "the changed endpoint in the set",
        Duration::from_secs(20),
        || pinned_allow(&egress_pins, cgroup).filter(|(a, _)| *a == want),
    );
    println!(
        "EndpointSlice change followed {:?} after the apply",
        changed.elapsed()
    );

    // The Service deleted: every address goes, though its slices remain.
    let deleted = Instant::now();
    cluster
        .kubectl_ok(&["delete", "service", "api", "-n", NS])
        .unwrap();
    wait_for("the addresses removed", Duration::from_secs(20), || {
        pinned_allow(&egress_pins, cgroup).filter(|(a, _)| a.is_empty())
    });
    println!(
        "Service deletion removed its addresses {:?} after the delete",
        deleted.elapsed()
    );
    let (_, domains) = pinned_allow(&egress_pins, cgroup).unwrap();
    assert_eq!(domains, prefixes(&["allowed.test"]), "the domain stays");

    let (status, took, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    println!("daemon stopped in {took:?}");
    assert!(
        log.iter().any(|l| l.contains("the Service has no address")),
        "the unresolved Service is logged"
    );
    for kind in ["endpointslice", "service"] {
        let _ = cluster.kubectl_output(&["delete", kind, "--all", "-n", NS]);
    }
    let _ = cluster.kubectl_output(&["delete", "rpol", "svc-allow"]);
    force_delete_pod(cluster, NS, "svc-web");
}

// ---- a domain on the daemon ------------------------------------------------------------

const DNS_NODE: &str = "host-dns-node";
const DNS_NS: &str = "dns-names";
const CHILD_ENV: &str = "KRT_DNS_NAMES_CHILD";

/// The child: joins the cgroup, asks the resolver for a name's A record,
/// connects to the answer. Exit 0 connected, 10 not, 12 no answer.
#[test]
fn resolve_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('\t').collect();
    let (dir, resolver, name, port) = (parts[0], parts[1], parts[2], parts[3]);
    std::fs::write(
        Path::new(dir).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    sock.send_to(
        &dnsmsg::query(7, name, dnsmsg::TYPE_A),
        resolver.parse::<SocketAddr>().unwrap(),
    )
    .unwrap();
    let mut buf = [0u8; 512];
    let Some(addr) = sock
        .recv_from(&mut buf)
        .ok()
        .and_then(|(n, _)| dnsmsg::first_a(&buf[..n]))
    else {
        std::process::exit(12);
    };
    let to = SocketAddr::from((addr, port.parse::<u16>().unwrap()));
    let code = match TcpStream::connect_timeout(&to, Duration::from_millis(1500)) {
        Ok(mut s) => {
            let _ = s.write_all(b"x");
            let _ = s.read(&mut [0u8; 8]);
            0
        }
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => 10,
        Err(_) => 11,
    };
    std::process::exit(code);
}

/// A child in `cgroup` resolves `name` through `resolver` and connects to
/// the answered address (`answer`, where this listens): whether it
/// connected.
fn resolves_and_connects(
    cgroup: &Path,
    resolver: SocketAddr,
    name: &str,
    answer: Ipv4Addr,
) -> bool {
    let listener = TcpListener::bind((answer, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "resolve_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}\t{resolver}\t{name}\t{port}", cgroup.display()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut accepted = None;
    while accepted.is_none() && Instant::now() < deadline {
        match listener.accept() {
            Ok((s, _)) => accepted = Some(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    drop(accepted);
    match child.wait().unwrap().code() {
        Some(0) => true,
        Some(10 | 11) => false,
        other => panic!("{name}: the child found no answer ({other:?})"),
    }
}

/// Answers A questions for the names of `table` from `<ip>:53` (what a
/// cluster resolver does), NXDOMAIN otherwise; stops with the returned
/// flag.
fn resolver(
    ip: Ipv4Addr,
    table: Vec<(&'static str, Ipv4Addr)>,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let sock = UdpSocket::bind((ip, 53)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let addr = sock.local_addr().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !stopping.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let Some(name) = dnsmsg::question_name(&buf[..n]) else {
                continue;
            };
            let mut r = match table.iter().find(|(t, _)| *t == name) {
                Some((_, a)) => {
                    let mut r = dnsmsg::Response::new(&name, dnsmsg::TYPE_A);
                    r.a(&dnsmsg::ptr(dnsmsg::QNAME_AT), 60, *a);
                    r
                }
                None => dnsmsg::Response::new(&name, dnsmsg::TYPE_A).rcode(3),
            };
            r.bytes[..2].copy_from_slice(&buf[..2]);
            let _ = sock.send_to(&r.bytes, from);
        }
    });
    (addr, stop)
}

#[test]
fn a_domain_allowed_on_the_daemon_opens_what_the_pods_own_answer_gave() {
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, DNS_NS, "team: dns");
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: dns-allow\nspec:\n  mode: enforce\n  podSelector: {matchLabels: {app: dns-web}}\n  behaviors:\n  - network:\n      allow: {values: [\"allowed.test\", \"127.0.4.53\"]}\n      deny: {values: [\"*\"]}\n",
    );
    // Two monitor policies beside it (issue 33, point 4): one allowing the
    // domain under a default deny must be silent for the address the pod's
    // answer gave, one denying the domain must report that address. The
    // deny also names `watched.test`, which no enforce policy names: its
    // answers are learned for the monitor alone.
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: dns-watch-allow\nspec:\n  mode: monitor\n  podSelector: {matchLabels: {app: dns-web}}\n  behaviors:\n  - network:\n      allow: {values: [\"allowed.test\", \"127.0.4.53\"]}\n      deny: {values: [\"*\"]}\n",
    );
    apply(
        cluster,
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: dns-watch-deny\nspec:\n  mode: monitor\n  podSelector: {matchLabels: {app: dns-web}}\n  behaviors:\n  - network:\n      deny: {values: [\"Allowed.Test.\", \"watched.test\"]}\n",
    );
    force_delete_pod(cluster, DNS_NS, "dns-web");
    let id = "6a".repeat(32);
    let uid = running_pod(
        cluster,
        DNS_NS,
        "dns-web",
        DNS_NODE,
        "app: dns-web",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;

    let allowed = Ipv4Addr::new(127, 0, 0, 30);
    let other = Ipv4Addr::new(127, 0, 0, 31);
    let watched = Ipv4Addr::new(127, 0, 0, 32);
    let (resolver_addr, stop) = resolver(
        Ipv4Addr::new(127, 0, 4, 53),
        vec![
            ("allowed.test", allowed),
            ("other.test", other),
            ("watched.test", watched),
        ],
    );
    let metrics_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            &metrics.to_string(),
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--report-interval",
            "1s",
            // The test's resolver is on loopback, which `auto` never
            // declares: listed explicitly, as on a test node.
            "--dns-resolvers",
            "auto,127.0.4.53",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", DNS_NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    daemon.wait_log(
        "DNS answers teach domain addresses only from these resolvers",
        Duration::from_secs(5),
    );
    assert!(
        daemon
            .log()
            .iter()
            .any(|l| l.contains("only from these resolvers") && l.contains("127.0.4.53")),
        "the declared resolvers are logged"
    );
    let cgroup = pod.cgroup_id();
    wait_for(
        "the pod's set naming the domain",
        Duration::from_secs(20),
        || pinned_allow(&pins.join("egress"), cgroup).filter(|(_, d)| d.contains("allowed.test")),
    );

    assert!(
        resolves_and_connects(container, resolver_addr, "allowed.test", allowed),
        "the pod's own answer for allowed.test opens its address"
    );
    assert!(
        !resolves_and_connects(container, resolver_addr, "other.test", other),
        "an address answered for another name stays dropped"
    );
    assert!(
        !resolves_and_connects(container, resolver_addr, "watched.test", watched),
        "a name only a monitor policy names lifts no default deny"
    );
    // The monitor judged each address by the name the answer taught: the
    // domain's address is the deny's finding and not the allow's; the
    // other address (no policy names other.test) is the allow's default
    // deny; the watched name's address, learned for the monitor alone, is
    // the deny's finding too. The watched connect came last, so once its
    // finding is in the Report every earlier observation has been judged.
    let results = wait_for("the monitor findings", Duration::from_secs(30), || {
        let r = get_json(
            cluster,
            &["report", "kyverno-runtime-dns-web", "-n", DNS_NS],
        )?;
        let results = r["results"].as_array()?.clone();
        let has = |policy: &str, target: &str| {
            results
                .iter()
                .any(|x| x["policy"] == policy && x["properties"]["target"] == target)
        };
        (has("dns-watch-allow", &other.to_string())
            && has("dns-watch-deny", &allowed.to_string())
            && has("dns-watch-deny", &watched.to_string()))
        .then_some(results)
    });
    let by = |policy: &str| -> Vec<String> {
        results
            .iter()
            .filter(|x| x["policy"] == policy)
            .map(|x| {
                x["properties"]["target"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    println!(
        "monitor findings: dns-watch-allow {:?}, dns-watch-deny {:?}",
        by("dns-watch-allow"),
        by("dns-watch-deny")
    );
    assert!(
        !by("dns-watch-allow").contains(&allowed.to_string()),
        "allowed.test's own address is allowed by its name"
    );
    let mut denied = by("dns-watch-deny");
    denied.sort();
    assert_eq!(denied, [allowed.to_string(), watched.to_string()]);
    // The deny's results say which of its values each address matched as.
    let mut matched: Vec<(&str, &str)> = results
        .iter()
        .filter(|x| x["policy"] == "dns-watch-deny")
        .filter_map(|x| {
            Some((
                x["properties"]["target"].as_str()?,
                x["properties"]["matched"].as_str()?,
            ))
        })
        .collect();
    matched.sort();
    println!("dns-watch-deny matched: {matched:?}");
    assert_eq!(
        matched,
        [
            ("127.0.0.30", "allowed.test"),
            ("127.0.0.32", "watched.test")
        ],
        "{results:?}"
    );
    let text = wait_for(
        "the snooper's counters in /metrics",
        Duration::from_secs(20),
        || {
            let text = scrape(metrics)?;
            (series(
                &text,
                &[
                    "events_ingested_total",
                    "source=\"dnssnoop\"",
                    "kind=\"learned\"",
                ],
            )? >= 1)
                .then_some(text)
        },
    );
    for line in text.lines().filter(|l| l.contains("dnssnoop")) {
        println!("{line}");
    }
    assert_eq!(
        series(
            &text,
            &[
                "events_ingested_total",
                "source=\"dnssnoop\"",
                "kind=\"response\""
            ]
        ),
        Some(3)
    );
    assert_eq!(
        series(
            &text,
            &[
                "events_dropped_total",
                "source=\"dnssnoop\"",
                "reason=\"answer_unreadable\""
            ]
        ),
        Some(0)
    );
    // Each answer answered a question the pod asked the declared resolver.
    for (series_of, want) in [
        (
            [
                "events_ingested_total",
                "source=\"dnssnoop\"",
                "kind=\"question\"",
            ],
            3,
        ),
        (
            [
                "events_dropped_total",
                "source=\"dnssnoop\"",
                "reason=\"answer_unsolicited\"",
            ],
            0,
        ),
    ] {
        assert_eq!(series(&text, &series_of), Some(want), "{series_of:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    for p in ["dns-allow", "dns-watch-allow", "dns-watch-deny"] {
        let _ = cluster.kubectl_output(&["delete", "rpol", p]);
    }
    force_delete_pod(cluster, DNS_NS, "dns-web");
}
