//! Connections that can be closed from outside the task that drives them.
//!
//! hyper drives each HTTP/2 connection in a task of its own, and a request
//! body that is blocked on a shut flow-control window lives in yet another.
//! Dropping the future of a call does not end either of them: the body task
//! keeps waiting for a window update that a collector which stopped reading
//! never sends, and keeps the connection alive with it. To bound shutdown
//! (and to abandon a stalled stream without leaking it), every connection's
//! byte stream is wrapped in [`Abortable`]: [`Connections::abort_all`] makes
//! its next read and write fail, and wakes the task that waits on them, so
//! hyper tears the connection and all its streams down.

use futures::task::AtomicWaker;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The shared switch of one connection.
pub(crate) struct AbortSignal {
    aborted: AtomicBool,
    // Reads and writes may be polled from different tasks (or with different
    // wakers), so each direction keeps its own.
    read: AtomicWaker,
    write: AtomicWaker,
    /// Where the connection's own I/O errors go (see
    /// [`Connections::last_error`]).
    errors: Arc<Mutex<Option<String>>>,
}

impl AbortSignal {
    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.read.wake();
        self.write.wake();
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn record<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(e)) = &poll {
            *self.errors.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
        }
        poll
    }
}

/// The connections of one channel (client) or one server.
#[derive(Default)]
pub(crate) struct Connections {
    // Weak: a connection that ended on its own is dropped with its last
    // strong reference and pruned at the next `track`.
    live: Mutex<Vec<Weak<AbortSignal>>>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl Connections {
    /// The last I/O error of any of the connections. hyper reports a
    /// connection that failed under a request as "connection closed"; the
    /// reason (a TLS alert such as a refused client certificate) is only
    /// in the I/O error its own task saw, which is kept here.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A switch for a new connection, remembered until the connection is
    /// dropped.
    pub(crate) fn track(&self) -> Arc<AbortSignal> {
        let signal = Arc::new(AbortSignal {
            aborted: AtomicBool::new(false),
            read: AtomicWaker::new(),
            write: AtomicWaker::new(),
            errors: self.last_error.clone(),
        });
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&signal));
        signal
    }

    /// Fails every tracked connection's I/O from now on.
    pub(crate) fn abort_all(&self) {
        let live = std::mem::take(&mut *self.live.lock().unwrap_or_else(PoisonError::into_inner));
        for signal in live.iter().filter_map(Weak::upgrade) {
            signal.abort();
        }
    }
}

/// A byte stream whose I/O fails once its [`AbortSignal`] is set.
pub(crate) struct Abortable<T> {
    io: T,
    signal: Arc<AbortSignal>,
}

impl<T> Abortable<T> {
    pub(crate) fn new(io: T, signal: Arc<AbortSignal>) -> Self {
        Abortable { io, signal }
    }

    /// The wrapped stream.
    pub(crate) fn get_ref(&self) -> &T {
        &self.io
    }
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection closed by the push sink or collector",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Abortable<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Register before checking, so an abort between the two still wakes
        // this task.
        this.signal.read.register(cx.waker());
        if this.signal.is_aborted() {
            return Poll::Ready(Err(aborted()));
        }
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        this.signal.record(poll)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Abortable<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.signal.write.register(cx.waker());
        if this.signal.is_aborted() {
            return Poll::Ready(Err(aborted()));
        }
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.signal.record(poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.signal.write.register(cx.waker());
        if this.signal.is_aborted() {
            return Poll::Ready(Err(aborted()));
        }
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.signal.record(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.signal.write.register(cx.waker());
        if this.signal.is_aborted() {
            return Poll::Ready(Err(aborted()));
        }
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.signal.record(poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.signal.write.register(cx.waker());
        if this.signal.is_aborted() {
            return Poll::Ready(Err(aborted()));
        }
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.signal.record(poll)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A read blocked on a peer that never writes fails as soon as the
    /// connection is aborted from elsewhere.
    #[tokio::test]
    async fn abort_wakes_a_blocked_read() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let conns = Connections::default();
        let mut io = Abortable::new(ours, conns.track());
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            io.read(&mut buf).await
        });
        tokio::task::yield_now().await;
        conns.abort_all();
        let err = reader.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        // The stream went with the task: the peer sees the connection
        // closed.
        theirs.write_all(b"x").await.unwrap_err();
    }

    #[test]
    fn dropped_connections_are_pruned() {
        let conns = Connections::default();
        for _ in 0..100 {
            drop(conns.track());
        }
        let _kept = conns.track();
        assert_eq!(conns.live.lock().unwrap().len(), 1);
    }
}
