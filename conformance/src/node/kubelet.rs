//! The kubelet's part, played for real: a pod's object bound to this node,
//! its container cgroups in the layout its runtime and cgroup driver make
//! (containerd, CRI-O or docker; cgroupfs or systemd), and the status a
//! kubelet writes (Running, each container's id), so the daemon resolves
//! the pod's cgroups exactly as on a real node.

use super::cluster::Cluster;
use super::net::Sandbox;
use anyhow::Context as _;
use conformance::scenario::{CgroupDriver, PodDef, Runtime};
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A running pod: each container's cgroup.
#[derive(Debug, Clone)]
pub struct RunningPod {
    /// The pod as the scenario wrote it (namespace filled in).
    pub def: PodDef,
    /// `(container, cgroup directory)`, in the pod's order.
    pub containers: Vec<(String, PathBuf)>,
    /// Directories this pod created, outermost first.
    pub created: Vec<PathBuf>,
    /// On a real node: each container's process (the node's PID), in the
    /// order of `containers`; empty for a pod this module made.
    pub pids: Vec<u32>,
    /// On a real node: the pod's own network namespace (the harness's
    /// pods share the node half's one).
    pub sandbox: Option<Arc<Sandbox>>,
}

impl RunningPod {
    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.def.namespace.as_deref().unwrap_or_default()
    }

    /// The index of `container` (the first when `None`).
    fn index(&self, container: Option<&str>) -> anyhow::Result<usize> {
        let found = match container {
            None => (!self.containers.is_empty()).then_some(0),
            Some(c) => self.containers.iter().position(|(n, _)| n == c),
        };
        found.with_context(|| format!("pod {} has no container {container:?}", self.def.name))
    }

    /// `cgroup.procs` of `container` (the first when `None`).
    pub fn procs(&self, container: Option<&str>) -> anyhow::Result<PathBuf> {
        let i = self.index(container)?;
        self.containers
            .get(i)
            .map(|(_, dir)| dir.join("cgroup.procs"))
            .context("no such container")
    }

    /// On a real node, the process of `container` (the first when `None`).
    pub fn pid(&self, container: Option<&str>) -> anyhow::Result<Option<u32>> {
        let i = self.index(container)?;
        Ok(self.pids.get(i).copied())
    }
}

/// The cgroup v2 mount: `/sys/fs/cgroup` in a guest, `/sys/fs/cgroup/unified`
/// on a hybrid host.
pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    text.lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .context("no cgroup2 mount in /proc/self/mountinfo")
}

/// A container id (64 hex digits) unique to the pod and container index.
fn container_id(uid: &str, index: usize) -> String {
    let hex: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
    let mut id = format!("{hex}{hex}{hex}");
    id.truncate(60);
    format!("{id}{index:04x}")
}

/// Where `runtime` under `driver` puts a BestEffort pod's container, and
/// the `containerID` the kubelet reports for it.
pub fn layout(
    root: &Path,
    runtime: Runtime,
    driver: CgroupDriver,
    uid: &str,
    id: &str,
) -> (Vec<PathBuf>, String) {
    let scheme = match runtime {
        Runtime::Containerd => "containerd",
        Runtime::Crio => "cri-o",
        Runtime::Docker => "docker",
    };
    let dirs = match driver {
        CgroupDriver::Cgroupfs => {
            let leaf = match runtime {
                Runtime::Crio => format!("crio-{id}"),
                Runtime::Containerd | Runtime::Docker => id.to_string(),
            };
            let pod = root.join(format!("kubepods/besteffort/pod{uid}"));
            vec![
                root.join("kubepods"),
                root.join("kubepods/besteffort"),
                pod.clone(),
                pod.join(leaf),
            ]
        }
        CgroupDriver::Systemd => {
            let scope = match runtime {
                Runtime::Containerd => format!("cri-containerd-{id}.scope"),
                Runtime::Crio => format!("crio-{id}.scope"),
                Runtime::Docker => format!("docker-{id}.scope"),
            };
            let slice = root.join("kubepods.slice/kubepods-besteffort.slice");
            let pod = slice.join(format!(
                "kubepods-besteffort-pod{}.slice",
                uid.replace('-', "_")
            ));
            vec![
                root.join("kubepods.slice"),
                slice.clone(),
                pod.clone(),
                pod.join(scope),
            ]
        }
    };
    (dirs, format!("{scheme}://{id}"))
}

