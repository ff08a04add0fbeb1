//! The collector's bookkeeping: the bounded buffer, stage order, sinks, the
//! sources' lifecycle and restarts, and shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::future::BoxFuture;
use kyverno_runtime_metrics::{Metrics, SourceFailureReason};
use kyverno_runtime_plane::collector::{
    dispatch, Collector, Sink, Source, SourceContext, SourceError, SourceState, Stage,
};
use kyverno_runtime_plane::event::{Event, Facts};
use kyverno_runtime_plane::sources::{PollSource, Polled};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

fn open(path: &str) -> Event {
    Event::new("test", Facts::Open { path: path.into() })
}

fn path(e: &Event) -> String {
    match &e.facts {
        Facts::Open { path } => path.clone(),
        _ => String::new(),
    }
}

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
    finished: AtomicUsize,
}

impl Sink for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn handle(&self, event: &Event) {
        self.seen.lock().unwrap().push(path(event));
    }
    fn finish(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }
}

struct Panics;

impl Sink for Panics {
    fn name(&self) -> &'static str {
        "panics"
    }
    fn handle(&self, event: &Event) {
        if path(event).contains("boom") {
            panic!("a sink bug");
        }
    }
}

/// Appends its tag to the path; drops paths containing `drop`.
struct Tag(&'static str);

impl Stage for Tag {
    fn name(&self) -> &'static str {
        self.0
    }
    fn process(&self, event: &mut Event) -> bool {
        if let Facts::Open { path } = &mut event.facts {
            if path.contains("drop") {
                return false;
            }
            path.push_str(self.0);
        }
        true
    }
}

#[test]
fn stages_run_in_order_every_sink_sees_survivors_and_a_panic_is_contained() {
    let rec = Arc::new(Recorder::default());
    let stages: Vec<Arc<dyn Stage>> = vec![Arc::new(Tag("-a")), Arc::new(Tag("-b"))];
    let sinks: Vec<Arc<dyn Sink>> = vec![Arc::new(Panics), rec.clone()];
    let mut batch = vec![open("/x"), open("/drop-me"), open("/boom"), open("/y")];
    dispatch(&stages, &sinks, &mut batch);
    assert_eq!(
        *rec.seen.lock().unwrap(),
        ["/x-a-b", "/boom-a-b", "/y-a-b"],
        "the stages ran in order, the dropped event reached no sink, and the panicking sink cost the other nothing"
    );
}

/// Emits `batches` one per run and then waits for stop.
struct Burst {
    batches: Vec<Vec<Event>>,
}

