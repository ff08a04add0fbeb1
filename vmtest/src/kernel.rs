//! Kernel series, and resolving one to an extracted `vmlinuz` in the cache.
//!
//! A series names a Debian kernel line, not an exact version: ABIs move with
//! every stable update, so the newest `linux-image-<series>.*-cloud-amd64`
//! in the series' suite is chosen at resolution time. The cloud flavour is
//! used because it is the smallest Debian kernel that still has BTF, BPF-LSM
//! and the 8250 serial driver built in.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::apt::{self, combined, PackageInfo, PrivateApt, LISTS_MAX_AGE};
use crate::cache::Cache;
use crate::debversion;
use crate::error::{describe_status, tail, Error, Result};

/// A Debian kernel line the matrix tests against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum KernelSeries {
    /// Linux 5.10 (Debian 11 bullseye).
    #[serde(rename = "5.10")]
    V5_10,
    /// Linux 6.1 (Debian 12 bookworm).
    #[serde(rename = "6.1")]
    V6_1,
    /// Linux 6.12 (Debian 13 trixie).
    #[serde(rename = "6.12")]
    V6_12,
    /// The newest Linux 7.x (Debian sid).
    #[serde(rename = "7.x")]
    V7,
}

impl KernelSeries {
    /// Every series, oldest first.
    pub const ALL: [KernelSeries; 4] = [
        KernelSeries::V5_10,
        KernelSeries::V6_1,
        KernelSeries::V6_12,
        KernelSeries::V7,
    ];

    /// The series' name as written on the command line (`5.10` … `7.x`).
    pub fn name(self) -> &'static str {
        match self {
            KernelSeries::V5_10 => "5.10",
            KernelSeries::V6_1 => "6.1",
            KernelSeries::V6_12 => "6.12",
            KernelSeries::V7 => "7.x",
        }
    }

    /// The Debian suite whose main archive carries the series.
    pub fn suite(self) -> &'static str {
        match self {
            KernelSeries::V5_10 => "bullseye",
            KernelSeries::V6_1 => "bookworm",
            KernelSeries::V6_12 => "trixie",
            KernelSeries::V7 => "sid",
        }
    }

    /// The version prefix that follows `linux-image-` (`6.1.` so that `6.12`
    /// does not match `6.1`).
    fn version_prefix(self) -> &'static str {
        match self {
            KernelSeries::V5_10 => "5.10.",
            KernelSeries::V6_1 => "6.1.",
            KernelSeries::V6_12 => "6.12.",
            KernelSeries::V7 => "7.",
        }
    }

    /// The apt-cache (POSIX extended) regex for the series' image packages.
    pub fn package_regex(self) -> String {
        format!(
            "^linux-image-{}.*-cloud-amd64$",
            self.version_prefix().replace('.', "\\.")
        )
    }

    /// Whether `name` is one of the series' signed image packages (not the
    /// `-dbg` or `-unsigned` variants, not the unversioned metapackage).
    pub fn matches_image_package(self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("linux-image-") else {
            return false;
        };
        let Some(abi) = rest.strip_suffix("-cloud-amd64") else {
            return false;
        };
        abi.strip_prefix(self.version_prefix()).is_some_and(|tail| {
            tail.starts_with(|c: char| c.is_ascii_digit())
                && tail
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".+~-".contains(c))
        })
    }
}

impl fmt::Display for KernelSeries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KernelSeries {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "5.10" => Ok(KernelSeries::V5_10),
            "6.1" => Ok(KernelSeries::V6_1),
            "6.12" => Ok(KernelSeries::V6_12),
            "7.x" | "7" => Ok(KernelSeries::V7),
            other => Err(Error::UnknownSeries(other.to_owned())),
        }
    }
}

/// Parses a comma-separated list of series (`5.10,6.1`).
pub fn parse_series_list(s: &str) -> Result<Vec<KernelSeries>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// A resolved, downloaded and extracted kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kernel {
    /// The series it was resolved from.
    pub series: KernelSeries,
    /// The kernel release (`uname -r`), e.g. `6.1.0-37-cloud-amd64`.
    pub version: String,
    /// The image package resolved for the series.
    pub package: String,
    /// That package's Debian version, e.g. `6.1.140-1`.
    pub package_version: String,
    /// The extracted kernel image in the cache.
    pub vmlinuz: PathBuf,
}

