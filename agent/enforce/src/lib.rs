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

pub mod egress;
pub mod fake;
pub mod lsm;
pub mod openexec;
pub mod seam;

pub use seam::{
    CgroupId, Decision, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff,
    Result, Rules,
};
