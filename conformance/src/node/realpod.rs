//! A real node's pods: on a node whose kubelet and container runtime are
//! real, a scenario's pod is created through the API and started by them
//! (busybox containers that sleep). The node half, itself a privileged
//! pod in the node's PID namespace, then finds what the harness would
//! have made by hand: each container's cgroup (the runtime's own layout,
//! found by the container's id), its process, and through it the pod's
//! network namespace and the container's filesystem, where the scenario's
//! programs and files are put.

use super::cluster::Cluster;
use super::kubelet::RunningPod;
use super::net::Sandbox;
use anyhow::{bail, Context as _};
use conformance::scenario::{PodDef, Setup};
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node's cgroup namespace: a workload process joins it before it
/// moves into a container's cgroup (see [`crate::child::ChildTask`]).
pub const NODE_CGROUPNS: &str = "/proc/1/ns/cgroup";

/// How long a pod may take to run: image present, yet a guest under TCG
/// starts a pod in seconds, not milliseconds.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The node's cgroup v2 mount as the node sees it (`/proc/1/root/...`):
/// this pod's own `/sys/fs/cgroup` may be a view of its own subtree only.
pub fn node_cgroup2_root() -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/1/mountinfo").context("reading /proc/1/mountinfo")?;
    let mount = text
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(str::to_string))?
        })
        .context("the node has no cgroup2 mount (/proc/1/mountinfo)")?;
    Ok(Path::new("/proc/1/root").join(mount.trim_start_matches('/')))
}

/// The pod as this suite creates it on a real node: each container sleeps
/// in the node's busybox image; a delete ends it at once.
pub fn manifest(def: &PodDef, node: &str, image: &str) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = def
        .containers
        .iter()
        .map(|c| {
            serde_json::json!({"name": c, "image": image, "imagePullPolicy": "Never",
                "command": ["sleep", "2147483647"]})
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": def.name, "namespace": def.namespace, "labels": def.labels},
        "spec": {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 0,
                 "automountServiceAccountToken": false, "enableServiceLinks": false}})
}

/// Creates the pod, waits until the runtime runs every container, and
/// finds each one's cgroup and process; puts the scenario's programs and
/// files into every container.
pub fn start(
    cluster: &Cluster,
    node: &str,
    cgroup_root: &Path,
    def: &PodDef,
    image: &str,
    setup: &Setup,
) -> anyhow::Result<RunningPod> {
    let ns = def.namespace.clone().unwrap_or_default();
    let pods = cluster.ns::<Pod>(&ns);
    cluster.apply(&pods, &def.name, manifest(def, node, image))?;
    let started = Instant::now();
    let ids = loop {
        let pod = cluster.get(&pods, &def.name)?;
        if let Some(ids) = pod.as_ref().and_then(|p| running_ids(p, &def.containers)) {
            break ids;
        }
        if started.elapsed() > START_TIMEOUT {
            let status = pod
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string(&s).unwrap_or_default())
                .unwrap_or_default();
            bail!(
                "not running after {}s; its status: {status}",
                START_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut containers = Vec::new();
    let mut pids = Vec::new();
    for (name, id) in def.containers.iter().zip(ids) {
        let dir = find_cgroup(cgroup_root, &id).with_context(|| {
            format!(
                "no cgroup named for container {name} ({id}) under {}",
                cgroup_root.display()
            )
        })?;
        let pid = first_pid(&dir)?;
        put_fixtures(pid, setup).with_context(|| format!("container {name}'s files"))?;
        containers.push((name.clone(), dir));
        pids.push(pid);
    }
    let first = pids.first().copied().context("a pod with no container")?;
    let sandbox = Sandbox::of_process(first).context("the pod's network namespace")?;
    Ok(RunningPod {
        def: def.clone(),
        containers,
        created: Vec::new(),
        pids,
        sandbox: Some(Arc::new(sandbox)),
    })
}

/// Each container's id once all of them run, in the pod's order.
fn running_ids(pod: &Pod, containers: &[String]) -> Option<Vec<String>> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    containers
        .iter()
        .map(|c| {
            let s = statuses.iter().find(|s| &s.name == c)?;
            s.state.as_ref()?.running.as_ref()?;
            let id = s.container_id.as_deref()?;
            Some(id.rsplit("://").next()?.to_string())
        })
        .collect()
}

/// The cgroup directory whose name carries the container's id, wherever
/// the runtime and the cgroup driver put it (a few levels under the root).
fn find_cgroup(root: &Path, id: &str) -> Option<PathBuf> {
    let mut level = vec![root.to_path_buf()];
    for _ in 0..6 {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if e.file_name().to_string_lossy().contains(id) {
                    return Some(e.path());
                }
                next.push(e.path());
            }
        }
        level = next;
    }
    None
}

/// A process of the container (its `sleep`), in the node's PIDs.
fn first_pid(dir: &Path) -> anyhow::Result<u32> {
    let procs = dir.join("cgroup.procs");
    let text =
        std::fs::read_to_string(&procs).with_context(|| format!("reading {}", procs.display()))?;
    text.lines()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("no process in {}", procs.display()))
}

/// The scenario's programs (copies of the container's own busybox) and
/// files, written through the container's root as its process sees it.
/// They go with the container: nothing to remove afterwards.
fn put_fixtures(pid: u32, setup: &Setup) -> anyhow::Result<()> {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    for p in &setup.programs {
        let to = inside(p);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::copy(root.join("bin/busybox"), &to)
            .with_context(|| format!("copying busybox to {p}"))?;
    }
    for f in &setup.files {
        let to = inside(f);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&to, b"krt-conformance fixture\n")
            .with_context(|| format!("writing {f}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_cgroup_is_found_in_either_drivers_layout() {
        let root = tempfile::tempdir().unwrap();
        let id = "4f1c".repeat(16);
        let systemd = root.path().join(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-{id}.scope"
        ));
        let cgroupfs = root
            .path()
            .join(format!("kubepods/besteffort/pod2/{}", "9a".repeat(32)));
        for d in [&systemd, &cgroupfs] {
            assert!(std::fs::create_dir_all(d).is_ok());
        }
        assert_eq!(find_cgroup(root.path(), &id), Some(systemd));
        assert_eq!(find_cgroup(root.path(), &"9a".repeat(32)), Some(cgroupfs));
        assert_eq!(find_cgroup(root.path(), &"00".repeat(32)), None);
    }

    #[test]
    fn a_pod_runs_only_once_every_container_has_an_id() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "status": {"containerStatuses": [
                {"name": "app", "ready": true, "restartCount": 0, "image": "b", "imageID": "",
                 "containerID": "containerd://abc", "state": {"running": {}}},
                {"name": "sidecar", "ready": false, "restartCount": 0, "image": "b", "imageID": "",
                 "state": {"waiting": {"reason": "ContainerCreating"}}}]}}))
        .unwrap();
        let both = ["app".to_string(), "sidecar".to_string()];
        assert_eq!(running_ids(&pod, &both), None);
        assert_eq!(running_ids(&pod, &both[..1]), Some(vec!["abc".to_string()]));
        let sidecar = &mut pod
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[1];
        sidecar.container_id = Some("containerd://def".into());
        sidecar.state = serde_json::from_value(serde_json::json!({"running": {}})).unwrap();
        assert_eq!(
            running_ids(&pod, &both),
            Some(vec!["abc".to_string(), "def".to_string()])
        );
    }
}