/// Resolves `series` to the newest matching kernel, downloading and
/// extracting it on first use.
///
/// Network is touched only when the suite's lists are missing or older than
/// [`LISTS_MAX_AGE`], when the lists name no matching package, or when a
/// download from stale lists fails. If a refresh fails but a kernel of the
/// series is already extracted, that kernel is used (with a warning), so an
/// offline machine with a warm cache keeps working.
pub fn resolve_kernel(series: KernelSeries, cache: &Cache) -> Result<Kernel> {
    let mirror = match cache.mirror_override() {
        Some(m) => m.to_owned(),
        None => apt::system_mirror()?,
    };
    let apt_dir = cache.apt_dir(series.suite());
    std::fs::create_dir_all(&apt_dir).map_err(|e| Error::io("creating apt dir", &apt_dir, e))?;
    // Serialise processes sharing the cache: apt's own lock would make a
    // second concurrent update fail instead of wait.
    let _lock = lock(&apt_dir.join("lock"))?;
    let apt = PrivateApt::new(series, apt_dir, &mirror)?;

    let mut refreshed = false;
    if !apt.lists_fresh(LISTS_MAX_AGE) {
        tracing::info!(suite = apt.suite(), "refreshing private apt lists");
        match apt.update() {
            Ok(()) => refreshed = true,
            Err(e) => {
                if let Some(k) = newest_cached(cache, series)? {
                    tracing::warn!(error = %e, kernel = %k.version, "apt update failed; using cached kernel");
                    return Ok(k);
                }
                if !apt.has_lists() {
                    return Err(e);
                }
                tracing::warn!(error = %e, "apt update failed; trying the stale lists");
            }
        }
    }

    let pick = match select_package(&apt, series) {
        Ok(p) => p,
        Err(_) if !refreshed => {
            apt.update()?;
            refreshed = true;
            select_package(&apt, series)?
        }
        Err(e) => return Err(e),
    };
    if let Some(k) = cached(cache, &pick)? {
        return Ok(k);
    }
    match fetch(&apt, cache, series, &pick) {
        Err(Error::Download { .. }) if !refreshed => {
            // The pool file may have been superseded since the lists were
            // fetched; refresh and resolve again once.
            apt.update()?;
            let pick = select_package(&apt, series)?;
            match cached(cache, &pick)? {
                Some(k) => Ok(k),
                None => fetch(&apt, cache, series, &pick),
            }
        }
        other => other,
    }
}

/// Takes an exclusive `flock` on `path` (created if missing) until the guard drops.
pub(crate) fn lock(path: &Path) -> Result<Flock<File>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io("opening lock file", path, e))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| Error::io("locking", path, errno.into()))
}

/// The newest of the series' image packages in the lists.
fn select_package(apt: &PrivateApt, series: KernelSeries) -> Result<PackageInfo> {
    let names: Vec<String> = apt
        .search(&series.package_regex())?
        .into_iter()
        .filter(|n| series.matches_image_package(n))
        .collect();
    let infos = if names.is_empty() {
        Vec::new()
    } else {
        apt.show(&names)?
    };
    newest_image(series, &infos).ok_or_else(|| Error::NoKernelPackage {
        series,
        suite: apt.suite().to_owned(),
        pattern: series.package_regex(),
    })
}

/// Picks the newest of the series' image packages by Debian version order
/// (then by name, so the choice is deterministic).
pub fn newest_image(series: KernelSeries, packages: &[PackageInfo]) -> Option<PackageInfo> {
    packages
        .iter()
        .filter(|p| series.matches_image_package(&p.name))
        .max_by(|a, b| {
            debversion::compare(&a.version, &b.version).then_with(|| a.name.cmp(&b.name))
        })
        .cloned()
}

/// The dependencies worth searching for a vmlinuz when the image package is
/// a metapackage: those carrying the same ABI string, kernel binaries first
/// (sid's `linux-binary-*`), the large modules package last.
pub fn vmlinuz_candidates(image: &PackageInfo) -> Vec<String> {
    let abi = image
        .name
        .strip_prefix("linux-image-")
        .unwrap_or(&image.name);
    let rank = |n: &str| {
        if n.starts_with("linux-binary-") {
            0
        } else if n.starts_with("linux-image-") {
            1
        } else if n.starts_with("linux-modules-") {
            3
        } else {
            2
        }
    };
    let mut deps: Vec<String> = image
        .depends
        .iter()
        .filter(|d| d.contains(abi) && **d != image.name)
        .cloned()
        .collect();
    deps.sort_by_key(|d| rank(d));
    deps
}

