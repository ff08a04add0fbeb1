//! The collector: N [`Source`]s → one bounded buffer → ordered [`Stage`]s →
//! N [`Sink`]s, all driven by [`Collector::run`].
//!
//! - **Never block a source.** The buffer is bounded in events; a batch
//!   that does not fit loses its newest events, counted as `buffer_full`
//!   against its source ([`Emitter::emit`]). A kernel ring buffer behind a
//!   blocked reader would lose records anyway, uncounted by us.
//! - **Stages run in order** and may annotate an event or drop it
//!   (returning `false`; the stage counts why). **Sinks** then see every
//!   event that survived, each guarded so that a panicking sink costs the
//!   others nothing.
//! - **Sources have a lifecycle** ([`SourceState`]): `Starting` until the
//!   source says it is usable ([`SourceContext::ready`]), `Available`, or
//!   `Failed` with a bounded reason. A source that fails (returns an error,
//!   or returns before shutdown) is restarted after a backoff that doubles
//!   from [`BACKOFF_START`] to [`BACKOFF_MAX`]; one whose constructor
//!   failed is [registered as failed](Collector::register_failed) and stays
//!   so until the daemon restarts. Status (`eventSources`) and metrics
//!   (`source_available`, `source_failures_total`) read these states.
//! - **Shutdown loses nothing it holds.** On stop each source is asked to
//!   return after a final drain, and the dispatch loop handles every
//!   buffered event before [`Collector::run`] returns.

use crate::event::Event;
use futures::future::BoxFuture;
use kyverno_runtime_metrics::{DropReason, Metrics, SourceFailureReason};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The first restart delay of a failed source.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// The longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A failure reason is cut to this many characters (it reaches status).
pub const REASON_MAX: usize = 256;
/// Default capacity of the buffer, in events.
pub const DEFAULT_CAPACITY: usize = 65_536;

/// Why a source's run ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct SourceError {
    /// What failed, as the operator reads it.
    pub reason: String,
}

impl SourceError {
    /// A source error saying `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        SourceError {
            reason: reason.into(),
        }
    }
}

/// A producer of events, run by the collector until shutdown.
///
/// `run` emits through its context and returns `Ok(())` once the context
/// says to stop (after a final drain), or an error when its reader failed;
/// the collector then restarts it after a backoff. Returning `Ok(())`
/// before the stop is a failure too (`UnexpectedExit`).
pub trait Source: Send + 'static {
    /// The source's name (`openexec-observe`, `exec-trace`,
    /// `egress-observe`, `dnsquery`): the metric label and the status
    /// entry.
    fn name(&self) -> &'static str;

    /// Produces events until `ctx` says to stop.
    fn run<'a>(&'a mut self, ctx: &'a SourceContext) -> BoxFuture<'a, Result<(), SourceError>>;
}

/// Annotates an event, or drops it (returns `false`, having counted why).
pub trait Stage: Send + Sync + 'static {
    /// The stage's name, for logs.
    fn name(&self) -> &'static str;

    /// Processes one event.
    fn process(&self, event: &mut Event) -> bool;
}

/// Consumes events that survived every stage. Must be fast; a panic is
/// contained and logged, never propagated.
pub trait Sink: Send + Sync + 'static {
    /// The sink's name, for logs.
    fn name(&self) -> &'static str;

    /// Handles one event.
    fn handle(&self, event: &Event);

    /// Called once after the last event, before [`Collector::run`] returns.
    fn finish(&self) {}
}

/// Where a source is in its lifecycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// Running (or about to), not yet usable.
    Starting,
    /// Usable: producing events (or quietly able to).
    Available,
    /// Failed; restarted after a backoff unless it never initialised.
    Failed {
        /// Why, as the metric labels it.
        kind: SourceFailureReason,
        /// Why, in words (at most [`REASON_MAX`] characters).
        reason: String,
    },
}

impl SourceState {
    /// Whether the source is usable.
    pub fn is_available(&self) -> bool {
        matches!(self, SourceState::Available)
    }
}

fn bounded(reason: &str) -> String {
    if reason.chars().count() <= REASON_MAX {
        return reason.to_string();
    }
    let mut s: String = reason.chars().take(REASON_MAX - 1).collect();
    s.push('…');
    s
}

/// Every source's state, shared with status and metrics.
#[derive(Clone, Default)]
pub struct SourceStates {
    inner: Arc<Mutex<BTreeMap<&'static str, SourceState>>>,
    metrics: Option<Arc<Metrics>>,
}

