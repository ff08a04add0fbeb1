//! The event plane: how what the kernel saw becomes a finding.
//!
//! ```text
//! sources (poll: counter drains; ring: exec records, refusal records, DNS questions)
//!     -> collector buffer (bounded; drops the newest, counted)
//!     -> stages: attribution (cgroup id, pod uid, pid -> pod)
//!     -> sinks: monitor (per-policy matchers, monitorFilter) -> findings
//! ```
//!
//! - [`event`]: the normalized [`Event`](event::Event).
//! - [`collector`]: [`Source`](collector::Source), [`Stage`](collector::Stage),
//!   [`Sink`](collector::Sink), the pipeline and the sources' lifecycle.
//! - [`sources`]: the poll and ring buffer source shapes.
//! - [`attribution`]: the pod index, a stage.
//! - [`monitor`]: the matcher of policies, a sink; [`matchers`] and
//!   [`filter`] are its parts.
//! - [`record`]: events as JSON lines, written down and read back (what
//!   `kyverno-runtime policy test` feeds through attribution and the
//!   monitor).

pub mod attribution;
pub mod collector;
pub mod event;
pub mod filter;
pub mod matchers;
pub mod monitor;
pub mod record;
pub mod sources;

pub use attribution::Index;
pub use collector::{
    Collector, Sink, Source, SourceContext, SourceError, SourceState, SourceStates, Stage,
};
pub use event::{Event, Facts, KernelVerdict, Kind, PodRef, ProcessInfo};
pub use monitor::{FindingSink, Monitor, MonitorPolicy};
pub use sources::{LossPoll, PollSource, Polled, RingSource};
