//! The daemon's side: [`PushSink`] streams findings to a collector.
//!
//! # Delivery
//!
//! At most once, in order, every loss counted. [`PushHandle::submit`]
//! redacts the finding and queues its wire message (bounded, oldest dropped
//! on overflow: [`PushDrop::QueueFull`]); [`PushSink::run`] connects, opens
//! a `Report` stream when there is something to send, and feeds it from the
//! queue in order.
//!
//! A stream does not live forever: it is closed after
//! [`PushConfig::stream_max_findings`] findings or
//! [`PushConfig::stream_max_age`] after its first one, and the next stream
//! opens on the same connection when more findings wait. The collector's
//! [`Ack`](crate::proto::Ack) then says how many of the stream's findings it
//! accepted, which is the only delivery confirmation gRPC client streaming
//! offers. That bounds what a broken stream leaves unconfirmed: the findings
//! of a stream that breaks (or stalls, or is acknowledged short) are counted
//! as [`PushDrop::SendFailed`], at most one stream's worth. They are not
//! re-queued: some of them may have arrived, and a resend would be a
//! duplicate nothing downstream can tell from a new occurrence.
//!
//! # Reconnecting
//!
//! A failed connection or stream is retried after a backoff of
//! [`backoff_initial`](PushConfig::backoff_initial) (5 s) doubling to
//! [`backoff_max`](PushConfig::backoff_max) (60 s), so a collector that is
//! gone rather than restarting does not become fleet-wide connection churn.
//! The backoff resets when a stream is acknowledged: under TLS 1.3 a client
//! learns that the collector refused its certificate only after its own
//! handshake has finished, so a connection that merely opened proves
//! nothing. A stream that has findings to take (or an acknowledgement to
//! wait for) and makes no progress for
//! [`stall_timeout`](PushConfig::stall_timeout) counts as broken: a
//! collector that accepts a stream and stops reading holds its flow-control
//! window shut forever, and HTTP/2 keepalive does not notice because the
//! connection itself is healthy.
//!
//! # Shutdown
//!
//! When the shutdown future completes, the open stream takes whatever is
//! queued and closes (or a last connection is made for it), bounded by
//! [`shutdown_deadline`](PushConfig::shutdown_deadline). When the deadline
//! passes first (typically a collector that stopped reading), the
//! connection is closed out from under the blocked stream, and its
//! unconfirmed findings ([`PushDrop::SendFailed`]) and everything still
//! queued ([`PushDrop::Shutdown`]) are counted.

use crate::abort::{Abortable, Connections};
use crate::error::{Error, Result};
use crate::proto;
use crate::proto::finding_collector_client::FindingCollectorClient;
use crate::queue::{self, DropHook, Pop, PushDrop, Queue, Tally};
use crate::tls::{Identity, Target};
use futures::Stream;
use hyper_util::rt::TokioIo;
use kyverno_runtime_report::{sanitize, Finding};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};
use tonic::codegen::http::Uri;
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint};

/// How a [`PushSink`] reaches its collector, and its limits.
///
/// [`PushConfig::new`] fills in the defaults below; every field is public so
/// a caller (or a test) can change one.
#[derive(Clone, Debug)]
pub struct PushConfig {
    /// The collector, `HOST:PORT` (`[ADDRESS]:PORT` for IPv6). The host is
    /// also the name the collector's certificate must carry.
    pub target: String,
    /// The CA certificate(s) that sign the collector's certificate (PEM).
    /// Only these are trusted; system roots are not.
    pub ca: PathBuf,
    /// The daemon's client certificate chain (PEM).
    pub cert: PathBuf,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// This node's name, sent with every finding.
    pub node: String,
    /// How many findings may wait; on overflow the oldest is dropped.
    pub queue_capacity: usize,
    /// The first reconnect delay.
    pub backoff_initial: Duration,
    /// The largest reconnect delay (the delay doubles up to it).
    pub backoff_max: Duration,
    /// How long shutdown may take to drain the queue into the stream.
    pub shutdown_deadline: Duration,
    /// A stream is closed (and its acknowledgement awaited) after this many
    /// findings.
    pub stream_max_findings: u64,
    /// A stream is closed this long after it carried its first finding.
    pub stream_max_age: Duration,
    /// A stream with work to do and no progress for this long is broken.
    pub stall_timeout: Duration,
    /// The bound on TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
}

