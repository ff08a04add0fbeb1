//! The guest's NIC driver, taken from the kernel's own packages.
//!
//! Stock Debian kernels build `virtio_net` (and, before 6.12, `virtio_pci`
//! and the virtio core) as modules, so a guest that needs the network (a
//! [`HostForward`](crate::HostForward)) must load them from its initramfs.
//! They come from the kernel's own packages, so their vermagic and
//! signatures match: the image package for 5.10 to 6.12; for sid's split
//! 7.x packages `linux-modules-*` and `linux-base-*`, downloaded on first
//! use (see [`module_packages`]). Dependencies are read from each module's
//! own `.modinfo` (the packages ship no `modules.dep`: `depmod` runs at
//! install time) and skipped when the kernel's `modules.builtin` lists them.
//!
//! The result is cached beside the kernel, decompressed once on the host
//! (6.12 and later ship `.ko.xz`), so the guest depends neither on busybox's
//! nor on the kernel's decompression support, and pays no time for it under
//! TCG:
//!
//! ```text
//! kernels/<version>/nic-modules/<name>.ko    one per module
//! kernels/<version>/nic-modules/order        module names, dependencies first
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::apt::{combined, PrivateApt};
use crate::cache::Cache;
use crate::error::{describe_status, tail, Error, Result};
use crate::kernel::{extract_deb, lock, Kernel};

/// The modules a virtio NIC on qemu's q35 needs; their dependencies are read
/// from the modules themselves.
pub const NIC_MODULES: [&str; 2] = ["virtio_pci", "virtio_net"];

/// Directory under the kernel's cache directory holding the NIC modules.
const CACHE_SUBDIR: &str = "nic-modules";
/// File listing the cached modules in load order.
const ORDER_FILE: &str = "order";

/// The NIC modules of `kernel` as decompressed `.ko` files in the cache, in
/// load order (dependencies first); empty if the kernel has them built in.
/// Extracts them from the kernel's package on first use.
pub fn nic_modules(kernel: &Kernel) -> Result<Vec<PathBuf>> {
    cached_modules(kernel, CACHE_SUBDIR, &NIC_MODULES)
}

/// The modules named in `roots` (and their dependencies) of `kernel`, as
/// [`nic_modules`] gives the NIC's: decompressed, in load order, cached
/// beside the kernel per set of names (`modules-<a>+<b>`).
pub fn extra_modules(kernel: &Kernel, roots: &[String]) -> Result<Vec<PathBuf>> {
    if roots.is_empty() {
        return Ok(Vec::new());
    }
    let mut names: Vec<String> = roots.iter().map(|r| normalize(r)).collect();
    if let Some(bad) = names
        .iter()
        .find(|n| n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(Error::KernelModules {
            kernel: kernel.version.clone(),
            message: format!("{bad:?} is not a module name"),
        });
    }
    names.sort();
    names.dedup();
    let subdir = format!("modules-{}", names.join("+"));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    cached_modules(kernel, &subdir, &refs)
}

/// `roots` and their dependencies, extracted once into
/// `kernels/<version>/<subdir>` and read from there afterwards.
fn cached_modules(kernel: &Kernel, subdir: &str, roots: &[&str]) -> Result<Vec<PathBuf>> {
    let kdir = kernel_dir(kernel)?;
    let dest = kdir.join(subdir);
    if let Some(cached) = read_cached(&dest)? {
        return Ok(cached);
    }
    // One extraction at a time per kernel; the others then find the cache.
    let _lock = lock(&kdir.join(format!(".{subdir}.lock")))?;
    if let Some(cached) = read_cached(&dest)? {
        return Ok(cached);
    }
    let scratch = tempfile::Builder::new()
        .prefix(&format!(".{subdir}-"))
        .tempdir_in(&kdir)
        .map_err(|e| Error::io("creating extraction dir", &kdir, e))?;
    let found = extract_modules(kernel, scratch.path())?;
    let staged = scratch.path().join("out");
    std::fs::create_dir(&staged).map_err(|e| Error::io("creating modules dir", &staged, e))?;
    let order = resolve(&found.tree, &found.builtin, roots, &staged).map_err(|message| {
        Error::KernelModules {
            kernel: kernel.version.clone(),
            message,
        }
    })?;
    let order_file = staged.join(ORDER_FILE);
    let text: String = order.iter().map(|m| format!("{m}\n")).collect();
    std::fs::write(&order_file, text).map_err(|e| Error::io("writing", &order_file, e))?;
    // The directory appears complete or not at all; one that lost a file
    // (read_cached refused it) is replaced.
    if dest.exists() {
        // Moved into this extraction's own scratch directory, which goes
        // with it: no recursive removal of a path outside it.
        let replaced = scratch.path().join("replaced");
        std::fs::rename(&dest, &replaced).map_err(|e| Error::io("replacing modules", &dest, e))?;
    }
    std::fs::rename(&staged, &dest).map_err(|e| Error::io("installing modules", &dest, e))?;
    tracing::info!(kernel = %kernel.version, modules = %order.join(","), "extracted kernel modules");
    Ok(order.iter().map(|m| dest.join(format!("{m}.ko"))).collect())
}

