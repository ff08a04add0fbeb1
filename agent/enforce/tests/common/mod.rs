//! Shared fixtures of the host-kernel tests: a cgroup of the test's own
//! under the host's cgroup v2 mount.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod egress;

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The cgroup v2 mount (the unified hierarchy on a hybrid host), read with
/// the probe's mountinfo parser.
pub fn cgroup2_mount() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    kyverno_runtime_compat::parse_mountinfo(&mountinfo)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .expect("no cgroup2 mount in /proc/self/mountinfo")
}

/// Moves this process into cgroup `dir`: a child's first act, so the
/// sockets it opens belong to the cgroup under test.
pub fn join_cgroup(dir: &Path) {
    fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).unwrap();
}

/// A cgroup under the cgroup v2 mount, removed on drop.
pub struct TempCgroup(pub PathBuf);

impl TempCgroup {
    /// `krt-<suite>-<tag>-<pid>`, recreated if an earlier run left it.
    pub fn new(suite: &str, tag: &str) -> Self {
        let dir = cgroup2_mount().join(format!("krt-{suite}-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    /// Its cgroup id (the directory's inode number).
    pub fn id(&self) -> u64 {
        fs::metadata(&self.0).unwrap().ino()
    }

    /// Removes it, retrying while its last processes exit; true once gone.
    pub fn remove(&self) -> bool {
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        if !self.remove() {
            eprintln!("cannot remove {}", self.0.display());
        }
    }
}