/// Creates the pod's object, its cgroups and its Running status.
pub fn start(
    cluster: &Cluster,
    node: &str,
    root: &Path,
    def: &PodDef,
) -> anyhow::Result<RunningPod> {
    let ns = def.namespace.clone().unwrap_or_default();
    let pods = cluster.ns::<Pod>(&ns);
    let containers: Vec<serde_json::Value> = def
        .containers
        .iter()
        .map(|c| serde_json::json!({"name": c, "image": "busybox"}))
        .collect();
    let pod = cluster.apply(
        &pods,
        &def.name,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": def.name, "namespace": ns, "labels": def.labels},
            "spec": {"nodeName": node, "containers": containers}}),
    )?;
    let uid = pod.metadata.uid.clone().context("the pod has no uid")?;
    let mut created = Vec::new();
    let mut running = Vec::new();
    let mut statuses = Vec::new();
    for (i, c) in def.containers.iter().enumerate() {
        let id = container_id(&uid, i);
        let (dirs, container_id) = layout(root, def.runtime, def.cgroup_driver, &uid, &id);
        for d in &dirs {
            if !d.exists() {
                std::fs::create_dir(d)
                    .with_context(|| format!("creating cgroup {}", d.display()))?;
                created.push(d.clone());
            }
        }
        let leaf = dirs.last().cloned().context("no cgroup")?;
        running.push((c.clone(), leaf));
        statuses.push(
            serde_json::json!({"name": c, "ready": true, "restartCount": 0,
            "image": "busybox", "imageID": "busybox@sha256:0",
            "containerID": container_id, "state": {"running": {}}}),
        );
    }
    cluster.patch_status(
        &pods,
        &def.name,
        serde_json::json!({"status": {"phase": "Running", "qosClass": "BestEffort",
            "containerStatuses": statuses}}),
    )?;
    Ok(RunningPod {
        def: def.clone(),
        containers: running,
        created,
        pids: Vec::new(),
        sandbox: None,
    })
}

/// Deletes the pod's object and the cgroups it created (innermost first;
/// a process that just exited may linger a moment, hence the retries).
pub fn stop(cluster: &Cluster, pod: &RunningPod) -> anyhow::Result<()> {
    cluster.delete(&cluster.ns::<Pod>(pod.namespace()), &pod.def.name)?;
    remove_dirs(&pod.created);
    Ok(())
}

/// Removes directories innermost first, retrying briefly; one that stays
/// (another pod's parent still in use) is left.
pub fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs.iter().rev() {
        for _ in 0..50 {
            match std::fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                // Not empty: a shared parent another pod still uses.
                Err(e) if e.raw_os_error() == Some(39) => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_the_runtimes_own() {
        let root = Path::new("/sys/fs/cgroup");
        let uid = "5b2e9c71-3f4a-4d8b-b6e2-91c0d7a4e833";
        let id = container_id(uid, 1);
        assert_eq!(id.len(), 64);
        assert!(id.ends_with("0001"));
        let (dirs, cid) = layout(root, Runtime::Containerd, CgroupDriver::Cgroupfs, uid, &id);
        assert_eq!(
            dirs[3],
            root.join(format!("kubepods/besteffort/pod{uid}/{id}"))
        );
        assert_eq!(cid, format!("containerd://{id}"));
        let (dirs, cid) = layout(root, Runtime::Crio, CgroupDriver::Systemd, uid, &id);
        assert_eq!(
            dirs[3],
            root.join(format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5b2e9c71_3f4a_4d8b_b6e2_91c0d7a4e833.slice/crio-{id}.scope"
            ))
        );
        assert_eq!(cid, format!("cri-o://{id}"));
        let (dirs, cid) = layout(root, Runtime::Docker, CgroupDriver::Systemd, uid, &id);
        assert!(dirs[3].ends_with(format!("docker-{id}.scope")));
        assert_eq!(cid, format!("docker://{id}"));
    }
}