/// The kernel's directory in the cache (`kernels/<version>`, holding vmlinuz).
fn kernel_dir(kernel: &Kernel) -> Result<PathBuf> {
    kernel
        .vmlinuz
        .parent()
        .map(Path::to_owned)
        .ok_or_else(|| Error::KernelModules {
            kernel: kernel.version.clone(),
            message: format!("{} has no parent directory", kernel.vmlinuz.display()),
        })
}

/// The cached modules in load order, or `None` when there is no complete
/// cache (no order file, or a listed module is gone).
fn read_cached(dest: &Path) -> Result<Option<Vec<PathBuf>>> {
    let order = dest.join(ORDER_FILE);
    let text = match std::fs::read_to_string(&order) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("reading", order, e)),
    };
    let files: Vec<PathBuf> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|m| dest.join(format!("{}.ko", m.trim())))
        .collect();
    Ok(files.iter().all(|f| f.is_file()).then_some(files))
}

/// The cache a kernel from [`resolve_kernel`](crate::resolve_kernel) lives
/// in: its vmlinuz is `<root>/kernels/<version>/vmlinuz`.
fn cache_of(kernel: &Kernel) -> Result<Cache> {
    let root = kernel
        .vmlinuz
        .parent()
        .and_then(Path::parent)
        .filter(|k| k.file_name().is_some_and(|n| n == "kernels"))
        .and_then(Path::parent)
        .ok_or_else(|| Error::KernelModules {
            kernel: kernel.version.clone(),
            message: format!(
                "{} is not in a vmtest cache (<root>/kernels/<version>/vmlinuz), so its package cannot be found",
                kernel.vmlinuz.display()
            ),
        })?;
    let cache = Cache::new(root);
    Ok(
        match std::env::var("VMTEST_MIRROR")
            .ok()
            .filter(|m| !m.is_empty())
        {
            Some(m) => cache.with_mirror(m),
            None => cache,
        },
    )
}

/// The packages that may ship the kernel's modules and `modules.builtin`,
/// most likely first: the image package itself (5.10 to 6.12), then sid's
/// `linux-modules-<abi>` (the `.ko` files) and `linux-base-<abi>`
/// (`modules.builtin`, `System.map`, the config).
pub fn module_packages(kernel: &Kernel) -> Vec<String> {
    let abi = kernel
        .package
        .strip_prefix("linux-image-")
        .unwrap_or(&kernel.package);
    vec![
        kernel.package.clone(),
        format!("linux-modules-{abi}"),
        format!("linux-base-{abi}"),
    ]
}

fn deb_path(cache: &Cache, name: &str, version: &str) -> PathBuf {
    // The file name `apt-get download` produces (see apt.rs).
    cache
        .debs_dir()
        .join(format!("{name}_{}_amd64.deb", version.replace(':', "%3a")))
}

/// What [`extract_modules`] found: the directory holding `kernel/**.ko*`
/// and the kernel's list of built-in modules.
struct Extracted {
    tree: PathBuf,
    builtin: BTreeSet<String>,
}

