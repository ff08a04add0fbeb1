//! An NRI plugin: containerd (2.x by default, 1.7 when enabled) and CRI-O
//! tell the daemon of each container after its cgroup exists and before
//! its process starts, and wait for the answer.
//!
//! The daemon otherwise learns a container from its Pod's status, which
//! the kubelet publishes after the runtime started it; until then the
//! container runs unenforced (issue 35). NRI's `StartContainer` request is
//! made between the runtime's create (the cgroup exists, the process
//! waits in the runtime's init) and its start (the entrypoint's exec), so
//! a daemon that programs the kernel before answering enforces from the
//! entrypoint on.
//!
//! The protocol: the plugin connects to the runtime's socket, multiplexes
//! it into two ttRPC connections ([`mux`]), registers on the runtime's
//! service and serves the plugin's ([`plugin`]). The answer to a start is
//! bounded in time ([`Config::answer_within`], 1 s by default): a plugin the runtime waits
//! on too long is dropped by it, and a hook that blocks on the daemon must
//! never hold the daemon's own pod (cilium/tetragon#2402).

pub mod gate;
pub mod mux;
pub mod plugin;

pub use plugin::{
    run, Config, Container, Containers, Registration, DEFAULT_ANSWER_WITHIN, MAX_ANSWER_WITHIN,
};

pub use generated::{api, api_ttrpc};

/// The code generated from NRI's `api.proto` (build.rs), under one set of
/// allowances: it is not ours to lint.
#[allow(
    missing_docs,
    nonstandard_style,
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    unused,
    rust_2018_idioms
)]
mod generated {
    /// NRI's messages.
    pub mod api {
        include!(concat!(env!("OUT_DIR"), "/api.rs"));
    }

    /// NRI's ttRPC services.
    pub mod api_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/api_ttrpc.rs"));
    }
}