impl Source for Burst {
    fn name(&self) -> &'static str {
        "burst"
    }
    fn run<'a>(&'a mut self, ctx: &'a SourceContext) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            ctx.ready();
            for b in self.batches.drain(..) {
                ctx.emit(b);
            }
            ctx.stopped().await;
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_full_buffer_drops_the_newest_and_counts_them() {
    let metrics = Arc::new(Metrics::new());
    // Nothing drains while the source emits (the dispatch loop is not
    // running yet): build the emitter's view directly.
    let collector = Collector::new(3, Some(metrics.clone()));
    let emitter = collector.emitter();
    let queued = emitter.emit("burst", vec![open("/1"), open("/2")]);
    assert_eq!(queued, 2);
    let queued = emitter.emit("burst", vec![open("/3"), open("/4"), open("/5")]);
    assert_eq!(queued, 1, "one slot was left");
    assert_eq!(emitter.queued(), 3);
    let text = metrics.encode();
    assert!(
        text.contains(
            r#"nirmata_runtime_events_dropped_total{source="burst",reason="buffer_full"} 2"#
        ),
        "{text}"
    );
    drop(emitter);

    let rec = Arc::new(Recorder::default());
    let mut collector = collector;
    collector.add_sink(rec.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    stop_tx.send(true).unwrap();
    collector.run(stop_rx).await;
    assert_eq!(
        *rec.seen.lock().unwrap(),
        ["/1", "/2", "/3"],
        "the newest were dropped, the rest delivered before run returned"
    );
    assert_eq!(rec.finished.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_event_emitted_before_stop_is_delivered() {
    let rec = Arc::new(Recorder::default());
    let mut collector = Collector::new(1024, None);
    collector.add_sink(rec.clone());
    collector.add_source(Box::new(Burst {
        batches: vec![vec![open("/a"), open("/b")], vec![open("/c")]],
    }));
    let states = collector.states();
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));
    tokio::time::timeout(Duration::from_secs(5), async {
        while states.get("burst") != Some(SourceState::Available) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert_eq!(*rec.seen.lock().unwrap(), ["/a", "/b", "/c"]);
}

#[tokio::test(start_paused = true)]
async fn with_no_source_it_runs_and_beats_until_stop() {
    // A node where no event source could start (issue 25: the daemon then
    // ended and crash-looped): the collector keeps beating, so /healthz
    // stays live, and returns only at stop.
    let beats = Arc::new(AtomicUsize::new(0));
    let mut collector = Collector::new(16, None);
    let counted = beats.clone();
    collector.on_heartbeat(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!run.is_finished(), "it ended with no source and no stop");
    assert!(beats.load(Ordering::SeqCst) >= 30, "the heartbeat stopped");
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("it returns at stop")
        .unwrap();
}

/// Fails its first `fail` runs, then runs until stop.
struct Flaky {
    runs: Arc<AtomicUsize>,
    fail: usize,
    exit_early: bool,
}

impl Source for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn run<'a>(&'a mut self, ctx: &'a SourceContext) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let n = self.runs.fetch_add(1, Ordering::SeqCst);
            if n < self.fail {
                if self.exit_early {
                    return Ok(());
                }
                return Err(SourceError::new(format!("reader failed on run {n}")));
            }
            ctx.ready();
            ctx.stopped().await;
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_source_is_restarted_with_a_doubling_backoff_and_its_failures_counted() {
    let metrics = Arc::new(Metrics::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut collector = Collector::new(16, Some(metrics.clone()));
    collector.add_source(Box::new(Flaky {
        runs: runs.clone(),
        fail: 3,
        exit_early: false,
    }));
    let states = collector.states();
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));

    // Run 0 fails at once; the restarts wait 1 s, then 2 s, then 4 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        states.get("flaky"),
        Some(SourceState::Failed {
            kind: SourceFailureReason::ReaderFailed,
            reason: "reader failed on run 0".into()
        })
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "restarted after 1 s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "not yet: the second wait is 2 s"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(states.get("flaky"), Some(SourceState::Available));
    let text = metrics.encode();
    assert!(
        text.contains(
            r#"nirmata_runtime_source_failures_total{source="flaky",reason="ReaderFailed"} 3"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"nirmata_runtime_source_available{source="flaky"} 1"#),
        "{text}"
    );
    stop_tx.send(true).unwrap();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_source_returning_before_shutdown_is_an_unexpected_exit() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut collector = Collector::new(16, None);
    collector.add_source(Box::new(Flaky {
        runs: runs.clone(),
        fail: 1,
        exit_early: true,
    }));
    let states = collector.states();
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        states.get("flaky"),
        Some(SourceState::Failed {
            kind: SourceFailureReason::UnexpectedExit,
            ..
        })
    ));
    stop_tx.send(true).unwrap();
    run.await.unwrap();
}

#[test]
fn a_constructor_failure_is_registered_with_a_bounded_reason() {
    let metrics = Arc::new(Metrics::new());
    let mut collector = Collector::new(16, Some(metrics.clone()));
    collector.register_failed(
        "exec-trace",
        SourceFailureReason::InitializationFailed,
        &"x".repeat(1000),
    );
    let Some(SourceState::Failed { kind, reason }) = collector.states().get("exec-trace") else {
        panic!("not failed");
    };
    assert_eq!(kind, SourceFailureReason::InitializationFailed);
    assert_eq!(reason.chars().count(), 256);
    assert!(metrics
        .encode()
        .contains(r#"nirmata_runtime_source_available{source="exec-trace"} 0"#));
}

#[tokio::test(start_paused = true)]
async fn a_poll_source_is_ready_after_its_first_poll_and_polls_once_more_at_stop() {
    let polls = Arc::new(AtomicUsize::new(0));
    let counter = polls.clone();
    let rec = Arc::new(Recorder::default());
    let mut collector = Collector::new(64, None);
    collector.add_sink(rec.clone());
    collector.add_source(Box::new(PollSource::new(
        "poller",
        Duration::from_secs(10),
        move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            Ok(Polled {
                events: vec![open(&format!("/poll-{n}"))],
                lost: Vec::new(),
            })
        },
    )));
    let states = collector.states();
    assert_eq!(states.get("poller"), Some(SourceState::Starting));
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(states.get("poller"), Some(SourceState::Available));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(polls.load(Ordering::SeqCst), 2);
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert_eq!(polls.load(Ordering::SeqCst), 3, "a final poll at stop");
    assert_eq!(*rec.seen.lock().unwrap(), ["/poll-0", "/poll-1", "/poll-2"]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_poll_fails_the_source() {
    let mut collector = Collector::new(64, None);
    collector.add_source(Box::new(PollSource::new(
        "broken",
        Duration::from_secs(10),
        || Err(SourceError::new("map lookup failed: EPERM")),
    )));
    let states = collector.states();
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = tokio::spawn(collector.run(stop_rx));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        states.get("broken"),
        Some(SourceState::Failed {
            kind: SourceFailureReason::ReaderFailed,
            reason: "map lookup failed: EPERM".into()
        })
    );
    stop_tx.send(true).unwrap();
    run.await.unwrap();
}
