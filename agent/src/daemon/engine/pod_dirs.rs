//! The pod directory fallback (issue 35, point 3): where no runtime hook
//! announces containers before they start (containerd 1.6, CRI-O without
//! NRI, or NRI not registered yet), a pod's own cgroup directory is bound
//! to the open/exec policies that select the pod as soon as the kubelet
//! creates it, before the runtime creates the pod's sandbox and
//! containers inside it. The kernel programs decide for a task whose own
//! cgroup is not bound by its parent's binding (`krt_oe_pod_cgroup` in
//! `openexec_check.h`), so a container is enforced from its first
//! instruction, until its own cgroup, learned from the Pod's status, takes
//! over.
//!
//! A pod whose directory exists while its phase is still Pending is taken
//! as on the node (its containers are what is about to run there); a pod
//! the watch has not delivered yet is bound when it arrives. The watcher
//! of the kubelet's directories is `daemon/pod_dirs.rs`.
//!
//! Only open and exec: the network programs are attached per container
//! cgroup, and a program attached to the pod's directory would run twice
//! for every packet of a container that has its own attachment.

use super::*;

/// What the fallback knows.
#[derive(Debug, Default)]
pub struct PodDirs {
    /// `--pod-cgroup-fallback`: the daemon watches the kubelet's pod
    /// directories.
    enabled: bool,
    /// A runtime hook (NRI) is registered: it announces every container
    /// before it starts, so the fallback is not needed.
    hook_registered: bool,
    /// The pod directories that exist, by pod UID: their cgroup ids.
    cgroups: BTreeMap<String, u64>,
    /// Pods the watch delivered in phase Pending (only while enabled), so
    /// that their directory's appearance can take them.
    pending: BTreeMap<String, Pod>,
}

impl PodDirs {
    /// Whether pod directories are bound now.
    pub fn active(&self) -> bool {
        self.enabled && !self.hook_registered
    }

    /// The pod's directory's cgroup id, while the fallback is active.
    pub fn cgroup_of(&self, uid: &str) -> Option<u64> {
        self.active()
            .then(|| self.cgroups.get(uid).copied())
            .flatten()
    }

    /// Whether `pod` (not Running) is about to run here: Pending, with its
    /// directory present, while the fallback is active.
    fn starting(&self, uid: &str, pod: &Pod) -> bool {
        self.active() && is_pending(pod) && self.cgroups.contains_key(uid)
    }
}

/// Phase Pending, or no phase yet.
fn is_pending(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_none_or(|p| p == "Pending")
}

impl Engine {
    /// Turns the fallback on (`--pod-cgroup-fallback`); it is active
    /// while no runtime hook is registered.
    pub fn enable_pod_cgroup_fallback(&mut self) {
        self.pod_dirs.enabled = true;
        self.pod_fallback_changed();
    }

    /// Whether the open/exec programs are loaded (the fallback is theirs).
    pub fn open_exec_loaded(&self) -> bool {
        self.openexec.get_ref().is_some()
    }

    /// The cgroup hierarchies the resolver reads (the watcher reads the
    /// same).
    pub fn resolver_hierarchies(&self) -> kyverno_runtime_cgroups::Resolver {
        self.resolver.hierarchies().clone()
    }

    /// Whether the pod directory fallback is active now.
    #[cfg(test)]
    pub fn pod_cgroup_fallback_active(&self) -> bool {
        self.pod_dirs.active()
    }

    /// A runtime hook registered (true) or was lost (false).
    pub(super) fn runtime_hook_registered(&mut self, registered: bool) {
        if self.pod_dirs.hook_registered == registered {
            return;
        }
        self.pod_dirs.hook_registered = registered;
        self.pod_fallback_changed();
    }

