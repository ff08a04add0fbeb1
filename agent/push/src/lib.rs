//! The gRPC push sink: findings streamed live to a collector over mutual
//! TLS, and a reference collector that receives them.
//!
//! This is the second finding sink (the Reports are the first), for a
//! cluster that wants findings as they happen rather than by polling Report
//! objects. The daemon is always the client of `FindingCollector.Report`
//! (`proto/kyverno_runtime/push/v1/push.proto`, client streaming), so a
//! node opens no listening port.
//!
//! - [`PushSink`] owns the send queue and the stream. [`PushHandle::submit`]
//!   is the event path's entry: it passes the finding through the
//!   redaction chokepoint ([`Finding::redact`](kyverno_runtime_report::Finding::redact))
//!   *before* it is queued, never blocks, and counts what the bounded
//!   queue drops. [`PushSink::run`] connects, reconnects with backoff, and
//!   drains on shutdown within a deadline even when the collector stopped
//!   reading. Delivery is at most once, and every loss is counted by
//!   [`PushDrop`] reason (see the [`sink`] docs for exactly when).
//! - The TLS files are read and checked when the sink (or collector) is
//!   built, and a bad one is named in the error: a daemon must not start
//!   with a sink that can never connect. There is no plaintext mode.
//! - [`Collector`] / [`serve`] is the reference receiver: client
//!   certificates required and checked against a CA, one JSON line per
//!   finding ([`CollectedFinding`]).
//! - [`proto`] is the generated wire code. Wire messages and the domain
//!   [`Finding`](kyverno_runtime_report::Finding) stay apart and are
//!   converted at the edges ([`ReceivedFinding`]).
//!
//! The pod owner fields on the wire are **unverified** correlation metadata
//! (read verbatim from the pod's first ownerReference); a receiver must
//! never use them as a security boundary.

mod abort;
mod collector;
mod error;
mod queue;
pub mod sink;
mod tls;
mod wire;

/// The wire types and the generated client and server
/// (`kyverno_runtime.push.v1`); the documentation is the `.proto` file's.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("kyverno_runtime.push.v1");
}

pub use collector::{
    open_output, serve, Collector, PeerInfo, ServerTls, HANDSHAKE_TIMEOUT, SHUTDOWN_GRACE,
};
pub use error::{Error, Result, TlsFile};
pub use queue::{DropHook, PushDrop};
pub use sink::{PushConfig, PushHandle, PushSink};
pub use tls::MAX_TLS_FILE_BYTES;
pub use wire::{CollectedFinding, CollectedPod, CollectedProcess, ReceivedFinding};