impl PushConfig {
    /// The spec's queue bound.
    pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;
    /// The spec's first reconnect delay.
    pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(5);
    /// The spec's reconnect delay cap.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
    /// Short enough for a DaemonSet rollout (the default termination grace
    /// is 30 s and other components flush too), long enough to drain a
    /// full queue to a healthy collector.
    pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);
    /// At most this many findings are unconfirmed when a stream breaks.
    pub const DEFAULT_STREAM_MAX_FINDINGS: u64 = 1024;
    /// At most this much time's findings are unconfirmed when a stream
    /// breaks; also how often a busy stream is confirmed.
    pub const DEFAULT_STREAM_MAX_AGE: Duration = Duration::from_secs(10);
    /// Longer than any healthy pause in a collector's reading.
    pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
    /// A collector that has not answered a connection in this long is not
    /// going to.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A configuration with the default limits.
    pub fn new(
        target: impl Into<String>,
        ca: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        node: impl Into<String>,
    ) -> PushConfig {
        PushConfig {
            target: target.into(),
            ca: ca.into(),
            cert: cert.into(),
            key: key.into(),
            node: node.into(),
            queue_capacity: Self::DEFAULT_QUEUE_CAPACITY,
            backoff_initial: Self::DEFAULT_BACKOFF_INITIAL,
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
            shutdown_deadline: Self::DEFAULT_SHUTDOWN_DEADLINE,
            stream_max_findings: Self::DEFAULT_STREAM_MAX_FINDINGS,
            stream_max_age: Self::DEFAULT_STREAM_MAX_AGE,
            stall_timeout: Self::DEFAULT_STALL_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |field, reason| Err(Error::Config { field, reason });
        if self.node.trim().is_empty() {
            return bad("node", "is empty");
        }
        if self.queue_capacity == 0 {
            return bad("queue_capacity", "must be at least 1");
        }
        if self.backoff_initial.is_zero() {
            return bad("backoff_initial", "must be more than zero");
        }
        if self.backoff_max < self.backoff_initial {
            return bad("backoff_max", "must be at least backoff_initial");
        }
        if self.stream_max_findings == 0 {
            return bad("stream_max_findings", "must be at least 1");
        }
        for (field, value) in [
            ("stream_max_age", self.stream_max_age),
            ("stall_timeout", self.stall_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return bad(field, "must be more than zero");
            }
        }
        Ok(())
    }
}

/// The limits the run loop needs, split from the paths it does not.
#[derive(Clone, Copy, Debug)]
struct Limits {
    backoff_initial: Duration,
    backoff_max: Duration,
    shutdown_deadline: Duration,
    stream_max_findings: u64,
    stream_max_age: Duration,
    stall_timeout: Duration,
}

/// What went wrong with the collector, for [`PushHandle::failures`].
#[derive(Default)]
struct Health {
    failures: AtomicU64,
    last_failure: Mutex<Option<String>>,
}

/// The gRPC push sink: a send queue and the loop that streams it to the
/// collector over mutual TLS. Build it with [`PushSink::new`], give
/// [`PushSink::handle`]s to the producers, and drive [`PushSink::run`] in
/// the daemon's task group.
pub struct PushSink {
    handle: PushHandle,
    limits: Limits,
    endpoint: Endpoint,
    tls: tokio_rustls::TlsConnector,
    target: Arc<Target>,
    /// The target as configured, for logs.
    target_name: String,
}

impl std::fmt::Debug for PushSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSink")
            .field("target", &self.target_name)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The producers' side of a [`PushSink`]: cheap to clone, never blocks.
#[derive(Clone)]
pub struct PushHandle {
    queue: Arc<Queue>,
    node: Arc<str>,
    health: Arc<Health>,
}

