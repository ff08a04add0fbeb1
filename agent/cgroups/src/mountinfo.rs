//! `/proc/self/mountinfo` parsing and the choice of the cgroup hierarchies
//! to resolve in.
//!
//! `kyverno_runtime_compat` has a mountinfo parser, but it keeps only the
//! mount point and the filesystem type. Resolution also needs the root
//! column (cgroup namespaces and bind mounts of a subtree) and the super
//! options (which v1 controller a hierarchy carries), and compat links
//! libbpf through `kyverno-runtime-bpf`, which a path resolver should not
//! need. So this module parses the few columns it needs itself.
//!
//! # The root column
//!
//! The 4th field of a mountinfo line is the directory of the filesystem
//! that appears at the mount point. For a cgroup filesystem it is a cgroup
//! path, printed relative to the reader's cgroup namespace:
//!
//! - `/`: the mount shows the whole hierarchy (as far as this namespace can
//!   see); a kubelet path `kubepods.slice/...` is joined to the mount point.
//! - `/kubepods.slice` (a descendant): the mount shows only that subtree, as
//!   when a bind mount or a runtime without cgroup namespaces exposes part of
//!   the tree. A kubelet path maps only if it lies under the root, by
//!   stripping the root: `kubepods.slice/x` -> `<mount point>/x`.
//! - `/../..` (an ancestor): the mount shows more than our own namespace,
//!   which is what the host's `/sys/fs/cgroup` bind-mounted into a container
//!   with a private cgroup namespace looks like. How far up it reaches cannot
//!   be told from inside, so it is treated as the hierarchy root, which a
//!   host bind mount is in practice; the bounded search covers the rest.

use crate::{Error, Result};
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

/// The most bytes of a mount table read: far above a node's (a few hundred
/// bytes a mount, tens of mounts a pod), and a bound on what a kernel file
/// may make the daemon hold.
pub const MAX_MOUNTINFO_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a mount table (`/proc/self/mountinfo`, `/proc/1/mountinfo`) of at
/// most [`MAX_MOUNTINFO_BYTES`].
pub fn read_mountinfo(path: &Path) -> Result<String> {
    let error = |source| Error::Mountinfo {
        path: path.to_owned(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(error)?
        .take(MAX_MOUNTINFO_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(error)?;
    if text.len() as u64 > MAX_MOUNTINFO_BYTES {
        return Err(error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_MOUNTINFO_BYTES} bytes"),
        )));
    }
    Ok(text)
}

/// One line of mountinfo, reduced to the columns resolution needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfoEntry {
    /// Field 4: the directory of the filesystem shown at the mount point (for
    /// cgroup filesystems, a cgroup path relative to our cgroup namespace).
    pub root: PathBuf,
    /// Field 5: where it is mounted, with octal escapes decoded.
    pub mount_point: PathBuf,
    /// The filesystem type after the `-` separator (`cgroup2`, `cgroup`, ...).
    pub fs_type: String,
    /// The super options (for cgroup v1, the controllers: `rw,cpu,cpuacct`).
    pub super_options: Vec<String>,
}

/// Parses mountinfo text. Malformed lines are skipped: the table comes from
/// the kernel, and one odd line must not hide the others.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfoEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountInfoEntry> {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|f| *f == "-")?;
    if separator < 6 {
        return None;
    }
    Some(MountInfoEntry {
        root: PathBuf::from(unescape(fields.get(3)?)),
        mount_point: PathBuf::from(unescape(fields.get(4)?)),
        fs_type: (*fields.get(separator + 1)?).to_string(),
        super_options: fields
            .get(separator + 3)
            .map(|opts| opts.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
    })
}

/// Decodes the `\040`-style octal escapes mountinfo uses for spaces and the like.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(digits) = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\') {
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which cgroup hierarchy version a root belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// A cgroup v1 controller (or named) hierarchy: no BPF-usable cgroup id.
    V1,
    /// The cgroup v2 (unified) hierarchy: the directory inode is the cgroup id.
    V2,
}

impl CgroupVersion {
    /// The version of a directory given as an explicit root (a
    /// `--cgroup-root` flag): every cgroup v2 directory has a
    /// `cgroup.controllers` file and no v1 directory does.
    pub fn of_dir(dir: &Path) -> Self {
        if dir.join("cgroup.controllers").exists() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
    }
}

