//! Kernel facts read from procfs, sysfs and securityfs, and their parsers.
//!
//! The parsers are pure so they are tested on text recorded from real hosts.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What the probe read about the running kernel, apart from program loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelFacts {
    /// `uname -r`, from `/proc/sys/kernel/osrelease`.
    pub release: String,
    /// Whether the kernel exposes its own BTF at `/sys/kernel/btf/vmlinux`,
    /// which CO-RE relocation and LSM/fmod_ret attachment need.
    pub btf: bool,
    /// The active LSM list.
    pub lsm: LsmFacts,
    /// The selected kernel lockdown mode (`none`, `integrity`,
    /// `confidentiality`), or `None` when the kernel has no lockdown LSM.
    pub lockdown: Option<String>,
    /// The cgroup hierarchy this process lives in.
    pub cgroup: CgroupFacts,
    /// The BPF filesystem.
    pub bpffs: BpffsFacts,
}

/// The active LSM list, from securityfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LsmFacts {
    /// Active LSMs in kernel order, or `None` when the list could not be read.
    pub active: Option<Vec<String>>,
    /// Whether `bpf` is in the active list (`false` when the list is unknown).
    pub bpf_active: bool,
    /// Whether the probe had to mount securityfs to read the list.
    pub mounted_securityfs: bool,
    /// Why the list could not be read, when it could not.
    pub error: Option<String>,
}

/// Which cgroup hierarchy layout the host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupLayout {
    /// cgroup v2 only, mounted at the cgroup root.
    Unified,
    /// cgroup v1 controllers with a cgroup v2 hierarchy beside them
    /// (typically at `/sys/fs/cgroup/unified`).
    Hybrid,
    /// cgroup v1 only: no cgroup_skb attachment point exists.
    Legacy,
    /// No cgroup filesystem is mounted at all.
    None,
}

impl CgroupLayout {
    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            CgroupLayout::Unified => "unified",
            CgroupLayout::Hybrid => "hybrid",
            CgroupLayout::Legacy => "legacy",
            CgroupLayout::None => "none",
        }
    }
}

/// The cgroup v2 mount actually in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupFacts {
    /// The layout derived from the mount table.
    pub layout: CgroupLayout,
    /// Where the cgroup v2 hierarchy is mounted, if it is.
    pub v2_mount: Option<PathBuf>,
}

/// The BPF filesystem, where later backends pin programs and maps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BpffsFacts {
    /// Whether a bpffs is mounted.
    pub mounted: bool,
    /// Its mount point (the standard `/sys/fs/bpf` is preferred when several exist).
    pub path: Option<PathBuf>,
}

/// One line of `/proc/self/mountinfo`, reduced to what the probe needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount point, with the kernel's octal escapes decoded.
    pub mount_point: PathBuf,
    /// The filesystem type (`cgroup2`, `cgroup`, `bpf`, `securityfs`, ...).
    pub fs_type: String,
}

/// Parses `/proc/self/mountinfo`. Malformed lines are skipped: the table
/// comes from the kernel, and one odd line must not hide the others.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            // Fields: id parent major:minor root mount-point options [optional...] - fstype source super-options
            let separator = fields.iter().position(|f| *f == "-")?;
            let mount_point = fields.get(4)?;
            let fs_type = fields.get(separator + 1)?;
            if separator < 6 {
                return None;
            }
            Some(MountEntry {
                mount_point: PathBuf::from(unescape_mount_field(mount_point)),
                fs_type: (*fs_type).to_string(),
            })
        })
        .collect()
}

/// Decodes the `\040`-style octal escapes mountinfo uses for spaces and the like.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
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

/// Derives the cgroup layout and the v2 mount in use from the mount table.
pub(crate) fn cgroup_facts(mounts: &[MountEntry]) -> CgroupFacts {
    let v2: Vec<&Path> = mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point.as_path())
        .collect();
    let has_v1 = mounts.iter().any(|m| m.fs_type == "cgroup");
    // Prefer the conventional locations when a hierarchy is mounted twice
    // (a container runtime may bind it elsewhere as well).
    let v2_mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(Path::new)
        .find(|p| v2.contains(p))
        .or_else(|| v2.first().copied())
        .map(Path::to_path_buf);
    let layout = match (&v2_mount, has_v1) {
        (Some(_), false) => CgroupLayout::Unified,
        (Some(_), true) => CgroupLayout::Hybrid,
        (None, true) => CgroupLayout::Legacy,
        (None, false) => CgroupLayout::None,
    };
    CgroupFacts { layout, v2_mount }
}