impl SourceStates {
    /// States mirrored into `metrics` (`source_available`,
    /// `source_failures_total`).
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        SourceStates {
            inner: Arc::default(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, SourceState>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets `source`'s state, counting a failure and logging a change.
    pub fn set(&self, source: &'static str, state: SourceState) {
        let previous = self.lock().insert(source, state.clone());
        if let Some(m) = &self.metrics {
            m.set_source_available(source, state.is_available());
            if let SourceState::Failed { kind, .. } = &state {
                m.source_failure(source, *kind);
            }
        }
        if previous.as_ref() != Some(&state) {
            match &state {
                SourceState::Failed { reason, kind } => {
                    tracing::warn!(source, ?kind, reason = %reason, "event source failed")
                }
                SourceState::Available => tracing::info!(source, "event source available"),
                SourceState::Starting => tracing::debug!(source, "event source starting"),
            }
        }
    }

    /// The state of `source`, if it is known.
    pub fn get(&self, source: &str) -> Option<SourceState> {
        self.lock().get(source).cloned()
    }

    /// Every source's state.
    pub fn all(&self) -> BTreeMap<&'static str, SourceState> {
        self.lock().clone()
    }
}

/// The buffer's input side: what sources emit into.
#[derive(Clone)]
pub struct Emitter {
    tx: mpsc::UnboundedSender<Vec<Event>>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    metrics: Option<Arc<Metrics>>,
}

impl Emitter {
    /// Queues `batch`; whatever does not fit is dropped (the newest first)
    /// and counted as `buffer_full` against `source`. Returns how many were
    /// queued. Never waits.
    pub fn emit(&self, source: &'static str, mut batch: Vec<Event>) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let want = batch.len();
        let mut taken = 0;
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                taken = want.min(self.capacity.saturating_sub(q));
                Some(q + taken)
            });
        let dropped = want - taken;
        if dropped > 0 {
            batch.truncate(taken);
            if let Some(m) = &self.metrics {
                m.events_dropped(source, DropReason::buffer_full, dropped as u64);
            }
        }
        if taken == 0 {
            return 0;
        }
        if self.tx.send(batch).is_err() {
            // The dispatch loop is gone (shutdown finished): nothing will
            // handle these; count them rather than pretend.
            self.queued.fetch_sub(taken, Ordering::AcqRel);
            if let Some(m) = &self.metrics {
                m.events_dropped(source, DropReason::shutdown, taken as u64);
            }
            return 0;
        }
        taken
    }

    /// Events queued and not yet handled.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// What a running source is handed.
pub struct SourceContext {
    name: &'static str,
    emitter: Emitter,
    states: SourceStates,
    stop: watch::Receiver<bool>,
    metrics: Option<Arc<Metrics>>,
}

impl SourceContext {
    /// The source's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Queues events (see [`Emitter::emit`]); counts them as ingested by
    /// kind.
    pub fn emit(&self, batch: Vec<Event>) {
        if let Some(m) = &self.metrics {
            for e in &batch {
                m.events_ingested(self.name, e.kind().as_str(), e.count);
            }
        }
        self.emitter.emit(self.name, batch);
    }

    /// The source is usable (its reader is set up, or its first poll
    /// succeeded).
    pub fn ready(&self) {
        if self.states.get(self.name) != Some(SourceState::Available) {
            self.states.set(self.name, SourceState::Available);
        }
    }

    /// Observations the kernel or the decoder lost, counted against this
    /// source.
    pub fn lost(&self, reason: DropReason, count: u64) {
        if count > 0 {
            if let Some(m) = &self.metrics {
                m.events_dropped(self.name, reason, count);
            }
        }
    }

