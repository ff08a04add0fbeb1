//! The send queue between the event path and the stream: bounded, dropping
//! the oldest finding on overflow, never blocking the producer.
//!
//! A collector that stops reading (or is gone) must cost findings, never
//! the daemon: [`Queue::push`] takes a short lock, never waits for room and
//! never allocates past the capacity, and every finding that does not reach
//! the collector is counted under a [`PushDrop`] reason.

use crate::proto;
use std::collections::VecDeque;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// Why findings were lost (the reason label of a drop counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PushDrop {
    /// The queue was full: the oldest queued finding made room for a new
    /// one.
    QueueFull,
    /// The finding was handed to a stream that then broke, stalled, or was
    /// acknowledged for fewer findings than it carried. Nothing confirms
    /// that it arrived, so it is counted as lost; it may still have reached
    /// the collector. It is not sent again, because a resend of something
    /// that did arrive would be a duplicate the collector cannot recognize.
    SendFailed,
    /// The sink stopped (or its shutdown deadline passed) with the finding
    /// still queued, or the finding was submitted after the sink stopped.
    Shutdown,
}

impl PushDrop {
    /// Every reason, in declaration order.
    pub const ALL: [PushDrop; 3] = [
        PushDrop::QueueFull,
        PushDrop::SendFailed,
        PushDrop::Shutdown,
    ];

    /// A short stable name for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PushDrop::QueueFull => "queue_full",
            PushDrop::SendFailed => "send_failed",
            PushDrop::Shutdown => "shutdown",
        }
    }

    fn index(self) -> usize {
        match self {
            PushDrop::QueueFull => 0,
            PushDrop::SendFailed => 1,
            PushDrop::Shutdown => 2,
        }
    }
}

/// Called with a reason and how many findings were lost for it, on the
/// thread that lost them (the event path for [`PushDrop::QueueFull`]), so
/// it must be cheap: a metric increment.
pub type DropHook = Arc<dyn Fn(PushDrop, u64) + Send + Sync>;

/// Where the queue is in the sink's life.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Streams wait for findings and end by their own limits.
    Open,
    /// Shutting down: the stream takes what is queued and then ends.
    Draining,
    /// The sink stopped: nothing will send what is pushed.
    Closed,
}

struct State {
    items: VecDeque<proto::Finding>,
    phase: Phase,
}

/// The queue and the sink's counters, shared by the handles and the run
/// loop.
pub(crate) struct Queue {
    state: Mutex<State>,
    // `notify_waiters` (not `notify_one`): a waiter enables its `Notified`
    // before looking at the queue, so no wakeup is lost, and an abandoned
    // stream cannot swallow a stored permit meant for the next one.
    notify: Notify,
    capacity: usize,
    dropped: [AtomicU64; 3],
    delivered: AtomicU64,
    on_drop: Option<DropHook>,
}

/// What one stream took from the queue.
#[derive(Default)]
pub(crate) struct Tally {
    // Both only change under the queue's lock, so that once `Queue::cancel`
    // returns, `sent` is final: no finding can be taken by a stream after
    // the run loop has counted it.
    sent: AtomicU64,
    cancelled: AtomicBool,
}

impl Tally {
    /// How many findings the stream has taken.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

/// The answer of [`Queue::pop_for`].
// Returned by value and moved straight on: boxing the finding would cost an
// allocation per finding for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Pop {
    /// The next finding, now counted as the stream's.
    Item(proto::Finding),
    /// Nothing queued; the stream should wait (or end, when draining).
    Empty {
        /// The sink is shutting down.
        draining: bool,
    },
    /// The run loop gave up on this stream.
    Cancelled,
}

