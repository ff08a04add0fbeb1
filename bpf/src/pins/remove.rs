//! Removing a checked pin directory: only what the layout names, through
//! directory descriptors, never across a mount, directories only once
//! empty, the marker last.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{openat, unlinkat, AtFlags, FileType, Mode};
use rustix::io::Errno;

use super::fs::{self, refused, Ident, DIR_FLAGS};
use super::{
    check, lookup, marker, Entry, Kind, Layout, MarkerState, Named, ObjectKind, Result, MARKER,
};

/// What a removal did, for the operator: every entry removed, every entry
/// kept and why, every failure.
#[derive(Debug, Default)]
pub struct Removal {
    /// The directory as given.
    pub dir: PathBuf,
    /// There was no such directory: nothing to do.
    pub absent: bool,
    /// The pins removed (maps, links, markers).
    pub removed_pins: Vec<PathBuf>,
    /// The directories removed (the pin directory last, when it went).
    pub removed_dirs: Vec<PathBuf>,
    /// What was left in place.
    pub kept: Vec<Kept>,
    /// Entries of the layout that could not be removed.
    pub failed: Vec<Failed>,
}

impl Removal {
    /// Nothing was kept and nothing failed: the directory is gone.
    pub fn is_complete(&self) -> bool {
        self.kept.is_empty() && self.failed.is_empty()
    }
}

impl fmt::Display for Removal {
    /// One line: what went, how much was kept or failed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.absent {
            return write!(
                f,
                "{} does not exist: nothing to remove",
                self.dir.display()
            );
        }
        write!(
            f,
            "removed {} pins and {} directories under {}",
            self.removed_pins.len(),
            self.removed_dirs.len(),
            self.dir.display()
        )?;
        if !self.kept.is_empty() {
            write!(f, "; kept {} entries that are not ours", self.kept.len())?;
        }
        if !self.failed.is_empty() {
            write!(f, "; {} could not be removed", self.failed.len())?;
        }
        Ok(())
    }
}

/// An entry left in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Where (for display; never resolved again).
    pub path: PathBuf,
    /// Why it was kept.
    pub reason: KeptReason,
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kept {}: {}", self.path.display(), self.reason)
    }
}

/// Why an entry was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptReason {
    /// The layout does not name it.
    NotInLayout,
    /// The layout names a pin there, but it is a directory, a symlink or
    /// another file type.
    NotAPin(String),
    /// The layout names a pin of another object kind there.
    WrongObject {
        /// What the layout names.
        want: ObjectKind,
        /// What it is.
        found: String,
    },
    /// A directory of the layout that is another mount (something is
    /// mounted over it).
    OtherMount,
    /// A subdirectory that should carry its own marker and does not, or
    /// carries another.
    Unmarked(String),
    /// A directory that still holds entries that are not ours.
    NotEmpty,
}

impl fmt::Display for KeptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeptReason::NotInLayout => write!(f, "not part of kyverno-runtime's pin layout"),
            KeptReason::NotAPin(what) => {
                write!(f, "the layout has a pin of this name, but this is {what}")
            }
            KeptReason::WrongObject { want, found } => write!(
                f,
                "the layout has a {} of this name, but this is {found}",
                want.name()
            ),
            KeptReason::OtherMount => write!(f, "another filesystem is mounted there"),
            KeptReason::Unmarked(why) => write!(f, "not marked as kyverno-runtime's: {why}"),
            KeptReason::NotEmpty => {
                write!(f, "the directory still holds entries that are not ours")
            }
        }
    }
}

/// An entry of the layout whose removal failed.
#[derive(Debug)]
pub struct Failed {
    /// Where.
    pub path: PathBuf,
    /// The failed operation.
    pub op: &'static str,
    /// The error.
    pub error: std::io::Error,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.error)
    }
}

/// See [`super::remove`].
pub(crate) fn remove(dir: &Path, want: Option<Kind>) -> Result<Removal> {
    let mut out = Removal {
        dir: dir.to_owned(),
        ..Removal::default()
    };
    let Some((fd, me, found)) = fs::open_checked(dir)? else {
        out.absent = true;
        return Ok(out);
    };
    // The one decision: nothing below runs unless it allows.
    let kind = check(&found, want).map_err(|reason| refused(dir, reason))?;
    let mut walk = Walk { root: me, out };
    if walk.marked(fd.as_fd(), dir, kind.layout()) {
        walk.remove_root(fd.as_fd(), dir);
    }
    Ok(walk.out)
}

struct Walk {
    /// The checked pin directory: nothing on another mount is touched.
    root: Ident,
    out: Removal,
}

impl Walk {
    fn fail(&mut self, path: PathBuf, op: &'static str, e: Errno) {
        self.out.failed.push(Failed {
            path,
            op,
            error: e.into(),
        });
    }

    fn keep(&mut self, path: PathBuf, reason: KeptReason) {
        self.out.kept.push(Kept { path, reason });
    }

    /// Empties a directory of `layout` whose marker was checked, then
    /// removes the marker; whether everything of ours in it went (the
    /// marker too).
    fn marked(&mut self, dir: BorrowedFd<'_>, shown: &Path, layout: &'static Layout) -> bool {
        if !self.entries(dir, shown, layout.entries) {
            // The marker stays: a second run can finish the job.
            return false;
        }
        match unlinkat(dir, MARKER, AtFlags::empty()) {
            Ok(()) => {
                self.out.removed_pins.push(shown.join(MARKER));
                true
            }
            Err(e) => {
                self.fail(shown.join(MARKER), "removing", e);
                false
            }
        }
    }

