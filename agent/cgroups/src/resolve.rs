//! Resolution: from a Pod to its containers' cgroup directories.

use crate::container::{self, parse_container_id, Runtime, State};
use crate::layout::{self, Driver, Layout};
use crate::mountinfo::{self, CgroupRoot, CgroupVersion};
use crate::Result;
use k8s_openapi::api::core::v1::Pod;
use std::cell::OnceCell;
use std::collections::VecDeque;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How deep below a mount point the search looks for a pod directory. The
/// deepest real layout is a kind node seen from its host:
/// `system.slice/docker-<node>.scope/kubelet.slice/kubelet-kubepods.slice/
/// kubelet-kubepods-besteffort.slice/<pod>` (6); 8 leaves room for one more
/// level of nesting without walking whole container subtrees.
pub const MAX_SEARCH_DEPTH: usize = 8;

/// How many directories the search reads at most, so a huge or looping tree
/// costs a bounded time per pod.
pub const MAX_SEARCH_DIRS: usize = 10_000;

/// How many tried paths a [`UnresolvedReason::NotFound`] keeps; the real
/// maximum is about 20 (3 QoS classes x 2 drivers x 2 CRI-O leaves, plus the
/// search, on 2 hierarchies), so this only guards against surprises.
pub const MAX_TRIED: usize = 32;

/// How a container directory was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// At one of the standard paths of [`crate::layout`].
    Standard,
    /// By the bounded search for the pod directory (a prefixed or renamed
    /// kubepods tree): worth a log line, since the layout is not standard.
    Search,
}

/// A container whose cgroup directory was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedContainer {
    /// The container's name in the pod spec.
    pub name: String,
    /// The bare container id, without the runtime scheme.
    pub container_id: String,
    /// The runtime that named it.
    pub runtime: Runtime,
    /// The absolute path of the container's cgroup directory.
    pub path: PathBuf,
    /// The cgroup id BPF reports for the container's tasks: the directory's
    /// inode on cgroup v2; `None` on cgroup v1, where no such id exists (the
    /// container is then also listed in [`Resolution::unresolved`]).
    pub cgroup_id: Option<u64>,
    /// The directory shape that matched.
    pub layout: Layout,
    /// Whether a standard path or the search found it.
    pub discovery: Discovery,
}

/// Why a container has no usable cgroup id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnresolvedReason {
    /// The `containerID` is not `<scheme>://<64 lowercase hex digits>`.
    #[error("malformed containerID")]
    MalformedContainerId,
    /// The `containerID` names a runtime this crate has no layouts for.
    #[error("unknown container runtime {scheme:?}")]
    UnknownRuntime {
        /// The scheme before `://`.
        scheme: String,
    },
    /// The pod has no `metadata.uid`, or one that is not safe in a path.
    #[error("the pod has no usable metadata.uid")]
    InvalidPodUid,
    /// No candidate directory exists. `tried` lists the paths that were
    /// checked, in order (at most [`MAX_TRIED`]); an entry
    /// `<mount point>/**/pod<uid>` stands for the bounded search for the pod
    /// directory under that mount point, which found nothing.
    #[error("no cgroup directory found ({} paths tried)", tried.len())]
    NotFound {
        /// The paths checked, in order.
        tried: Vec<PathBuf>,
    },
    /// The container was found only in a cgroup v1 hierarchy, whose
    /// directories have no cgroup id BPF can see: no enforcement and no
    /// observation is possible for it.
    #[error("found only on cgroup v1 at {path}, which has no BPF cgroup id")]
    V1NoCgroupId {
        /// The directory that was found.
        path: PathBuf,
    },
    /// A candidate could not be checked (for example, permission denied),
    /// and no other candidate matched.
    #[error("cannot stat {path}: {message}")]
    Io {
        /// The candidate that failed.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
}

impl UnresolvedReason {
    /// A metric label for the reason, from its variant name.
    pub fn label(&self) -> &'static str {
        match self {
            UnresolvedReason::MalformedContainerId => "malformed_container_id",
            UnresolvedReason::UnknownRuntime { .. } => "unknown_runtime",
            UnresolvedReason::InvalidPodUid => "invalid_pod_uid",
            UnresolvedReason::NotFound { .. } => "not_found",
            UnresolvedReason::V1NoCgroupId { .. } => "v1_no_cgroup_id",
            UnresolvedReason::Io { .. } => "io",
        }
    }
}

/// A container with a running instance but no usable cgroup id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The container's name in the pod spec.
    pub name: String,
    /// The `containerID` exactly as the status gives it (it may not parse).
    pub container_id: String,
    /// Why it is not resolved.
    pub reason: UnresolvedReason,
}

