//! What the container runtime said it started (through the NRI plugin)
//! before the Pod's status says so.
//!
//! The engine learns containers from the Pod's status, which the kubelet
//! writes after the runtime started them. The runtime tells the NRI plugin
//! earlier, between the container's create (its cgroup exists) and its
//! start; the engine then takes the Pod as if its status already named the
//! container, running, and programs it before the start is answered. The
//! runtime's word stands for a container until the status names the same
//! instance (then the status is the whole truth again), the runtime says
//! it stopped, or the plugin reconnects (a synchronize replaces it all:
//! events may have been missed while it was away).

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, Pod};
use kyverno_runtime_nri::Container;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// Containers started by the runtime, by pod UID, and the pods they
/// belong to as the watch last delivered them.
#[derive(Debug, Default)]
pub struct Started {
    /// Off (no NRI plugin): nothing is kept, pods pass through unchanged.
    enabled: bool,
    /// The watch's last Pod object by UID (only while enabled: a runtime
    /// event re-derives the pod from it).
    pods: BTreeMap<String, Pod>,
    /// By pod UID, then container name: the runtime's `scheme://id` of
    /// the instance it started.
    containers: BTreeMap<String, BTreeMap<String, String>>,
}

impl Started {
    /// Keeps what the runtime says from now on.
    pub fn enable(&mut self) {
        self.enabled = true;
    }

    /// The watch delivered `pod`: keeps it (while enabled) and returns it
    /// with the runtime's containers merged; a copy only when there is
    /// something to merge. Containers the status now names as the runtime
    /// did are the status's again.
    pub fn watched<'a>(&mut self, pod: &'a Pod) -> Cow<'a, Pod> {
        if !self.enabled {
            return Cow::Borrowed(pod);
        }
        let Some(uid) = pod.metadata.uid.clone() else {
            return Cow::Borrowed(pod);
        };
        if let Some(started) = self.containers.get_mut(&uid) {
            let statuses = super::convert::container_ids(pod);
            started.retain(|name, id| statuses.get(name) != Some(id));
            if started.is_empty() {
                self.containers.remove(&uid);
            }
        }
        self.pods.insert(uid.clone(), pod.clone());
        if !self.containers.contains_key(&uid) {
            return Cow::Borrowed(pod);
        }
        self.merged(&uid).map_or(Cow::Borrowed(pod), Cow::Owned)
    }

    /// The watch saw `uid` deleted.
    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.containers.remove(uid);
    }

    /// The runtime is starting `c`: the pod as it now is, if the watch has
    /// delivered it.
    pub fn start(&mut self, c: &Container) -> Option<Pod> {
        if !self.enabled {
            return None;
        }
        self.containers
            .entry(c.pod_uid.clone())
            .or_default()
            .insert(c.name.clone(), runtime_id(c));
        self.merged(&c.pod_uid)
    }

    /// The runtime stopped or removed `c`: the pod as it now is, if this
    /// changed it.
    pub fn stop(&mut self, c: &Container) -> Option<Pod> {
        let started = self.containers.get_mut(&c.pod_uid)?;
        if started.get(&c.name) != Some(&runtime_id(c)) {
            return None;
        }
        started.remove(&c.name);
        if started.is_empty() {
            self.containers.remove(&c.pod_uid);
        }
        self.merged(&c.pod_uid)
    }

    /// The runtime's containers after a (re)connection replace what it
    /// said before: the pods whose view changed, as they now are.
    pub fn synchronize(&mut self, containers: &[Container]) -> Vec<Pod> {
        if !self.enabled {
            return Vec::new();
        }
        let before = std::mem::take(&mut self.containers);
        for c in containers {
            // What the status already says needs no word from the runtime.
            let said = self
                .pods
                .get(&c.pod_uid)
                .map(super::convert::container_ids)
                .and_then(|ids| ids.get(&c.name).cloned());
            if said.as_deref() == Some(runtime_id(c).as_str()) {
                continue;
            }
            self.containers
                .entry(c.pod_uid.clone())
                .or_default()
                .insert(c.name.clone(), runtime_id(c));
        }
        let changed: BTreeSet<&String> = before
            .keys()
            .chain(self.containers.keys())
            .filter(|uid| before.get(*uid) != self.containers.get(*uid))
            .collect();
        changed
            .into_iter()
            .filter_map(|uid| self.merged(uid))
            .collect()
    }

    /// The plugin lost the runtime: what it said may go stale unseen (a
    /// stop missed), so the statuses alone speak until it is back. The
    /// pods whose view changed, as they now are.
    pub fn disconnected(&mut self) -> Vec<Pod> {
        self.synchronize(&[])
    }

    /// `uid`'s pod with the runtime's containers merged into its status:
    /// each named there as the runtime's instance, running; a pod with one
    /// is taken as running even while its phase is still `Pending` (its
    /// first container starting). `None` when the watch has not delivered
    /// the pod.
    fn merged(&self, uid: &str) -> Option<Pod> {
        let mut pod = self.pods.get(uid)?.clone();
        let Some(started) = self.containers.get(uid) else {
            return Some(pod);
        };
        let spec = pod.spec.as_ref();
        let is_init = |name: &str| {
            spec.and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.name == name)
        };
        let is_ephemeral = |name: &str| {
            spec.and_then(|s| s.ephemeral_containers.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.name == name)
        };
        let status = pod.status.get_or_insert_with(Default::default);
        for (name, id) in started {
            let list = if is_init(name) {
                &mut status.init_container_statuses
            } else if is_ephemeral(name) {
                &mut status.ephemeral_container_statuses
            } else {
                &mut status.container_statuses
            };
            let list = list.get_or_insert_with(Vec::new);
            let running = ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            };
            match list.iter_mut().find(|s| &s.name == name) {
                Some(s) => {
                    s.container_id = Some(id.clone());
                    s.state = Some(running);
                }
                None => list.push(ContainerStatus {
                    name: name.clone(),
                    container_id: Some(id.clone()),
                    state: Some(running),
                    ..Default::default()
                }),
            }
        }
        if matches!(status.phase.as_deref(), None | Some("Pending")) {
            status.phase = Some("Running".to_string());
        }
        Some(pod)
    }
}

