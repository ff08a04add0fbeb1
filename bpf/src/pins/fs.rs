//! Directory descriptors: opening a directory without following a final
//! symlink, the facts [`super::check`] decides on, what a pinned object
//! is. Nothing here changes the filesystem.

use std::ffi::OsString;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{
    fstatfs, openat, statx, AtFlags, FileType, Mode, OFlags, StatxAttributes, StatxFlags, CWD,
};
use rustix::io::Errno;

use super::{marker, Inspection, MarkerState, ObjectKind, PinError, Refusal, BPF_FS_MAGIC};

/// How every directory is opened: read-only, a directory, never through a
/// symlink in the last component, closed on exec.
pub(crate) const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

pub(crate) fn refused(dir: &Path, reason: Refusal) -> PinError {
    PinError::Refused {
        dir: dir.to_owned(),
        reason,
    }
}

pub(crate) fn io_err(dir: &Path, op: &'static str, e: Errno) -> PinError {
    PinError::Io {
        dir: dir.to_owned(),
        op,
        error: e.into(),
    }
}

/// Opens `dir` for inspection; `Ok(None)` when it does not exist.
pub(crate) fn open_dir(dir: &Path) -> Result<Option<OwnedFd>, PinError> {
    match openat(CWD, dir, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        // O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR (ELOOP
        // without O_DIRECTORY, or for a path that loops): say which.
        Err(Errno::LOOP | Errno::NOTDIR) => {
            let last = statx(CWD, dir, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE);
            let symlink = last
                .is_ok_and(|st| FileType::from_raw_mode(st.stx_mode.into()) == FileType::Symlink);
            Err(refused(
                dir,
                if symlink {
                    Refusal::Symlink
                } else {
                    Refusal::NotADirectory
                },
            ))
        }
        Err(e) => Err(io_err(dir, "opening", e)),
    }
}

/// Opens `dir` and reads everything [`super::check`] decides on.
pub(crate) fn open_checked(dir: &Path) -> Result<Option<(OwnedFd, Ident, Inspection)>, PinError> {
    let Some(fd) = open_dir(dir)? else {
        return Ok(None);
    };
    let fs_magic = fs_magic(fd.as_fd()).map_err(|e| io_err(dir, "statfs", e))?;
    let me = Ident::of(fd.as_fd()).map_err(|e| io_err(dir, "statx", e))?;
    let mount_root = is_mount_root(fd.as_fd(), &me).map_err(|e| io_err(dir, "statx ..", e))?;
    // Only a bpffs directory can hold a marker (and only one below a
    // mount root is read at all).
    let marker = if fs_magic == BPF_FS_MAGIC && !mount_root {
        marker::read(fd.as_fd())
    } else {
        MarkerState::Absent
    };
    let inspection = Inspection {
        fs_magic,
        mount_root,
        marker,
    };
    Ok(Some((fd, me, inspection)))
}

/// The filesystem magic of `fd`'s filesystem (its low 32 bits: every
/// magic is 32 bits, and `f_type` is signed on some targets).
pub(crate) fn fs_magic(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let fs = fstatfs(fd)?;
    // The field's integer type differs between targets; widen it.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let magic = fs.f_type as i64;
    Ok(magic as u64 & 0xffff_ffff)
}

/// Where a directory is: its device, inode and mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ident {
    dev: (u32, u32),
    ino: u64,
    /// The mount's id, when the kernel reports it (5.8+).
    mnt_id: Option<u64>,
    /// `STATX_ATTR_MOUNT_ROOT`, when the kernel reports it (5.8+).
    mount_root: Option<bool>,
}

impl Ident {
    pub(crate) fn of(fd: BorrowedFd<'_>) -> Result<Self, Errno> {
        Self::at(fd, c"", AtFlags::EMPTY_PATH)
    }