/// What resolving one pod found: partial results and per-container reasons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Containers whose directory was found (init, regular, then ephemeral).
    pub containers: Vec<ResolvedContainer>,
    /// Containers without a running instance yet: no `containerID`, or
    /// waiting (created, or about to restart). They resolve later, and
    /// [`container_ids_key`](crate::container_ids_key) changes when they do.
    pub pending: Vec<String>,
    /// Containers that have terminated (finished init containers): their
    /// cgroup is gone, and they need none.
    pub exited: Vec<String>,
    /// Containers that should have a cgroup id and do not. A v1-only
    /// container appears both here and in `containers`, with its path.
    pub unresolved: Vec<Unresolved>,
}

impl Resolution {
    /// Whether every container that should be covered has a cgroup id:
    /// nothing pending and nothing unresolved.
    pub fn is_complete(&self) -> bool {
        self.pending.is_empty() && self.unresolved.is_empty()
    }
}

/// Resolves pods against the cgroup hierarchies of this node.
#[derive(Debug, Clone)]
pub struct Resolver {
    roots: Vec<CgroupRoot>,
}

impl Resolver {
    /// A resolver over explicit hierarchies, tried in order (an override
    /// such as `--cgroup-root`, or a test's tempdir).
    pub fn new(roots: Vec<CgroupRoot>) -> Self {
        Resolver { roots }
    }

    /// A resolver over the hierarchies [`crate::select_roots`] picks from
    /// mountinfo text.
    pub fn from_mountinfo(text: &str) -> Result<Self> {
        mountinfo::roots_from_text(text).map(Resolver::new)
    }

    /// A resolver over this process's own mount table, `/proc/self/mountinfo`.
    pub fn discover() -> Result<Self> {
        let text = crate::read_mountinfo(Path::new("/proc/self/mountinfo"))?;
        Resolver::from_mountinfo(&text)
    }

    /// The hierarchies, in the order they are tried.
    pub fn roots(&self) -> &[CgroupRoot] {
        &self.roots
    }

    /// Resolves every container in the pod's status. Never fails as a
    /// whole: each container lands in exactly one of `containers`,
    /// `pending`, `exited` or `unresolved` (v1-only ones in two, see
    /// [`Resolution::unresolved`]).
    pub fn resolve(&self, pod: &Pod) -> Resolution {
        let mut out = Resolution::default();
        let uid = pod.metadata.uid.as_deref().filter(|u| layout::valid_uid(u));
        let qos = pod.status.as_ref().and_then(|s| s.qos_class.as_deref());
        let classes = layout::qos_classes(qos);
        // The search depends only on the pod, so containers share it.
        let searches: Vec<OnceCell<Option<(Driver, PathBuf)>>> =
            self.roots.iter().map(|_| OnceCell::new()).collect();
        for entry in container::entries(pod) {
            let name = entry.name.to_string();
            let raw = match (entry.state, entry.container_id) {
                (State::Terminated, _) => {
                    out.exited.push(name);
                    continue;
                }
                (State::Waiting, _) | (_, None) => {
                    out.pending.push(name);
                    continue;
                }
                (_, Some(raw)) => raw,
            };
            let unresolved = |reason| Unresolved {
                name: name.clone(),
                container_id: raw.to_string(),
                reason,
            };
            let (runtime, id) = match parse_container_id(raw) {
                Ok(parsed) => parsed,
                Err(reason) => {
                    out.unresolved.push(unresolved(reason));
                    continue;
                }
            };
            let Some(uid) = uid else {
                out.unresolved
                    .push(unresolved(UnresolvedReason::InvalidPodUid));
                continue;
            };
            match self.locate(uid, classes, runtime, id, &searches) {
                Ok(found) => {
                    let cgroup_id = match found.version {
                        CgroupVersion::V2 => Some(found.ino),
                        CgroupVersion::V1 => {
                            out.unresolved
                                .push(unresolved(UnresolvedReason::V1NoCgroupId {
                                    path: found.path.clone(),
                                }));
                            None
                        }
                    };
                    out.containers.push(ResolvedContainer {
                        name,
                        container_id: id.to_string(),
                        runtime,
                        path: found.path,
                        cgroup_id,
                        layout: found.layout,
                        discovery: found.discovery,
                    });
                }
                Err(reason) => out.unresolved.push(unresolved(reason)),
            }
        }
        out
    }