/// Extracts the packages holding the kernel's modules and its
/// `modules.builtin` into `scratch`, in [`module_packages`] order, until
/// both are found: the image package has both up to 6.12; sid splits them
/// into `linux-modules-*` and `linux-base-*`.
fn extract_modules(kernel: &Kernel, scratch: &Path) -> Result<Extracted> {
    let cache = cache_of(kernel)?;
    let mut looked_in = Vec::new();
    let mut tree = None;
    let mut builtin = None;
    for (i, name) in module_packages(kernel).iter().enumerate() {
        let deb = deb_path(&cache, name, &kernel.package_version);
        // resolve_kernel keeps the image package, but not sid's separate
        // ones, and a cleaned cache keeps none.
        let deb = if deb.is_file() {
            deb
        } else {
            match download(&cache, kernel, name) {
                Ok(deb) => deb,
                Err(e) => {
                    looked_in.push(format!("{} (missing; download failed: {e})", deb.display()));
                    continue;
                }
            }
        };
        let root = scratch.join(format!("deb{i}"));
        std::fs::create_dir(&root).map_err(|e| Error::io("creating extraction dir", &root, e))?;
        extract_deb(&deb, &root)?;
        let mut found = Vec::new();
        for dir in ["usr/lib/modules", "lib/modules"] {
            let dir = root.join(dir).join(&kernel.version);
            if tree.is_none() && dir.join("kernel").is_dir() {
                tree = Some(dir.clone());
                found.push("modules");
            }
            let list = dir.join("modules.builtin");
            if builtin.is_none() && list.is_file() {
                let text =
                    std::fs::read_to_string(&list).map_err(|e| Error::io("reading", &list, e))?;
                builtin = Some(parse_builtin(&text));
                found.push("modules.builtin");
            }
        }
        looked_in.push(format!(
            "{} ({})",
            deb.display(),
            if found.is_empty() {
                "neither".to_owned()
            } else {
                found.join(", ")
            }
        ));
        if let (Some(tree), Some(builtin)) = (&tree, &builtin) {
            return Ok(Extracted {
                tree: tree.clone(),
                builtin: builtin.clone(),
            });
        }
    }
    Err(Error::KernelModules {
        kernel: kernel.version.clone(),
        message: format!(
            "found no package with its modules and modules.builtin; looked in: {}",
            looked_in.join("; ")
        ),
    })
}

/// Downloads `name` at the kernel's package version through the suite's
/// private apt (sid ships modules apart from the kernel image).
fn download(cache: &Cache, kernel: &Kernel, name: &str) -> Result<PathBuf> {
    let mirror = match cache.mirror_override() {
        Some(m) => m.to_owned(),
        None => crate::apt::system_mirror()?,
    };
    let apt_dir = cache.apt_dir(kernel.series.suite());
    std::fs::create_dir_all(&apt_dir).map_err(|e| Error::io("creating apt dir", &apt_dir, e))?;
    let _lock = lock(&apt_dir.join("lock"))?;
    let apt = PrivateApt::new(kernel.series, apt_dir, &mirror)?;
    tracing::info!(package = %name, version = %kernel.package_version, "downloading kernel modules");
    apt.download(name, &kernel.package_version, &cache.debs_dir())
}

/// A module's name as the kernel spells it: `-` and `_` are the same.
fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

/// The module name of a `.ko`, `.ko.xz`, `.ko.zst` or `.ko.gz` file name.
fn module_name(file: &str) -> Option<String> {
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    Some(normalize(stem))
}

/// Every module file under `dir`, by normalised name.
fn index_modules(dir: &Path, out: &mut BTreeMap<String, PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            index_modules(&path, out);
        } else if let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(module_name)
        {
            out.entry(name).or_insert(path);
        }
    }
}

/// Module names in a `modules.builtin` file (`kernel/drivers/x/y.ko` lines).
pub fn parse_builtin(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim().rsplit('/').next())
        .filter_map(module_name)
        .collect()
}

/// Decompresses (or copies) a module file into `dest`.
fn decompress(src: &Path, dest: &Path) -> Result<()> {
    let name = src.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else if name.ends_with(".gz") {
        "gzip"
    } else {
        std::fs::copy(src, dest).map_err(|e| Error::io("copying module", src, e))?;
        return Ok(());
    };
    let out = std::fs::File::create(dest).map_err(|e| Error::io("creating", dest, e))?;
    let result = Command::new(tool)
        .args(["-d", "-c"])
        .arg(src)
        .stdout(out)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Error::Tool {
            tool: format!("{tool} -dc"),
            status: format!("could not start: {e} (install {tool} to unpack {name})"),
            output_tail: String::new(),
        })?;
    if result.status.success() {
        Ok(())
    } else {
        Err(Error::Tool {
            tool: format!("{tool} -dc {name}"),
            status: describe_status(&result.status),
            output_tail: tail(&combined(&result), 10),
        })
    }
}

/// Resolves `roots` and their dependencies in the modules tree `tree`,
/// decompressing each needed module to `out/<name>.ko`, and returns the
/// names in load order. Modules in `builtin` are skipped; a module that is
/// neither built in nor shipped is an error (the message says which).
fn resolve(
    tree: &Path,
    builtin: &BTreeSet<String>,
    roots: &[&str],
    out: &Path,
) -> std::result::Result<Vec<String>, String> {
    let mut files = BTreeMap::new();
    index_modules(&tree.join("kernel"), &mut files);
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for root in roots {
        visit(
            &normalize(root),
            &files,
            builtin,
            out,
            &mut seen,
            &mut order,
            &mut Vec::new(),
        )?;
    }
    Ok(order)
}

