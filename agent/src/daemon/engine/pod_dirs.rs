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
//! The pod's sandbox (the pause process) lives in a child of the pod's
//! directory too, and a policy of the pod's must never refuse it its
//! program (an exec default deny would keep every selected pod from
//! starting). The first child of a pod's directory is the sandbox's (the
//! kubelet creates containers only once the sandbox runs): it is exempted
//! in the kernel (`oe_pod_exempt`) before the directory is bound, and the
//! directory is bound only while its sandbox is known. A sandbox created
//! again while containers of the old one remain is not recognised and the
//! directory stays unbound: the safe side (the status path then).
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
    /// The pod directories that exist, by pod UID.
    dirs: BTreeMap<String, PodDir>,
    /// Pods the watch delivered in phase Pending (only while enabled), so
    /// that their directory's appearance can take them.
    pending: BTreeMap<String, Pod>,
    /// The kernel's count of decisions taken through pod directories at
    /// the last poll (the metric takes the difference).
    pub(super) decisions_seen: u64,
}

impl PodDirs {
    /// Whether pod directories are bound now.
    pub fn active(&self) -> bool {
        self.enabled && !self.hook_registered
    }

    /// The pod's directory's cgroup id, while the fallback is active and
    /// the directory's sandbox is known (and exempt).
    pub fn cgroup_of(&self, uid: &str) -> Option<u64> {
        if !self.active() {
            return None;
        }
        self.dirs
            .get(uid)
            .filter(|d| d.sandbox.is_some())
            .map(|d| d.id)
    }

    /// Whether `pod` (not Running) is about to run here: Pending, with its
    /// directory bound.
    fn starting(&self, uid: &str, pod: &Pod) -> bool {
        is_pending(pod) && self.cgroup_of(uid).is_some()
    }
}

/// One pod's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodDir {
    /// Its cgroup id.
    id: u64,
    /// Its children's cgroup ids (the sandbox's and the containers').
    children: BTreeSet<u64>,
    /// The sandbox's: the first child seen in an empty directory.
    sandbox: Option<u64>,
}

