//! The directory names the kubelet and the container runtimes create.
//!
//! Pod directories, relative to the hierarchy root (`<uid_>` is the pod UID
//! with `-` replaced by `_`, because `-` separates systemd slice levels):
//!
//! | QoS        | systemd driver                                                              | cgroupfs driver             |
//! |------------|-----------------------------------------------------------------------------|-----------------------------|
//! | Guaranteed | `kubepods.slice/kubepods-pod<uid_>.slice`                                   | `kubepods/pod<uid>`         |
//! | Burstable  | `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` | `kubepods/burstable/pod<uid>` |
//! | BestEffort | `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice` | `kubepods/besteffort/pod<uid>` |
//!
//! Container directories inside the pod directory:
//!
//! | runtime    | systemd driver                                   | cgroupfs driver |
//! |------------|--------------------------------------------------|-----------------|
//! | containerd | `cri-containerd-<id>.scope`                      | `<id>`          |
//! | CRI-O      | `crio-<id>.scope/container`, `crio-<id>.scope`   | `crio-<id>`     |
//! | docker     | `docker-<id>.scope`                              | `<id>`          |
//!
//! CRI-O runs a container's processes in a nested `container` directory of
//! its scope when it needs the scope itself for other processes (newer
//! releases); the nested directory is preferred because it is the cgroup the
//! workload's tasks report. `crio-conmon-<id>.scope` holds CRI-O's monitor
//! process, not the container, and is never a candidate.
//!
//! When the QoS class is absent or unknown all three classes are tried. The
//! driver is never known in advance, so both are tried, systemd first.
//!
//! Nodes that nest these under a prefix (kind nodes seen from their host, a
//! kubelet `--cgroup-root` such as kind's `/kubelet`, which renames the
//! slices `kubelet-kubepods-...`) are covered by a bounded breadth-first
//! search for the pod directory (see `Resolver`), which matches a pod
//! directory by the suffix the kubelet always writes (`pod<uid>` or
//! `-pod<uid_>.slice`), whatever the prefix.

use crate::container::Runtime;
use std::path::PathBuf;

/// The shape of the container directory that was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A systemd scope in a pod slice (systemd cgroup driver).
    SystemdScope,
    /// The `container` directory nested in a CRI-O systemd scope.
    SystemdScopeNested,
    /// A plain directory in a pod directory (cgroupfs cgroup driver).
    Cgroupfs,
}

/// The kubelet's cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driver {
    Systemd,
    Cgroupfs,
}

/// A pod's QoS class, which picks the kubelet's parent directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The classes to try for `status.qosClass`: the named one, or all three.
pub(crate) fn qos_classes(qos_class: Option<&str>) -> &'static [Qos] {
    match qos_class {
        Some("Guaranteed") => &[Qos::Guaranteed],
        Some("Burstable") => &[Qos::Burstable],
        Some("BestEffort") => &[Qos::BestEffort],
        _ => &[Qos::Guaranteed, Qos::Burstable, Qos::BestEffort],
    }
}

/// Whether a pod UID is safe to put in a path. UIDs are UUIDs, or 32 hex
/// digits for static pods; anything else is refused rather than joined.
pub(crate) fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn systemd_uid(uid: &str) -> String {
    uid.replace('-', "_")
}

/// The standard pod directories, relative to the hierarchy root: systemd
/// first, then cgroupfs, each in the order of `classes`.
pub(crate) fn pod_dirs(uid: &str, classes: &[Qos]) -> Vec<(Driver, PathBuf)> {
    let u = systemd_uid(uid);
    let systemd = classes.iter().map(|qos| {
        let path = match qos {
            Qos::Guaranteed => format!("kubepods.slice/kubepods-pod{u}.slice"),
            Qos::Burstable => {
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice")
            }
            Qos::BestEffort => {
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice")
            }
        };
        (Driver::Systemd, PathBuf::from(path))
    });
    let cgroupfs = classes.iter().map(|qos| {
        let path = match qos {
            Qos::Guaranteed => format!("kubepods/pod{uid}"),
            Qos::Burstable => format!("kubepods/burstable/pod{uid}"),
            Qos::BestEffort => format!("kubepods/besteffort/pod{uid}"),
        };
        (Driver::Cgroupfs, PathBuf::from(path))
    });
    systemd.chain(cgroupfs).collect()
}