impl Queue {
    pub(crate) fn new(capacity: usize, on_drop: Option<DropHook>) -> Queue {
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                phase: Phase::Open,
            }),
            notify: Notify::new(),
            capacity,
            dropped: Default::default(),
            delivered: AtomicU64::new(0),
            on_drop,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the deque invalid
        // (every critical section is a single push or pop), so a poisoned
        // lock is still usable; refusing it would turn one bug into a
        // panicking event path.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a finding; on overflow the oldest one goes.
    pub(crate) fn push(&self, finding: proto::Finding) {
        let lost = {
            let mut state = self.lock();
            if state.phase == Phase::Closed {
                Some(PushDrop::Shutdown)
            } else {
                state.items.push_back(finding);
                if state.items.len() > self.capacity {
                    state.items.pop_front();
                    Some(PushDrop::QueueFull)
                } else {
                    None
                }
            }
        };
        self.notify.notify_waiters();
        if let Some(reason) = lost {
            self.lost(reason, 1);
        }
    }

    /// The next finding for a stream, unless the run loop cancelled it.
    pub(crate) fn pop_for(&self, tally: &Tally) -> Pop {
        let mut state = self.lock();
        if tally.cancelled.load(Ordering::SeqCst) {
            return Pop::Cancelled;
        }
        match state.items.pop_front() {
            Some(item) => {
                tally.sent.fetch_add(1, Ordering::SeqCst);
                Pop::Item(item)
            }
            None => Pop::Empty {
                draining: state.phase != Phase::Open,
            },
        }
    }

    /// Stops a stream from taking more findings; returns how many it took.
    pub(crate) fn cancel(&self, tally: &Tally) -> u64 {
        let _state = self.lock();
        tally.cancelled.store(true, Ordering::SeqCst);
        tally.sent()
    }

    /// Whether the sink is shutting down (or stopped).
    pub(crate) fn draining(&self) -> bool {
        self.lock().phase != Phase::Open
    }

    /// How many findings wait.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Waits until a finding is queued (returns at once if one is).
    pub(crate) async fn until_nonempty(&self) {
        loop {
            let mut notified = pin!(self.notify.notified());
            notified.as_mut().enable();
            if self.len() > 0 {
                return;
            }
            notified.await;
        }
    }

    /// A future that completes at the next push (or phase change). The
    /// caller enables it before looking at the queue, so that a push in
    /// between is not missed.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Shutdown began: streams take what is queued and end.
    pub(crate) fn begin_drain(&self) {
        {
            let mut state = self.lock();
            if state.phase == Phase::Open {
                state.phase = Phase::Draining;
            }
        }
        self.notify.notify_waiters();
    }

    /// The sink stopped: what is still queued is lost, and so is anything
    /// submitted from now on.
    pub(crate) fn close(&self) {
        let left = {
            let mut state = self.lock();
            state.phase = Phase::Closed;
            let left = state.items.len();
            state.items.clear();
            left
        };
        self.notify.notify_waiters();
        self.lost(PushDrop::Shutdown, left as u64);
    }

    /// Counts findings lost for a reason and tells the hook.
    pub(crate) fn lost(&self, reason: PushDrop, n: u64) {
        if n == 0 {
            return;
        }
        self.dropped[reason.index()].fetch_add(n, Ordering::Relaxed);
        if let Some(hook) = &self.on_drop {
            hook(reason, n);
        }
    }

    /// Counts findings the collector acknowledged.
    pub(crate) fn acknowledged(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn dropped(&self, reason: PushDrop) -> u64 {
        self.dropped[reason.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn dropped_total(&self) -> u64 {
        PushDrop::ALL.iter().map(|r| self.dropped(*r)).sum()
    }

    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

/// A new stream's tally.
pub(crate) fn tally() -> Arc<Tally> {
    Arc::new(Tally::default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn finding(target: &str) -> proto::Finding {
        proto::Finding {
            target: target.into(),
            ..Default::default()
        }
    }

    #[test]
    fn overflow_drops_the_oldest_and_counts_it() {
        let seen = Arc::new(AtomicU64::new(0));
        let hook_seen = seen.clone();
        let hook: DropHook = Arc::new(move |reason, n| {
            assert_eq!(reason, PushDrop::QueueFull);
            hook_seen.fetch_add(n, Ordering::SeqCst);
        });
        let q = Queue::new(3, Some(hook));
        for i in 0..5 {
            q.push(finding(&i.to_string()));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(PushDrop::QueueFull), 2);
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let t = tally();
        let order: Vec<String> = std::iter::from_fn(|| match q.pop_for(&t) {
            Pop::Item(f) => Some(f.target),
            _ => None,
        })
        .collect();
        assert_eq!(order, ["2", "3", "4"]);
        assert_eq!(t.sent(), 3);
    }

    #[test]
    fn a_cancelled_stream_takes_nothing_more() {
        let q = Queue::new(8, None);
        q.push(finding("a"));
        q.push(finding("b"));
        let t = tally();
        assert!(matches!(q.pop_for(&t), Pop::Item(_)));
        assert_eq!(q.cancel(&t), 1);
        assert!(matches!(q.pop_for(&t), Pop::Cancelled));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn closing_counts_what_is_left_and_what_comes_after() {
        let q = Queue::new(8, None);
        q.push(finding("a"));
        q.begin_drain();
        assert!(matches!(q.pop_for(&tally()), Pop::Item(_)));
        assert!(matches!(q.pop_for(&tally()), Pop::Empty { draining: true }));
        q.push(finding("b"));
        q.close();
        q.push(finding("c"));
        assert_eq!(q.dropped(PushDrop::Shutdown), 2);
        assert_eq!(q.len(), 0);
    }
}
