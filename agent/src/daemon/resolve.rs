//! The engine's side of container cgroup resolution: the
//! `kyverno-runtime-cgroups` crate finds the directories; this keeps what
//! the managers need (ids and paths) and what status needs (what failed).

use k8s_openapi::api::core::v1::Pod;
use kyverno_runtime_cgroups as cgroups;
use kyverno_runtime_enforce::egress::ContainerCgroup;
use kyverno_runtime_enforce::CgroupId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One container that could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// The container's name.
    pub container: String,
    /// Why.
    pub reason: String,
}

/// A pod's containers as far as they resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroups {
    /// The container-status key this was resolved from.
    pub key: String,
    /// The containers found, with a cgroup id.
    pub containers: Vec<ContainerCgroup>,
    /// Their names, for findings.
    pub names: BTreeMap<CgroupId, String>,
    /// The containers that were not found (pending ones are not listed:
    /// they have no cgroup yet, which is not a failure).
    pub unresolved: Vec<Unresolved>,
}

impl PodCgroups {
    /// The cgroup ids.
    pub fn ids(&self) -> Vec<CgroupId> {
        self.containers.iter().map(|c| c.id).collect()
    }
}

/// The key of a pod's container statuses: a change means "resolve again".
pub fn container_ids_key(pod: &Pod) -> String {
    cgroups::container_ids_key(pod)
}

/// Resolves pods under the node's cgroup hierarchy.
pub struct CgroupResolver {
    inner: cgroups::Resolver,
}

impl CgroupResolver {
    /// The root from `--cgroup-root`; otherwise the host's cgroup mounts,
    /// from the host's mount table as the probe reads it
    /// ([`kyverno_runtime_compat::HostMounts`]).
    ///
    /// In a container (its own mount and cgroup namespaces, no host
    /// mounts) the daemon's own `/sys/fs/cgroup` shows only its own
    /// subtree; with hostPID, the host's mounts are those of PID 1, reached
    /// through `/proc/1/root`. When the daemon shares PID 1's mount
    /// namespace (a VM, a host process) its own mountinfo is the same.
    pub fn new(root: Option<PathBuf>) -> Result<Self, cgroups::Error> {
        let inner = match root {
            Some(path) => {
                let version = cgroups::CgroupVersion::of_dir(&path);
                cgroups::Resolver::new(vec![cgroups::CgroupRoot::new(path, version)])
            }
            None => {
                let (table, host_root) =
                    kyverno_runtime_compat::HostMounts::locate(&kyverno_runtime_compat::LiveHost);
                let text = cgroups::read_mountinfo(Path::new(table))?;
                let roots = cgroups::select_roots(&cgroups::parse_mountinfo(&text))
                    .into_iter()
                    .map(|mut r| {
                        r.mount_point = kyverno_runtime_compat::reach(&host_root, &r.mount_point);
                        r
                    })
                    .collect::<Vec<_>>();
                if roots.is_empty() {
                    return Err(cgroups::Error::NoCgroupMount);
                }
                cgroups::Resolver::new(roots)
            }
        };
        for r in inner.roots() {
            tracing::info!(root = %r.mount_point.display(), version = ?r.version, "container cgroups are resolved under this root");
        }
        Ok(Self { inner })
    }

    /// A cgroup v2 hierarchy at `root`, whatever file system it is on (a
    /// scratch directory in tests).
    #[cfg(test)]
    pub fn v2_at(root: PathBuf) -> Self {
        Self {
            inner: cgroups::Resolver::new(vec![cgroups::CgroupRoot::new(
                root,
                cgroups::CgroupVersion::V2,
            )]),
        }
    }

    /// The cgroup v2 hierarchy's mount, when there is one (where a PID's
    /// cgroup path is resolved to a directory).
    pub fn v2_root(&self) -> Option<PathBuf> {
        self.inner
            .roots()
            .iter()
            .find(|r| r.version == cgroups::CgroupVersion::V2)
            .map(|r| r.mount_point.clone())
    }

    /// The hierarchies' resolver itself (the pod directory watcher reads
    /// the same roots).
    pub fn hierarchies(&self) -> &cgroups::Resolver {
        &self.inner
    }

    /// Resolves a pod's containers; never fails as a whole.
    pub fn resolve(&self, pod: &Pod) -> PodCgroups {
        let r = self.inner.resolve(pod);
        let mut out = PodCgroups {
            key: container_ids_key(pod),
            ..Default::default()
        };
        for c in r.containers {
            // A container without a cgroup id (cgroup v1) is also listed in
            // `unresolved`, with the reason.
            if let Some(id) = c.cgroup_id {
                out.names.insert(id, c.name);
                out.containers.push(ContainerCgroup { id, path: c.path });
            }
        }
        for u in r.unresolved {
            out.unresolved.push(Unresolved {
                container: u.name,
                reason: u.reason.to_string(),
            });
        }
        out
    }
}
