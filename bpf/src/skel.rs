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
    unused_imports,
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

/// Skeletons of `bpf/egress/*.bpf.c`.
pub(crate) mod egress {
    /// `bpf/egress/egress_filter.bpf.c`.
    pub(crate) mod egress_filter {
        include!(concat!(env!("OUT_DIR"), "/egress/egress_filter.skel.rs"));

        /// The raw object: the handle loads it through the generic object
        /// API, whose `Object` owns its maps and programs (no borrowed
        /// storage) and is `Send + Sync`, unlike the generated skeleton.
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/egress/egress_filter.bpf.o"));
    }
}

/// Skeletons of `bpf/dnssnoop/*.bpf.c`.
pub(crate) mod dnssnoop {
    /// `bpf/dnssnoop/snoop.bpf.c`.
    pub(crate) mod snoop {
        include!(concat!(env!("OUT_DIR"), "/dnssnoop/snoop.skel.rs"));

        /// The raw object: the egress filter loads it through the generic
        /// object API, over its own maps (`reuse_fd`).
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/dnssnoop/snoop.bpf.o"));
    }
}

/// Skeletons of `bpf/dns/*.bpf.c`.
pub(crate) mod dns {
    /// `bpf/dns/query.bpf.c`.
    pub(crate) mod query {
        include!(concat!(env!("OUT_DIR"), "/dns/query.skel.rs"));

        /// The raw object, loaded through the generic object API so that
        /// the observer owns its `Object` (no borrowed skeleton storage).
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/dns/query.bpf.o"));
    }
}

/// Skeletons of `bpf/protocol/*.bpf.c`.
pub(crate) mod protocol {
    /// `bpf/protocol/classifier.bpf.c`.
    pub(crate) mod classifier {
        include!(concat!(env!("OUT_DIR"), "/protocol/classifier.skel.rs"));

        /// The raw object, loaded through the generic object API so that
        /// the classifier owns its `Object` (no borrowed skeleton storage).
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/protocol/classifier.bpf.o"));
    }
}

/// Skeletons of `bpf/openexec/*.bpf.c`.
pub(crate) mod openexec {
    /// `bpf/openexec/lsm.bpf.c`.
    pub(crate) mod lsm {
        include!(concat!(env!("OUT_DIR"), "/openexec/lsm.skel.rs"));

        /// The raw object, loaded through the generic object API so the
        /// handle owns its `Object`.
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/openexec/lsm.bpf.o"));
    }
    /// `bpf/openexec/fmod_ret.bpf.c`.
    pub(crate) mod fmod_ret {
        include!(concat!(env!("OUT_DIR"), "/openexec/fmod_ret.skel.rs"));

        /// The raw object.
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/openexec/fmod_ret.bpf.o"));
    }
}

/// Skeletons of `bpf/exectrace/*.bpf.c`.
pub(crate) mod exectrace {
    /// `bpf/exectrace/exec_trace.bpf.c`.
    pub(crate) mod exec_trace {
        include!(concat!(env!("OUT_DIR"), "/exectrace/exec_trace.skel.rs"));

        /// The raw object, loaded through the generic object API so the
        /// tracer owns its `Object`.
        pub(crate) const OBJECT: &[u8] =
            include_bytes!(concat!(env!("OUT_DIR"), "/exectrace/exec_trace.bpf.o"));
    }
}
