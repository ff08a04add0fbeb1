//! The cgroup v2 side of the BPF tests and the cgroup_skb bench: the
//! mount, this process's own cgroup and its id, and temporary child
//! cgroups.

#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
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

/// This process's cgroup v2 directory: the `0::PATH` line of
/// /proc/self/cgroup under the cgroup2 mount.
pub fn own_cgroup_dir() -> PathBuf {
    let cgroups = fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no cgroup v2 line (0::PATH) in /proc/self/cgroup");
    cgroup2_mount().join(path.trim_start_matches('/'))
}

/// A cgroup v2 id: the inode number of its directory.
pub fn cgroup_id(dir: &Path) -> u64 {
    fs::metadata(dir)
        .unwrap_or_else(|e| panic!("stat {}: {e}", dir.display()))
        .ino()
}

/// The id of this process's cgroup.
pub fn own_cgroup_id() -> u64 {
    cgroup_id(&own_cgroup_dir())
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
        cgroup_id(&self.0)
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

/// Held (read) by every test that needs this process to stay in its
/// cgroup; the test that moves the process into another cgroup holds it
/// exclusively, so no other test runs meanwhile.
static PROCESS_CGROUP: std::sync::RwLock<()> = std::sync::RwLock::new(());

std::thread_local! {
    /// This thread's hold of [`PROCESS_CGROUP`] (read), and how many
    /// [`SharedCgroup`]s share it. A test may hold two fixtures at once;
    /// taking the lock a second time on one thread would deadlock behind a
    /// writer waiting for the first (std's RwLock lets no reader in past a
    /// waiting writer): the CI run of stop 49's first try hung so.
    static HELD: std::cell::RefCell<(usize, Option<std::sync::RwLockReadGuard<'static, ()>>)> =
        const { std::cell::RefCell::new((0, None)) };
}

/// A share of this thread's read hold of the process's cgroup (see
/// [`shared`]); the hold ends with the last share.
pub struct SharedCgroup(());

impl Drop for SharedCgroup {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.0 -= 1;
            if h.0 == 0 {
                h.1 = None;
            }
        });
    }
}

/// Keeps this process in its cgroup for as long as the share lives: taken
/// once per thread, however many fixtures a test holds.
pub fn shared() -> SharedCgroup {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.0 == 0 {
            h.1 = Some(PROCESS_CGROUP.read().unwrap_or_else(|e| e.into_inner()));
        }
        h.0 += 1;
    });
    SharedCgroup(())
}

/// Moves of this process between cgroups: no [`shared`] hold is taken
/// meanwhile (never call it while this thread holds one).
pub fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    PROCESS_CGROUP.write().unwrap_or_else(|e| e.into_inner())
}
