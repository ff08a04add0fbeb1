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

use super::engine::ScannedPodDir;
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
            tracing::info!(dirs = ?w.parents(), "pod directories: watching where the kubelet creates them");
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
#[derive(Clone, PartialEq, Eq)]
enum Kind {
    /// The kubepods directory: Guaranteed pods' directories and the QoS
    /// directories are created in it.
    Kubepods,
    /// A QoS directory: Burstable or BestEffort pods' directories.
    Qos,
    /// A pod's directory (its UID): its sandbox's and containers'.
    Pod(String),
}

/// One directory event, for the engine, in the kernel's order.
enum Change {
    PodAppeared(PodCgroup),
    PodRemoved(String),
    ChildAppeared(String, u64),
    ChildRemoved(String, u64),
}

struct Watcher {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, (PathBuf, Kind)>,
    /// The children of watched pod directories, by path: a removal names
    /// only the path.
    children: HashMap<PathBuf, u64>,
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
            children: HashMap::new(),
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

    /// The watched directories pods' directories appear in (kubepods and
    /// its QoS directories), in path order.
    fn parents(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self
            .dirs
            .values()
            .filter(|(_, k)| !matches!(k, Kind::Pod(_)))
            .map(|(p, _)| p.clone())
            .collect();
        dirs.sort();
        dirs
    }

    /// Watches a pod's directory (before reading it), and returns its
    /// children now, oldest first. A directory that went meanwhile has
    /// none.
    fn watch_pod(&mut self, pod: &PodCgroup) -> Vec<u64> {
        if self.add(&pod.path, Kind::Pod(pod.uid.clone())).is_err() {
            return Vec::new();
        }
        pods::children(&pod.path)
            .into_iter()
            .map(|(path, id)| {
                self.children.insert(path, id);
                id
            })
            .collect()
    }

    /// Every pod directory in the watched directories now, each watched,
    /// with its children, handed to the engine.
    fn scan(&mut self, engine: &impl Sink) {
        let mut now = BTreeMap::new();
        for parent in self.parents() {
            for pod in pods::pod_cgroups_in(&parent) {
                let children = self.watch_pod(&pod);
                now.insert(
                    pod.uid,
                    ScannedPodDir {
                        id: pod.cgroup_id,
                        children,
                    },
                );
            }
        }
        tracing::debug!(pods = now.len(), "pod directories read");
        engine.scanned(now);
    }

    /// A pod's directory appeared: watched, then read.
    fn pod_appeared(&mut self, pod: PodCgroup, changes: &mut Vec<Change>) {
        let uid = pod.uid.clone();
        let children = self.watch_pod(&pod);
        changes.push(Change::PodAppeared(pod));
        changes.extend(
            children
                .into_iter()
                .map(|id| Change::ChildAppeared(uid.clone(), id)),
        );
    }

    /// Applies events until the kubepods directory goes (Ok) or reading
    /// fails.
    fn run(&mut self, engine: &impl Sink) -> nix::Result<()> {
        while self.next(engine)? {}
        Ok(())
    }

    /// Waits for the next events and applies them; false once the
    /// kubepods directory went.
    fn next(&mut self, engine: &impl Sink) -> nix::Result<bool> {
        {
            let events = self.inotify.read_events()?;
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
                        return Ok(false);
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
                let created = ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                match (kind, created) {
                    (Kind::Pod(uid), true) => {
                        if let Ok(meta) = std::fs::symlink_metadata(&path) {
                            let id = std::os::unix::fs::MetadataExt::ino(&meta);
                            self.children.insert(path, id);
                            changes.push(Change::ChildAppeared(uid, id));
                        }
                    }
                    (Kind::Pod(uid), false) => {
                        if let Some(id) = self.children.remove(&path) {
                            changes.push(Change::ChildRemoved(uid, id));
                        }
                    }
                    (Kind::Kubepods, true) if pods::is_qos_dir_name(name) => {
                        // A QoS directory's first pod: watch it, then read
                        // what it already holds.
                        self.add(&path, Kind::Qos)?;
                        for pod in pods::pod_cgroups_in(&path) {
                            self.pod_appeared(pod, &mut changes);
                        }
                    }
                    (_, true) => {
                        if let Some(pod) = pods::pod_cgroup_at(&path) {
                            self.pod_appeared(pod, &mut changes);
                        }
                    }
                    (_, false) => {
                        if let Some(uid) = pods::pod_uid_of_dir(name) {
                            self.children.retain(|child, _| !child.starts_with(&path));
                            changes.push(Change::PodRemoved(uid));
                        }
                    }
                }
            }
            if rescan {
                tracing::warn!(
                    "pod directories: the event queue overflowed; reading every directory again"
                );
                self.scan(engine);
            } else if !changes.is_empty() {
                engine.apply(changes);
            }
            Ok(true)
        }
    }
}

/// Where the watcher's findings go: the engine (a trait so the watcher's
/// own test can record them).
trait Sink {
    /// Every pod directory, read whole.
    fn scanned(&self, now: BTreeMap<String, ScannedPodDir>);
    /// Changes, in the kernel's order.
    fn apply(&self, changes: Vec<Change>);
}