impl std::fmt::Debug for PushHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushHandle")
            .field("node", &self.node)
            .field("queued", &self.queued())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl PushHandle {
    /// Queues a finding for the collector, redacted first
    /// ([`Finding::redact`]), so what waits in the queue is already
    /// scrubbed. Never blocks: when the queue is full the oldest finding is
    /// dropped and counted ([`PushDrop::QueueFull`]); after the sink has
    /// stopped the finding is counted as [`PushDrop::Shutdown`].
    pub fn submit(&self, finding: Finding) {
        self.queue
            .push(crate::wire::encode(finding.redact(), &self.node));
    }

    /// How many findings wait to be sent.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// How many findings were lost, for every reason.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped_total()
    }

    /// How many findings were lost for one reason.
    pub fn dropped_by(&self, reason: PushDrop) -> u64 {
        self.queue.dropped(reason)
    }

    /// How many findings the collector acknowledged.
    pub fn delivered(&self) -> u64 {
        self.queue.delivered()
    }

    /// How many connection attempts and streams failed.
    pub fn failures(&self) -> u64 {
        self.health.failures.load(Ordering::Relaxed)
    }

    /// The last failure, with its causes, for diagnostics.
    pub fn last_failure(&self) -> Option<String> {
        self.health
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl PushSink {
    /// Reads and checks the TLS files and the configuration. Fails naming
    /// the file when the CA, the certificate or the key is missing,
    /// unreadable or malformed, or when the key does not match the
    /// certificate: a daemon must not start with a sink that can never
    /// connect. Connects nothing yet.
    ///
    /// `on_drop` is told about every loss as it is counted (see
    /// [`DropHook`]).
    pub fn new(config: PushConfig, on_drop: Option<DropHook>) -> Result<PushSink> {
        config.check()?;
        let target = Target::parse(&config.target)?;
        let tls = Identity::load(&config.ca, &config.cert, &config.key)?.client_config()?;
        // The URI only names the authority for HTTP/2's `:authority`; the
        // connector dials the target and does TLS itself. Its scheme is
        // `http` so that tonic never tries to add TLS of its own (it would
        // refuse an `https` URI if another crate in the build enabled its
        // TLS feature, having no configuration for it).
        let endpoint = Endpoint::from_shared(format!("http://{}", config.target))
            .map_err(|_| Error::Target {
                target: config.target.clone(),
                reason: "not a valid URI authority",
            })?
            .connect_timeout(config.connect_timeout)
            // Notices a collector host that vanished without closing the
            // connection; a stream that is merely blocked is the stall
            // timeout's job.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        Ok(PushSink {
            handle: PushHandle {
                queue: Arc::new(Queue::new(config.queue_capacity, on_drop)),
                // The node name is ours, not the kernel's, but it rides the
                // same wire: it passes the same chokepoint.
                node: sanitize(&config.node).into(),
                health: Arc::default(),
            },
            limits: Limits {
                backoff_initial: config.backoff_initial,
                backoff_max: config.backoff_max,
                shutdown_deadline: config.shutdown_deadline,
                stream_max_findings: config.stream_max_findings,
                stream_max_age: config.stream_max_age,
                stall_timeout: config.stall_timeout,
            },
            endpoint,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            target: Arc::new(target),
            target_name: config.target,
        })
    }

    /// A producers' handle.
    pub fn handle(&self) -> PushHandle {
        self.handle.clone()
    }

    /// How many findings wait to be sent.
    pub fn queued(&self) -> usize {
        self.handle.queued()
    }

    /// How many findings were lost, for every reason.
    pub fn dropped(&self) -> u64 {
        self.handle.dropped()
    }

    /// Streams the queue to the collector until `shutdown` completes, then
    /// drains it within the shutdown deadline (see the [module
    /// docs](self)). Returns once everything queued was sent or counted as
    /// lost; findings submitted afterwards are counted as
    /// [`PushDrop::Shutdown`].
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let queue = &self.handle.queue;
        let mut backoff = Backoff::new(self.limits.backoff_initial, self.limits.backoff_max);
        let mut link: Option<Link> = None;
        // Set when shutdown begins: the end of the drain.
        let mut deadline: Option<Instant> = None;
        loop {
            // A stream is opened only when there is something to send, so
            // an idle node holds no stream open on the collector.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = queue.until_nonempty() => {}
            }
            let current = match link.take() {
                Some(current) => current,
                None => {
                    let connected = tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        connected = self.connect() => connected,
                    };
                    match connected {
                        Ok(current) => current,
                        Err(e) => {
                            let wait = backoff.next();
                            self.failed(
                                "connecting to the collector failed",
                                &causes(&e),
                                Some(wait),
                            );
                            tokio::select! {
                                biased;
                                () = &mut shutdown => break,
                                () = sleep(wait) => continue,
                            }
                        }
                    }
                }
            };
            match self.stream(&current, &mut shutdown, &mut deadline).await {
                End::Acked => {
                    backoff.reset();
                    link = Some(current);
                }
                End::Failed(e) => {
                    drop(current);
                    if deadline.is_some() {
                        self.failed("the stream failed while draining", &e.describe(), None);
                        break;
                    }
                    let wait = backoff.next();
                    self.failed(
                        "the stream to the collector failed",
                        &e.describe(),
                        Some(wait),
                    );
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = sleep(wait) => {}
                    }
                }
                End::Deadline => {
                    drop(current);
                    break;
                }
            }
            if deadline.is_some() {
                break;
            }
        }
        self.drain(link, deadline).await;
        queue.close();
        tracing::info!(
            delivered = queue.delivered(),
            dropped = queue.dropped_total(),
            "push sink stopped"
        );
    }

    /// The end of the run: what is queued goes out on the open link (or a
    /// last connection) until the deadline.
    async fn drain(&self, mut link: Option<Link>, deadline: Option<Instant>) {
        let queue = &self.handle.queue;
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.limits.shutdown_deadline);
        let mut armed = Some(deadline);
        queue.begin_drain();
        while queue.len() > 0 && Instant::now() < deadline {
            let current = match link.take() {
                Some(current) => current,
                None => match timeout_at(deadline, self.connect()).await {
                    Ok(Ok(current)) => current,
                    Ok(Err(e)) => {
                        self.failed("connecting to drain the queue failed", &causes(&e), None);
                        return;
                    }
                    Err(_) => {
                        tracing::warn!("the shutdown deadline passed while connecting");
                        return;
                    }
                },
            };
            match self
                .stream(&current, &mut std::future::pending(), &mut armed)
                .await
            {
                End::Acked => link = Some(current),
                End::Failed(e) => {
                    self.failed("the stream failed while draining", &e.describe(), None);
                    return;
                }
                End::Deadline => return,
            }
        }
    }

    /// A new connection (a channel of one HTTP/2 connection that this sink
    /// can close).
    async fn connect(&self) -> std::result::Result<Link, tonic::transport::Error> {
        let conns = Arc::new(Connections::default());
        let connector = Connector {
            tls: self.tls.clone(),
            target: self.target.clone(),
            conns: conns.clone(),
        };
        let channel = self.endpoint.connect_with_connector(connector).await?;
        Ok(Link { channel, conns })
    }

    /// One `Report` stream, from opening to its acknowledgement (or its
    /// failure). Arms `deadline` when `stop` completes first; ends at it.
    async fn stream(
        &self,
        link: &Link,
        stop: &mut (impl Future<Output = ()> + Unpin),
        deadline: &mut Option<Instant>,
    ) -> End {
        let queue = &self.handle.queue;
        let tally = queue::tally();
        let progress = Arc::new(Progress::default());
        let outgoing = outgoing(queue.clone(), tally.clone(), progress.clone(), self.limits);
        let mut client = FindingCollectorClient::new(link.channel.clone());
        let mut call = pin!(client.report(outgoing));
        let mut watchdog = Watchdog::new(self.limits.stall_timeout);
        loop {
            tokio::select! {
                biased;
                result = &mut call => return self.settle(result, &tally, link),
                () = &mut *stop, if deadline.is_none() => {
                    *deadline = Some(Instant::now() + self.limits.shutdown_deadline);
                    queue.begin_drain();
                }
                () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let unconfirmed = queue.cancel(&tally);
                    queue.lost(PushDrop::SendFailed, unconfirmed);
                    tracing::warn!(
                        unconfirmed,
                        queued = queue.len(),
                        "the shutdown deadline passed with the stream blocked; closing it"
                    );
                    return End::Deadline;
                }
                () = watchdog.tick(), if deadline.is_none() => {
                    let waiting = progress.closed() || queue.len() > 0;
                    if watchdog.stalled(waiting, progress.count()) {
                        let unconfirmed = queue.cancel(&tally);
                        queue.lost(PushDrop::SendFailed, unconfirmed);
                        return End::Failed(Failure {
                            error: Box::new(Stalled(self.limits.stall_timeout)),
                            connection: None,
                        });
                    }
                }
            }
        }
    }

    /// Counts a finished stream: what the collector acknowledged was
    /// delivered, the rest of what the stream took is lost.
    fn settle(
        &self,
        result: std::result::Result<tonic::Response<proto::Ack>, tonic::Status>,
        tally: &Tally,
        link: &Link,
    ) -> End {
        let queue = &self.handle.queue;
        // Nothing more can be taken by this stream from here on, so `sent`
        // is final.
        let sent = queue.cancel(tally);
        match result {
            Ok(ack) => {
                let received = ack.into_inner().received.min(sent);
                queue.acknowledged(received);
                if received < sent {
                    tracing::warn!(
                        sent,
                        received,
                        "the collector acknowledged fewer findings than the stream carried"
                    );
                    queue.lost(PushDrop::SendFailed, sent - received);
                }
                End::Acked
            }
            Err(status) => {
                queue.lost(PushDrop::SendFailed, sent);
                End::Failed(Failure {
                    error: Box::new(StreamFailed(status)),
                    connection: link.conns.last_error(),
                })
            }
        }
    }

    fn failed(&self, what: &'static str, why: &str, retry_in: Option<Duration>) {
        let message = format!("{what}: {why}");
        let health = &self.handle.health;
        health.failures.fetch_add(1, Ordering::Relaxed);
        match retry_in {
            Some(wait) => tracing::warn!(
                collector = %self.target_name,
                retry_in = ?wait,
                error = %message,
                "push sink: retrying after a failure"
            ),
            None => tracing::warn!(
                collector = %self.target_name,
                error = %message,
                "push sink: a failure while shutting down"
            ),
        }
        *health
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(message);
    }
}

