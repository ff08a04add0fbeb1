//! A real scrape of `/metrics` and `/healthz` over loopback, parsed by an
//! independent Prometheus text-format parser.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_metrics::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
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
}

#[tokio::test]
async fn healthz_fails_until_synced_and_while_the_collector_is_stalled() {
    let health = Arc::new(Health::new(Duration::from_millis(200)));
    let (addr, _stop) = start(Arc::new(Metrics::new()), health.clone()).await;
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("has not synced"), "{body}");

    health.set_policies_synced();
    health.collector_tick();
    assert_eq!(get(addr, "/healthz").await.0, 200);

    // The collector loop stops ticking: unhealthy once the threshold passes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("collector loop has not ticked"), "{body}");
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
