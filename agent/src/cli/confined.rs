//! Reading the files a test file names, confined to the test's own
//! directory.
//!
//! A `kyverno-runtime-test.yaml` names its policy and event files by
//! relative path. The directory it sits in may come from anyone (a pull
//! request run in CI), so a name must not reach a file outside it: not by
//! an absolute path, not by `..`, not by a symbolic link that leads out,
//! and not by a `/proc` magic link. [`Confined::read_text`] refuses each
//! before reading a byte.
//!
//! The check is the kernel's, not a string comparison: the directory is
//! opened once, and each file is opened relative to it with `openat2(2)`
//! and `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so the path is resolved
//! and confined in the same system call, with no window between checking
//! and opening for a renamed directory or a swapped link to slip through.
//! Kernels before 5.6 (or a seccomp filter refusing the call) fall back to
//! resolving both paths (`realpath`) and comparing prefixes, then opening
//! the resolved path without following a final link: the same answer for
//! a directory that does not change while it is read, which is what an
//! untrusted checkout is.
//!
//! Only regular files are read (a FIFO would block the run forever, a
//! device could be endless), through the same bounded reader as every
//! other input ([`super::input`]).

use super::input::{self, InputError};
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Component, Path, PathBuf};

/// Why a named file was not read. The display names the file as the test
/// wrote it and the rule it broke, never its content.
#[derive(Debug, thiserror::Error)]
pub enum ConfinedError {
    /// An absolute path.
    #[error("{name}: an absolute path; a test reads only files under its own directory, named relative to it")]
    Absolute {
        /// The name as written.
        name: String,
    },
    /// A `..` component, or nothing at all.
    #[error(
        "{name}: {why}; a test reads only files under its own directory, named relative to it"
    )]
    NotBeneath {
        /// The name as written.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Resolving it (a symbolic link) leaves the directory.
    #[error("{name}: resolves outside the test's directory (a symbolic link leading out of it, or a /proc magic link); a test reads only files under its own directory")]
    Outside {
        /// The name as written.
        name: String,
    },
    /// Not a regular file (a directory, FIFO, socket or device).
    #[error("{name}: not a regular file")]
    NotRegular {
        /// The name as written.
        name: String,
    },
    /// Opening or reading failed.
    #[error(transparent)]
    Input(#[from] InputError),
}

/// A directory whose files can be read, and no file outside it.
#[derive(Debug)]
pub struct Confined {
    /// The directory as given (how files are shown).
    dir: PathBuf,
    /// The directory, open.
    fd: OwnedFd,
}

impl Confined {
    /// Opens `dir`. The directory itself is the caller's choice (the
    /// directory of a test file a person named or found in a walk).
    pub fn open(dir: &Path) -> Result<Self, InputError> {
        let how = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(dir, how, Mode::empty()).map_err(|e| InputError::Io {
            name: input::input_name(dir),
            error: e.into(),
        })?;
        Ok(Confined {
            dir: dir.to_path_buf(),
            fd,
        })
    }

    /// How `name` is shown: the directory joined with it.
    pub fn display(&self, name: &Path) -> String {
        self.dir.join(name).display().to_string()
    }

    /// Reads `name`, relative to the directory, as bounded UTF-8 text; see
    /// the module docs for what is refused.
    pub fn read_text(&self, name: &Path) -> Result<String, ConfinedError> {
        let shown = self.display(name);
        lexically_beneath(name, &shown)?;
        let file = match self.open_beneath(name, &shown) {
            Err(Fallback) => self.open_resolved(name, &shown)?,
            Ok(file) => file?,
        };
        let meta = file.metadata().map_err(|error| InputError::Io {
            name: shown.clone(),
            error,
        })?;
        if !meta.is_file() {
            return Err(ConfinedError::NotRegular { name: shown });
        }
        Ok(input::read_text_from(&shown, file)?)
    }

    /// `openat2` beneath the directory; `Err(Fallback)` when this kernel
    /// (or a seccomp filter) does not offer it.
    fn open_beneath(
        &self,
        name: &Path,
        shown: &str,
    ) -> Result<Result<File, ConfinedError>, Fallback> {
        // O_NONBLOCK: opening a FIFO must not wait for a writer; it is
        // refused as not a regular file right after.
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        match openat2(&self.fd, name, how) {
            Ok(fd) => Ok(Ok(File::from(fd))),
            Err(Errno::ENOSYS | Errno::EPERM | Errno::E2BIG) => Err(Fallback),
            // EXDEV: a component resolved outside; ELOOP: a magic link (or
            // a link chain too long to be anything but a trap).
            Err(Errno::EXDEV | Errno::ELOOP) => Ok(Err(ConfinedError::Outside {
                name: shown.to_string(),
            })),
            Err(e) => Ok(Err(InputError::Io {
                name: shown.to_string(),
                error: e.into(),
            }
            .into())),
        }
    }

    /// The fallback: resolve, compare, open the resolved path.
    fn open_resolved(&self, name: &Path, shown: &str) -> Result<File, ConfinedError> {
        let io = |error| InputError::Io {
            name: shown.to_string(),
            error,
        };
        let root = std::fs::canonicalize(&self.dir).map_err(io)?;
        let target = std::fs::canonicalize(self.dir.join(name)).map_err(io)?;
        if !target.starts_with(&root) {
            return Err(ConfinedError::Outside {
                name: shown.to_string(),
            });
        }
        Ok(std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(fallback_flags())
            .open(&target)
            .map_err(io)?)
    }
}

/// `openat2` is not available: resolve in user space instead.
struct Fallback;

/// `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY` for the fallback's open of an
/// already resolved path.
fn fallback_flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits()
}