/// The engine's side: what the NRI plugin reports.
impl super::Engine {
    /// Keeps what the runtime says of containers before their Pods'
    /// statuses do (the NRI plugin is on).
    pub fn enable_runtime_hook(&mut self) {
        self.started.enable();
    }

    /// The runtime is starting `container` (its cgroup exists, its process
    /// has not run): programs it now if its pod is known. Returns whether
    /// it was (otherwise the pod's arrival from the watch programs it).
    pub fn container_started(&mut self, container: &Container) -> bool {
        match self.started.start(container) {
            Some(pod) => {
                self.take_pod(&pod);
                true
            }
            None => false,
        }
    }

    /// The runtime stopped or removed `container`.
    pub fn container_stopped(&mut self, container: &Container) {
        if let Some(pod) = self.started.stop(container) {
            self.take_pod(&pod);
        }
    }

    /// The runtime's containers when the NRI plugin (re)registered.
    pub fn runtime_synchronized(&mut self, containers: &[Container]) {
        self.runtime_hook_registered(true);
        for pod in self.started.synchronize(containers) {
            self.take_pod(&pod);
        }
    }

    /// The NRI plugin lost the runtime: the Pods' statuses alone speak.
    pub fn runtime_disconnected(&mut self) {
        self.runtime_hook_registered(false);
        for pod in self.started.disconnected() {
            self.take_pod(&pod);
        }
    }

    /// Whether the pod `uid` is on this node and handed to the managers.
    pub fn pod_known(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }
}