impl Sink for SharedEngine {
    fn scanned(&self, now: BTreeMap<String, ScannedPodDir>) {
        lock(self).pod_cgroups_scanned(now);
    }

    fn apply(&self, changes: Vec<Change>) {
        let mut engine = lock(self);
        for change in changes {
            match change {
                Change::PodAppeared(pod) => engine.pod_cgroup_appeared(&pod.uid, pod.cgroup_id),
                Change::PodRemoved(uid) => engine.pod_cgroup_removed(&uid),
                Change::ChildAppeared(uid, id) => engine.pod_dir_child_appeared(&uid, id),
                Change::ChildRemoved(uid, id) => engine.pod_dir_child_removed(&uid, id),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kyverno_runtime_cgroups::{CgroupRoot, CgroupVersion};
    use std::cell::RefCell;
    use std::os::unix::fs::MetadataExt;

    const UID: &str = "1f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10";
    const UID2: &str = "2f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10";

    /// What the engine would have been told, as text.
    #[derive(Default)]
    struct Recorder(RefCell<Vec<String>>);

    impl Sink for Recorder {
        fn scanned(&self, now: BTreeMap<String, ScannedPodDir>) {
            for (uid, dir) in now {
                self.0
                    .borrow_mut()
                    .push(format!("scanned {uid} {} {:?}", dir.id, dir.children));
            }
        }
        fn apply(&self, changes: Vec<Change>) {
            for c in changes {
                self.0.borrow_mut().push(match c {
                    Change::PodAppeared(p) => format!("pod {} {}", p.uid, p.cgroup_id),
                    Change::PodRemoved(uid) => format!("pod gone {uid}"),
                    Change::ChildAppeared(uid, id) => format!("child {uid} {id}"),
                    Change::ChildRemoved(uid, id) => format!("child gone {uid} {id}"),
                });
            }
        }
    }

    fn ino(p: &Path) -> u64 {
        std::fs::metadata(p)
            .map(|m| m.ino())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn mkdir(p: &Path) {
        std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }

    /// The next batch of events, as recorded.
    fn next(w: &mut Watcher, r: &Recorder) -> Vec<String> {
        assert!(w.next(r).unwrap_or_else(|e| panic!("{e}")));
        r.0.borrow_mut().drain(..).collect()
    }

    /// Batches until `n` lines were recorded.
    fn at_least(w: &mut Watcher, r: &Recorder, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(next(w, r));
        }
        got
    }

    /// The watcher on a scratch tree shaped as the kubelet's (inotify sees
    /// mkdir and rmdir on any file system): what is there first, a pod
    /// appearing in a QoS directory that appeared after the watch began,
    /// its sandbox's and container's directories, and their removal.
    #[test]
    fn reports_pod_directories_and_their_children_in_order() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let kubepods = tmp.path().join("kubepods");
        let first = kubepods.join("besteffort").join(format!("pod{UID}"));
        mkdir(&first.join("sandbox"));
        let hierarchies = Resolver::new(vec![CgroupRoot::new(tmp.path(), CgroupVersion::V2)]);
        let dirs = hierarchies.kubepods_dirs();
        assert_eq!(dirs, vec![kubepods.clone()]);
        let mut w = Watcher::start(&dirs).unwrap_or_else(|e| panic!("{e}"));
        let r = Recorder::default();
        w.scan(&r);
        assert_eq!(
            r.0.borrow_mut().drain(..).collect::<Vec<_>>(),
            vec![format!(
                "scanned {UID} {} [{}]",
                ino(&first),
                ino(&first.join("sandbox"))
            )]
        );

        // A QoS directory created after the watch began, with a pod in it;
        // then that pod's sandbox and container.
        let second = kubepods.join("burstable").join(format!("pod{UID2}"));
        mkdir(&second);
        assert_eq!(
            at_least(&mut w, &r, 1),
            vec![format!("pod {UID2} {}", ino(&second))]
        );
        mkdir(&second.join("sandbox"));
        mkdir(&second.join("ctr"));
        assert_eq!(
            at_least(&mut w, &r, 2),
            vec![
                format!("child {UID2} {}", ino(&second.join("sandbox"))),
                format!("child {UID2} {}", ino(&second.join("ctr"))),
            ]
        );

        // Removal: the container's directory, then the pod's.
        let ctr = ino(&second.join("ctr"));
        let sandbox = ino(&second.join("sandbox"));
        std::fs::remove_dir(second.join("ctr")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            at_least(&mut w, &r, 1),
            vec![format!("child gone {UID2} {ctr}")]
        );
        std::fs::remove_dir(second.join("sandbox")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::remove_dir(&second).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            at_least(&mut w, &r, 2),
            vec![
                format!("child gone {UID2} {sandbox}"),
                format!("pod gone {UID2}")
            ]
        );

        // Not a pod's directory: nothing; the first pod's container: seen.
        mkdir(&kubepods.join("not-a-pod"));
        mkdir(&first.join("ctr"));
        assert_eq!(
            at_least(&mut w, &r, 1),
            vec![format!("child {UID} {}", ino(&first.join("ctr")))]
        );
    }
}
