//! The host's mounts as this process can reach them: one answer for the
//! probe and the cgroup resolver (issue 25: in a hostPID pod the probe read
//! the container's own mount table, found no cgroup v2 and declared the
//! network behaviors unavailable, while the resolver read PID 1's and found
//! it).
//!
//! A process in PID 1's mount namespace (a host process, a VM) sees the
//! host's mounts as its own. A container sees its own: a runtime mounts a
//! private `/sys/fs/cgroup` (on a hybrid host, only the v1 controllers),
//! and no bpffs. With hostPID the host's table is PID 1's, and the host's
//! files are reached through `/proc/1/root`.

use std::path::{Path, PathBuf};

use crate::facts::{self, MountEntry};
use crate::host::Host;

/// This process's own mount table.
pub(crate) const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";
/// PID 1's mount table.
pub(crate) const INIT_MOUNTINFO: &str = "/proc/1/mountinfo";
/// PID 1's root, from another mount namespace.
pub const INIT_ROOT: &str = "/proc/1/root";

/// The host's mount table, with every mount point as this process reaches
/// it (under [`INIT_ROOT`] from another mount namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMounts {
    /// The mounts, mount points rewritten to where this process reaches
    /// them.
    pub mounts: Vec<MountEntry>,
    /// Where the host's `/` is reached: `/`, or [`INIT_ROOT`].
    pub root: PathBuf,
    /// The table they were read from.
    pub source: &'static str,
}

impl HostMounts {
    /// Reads the host's mount table through `host`: its own when it shares
    /// PID 1's mount namespace (or cannot tell), PID 1's otherwise. An
    /// unreadable table reads as empty, with the reason.
    pub fn read(host: &dyn Host) -> Result<Self, String> {
        let (source, root) = Self::locate(host);
        let text = host
            .read_to_string(Path::new(source))
            .map_err(|e| format!("reading {source}: {e}"))?;
        let mounts = facts::parse_mountinfo(&text)
            .into_iter()
            .map(|mut m| {
                m.mount_point = reach(&root, &m.mount_point);
                m
            })
            .collect();
        Ok(Self {
            mounts,
            root,
            source,
        })
    }

    /// Which mount table is the host's, and where the host's `/` is
    /// reached from this process (see [`Self::read`]).
    pub fn locate(host: &dyn Host) -> (&'static str, PathBuf) {
        if host.shares_init_mount_namespace() {
            (SELF_MOUNTINFO, PathBuf::from("/"))
        } else {
            (INIT_MOUNTINFO, PathBuf::from(INIT_ROOT))
        }
    }

    /// `path` on the host, as this process reaches it.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        reach(&self.root, path)
    }
}

/// `path` on the host, reached through `root` (`/`: as it is).
pub fn reach(root: &Path, path: &Path) -> PathBuf {
    if root == Path::new("/") {
        return path.to_path_buf();
    }
    root.join(path.strip_prefix("/").unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_host::FakeHost;

    const HYBRID_HOST: &str = include_str!("../tests/fixtures/mountinfo-hybrid-host.txt");
    const HYBRID_POD: &str = include_str!("../tests/fixtures/mountinfo-hybrid-pod.txt");

    #[test]
    fn a_process_beside_init_reads_its_own_table_as_the_host() {
        let host = FakeHost::beside_init(HYBRID_HOST);
        let view = HostMounts::read(&host).unwrap();
        assert_eq!(view.source, SELF_MOUNTINFO);
        assert_eq!(view.root, Path::new("/"));
        let facts = facts::cgroup_facts(&view.mounts);
        assert_eq!(facts.layout, crate::CgroupLayout::Hybrid);
        assert_eq!(
            facts.v2_mount.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn a_pod_reads_init_s_table_and_reaches_it_through_proc_1_root() {
        let host = FakeHost::in_a_pod(HYBRID_POD, HYBRID_HOST);
        // Its own table has no cgroup v2: what the probe used to read.
        let own = facts::cgroup_facts(&facts::parse_mountinfo(HYBRID_POD));
        assert_eq!(own.layout, crate::CgroupLayout::Legacy);
        let view = HostMounts::read(&host).unwrap();
        assert_eq!(view.source, INIT_MOUNTINFO);
        let facts = facts::cgroup_facts(&view.mounts);
        assert_eq!(facts.layout, crate::CgroupLayout::Hybrid);
        assert_eq!(
            facts.v2_mount.as_deref(),
            Some(Path::new("/proc/1/root/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            view.host_path(Path::new("/sys/fs/bpf")),
            Path::new("/proc/1/root/sys/fs/bpf")
        );
    }

    #[test]
    fn an_unreadable_table_says_which() {
        let host = FakeHost::in_a_pod(HYBRID_POD, "");
        let mut host = host;
        host.files.remove(Path::new(INIT_MOUNTINFO));
        let err = HostMounts::read(&host).unwrap_err();
        assert!(err.starts_with("reading /proc/1/mountinfo: "), "{err}");
    }
}