/// Refuses, before any system call, a name that is absolute, empty or
/// climbs with `..` (even `a/../b`, which stays inside: a test has no
/// reason to write it, and refusing it keeps the rule one sentence).
fn lexically_beneath(name: &Path, shown: &str) -> Result<(), ConfinedError> {
    let mut normal = false;
    for c in name.components() {
        match c {
            Component::Normal(_) => normal = true,
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(ConfinedError::NotBeneath {
                    name: shown.to_string(),
                    why: "a .. component",
                })
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ConfinedError::Absolute {
                    name: shown.to_string(),
                })
            }
        }
    }
    if normal {
        Ok(())
    } else {
        Err(ConfinedError::NotBeneath {
            name: shown.to_string(),
            why: "names no file",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// `outer/token` (a secret) and `outer/test/` (the test's directory)
    /// holding `ok.txt`, `sub/inner.txt` and links of every kind.
    fn layout() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let outer = tmp.path();
        let dir = outer.join("test");
        let write = |p: &Path, s: &str| std::fs::write(p, s).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(dir.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        write(&outer.join("token"), "ghp_SECRET");
        write(&dir.join("ok.txt"), "ok");
        write(&dir.join("sub/inner.txt"), "inner");
        let link = |target: &str, at: &str| {
            symlink(target, dir.join(at)).unwrap_or_else(|e| panic!("symlink {at}: {e}"))
        };
        link("../token", "up-link");
        link(
            outer.join("token").to_str().unwrap_or_default(),
            "absolute-link",
        );
        link("sub/inner.txt", "inside-link");
        link("sub", "sub-link");
        link("/proc/self/root/etc/hostname", "magic-link");
        nix::unistd::mkfifo(&dir.join("fifo"), Mode::S_IRUSR | Mode::S_IWUSR)
            .unwrap_or_else(|e| panic!("mkfifo: {e}"));
        (tmp, dir)
    }

    fn read(c: &Confined, name: &str) -> Result<String, String> {
        c.read_text(Path::new(name)).map_err(|e| e.to_string())
    }

    #[test]
    fn files_beneath_the_directory_are_read_and_links_inside_it_followed() {
        let (_tmp, dir) = layout();
        let c = Confined::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&c, "ok.txt").as_deref(), Ok("ok"));
        assert_eq!(read(&c, "./sub/inner.txt").as_deref(), Ok("inner"));
        assert_eq!(read(&c, "inside-link").as_deref(), Ok("inner"));
        assert_eq!(read(&c, "sub-link/inner.txt").as_deref(), Ok("inner"));
    }

    #[test]
    fn nothing_outside_the_directory_is_read_and_no_error_shows_it() {
        let (tmp, dir) = layout();
        let c = Confined::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let token = tmp.path().join("token");
        for (name, want) in [
            ("../token", "a .. component"),
            ("sub/../../token", "a .. component"),
            (token.to_str().unwrap_or_default(), "an absolute path"),
            ("up-link", "resolves outside the test's directory"),
            ("absolute-link", "resolves outside the test's directory"),
            ("magic-link", "resolves outside the test's directory"),
            ("", "names no file"),
            (".", "names no file"),
            ("fifo", "not a regular file"),
            ("sub", "not a regular file"),
        ] {
            let err = read(&c, name)
                .err()
                .unwrap_or_else(|| panic!("{name} was read"));
            assert!(err.contains(want), "{name}: {err}");
            assert!(!err.contains("ghp_SECRET"), "{name}: {err}");
        }
    }

    #[test]
    fn the_fallback_gives_the_same_answers() {
        let (_tmp, dir) = layout();
        let c = Confined::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let fallback = |name: &str| {
            c.open_resolved(Path::new(name), name)
                .map(|f| input::read_text_from(name, f).unwrap_or_default())
                .map_err(|e| e.to_string())
        };
        assert_eq!(fallback("ok.txt").as_deref(), Ok("ok"));
        assert_eq!(fallback("inside-link").as_deref(), Ok("inner"));
        for name in ["up-link", "absolute-link"] {
            let err = fallback(name).err().unwrap_or_default();
            assert!(err.contains("resolves outside"), "{name}: {err}");
        }
    }
}
