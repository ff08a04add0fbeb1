//! Kernel capability probe and the backend plan derived from it.
//!
//! The probe answers two questions about the running kernel, in this order:
//!
//! 1. What can it do? [`measure`] reads the facts that matter (release, BTF,
//!    the active LSM list, lockdown, the cgroup v2 mount, bpffs) and *loads*
//!    a tiny program or map of every kind a backend needs, recording whether
//!    it loaded, attached and ran, or the errno and verifier log when it did
//!    not. Reading a version number is never enough: an LSM program loads and
//!    attaches even when `bpf` is absent from the active LSM list, and a
//!    sandboxed kernel can refuse a program type its version supports.
//! 2. Which backend serves each behavior? [`derive_plan`] is a pure function
//!    of those [`Measurements`] and the operator's [`Overrides`], so it is
//!    unit-tested against measurements recorded on real kernels
//!    (`compat/tests/fixtures/`).
//!
//! Everything the probe reads or calls goes through the [`Host`] seam;
//! [`LiveHost`] is the real one. [`Prober`] runs the measurement once and
//! caches it for the life of the process.

mod facts;
mod host;
mod measure;
mod plan;
mod report;
#[cfg(test)]
mod test_host;
mod view;

pub use facts::{
    parse_active_lsms, parse_lockdown, parse_mountinfo, BpffsFacts, CgroupFacts, CgroupLayout,
    KernelFacts, LsmFacts, MountEntry,
};
pub use host::{Host, LiveHost};
pub use kyverno_runtime_bpf::probe::{ProbeMap, ProbeProgram};
pub use measure::{measure, MapId, Measurements, Outcome, ProbeFailure, Prober, ProgramId};
pub use plan::{derive_plan, Backend, Behavior, OpenExecBackend, Overrides, Plan, PlanEntry};
pub use report::{ProbeReport, SCHEMA_VERSION};
pub use view::{reach, HostMounts, INIT_ROOT};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A recorded measurement (a fixture or a `probe --json` file) did not parse.
    #[error("measurements do not parse: {0}")]
    Measurements(#[from] serde_json::Error),
    /// An override names a backend this crate does not know.
    #[error("unknown open/exec backend {value:?}: expected one of auto, bpf_lsm, fmod_ret, none")]
    UnknownBackend {
        /// The value the operator gave.
        value: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
