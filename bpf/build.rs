//! Compiles every `bpf/<backend>/*.bpf.c` into a CO-RE object and generates
//! its libbpf-rs skeleton into `OUT_DIR` (never committed).
//!
//! Skeletons land at `$OUT_DIR/<backend>/<name>.skel.rs` next to their
//! objects (`<name>.bpf.o`); `src/skel.rs` includes them. When clang is missing or `KRT_BPF_STUB=1` is set, nothing
//! is compiled and the crate is built with `--cfg krt_bpf_stub` instead, so
//! `cargo check` and clippy work on machines without a BPF toolchain
//! (aya gates its BPF build the same way). `CLANG=/path/to/clang` picks
//! another compiler than the `clang` on `PATH`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result};
use libbpf_cargo::SkeletonBuilder;

/// Directories under `bpf/` holding one backend's `*.bpf.c` programs.
/// Every `.bpf.c` file there becomes one object with one skeleton.
const BACKENDS: &[&str] = &[
    "probe",
    "egress",
    "dnssnoop",
    "dns",
    "protocol",
    "openexec",
    "exectrace",
];

/// Shared headers (`vmlinux.h`, `common.h`, ...).
const INCLUDE_DIR: &str = "include";

fn main() -> Result<()> {
    println!("cargo::rustc-check-cfg=cfg(krt_bpf_stub)");
    println!("cargo:rerun-if-env-changed=KRT_BPF_STUB");
    println!("cargo:rerun-if-env-changed=CLANG");
    // A PATH change may bring clang in (or take it away). Installing clang
    // into an unchanged PATH is not noticed: `cargo clean -p
    // kyverno-runtime-bpf` then turns a stub build into a real one.
    println!("cargo:rerun-if-env-changed=PATH");

    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").context("OUT_DIR")?);
    let include_dir = manifest_dir.join(INCLUDE_DIR);

    // Watch the headers and sources (and their directories, for added
    // files) before deciding on a stub, so both kinds of build go stale on
    // the same edits.
    println!("cargo:rerun-if-changed={}", include_dir.display());
    watch_dir(&include_dir, |name| name.ends_with(".h"))?;
    let mut sources = Vec::new();
    for backend in BACKENDS {
        let dir = manifest_dir.join(backend);
        println!("cargo:rerun-if-changed={}", dir.display());
        sources.extend(
            watch_dir(&dir, |name| name.ends_with(".bpf.c"))?
                .into_iter()
                .map(|src| (*backend, src)),
        );
    }

    let clang = env::var_os("CLANG").map_or_else(|| PathBuf::from("clang"), PathBuf::from);
    if env::var("KRT_BPF_STUB").is_ok_and(|v| v == "1") {
        return stub("KRT_BPF_STUB=1 is set");
    }
    if !runs(&clang) {
        return stub(&format!(
            "cannot run `{} --version` (clang not installed or not on PATH)",
            clang.display()
        ));
    }

    let Some(arch) = target_arch_define()? else {
        return stub("vmlinux.h is generated for x86_64 only");
    };
    for (backend, src) in &sources {
        let stem = obj_stem(src)?;
        let skel_dir = out_dir.join(backend);
        fs::create_dir_all(&skel_dir)
            .with_context(|| format!("creating {}", skel_dir.display()))?;
        let skel = skel_dir.join(format!("{stem}.skel.rs"));
        SkeletonBuilder::new()
            .source(src)
            // Keep the object next to its skeleton: the skeleton embeds it
            // by path (`reference_obj`) instead of as a huge byte-array
            // literal, and code that needs the raw object (maps probe)
            // includes it from the same place.
            .obj(skel_dir.join(format!("{stem}.bpf.o")))
            .reference_obj(true)
            .clang(&clang)
            // libbpf-cargo itself adds `-g -O2 -target bpf` and the include
            // directory with libbpf-sys's bundled bpf_*.h headers.
            .clang_args([
                format!("-D{arch}"),
                "-I".to_owned(),
                include_dir.display().to_string(),
                "-Wall".to_owned(),
                "-Werror".to_owned(),
            ])
            .build_and_generate(&skel)
            .with_context(|| format!("building BPF object {}", src.display()))?;
    }
    Ok(())
}

/// Builds the crate without BPF objects: every probe reports the reason.
fn stub(reason: &str) -> Result<()> {
    println!(
        "cargo:warning=kyverno-runtime-bpf: {reason}; building WITHOUT BPF objects \
         (every probe will fail: install clang and rebuild)"
    );
    println!("cargo:rustc-cfg=krt_bpf_stub");
    Ok(())
}

/// Whether `clang --version` runs.
fn runs(clang: &Path) -> bool {
    Command::new(clang)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// `__TARGET_ARCH_<arch>` as bpf_tracing.h expects it (PT_REGS access), or
/// `None` for an architecture we have no `vmlinux.h` for.
fn target_arch_define() -> Result<Option<&'static str>> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    // The committed vmlinux.h is dumped from an x86_64 kernel; adding an
    // architecture means committing its own vmlinux.h and selecting it here.
    Ok((arch == "x86_64").then_some("__TARGET_ARCH_x86"))
}

/// `foo` for `.../foo.bpf.c`: the skeleton's (and object's) name.
fn obj_stem(src: &Path) -> Result<String> {
    src.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".bpf.c"))
        .map(str::to_owned)
        .with_context(|| format!("{} is not a <name>.bpf.c file", src.display()))
}

/// Emits `rerun-if-changed` for every file in `dir` whose name passes
/// `keep`, and returns them sorted (deterministic build order).
fn watch_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(&keep) {
            println!("cargo:rerun-if-changed={}", path.display());
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
