//! Attribution: which pod an event came from.
//!
//! [`Index`] is both a pod handler (the engine calls [`Index::upsert`] and
//! [`Index::remove`] from the pod watch, before anything can ask about that
//! pod's events) and a [`Stage`]: it resolves an event to a [`PodRef`] by
//! cgroup id, then by pod uid (a source that knows the pod fills it in),
//! then by PID (reading `/proc/<pid>/cgroup`), and drops the event when none
//! of those hit, counting `attribution_misses_total` and
//! `events_dropped_total{reason="unattributed"}`: a silent drop would hide
//! an attribution regression.

use crate::collector::Stage;
use crate::event::{Event, PodRef};
use kyverno_runtime_metrics::{DropReason, Metrics};
use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

/// The most bytes of a `/proc/<pid>/cgroup` read (a line per hierarchy).
const MAX_PROC_CGROUP_BYTES: u64 = 64 * 1024;

#[derive(Default)]
struct Maps {
    by_cgroup: HashMap<u64, Arc<PodRef>>,
    by_uid: HashMap<String, Arc<PodRef>>,
    version: u64,
}

/// The cgroup, uid and PID index of this node's pods.
pub struct Index {
    maps: RwLock<Maps>,
    metrics: Option<Arc<Metrics>>,
    /// Where `/proc` is (the host's, through hostPID).
    proc_root: PathBuf,
    /// The cgroup v2 mount the PID lookup resolves a cgroup path under;
    /// without it, PIDs are not looked up.
    cgroup_root: Option<PathBuf>,
}

