//! The two source shapes: [`PollSource`] over counters a drain reads and
//! resets, and [`RingSource`] over a kernel ring buffer read as records
//! arrive.
//!
//! A ring buffer source needs no thread of its own: libbpf's epoll
//! instance over the ring is registered with the async runtime, which
//! wakes the source when the kernel signals new records. A timer drains it
//! as well (once a second), so a wakeup lost between a drain and the next
//! wait costs at most that second, never the records.

use crate::collector::{Source, SourceContext, SourceError};
use crate::event::Event;
use futures::future::BoxFuture;
use kyverno_runtime_bpf::ring::RecordReader;
use kyverno_runtime_metrics::DropReason;
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What one poll read: events, and observations the kernel lost since the
/// previous poll (by reason).
#[derive(Debug, Default)]
pub struct Polled {
    /// The events.
    pub events: Vec<Event>,
    /// Losses since the previous poll.
    pub lost: Vec<(DropReason, u64)>,
}

/// A source that polls counters every `interval`. Ready after its first
/// successful poll (an empty one included); a failed poll fails the source
/// (the collector restarts it). On stop it polls once more, so the last
/// window is not lost.
pub struct PollSource<F> {
    name: &'static str,
    interval: Duration,
    poll: F,
}

impl<F> PollSource<F>
where
    F: FnMut() -> Result<Polled, SourceError> + Send + 'static,
{
    /// A source named `name` calling `poll` every `interval`.
    pub fn new(name: &'static str, interval: Duration, poll: F) -> Self {
        PollSource {
            name,
            interval,
            poll,
        }
    }

    fn poll_once(&mut self, ctx: &SourceContext) -> Result<(), SourceError> {
        let polled = (self.poll)()?;
        ctx.ready();
        for (reason, n) in polled.lost {
            ctx.lost(reason, n);
        }
        ctx.emit(polled.events);
        Ok(())
    }
}

impl<F> Source for PollSource<F>
where
    F: FnMut() -> Result<Polled, SourceError> + Send + 'static,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn run<'a>(&'a mut self, ctx: &'a SourceContext) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let mut tick = tokio::time::interval(self.interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => self.poll_once(ctx)?,
                    () = ctx.stopped() => {
                        self.poll_once(ctx)?;
                        return Ok(());
                    }
                }
            }
        })
    }
}

/// A ring buffer reader as a [`RingSource`] needs it. Its raw descriptor
/// ([`AsRawFd`]) is the one that turns readable when records arrive, owned
/// by the reader and valid as long as it lives.
pub trait RingRead: AsRawFd + Send + 'static {
    /// What a record decodes to.
    type Record;

    /// Every record committed so far, without waiting.
    fn take_ready(&mut self) -> Result<Vec<Self::Record>, SourceError>;

    /// Records dropped as undecodable, cumulative.
    fn undecodable(&self) -> u64;
}

impl<T: Send + 'static> RingRead for RecordReader<T> {
    type Record = T;

    fn take_ready(&mut self) -> Result<Vec<T>, SourceError> {
        RecordReader::take_ready(self).map_err(|e| SourceError::new(e.to_string()))
    }

    fn undecodable(&self) -> u64 {
        RecordReader::undecodable(self)
    }
}

/// Registers `reader`'s readiness descriptor with the runtime, handing the
/// reader itself to the registration (it comes back on failure).
#[allow(unsafe_code)]
fn register<R: RingRead>(reader: R) -> Result<AsyncFd<R>, (R, std::io::Error)> {
    // SAFETY: tokio requires the descriptor to stay open, and the same
    // one, for as long as the `AsyncFd` lives. It is the reader's own epoll
    // instance (libbpf's, created with the ring buffer and closed only when
    // the reader is dropped), and the `AsyncFd` owns the reader, so the
    // descriptor outlives the registration; `as_raw_fd` returns that one
    // descriptor every time.
    unsafe { AsyncFd::register_with_interest(reader, Interest::READABLE) }
        .map_err(|e| e.into_parts())
}