/// A pod directory as the watcher read it whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedPodDir {
    /// Its cgroup id.
    pub id: u64,
    /// Its children's cgroup ids, oldest first (the first is the
    /// sandbox's).
    pub children: Vec<u64>,
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

    /// The kubelet created pod `uid`'s directory (cgroup `id`); bound
    /// once its sandbox's directory appears in it.
    pub fn pod_cgroup_appeared(&mut self, uid: &str, id: u64) {
        if self.pod_dirs.dirs.get(uid).is_some_and(|d| d.id == id) {
            return;
        }
        let fresh = PodDir {
            id,
            children: BTreeSet::new(),
            sandbox: None,
        };
        let old = self.pod_dirs.dirs.insert(uid.to_owned(), fresh);
        self.pod_dir_changed(uid);
        if let Some(sandbox) = old.and_then(|d| d.sandbox) {
            self.exempt(sandbox, false);
        }
    }

    /// Pod `uid`'s directory is gone.
    pub fn pod_cgroup_removed(&mut self, uid: &str) {
        let Some(old) = self.pod_dirs.dirs.remove(uid) else {
            return;
        };
        self.pod_dir_changed(uid);
        if let Some(sandbox) = old.sandbox {
            self.exempt(sandbox, false);
        }
    }

    /// A directory appeared in pod `uid`'s: the first in an empty one is
    /// the sandbox's, exempted, and then the pod's directory is bound.
    pub fn pod_dir_child_appeared(&mut self, uid: &str, child: u64) {
        let Some(dir) = self.pod_dirs.dirs.get_mut(uid) else {
            return;
        };
        let first = dir.children.is_empty() && dir.sandbox.is_none();
        dir.children.insert(child);
        if first {
            dir.sandbox = Some(child);
            // Exempt before the binding that would decide for it.
            self.exempt(child, true);
            self.pod_dir_changed(uid);
        }
    }

    /// A directory in pod `uid`'s went; the sandbox's going unbinds the
    /// pod's directory.
    pub fn pod_dir_child_removed(&mut self, uid: &str, child: u64) {
        let Some(dir) = self.pod_dirs.dirs.get_mut(uid) else {
            return;
        };
        dir.children.remove(&child);
        if dir.sandbox == Some(child) {
            dir.sandbox = None;
            self.pod_dir_changed(uid);
            self.exempt(child, false);
        }
    }

    /// Every pod directory there is now (the watcher's first look, and
    /// after its events overflowed): replaces what was known.
    pub fn pod_cgroups_scanned(&mut self, now: BTreeMap<String, ScannedPodDir>) {
        let now: BTreeMap<String, PodDir> = now
            .into_iter()
            .map(|(uid, scanned)| {
                let dir = PodDir {
                    id: scanned.id,
                    sandbox: scanned.children.first().copied(),
                    children: scanned.children.into_iter().collect(),
                };
                (uid, dir)
            })
            .collect();
        // Exempt before any binding that would decide for them.
        for sandbox in now.values().filter_map(|d| d.sandbox) {
            self.exempt(sandbox, true);
        }
        let before = std::mem::replace(&mut self.pod_dirs.dirs, now);
        let bound = |d: &PodDir| d.sandbox.map(|_| d.id);
        let changed: BTreeSet<String> = before
            .keys()
            .chain(self.pod_dirs.dirs.keys())
            .filter(|uid| {
                before.get(*uid).and_then(bound) != self.pod_dirs.dirs.get(*uid).and_then(bound)
            })
            .cloned()
            .collect();
        if self.pod_dirs.active() {
            self.rebind_pod_dirs(changed);
        }
        let kept: BTreeSet<u64> = self
            .pod_dirs
            .dirs
            .values()
            .filter_map(|d| d.sandbox)
            .collect();
        for gone in before.values().filter_map(|d| d.sandbox) {
            if !kept.contains(&gone) {
                self.exempt(gone, false);
            }
        }
    }

    /// Writes or removes a sandbox's exemption in the kernel.
    fn exempt(&mut self, cgroup: u64, exempt: bool) {
        if let Some(m) = self.openexec.get() {
            if let Err(e) = m.open_backend().set_pod_exempt(cgroup, exempt) {
                tracing::error!(error = %e, cgroup, exempt, "exempting a pod sandbox from the pod directory fallback failed");
            }
        }
    }

    /// Pod `uid`'s directory appeared, changed or went.
    fn pod_dir_changed(&mut self, uid: &str) {
        if self.pod_dirs.active() {
            self.rebind_pod_dirs(BTreeSet::from([uid.to_owned()]));
        }
    }

    /// The pods of `uids` after their directories' binding changed: a
    /// Pending one is taken again (it joins or leaves the node's pods with
    /// its directory, and taking it programs it), and one on the node
    /// before and after is programmed again (its open/exec binding gained
    /// or lost the directory). Each is programmed once.
    fn rebind_pod_dirs(&mut self, uids: BTreeSet<String>) {
        let known_before: Vec<String> = uids
            .iter()
            .filter(|uid| self.pods.contains_key(*uid))
            .cloned()
            .collect();
        for uid in &uids {
            if let Some(pod) = self.pod_dirs.pending.get(uid).cloned() {
                let pod = self.started.watched(&pod).into_owned();
                self.take_pod(&pod);
            }
        }
        let rebound: BTreeSet<String> = known_before
            .into_iter()
            .filter(|uid| self.pods.contains_key(uid))
            .collect();
        for uid in &rebound {
            self.observe_pod(uid);
        }
        if !rebound.is_empty() {
            self.program_pods(rebound);
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
        let uids = self
            .pods
            .keys()
            .chain(self.pod_dirs.pending.keys())
            .cloned()
            .collect();
        self.rebind_pod_dirs(uids);
    }
}

/// The metric's name for this hook (`container_start_hook{hook}`).
pub const POD_DIR_HOOK: &str = "pod-cgroup";