fn kernel_json(dir: &Path) -> PathBuf {
    dir.join("kernel.json")
}

/// Every kernel extracted in the cache.
pub fn cached_kernels(cache: &Cache) -> Result<Vec<Kernel>> {
    let dir = cache.kernels_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("listing kernels", &dir, e)),
    };
    let mut kernels = Vec::new();
    for entry in entries.flatten() {
        let meta = kernel_json(&entry.path());
        let Ok(text) = std::fs::read_to_string(&meta) else {
            continue; // a half-extracted or foreign directory
        };
        let kernel: Kernel = serde_json::from_str(&text).map_err(|e| Error::metadata(&meta, e))?;
        if kernel.vmlinuz.is_file() {
            kernels.push(kernel);
        }
    }
    Ok(kernels)
}

fn cached(cache: &Cache, pick: &PackageInfo) -> Result<Option<Kernel>> {
    Ok(cached_kernels(cache)?
        .into_iter()
        .find(|k| k.package == pick.name && k.package_version == pick.version))
}

fn newest_cached(cache: &Cache, series: KernelSeries) -> Result<Option<Kernel>> {
    Ok(cached_kernels(cache)?
        .into_iter()
        .filter(|k| k.series == series)
        .max_by(|a, b| debversion::compare(&a.package_version, &b.package_version)))
}

/// Downloads the image package (and, for a metapackage, the dependency that
/// ships the kernel) and extracts its vmlinuz into the cache.
fn fetch(
    apt: &PrivateApt,
    cache: &Cache,
    series: KernelSeries,
    image: &PackageInfo,
) -> Result<Kernel> {
    let kernels = cache.kernels_dir();
    std::fs::create_dir_all(&kernels)
        .map_err(|e| Error::io("creating kernels dir", &kernels, e))?;
    let mut tried = Vec::new();
    let mut queue = vec![image.clone()];
    let candidates = vmlinuz_candidates(image);
    if !candidates.is_empty() {
        queue.extend(apt.show(&candidates)?);
    }
    for pkg in queue {
        tracing::info!(package = %pkg.name, version = %pkg.version, "downloading");
        let deb = apt.download(&pkg.name, &pkg.version, &cache.debs_dir())?;
        tried.push(pkg.name.clone());
        let scratch = tempfile::Builder::new()
            .prefix(".extract-")
            .tempdir_in(&kernels)
            .map_err(|e| Error::io("creating extraction dir", &kernels, e))?;
        extract_deb(&deb, scratch.path())?;
        let Some((version, found)) = find_vmlinuz(scratch.path()) else {
            continue;
        };
        let dest = kernels.join(&version);
        let kernel = Kernel {
            series,
            version,
            package: image.name.clone(),
            package_version: image.version.clone(),
            vmlinuz: dest.join("vmlinuz"),
        };
        install_kernel(&found, &dest, &kernel, scratch.path())?;
        return Ok(kernel);
    }
    Err(Error::NoVmlinuz {
        series,
        package: image.name.clone(),
        tried,
    })
}

