//! A real scrape of `/metrics` and `/healthz` over loopback, parsed by an
//! independent Prometheus text-format parser.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_metrics::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every series the specification lists, as a scraper sees it.
const SERIES: [&str; 10] = [
    "nirmata_runtime_events_ingested_total",
    "nirmata_runtime_events_dropped_total",
    "nirmata_runtime_attribution_misses_total",
    "nirmata_runtime_findings_emitted_total",
    "nirmata_runtime_monitor_filter_eval_errors_total",
    "nirmata_runtime_report_writes_total",
    "nirmata_runtime_source_available",
    "nirmata_runtime_source_failures_total",
    "nirmata_runtime_bpf_program_run_time_seconds_total",
    "nirmata_runtime_bpf_program_runs_total",
];

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn value(v: &prometheus_parse::Value) -> f64 {
    match v {
        prometheus_parse::Value::Counter(x)
        | prometheus_parse::Value::Gauge(x)
        | prometheus_parse::Value::Untyped(x) => *x,
        other => panic!("unexpected sample kind {other:?}"),
    }
}

fn populated() -> Arc<Metrics> {
    let m = Arc::new(Metrics::new());
    m.events_ingested("exec-trace", "exec", 3);
    m.events_dropped("collector", DropReason::buffer_full, 2);
    m.events_dropped("dnsquery", DropReason::name_unreadable, 1);
    m.attribution_miss();
    m.finding_emitted("deny-shell", "exec");
    m.monitor_filter_eval_error("watch-curl", "only-curl");
    m.report_write(ReportWriteResult::success);
    m.set_source_available("dnsquery", true);
    m.source_failure("exec-trace", SourceFailureReason::ReaderFailed);
    m.bpf_program_ran("egress_filter", 1_500, 3);
    m.status_write_failed("throttled");
    m.status_write_failed("throttled");
    m.status_write_failed("unreachable");
    m.event_write(EventWriteResult::created);
    m.event_write_failed(EventWriteFailure::forbidden);
    m.events_dropped("events", DropReason::pod_budget, 3);
    m
}

async fn start(
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        Some("127.0.0.1:0".parse().unwrap()),
        metrics,
        health,
        move |addr| {
            let _ = bound_tx.send(addr);
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    (bound_rx.await.unwrap(), stop_tx)
}

#[tokio::test]
async fn a_scrape_parses_and_holds_every_listed_series() {
    let health = Arc::new(Health::new(Duration::from_secs(60)));
    let (addr, _stop) = start(populated(), health).await;
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    for series in SERIES {
        assert!(
            scrape.samples.iter().any(|s| s.metric == series),
            "{series} missing from:\n{body}"
        );
    }
    let dropped: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "nirmata_runtime_events_dropped_total")
        .map(|s| {
            (
                s.labels.get("source").unwrap().to_string(),
                s.labels.get("reason").unwrap().to_string(),
                value(&s.value),
            )
        })
        .collect();
    assert!(
        dropped.contains(&("collector".into(), "buffer_full".into(), 2.0)),
        "{dropped:?}"
    );
    let runtime = scrape
        .samples
        .iter()
        .find(|s| s.metric == "nirmata_runtime_bpf_program_run_time_seconds_total")
        .unwrap();
    assert_eq!(value(&runtime.value), 1.5e-6);
    // OpenMetrics declares a counter's family without `_total`; this parser
    // then reads its samples as untyped, so the declared types are checked here.
    for family in [
        "events_ingested",
        "events_dropped",
        "attribution_misses",
        "source_failures",
        "bpf_program_runs",
    ] {
        assert!(
            body.contains(&format!("# TYPE nirmata_runtime_{family} counter")),
            "{family}"
        );
    }
    assert!(body.contains("# TYPE nirmata_runtime_source_available gauge"));
    // Failed status writes, by reason (issue 38).
    let failed: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "nirmata_runtime_status_writes_failed_total")
        .map(|s| (s.labels.get("reason").unwrap().to_string(), value(&s.value)))
        .collect();
    assert!(failed.contains(&("throttled".into(), 2.0)), "{failed:?}");
    assert!(failed.contains(&("unreachable".into(), 1.0)), "{failed:?}");
    assert!(body.contains("# TYPE nirmata_runtime_status_writes_failed counter"));
    // Kubernetes Event writes, by result and by failure reason, and the
    // Events a budget left out (issue 38).
    let sample = |metric: &str, label: &str| -> Vec<(String, f64)> {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .map(|s| (s.labels.get(label).unwrap().to_string(), value(&s.value)))
            .collect()
    };
    assert_eq!(
        sample("nirmata_runtime_event_writes_total", "result"),
        [("created".to_string(), 1.0)]
    );
    assert_eq!(
        sample("nirmata_runtime_event_writes_failed_total", "reason"),
        [("forbidden".to_string(), 1.0)]
    );
    assert!(
        dropped.contains(&("events".into(), "pod_budget".into(), 3.0)),
        "{dropped:?}"
    );
    for family in ["event_writes", "event_writes_failed"] {
        assert!(
            body.contains(&format!("# TYPE nirmata_runtime_{family} counter")),
            "{family}"
        );
    }
}