/// An error and its sources, `: `-separated (a tonic transport error says
/// little more than "transport error" until its causes are read).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        // Wrappers often repeat their cause's message.
        if !out.ends_with(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = e.source();
    }
    out
}

/// How a stream ended.
enum End {
    /// The collector acknowledged it.
    Acked,
    /// It broke, was refused, or stalled.
    Failed(Failure),
    /// The shutdown deadline passed first.
    Deadline,
}

/// Why a stream failed.
struct Failure {
    error: Box<dyn std::error::Error + Send + Sync>,
    /// The last I/O error of the stream's connection: hyper reports a
    /// connection that failed under a request as "connection closed", and
    /// the reason (a TLS alert such as a refused client certificate) is
    /// only here.
    connection: Option<String>,
}

impl Failure {
    fn describe(&self) -> String {
        let mut out = causes(&*self.error);
        if let Some(connection) = &self.connection {
            if !out.contains(connection.as_str()) {
                out.push_str("; the connection failed with: ");
                out.push_str(connection);
            }
        }
        out
    }
}

/// A stream that ended in a gRPC status.
#[derive(Debug)]
struct StreamFailed(tonic::Status);

impl std::fmt::Display for StreamFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `Debug` of the code is its name (`Unavailable`); the `Display` of
        // a whole `Status` repeats its source and metadata.
        write!(f, "{:?}: {}", self.0.code(), self.0.message())
    }
}