/// Kernel-side loss counters of a ring buffer source, read as deltas.
pub type LossPoll = Box<dyn FnMut() -> Vec<(DropReason, u64)> + Send>;

enum Reader<R: RingRead> {
    Idle(R),
    Registered(AsyncFd<R>),
    /// Only while moving between the two.
    Gone,
}

/// A source over a kernel ring buffer: each record becomes the events
/// `convert` makes of it, delivered as it arrives.
pub struct RingSource<R: RingRead> {
    name: &'static str,
    reader: Reader<R>,
    convert: Box<dyn FnMut(R::Record) -> Vec<Event> + Send>,
    losses: Option<LossPoll>,
    undecodable_seen: u64,
}

impl<R: RingRead> RingSource<R> {
    /// A source named `name` over `reader`.
    pub fn new(
        name: &'static str,
        reader: R,
        convert: impl FnMut(R::Record) -> Vec<Event> + Send + 'static,
    ) -> Self {
        RingSource {
            name,
            reader: Reader::Idle(reader),
            convert: Box::new(convert),
            losses: None,
            undecodable_seen: 0,
        }
    }

    /// Also reports the kernel's loss counters (read once a second and at
    /// stop, as deltas).
    pub fn with_losses(mut self, losses: LossPoll) -> Self {
        self.losses = Some(losses);
        self
    }

    /// Registers the reader with the runtime (once; a restart reuses it).
    fn registered(&mut self) -> Result<(), SourceError> {
        match std::mem::replace(&mut self.reader, Reader::Gone) {
            Reader::Idle(r) => match register(r) {
                Ok(fd) => {
                    self.reader = Reader::Registered(fd);
                    Ok(())
                }
                Err((r, e)) => {
                    self.reader = Reader::Idle(r);
                    Err(SourceError::new(format!(
                        "registering the ring buffer with the runtime: {e}"
                    )))
                }
            },
            other => {
                self.reader = other;
                Ok(())
            }
        }
    }

    fn drain(&mut self, ctx: &SourceContext) -> Result<(), SourceError> {
        let reader = match &mut self.reader {
            Reader::Registered(fd) => fd.get_mut(),
            Reader::Idle(r) => r,
            Reader::Gone => return Ok(()),
        };
        let records = reader.take_ready()?;
        let undecodable = reader.undecodable();
        let mut events = Vec::with_capacity(records.len());
        for r in records {
            events.extend((self.convert)(r));
        }
        ctx.lost(
            DropReason::undecodable,
            undecodable.saturating_sub(self.undecodable_seen),
        );
        self.undecodable_seen = undecodable;
        ctx.emit(events);
        Ok(())
    }

    fn poll_losses(&mut self, ctx: &SourceContext) {
        if let Some(losses) = &mut self.losses {
            for (reason, n) in losses() {
                ctx.lost(reason, n);
            }
        }
    }

    /// Waits until the kernel signals records (or forever, when the reader
    /// could not be registered: the timer then drains it).
    async fn wait(&mut self) -> Result<(), SourceError> {
        let Reader::Registered(fd) = &mut self.reader else {
            return std::future::pending().await;
        };
        let mut guard = fd
            .readable_mut()
            .await
            .map_err(|e| SourceError::new(format!("waiting for the ring buffer: {e}")))?;
        // Cleared before draining: a record committed after the drain
        // wakes the next wait.
        guard.clear_ready();
        Ok(())
    }
}

impl<R: RingRead> Source for RingSource<R>
where
    R::Record: Send,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn run<'a>(&'a mut self, ctx: &'a SourceContext) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.registered()?;
            ctx.ready();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    woke = self.wait() => {
                        woke?;
                        self.drain(ctx)?;
                    }
                    _ = tick.tick() => {
                        self.drain(ctx)?;
                        self.poll_losses(ctx);
                    }
                    () = ctx.stopped() => {
                        self.drain(ctx)?;
                        self.poll_losses(ctx);
                        return Ok(());
                    }
                }
            }
        })
    }
}
