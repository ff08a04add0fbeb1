//! Where downloaded kernels and private apt state live.
//!
//! Everything is kept outside the work tree so that `git clean` never throws
//! away a 30 MB download and so that several checkouts share one cache:
//!
//! ```text
//! <root>/                         $KRT_CACHE_DIR, else $XDG_CACHE_HOME/kyverno-runtime,
//!                                 else $HOME/.cache/kyverno-runtime; then vmtest/
//!   apt/<suite>/sources.list      the private one-suite list
//!   apt/<suite>/lists/            Dir::State::Lists (Packages indexes)
//!   apt/<suite>/cache/            Dir::Cache (pkgcache.bin)
//!   apt/<suite>/updated           stamp: mtime = last successful apt-get update
//!   apt/<suite>/lock              flock held while a process uses this suite
//!   debs/<pkg>_<ver>_amd64.deb    downloaded packages (kept: modules may be wanted later)
//!   kernels/<version>/vmlinuz     the extracted kernel
//!   kernels/<version>/kernel.json the resolved [`Kernel`](crate::Kernel)
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A handle on the vmtest cache directory and the mirror to download from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    root: PathBuf,
    mirror: Option<String>,
}

impl Cache {
    /// A cache rooted exactly at `root` (no `vmtest/` appended). The mirror is
    /// read from the machine's apt configuration when first needed.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Cache {
            root: root.into(),
            mirror: None,
        }
    }

    /// The cache chosen by the environment: `$KRT_CACHE_DIR/vmtest`, else
    /// `$XDG_CACHE_HOME/kyverno-runtime/vmtest`, else
    /// `$HOME/.cache/kyverno-runtime/vmtest`. `VMTEST_MIRROR`, when set,
    /// overrides the mirror found in the apt configuration.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`Cache::from_env`] with an injectable variable source, so the
    /// precedence rules are testable without touching the process environment.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let base = if let Some(dir) = set("KRT_CACHE_DIR") {
            dir
        } else if let Some(dir) = set("XDG_CACHE_HOME") {
            dir.join("kyverno-runtime")
        } else if let Some(home) = set("HOME") {
            home.join(".cache").join("kyverno-runtime")
        } else {
            return Err(Error::NoCacheDir);
        };
        let mirror = var("VMTEST_MIRROR")
            .and_then(|m| m.into_string().ok())
            .filter(|m| !m.is_empty());
        Ok(Cache {
            root: base.join("vmtest"),
            mirror,
        })
    }

    /// Uses `uri` as the Debian mirror instead of the machine's apt configuration.
    pub fn with_mirror(mut self, uri: impl Into<String>) -> Self {
        self.mirror = Some(uri.into());
        self
    }

    /// The cache root (the `vmtest/` directory).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The explicitly configured mirror, if any.
    pub fn mirror_override(&self) -> Option<&str> {
        self.mirror.as_deref()
    }

    /// Private apt state for one suite.
    pub fn apt_dir(&self, suite: &str) -> PathBuf {
        self.root.join("apt").join(suite)
    }

    /// Where downloaded `.deb` files are kept.
    pub fn debs_dir(&self) -> PathBuf {
        self.root.join("debs")
    }

    /// Where extracted kernels are kept, one directory per kernel version.
    pub fn kernels_dir(&self) -> PathBuf {
        self.root.join("kernels")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn krt_cache_dir_wins() {
        let c = Cache::from_vars(vars(&[
            ("KRT_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]))
        .unwrap();
        assert_eq!(c.root(), Path::new("/c/vmtest"));
    }

    #[test]
    fn xdg_then_home() {
        let c = Cache::from_vars(vars(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])).unwrap();
        assert_eq!(c.root(), Path::new("/x/kyverno-runtime/vmtest"));
        let c = Cache::from_vars(vars(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])).unwrap();
        assert_eq!(c.root(), Path::new("/h/.cache/kyverno-runtime/vmtest"));
        assert!(matches!(
            Cache::from_vars(vars(&[])),
            Err(Error::NoCacheDir)
        ));
    }

    #[test]
    fn mirror_override_from_env() {
        let c = Cache::from_vars(vars(&[
            ("HOME", "/h"),
            ("VMTEST_MIRROR", "http://mirror.invalid/debian"),
        ]))
        .unwrap();
        assert_eq!(c.mirror_override(), Some("http://mirror.invalid/debian"));
        assert_eq!(
            c.apt_dir("sid"),
            Path::new("/h/.cache/kyverno-runtime/vmtest/apt/sid")
        );
    }
}
