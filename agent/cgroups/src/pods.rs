//! Pod directories themselves, before any container is in them.
//!
//! The kubelet creates a pod's directory (see [`crate::layout`]) before it
//! asks the runtime for the pod's sandbox, and every container of the pod
//! is created inside it. Where no runtime hook announces containers before
//! they start (containerd 1.6, CRI-O without NRI), the daemon watches the
//! directories pod directories appear in, and the kernel checks a task's
//! parent cgroup when its own is not known yet: a container is then covered
//! from its first instruction as long as the daemon noticed its pod's
//! directory first, which happens while the runtime is still creating the
//! sandbox.
//!
//! Only cgroup v2 directories are found here: a cgroup v1 directory has no
//! id the kernel programs can compare.

use crate::layout::{self, Driver};
use crate::mountinfo::CgroupVersion;
use crate::resolve::{walk_dirs, Resolver, Step};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A pod's own cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// The pod UID the directory's name carries (with `-`, as the API
    /// server writes it, whichever driver named the directory).
    pub uid: String,
    /// The directory.
    pub path: PathBuf,
    /// Its cgroup id (the directory's inode on cgroup v2).
    pub cgroup_id: u64,
}

/// The pod UID a directory name carries, if the name is a pod directory's
/// (`pod<uid>` of the cgroupfs driver, `[<prefix>-]pod<uid_>.slice` of the
/// systemd driver).
pub fn pod_uid_of_dir(name: &str) -> Option<String> {
    if !layout::looks_like_pod_dir(name) {
        return None;
    }
    let uid = match name.strip_suffix(".slice") {
        Some(core) => core
            .strip_prefix("pod")
            .or_else(|| core.rsplit_once("-pod").map(|(_, rest)| rest))?
            .replace('_', "-"),
        None => name.strip_prefix("pod")?.to_string(),
    };
    layout::valid_uid(&uid).then_some(uid)
}

/// The pod directory of `path`, if `path` is one (its name says so and it
/// is a directory), with its cgroup id.
pub fn pod_cgroup_at(path: &Path) -> Option<PodCgroup> {
    let uid = pod_uid_of_dir(path.file_name()?.to_str()?)?;
    let meta = fs::symlink_metadata(path).ok()?;
    meta.is_dir().then(|| PodCgroup {
        uid,
        path: path.to_path_buf(),
        cgroup_id: meta.ino(),
    })
}

/// Whether a directory name is one of the kubelet's QoS parents inside
/// the kubepods directory (`burstable`, `besteffort`, or a slice named
/// after them, prefixed or not).
fn is_qos_dir(name: &str) -> bool {
    let core = name.strip_suffix(".slice").unwrap_or(name);
    core == "burstable"
        || core == "besteffort"
        || core.ends_with("-burstable")
        || core.ends_with("-besteffort")
}

/// Whether a directory name is the kubelet's kubepods directory
/// (`kubepods`, `kubepods.slice`, or a prefixed slice such as kind's
/// `kubelet-kubepods.slice`).
fn is_kubepods_dir(name: &str) -> bool {
    name == "kubepods" || name == "kubepods.slice" || name.ends_with("-kubepods.slice")
}

/// The QoS parents of a kubepods directory that exist now.
pub fn qos_dirs(kubepods: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(kubepods) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().is_some_and(is_qos_dir))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

/// Whether a directory name is a QoS parent (see [`qos_dirs`]).
pub fn is_qos_dir_name(name: &str) -> bool {
    is_qos_dir(name)
}

/// The pod directories directly inside `parent` (a kubepods or QoS
/// directory) now.
pub fn pod_cgroups_in(parent: &Path) -> Vec<PodCgroup> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<PodCgroup> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| pod_cgroup_at(&e.path()))
        .collect();
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The directories directly inside a pod's directory now (its sandbox's
/// and its containers'), with their cgroup ids, oldest first: kernfs
/// hands out ids in increasing order, so the lowest is the one created
/// first, which in a pod's directory is the sandbox's (the kubelet creates
/// containers only once the sandbox runs).
pub fn children(pod_dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(entries) = fs::read_dir(pod_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, u64)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.ino())))
        .collect();
    found.sort_by_key(|(_, id)| *id);
    found
}

impl Resolver {
    /// The kubepods directories on the cgroup v2 hierarchies: the standard
    /// ones (`kubepods.slice`, `kubepods`) where they exist, else what a
    /// bounded breadth-first search finds (a `--cgroup-root` or a kind
    /// node's prefix). Empty where the node has no v2 hierarchy or no
    /// pods yet.
    pub fn kubepods_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for root in self.roots() {
            if root.version != CgroupVersion::V2 {
                continue;
            }
            let standard: Vec<PathBuf> = [Driver::Systemd, Driver::Cgroupfs]
                .iter()
                .filter_map(|d| {
                    let name = match d {
                        Driver::Systemd => "kubepods.slice",
                        Driver::Cgroupfs => "kubepods",
                    };
                    root.map(Path::new(name))
                })
                .filter(|p| p.is_dir())
                .collect();
            if standard.is_empty() {
                out.extend(search_kubepods(&root.mount_point));
            } else {
                out.extend(standard);
            }
        }
        out
    }

    /// The pod's own directory on a cgroup v2 hierarchy, with its id, if
    /// it exists now.
    pub fn pod_cgroup(&self, uid: &str, qos_class: Option<&str>) -> Option<PodCgroup> {
        if !layout::valid_uid(uid) {
            return None;
        }
        let candidates = layout::pod_dirs(uid, layout::qos_classes(qos_class));
        for root in self.roots() {
            if root.version != CgroupVersion::V2 {
                continue;
            }
            for (_, relative) in &candidates {
                if let Some(found) = root.map(relative).and_then(|p| pod_cgroup_at(&p)) {
                    return Some(found);
                }
            }
        }
        for kubepods in self.kubepods_dirs() {
            let parents = std::iter::once(kubepods.clone()).chain(qos_dirs(&kubepods));
            for parent in parents {
                if let Some(found) = pod_cgroups_in(&parent).into_iter().find(|p| p.uid == uid) {
                    return Some(found);
                }
            }
        }
        None
    }
}