impl Index {
    /// An empty index; misses counted in `metrics`. PIDs are resolved
    /// through `proc_root/<pid>/cgroup` under `cgroup_root`.
    pub fn new(
        metrics: Option<Arc<Metrics>>,
        proc_root: impl Into<PathBuf>,
        cgroup_root: Option<PathBuf>,
    ) -> Self {
        Index {
            maps: RwLock::default(),
            metrics,
            proc_root: proc_root.into(),
            cgroup_root,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Maps> {
        self.maps.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Maps> {
        self.maps.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a pod (idempotent): its labels, owner and cgroups
    /// as given; cgroups it no longer has are evicted. The stored pod gets
    /// a fresh [`PodRef::version`].
    pub fn upsert(&self, mut pod: PodRef) {
        let mut maps = self.write();
        maps.version += 1;
        pod.version = maps.version;
        let pod = Arc::new(pod);
        if let Some(old) = maps.by_uid.insert(pod.uid.clone(), Arc::clone(&pod)) {
            for cgroup in old.containers.keys() {
                if !pod.containers.contains_key(cgroup) {
                    maps.by_cgroup.remove(cgroup);
                }
            }
        }
        for cgroup in pod.containers.keys() {
            maps.by_cgroup.insert(*cgroup, Arc::clone(&pod));
        }
    }

    /// Removes a pod and every cgroup it owned.
    pub fn remove(&self, uid: &str) {
        let mut maps = self.write();
        if let Some(old) = maps.by_uid.remove(uid) {
            for cgroup in old.containers.keys() {
                if maps.by_cgroup.get(cgroup).is_some_and(|p| p.uid == old.uid) {
                    maps.by_cgroup.remove(cgroup);
                }
            }
        }
    }

    /// The pod owning cgroup `id`.
    pub fn by_cgroup(&self, id: u64) -> Option<Arc<PodRef>> {
        self.read().by_cgroup.get(&id).cloned()
    }

    /// The pod with uid `uid`.
    pub fn by_uid(&self, uid: &str) -> Option<Arc<PodRef>> {
        self.read().by_uid.get(uid).cloned()
    }

    /// The cgroup v2 path of `pid` relative to the hierarchy's root, from
    /// `/proc/<pid>/cgroup`. The kernel writes it relative to the
    /// reader's cgroup namespace: a daemon in a namespace of its own sees
    /// the host's cgroups as `/../../<path>`, as many `..` as its own
    /// namespace root is deep, which PID 1's entry (the host root) tells.
    fn cgroup_path(&self, pid: u32) -> Option<String> {
        let read = |pid: &str| -> Option<String> {
            // One line per hierarchy, a few hundred bytes: a kernel file,
            // but nothing is read unbounded.
            let mut text = String::new();
            std::fs::File::open(self.proc_root.join(pid).join("cgroup"))
                .ok()?
                .take(MAX_PROC_CGROUP_BYTES + 1)
                .read_to_string(&mut text)
                .ok()?;
            if text.len() as u64 > MAX_PROC_CGROUP_BYTES {
                return None;
            }
            Some(
                text.lines()
                    .find_map(|l| l.strip_prefix("0::"))?
                    .to_string(),
            )
        };
        let ups = |p: &str| p.split('/').filter(|c| *c == "..").count();
        let depth = read("1").map_or(0, |p| ups(&p));
        let path = read(&pid.to_string())?;
        let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let leading = parts.iter().take_while(|c| **c == "..").count();
        // Fewer `..` than our depth: inside our own namespace, whose host
        // path we cannot name; more, or one further in: not a real path.
        if leading != depth || parts[leading..].contains(&"..") {
            return None;
        }
        Some(parts[leading..].join("/"))
    }

    /// The pod process `pid` runs in, and its cgroup: the cgroup v2 path in
    /// `/proc/<pid>/cgroup` resolved under the cgroup root to a directory,
    /// whose inode is the cgroup id.
    pub fn by_pid(&self, pid: u32) -> Option<(u64, Arc<PodRef>)> {
        let root = self.cgroup_root.as_ref()?;
        let path = self.cgroup_path(pid)?;
        let id = std::fs::metadata(root.join(path)).ok()?.ino();
        Some((id, self.by_cgroup(id)?))
    }

    /// Pods indexed.
    pub fn len(&self) -> usize {
        self.read().by_uid.len()
    }

    /// Whether no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn miss(&self, event: &Event) {
        if let Some(m) = &self.metrics {
            m.attribution_miss();
            m.events_dropped(event.source, DropReason::unattributed, event.count);
        }
    }
}

impl Stage for Index {
    fn name(&self) -> &'static str {
        "attribution"
    }

    fn process(&self, event: &mut Event) -> bool {
        if event.pod.is_some() {
            return true;
        }
        let pod = {
            let maps = self.read();
            event
                .cgroup
                .and_then(|id| maps.by_cgroup.get(&id).cloned())
                .or_else(|| {
                    event
                        .pod_uid
                        .as_deref()
                        .and_then(|uid| maps.by_uid.get(uid).cloned())
                })
        };
        let pod = match pod {
            Some(p) => Some(p),
            None => match event.process.as_ref().map(|p| p.pid) {
                Some(pid) => self.by_pid(pid).map(|(cgroup, p)| {
                    event.cgroup = Some(cgroup);
                    p
                }),
                None => None,
            },
        };
        match pod {
            Some(p) => {
                event.pod = Some(p);
                true
            }
            None => {
                self.miss(event);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::event::{Facts, ProcessInfo};
    use std::collections::BTreeMap;

    fn pod(uid: &str, cgroups: &[u64]) -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            containers: cgroups.iter().map(|c| (*c, format!("c{c}"))).collect(),
            ..PodRef::default()
        }
    }

    fn open(cgroup: Option<u64>) -> Event {
        let mut e = Event::new(
            "openexec-observe",
            Facts::Open {
                path: "/etc/passwd".into(),
            },
        );
        e.cgroup = cgroup;
        e
    }

    #[test]
    fn a_proc_cgroup_file_over_the_bound_is_not_read() {
        let root = std::env::temp_dir().join(format!("krt-proc-bound-{}", std::process::id()));
        let file = |pid: &str, len: Option<u64>| {
            std::fs::create_dir_all(root.join(pid))?;
            let path = root.join(pid).join("cgroup");
            match len {
                None => std::fs::write(path, "0::/\n"),
                Some(n) => std::fs::write(&path, "0::/kubepods/pod1\n")
                    .and_then(|()| std::fs::OpenOptions::new().write(true).open(&path))
                    .and_then(|f| f.set_len(n)),
            }
        };
        let made = file("1", None)
            .and_then(|()| file("42", Some(18)))
            .and_then(|()| file("43", Some(MAX_PROC_CGROUP_BYTES + 1)));
        let index = Index::new(None, &root, None);
        let (fits, over) = (index.cgroup_path(42), index.cgroup_path(43));
        let _ = std::fs::remove_dir_all(&root);
        made.unwrap();
        assert_eq!(fits.as_deref(), Some("kubepods/pod1"));
        assert_eq!(over, None);
    }

    #[test]
    fn attributes_by_cgroup_then_uid_and_drops_and_counts_a_miss() {
        let metrics = Arc::new(Metrics::new());
        let index = Index::new(Some(metrics.clone()), "/nonexistent", None);
        index.upsert(pod("a", &[10, 11]));
        let mut e = open(Some(11));
        assert!(index.process(&mut e));
        assert_eq!(e.pod.as_ref().unwrap().uid, "a");
        assert_eq!(e.container(), Some("c11"));

        let mut by_uid = open(None);
        by_uid.pod_uid = Some("a".into());
        assert!(index.process(&mut by_uid));
        assert_eq!(by_uid.pod.unwrap().uid, "a");

        let mut miss = open(Some(99));
        miss.count = 7;
        assert!(!index.process(&mut miss));
        let text = metrics.encode();
        assert!(
            text.contains("nirmata_runtime_attribution_misses_total 1"),
            "{text}"
        );
        assert!(
            text.contains(r#"nirmata_runtime_events_dropped_total{source="openexec-observe",reason="unattributed"} 7"#),
            "{text}"
        );
    }

    #[test]
    fn an_update_evicts_cgroups_the_pod_no_longer_has_and_a_delete_all() {
        let index = Index::new(None, "/nonexistent", None);
        index.upsert(pod("a", &[10, 11]));
        let v1 = index.by_uid("a").unwrap().version;
        let mut relabeled = pod("a", &[11, 12]);
        relabeled.labels = BTreeMap::from([("app".into(), "web".into())]);
        index.upsert(relabeled);
        assert!(index.by_cgroup(10).is_none());
        let now = index.by_cgroup(12).unwrap();
        assert_eq!(now.labels["app"], "web");
        assert!(now.version > v1, "a replaced pod has a new version");
        index.remove("a");
        assert!(index.by_cgroup(11).is_none() && index.by_uid("a").is_none());
        assert!(index.is_empty());
    }

    #[test]
    fn attributes_by_pid_through_proc_and_the_cgroup_directory() {
        // A fresh directory of this test's own, removed on drop.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let cg = dir.join("cgroup/kubepods/pod1/ctr");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::create_dir_all(dir.join("proc/4242")).unwrap();
        std::fs::write(dir.join("proc/4242/cgroup"), "0::/kubepods/pod1/ctr\n").unwrap();
        std::fs::create_dir_all(dir.join("proc/4243")).unwrap();
        std::fs::write(dir.join("proc/4243/cgroup"), "0::/../../elsewhere\n").unwrap();
        std::fs::create_dir_all(dir.join("proc/1")).unwrap();
        std::fs::write(dir.join("proc/1/cgroup"), "0::/\n").unwrap();
        let id = std::fs::metadata(&cg).unwrap().ino();
        let index = Index::new(None, dir.join("proc"), Some(dir.join("cgroup")));
        index.upsert(pod("p", &[id]));
        let mut e = open(None);
        e.process = Some(ProcessInfo {
            pid: 4242,
            comm: "cat".into(),
        });
        assert!(index.process(&mut e));
        assert_eq!(e.cgroup, Some(id));
        assert_eq!(e.pod.unwrap().uid, "p");
        let mut outside = open(None);
        outside.process = Some(ProcessInfo {
            pid: 4243,
            comm: "cat".into(),
        });
        assert!(!index.process(&mut outside));
        // A daemon in a cgroup namespace two deep sees PID 1 at /../.. and
        // the pod's cgroup as /../../kubepods/...
        std::fs::write(dir.join("proc/1/cgroup"), "0::/../..\n").unwrap();
        std::fs::write(
            dir.join("proc/4242/cgroup"),
            "0::/../../kubepods/pod1/ctr\n",
        )
        .unwrap();
        let mut nested = open(None);
        nested.process = Some(ProcessInfo {
            pid: 4242,
            comm: "cat".into(),
        });
        assert!(index.process(&mut nested));
        assert_eq!(nested.pod.unwrap().uid, "p");
    }
}