    fn at(dir: BorrowedFd<'_>, name: &std::ffi::CStr, flags: AtFlags) -> Result<Self, Errno> {
        let st = statx(
            dir,
            name,
            flags | AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::TYPE | StatxFlags::INO | StatxFlags::MNT_ID,
        )?;
        let known = StatxFlags::from_bits_retain(st.stx_mask);
        Ok(Ident {
            dev: (st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            mnt_id: known.contains(StatxFlags::MNT_ID).then_some(st.stx_mnt_id),
            mount_root: st
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)),
        })
    }

    /// Whether `other` is on the same mount as this.
    pub(crate) fn same_mount(&self, other: &Ident) -> bool {
        self.dev == other.dev
            && match (self.mnt_id, other.mnt_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Whether `other` is this very directory.
    pub(crate) fn same_inode(&self, other: &Ident) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// Whether `fd` (whose [`Ident`] is `me`) is the root of a mount: the
/// kernel says so, or its `..` is on another mount, or is itself (the
/// process's root).
pub(crate) fn is_mount_root(fd: BorrowedFd<'_>, me: &Ident) -> Result<bool, Errno> {
    if me.mount_root == Some(true) {
        return Ok(true);
    }
    let parent = openat(fd, c"..", DIR_FLAGS, Mode::empty())?;
    let up = Ident::of(parent.as_fd())?;
    Ok(!me.same_mount(&up) || me.same_inode(&up))
}

/// What an entry of a directory is, by `statx` without following it.
pub(crate) fn entry_type(dir: BorrowedFd<'_>, name: &OsString) -> Result<Option<FileType>, Errno> {
    match statx(
        dir,
        name.as_os_str(),
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::TYPE,
    ) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.stx_mode.into()))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the subdirectory `name` of `dir` and returns it with its
/// [`Ident`].
pub(crate) fn open_subdir(dir: BorrowedFd<'_>, name: &OsString) -> Result<(OwnedFd, Ident), Errno> {
    let fd = openat(dir, name.as_os_str(), DIR_FLAGS, Mode::empty())?;
    let id = Ident::of(fd.as_fd())?;
    Ok((fd, id))
}

/// The names in `dir` (without `.` and `..`), sorted.
pub(crate) fn names(dir: BorrowedFd<'_>) -> Result<Vec<OsString>, Errno> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(std::ffi::OsStr::from_bytes(name).to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// A path naming `name` in the directory `dir` is open on, for the BPF
/// calls that take a path (`BPF_OBJ_GET`, `BPF_OBJ_PIN`): the kernel
/// resolves `/proc/self/fd/N` to that very directory, never by its name.
pub(crate) fn proc_path(dir: BorrowedFd<'_>, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// What the BPF object an fd holds is, by the first key of its
/// `/proc/self/fdinfo` entry that only one kind of BPF object shows
/// (`map_type`, `link_type`, `prog_type`; the `/proc/self/fd` link text
/// differs between kernels: `bpf_link`, `bpf-link`).
pub(crate) fn fd_object(fd: BorrowedFd<'_>) -> Result<FdObject, String> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let info = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    for line in info.lines() {
        let key = line.split(':').next().unwrap_or_default();
        match key {
            "map_type" => return Ok(FdObject::Map),
            "link_type" => return Ok(FdObject::Link),
            "prog_type" => return Ok(FdObject::Program),
            _ => {}
        }
    }
    Ok(FdObject::Other)
}

/// What [`fd_object`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FdObject {
    Map,
    Link,
    Program,
    Other,
}

/// The object pinned at `name` in `dir`: `Ok(kind)` for a map or a link,
/// `Err` with what it is otherwise.
pub(crate) fn pinned_object(dir: BorrowedFd<'_>, name: &str) -> Result<ObjectKind, String> {
    // `Link::open` is a plain BPF_OBJ_GET, whatever the object; its drop
    // only closes the descriptor (a pinned link stays attached).
    let object = libbpf_rs::Link::open(proc_path(dir, name))
        .map_err(|e| format!("not a BPF object ({e:#})"))?;
    match fd_object(object.as_fd())? {
        FdObject::Map => Ok(ObjectKind::Map),
        FdObject::Link => Ok(ObjectKind::Link),
        FdObject::Program => Err("a program".to_owned()),
        FdObject::Other => Err("not a BPF map or link".to_owned()),
    }
}