    /// Removes what `entries` names in `dir`; whether nothing of ours
    /// failed.
    fn entries(&mut self, dir: BorrowedFd<'_>, shown: &Path, entries: &'static [Entry]) -> bool {
        let names = match fs::names(dir) {
            Ok(names) => names,
            Err(e) => {
                self.fail(shown.to_owned(), "listing", e);
                return false;
            }
        };
        let mut clean = true;
        for name in names {
            let path = shown.join(&name);
            if name == MARKER {
                continue;
            }
            let Some(named) = name.to_str().and_then(|n| lookup(entries, n)) else {
                self.keep(path, KeptReason::NotInLayout);
                continue;
            };
            let file_type = match fs::entry_type(dir, &name) {
                Ok(Some(t)) => t,
                Ok(None) => continue,
                Err(e) => {
                    self.fail(path, "inspecting", e);
                    clean = false;
                    continue;
                }
            };
            clean &= match named {
                Named::Object(kind) => self.object(dir, &name, path, file_type, kind),
                Named::Dir(sub) => self.subdir(dir, &name, path, file_type, |w, fd, p| {
                    w.entries(fd, p, sub)
                }),
                Named::Marked(layout) => {
                    self.subdir(dir, &name, path, file_type, |w, fd, p| {
                        match marker::read(fd) {
                            MarkerState::Ours(k) if k == layout.kind => w.marked(fd, p, layout),
                            // A directory the backend made before it
                            // could mark it: removed only if empty.
                            MarkerState::Absent => {
                                w.keep_contents(fd, p, "the directory has no marker");
                                true
                            }
                            MarkerState::Ours(k) => {
                                w.keep_contents(fd, p, &format!("its marker says {}", k.name()));
                                true
                            }
                            MarkerState::NotOurs(why) => {
                                w.keep_contents(fd, p, &why);
                                true
                            }
                        }
                    })
                }
            };
        }
        clean
    }

    /// Names what an unmarked subdirectory holds (kept, untouched).
    fn keep_contents(&mut self, dir: BorrowedFd<'_>, shown: &Path, why: &str) {
        match fs::names(dir) {
            Ok(names) => {
                for name in names {
                    self.keep(shown.join(name), KeptReason::Unmarked(why.to_owned()));
                }
            }
            Err(e) => self.fail(shown.to_owned(), "listing", e),
        }
    }

    /// Removes the pin `name` of `dir` if it is a `want`.
    fn object(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsString,
        path: PathBuf,
        file_type: FileType,
        want: ObjectKind,
    ) -> bool {
        // bpffs shows every pinned object as a regular file.
        if file_type != FileType::RegularFile {
            self.keep(path, KeptReason::NotAPin(format!("a {file_type:?}")));
            return true;
        }
        let Some(utf8) = name.to_str() else {
            self.keep(path, KeptReason::NotInLayout);
            return true;
        };
        match fs::pinned_object(dir, utf8) {
            Ok(found) if found == want => {}
            Ok(found) => {
                let found = format!("a {}", found.name());
                self.keep(path, KeptReason::WrongObject { want, found });
                return true;
            }
            Err(found) => {
                self.keep(path, KeptReason::WrongObject { want, found });
                return true;
            }
        }
        match unlinkat(dir, name.as_os_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {
                self.out.removed_pins.push(path);
                true
            }
            Err(e) => {
                self.fail(path, "removing", e);
                false
            }
        }
    }

    /// Opens the subdirectory `name` of `dir` (on the pin directory's own
    /// mount only), empties it with `inner`, and removes it if it is then
    /// empty.
    fn subdir(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsString,
        path: PathBuf,
        file_type: FileType,
        inner: impl FnOnce(&mut Self, BorrowedFd<'_>, &Path) -> bool,
    ) -> bool {
        if file_type != FileType::Directory {
            self.keep(path, KeptReason::NotAPin(format!("a {file_type:?}")));
            return true;
        }
        let (fd, id) = match fs::open_subdir(dir, name) {
            Ok(opened) => opened,
            Err(Errno::NOENT) => return true,
            Err(e) => {
                self.fail(path, "opening", e);
                return false;
            }
        };
        let over_mount =
            !self.root.same_mount(&id) || fs::is_mount_root(fd.as_fd(), &id).unwrap_or(true);
        if over_mount {
            self.keep(path, KeptReason::OtherMount);
            return true;
        }
        if !inner(self, fd.as_fd(), &path) {
            return false;
        }
        drop(fd);
        self.rmdir(dir, name, path)
    }

    /// Removes the empty directory `name` of `dir`; one that is not empty
    /// is kept (what it holds was named already).
    fn rmdir(&mut self, dir: BorrowedFd<'_>, name: &OsString, path: PathBuf) -> bool {
        match unlinkat(dir, name.as_os_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {
                self.out.removed_dirs.push(path);
                true
            }
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                self.keep(path, KeptReason::NotEmpty);
                true
            }
            Err(e) => {
                self.fail(path, "removing", e);
                false
            }
        }
    }

    /// Removes the pin directory itself (empty now, or kept): by its name
    /// in its parent, opened as `..` of it, once that name is checked to
    /// still be this very directory.
    fn remove_root(&mut self, fd: BorrowedFd<'_>, shown: &Path) {
        let Some(name) = shown.file_name().map(OsString::from) else {
            return;
        };
        let parent = match openat(fd, c"..", DIR_FLAGS, Mode::empty()) {
            Ok(parent) => parent,
            Err(e) => return self.fail(shown.to_owned(), "opening the parent of", e),
        };
        let same = fs::open_subdir(parent.as_fd(), &name)
            .map(|(_, id)| id.same_inode(&self.root))
            .unwrap_or(false);
        if !same {
            // Renamed meanwhile, or named through a symlink: leave the
            // (empty) directory rather than guess.
            return;
        }
        self.rmdir(parent.as_fd(), &name, shown.to_owned());
    }
}