/// A cgroup hierarchy as this process sees it: where it is mounted and which
/// cgroup the mount point shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    /// The directory to look in (`/sys/fs/cgroup`, a host bind mount, a
    /// test's tempdir).
    pub mount_point: PathBuf,
    /// The mountinfo root column: the cgroup shown at `mount_point` (`/` for
    /// the whole hierarchy). See the module docs for how it maps paths.
    pub mount_root: PathBuf,
    /// The hierarchy's version, which decides whether an inode is a cgroup id.
    pub version: CgroupVersion,
}

impl CgroupRoot {
    /// An explicit root that shows the whole hierarchy (a test harness, a
    /// `--cgroup-root` flag).
    pub fn new(mount_point: impl Into<PathBuf>, version: CgroupVersion) -> Self {
        CgroupRoot {
            mount_point: mount_point.into(),
            mount_root: PathBuf::from("/"),
            version,
        }
    }

    /// Maps a cgroup path relative to the hierarchy root (as the kubelet
    /// names it, e.g. `kubepods.slice/...`) to a directory under the mount
    /// point, or `None` when the mount does not show that part of the tree.
    pub fn map(&self, hierarchy_path: &Path) -> Option<PathBuf> {
        let relative = hierarchy_path.strip_prefix("/").unwrap_or(hierarchy_path);
        match subtree(&self.mount_root) {
            None => Some(self.mount_point.join(relative)),
            Some(sub) => relative
                .strip_prefix(&sub)
                .ok()
                .map(|rest| self.mount_point.join(rest)),
        }
    }
}

/// The subtree a mount root shows, relative to the hierarchy root, or
/// `None` when it shows the whole hierarchy (`/`, or an ancestor `/..`).
fn subtree(mount_root: &Path) -> Option<PathBuf> {
    if mount_root.components().any(|c| c == Component::ParentDir) {
        return None;
    }
    let relative: PathBuf = mount_root
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    (!relative.as_os_str().is_empty()).then_some(relative)
}

/// Ranks a mount root: one that sees more of the hierarchy is better.
fn root_rank(root: &Path) -> u8 {
    if root.components().any(|c| c == Component::ParentDir) {
        0
    } else if subtree(root).is_none() {
        1
    } else {
        2
    }
}

/// Ranks a v1 hierarchy by the controllers it carries. The kubelet creates
/// pod cgroups in cpu, cpuacct, memory and pids on every node; the named
/// systemd hierarchy carries the systemd driver's scopes but is not a
/// controller, so it is the last resort.
fn controller_rank(entry: &MountInfoEntry) -> Option<u8> {
    let has = |name: &str| entry.super_options.iter().any(|o| o == name);
    if has("cpu") || has("cpuacct") {
        Some(0)
    } else if has("memory") {
        Some(1)
    } else if has("pids") {
        Some(2)
    } else if has("name=systemd") {
        Some(3)
    } else {
        None
    }
}

/// Chooses the hierarchies to resolve in, best first: the cgroup2 mount (if
/// any) and then one cgroup v1 hierarchy (if any). On a hybrid host both are
/// returned, because the cgroupfs driver may create a container only in the
/// v1 controllers; a v1 hit still gives the path, without a cgroup id.
///
/// Among several mounts of the same hierarchy, the one that sees the most of
/// the tree wins (see the module docs), then the conventional mount point,
/// then the first in the table, so the choice is deterministic.
pub fn select_roots(entries: &[MountInfoEntry]) -> Vec<CgroupRoot> {
    let conventional = |p: &Path| match p.to_str() {
        Some("/sys/fs/cgroup") => 0u8,
        Some("/sys/fs/cgroup/unified") => 1,
        _ => 2,
    };
    let v2 = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.fs_type == "cgroup2")
        .min_by_key(|(i, e)| (root_rank(&e.root), conventional(&e.mount_point), *i))
        .map(|(_, e)| (e, CgroupVersion::V2));
    let v1 = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.fs_type == "cgroup")
        .filter_map(|(i, e)| Some((controller_rank(e)?, root_rank(&e.root), i, e)))
        .min_by_key(|(controller, root, i, _)| (*controller, *root, *i))
        .map(|(_, _, _, e)| (e, CgroupVersion::V1));
    v2.into_iter()
        .chain(v1)
        .map(|(e, version)| CgroupRoot {
            mount_point: e.mount_point.clone(),
            mount_root: e.root.clone(),
            version,
        })
        .collect()
}

