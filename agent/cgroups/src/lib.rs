//! Resolves a Kubernetes Pod's containers to their cgroup directories and
//! cgroup ids.
//!
//! The BPF backends key everything on the cgroup id the kernel reports for
//! a task (`bpf_get_current_cgroup_id`, the cgroup a `cgroup_skb` program is
//! attached to). The API server only tells us a pod's UID, its QoS class and
//! each container's `containerID` (`containerd://<id>`, `cri-o://<id>`,
//! `docker://<id>`). This crate joins the two by rebuilding the directory
//! names the kubelet and the runtime create, for every layout real nodes use
//! (systemd and cgroupfs drivers; containerd, CRI-O and docker scopes), and
//! by a bounded search when a node nests them under an unknown prefix (kind,
//! a custom `--cgroup-root`). See [`layout`] for the candidate table.
//!
//! # Why a resolution is a report, not a `Result`
//!
//! The spec's "Known Gaps" admits that attribution is a best-effort
//! path-shape heuristic whose misses go unnoticed and are never retried.
//! [`Resolver::resolve`] therefore never fails as a whole: it returns every
//! container it found, every container that has no running instance yet
//! ([`Resolution::pending`]), and every container it could not attribute
//! with a typed [`UnresolvedReason`] (which names the paths it tried), so the
//! daemon can report "this container is not covered" positively.
//! [`Resolution::is_complete`] says whether a pod is fully covered, and
//! [`container_ids_key`] changes exactly when the facts that resolution
//! depends on change, so the daemon knows when a retry can succeed.
//!
//! # Where the hierarchy is
//!
//! [`Resolver::discover`] reads `/proc/self/mountinfo` (see [`mountinfo`]):
//! the cgroup2 mount (unified, or hybrid at `/sys/fs/cgroup/unified`) first,
//! then one cgroup v1 controller hierarchy as a fallback. A test harness or a
//! `--cgroup-root` flag builds the [`Resolver`] from an explicit
//! [`CgroupRoot`] instead.
//!
//! # cgroup ids
//!
//! On cgroup v2 the cgroup id is the directory's inode number: kernfs has
//! used 64-bit node ids as inode numbers since Linux 5.5, and that id is what
//! BPF sees. (Before 5.5 the BPF id also carried a generation in its upper
//! 32 bits; the kernels this project supports are newer.) cgroup v1
//! directories have inodes too, but no BPF helper reports a v1 cgroup, so a
//! container found only in a v1 hierarchy is returned with its path and
//! `cgroup_id: None`, and is also listed in [`Resolution::unresolved`] as
//! [`UnresolvedReason::V1NoCgroupId`] so the caller reports "no enforcement"
//! for it.

mod container;
pub mod layout;
pub mod mountinfo;
pub mod pods;
mod resolve;

pub use container::{container_ids_key, Runtime};
pub use layout::Layout;
pub use mountinfo::{
    parse_mountinfo, read_mountinfo, select_roots, CgroupRoot, CgroupVersion, MountInfoEntry,
    MAX_MOUNTINFO_BYTES,
};
pub use resolve::{
    Discovery, Resolution, ResolvedContainer, Resolver, Unresolved, UnresolvedReason,
    MAX_SEARCH_DEPTH, MAX_SEARCH_DIRS, MAX_TRIED,
};

use std::path::PathBuf;

/// Errors of this crate. Per-container failures are not errors: they are
/// [`UnresolvedReason`]s inside a [`Resolution`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The mount table could not be read.
    #[error("cannot read the mount table {path}: {source}")]
    Mountinfo {
        /// The file that was read (normally `/proc/self/mountinfo`).
        path: PathBuf,
        /// Why reading it failed.
        #[source]
        source: std::io::Error,
    },
    /// The mount table has neither a cgroup2 mount nor a cgroup v1
    /// hierarchy with a controller pod cgroups are created in.
    #[error(
        "no cgroup2 mount and no cgroup v1 cpu, cpuacct, memory, pids or name=systemd hierarchy \
         in the mount table; mount the host's /sys/fs/cgroup or pass the cgroup root explicitly"
    )]
    NoCgroupMount,
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