/// The id as a Pod's status writes it: `containerd://…`, `cri-o://…`.
fn runtime_id(c: &Container) -> String {
    let scheme = match c.runtime.as_str() {
        "" => "containerd",
        other => other,
    };
    format!("{scheme}://{}", c.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container as SpecContainer, PodSpec, PodStatus};

    const UID: &str = "0b5c7d7e-1f1a-4f4e-9a55-2d7f1c0a9e11";

    fn id(n: u8) -> String {
        format!("{:064x}", n)
    }

    fn pod(phase: &str, statuses: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(UID.to_string());
        p.metadata.namespace = Some("ns".to_string());
        p.metadata.name = Some("p".to_string());
        p.spec = Some(PodSpec {
            init_containers: Some(vec![SpecContainer {
                name: "init".to_string(),
                ..Default::default()
            }]),
            containers: vec![SpecContainer {
                name: "app".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.to_string()),
            container_statuses: Some(
                statuses
                    .iter()
                    .map(|(name, cid)| ContainerStatus {
                        name: name.to_string(),
                        container_id: Some(cid.to_string()),
                        state: Some(ContainerState {
                            running: Some(ContainerStateRunning::default()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    fn container(name: &str, n: u8) -> Container {
        Container {
            runtime: "containerd".to_string(),
            pod_uid: UID.to_string(),
            pod_namespace: "ns".to_string(),
            pod_name: "p".to_string(),
            name: name.to_string(),
            id: id(n),
        }
    }

    fn ids(p: &Pod) -> BTreeMap<String, String> {
        super::super::convert::container_ids(p)
    }

    #[test]
    fn a_started_container_is_in_the_pod_before_its_status_says_so() {
        let mut s = Started::default();
        s.enable();
        let pending = pod("Pending", &[]);
        assert_eq!(*s.watched(&pending), pending);
        let merged = s.start(&container("app", 1)).unwrap_or_default();
        assert!(super::super::convert::is_running(&merged));
        assert_eq!(
            ids(&merged).get("app"),
            Some(&format!("containerd://{}", id(1)))
        );
        // A later status without the container keeps it.
        let pending_again = pod("Pending", &[]);
        let still = s.watched(&pending_again);
        assert_eq!(
            ids(&still).get("app"),
            Some(&format!("containerd://{}", id(1)))
        );
        // The status naming it makes the status the truth again.
        let caught_up = pod("Running", &[("app", &format!("containerd://{}", id(1)))]);
        // Nothing left to merge: the watch's own object, not a copy.
        assert!(matches!(s.watched(&caught_up), Cow::Borrowed(p) if *p == caught_up));
        assert!(s.containers.is_empty());
    }

    #[test]
    fn a_restart_is_the_new_instance_until_the_status_names_it() {
        let mut s = Started::default();
        s.enable();
        let old = format!("containerd://{}", id(1));
        s.watched(&pod("Running", &[("app", &old)]));
        let merged = s.start(&container("app", 2)).unwrap_or_default();
        assert_eq!(
            ids(&merged).get("app"),
            Some(&format!("containerd://{}", id(2)))
        );
        // The old instance's status (written before the restart) does not
        // take it back.
        let old_status = pod("Running", &[("app", &old)]);
        let again = s.watched(&old_status);
        assert_eq!(
            ids(&again).get("app"),
            Some(&format!("containerd://{}", id(2)))
        );
    }

    #[test]
    fn init_containers_go_to_their_own_statuses_and_a_stop_ends_the_word() {
        let mut s = Started::default();
        s.enable();
        s.watched(&pod("Pending", &[]));
        let merged = s.start(&container("init", 3)).unwrap_or_default();
        let status = merged.status.clone().unwrap_or_default();
        assert_eq!(status.init_container_statuses.map(|v| v.len()), Some(1));
        assert!(super::super::convert::is_running(&merged));
        // A stop of another instance changes nothing; its own ends it.
        assert_eq!(s.stop(&container("init", 4)), None);
        let stopped = s.stop(&container("init", 3)).unwrap_or_default();
        assert!(!super::super::convert::is_running(&stopped));
    }

    #[test]
    fn a_synchronize_replaces_what_the_runtime_said() {
        let mut s = Started::default();
        s.enable();
        s.watched(&pod("Pending", &[]));
        s.start(&container("app", 1));
        let changed = s.synchronize(&[container("app", 5)]);
        assert_eq!(changed.len(), 1);
        assert_eq!(
            ids(&changed[0]).get("app"),
            Some(&format!("containerd://{}", id(5)))
        );
        // Nothing new: nothing changed.
        assert!(s.synchronize(&[container("app", 5)]).is_empty());
        let gone = s.disconnected();
        assert_eq!(gone.len(), 1);
        assert!(!super::super::convert::is_running(&gone[0]));
    }

    #[test]
    fn disabled_keeps_nothing() {
        let mut s = Started::default();
        let p = pod("Pending", &[]);
        assert!(matches!(s.watched(&p), Cow::Borrowed(q) if *q == p));
        assert_eq!(s.start(&container("app", 1)), None);
        assert!(s.pods.is_empty() && s.containers.is_empty());
    }

    #[test]
    fn a_container_before_its_pod_waits_for_the_pod() {
        let mut s = Started::default();
        s.enable();
        assert_eq!(s.start(&container("app", 1)), None);
        let pending = pod("Pending", &[]);
        let merged = s.watched(&pending);
        assert_eq!(
            ids(&merged).get("app"),
            Some(&format!("containerd://{}", id(1)))
        );
    }
}