impl std::error::Error for StreamFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// A stream that made no progress.
#[derive(Debug, thiserror::Error)]
#[error("no progress for {0:?} with findings waiting (the collector stopped reading)")]
struct Stalled(Duration);

/// One channel and the connections under it; dropping it closes them, so a
/// stream abandoned after a stall or at the deadline does not live on in
/// hyper's tasks.
struct Link {
    channel: Channel,
    conns: Arc<Connections>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.conns.abort_all();
    }
}

/// Dials the target and does the TLS handshake, for tonic's channel.
#[derive(Clone)]
struct Connector {
    tls: tokio_rustls::TlsConnector,
    target: Arc<Target>,
    conns: Arc<Connections>,
}

type Conn = TokioIo<Abortable<tokio_rustls::client::TlsStream<TcpStream>>>;

impl Service<Uri> for Connector {
    type Response = Conn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.target.host.as_str(), this.target.port)).await?;
            // Findings are small and each should leave when produced.
            tcp.set_nodelay(true)?;
            let tls = this
                .tls
                .connect(this.target.server_name.clone(), tcp)
                .await?;
            Ok(TokioIo::new(Abortable::new(tls, this.conns.track())))
        })
    }
}

/// What a stream did, for the stall watchdog.
#[derive(Default)]
struct Progress {
    /// Findings taken plus the end of the stream: any change is progress.
    count: AtomicU64,
    /// The stream ended its side and waits for the acknowledgement.
    closed: AtomicBool,
}