    /// Whether shutdown was asked for.
    pub fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves once shutdown is asked for.
    pub async fn stopped(&self) {
        let mut rx = self.stop.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The pipeline; see the module docs.
pub struct Collector {
    sources: Vec<Box<dyn Source>>,
    stages: Vec<Arc<dyn Stage>>,
    sinks: Vec<Arc<dyn Sink>>,
    states: SourceStates,
    metrics: Option<Arc<Metrics>>,
    emitter: Emitter,
    rx: mpsc::UnboundedReceiver<Vec<Event>>,
    heartbeat: Option<Box<dyn Fn() + Send + Sync>>,
    backoff_start: Duration,
}

impl Collector {
    /// A collector whose buffer holds `capacity` events.
    pub fn new(capacity: usize, metrics: Option<Arc<Metrics>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let emitter = Emitter {
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            capacity: capacity.max(1),
            metrics: metrics.clone(),
        };
        Collector {
            sources: Vec::new(),
            stages: Vec::new(),
            sinks: Vec::new(),
            states: SourceStates::new(metrics.clone()),
            metrics,
            emitter,
            rx,
            heartbeat: None,
            backoff_start: BACKOFF_START,
        }
    }

    /// The states of every source (registered or added), for status.
    pub fn states(&self) -> SourceStates {
        self.states.clone()
    }

    /// The buffer's input, for a producer that is not a [`Source`].
    pub fn emitter(&self) -> Emitter {
        self.emitter.clone()
    }

    /// Adds a source; it starts with [`Collector::run`].
    pub fn add_source(&mut self, source: Box<dyn Source>) {
        self.states.set(source.name(), SourceState::Starting);
        self.sources.push(source);
    }

    /// Records a source whose constructor failed: `Failed` until the
    /// daemon restarts.
    pub fn register_failed(&mut self, name: &'static str, kind: SourceFailureReason, reason: &str) {
        self.states.set(
            name,
            SourceState::Failed {
                kind,
                reason: bounded(reason),
            },
        );
    }

    /// Appends a stage (stages run in insertion order).
    pub fn add_stage(&mut self, stage: Arc<dyn Stage>) {
        self.stages.push(stage);
    }

    /// Adds a sink.
    pub fn add_sink(&mut self, sink: Arc<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Called on every turn of the dispatch loop (the health check's
    /// collector heartbeat).
    pub fn on_heartbeat(&mut self, beat: impl Fn() + Send + Sync + 'static) {
        self.heartbeat = Some(Box::new(beat));
    }

    /// The first restart delay (tests shorten it).
    pub fn backoff_start(&mut self, delay: Duration) {
        self.backoff_start = delay;
    }

    /// Runs every source and the dispatch loop until `stop` turns true;
    /// then lets each source drain once more, handles every buffered event,
    /// and returns. It runs until `stop` even when no source runs (none
    /// was available on the node, or every one has ended): the daemon then
    /// stays up, serving status, `/metrics` and `/healthz` and saying why
    /// (issue 25), instead of ending and being restarted in a loop.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let Collector {
            sources,
            stages,
            sinks,
            states,
            metrics,
            emitter,
            mut rx,
            heartbeat,
            backoff_start,
        } = self;
        let mut tasks = tokio::task::JoinSet::new();
        for source in sources {
            tasks.spawn(supervise(
                source,
                emitter.clone(),
                states.clone(),
                stop.clone(),
                metrics.clone(),
                backoff_start,
            ));
        }
        let queued = Arc::clone(&emitter.queued);
        // The dispatch loop owns the receiver; our emitter is dropped once
        // the sources are done, so the channel closes when every producer
        // has finished.
        drop(emitter);
        let dispatch_stop = stop.clone();
        let dispatch = async {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Every producer gone: nothing more can arrive, but the loop
            // keeps beating until stop (see above).
            let mut closed = false;
            loop {
                tokio::select! {
                    batch = rx.recv(), if !closed => match batch {
                        Some(mut batch) => {
                            let n = batch.len();
                            dispatch(&stages, &sinks, &mut batch);
                            queued.fetch_sub(n, Ordering::AcqRel);
                        }
                        None => closed = true,
                    },
                    _ = tick.tick() => {}
                }
                if let Some(beat) = &heartbeat {
                    beat();
                }
                if closed && *dispatch_stop.borrow() {
                    break;
                }
            }
        };
        let sources_done = async { while tasks.join_next().await.is_some() {} };
        // Both run until the sources have stopped and every emitter clone
        // (theirs and any handed out) is gone.
        tokio::join!(dispatch, sources_done);
        for sink in &sinks {
            let name = sink.name();
            if std::panic::catch_unwind(AssertUnwindSafe(|| sink.finish())).is_err() {
                tracing::error!(sink = name, "an event sink panicked while finishing");
            }
        }
    }
}

/// Runs one batch through the stages, then the sinks.
pub fn dispatch(stages: &[Arc<dyn Stage>], sinks: &[Arc<dyn Sink>], batch: &mut [Event]) {
    'events: for event in batch.iter_mut() {
        for stage in stages {
            if !stage.process(event) {
                continue 'events;
            }
        }
        for sink in sinks {
            if std::panic::catch_unwind(AssertUnwindSafe(|| sink.handle(event))).is_err() {
                tracing::error!(
                    sink = sink.name(),
                    "an event sink panicked; the event is lost to it"
                );
            }
        }
    }
}

/// Runs `source` until stop, restarting it with backoff when it fails.
async fn supervise(
    mut source: Box<dyn Source>,
    emitter: Emitter,
    states: SourceStates,
    stop: watch::Receiver<bool>,
    metrics: Option<Arc<Metrics>>,
    backoff_start: Duration,
) {
    let name = source.name();
    let ctx = SourceContext {
        name,
        emitter,
        states: states.clone(),
        stop: stop.clone(),
        metrics,
    };
    let mut delay = backoff_start;
    loop {
        if ctx.stopping() {
            return;
        }
        states.set(name, SourceState::Starting);
        let started = tokio::time::Instant::now();
        let result = source.run(&ctx).await;
        if ctx.stopping() {
            if let Err(e) = result {
                tracing::warn!(source = name, error = %e, "event source failed while stopping");
            }
            return;
        }
        let (kind, reason) = match result {
            Ok(()) => (
                SourceFailureReason::UnexpectedExit,
                "returned before shutdown".to_string(),
            ),
            Err(e) => (SourceFailureReason::ReaderFailed, e.reason),
        };
        states.set(
            name,
            SourceState::Failed {
                kind,
                reason: bounded(&reason),
            },
        );
        // A source that ran well for a while starts its backoff afresh.
        if started.elapsed() > BACKOFF_MAX {
            delay = backoff_start;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = ctx.stopped() => return,
        }
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}
