//! Fault tier (issue 34, item 3): the daemon SIGKILLed while it programs
//! a policy update of 10,000 entries, and restarted.
//!
//! An enforce policy denies 10,000 addresses read from a data source (a
//! loopback list server): list A, `127.16.0.0 + 0..10,000`. The source
//! then serves list B, `+ 5,000..15,000`, and the daemon re-evaluates and
//! rewrites the pod's set: 5,000 entries to add, 5,000 to remove, 5,000 in
//! both. The daemon is SIGKILLed at several points of that rewrite (as
//! soon as its first new entry is seen in the kernel, half-way, and once
//! every new entry is in but old ones remain), then started again on the
//! same pins. Throughout, from before the edit to after the restarted
//! daemon converged, a reader checks the pinned maps themselves
//! (`cgroup_filters`, `egress_hosts`): the pod's cgroup keeps its set, and
//! every address both lists deny is denied at every scan; a connect loop
//! in the pod's cgroup to one of them never connects. After each restart
//! the set holds exactly list B (no stale entry, no missing one, nothing
//! in the prefix tries, no other set left behind), which is what the
//! specification's rule (#32's reference model) gives for one policy with
//! one deny list: the list itself.
//!
//! One row per kill point: what the kernel held when the daemon died, the
//! longest gap (asserted 0), the time from restart to exactly B.
//!
//! Needs root (cgroup v2, bpffs, cgroup_skb) and the local control plane
//! (`ci/kube-up`); run by `ci/faults` and `ci/test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::faults::ConnectLoop;
use common::host::HostPod;
use common::*;
use libbpf_rs::{MapCore as _, MapFlags, MapHandle};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODE: &str = "faults-kill-node";
const NS: &str = "faults-kill";
const POLICY: &str = "faults-kill";
/// Entries in each list.
const N: u32 = 10_000;
/// How far list B is shifted from list A.
const SHIFT: u32 = 5_000;
/// `krt_egress_domain_verdict`'s deny bit and `krt_egress_family`'s IPv4.
const DENY_BIT: u32 = 1 << 1;
const IPV4: u32 = 4;

/// The `i`th address of the lists.
fn addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 16, 0, 0)) + i)
}

/// The list server's body for entries `from..from + N`.
fn list(from: u32) -> String {
    let cidrs: Vec<String> = (from..from + N)
        .map(|i| format!("\"{}/32\"", addr(i)))
        .collect();
    format!("{{\"cidrs\": [{}]}}", cidrs.join(","))
}

