//! The generated libbpf-rs skeletons, one module per BPF object.
//!
//! The generated code is not ours to lint: it uses `unsafe` (with its own
//! SAFETY comments), `unwrap`/`expect` on invariants of the embedded object,
//! and has no docs. The allowances below are limited to this module; the
//! code that drives the skeletons (`probe::kernel`) has no `unsafe`.
#![allow(
    unsafe_code,
    missing_docs,
    unreachable_pub,
    dead_code,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::unwrap_used,
    clippy::expect_used
)]

/// Skeletons of `bpf/probe/*.bpf.c`.
pub(crate) mod probe {
    /// `bpf/probe/lsm_file_open.bpf.c`.
    pub(crate) mod lsm_file_open {
        include!(concat!(env!("OUT_DIR"), "/probe/lsm_file_open.skel.rs"));
    }
    /// `bpf/probe/fmod_ret_file_open.bpf.c`.
    pub(crate) mod fmod_ret_file_open {
        include!(concat!(
            env!("OUT_DIR"),
            "/probe/fmod_ret_file_open.skel.rs"
        ));
    }
    /// `bpf/probe/cgroup_skb_egress.bpf.c`.
    pub(crate) mod cgroup_skb_egress {
        include!(concat!(env!("OUT_DIR"), "/probe/cgroup_skb_egress.skel.rs"));
    }
    /// `bpf/probe/exec_trace.bpf.c`.
    pub(crate) mod exec_trace {
        include!(concat!(env!("OUT_DIR"), "/probe/exec_trace.skel.rs"));
    }
    /// `bpf/probe/maps.bpf.c`.
    pub(crate) mod maps {
        include!(concat!(env!("OUT_DIR"), "/probe/maps.skel.rs"));

        /// The raw object, for the map probes: they switch off
        /// auto-creation of the maps not under test, which the generated
        /// skeleton cannot represent (it expects every map to exist).
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/probe/maps.bpf.o"));
    }
}