    /// The watch delivered `pod`: a Pending one is kept for its
    /// directory's appearance.
    pub(super) fn pod_dirs_watched(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_ref() else {
            return;
        };
        if self.pod_dirs.enabled && is_pending(pod) {
            self.pod_dirs.pending.insert(uid.clone(), pod.clone());
        } else {
            self.pod_dirs.pending.remove(uid);
        }
    }

    /// The watch saw the pod deleted.
    pub(super) fn pod_dirs_forget(&mut self, uid: &str) {
        self.pod_dirs.pending.remove(uid);
    }

    /// Whether `pod`, not Running, is kept as on the node: see
    /// [`PodDirs::starting`].
    pub(super) fn starting_in_pod_dir(&self, uid: &str, pod: &Pod) -> bool {
        self.pod_dirs.starting(uid, pod)
    }

    /// The kubelet created pod `uid`'s directory (cgroup `id`).
    pub fn pod_cgroup_appeared(&mut self, uid: &str, id: u64) {
        if self.pod_dirs.cgroups.insert(uid.to_owned(), id) == Some(id) {
            return;
        }
        self.pod_dir_changed(uid);
    }

    /// Pod `uid`'s directory is gone.
    pub fn pod_cgroup_removed(&mut self, uid: &str) {
        if self.pod_dirs.cgroups.remove(uid).is_none() {
            return;
        }
        self.pod_dir_changed(uid);
    }

    /// Every pod directory there is now (the watcher's first look, and
    /// after its events overflowed): replaces what was known.
    pub fn pod_cgroups_scanned(&mut self, now: BTreeMap<String, u64>) {
        let before = std::mem::replace(&mut self.pod_dirs.cgroups, now);
        let changed: BTreeSet<String> = before
            .iter()
            .filter(|(uid, id)| self.pod_dirs.cgroups.get(*uid) != Some(id))
            .map(|(uid, _)| uid.clone())
            .chain(
                self.pod_dirs
                    .cgroups
                    .iter()
                    .filter(|(uid, id)| before.get(*uid) != Some(id))
                    .map(|(uid, _)| uid.clone()),
            )
            .collect();
        for uid in changed {
            self.pod_dir_changed(&uid);
        }
    }

    /// Pod `uid`'s directory appeared, changed or went: the pod is taken
    /// again (a Pending one joins or leaves the node's pods) and its
    /// open/exec binding follows.
    fn pod_dir_changed(&mut self, uid: &str) {
        if !self.pod_dirs.active() {
            return;
        }
        if let Some(pod) = self.pod_dirs.pending.get(uid).cloned() {
            let pod = self.started.watched(&pod).into_owned();
            self.take_pod(&pod);
        }
        if self.pods.contains_key(uid) {
            self.observe_pod(uid);
            self.program_pod(uid);
        }
    }

    /// The fallback turned on or off: the kernel's switch, the metric,
    /// and every pod's binding follow.
    fn pod_fallback_changed(&mut self) {
        let active = self.pod_dirs.active();
        self.metrics.set_container_start_hook(POD_DIR_HOOK, active);
        if let Some(m) = self.openexec.get() {
            if let Err(e) = m.open_backend().set_pod_fallback(active) {
                tracing::error!(error = %e, active, "switching the pod directory fallback failed");
            }
        }
        if active {
            tracing::info!("pod directories are bound to open/exec policies as the kubelet creates them: containers are enforced from their first instruction");
        } else if self.pod_dirs.enabled {
            tracing::info!(
                "the runtime hook announces containers; pod directories are no longer bound"
            );
        }
        let pending: Vec<Pod> = self.pod_dirs.pending.values().cloned().collect();
        for pod in pending {
            let pod = self.started.watched(&pod).into_owned();
            self.take_pod(&pod);
        }
        let uids: BTreeSet<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            self.observe_pod(uid);
        }
        if !uids.is_empty() {
            self.program_pods(uids);
        }
    }
}

/// The metric's name for this hook (`container_start_hook{hook}`).
pub const POD_DIR_HOOK: &str = "pod-cgroup";