/// An `egress_hosts` key: set id, family, address (`krt_egress_host_key`).
fn host_key(set: u32, ip: Ipv4Addr) -> Vec<u8> {
    let mut key = Vec::with_capacity(24);
    key.extend_from_slice(&set.to_ne_bytes());
    key.extend_from_slice(&IPV4.to_ne_bytes());
    key.extend_from_slice(&ip.octets());
    key.extend_from_slice(&[0; 12]);
    key
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// The pinned maps the reader checks, opened by path (they outlive every
/// daemon process: the test reads them across the kill).
struct Kernel {
    cgroups: MapHandle,
    hosts: MapHandle,
    tries: Vec<MapHandle>,
    cgroup_id: u64,
}

impl Kernel {
    fn open(pins: &Path, cgroup_id: u64) -> Kernel {
        let maps = pins.join("egress").join("maps");
        let open = |name: &str| MapHandle::from_pinned_path(maps.join(name)).unwrap();
        Kernel {
            cgroups: open("cgroup_filters"),
            hosts: open("egress_hosts"),
            tries: ["allow_v4", "deny_v4", "allow_v6", "deny_v6"]
                .iter()
                .map(|n| open(n))
                .collect(),
            cgroup_id,
        }
    }

    /// The pod's set id, if its cgroup is programmed.
    fn set(&self) -> Option<u32> {
        let value = self
            .cgroups
            .lookup(&self.cgroup_id.to_ne_bytes(), MapFlags::ANY)
            .unwrap()?;
        Some(u32_at(&value, 0))
    }

    /// Whether `set` denies `ip` (a host entry with the deny bit).
    fn denies(&self, set: u32, ip: Ipv4Addr) -> bool {
        self.hosts
            .lookup(&host_key(set, ip), MapFlags::ANY)
            .unwrap()
            .is_some_and(|v| u32_at(&v, 0) & DENY_BIT != 0)
    }

    /// How many of entries `range` `set` denies.
    fn denied_in(&self, set: u32, range: std::ops::Range<u32>) -> usize {
        range.filter(|i| self.denies(set, addr(*i))).count()
    }

    /// Every host entry of every set: (set, address, verdict bits). Read
    /// only when no daemon writes (a hash walk under writes may skip keys).
    fn all_hosts(&self) -> Vec<(u32, Ipv4Addr, u32)> {
        self.hosts
            .keys()
            .filter_map(|key| {
                let value = self.hosts.lookup(&key, MapFlags::ANY).ok()??;
                let ip = Ipv4Addr::new(key[8], key[9], key[10], key[11]);
                Some((u32_at(&key, 0), ip, u32_at(&value, 0)))
            })
            .collect()
    }

    fn trie_entries(&self) -> usize {
        self.tries.iter().map(|t| t.keys().count()).sum()
    }
}

/// What the reader saw since it started.
#[derive(Default)]
struct Seen {
    scans: u64,
    /// Scans discarded because the pod's set changed during them.
    set_changes: u64,
    /// Broken invariants: how many, and the first few with when.
    broken: u64,
    violations: Vec<String>,
    /// The latest scan's counts: old-only entries denied, new-only ones.
    old_only: usize,
    new_only: usize,
}

/// A thread checking, scan after scan, that the pod's cgroup has a set
/// and that set denies every address both lists deny.
struct Reader {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(pins: &Path, cgroup_id: u64) -> Reader {
        let kernel = Kernel::open(pins, cgroup_id);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, halt) = (seen.clone(), stop.clone());
        let started = Instant::now();
        let broke = |seen: &mut Seen, what: String| {
            seen.broken += 1;
            if seen.violations.len() < 20 {
                seen.violations.push(what);
            }
        };
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                let Some(set) = kernel.set() else {
                    let what = format!(
                        "{:.3?}: the pod's cgroup has no set (everything passes)",
                        started.elapsed()
                    );
                    broke(&mut sink.lock().unwrap(), what);
                    continue;
                };
                let missing: Vec<u32> = (SHIFT..N)
                    .filter(|i| !kernel.denies(set, addr(*i)))
                    .collect();
                let old_only = kernel.denied_in(set, 0..SHIFT);
                let new_only = kernel.denied_in(set, N..N + SHIFT);
                let mut seen = sink.lock().unwrap();
                if kernel.set() != Some(set) {
                    seen.set_changes += 1;
                    continue;
                }
                seen.scans += 1;
                if !missing.is_empty() {
                    let what = format!(
                        "{:.3?}: {} addresses both lists deny not denied (first {})",
                        started.elapsed(),
                        missing.len(),
                        addr(missing[0])
                    );
                    broke(&mut seen, what);
                }
                seen.old_only = old_only;
                seen.new_only = new_only;
            }
        });
        Reader {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The latest counts (old-only, new-only) after a scan that starts
    /// from now.
    fn counts(&self) -> (usize, usize) {
        let from = self.seen.lock().unwrap().scans;
        wait_for("a fresh scan", Duration::from_secs(10), || {
            let seen = self.seen.lock().unwrap();
            (seen.scans >= from + 2).then_some((seen.old_only, seen.new_only))
        })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the pod's set denies exactly list `from..from + N` as far
/// as the reader's counts tell; returns how long it took.
fn converged(reader: &Reader, new: bool, within: Duration) -> Duration {
    let start = Instant::now();
    let want = if new {
        (0, SHIFT as usize)
    } else {
        (SHIFT as usize, 0)
    };
    wait_for("the set to converge", within, || {
        (reader.counts() == want).then_some(())
    });
    start.elapsed()
}

/// Exactly list B in the kernel: every host entry of every set is B's
/// address with the deny bit alone, each once, in the pod's set; the
/// prefix tries are empty.
fn assert_exactly_b(kernel: &Kernel) {
    let set = kernel.set().expect("the pod's set");
    let hosts = kernel.all_hosts();
    let want: BTreeSet<Ipv4Addr> = (SHIFT..SHIFT + N).map(addr).collect();
    let stale: Vec<_> = hosts
        .iter()
        .filter(|(s, ip, v)| *s != set || !want.contains(ip) || *v != DENY_BIT)
        .take(5)
        .collect();
    assert!(stale.is_empty(), "stale host entries: {stale:?}");
    let have: BTreeSet<Ipv4Addr> = hosts.iter().map(|(_, ip, _)| *ip).collect();
    assert_eq!(hosts.len(), want.len(), "duplicate or missing host entries");
    let missing: Vec<_> = want.difference(&have).take(5).collect();
    assert!(missing.is_empty(), "missing entries: {missing:?}");
    assert_eq!(kernel.trie_entries(), 0, "entries left in the prefix tries");
}

/// Where in the rewrite to kill the daemon, judged from sampled entries
/// (every 100th old-only and new-only address: a check takes about a
/// hundred lookups, so it can land inside a rewrite of milliseconds).
#[derive(Clone, Copy)]
enum KillPoint {
    /// Some new entries in, every old one still there.
    Adding,
    /// Every new entry in, some old ones removed, most left.
    Removing,
    /// Every new entry in, most old ones removed, some left.
    LateRemoving,
}

impl KillPoint {
    fn name(self) -> &'static str {
        match self {
            KillPoint::Adding => "adding the new entries",
            KillPoint::Removing => "removing the old entries",
            KillPoint::LateRemoving => "removing the last old entries",
        }
    }

    /// Waits for the point in `kernel`; false if the rewrite went past it
    /// between two checks.
    fn reached(self, kernel: &Kernel, within: Duration) -> bool {
        let start = Instant::now();
        let sample = |range: std::ops::Range<u32>, set: u32| {
            range
                .step_by(100)
                .filter(|i| kernel.denies(set, addr(*i)))
                .count()
        };
        let total = (SHIFT as usize).div_ceil(100);
        while start.elapsed() < within {
            let Some(set) = kernel.set() else { continue };
            let new = sample(N..N + SHIFT, set);
            let old = sample(0..SHIFT, set);
            match self {
                KillPoint::Adding if new > 0 && old == total => return true,
                KillPoint::Removing if new == total && old > total / 2 && old < total => {
                    return true
                }
                KillPoint::LateRemoving if new == total && old > 0 && old <= total / 2 => {
                    return true
                }
                _ if new == total && old == 0 => return false,
                _ => {}
            }
        }
        panic!("the rewrite did not start within {within:?}");
    }
}

struct Row {
    point: &'static str,
    tries: usize,
    at_kill: (usize, usize),
    gap: f64,
    leaked: usize,
    samples: usize,
    restart_to_exact: Duration,
}

#[test]
fn a_daemon_killed_mid_update_leaves_old_or_new_and_its_successor_converges_exactly() {
    let cluster = cluster();
    let dir = tempdir();
    namespace(cluster, NS, "team: faults-kill");
    let server = ListServer::start(&list(0));
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
    force_delete_pod(cluster, NS, "kill-web");
    let id = "6b".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "kill-web",
        NODE,
        &format!("app: {POLICY}"),
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);

    // One address both lists deny, and one neither does, for the loop.
    let both = std::net::TcpListener::bind((addr(N - 1), 0)).unwrap();
    let neither = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (both_addr, neither_addr) = (both.local_addr().unwrap(), neither.local_addr().unwrap());
    for l in [&both, &neither] {
        let l = l.try_clone().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                drop(c)
            }
        });
    }

    let mut daemon = host_daemon(cluster, NODE, &pod, "");
    daemon.wait_log("pods on this node listed", Duration::from_secs(60));
    wait_for("list A in the kernel", Duration::from_secs(60), || {
        pod.pins()
            .join("egress/maps/egress_hosts")
            .exists()
            .then_some(())
    });
    let kernel = Kernel::open(&pod.pins(), pod.cgroup_id());
    wait_for("list A in the pod's set", Duration::from_secs(60), || {
        let set = kernel.set()?;
        (kernel.denied_in(set, 0..N) == N as usize).then_some(())
    });
    let reader = Reader::start(&pod.pins(), pod.cgroup_id());
    converged(&reader, false, Duration::from_secs(10));
    println!("list A ({N} entries) in the kernel");
    let connects = ConnectLoop::start(&pod.container, both_addr, neither_addr);

    let mut rows = Vec::new();
    for point in [
        KillPoint::Adding,
        KillPoint::Removing,
        KillPoint::LateRemoving,
    ] {
        let from = connects.len();
        println!("kill point: {}", point.name());
        // A rewrite may finish between two checks: try again from list A.
        let mut tries = 0;
        let edit = loop {
            tries += 1;
            assert!(tries <= 8, "{}: never caught in 8 rewrites", point.name());
            server.serve(&list(SHIFT));
            let edit = Instant::now();
            if point.reached(&kernel, Duration::from_secs(60)) {
                break edit;
            }
            println!("  the rewrite went past it between two checks; again");
            server.serve(&list(0));
            converged(&reader, false, Duration::from_secs(60));
        };
        drop(daemon); // SIGKILL, and reaped
        let killed = Instant::now();
        let at_kill = reader.counts();
        println!(
            "  killed {:.1?} after the edit; the kernel held {} of {SHIFT} old-only and {} of {SHIFT} new-only entries",
            killed - edit,
            at_kill.0,
            at_kill.1
        );
        // The pins alone, a few scans long: still old or new per value.
        std::thread::sleep(Duration::from_secs(1));
        daemon = host_daemon(cluster, NODE, &pod, "");
        let restarted = Instant::now();
        converged(&reader, true, Duration::from_secs(120));
        let restart_to_exact = restarted.elapsed();
        assert_exactly_b(&kernel);
        println!("  restarted: exactly list B after {restart_to_exact:.1?}");
        let (leaked, _, samples, gap) = connects.since(from);
        rows.push(Row {
            point: point.name(),
            tries,
            at_kill,
            gap,
            leaked,
            samples,
            restart_to_exact,
        });
        // Back to list A for the next point.
        server.serve(&list(0));
        converged(&reader, false, Duration::from_secs(60));
    }
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    // The shared control plane serves later tiers: leave no policy whose
    // data source is gone.
    cluster.kubectl_ok(&["delete", "rpol", POLICY]).unwrap();
    let seen = reader.seen.lock().unwrap();
    let (scans, set_changes, broken) = (seen.scans, seen.set_changes, seen.broken);
    let violations = seen.violations.clone();
    drop(seen);
    drop(reader);

    println!();
    println!(
        "| killed while | rewrites tried | kernel at the kill (old-only / new-only of {SHIFT}) | longest gap | denied connected (of connects) | restart to exactly B |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} / {} | {:.1} s | {} (of {}) | {:.1} s |",
            r.point,
            r.tries,
            r.at_kill.0,
            r.at_kill.1,
            r.gap,
            r.leaked,
            r.samples,
            r.restart_to_exact.as_secs_f64()
        );
    }
    println!(
        "reader: {scans} scans of the {} addresses both lists deny, {broken} broken; {set_changes} discarded as the set changed",
        N - SHIFT
    );
    assert!(status.success(), "{}", log.join("\n"));
    assert_eq!(broken, 0, "{violations:#?}");
    assert!(scans > 0);
    for r in &rows {
        assert_eq!(r.leaked, 0, "{}: a denied address connected", r.point);
        assert!(r.gap == 0.0, "{}: a gap of {} s", r.point, r.gap);
    }
    let cgroup = pod.container.clone();
    drop(connects);
    let _ = common::faults::wait_for_ok(Duration::from_secs(5), || {
        std::fs::read_to_string(cgroup.join("cgroup.procs"))
            .ok()
            .filter(|p| p.trim().is_empty())
    });
    drop(pod);
}
