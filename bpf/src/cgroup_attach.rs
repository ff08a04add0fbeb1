//! Attaching the `cgroup_skb/egress` programs (the egress filter, the
//! protocol classifier, the DNS observer) to cgroup v2 directories.
//!
//! # Coexistence
//!
//! Every attachment is a BPF link (`BPF_LINK_CREATE` with
//! `BPF_CGROUP_INET_EGRESS`), which the kernel always treats as
//! `BPF_F_ALLOW_MULTI`: the three programs of this crate, and any other
//! tool's multi-attached programs, run side by side on one cgroup, and a
//! packet leaves only if every one of them passes it (the effective verdict
//! is the AND). A program some other tool attached *exclusively* (legacy
//! `BPF_PROG_ATTACH` without flags) makes the kernel refuse the link
//! (`EPERM`), which surfaces as [`AttachError::Attach`], never silently. A
//! link is held by its fd: dropping a [`CgroupLink`] detaches exactly that
//! program from exactly that cgroup and leaves the others alone. A *pinned*
//! link (the egress filter pins its links when it is loaded with a pin
//! directory) is also held by its pin, so it stays attached when the
//! process exits, until the pin is removed.
//!
//! # Ordering
//!
//! Each backend's `attach_cgroup` and `detach_cgroup` implement the order
//! the specification gives for its gate:
//!
//! - egress filter and classifier: *program, then attach* (the cgroup's
//!   set and flags are in the map before the first packet runs the
//!   program, so it never sees a half-built set), and *revoke, then
//!   detach* (the cgroup leaves the map first; a link without a map entry
//!   passes everything, so closing it afterwards is harmless);
//! - DNS observer: *attach, then admit* (a cgroup that failed to attach
//!   never sits in the gate reading as observed) and *revoke, then detach*.
//!
//! [`CgroupAttachments`] keys links by cgroup path, for the managers.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Why a program could not be attached to a cgroup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The cgroup directory could not be opened or read (gone, not a
    /// cgroup v2 directory, no permission).
    #[error("cgroup {path}: {message}", path = .path.display())]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// The I/O error.
        message: String,
    },
    /// The kernel refused the link (`EPERM` when another tool attached an
    /// exclusive program there, `EINVAL` for a cgroup v1 directory, ...).
    #[error("attaching {program} to {path} failed: {message}", path = .path.display())]
    Attach {
        /// The program (`krt_egress`, `krt_protocol`, ...).
        program: &'static str,
        /// The directory.
        path: PathBuf,
        /// The errno, when there is one.
        errno: Option<i32>,
        /// libbpf's error.
        message: String,
    },
}

/// The cgroup v2 id of `dir`: its inode number, what
/// `bpf_skb_cgroup_id` returns for a socket of that cgroup.
pub fn cgroup_id(dir: &Path) -> Result<u64, AttachError> {
    fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|e| AttachError::Cgroup {
            path: dir.to_owned(),
            errno: e.raw_os_error(),
            message: e.to_string(),
        })
}

/// One program attached to the egress of one cgroup v2 directory (and its
/// descendants). Detached when dropped, unless it is pinned: a pinned link
/// stays attached until its pin is removed as well (the egress filter's
/// `detach_cgroup` does both), which is what lets enforcement outlive the
/// process.
pub struct CgroupLink {
    program: &'static str,
    path: PathBuf,
    cgroup_id: u64,
    /// Where the link is pinned, if it is.
    pin: Option<PathBuf>,
    // Held for its drop, which closes the link's fd and so detaches (when
    // nothing else, such as a pin, holds the link). A stub build never
    // reads it (no handle can be loaded there).
    #[cfg_attr(krt_bpf_stub, allow(dead_code))]
    link: libbpf_rs::Link,
}

impl fmt::Debug for CgroupLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CgroupLink")
            .field("program", &self.program)
            .field("path", &self.path)
            .field("cgroup_id", &self.cgroup_id)
            .field("pin", &self.pin)
            .finish_non_exhaustive()
    }
}

