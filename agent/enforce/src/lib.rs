//! The enforcement seam and what sits on either side of it.
//!
//! - [`seam`]: the [`Enforcer`] trait every backend implements, with the
//!   policy-level union semantics it promises.
//! - [`fake`]: a backend in memory that *is* the reference model of those
//!   semantics, for the managers' unit tests and for comparing a kernel
//!   backend against.
//! - [`openexec`]: the open/exec manager (policies x pods -> programs and
//!   bindings).
//! - [`lsm`]: the kernel backends for open and exec (BPF-LSM and
//!   fmod_ret), over `kyverno-runtime-bpf`'s open/exec object.
//! - [`protocol`]: the application protocol manager (per-pod rule sets of
//!   the classifier, the union of the policies selecting each pod).
//! - [`dns`]: the DNS question observer's gate (which pods it sees) and the
//!   name matcher of the dns behavior.
//! - [`egress`]: the network manager and its kernel backend (the egress
//!   filter with its DNS answer snooper).
//! - [`names`]: cluster Service names and the addresses the API gives them.

pub mod dns;
pub mod egress;
pub mod fake;
pub mod lsm;
pub mod names;
pub mod openexec;
pub mod protocol;
pub mod seam;

pub use seam::{
    CgroupId, Decision, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff,
    Result, Rules,
};