impl Progress {
    fn step(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.step();
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Decides that a stream stalled: it was waiting (findings queued, or its
/// acknowledgement due) at every check for a whole `stall_timeout` without
/// any progress. Checks four times per timeout, so a stall is noticed
/// within 1.25 timeouts and a pause that just ended is never one.
struct Watchdog {
    interval: tokio::time::Interval,
    timeout: Duration,
    last_count: u64,
    since: Instant,
}

impl Watchdog {
    fn new(timeout: Duration) -> Watchdog {
        let period = (timeout / 4).max(Duration::from_millis(10));
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Watchdog {
            interval,
            timeout,
            last_count: 0,
            since: Instant::now(),
        }
    }

    async fn tick(&mut self) {
        self.interval.tick().await;
    }

    fn stalled(&mut self, waiting: bool, count: u64) -> bool {
        let now = Instant::now();
        if !waiting || count != self.last_count {
            self.last_count = count;
            self.since = now;
            return false;
        }
        now.duration_since(self.since) >= self.timeout
    }
}

/// The request stream of one `Report` call: findings from the queue, in
/// order, until the stream's limits (or, when draining, until the queue is
/// empty).
fn outgoing(
    queue: Arc<Queue>,
    tally: Arc<Tally>,
    progress: Arc<Progress>,
    limits: Limits,
) -> impl Stream<Item = proto::Finding> + Send + 'static {
    let state = (queue, tally, progress, None::<Instant>);
    futures::stream::unfold(
        state,
        move |(queue, tally, progress, mut close_at)| async move {
            let next = next_finding(&queue, &tally, &progress, limits, &mut close_at).await;
            next.map(|finding| (finding, (queue, tally, progress, close_at)))
        },
    )
}

async fn next_finding(
    queue: &Queue,
    tally: &Tally,
    progress: &Progress,
    limits: Limits,
    close_at: &mut Option<Instant>,
) -> Option<proto::Finding> {
    loop {
        let mut changed = pin!(queue.changed());
        changed.as_mut().enable();
        // Shutdown drains everything into this stream, whatever its limits.
        let rotate = !queue.draining()
            && (tally.sent() >= limits.stream_max_findings
                || close_at.is_some_and(|at| Instant::now() >= at));
        if rotate {
            progress.close();
            return None;
        }
        match queue.pop_for(tally) {
            Pop::Item(finding) => {
                progress.step();
                close_at.get_or_insert_with(|| Instant::now() + limits.stream_max_age);
                return Some(finding);
            }
            Pop::Cancelled => return None,
            Pop::Empty { draining: true } => {
                progress.close();
                return None;
            }
            Pop::Empty { draining: false } => match *close_at {
                Some(at) => {
                    tokio::select! {
                        () = changed => {}
                        () = sleep_until(at) => {}
                    }
                }
                None => changed.await,
            },
        }
    }
}

/// Reconnect delays: `initial`, doubling, capped at `max`.
#[derive(Debug)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = self.next.checked_mul(2).unwrap_or(self.max).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(60));
        let seq: Vec<u64> = (0..7).map(|_| b.next().as_secs()).collect();
        assert_eq!(seq, [5, 10, 20, 40, 60, 60, 60]);
        b.reset();
        assert_eq!(b.next().as_secs(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_needs_a_whole_timeout_of_waiting_without_progress() {
        let mut w = Watchdog::new(Duration::from_secs(4));
        // Idle (nothing to send) is never a stall.
        for _ in 0..10 {
            w.tick().await;
            assert!(!w.stalled(false, 0));
        }
        // Waiting from now on, with no progress: a stall after 4 s.
        let start = Instant::now();
        loop {
            w.tick().await;
            if w.stalled(true, 0) {
                break;
            }
        }
        assert!(start.elapsed() >= Duration::from_secs(4));
        // Progress resets it.
        w.tick().await;
        assert!(!w.stalled(true, 1));
    }

    #[test]
    fn bad_configuration_is_refused_before_any_file_is_read() {
        let base = PushConfig::new(
            "h:1",
            "/nonexistent/ca",
            "/nonexistent/c",
            "/nonexistent/k",
            "n",
        );
        type Change = fn(&mut PushConfig);
        let cases: [(Change, &str); 4] = [
            (|c| c.queue_capacity = 0, "queue_capacity"),
            (|c| c.node = " ".into(), "node"),
            (|c| c.backoff_max = Duration::from_secs(1), "backoff_max"),
            (|c| c.stall_timeout = Duration::ZERO, "stall_timeout"),
        ];
        for (change, field) in cases {
            let mut c = base.clone();
            change(&mut c);
            let err = PushSink::new(c, None).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        let mut c = base;
        c.target = "no-port".into();
        assert!(matches!(PushSink::new(c, None), Err(Error::Target { .. })));
    }
}