impl CgroupLink {
    /// The attached program's name.
    pub fn program(&self) -> &'static str {
        self.program
    }

    /// The cgroup directory it is attached to. A link adopted from a pin
    /// left by an earlier process does not know its directory (the kernel
    /// records only the cgroup id): its path is then the pin's.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the link is pinned, if it is.
    pub fn pin_path(&self) -> Option<&Path> {
        self.pin.as_deref()
    }

    /// A link opened from its pin at `pin` (left by an earlier process),
    /// attaching `program` to cgroup `cgroup_id`.
    #[cfg(not(krt_bpf_stub))]
    pub(crate) fn from_pin(
        program: &'static str,
        pin: &Path,
        cgroup_id: u64,
        link: libbpf_rs::Link,
    ) -> Self {
        Self {
            program,
            path: pin.to_owned(),
            cgroup_id,
            pin: Some(pin.to_owned()),
            link,
        }
    }

    /// The libbpf link (to read its info).
    #[cfg(not(krt_bpf_stub))]
    pub(crate) fn link(&self) -> &libbpf_rs::Link {
        &self.link
    }

    /// The libbpf link (to pin it, or to swap its program).
    #[cfg(not(krt_bpf_stub))]
    pub(crate) fn link_mut(&mut self) -> &mut libbpf_rs::Link {
        &mut self.link
    }

    /// Records that the link is now pinned at `pin`.
    #[cfg(not(krt_bpf_stub))]
    pub(crate) fn set_pin(&mut self, pin: Option<PathBuf>) {
        self.pin = pin;
    }

    /// The cgroup's id (its inode number when attached).
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// Closes the link now (the same as dropping it, spelled out): it
    /// detaches unless it is pinned.
    pub fn detach(self) {}
}

/// Attaches `program` to the inet egress hook of `dir` through a BPF link
/// (multi-attach, see the module docs).
#[cfg(not(krt_bpf_stub))]
pub(crate) fn attach_egress(
    program: &libbpf_rs::ProgramMut<'_>,
    name: &'static str,
    dir: &Path,
) -> Result<CgroupLink, AttachError> {
    use std::os::fd::AsRawFd as _;

    let cgroup = fs::File::open(dir).map_err(|e| AttachError::Cgroup {
        path: dir.to_owned(),
        errno: e.raw_os_error(),
        message: e.to_string(),
    })?;
    let id = cgroup
        .metadata()
        .map(|m| m.ino())
        .map_err(|e| AttachError::Cgroup {
            path: dir.to_owned(),
            errno: e.raw_os_error(),
            message: e.to_string(),
        })?;
    // The program's expected_attach_type is BPF_CGROUP_INET_EGRESS (from
    // its SEC name), which is what libbpf's link_create uses here.
    let link = program
        .attach_cgroup(cgroup.as_raw_fd())
        .map_err(|e| AttachError::Attach {
            program: name,
            path: dir.to_owned(),
            errno: crate::sys::errno(&e),
            message: format!("{e:#}"),
        })?;
    Ok(CgroupLink {
        program: name,
        path: dir.to_owned(),
        cgroup_id: id,
        pin: None,
        link,
    })
}

/// Links keyed by cgroup path: at most one per directory, so attaching a
/// cgroup twice is a no-op rather than a second run of the same program on
/// every packet.
#[derive(Debug)]
pub struct CgroupAttachments<L = CgroupLink> {
    links: BTreeMap<PathBuf, L>,
}

impl<L> Default for CgroupAttachments<L> {
    fn default() -> Self {
        Self {
            links: BTreeMap::new(),
        }
    }
}

impl<L> CgroupAttachments<L> {
    /// No attachments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches `dir` with `attach` unless it is attached already; returns
    /// whether it attached now. On an error nothing is kept.
    pub fn attach_with<E>(
        &mut self,
        dir: &Path,
        attach: impl FnOnce(&Path) -> Result<L, E>,
    ) -> Result<bool, E> {
        if self.links.contains_key(dir) {
            return Ok(false);
        }
        let link = attach(dir)?;
        self.links.insert(dir.to_owned(), link);
        Ok(true)
    }

    /// Takes the link of `dir` out (the caller revokes, then drops it, in
    /// the backend's order); `None` if it is not attached.
    pub fn take(&mut self, dir: &Path) -> Option<L> {
        self.links.remove(dir)
    }

    /// Whether `dir` is attached.
    pub fn contains(&self, dir: &Path) -> bool {
        self.links.contains_key(dir)
    }

    /// The attached directories, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.links.keys().map(PathBuf::as_path)
    }

    /// How many directories are attached.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_are_one_per_path() {
        let mut a: CgroupAttachments<u32> = CgroupAttachments::new();
        let p = Path::new("/sys/fs/cgroup/pod");
        assert_eq!(a.attach_with(p, |_| Ok::<_, ()>(1)), Ok(true));
        // The second attach does not run the closure.
        assert_eq!(a.attach_with(p, |_| Err(())), Ok(false));
        assert!(a.contains(p));
        assert_eq!(a.paths().collect::<Vec<_>>(), [p]);
        assert_eq!(a.take(p), Some(1));
        assert!(a.is_empty());
        assert_eq!(
            a.attach_with(p, |_| Err::<u32, _>("refused")),
            Err("refused")
        );
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn a_missing_cgroup_is_a_typed_error() {
        let err = cgroup_id(Path::new("/nonexistent/krt-cgroup")).unwrap_err();
        assert!(matches!(
            err,
            AttachError::Cgroup {
                errno: Some(libc::ENOENT),
                ..
            }
        ));
    }
}
