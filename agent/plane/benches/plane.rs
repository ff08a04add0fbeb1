//! Events per second per core through the event plane: collector buffer,
//! attribution and the monitor, with 100 policies and 1,000 pods.
//!
//! `cargo bench -p kyverno-runtime-plane --bench plane`
//!
//! Two measurements, each on one thread (a current-thread runtime, so the
//! figure is per core):
//!
//! - **dispatch**: batches through the stages and sinks directly (what the
//!   collector's dispatch loop does per batch);
//! - **collector**: a source task emitting batches into a running
//!   [`Collector`], until the last event reached the sink (buffer, channel
//!   and scheduling included).
//!
//! The synthetic load: 1,000 pods of 2 containers each in 10 namespaces,
//! labelled with one of 20 apps; 100 policies (70 monitor, 30 enforce) each
//! selecting one app, spread over the five behaviors with 10 to 50 values
//! per list; events of every kind on random containers, 1 in 10 refused by
//! the kernel and about 1 in 8 a finding. Findings go to a counting sink.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_plane::collector::{
    dispatch, Collector, Sink, Source, SourceContext, SourceError, Stage,
};
use kyverno_runtime_plane::event::{Event, Facts, KernelVerdict, PodRef, ProcessInfo};
use kyverno_runtime_plane::monitor::{FindingSink, Monitor, MonitorPolicy};
use kyverno_runtime_plane::Index;
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_report::Finding;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PODS: usize = 1_000;
const POLICIES: usize = 100;
const APPS: usize = 20;
const BATCH: usize = 1_024;
const EVENTS: usize = 2_000_000;

#[derive(Default)]
struct Count(AtomicU64);

impl FindingSink for Count {
    fn submit(&self, _: Finding) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts every event that reached the sinks (the collector run's end).
#[derive(Default)]
struct Seen(AtomicU64);

impl Sink for Seen {
    fn name(&self) -> &'static str {
        "seen"
    }
    fn handle(&self, _: &Event) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn policy(i: usize) -> MonitorPolicy {
    let mode = if i % 10 < 7 { "monitor" } else { "enforce" };
    let n = 10 + (i * 7) % 41;
    let paths: Vec<String> = (0..n).map(|k| format!("/usr/bin/tool-{i}-{k}")).collect();
    let nets: Vec<String> = (0..n)
        .map(|k| format!("10.{}.{}.0/24", i % 250, k % 250))
        .collect();
    let behavior = match i % 5 {
        0 => {
            serde_json::json!({"exec": {"allow": {"values": ["/bin/sh", "/usr/bin/env"]}, "deny": {"values": paths}}})
        }
        1 => serde_json::json!({"open": {"deny": {"values": paths}}}),
        2 => serde_json::json!({"network": {"allow": {"values": nets}, "deny": {"values": ["*"]}}}),
        3 => serde_json::json!({"protocol": {"deny": {"values": ["ssh", "quic"]}}}),
        _ => {
            if mode == "monitor" {
                serde_json::json!({"dns": {"allow": {"values": ["*.svc.cluster.local", "*.example.com"]}}})
            } else {
                serde_json::json!({"exec": {"deny": {"values": paths}}})
            }
        }
    };
    let spec = serde_json::json!({
        "mode": mode,
        "podSelector": {"matchLabels": {"app": format!("app-{}", i % APPS)}},
        "behaviors": [behavior],
    });
    let rp: RuntimePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
        "metadata": {"name": format!("p{i}")}, "spec": spec,
    }))
    .unwrap();
    let c = CompiledPolicy::compile(&rp.spec).unwrap();
    let e = c.evaluate().unwrap();
    MonitorPolicy::new(
        format!("p{i}"),
        format!("uid-{i}"),
        c.mode,
        c.target.clone(),
        &e,
        Vec::new(),
    )
}

/// The stages, the sinks, and the findings counter of a loaded plane.
type Plane = (Vec<Arc<dyn Stage>>, Vec<Arc<dyn Sink>>, Arc<Count>);

fn plane() -> Plane {
    let index = Arc::new(Index::new(None, "/proc", None));
    for p in 0..PODS {
        index.upsert(PodRef {
            namespace: format!("ns-{}", p % 10),
            name: format!("pod-{p}"),
            uid: format!("00000000-0000-0000-0000-{p:012}"),
            labels: BTreeMap::from([("app".into(), format!("app-{}", p % APPS))]),
            owner_kind: Some("Deployment".into()),
            owner_name: Some(format!("app-{}", p % APPS)),
            containers: BTreeMap::from([
                (1_000 + 2 * p as u64, "app".into()),
                (1_001 + 2 * p as u64, "sidecar".into()),
            ]),
            container_ids: BTreeMap::from([
                ("app".into(), format!("containerd://app-{p}")),
                ("sidecar".into(), format!("containerd://sidecar-{p}")),
            ]),
            node_name: "node-1".into(),
            service_account: format!("app-{}", p % APPS),
            version: 0,
        });
    }
    let count = Arc::new(Count::default());
    let monitor = Arc::new(Monitor::new(vec![count.clone()], None));
    for ns in 0..10 {
        monitor.set_namespace(&format!("ns-{ns}"), BTreeMap::new());
    }
    for i in 0..POLICIES {
        monitor.set_policy(policy(i));
    }
    (vec![index], vec![monitor], count)
}

