//! CO-RE BPF programs of every kyverno-runtime backend and their typed Rust
//! handles.
//!
//! Each backend owns a directory `bpf/<backend>/` of `*.bpf.c` programs; the
//! build script compiles every one of them into its own object and generates
//! a libbpf-rs skeleton into `OUT_DIR` (see `build.rs`). Shared C headers and
//! the committed `vmlinux.h` live in `bpf/include/`.
//!
//! Today there is one backend, [`probe`]: tiny programs and maps that the
//! `compat` crate loads to learn what the running kernel really allows.
//!
//! # Building without clang
//!
//! When `clang` is not on `PATH` or `KRT_BPF_STUB=1` is set, the crate is
//! built without BPF objects so that `cargo check` and clippy work anywhere:
//! [`BPF_OBJECTS_BUILT`] is then `false` and every probe fails with
//! "built without BPF objects: install clang and rebuild".

pub mod cgroup_attach;
pub mod dns;
pub mod egress;
pub mod exectrace;
pub mod frame;
#[cfg(not(krt_bpf_stub))]
mod libbpf_log;
pub mod openexec;
pub mod pins;
pub mod probe;
pub mod protocol;
pub mod ring;
#[cfg(not(krt_bpf_stub))]
mod skel;
#[cfg(not(krt_bpf_stub))]
mod sys;
pub mod verifier_log;

pub use probe::{
    probe_map, probe_program, ProbeError, ProbeMap, ProbeProgram, ProgramProbe, Stage,
    BPF_OBJECTS_BUILT,
};
pub use verifier_log::verifier_reason;

/// A map descriptor handed from one loaded object to another (the exec
/// tracer shares the open/exec object's `oe_exec_resolved`).
pub use libbpf_rs::MapHandle;