/// A manual monotonic clock: the test moves time, so a stall is proven
/// without sleeping through one (and cannot flake on a slow machine).
#[derive(Clone)]
struct ManualClock(Arc<Mutex<Instant>>);

impl ManualClock {
    fn new() -> Self {
        ManualClock(Arc::new(Mutex::new(Instant::now())))
    }
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
    fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }
}

#[tokio::test]
async fn healthz_fails_until_synced_and_while_the_collector_is_stalled() {
    let clock = ManualClock::new();
    let health = Arc::new(Health::with_clock(Duration::from_secs(30), {
        let clock = clock.clone();
        move || clock.now()
    }));
    let (addr, _stop) = start(Arc::new(Metrics::new()), health.clone()).await;
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("has not synced"), "{body}");

    health.set_policies_synced();
    health.collector_tick();
    assert_eq!(get(addr, "/healthz").await.0, 200);

    // The heartbeat advances within the window: still healthy.
    clock.advance(Duration::from_secs(25));
    health.collector_tick();
    clock.advance(Duration::from_secs(25));
    assert_eq!(get(addr, "/healthz").await.0, 200);

    // The collector loop stops ticking past the window: unhealthy.
    clock.advance(Duration::from_secs(10));
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(
        body.contains("collector loop has not ticked for 35s"),
        "{body}"
    );

    // It resumes: healthy again.
    health.collector_tick();
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 200, "{body}");
}

#[test]
fn bpf_program_stats_advance_by_the_kernels_cumulative_numbers() {
    let m = Metrics::new();
    let sample = |program: &str| {
        let body = m.encode();
        let scrape =
            prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
        let find = |metric: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == metric && s.labels.get("program") == Some(program))
                .map(|s| value(&s.value))
        };
        // Seconds as f64 sums: compared in whole nanoseconds.
        (
            find("nirmata_runtime_bpf_program_run_time_seconds_total").map(|s| (s * 1e9).round()),
            find("nirmata_runtime_bpf_program_runs_total"),
        )
    };
    // Two per-pod egress filters share a name: the metric is their sum.
    m.record_bpf_program_stats([
        ("egress_filter", 1_000, 2),
        ("egress_filter", 3_000, 4),
        ("open_dispatcher", 0, 0),
    ]);
    assert_eq!(sample("egress_filter"), (Some(4_000.0), Some(6.0)));
    assert_eq!(
        sample("open_dispatcher"),
        (Some(0.0), Some(0.0)),
        "exported even while the kernel counts nothing"
    );
    // Cumulative again: only the difference is added.
    m.record_bpf_program_stats([("egress_filter", 10_000, 10)]);
    assert_eq!(sample("egress_filter"), (Some(10_000.0), Some(10.0)));
    // The program was reloaded: its kernel counters restarted from zero.
    m.record_bpf_program_stats([("egress_filter", 500, 1)]);
    assert_eq!(sample("egress_filter"), (Some(10_500.0), Some(11.0)));
}

#[tokio::test]
async fn an_empty_address_serves_nothing_but_keeps_counting() {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(Duration::from_secs(60)));
    let mut bound = false;
    serve(None, metrics.clone(), health, |_| bound = true, async {})
        .await
        .unwrap();
    assert!(!bound);
    metrics.attribution_miss();
    assert!(metrics
        .encode()
        .contains("nirmata_runtime_attribution_misses_total 1"));
}