    /// Tries, per hierarchy, the standard candidates and then the search.
    fn locate(
        &self,
        uid: &str,
        classes: &[layout::Qos],
        runtime: Runtime,
        id: &str,
        searches: &[OnceCell<Option<(Driver, PathBuf)>>],
    ) -> Result<Found, UnresolvedReason> {
        let mut attempt = Attempt::default();
        let pod_dirs = layout::pod_dirs(uid, classes);
        for (root, search) in self.roots.iter().zip(searches) {
            for (driver, relative) in &pod_dirs {
                let Some(dir) = root.map(relative) else {
                    continue; // not visible through this mount
                };
                if let Some(found) =
                    attempt.leaves(root, *driver, &dir, runtime, id, Discovery::Standard)
                {
                    return Ok(found);
                }
            }
            match search.get_or_init(|| search_pod_dir(&root.mount_point, uid)) {
                Some((driver, dir)) => {
                    if let Some(found) =
                        attempt.leaves(root, *driver, dir, runtime, id, Discovery::Search)
                    {
                        return Ok(found);
                    }
                }
                None => attempt.record(root.mount_point.join("**").join(format!("pod{uid}"))),
            }
        }
        Err(match attempt.io {
            Some((path, message)) => UnresolvedReason::Io { path, message },
            None => UnresolvedReason::NotFound {
                tried: attempt.tried,
            },
        })
    }
}

/// A directory that was found.
struct Found {
    path: PathBuf,
    ino: u64,
    version: CgroupVersion,
    layout: Layout,
    discovery: Discovery,
}

/// The paths one container's resolution has checked.
#[derive(Default)]
struct Attempt {
    tried: Vec<PathBuf>,
    io: Option<(PathBuf, String)>,
}

impl Attempt {
    fn record(&mut self, path: PathBuf) {
        if self.tried.len() < MAX_TRIED {
            self.tried.push(path);
        }
    }

    /// Checks the runtime's container directories in one pod directory.
    fn leaves(
        &mut self,
        root: &CgroupRoot,
        driver: Driver,
        pod_dir: &Path,
        runtime: Runtime,
        id: &str,
        discovery: Discovery,
    ) -> Option<Found> {
        for (layout, leaf) in layout::leaves(driver, runtime, id) {
            let path = pod_dir.join(leaf);
            // The search usually finds a standard pod directory again.
            if self.tried.contains(&path) {
                continue;
            }
            match fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    return Some(Found {
                        path,
                        ino: meta.ino(),
                        version: root.version,
                        layout,
                        discovery,
                    })
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {}
                Err(e) => self.io = Some((path.clone(), e.to_string())),
            }
            self.record(path);
        }
        None
    }
}

/// What a bounded walk does after visiting one directory.
pub(crate) enum Step {
    /// Stop the walk.
    Stop,
    /// Queue the directory, so its own subdirectories are visited.
    Descend,
    /// Go on without entering it.
    Skip,
}

/// Breadth-first over the directories below `start`, at most
/// [`MAX_SEARCH_DEPTH`] levels deep and [`MAX_SEARCH_DIRS`] directories
/// read: `visit` is given each one's name and path, in name order level by
/// level, so a walk is deterministic. Symlinks are not followed and
/// unreadable directories are skipped (a walk is a fallback: the standard
/// candidates already reported their own errors).
pub(crate) fn walk_dirs(start: &Path, mut visit: impl FnMut(&str, PathBuf) -> Step) {
    let mut queue = VecDeque::from([(start.to_path_buf(), 0usize)]);
    let mut read = 0usize;
    while let Some((dir, depth)) = queue.pop_front() {
        read += 1;
        if read > MAX_SEARCH_DIRS {
            return;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let mut children: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            .collect();
        children.sort();
        for (name, path) in children {
            match visit(&name, path.clone()) {
                Step::Stop => return,
                Step::Descend if depth + 1 < MAX_SEARCH_DEPTH => queue.push_back((path, depth + 1)),
                Step::Descend | Step::Skip => {}
            }
        }
    }
}

/// The pod's directory below `start` ([`walk_dirs`]): the shallowest
/// match wins; other pods' directories are not entered.
fn search_pod_dir(start: &Path, uid: &str) -> Option<(Driver, PathBuf)> {
    let mut found = None;
    walk_dirs(start, |name, path| {
        if let Some(driver) = layout::pod_dir_driver(name, uid) {
            found = Some((driver, path));
            Step::Stop
        } else if layout::looks_like_pod_dir(name) {
            Step::Skip
        } else {
            Step::Descend
        }
    });
    found
}