/// Depth-first, dependencies before dependents; `path` detects cycles.
fn visit(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    out: &Path,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
    path: &mut Vec<String>,
) -> std::result::Result<(), String> {
    if seen.contains(name) || builtin.contains(name) {
        return Ok(());
    }
    if path.iter().any(|p| p == name) {
        return Err(format!(
            "module dependency cycle: {} -> {name}",
            path.join(" -> ")
        ));
    }
    let Some(src) = files.get(name) else {
        let via = path
            .last()
            .map(|p| format!(" (needed by {p})"))
            .unwrap_or_default();
        return Err(format!(
            "module {name}{via} is neither built in nor shipped in the package"
        ));
    };
    let dest = out.join(format!("{name}.ko"));
    decompress(src, &dest).map_err(|e| e.to_string())?;
    let image = std::fs::read(&dest).map_err(|e| format!("reading {}: {e}", dest.display()))?;
    let deps = modinfo(&image, "depends")
        .map_err(|e| format!("{}: {e}", src.display()))?
        .unwrap_or_default();
    path.push(name.to_owned());
    for dep in deps.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        visit(&normalize(dep), files, builtin, out, seen, order, path)?;
    }
    path.pop();
    seen.insert(name.to_owned());
    order.push(name.to_owned());
    Ok(())
}

