//! The host side of a pod for the daemon tests that run on this host's
//! kernel: the container cgroup a container runtime would make and a bpffs
//! of the test's own for the daemon's pins.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Tries a TCP connection to `addr` (`host:port`) from inside `cgroup`,
/// giving up after `seconds`; true if it connected. A dropped SYN shows
/// as the timeout.
pub fn connects_within(cgroup: &Path, addr: &str, seconds: &str) -> bool {
    let Some((host, port)) = addr.split_once(':') else {
        return false;
    };
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec 3<>/dev/tcp/{host}/{port}",
        cgroup.display()
    );
    Command::new("timeout")
        .args([seconds, "bash", "-c", &script])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The host's cgroup v2 mount (the unified hierarchy on a hybrid host),
/// read with the probe's mountinfo parser.
pub fn cgroup2_root() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    kyverno_runtime_compat::parse_mountinfo(&text)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .expect("a cgroup2 mount")
}

/// One pod's container cgroup (cgroupfs driver, BestEffort, containerd's
/// naming) and a private bpffs mounted under the test's directory.
/// Dropping it unmounts the bpffs, which drops every pin so the links
/// detach, then removes the cgroups it created, innermost first.
pub struct HostPod {
    /// The container's cgroup directory; a process written to its
    /// `cgroup.procs` is in the pod.
    pub container: PathBuf,
    /// The bpffs mount; the daemon pins under `bpffs/kyverno-runtime`.
    pub bpffs: PathBuf,
    created: Vec<PathBuf>,
}

impl HostPod {
    /// Mounts a bpffs at `dir/bpffs` and creates the cgroup of container
    /// `container_id` of the pod whose uid is `pod_uid`.
    pub fn new(dir: &Path, pod_uid: &str, container_id: &str) -> HostPod {
        let pod = HostPod::unmounted(dir, pod_uid, container_id);
        pod.mount_bpffs();
        pod
    }

    /// As [`HostPod::new`], but `dir/bpffs` is left a plain directory
    /// until [`HostPod::mount_bpffs`] (a pin directory not yet usable).
    pub fn unmounted(dir: &Path, pod_uid: &str, container_id: &str) -> HostPod {
        let bpffs = dir.join("bpffs");
        std::fs::create_dir_all(&bpffs).unwrap();
        let root = cgroup2_root();
        let pod_dir = root.join(format!("kubepods/besteffort/pod{pod_uid}"));
        let container = pod_dir.join(container_id);
        let mut created = Vec::new();
        for d in [
            root.join("kubepods"),
            root.join("kubepods/besteffort"),
            pod_dir,
            container.clone(),
        ] {
            if !d.exists() {
                std::fs::create_dir(&d).unwrap();
                created.push(d);
            }
        }
        HostPod {
            container,
            bpffs,
            created,
        }
    }

    /// Mounts a bpffs at `dir/bpffs` (the test's own scratch directory).
    pub fn mount_bpffs(&self) {
        assert!(Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&self.bpffs)
            .status()
            .unwrap()
            .success());
    }

    /// The daemon's `--pin-dir`.
    pub fn pins(&self) -> PathBuf {
        self.bpffs.join("kyverno-runtime")
    }

    /// The container cgroup's id (its inode number), the key of the
    /// kernel maps.
    pub fn cgroup_id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(&self.container).unwrap().ino()
    }
}

impl Drop for HostPod {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.bpffs).status();
        // A cgroup with no processes left can be removed.
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
