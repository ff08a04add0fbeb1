//! Resolution against cgroup trees recorded from real nodes.
//!
//! Each layout in `tests/layouts/` is three files:
//!
//! - `<layout>.tree`: every directory of the node's cgroup filesystems, one
//!   absolute path a line (`#` starts a comment), with the unrelated
//!   siblings a real node has (system.slice, pause sandboxes, CRI-O conmon
//!   scopes, other pods);
//! - `<layout>.mountinfo`: the node's `/proc/self/mountinfo`;
//! - `<layout>.pod.json`: a Pod on that node, as the API server returns it
//!   (the subtree layout reuses the containerd-systemd pod).
//!
//! A test rebuilds the tree in a tempdir, parses the mountinfo, moves the
//! chosen mount points into the tempdir, and resolves the pod.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus, Pod};
use kyverno_runtime_cgroups::{
    container_ids_key, CgroupRoot, CgroupVersion, Discovery, Layout, Resolver, Runtime,
    UnresolvedReason,
};
use rstest::rstest;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

const APP: &str = "bc90dc47c2388afbc45421a41977ef17d637ea36aeb7c285baa3eeeeed783a44";
const GHOST: &str = "ead6ef03d61ee60c533d6d450c50a1e559a8a37f6b796a4094cd0dac6b744428";
const CS_UID: &str = "1f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10";

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/layouts")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pod(layout: &str) -> Pod {
    serde_json::from_str(&fixture(&format!("{layout}.pod.json"))).unwrap()
}

/// A recorded node rebuilt in a tempdir.
struct Node {
    base: TempDir,
    resolver: Resolver,
}

impl Node {
    fn new(layout: &str) -> Self {
        let base = TempDir::new().unwrap();
        Self::build(base.path(), &fixture(&format!("{layout}.tree")));
        let recorded = Resolver::from_mountinfo(&fixture(&format!("{layout}.mountinfo"))).unwrap();
        let roots = recorded
            .roots()
            .iter()
            .map(|r| CgroupRoot {
                mount_point: base.path().join(r.mount_point.strip_prefix("/").unwrap()),
                ..r.clone()
            })
            .collect();
        Node {
            base,
            resolver: Resolver::new(roots),
        }
    }

    fn build(base: &Path, tree: &str) {
        for line in tree.lines().map(str::trim) {
            if !line.is_empty() && !line.starts_with('#') {
                std::fs::create_dir_all(base.join(line.trim_start_matches('/'))).unwrap();
            }
        }
    }

    /// A path of the recorded node, inside the tempdir.
    fn path(&self, recorded: &str) -> PathBuf {
        self.base.path().join(recorded.trim_start_matches('/'))
    }
}

fn status(name: &str, container_id: Option<&str>) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: container_id.map(str::to_string),
        image: "registry.k8s.io/app:1.0".into(),
        image_id: String::new(),
        ..Default::default()
    }
}

fn push_status(pod: &mut Pod, status: ContainerStatus) {
    let statuses = pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap();
    statuses.push(status);
}

