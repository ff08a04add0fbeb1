//! Temporary cgroup v2 directories for the tests and the bench that send
//! real traffic from a cgroup of their own.

#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

/// The mount point of the first cgroup2 filesystem (field 5 of a mountinfo
/// line whose filesystem type, after " - ", is cgroup2).
pub fn cgroup2_mount() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .expect("no cgroup2 mount in /proc/self/mountinfo")
}

/// A child cgroup of the cgroup v2 mount (`krt-<tag>-<pid>`), removed on
/// drop.
pub struct TempCgroup(pub PathBuf);

impl TempCgroup {
    pub fn new(tag: &str) -> Self {
        let dir = cgroup2_mount().join(format!("krt-{tag}-{}", std::process::id()));
        // A leftover of an aborted run (same pid reused) would still hold
        // links; it is empty, so removing it is safe.
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self(dir)
    }

    /// Its id (the directory's inode), as `bpf_skb_cgroup_id` reads it.
    pub fn id(&self) -> u64 {
        kyverno_runtime_bpf::cgroup_attach::cgroup_id(&self.0).unwrap()
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        // Its processes have exited or left; one may linger in
        // cgroup.procs for a moment, so retry the rmdir.
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("cannot remove {}", self.0.display());
    }
}