/// `dpkg-deb -x DEB DEST`: unpacks a package's files.
pub(crate) fn extract_deb(deb: &Path, dest: &Path) -> Result<()> {
    let out = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(dest)
        .output()
        .map_err(|e| Error::Tool {
            tool: "dpkg-deb -x".to_owned(),
            status: format!("could not start: {e}"),
            output_tail: String::new(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Tool {
            tool: format!("dpkg-deb -x {}", deb.display()),
            status: describe_status(&out.status),
            output_tail: tail(&combined(&out), 10),
        })
    }
}

/// Finds the kernel image in an extracted package: `boot/vmlinuz-VERSION`
/// (classic image packages) or `{usr/,}lib/modules/VERSION/vmlinuz` (sid's
/// `linux-binary-*`). Returns the version and the file.
pub fn find_vmlinuz(root: &Path) -> Option<(String, PathBuf)> {
    let read = |dir: PathBuf| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    for p in read(root.join("boot")) {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some(version) = name.strip_prefix("vmlinuz-") {
            if p.is_file() && !version.is_empty() {
                return Some((version.to_owned(), p.clone()));
            }
        }
    }
    for modules in ["usr/lib/modules", "lib/modules"] {
        for dir in read(root.join(modules)) {
            let image = dir.join("vmlinuz");
            if image.is_file() {
                let version = dir.file_name()?.to_str()?.to_owned();
                return Some((version, image));
            }
        }
    }
    None
}

/// Moves the image into `dest` with its metadata, atomically: the directory
/// appears complete or not at all.
fn install_kernel(image: &Path, dest: &Path, kernel: &Kernel, scratch: &Path) -> Result<()> {
    let staged = scratch.join(".kernel");
    std::fs::create_dir(&staged).map_err(|e| Error::io("creating kernel dir", &staged, e))?;
    let staged_image = staged.join("vmlinuz");
    std::fs::rename(image, &staged_image)
        .map_err(|e| Error::io("moving vmlinuz", &staged_image, e))?;
    let meta = kernel_json(&staged);
    let json = serde_json::to_string_pretty(kernel).map_err(|e| Error::metadata(&meta, e))?;
    std::fs::write(&meta, json).map_err(|e| Error::io("writing kernel metadata", &meta, e))?;
    if dest.exists() {
        // Same version extracted before under another package revision:
        // replace it, the newer metadata wins. The old one is moved into
        // this extraction's own scratch directory and goes with it: no
        // recursive removal of a path outside it.
        let replaced = scratch.join(".replaced");
        std::fs::rename(dest, &replaced).map_err(|e| Error::io("replacing kernel dir", dest, e))?;
    }
    std::fs::rename(&staged, dest).map_err(|e| Error::io("installing kernel", dest, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apt::parse_show;

    /// Recorded from `apt-cache search --names-only` and `apt-cache show` on
    /// the real suites (descriptions and most fields trimmed).
    const SEARCH_6_1: &str = "\
linux-image-6.1.0-47-cloud-amd64-dbg - Debug symbols for linux-image-6.1.0-47-cloud-amd64
linux-image-6.1.0-47-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-50-cloud-amd64-dbg - Debug symbols for linux-image-6.1.0-50-cloud-amd64
linux-image-6.1.0-50-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-47-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.1.0-50-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.12.95+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud (signed)
linux-image-cloud-amd64 - Linux for x86-64 cloud (meta-package)
";

    const SHOW_6_1: &str = "\
Package: linux-image-6.1.0-47-cloud-amd64
Version: 6.1.170-1
Depends: kmod, linux-base (>= 4.3~)

Package: linux-image-6.1.0-50-cloud-amd64
Version: 6.1.176-1
Depends: kmod, linux-base (>= 4.3~)
";

    const SHOW_7: &str = "\
Package: linux-image-7.1.9+deb14-cloud-amd64
Version: 7.1.9-2

Package: linux-image-7.2.13+deb14-cloud-amd64
Version: 7.2.13-1
Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), linux-binary-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), linux-modules-7.2.13+deb14-cloud-amd64 (= 7.2.13-1)
";

    #[test]
    fn parse_series() {
        assert_eq!("6.12".parse::<KernelSeries>().unwrap(), KernelSeries::V6_12);
        assert_eq!("7.x".parse::<KernelSeries>().unwrap(), KernelSeries::V7);
        assert!(
            matches!("4.19".parse::<KernelSeries>(), Err(Error::UnknownSeries(s)) if s == "4.19")
        );
        assert_eq!(
            parse_series_list("5.10,6.1,6.12,7.x").unwrap(),
            KernelSeries::ALL.to_vec()
        );
        for s in KernelSeries::ALL {
            assert_eq!(s.name().parse::<KernelSeries>().unwrap(), s);
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.name())
            );
        }
    }

    #[test]
    fn package_name_matching() {
        let names = apt::parse_search(SEARCH_6_1);
        let picked: Vec<&String> = names
            .iter()
            .filter(|n| KernelSeries::V6_1.matches_image_package(n))
            .collect();
        assert_eq!(
            picked,
            [
                "linux-image-6.1.0-47-cloud-amd64",
                "linux-image-6.1.0-50-cloud-amd64"
            ]
        );
        assert!(KernelSeries::V6_12.matches_image_package("linux-image-6.12.117+deb13-cloud-amd64"));
        assert!(!KernelSeries::V6_12.matches_image_package("linux-image-6.1.0-50-cloud-amd64"));
        assert!(KernelSeries::V7.matches_image_package("linux-image-7.2.13+deb14-cloud-amd64"));
        assert!(!KernelSeries::V7.matches_image_package("linux-image-7.2.13+deb14-cloud-amd64-dbg"));
        assert!(!KernelSeries::V7.matches_image_package("linux-binary-7.2.13+deb14-cloud-amd64"));
        assert_eq!(
            KernelSeries::V6_1.package_regex(),
            "^linux-image-6\\.1\\..*-cloud-amd64$"
        );
    }

    #[test]
    fn newest_by_debian_version() {
        let pick = newest_image(KernelSeries::V6_1, &parse_show(SHOW_6_1)).unwrap();
        assert_eq!(pick.name, "linux-image-6.1.0-50-cloud-amd64");
        assert_eq!(pick.version, "6.1.176-1");
        let pick = newest_image(KernelSeries::V7, &parse_show(SHOW_7)).unwrap();
        assert_eq!(pick.name, "linux-image-7.2.13+deb14-cloud-amd64");
        assert!(newest_image(KernelSeries::V5_10, &parse_show(SHOW_6_1)).is_none());
    }

    #[test]
    fn metapackage_dependencies() {
        let pick = newest_image(KernelSeries::V7, &parse_show(SHOW_7)).unwrap();
        assert_eq!(
            vmlinuz_candidates(&pick),
            vec![
                "linux-binary-7.2.13+deb14-cloud-amd64",
                "linux-base-7.2.13+deb14-cloud-amd64",
                "linux-modules-7.2.13+deb14-cloud-amd64"
            ]
        );
        let classic = newest_image(KernelSeries::V6_1, &parse_show(SHOW_6_1)).unwrap();
        assert!(vmlinuz_candidates(&classic).is_empty());
    }

    #[test]
    fn vmlinuz_layouts() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_vmlinuz(dir.path()).is_none());
        let boot = dir.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        std::fs::write(boot.join("config-6.1.0-50-cloud-amd64"), "").unwrap();
        std::fs::write(boot.join("vmlinuz-6.1.0-50-cloud-amd64"), "k").unwrap();
        let (v, p) = find_vmlinuz(dir.path()).unwrap();
        assert_eq!(v, "6.1.0-50-cloud-amd64");
        assert_eq!(p, boot.join("vmlinuz-6.1.0-50-cloud-amd64"));

        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("usr/lib/modules/7.2.13+deb14-cloud-amd64");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("vmlinuz"), "k").unwrap();
        let (v, p) = find_vmlinuz(dir.path()).unwrap();
        assert_eq!(v, "7.2.13+deb14-cloud-amd64");
        assert_eq!(p, m.join("vmlinuz"));
    }

    #[test]
    fn cached_kernels_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        assert!(cached_kernels(&cache).unwrap().is_empty());
        let scratch = tempfile::tempdir().unwrap();
        let img = scratch.path().join("vmlinuz-x");
        std::fs::write(&img, "k").unwrap();
        std::fs::create_dir_all(cache.kernels_dir()).unwrap();
        let dest = cache.kernels_dir().join("6.1.0-50-cloud-amd64");
        let k = Kernel {
            series: KernelSeries::V6_1,
            version: "6.1.0-50-cloud-amd64".into(),
            package: "linux-image-6.1.0-50-cloud-amd64".into(),
            package_version: "6.1.176-1".into(),
            vmlinuz: dest.join("vmlinuz"),
        };
        install_kernel(&img, &dest, &k, scratch.path()).unwrap();
        assert_eq!(cached_kernels(&cache).unwrap(), vec![k.clone()]);
        assert_eq!(
            newest_cached(&cache, KernelSeries::V6_1).unwrap(),
            Some(k.clone())
        );
        assert_eq!(newest_cached(&cache, KernelSeries::V7).unwrap(), None);
        // The same version extracted again replaces the first (moved into
        // the second extraction's scratch directory).
        let scratch2 = tempfile::tempdir().unwrap();
        let img2 = scratch2.path().join("vmlinuz-y");
        std::fs::write(&img2, "k2").unwrap();
        install_kernel(&img2, &dest, &k, scratch2.path()).unwrap();
        assert_eq!(std::fs::read_to_string(dest.join("vmlinuz")).unwrap(), "k2");
        assert!(scratch2.path().join(".replaced/vmlinuz").exists());
    }
}
