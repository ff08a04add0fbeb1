//! Watches the kubelet's pod directories appear and go (inotify on the
//! kubepods directory and its QoS directories of the cgroup v2 hierarchy)
//! and tells the engine, which binds each to the open/exec policies that
//! select its pod (see `engine/pod_dirs.rs`).
//!
//! The kubelet creates a pod's directory before it asks the runtime for
//! the pod's sandbox, so the engine usually hears of it hundreds of
//! milliseconds before the first container is created in it. Watches are
//! added before the directories are read, so a directory created between
//! the two is seen by one or the other. An event queue overflow reads
//! everything again; the kubepods directory going away (a kubelet
//! restart with another cgroup root) starts over.

use super::watches::{lock, SharedEngine};
use kyverno_runtime_cgroups::pods::{self, PodCgroup};
use kyverno_runtime_cgroups::Resolver;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the watcher waits before looking again for a kubepods
/// directory that is not there (yet), or after a failure.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Starts the watcher's thread.
pub fn spawn(engine: SharedEngine, hierarchies: Resolver) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("pod-dirs".into())
        .spawn(move || watch(&engine, &hierarchies))
        .map(|_| ())
}

fn watch(engine: &SharedEngine, hierarchies: &Resolver) {
    let mut waiting_said = false;
    loop {
        let kubepods = hierarchies.kubepods_dirs();
        if kubepods.is_empty() {
            if !waiting_said {
                tracing::info!("pod directories: no kubepods directory on the cgroup v2 hierarchy yet; looking again every second");
                waiting_said = true;
            }
            std::thread::sleep(LOOK_AGAIN);
            continue;
        }
        waiting_said = false;
        let ended = Watcher::start(&kubepods).and_then(|mut w| {
            tracing::info!(dirs = ?w.watched(), "pod directories: watching where the kubelet creates them");
            w.scan(engine);
            w.run(engine)
        });
        match ended {
            Ok(()) => {
                tracing::info!("pod directories: a kubepods directory went away; looking again")
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod directories: watching failed; looking again in a second")
            }
        }
        std::thread::sleep(LOOK_AGAIN);
    }
}

/// What a watched directory is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The kubepods directory: Guaranteed pods' directories and the QoS
    /// directories are created in it.
    Kubepods,
    /// A QoS directory: Burstable or BestEffort pods' directories.
    Qos,
}

/// One directory event, for the engine.
enum Change {
    Appeared(PodCgroup),
    Removed(String),
}

struct Watcher {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, (PathBuf, Kind)>,
}

/// Directory creation and removal, and renames (which a kubelet never
/// does, but a tree moved into place looks so).
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_ONLYDIR
}

impl Watcher {
    fn start(kubepods: &[PathBuf]) -> nix::Result<Self> {
        let mut w = Watcher {
            inotify: Inotify::init(InitFlags::IN_CLOEXEC)?,
            dirs: HashMap::new(),
        };
        for dir in kubepods {
            w.add(dir, Kind::Kubepods)?;
            for qos in pods::qos_dirs(dir) {
                w.add(&qos, Kind::Qos)?;
            }
        }
        Ok(w)
    }

    fn add(&mut self, dir: &Path, kind: Kind) -> nix::Result<()> {
        let wd = self.inotify.add_watch(dir, mask())?;
        self.dirs.insert(wd, (dir.to_path_buf(), kind));
        Ok(())
    }

    fn watched(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = self.dirs.values().map(|(p, _)| p.as_path()).collect();
        dirs.sort();
        dirs
    }

    /// Every pod directory in the watched directories now.
    fn scan(&self, engine: &SharedEngine) {
        let now: BTreeMap<String, u64> = self
            .dirs
            .values()
            .flat_map(|(dir, _)| pods::pod_cgroups_in(dir))
            .map(|p| (p.uid, p.cgroup_id))
            .collect();
        tracing::debug!(pods = now.len(), "pod directories read");
        lock(engine).pod_cgroups_scanned(now);
    }

    /// Applies events until the kubepods directory goes (Ok) or reading
    /// fails.
    fn run(&mut self, engine: &SharedEngine) -> nix::Result<()> {
        loop {
            let events = self.inotify.read_events()?;
            // In the kernel's order: a short-lived pod's directory may come
            // and go in one read.
            let mut changes: Vec<Change> = Vec::new();
            let mut rescan = false;
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    rescan = true;
                    continue;
                }
                let Some((dir, kind)) = self.dirs.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.dirs.remove(&ev.wd);
                    if kind == Kind::Kubepods {
                        return Ok(());
                    }
                    continue;
                }
                let Some(name) = ev.name.as_ref().and_then(|n| n.to_str()) else {
                    continue;
                };
                if !ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                    continue;
                }
                let path = dir.join(name);
                if ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                {
                    if kind == Kind::Kubepods && pods::is_qos_dir_name(name) {
                        // A QoS directory's first pod: watch it, then read
                        // what it already holds.
                        self.add(&path, Kind::Qos)?;
                        changes.extend(
                            pods::pod_cgroups_in(&path)
                                .into_iter()
                                .map(Change::Appeared),
                        );
                    } else if let Some(pod) = pods::pod_cgroup_at(&path) {
                        changes.push(Change::Appeared(pod));
                    }
                } else if let Some(uid) = pods::pod_uid_of_dir(name) {
                    changes.push(Change::Removed(uid));
                }
            }
            if rescan {
                tracing::warn!(
                    "pod directories: the event queue overflowed; reading every directory again"
                );
                self.scan(engine);
                continue;
            }
            if changes.is_empty() {
                continue;
            }
            let mut engine = lock(engine);
            for change in changes {
                match change {
                    Change::Appeared(pod) => engine.pod_cgroup_appeared(&pod.uid, pod.cgroup_id),
                    Change::Removed(uid) => engine.pod_cgroup_removed(&uid),
                }
            }
        }
    }
}