fn events(n: usize, seed: u64) -> Vec<Event> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let pod = rng.below(PODS);
            let cgroup = 1_000 + 2 * pod as u64 + (rng.next() & 1);
            let policy = pod % APPS + APPS * rng.below(POLICIES / APPS);
            let hit = rng.below(8) == 0;
            let facts = match rng.below(5) {
                0 => Facts::Exec {
                    filename: if hit {
                        format!("/usr/bin/tool-{policy}-3")
                    } else {
                        "/bin/sh".into()
                    },
                    argv: vec!["sh".into(), "-c".into(), "true".into()],
                },
                1 => Facts::Open {
                    path: if hit {
                        format!("/usr/bin/tool-{policy}-1")
                    } else {
                        "/etc/hosts".into()
                    },
                },
                2 => Facts::Net {
                    dest: IpAddr::V4(Ipv4Addr::new(
                        10,
                        (policy % 250) as u8,
                        if hit { 251 } else { 2 },
                        7,
                    )),
                    port: None,
                    names: Vec::new(),
                },
                3 => Facts::Protocol {
                    protocol: if hit { "ssh" } else { "tls" },
                    alpn: None,
                },
                _ => Facts::Dns {
                    qname: if hit {
                        "evil.test".into()
                    } else {
                        "api.example.com".into()
                    },
                },
            };
            let mut e = Event::new("bench", facts);
            e.cgroup = Some(cgroup);
            if rng.below(10) == 0 {
                e.kernel = Some(KernelVerdict::Denied);
                e.process = Some(ProcessInfo {
                    pid: 4242,
                    comm: "sh".into(),
                });
            }
            e
        })
        .collect()
}

struct Replay {
    batches: Vec<Vec<Event>>,
}

impl Source for Replay {
    fn name(&self) -> &'static str {
        "bench"
    }
    fn run<'a>(
        &'a mut self,
        ctx: &'a SourceContext,
    ) -> futures::future::BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            ctx.ready();
            for b in self.batches.drain(..) {
                ctx.emit(b);
                // Let the dispatch loop run, as a real source does between
                // reads.
                tokio::task::yield_now().await;
            }
            ctx.stopped().await;
            Ok(())
        })
    }
}

fn main() {
    let (stages, sinks, count) = plane();
    let input = events(EVENTS, 0x9e37_79b9_7f4a_7c15);

    // Warm the selection cache and the allocator once.
    let mut warm: Vec<Event> = input[..50_000].to_vec();
    dispatch(&stages, &sinks, &mut warm);

    let mut rounds = Vec::new();
    for _ in 0..3 {
        let mut batches: Vec<Vec<Event>> = input.chunks(BATCH).map(<[Event]>::to_vec).collect();
        let before = count.0.load(Ordering::Relaxed);
        let start = Instant::now();
        for b in &mut batches {
            dispatch(&stages, &sinks, b);
        }
        let took = start.elapsed();
        rounds.push((took, count.0.load(Ordering::Relaxed) - before));
    }
    rounds.sort();
    let (took, findings) = rounds[1];
    let dispatch_rate = EVENTS as f64 / took.as_secs_f64();
    println!(
        "dispatch (attribution + monitor): {EVENTS} events in {took:?} (median of 3): {:.2} M events/s/core, {findings} findings",
        dispatch_rate / 1e6
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rates = Vec::new();
    for _ in 0..3 {
        let batches: Vec<Vec<Event>> = input.chunks(BATCH).map(<[Event]>::to_vec).collect();
        let mut collector = Collector::new(1 << 20, None);
        for s in &stages {
            collector.add_stage(s.clone());
        }
        for s in &sinks {
            collector.add_sink(s.clone());
        }
        collector.add_source(Box::new(Replay { batches }));
        let seen = Arc::new(Seen::default());
        collector.add_sink(seen.clone());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let took = runtime.block_on(async move {
            let start = Instant::now();
            let run = tokio::spawn(collector.run(stop_rx));
            // Done once every event reached the sinks.
            while seen.0.load(Ordering::Relaxed) < EVENTS as u64 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            let took = start.elapsed();
            let _ = stop_tx.send(true);
            let _ = run.await;
            took
        });
        rates.push(EVENTS as f64 / took.as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let collector_rate = rates[1];
    println!(
        "collector (buffer + attribution + monitor, one thread): {:.2} M events/s/core (median of 3)",
        collector_rate / 1e6
    );
    println!(
        "goal 1.00 M events/s/core: dispatch {:.2}x, collector {:.2}x the goal",
        dispatch_rate / 1e6,
        collector_rate / 1e6
    );
}
