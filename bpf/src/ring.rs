//! Reading a BPF ring buffer of fixed-layout records, decoded as they are
//! consumed.
//!
//! Every ring buffer source of the daemon (DNS questions, exec records,
//! refusal records) has the same shape: a decoder that is pure and total
//! (arbitrary bytes give an error, never a panic), records the decoder
//! rejects counted and skipped rather than fatal (returning would lose
//! every record behind the bad one), and a reader that either waits
//! ([`RecordReader::poll`], for a thread or a test) or takes what is
//! committed without waiting ([`RecordReader::take_ready`]) when an event
//! loop has seen [`RecordReader::readiness_fd`] become readable. The
//! readiness descriptor is libbpf's epoll instance over the ring, which
//! becomes readable when the kernel signals new data, so an async reader
//! needs no thread of its own.

use std::os::fd::RawFd;
use std::time::Duration;

/// Why reading a ring buffer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// Setting the reader up failed (mapping the ring, creating the epoll
    /// instance).
    #[error("setting up the ring buffer reader of {map} failed: {message}")]
    Setup {
        /// The ring buffer map.
        map: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
    /// Waiting for or consuming records failed.
    #[error("reading the ring buffer {map} failed: {message}")]
    Read {
        /// The ring buffer map.
        map: &'static str,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
}

/// Reads one ring buffer, decoding each record into a `T`.
///
/// `Send`, not `Sync`: it belongs to the one task that drains the ring.
#[derive(Debug)]
pub struct RecordReader<T> {
    inner: imp::Reader<T>,
}

impl<T: Send + 'static> RecordReader<T> {
    /// Waits up to `timeout` for records (not at all for
    /// [`Duration::ZERO`]), then returns every record available, oldest
    /// first. An interrupted wait returns what it has.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<T>, RingError> {
        self.inner.poll(timeout)
    }

    /// Every record committed so far, without waiting.
    pub fn take_ready(&mut self) -> Result<Vec<T>, RingError> {
        self.inner.take_ready()
    }

    /// A descriptor that becomes readable when the kernel signals new
    /// records (register it with an event loop, then [`Self::take_ready`]).
    /// It belongs to the reader: valid while the reader lives, and closed
    /// with it, so an event loop registration must end first.
    pub fn readiness_fd(&self) -> RawFd {
        self.inner.readiness_fd()
    }

    /// Records dropped as undecodable since the reader was made.
    pub fn undecodable(&self) -> u64 {
        self.inner.undecodable()
    }
}

/// The [readiness descriptor](RecordReader::readiness_fd): owned by the
/// reader, open and the same for as long as it lives, which is what an
/// event loop registration needs.
impl<T: Send + 'static> std::os::fd::AsRawFd for RecordReader<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.readiness_fd()
    }
}

#[cfg(not(krt_bpf_stub))]
pub(crate) use imp::reader;

#[cfg(not(krt_bpf_stub))]
mod imp {
    use std::os::fd::RawFd;
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
    use std::time::Duration;

    use libbpf_rs::{MapCore, RingBuffer, RingBufferBuilder};

    use super::{RecordReader, RingError};
    use crate::sys::errno;

    #[derive(Debug)]
    struct Inbox<T> {
        records: Vec<T>,
        undecodable: u64,
    }

    pub(crate) struct Reader<T> {
        map: &'static str,
        ring: RingBuffer<'static>,
        inbox: Arc<Mutex<Inbox<T>>>,
    }

    impl<T> std::fmt::Debug for Reader<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Reader").field("map", &self.map).finish()
        }
    }

    /// Locks `m` even if a panicking thread poisoned it: the data stays
    /// usable, and the ring buffer callback runs inside libbpf, where a
    /// panic must never start.
    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader of the ring buffer `map` (named `name` in errors), each
    /// record decoded by `decode`. The ring maps the map's memory, which
    /// keeps the map alive after its object is gone.
    pub(crate) fn reader<T, E>(
        name: &'static str,
        map: &dyn MapCore,
        decode: fn(&[u8]) -> Result<T, E>,
    ) -> Result<RecordReader<T>, RingError>
    where
        T: Send + 'static,
        E: 'static,
    {
        let inbox = Arc::new(Mutex::new(Inbox {
            records: Vec::new(),
            undecodable: 0,
        }));
        let sink = Arc::clone(&inbox);
        let setup = |e: libbpf_rs::Error| RingError::Setup {
            map: name,
            errno: errno(&e),
            message: format!("{e:#}"),
        };
        let mut builder: RingBufferBuilder<'_, 'static> = RingBufferBuilder::new();
        builder
            .add(map, move |record: &[u8]| {
                let mut inbox = lock(&sink);
                match decode(record) {
                    Ok(r) => inbox.records.push(r),
                    Err(_) => inbox.undecodable = inbox.undecodable.saturating_add(1),
                }
                // Never stop consuming: a bad record must not cost the
                // records behind it.
                0
            })
            .map_err(setup)?;
        let ring = builder.build().map_err(setup)?;
        Ok(RecordReader {
            inner: Reader {
                map: name,
                ring,
                inbox,
            },
        })
    }

    impl<T> Reader<T> {
        fn read_err(&self, e: &libbpf_rs::Error) -> RingError {
            RingError::Read {
                map: self.map,
                errno: errno(e),
                message: format!("{e:#}"),
            }
        }

        pub(super) fn poll(&mut self, timeout: Duration) -> Result<Vec<T>, RingError> {
            // poll waits for the wakeup, which the kernel delivers a moment
            // after the commit (irq_work); consume then reads whatever is
            // committed, so a zero timeout sees every record written so far.
            for result in [self.ring.poll(timeout), self.ring.consume()] {
                if let Err(e) = result {
                    if errno(&e) != Some(libc::EINTR) {
                        return Err(self.read_err(&e));
                    }
                }
            }
            Ok(std::mem::take(&mut lock(&self.inbox).records))
        }

        pub(super) fn take_ready(&mut self) -> Result<Vec<T>, RingError> {
            if let Err(e) = self.ring.consume() {
                if errno(&e) != Some(libc::EINTR) {
                    return Err(self.read_err(&e));
                }
            }
            Ok(std::mem::take(&mut lock(&self.inbox).records))
        }

        pub(super) fn readiness_fd(&self) -> RawFd {
            self.ring.epoll_fd()
        }

        pub(super) fn undecodable(&self) -> u64 {
            lock(&self.inbox).undecodable
        }
    }
}

#[cfg(krt_bpf_stub)]
mod imp {
    //! A build without BPF objects has no maps, so no reader is ever made.

    use std::convert::Infallible;
    use std::marker::PhantomData;
    use std::os::fd::RawFd;
    use std::time::Duration;

    use super::RingError;

    #[derive(Debug)]
    pub(crate) struct Reader<T> {
        never: Infallible,
        _records: PhantomData<T>,
    }

    impl<T> Reader<T> {
        pub(super) fn poll(&mut self, _: Duration) -> Result<Vec<T>, RingError> {
            match self.never {}
        }

        pub(super) fn take_ready(&mut self) -> Result<Vec<T>, RingError> {
            match self.never {}
        }

        pub(super) fn readiness_fd(&self) -> RawFd {
            match self.never {}
        }

        pub(super) fn undecodable(&self) -> u64 {
            match self.never {}
        }
    }
}