/// The value of `key` in a kernel module's `.modinfo` section (NUL-separated
/// `key=value` strings), read from the ELF64 little-endian image. `None`
/// when the key is absent.
pub fn modinfo(image: &[u8], key: &str) -> std::result::Result<Option<String>, String> {
    let section = elf_section(image, ".modinfo")?.ok_or("no .modinfo section")?;
    let prefix = format!("{key}=");
    Ok(section
        .split(|&b| b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .find_map(|s| s.strip_prefix(&prefix).map(str::to_owned)))
}

/// The contents of the section called `name` in an ELF64 little-endian file.
fn elf_section<'a>(image: &'a [u8], name: &str) -> std::result::Result<Option<&'a [u8]>, String> {
    let bad = |what: &str| format!("not a loadable module: {what}");
    if image.get(..4) != Some(b"\x7fELF") {
        return Err(bad("no ELF magic"));
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian: what x86-64 modules are.
    if image.get(4..6) != Some(&[2, 1]) {
        return Err(bad("not ELF64 little-endian"));
    }
    let u16_at = |off: usize| -> Option<usize> {
        Some(u16::from_le_bytes(image.get(off..off + 2)?.try_into().ok()?) as usize)
    };
    let u32_at = |off: usize| -> Option<usize> {
        Some(u32::from_le_bytes(image.get(off..off + 4)?.try_into().ok()?) as usize)
    };
    let u64_at = |off: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(
            image.get(off..off + 8)?.try_into().ok()?,
        ))
        .ok()
    };
    let header = || -> Option<(usize, usize, usize, usize)> {
        Some((u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?))
    };
    let (shoff, shentsize, shnum, shstrndx) = header().ok_or_else(|| bad("short header"))?;
    if shentsize < 0x40 {
        return Err(bad("section header too small"));
    }
    // (name offset, file offset, size) of section `i`.
    let section = |i: usize| -> Option<(usize, usize, usize)> {
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((u32_at(at)?, u64_at(at + 0x18)?, u64_at(at + 0x20)?))
    };
    let bytes = |off: usize, size: usize| image.get(off..off.checked_add(size)?);
    let (_, stroff, strsize) = section(shstrndx).ok_or_else(|| bad("no section names"))?;
    let names = bytes(stroff, strsize).ok_or_else(|| bad("section names out of range"))?;
    for i in 0..shnum {
        let (name_off, off, size) = section(i).ok_or_else(|| bad("section header out of range"))?;
        let Some(rest) = names.get(name_off..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        if &rest[..end] == name.as_bytes() {
            return bytes(off, size)
                .map(Some)
                .ok_or_else(|| bad("section out of range"));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 little-endian file with a `.modinfo` section.
    fn elf_with_modinfo(modinfo: &[u8]) -> Vec<u8> {
        let shstrtab = b"\0.shstrtab\0.modinfo\0";
        let mut image = vec![0u8; 0x40];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2;
        image[5] = 1;
        let modinfo_off = image.len();
        image.extend_from_slice(modinfo);
        let strtab_off = image.len();
        image.extend_from_slice(shstrtab);
        let shoff = image.len();
        let mut sh = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 0x40];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            image.extend_from_slice(&h);
        };
        sh(0, 0, 0);
        sh(1, strtab_off, shstrtab.len());
        sh(11, modinfo_off, modinfo.len());
        image[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        image[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        image
    }

    #[test]
    fn modinfo_depends() {
        let image =
            elf_with_modinfo(b"license=GPL\0depends=virtio_ring,net-failover\0name=virtio_net\0");
        assert_eq!(
            modinfo(&image, "depends").unwrap().as_deref(),
            Some("virtio_ring,net-failover")
        );
        assert_eq!(
            modinfo(&image, "name").unwrap().as_deref(),
            Some("virtio_net")
        );
        assert_eq!(modinfo(&image, "alias").unwrap(), None);
        let empty = elf_with_modinfo(b"depends=\0");
        assert_eq!(modinfo(&empty, "depends").unwrap().as_deref(), Some(""));
        assert!(modinfo(b"not an elf", "depends").is_err());
        assert!(modinfo(&image[..0x30], "depends").is_err());
    }

    #[test]
    fn names_and_builtin() {
        assert_eq!(
            module_name("virtio_net.ko.xz").as_deref(),
            Some("virtio_net")
        );
        assert_eq!(module_name("virtio-rng.ko").as_deref(), Some("virtio_rng"));
        assert_eq!(module_name("modules.builtin"), None);
        let builtin = parse_builtin(
            "kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_pci.ko\n\n",
        );
        assert!(builtin.contains("virtio_pci") && builtin.contains("virtio"));
        assert_eq!(builtin.len(), 2);
    }

    #[test]
    fn resolution_order_skips_builtins() {
        let tree = tempfile::tempdir().unwrap();
        let k = tree.path().join("kernel/drivers");
        std::fs::create_dir_all(&k).unwrap();
        let module = |file: &str, deps: &str| {
            let info = format!("depends={deps}\0");
            std::fs::write(k.join(file), elf_with_modinfo(info.as_bytes())).unwrap();
        };
        module("virtio_net.ko", "virtio,net_failover");
        module("net_failover.ko", "failover");
        module("failover.ko", "");
        module("virtio_pci.ko", "virtio");
        let builtin = parse_builtin("kernel/drivers/virtio/virtio.ko\n");
        let out = tempfile::tempdir().unwrap();
        let order = resolve(tree.path(), &builtin, &NIC_MODULES, out.path()).unwrap();
        assert_eq!(
            order,
            ["virtio_pci", "failover", "net_failover", "virtio_net"]
        );
        assert!(out.path().join("failover.ko").is_file());

        std::fs::remove_file(k.join("failover.ko")).unwrap();
        let out = tempfile::tempdir().unwrap();
        let err = resolve(tree.path(), &builtin, &["virtio_net"], out.path()).unwrap_err();
        assert!(err.contains("failover (needed by net_failover)"), "{err}");
    }

    #[test]
    fn cache_is_complete_or_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_cached(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(ORDER_FILE), "failover\nvirtio_net\n").unwrap();
        std::fs::write(dir.path().join("failover.ko"), "x").unwrap();
        assert_eq!(
            read_cached(dir.path()).unwrap(),
            None,
            "virtio_net.ko is missing"
        );
        std::fs::write(dir.path().join("virtio_net.ko"), "x").unwrap();
        assert_eq!(
            read_cached(dir.path()).unwrap().unwrap(),
            [
                dir.path().join("failover.ko"),
                dir.path().join("virtio_net.ko")
            ]
        );
    }

    #[test]
    fn packages_searched() {
        let kernel = Kernel {
            series: crate::KernelSeries::V7,
            version: "7.2.13+deb14-cloud-amd64".into(),
            package: "linux-image-7.2.13+deb14-cloud-amd64".into(),
            package_version: "7.2.13-1".into(),
            vmlinuz: PathBuf::from("/c/vmtest/kernels/7.2.13+deb14-cloud-amd64/vmlinuz"),
        };
        assert_eq!(
            module_packages(&kernel),
            [
                "linux-image-7.2.13+deb14-cloud-amd64",
                "linux-modules-7.2.13+deb14-cloud-amd64",
                "linux-base-7.2.13+deb14-cloud-amd64"
            ]
        );
        assert_eq!(cache_of(&kernel).unwrap().root(), Path::new("/c/vmtest"));
        let mut elsewhere = kernel.clone();
        elsewhere.vmlinuz = PathBuf::from("/boot/vmlinuz");
        assert!(matches!(
            cache_of(&elsewhere),
            Err(Error::KernelModules { .. })
        ));
    }
}