#[rstest]
#[case::containerd_systemd("containerd-systemd", "containerd-systemd", &[
    ("app", Runtime::Containerd, Layout::SystemdScope, "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10.slice/cri-containerd-bc90dc47c2388afbc45421a41977ef17d637ea36aeb7c285baa3eeeeed783a44.scope"),
    ("sidecar", Runtime::Containerd, Layout::SystemdScope, "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10.slice/cri-containerd-25c639c08c93c7ce2fd84e595f464a7be9aea3a249e11edd7fa5bbf9a8564574.scope"),
], &["migrate"], Discovery::Standard, CgroupVersion::V2)]
#[case::containerd_systemd_subtree("containerd-systemd-subtree", "containerd-systemd", &[
    ("app", Runtime::Containerd, Layout::SystemdScope, "/sys/fs/cgroup/kubepods-burstable.slice/kubepods-burstable-pod1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10.slice/cri-containerd-bc90dc47c2388afbc45421a41977ef17d637ea36aeb7c285baa3eeeeed783a44.scope"),
    ("sidecar", Runtime::Containerd, Layout::SystemdScope, "/sys/fs/cgroup/kubepods-burstable.slice/kubepods-burstable-pod1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10.slice/cri-containerd-25c639c08c93c7ce2fd84e595f464a7be9aea3a249e11edd7fa5bbf9a8564574.scope"),
], &["migrate"], Discovery::Standard, CgroupVersion::V2)]
#[case::containerd_cgroupfs("containerd-cgroupfs", "containerd-cgroupfs", &[
    ("worker", Runtime::Containerd, Layout::Cgroupfs, "/sys/fs/cgroup/kubepods/besteffort/pod5b2e9c71-3f4a-4d8b-b6e2-91c0d7a4e833/8c3dc20fc15b624185082d68262e8dd6da44d3f7f78fa236bbdb9535e5560eb1"),
], &["fetch"], Discovery::Standard, CgroupVersion::V2)]
#[case::crio_systemd("crio-systemd", "crio-systemd", &[
    ("db", Runtime::CriO, Layout::SystemdScope, "/sys/fs/cgroup/kubepods.slice/kubepods-poda3c8e1f0_6b7d_4e29_8c15_f4d2b9a07e61.slice/crio-10cda6a6cc2d086d1b103fe09b146733134c0dd58c66eb745615521d44858157.scope"),
    ("proxy", Runtime::CriO, Layout::SystemdScopeNested, "/sys/fs/cgroup/kubepods.slice/kubepods-poda3c8e1f0_6b7d_4e29_8c15_f4d2b9a07e61.slice/crio-148c220a6360d4c3d4b3ee90bd2b4db486a671d73de2f3580c5e02ff47cd54c0.scope/container"),
], &[], Discovery::Standard, CgroupVersion::V2)]
#[case::crio_cgroupfs("crio-cgroupfs", "crio-cgroupfs", &[
    ("api", Runtime::CriO, Layout::Cgroupfs, "/sys/fs/cgroup/kubepods/burstable/pod9e7d6c5b-4a39-4281-9f0e-1d2c3b4a5968/crio-382af536e2ad230556477a08737c0a5b851e77f43d505976185760de9bb41b85"),
], &[], Discovery::Standard, CgroupVersion::V2)]
#[case::docker_systemd_hybrid("docker-systemd", "docker-systemd", &[
    ("cache", Runtime::Docker, Layout::SystemdScope, "/sys/fs/cgroup/unified/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podc41b7e2a_9d08_4f63_a5c1_7e8f9a0b1c2d.slice/docker-c3e3e874d2ebacc94ef0572b31e3cbdb43fc5f79c03f976ebf68178d4239a7e0.scope"),
], &[], Discovery::Standard, CgroupVersion::V2)]
#[case::docker_cgroupfs_without_qos_class("docker-cgroupfs", "docker-cgroupfs", &[
    ("web", Runtime::Docker, Layout::Cgroupfs, "/sys/fs/cgroup/kubepods/burstable/pode8f7a6b5-c4d3-4e21-b0a9-f8e7d6c5b4a3/dbeff76391d7898e437a87c69e6949b90808465308ee8bbe472da46e5cd318cf"),
    ("log", Runtime::Docker, Layout::Cgroupfs, "/sys/fs/cgroup/kubepods/burstable/pode8f7a6b5-c4d3-4e21-b0a9-f8e7d6c5b4a3/0b8708d4f98a79b27f48a3a18e027e97799d17c09a1523717ce477be7ae12163"),
], &[], Discovery::Standard, CgroupVersion::V2)]
#[case::cgroup_v1_cgroupfs("cgroup-v1-cgroupfs", "cgroup-v1-cgroupfs", &[
    ("legacy", Runtime::Containerd, Layout::Cgroupfs, "/sys/fs/cgroup/cpu,cpuacct/kubepods/burstable/pod2a3b4c5d-6e7f-4819-a2b3-c4d5e6f7a8b9/0a1a0c2896e52b47c88b7954baf6adc5af011f1bf159c8baa6c0b57bba71568b"),
], &[], Discovery::Standard, CgroupVersion::V1)]
#[case::kind_nested("kind-nested", "kind-nested", &[
    ("nginx", Runtime::Containerd, Layout::SystemdScope, "/sys/fs/cgroup/system.slice/docker-696ae930fbed08677065273f2dd537c0aee286f86158376d1d81ea788a9367f1.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod6d5c4b3a_2918_4765_b4a3_9281706f5e4d.slice/cri-containerd-3c644a6c360425e8a1296dfdb3e4e1a9d7f7170f260e2d577b0fa27565ca08ad.scope"),
], &[], Discovery::Search, CgroupVersion::V2)]
fn recorded_layouts_resolve_every_running_container(
    #[case] layout: &str,
    #[case] pod_fixture: &str,
    #[case] expected: &[(&str, Runtime, Layout, &str)],
    #[case] exited: &[&str],
    #[case] discovery: Discovery,
    #[case] version: CgroupVersion,
) {
    let node = Node::new(layout);
    let resolution = node.resolver.resolve(&pod(pod_fixture));

    let got: Vec<_> = resolution
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.runtime, c.layout, c.path.clone()))
        .collect();
    let want: Vec<_> = expected
        .iter()
        .map(|(name, runtime, layout, path)| (*name, *runtime, *layout, node.path(path)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(resolution.exited, exited);
    assert!(resolution.pending.is_empty());
    for c in &resolution.containers {
        assert_eq!(c.discovery, discovery, "{}", c.name);
        assert!(c.container_id.len() == 64, "{}", c.container_id);
        if version == CgroupVersion::V2 {
            // The cgroup id is the directory's inode on cgroup v2.
            assert_eq!(c.cgroup_id, Some(std::fs::metadata(&c.path).unwrap().ino()));
        } else {
            assert_eq!(c.cgroup_id, None);
        }
    }
    if version == CgroupVersion::V1 {
        // Found, but reported as not enforceable.
        assert!(!resolution.is_complete());
        let reasons: Vec<_> = resolution.unresolved.iter().map(|u| &u.reason).collect();
        assert_eq!(
            reasons,
            vec![&UnresolvedReason::V1NoCgroupId {
                path: node.path(expected[0].3)
            }]
        );
    } else {
        assert!(
            resolution.unresolved.is_empty(),
            "{:?}",
            resolution.unresolved
        );
        assert!(resolution.is_complete());
    }
}

#[rstest]
#[case::unified("containerd-systemd", &[("/sys/fs/cgroup", "/", CgroupVersion::V2)])]
#[case::subtree("containerd-systemd-subtree", &[("/sys/fs/cgroup", "/kubepods.slice", CgroupVersion::V2)])]
#[case::hybrid("docker-systemd", &[
    ("/sys/fs/cgroup/unified", "/", CgroupVersion::V2),
    ("/sys/fs/cgroup/cpu,cpuacct", "/", CgroupVersion::V1),
])]
#[case::legacy("cgroup-v1-cgroupfs", &[("/sys/fs/cgroup/cpu,cpuacct", "/", CgroupVersion::V1)])]
fn recorded_mount_tables_choose_the_hierarchies(
    #[case] layout: &str,
    #[case] expected: &[(&str, &str, CgroupVersion)],
) {
    let resolver = Resolver::from_mountinfo(&fixture(&format!("{layout}.mountinfo"))).unwrap();
    let got: Vec<_> = resolver
        .roots()
        .iter()
        .map(|r| (r.mount_point.clone(), r.mount_root.clone(), r.version))
        .collect();
    let want: Vec<_> = expected
        .iter()
        .map(|(m, r, v)| (PathBuf::from(m), PathBuf::from(r), *v))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_missing_container_is_not_found_with_the_paths_tried() {
    let node = Node::new("containerd-systemd");
    let mut pod = pod("containerd-systemd");
    push_status(
        &mut pod,
        status("ghost", Some(&format!("containerd://{GHOST}"))),
    );
    let resolution = node.resolver.resolve(&pod);

    assert_eq!(resolution.containers.len(), 2, "the others still resolve");
    assert!(!resolution.is_complete());
    let [ghost] = resolution.unresolved.as_slice() else {
        panic!("{:?}", resolution.unresolved)
    };
    assert_eq!(ghost.name, "ghost");
    assert_eq!(ghost.container_id, format!("containerd://{GHOST}"));
    // Burstable: the systemd and cgroupfs candidates, in that order. The
    // search finds the systemd pod slice again and does not repeat it.
    let u = CS_UID.replace('-', "_");
    assert_eq!(
        ghost.reason,
        UnresolvedReason::NotFound {
            tried: vec![
                node.path(&format!("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{GHOST}.scope")),
                node.path(&format!("/sys/fs/cgroup/kubepods/burstable/pod{CS_UID}/{GHOST}")),
            ]
        }
    );
    assert_eq!(ghost.reason.label(), "not_found");
}

#[test]
fn a_pod_missing_from_the_node_reports_the_search_too() {
    let node = Node::new("kind-nested");
    let mut pod = pod("containerd-systemd");
    pod.status.as_mut().unwrap().qos_class = None;
    let resolution = node.resolver.resolve(&pod);
    let UnresolvedReason::NotFound { tried } = &resolution.unresolved[0].reason else {
        panic!("{:?}", resolution.unresolved)
    };
    // 3 QoS classes x 2 drivers, then the search.
    assert_eq!(tried.len(), 7);
    assert_eq!(
        tried.last().unwrap(),
        &node.path(&format!("/sys/fs/cgroup/**/pod{CS_UID}"))
    );
    assert!(tried.iter().all(|p| p.starts_with(node.base.path())));
}

#[test]
fn bad_pending_and_good_containers_in_one_pod() {
    let node = Node::new("containerd-systemd");
    let mut pod = pod("containerd-systemd");
    push_status(&mut pod, status("typo", Some("containerd://not-hex")));
    push_status(
        &mut pod,
        status("escape", Some("containerd://../../../etc")),
    );
    push_status(&mut pod, status("bare", Some(APP)));
    push_status(&mut pod, status("rkt", Some(&format!("rkt://{APP}"))));
    push_status(&mut pod, status("starting", None));
    push_status(&mut pod, status("empty", Some("")));
    let mut created = status("created", Some(&format!("containerd://{GHOST}")));
    created.state = Some(ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("ContainerCreating".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    push_status(&mut pod, created);

    let resolution = node.resolver.resolve(&pod);
    let names: Vec<_> = resolution
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["app", "sidecar"]);
    assert_eq!(resolution.pending, ["starting", "empty", "created"]);
    assert_eq!(resolution.exited, ["migrate"]);
    let reasons: Vec<_> = resolution
        .unresolved
        .iter()
        .map(|u| (u.name.as_str(), u.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("typo", UnresolvedReason::MalformedContainerId),
            ("escape", UnresolvedReason::MalformedContainerId),
            ("bare", UnresolvedReason::MalformedContainerId),
            (
                "rkt",
                UnresolvedReason::UnknownRuntime {
                    scheme: "rkt".into()
                }
            ),
        ]
    );
    assert!(!resolution.is_complete());
}

#[test]
fn a_pod_without_a_usable_uid_resolves_nothing() {
    let node = Node::new("containerd-systemd");
    for uid in [None, Some("../kubepods")] {
        let mut pod = pod("containerd-systemd");
        pod.metadata.uid = uid.map(str::to_string);
        let resolution = node.resolver.resolve(&pod);
        assert!(resolution.containers.is_empty());
        assert_eq!(resolution.unresolved.len(), 2);
        assert!(resolution
            .unresolved
            .iter()
            .all(|u| u.reason == UnresolvedReason::InvalidPodUid));
    }
}

#[test]
fn the_search_is_bounded_in_depth() {
    let base = TempDir::new().unwrap();
    let u = CS_UID.replace('-', "_");
    let leaf = format!("kubepods-besteffort-pod{u}.slice/cri-containerd-{APP}.scope");
    // Pod slice 8 levels down: found. 9 levels down: out of reach.
    for (depth, found) in [(8, true), (9, false)] {
        let prefix: PathBuf = (1..depth).map(|i| format!("n{i}")).collect();
        let root = base.path().join(format!("d{depth}"));
        std::fs::create_dir_all(root.join(&prefix).join(&leaf)).unwrap();
        let resolver = Resolver::new(vec![CgroupRoot::new(&root, CgroupVersion::V2)]);
        let mut pod = pod("containerd-systemd");
        pod.status.as_mut().unwrap().container_statuses =
            Some(vec![status("app", Some(&format!("containerd://{APP}")))]);
        let resolution = resolver.resolve(&pod);
        assert_eq!(resolution.containers.len() == 1, found, "depth {depth}");
    }
}

#[test]
fn an_explicit_root_tells_its_version() {
    let dir = TempDir::new().unwrap();
    assert_eq!(CgroupVersion::of_dir(dir.path()), CgroupVersion::V1);
    std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    assert_eq!(CgroupVersion::of_dir(dir.path()), CgroupVersion::V2);
}

#[test]
fn the_retry_key_follows_ids_and_states_not_order() {
    let base = pod("containerd-systemd");
    let key = container_ids_key(&base);
    assert_eq!(key, container_ids_key(&base.clone()));

    let mut reordered = base.clone();
    reordered
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()
        .reverse();
    assert_eq!(container_ids_key(&reordered), key);

    let mut restarted = base.clone();
    restarted
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .container_id = Some(format!("containerd://{GHOST}"));
    assert_ne!(container_ids_key(&restarted), key);

    // Created -> running keeps the id; the key still changes.
    let mut waiting = base.clone();
    waiting
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state = Some(ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    });
    assert_ne!(container_ids_key(&waiting), key);

    let mut other_pod = base.clone();
    other_pod.metadata.uid = Some("7c1d2e3f-0a1b-4c5d-8e9f-a0b1c2d3e4f5".into());
    assert_ne!(container_ids_key(&other_pod), key);
}