/// Finds the bpffs mount, preferring `/sys/fs/bpf`.
pub(crate) fn bpffs_facts(mounts: &[MountEntry]) -> BpffsFacts {
    let standard = Path::new("/sys/fs/bpf");
    let path = mounts
        .iter()
        .filter(|m| m.fs_type == "bpf")
        .map(|m| m.mount_point.clone())
        .min_by_key(|p| p != standard);
    BpffsFacts {
        mounted: path.is_some(),
        path,
    }
}

/// Parses securityfs `lsm`: a comma-separated list such as
/// `lockdown,capability,landlock,yama,apparmor,bpf`.
pub fn parse_active_lsms(text: &str) -> Vec<String> {
    text.trim()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses securityfs `lockdown` (`none [integrity] confidentiality`) into the
/// selected mode, the one in brackets.
pub fn parse_lockdown(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on the 6.18 build host: cgroup v1 controllers with v2 at
    /// /sys/fs/cgroup/unified, and no bpffs.
    const HOST_MOUNTINFO: &str = include_str!("../tests/fixtures/mountinfo-host-6.18.txt");

    #[test]
    fn hybrid_host_uses_the_unified_subdirectory() {
        let mounts = parse_mountinfo(HOST_MOUNTINFO);
        let cg = cgroup_facts(&mounts);
        assert_eq!(cg.layout, CgroupLayout::Hybrid);
        assert_eq!(
            cg.v2_mount.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert!(!bpffs_facts(&mounts).mounted);
    }

    #[test]
    fn unified_layout_and_bpffs() {
        let text = "\
25 1 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
26 1 0:24 / /sys/fs/bpf rw,nosuid shared:9 - bpf bpf rw,mode=700
27 1 0:24 / /run/other\\040bpf rw - bpf bpf rw
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts[2].mount_point, PathBuf::from("/run/other bpf"));
        let cg = cgroup_facts(&mounts);
        assert_eq!(cg.layout, CgroupLayout::Unified);
        assert_eq!(cg.v2_mount.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        let bpffs = bpffs_facts(&mounts);
        assert_eq!(bpffs.path.as_deref(), Some(Path::new("/sys/fs/bpf")));
    }

    #[test]
    fn legacy_and_empty_tables() {
        let legacy = parse_mountinfo("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
        assert_eq!(cgroup_facts(&legacy).layout, CgroupLayout::Legacy);
        assert_eq!(cgroup_facts(&[]).layout, CgroupLayout::None);
        assert_eq!(cgroup_facts(&[]).v2_mount, None);
    }

    #[test]
    fn malformed_mountinfo_lines_are_skipped_not_fatal() {
        let text =
            "garbage\n1 2 3\n\n25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n1 2 3 4 - x\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].fs_type, "cgroup2");
    }

    #[test]
    fn escapes_that_are_not_octal_stay_literal() {
        assert_eq!(unescape_mount_field("a\\b"), "a\\b");
        assert_eq!(unescape_mount_field("a\\0"), "a\\0");
        assert_eq!(unescape_mount_field("a\\777b"), "a\\777b");
        assert_eq!(unescape_mount_field("tab\\011x"), "tab\tx");
    }

    #[test]
    fn lsm_list_and_lockdown() {
        assert_eq!(
            parse_active_lsms("lockdown,capability,landlock,bpf\n"),
            vec!["lockdown", "capability", "landlock", "bpf"]
        );
        assert!(parse_active_lsms("").is_empty());
        assert_eq!(
            parse_lockdown("none [integrity] confidentiality\n").as_deref(),
            Some("integrity")
        );
        assert_eq!(
            parse_lockdown("[none] integrity confidentiality").as_deref(),
            Some("none")
        );
        assert_eq!(parse_lockdown("none integrity"), None);
    }
}