/// The shallowest kubepods directories below `start`
/// ([`walk_dirs`](crate::resolve::walk_dirs); pods' directories are not
/// entered, and nothing below the level of the first found).
fn search_kubepods(start: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    walk_dirs(start, |name, path| {
        if is_kubepods_dir(name) {
            found.push(path);
            Step::Skip
        } else if found.is_empty() && !layout::looks_like_pod_dir(name) {
            Step::Descend
        } else {
            Step::Skip
        }
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::CgroupRoot;

    const UID: &str = "1f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10";

    #[test]
    fn pod_directory_names_carry_the_uid() {
        let systemd = UID.replace('-', "_");
        assert_eq!(pod_uid_of_dir(&format!("pod{UID}")).as_deref(), Some(UID));
        assert_eq!(
            pod_uid_of_dir(&format!("kubepods-burstable-pod{systemd}.slice")).as_deref(),
            Some(UID)
        );
        assert_eq!(
            pod_uid_of_dir(&format!("kubepods-pod{systemd}.slice")).as_deref(),
            Some(UID)
        );
        assert_eq!(
            pod_uid_of_dir(&format!("kubelet-kubepods-besteffort-pod{systemd}.slice")).as_deref(),
            Some(UID)
        );
        for not_a_pod in [
            "burstable",
            "kubepods-burstable.slice",
            "cri-containerd-abc.scope",
            "pod",
            "pod../../etc",
            "podshort",
            "",
        ] {
            assert_eq!(pod_uid_of_dir(not_a_pod), None, "{not_a_pod:?}");
        }
    }

    #[test]
    fn qos_and_kubepods_names() {
        for qos in [
            "burstable",
            "besteffort",
            "kubepods-burstable.slice",
            "kubelet-kubepods-besteffort.slice",
        ] {
            assert!(is_qos_dir(qos), "{qos}");
        }
        assert!(!is_qos_dir(&format!("pod{UID}")));
        assert!(!is_qos_dir("kubepods.slice"));
        for kubepods in ["kubepods", "kubepods.slice", "kubelet-kubepods.slice"] {
            assert!(is_kubepods_dir(kubepods), "{kubepods}");
        }
        assert!(!is_kubepods_dir("kubepods-burstable.slice"));
    }

    /// A v2 tree in a tempdir: the kubelet's directories, found by the
    /// standard names and, under a prefix, by the search.
    #[test]
    fn finds_kubepods_and_pod_directories_standard_and_prefixed() {
        for (prefix, kubepods) in [("", "kubepods"), ("krt-node/kubelet", "kubepods")] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let top = tmp.path().join(prefix).join(kubepods);
            let pod = top.join("burstable").join(format!("pod{UID}"));
            fs::create_dir_all(&pod).expect("mkdir");
            fs::create_dir_all(top.join("besteffort")).expect("mkdir");
            let resolver = Resolver::new(vec![CgroupRoot::new(tmp.path(), CgroupVersion::V2)]);
            assert_eq!(resolver.kubepods_dirs(), vec![top.clone()], "{prefix:?}");
            assert_eq!(
                qos_dirs(&top),
                vec![top.join("besteffort"), top.join("burstable")]
            );
            let found = resolver.pod_cgroup(UID, Some("Burstable")).expect("found");
            assert_eq!(found.path, pod);
            assert_eq!(found.uid, UID);
            assert_eq!(
                found.cgroup_id,
                fs::metadata(&pod).expect("stat").ino(),
                "the id is the directory's inode"
            );
            let sandbox = pod.join("sandbox");
            fs::create_dir(&sandbox).expect("mkdir");
            fs::create_dir(pod.join("a-container")).expect("mkdir");
            // Sorted by id (on cgroupfs, creation order; a scratch file
            // system hands out inodes its own way).
            let kids = children(&pod);
            assert_eq!(kids.len(), 2);
            assert!(kids[0].1 < kids[1].1, "by id: {kids:?}");
            assert!(kids.iter().any(|(p, _)| *p == sandbox));
            assert_eq!(pod_cgroups_in(&top.join("burstable")), vec![found]);
            // A wrong class misses the standard candidates; the scan of
            // every QoS parent still finds it.
            assert_eq!(
                resolver.pod_cgroup(UID, Some("BestEffort")).map(|p| p.path),
                Some(pod.clone())
            );
            assert_eq!(
                resolver.pod_cgroup("0f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10", None),
                None
            );
        }
    }

    #[test]
    fn cgroup_v1_has_no_pod_cgroup() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(tmp.path().join("kubepods").join(format!("pod{UID}"))).expect("mkdir");
        let resolver = Resolver::new(vec![CgroupRoot::new(tmp.path(), CgroupVersion::V1)]);
        assert!(resolver.kubepods_dirs().is_empty());
        assert_eq!(resolver.pod_cgroup(UID, None), None);
    }
}