/// [`select_roots`] on mountinfo text, failing when no hierarchy is usable.
pub(crate) fn roots_from_text(text: &str) -> Result<Vec<CgroupRoot>> {
    let roots = select_roots(&parse_mountinfo(text));
    if roots.is_empty() {
        Err(Error::NoCgroupMount)
    } else {
        Ok(roots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_table_over_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let big = dir.path().join("mountinfo");
        std::fs::File::create(&big)
            .and_then(|f| f.set_len(MAX_MOUNTINFO_BYTES + 1))
            .unwrap_or_else(|e| panic!("{e}"));
        let err = read_mountinfo(&big).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.ends_with("larger than 16777216 bytes")),
            "{err:?}"
        );
        assert!(read_mountinfo(Path::new("/dev/zero")).is_err());
        assert!(read_mountinfo(Path::new("/proc/self/mountinfo")).is_ok());
    }

    fn root(text: &str) -> Vec<(String, String, CgroupVersion)> {
        select_roots(&parse_mountinfo(text))
            .into_iter()
            .map(|r| {
                (
                    r.mount_point.display().to_string(),
                    r.mount_root.display().to_string(),
                    r.version,
                )
            })
            .collect()
    }

    #[test]
    fn unified() {
        let text = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
36 24 0:31 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:10 - bpf bpf rw,mode=700
";
        assert_eq!(
            root(text),
            vec![("/sys/fs/cgroup".into(), "/".into(), CgroupVersion::V2)]
        );
    }

    #[test]
    fn hybrid_prefers_unified_then_cpu_controller() {
        let text = "\
25 22 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
";
        assert_eq!(
            root(text),
            vec![
                (
                    "/sys/fs/cgroup/unified".into(),
                    "/".into(),
                    CgroupVersion::V2
                ),
                (
                    "/sys/fs/cgroup/cpu,cpuacct".into(),
                    "/".into(),
                    CgroupVersion::V1
                ),
            ]
        );
    }

    #[test]
    fn v1_falls_back_through_memory_pids_and_systemd() {
        let systemd =
            "27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n";
        let pids = "33 25 0:30 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        let memory = "31 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let devices = "34 25 0:31 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n";
        let pick = |text: String| root(&text)[0].0.clone();
        assert_eq!(
            pick(format!("{systemd}{pids}{memory}")),
            "/sys/fs/cgroup/memory"
        );
        assert_eq!(pick(format!("{systemd}{pids}")), "/sys/fs/cgroup/pids");
        assert_eq!(
            pick(format!("{devices}{systemd}")),
            "/sys/fs/cgroup/systemd"
        );
        assert!(roots_from_text(devices).is_err());
        assert!(matches!(roots_from_text(""), Err(Error::NoCgroupMount)));
    }

    #[test]
    fn namespaced_roots_map_paths_under_them() {
        // A pod that bind-mounts the host's kubepods subtree at /sys/fs/cgroup.
        let text = "1290 1280 0:30 /kubepods.slice /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        let roots = select_roots(&parse_mountinfo(text));
        let r = &roots[0];
        assert_eq!(r.mount_root, PathBuf::from("/kubepods.slice"));
        assert_eq!(
            r.map(Path::new(
                "kubepods.slice/kubepods-besteffort.slice/x.scope"
            )),
            Some(PathBuf::from(
                "/sys/fs/cgroup/kubepods-besteffort.slice/x.scope"
            ))
        );
        // Outside the subtree: not visible through this mount.
        assert_eq!(r.map(Path::new("kubepods/besteffort/pod1")), None);
        assert_eq!(r.map(Path::new("kubepods.slice-other/x")), None);
    }

    #[test]
    fn an_ancestor_root_wins_over_our_own_namespace() {
        // A container with a private cgroup namespace: its own /sys/fs/cgroup
        // shows `/`, the host's bind mount shows an ancestor.
        let text = "\
700 690 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup ro
701 690 0:30 /../../.. /host/sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw
";
        let roots = select_roots(&parse_mountinfo(text));
        assert_eq!(roots[0].mount_point, PathBuf::from("/host/sys/fs/cgroup"));
        assert_eq!(
            roots[0].map(Path::new("kubepods.slice")),
            Some(PathBuf::from("/host/sys/fs/cgroup/kubepods.slice"))
        );
    }

    #[test]
    fn escapes_and_malformed_lines() {
        let text = "garbage\n1 2 3\n\n40 1 0:30 / /host/cg\\040root rw shared:1 master:2 - cgroup2 none rw\n1 2 3 4 - x\n";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].mount_point, PathBuf::from("/host/cg root"));
        assert_eq!(entries[0].super_options, vec!["rw"]);
        assert_eq!(unescape("a\\b\\0\\777"), "a\\b\\0\\777");
    }
}