/// The container directories to try inside a pod directory, best first.
pub(crate) fn leaves(driver: Driver, runtime: Runtime, id: &str) -> Vec<(Layout, PathBuf)> {
    let one = |layout, name: String| vec![(layout, PathBuf::from(name))];
    match (driver, runtime) {
        (Driver::Systemd, Runtime::Containerd) => {
            one(Layout::SystemdScope, format!("cri-containerd-{id}.scope"))
        }
        (Driver::Systemd, Runtime::CriO) => vec![
            (
                Layout::SystemdScopeNested,
                PathBuf::from(format!("crio-{id}.scope/container")),
            ),
            (
                Layout::SystemdScope,
                PathBuf::from(format!("crio-{id}.scope")),
            ),
        ],
        (Driver::Systemd, Runtime::Docker) => {
            one(Layout::SystemdScope, format!("docker-{id}.scope"))
        }
        (Driver::Cgroupfs, Runtime::CriO) => one(Layout::Cgroupfs, format!("crio-{id}")),
        (Driver::Cgroupfs, Runtime::Containerd | Runtime::Docker) => {
            one(Layout::Cgroupfs, id.to_string())
        }
    }
}

/// Whether a directory name is this pod's directory, and in which driver's
/// naming. Only the suffix is matched, so prefixed slice names
/// (`kubelet-kubepods-besteffort-pod<uid_>.slice`) are found too.
pub(crate) fn pod_dir_driver(name: &str, uid: &str) -> Option<Driver> {
    if name.strip_prefix("pod") == Some(uid) {
        return Some(Driver::Cgroupfs);
    }
    let slice = format!("pod{}.slice", systemd_uid(uid));
    let systemd = name == slice
        || name
            .strip_suffix(&slice)
            .is_some_and(|prefix| prefix.ends_with('-'));
    systemd.then_some(Driver::Systemd)
}

/// Whether a directory name is some pod's directory. The search does not
/// descend into other pods: what lies below them is containers.
pub(crate) fn looks_like_pod_dir(name: &str) -> bool {
    let uid_like = |rest: &str, sep: u8| {
        rest.len() >= 32 && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == sep)
    };
    if name
        .strip_prefix("pod")
        .is_some_and(|rest| uid_like(rest, b'-'))
    {
        return true;
    }
    name.strip_suffix(".slice")
        .and_then(|core| {
            core.strip_prefix("pod")
                .or_else(|| core.rsplit_once("-pod").map(|(_, rest)| rest))
        })
        .is_some_and(|rest| uid_like(rest, b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1f6a4a34-8d2c-4b8e-9a51-2c1e7f3b9d10";

    #[test]
    fn pod_directory_names() {
        let u = "1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10";
        assert_eq!(
            pod_dir_driver(&format!("pod{UID}"), UID),
            Some(Driver::Cgroupfs)
        );
        for name in [
            format!("kubepods-pod{u}.slice"),
            format!("kubepods-burstable-pod{u}.slice"),
            format!("kubelet-kubepods-besteffort-pod{u}.slice"),
            format!("pod{u}.slice"),
        ] {
            assert_eq!(pod_dir_driver(&name, UID), Some(Driver::Systemd), "{name}");
            assert!(looks_like_pod_dir(&name), "{name}");
        }
        assert_eq!(pod_dir_driver(&format!("xpod{u}.slice"), UID), None);
        assert_eq!(pod_dir_driver(&format!("pod{UID}x"), UID), None);
        assert!(looks_like_pod_dir(&format!("pod{UID}")));
        for other in [
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods",
            "podman.slice",
            "system.slice",
        ] {
            assert!(!looks_like_pod_dir(other), "{other}");
        }
    }

    #[test]
    fn uids_that_are_not_path_safe_are_refused() {
        assert!(valid_uid(UID));
        assert!(valid_uid("0123456789abcdef0123456789abcdef"));
        for bad in ["", "../x", "a/b", "a b", &"a".repeat(65)] {
            assert!(!valid_uid(bad), "{bad}");
        }
    }

    #[test]
    fn unknown_qos_tries_every_class_for_both_drivers() {
        assert_eq!(pod_dirs(UID, qos_classes(None)).len(), 6);
        assert_eq!(pod_dirs(UID, qos_classes(Some("Platinum"))).len(), 6);
        assert_eq!(
            pod_dirs(UID, qos_classes(Some("Guaranteed"))),
            vec![
                (
                    Driver::Systemd,
                    PathBuf::from(
                        "kubepods.slice/kubepods-pod1f6a4a34_8d2c_4b8e_9a51_2c1e7f3b9d10.slice"
                    )
                ),
                (
                    Driver::Cgroupfs,
                    PathBuf::from(format!("kubepods/pod{UID}"))
                ),
            ]
        );
    }
}
