//! `kyverno-runtime cleanup` against real bpffs, tmpfs and ext4 (#24 §1;
//! root). Run with `cargo test -p kyverno-runtime --features host-tests
//! --test cleanup_host`.
//!
//! A bug here must not be able to damage the machine, so:
//! - the whole program runs in a private mount namespace of its own
//!   (`unshare(CLONE_NEWNS)` and `/` made `MS_REC | MS_PRIVATE` before
//!   anything else), and every directory it hands to `cleanup` is a
//!   scratch directory, on a tmpfs or bpffs mounted over a scratch
//!   directory, or on ext4 in a fresh temporary directory;
//! - every run that must be refused runs under a seccomp filter that
//!   kills the process at the first `unlink`, `unlinkat`, `rmdir`,
//!   `rename`, `renameat` or `renameat2`: "refused with exit status 2" then
//!   also proves "no syscall that unlinks" (a control run shows the filter
//!   kills a cleanup that removes);
//! - the `/`-like inputs (`/`, `/proc/1/root`, `/proc/1/root/sys/fs/bpf`,
//!   a symlink to a bpffs root, ...) are given only inside a sandbox: a new
//!   PID namespace whose PID 1 pivots its mount namespace's root into a
//!   scratch tmpfs (the host's `/usr` and `/etc` bound read-only), so `/`
//!   and `/proc/1/root` there are the scratch tmpfs, not the host.
//!
//! The program is its own main (a single thread, which `unshare` needs);
//! the same binary re-executed with `--seccomp-exec`, `--pid-ns` or
//! `--pid1` plays the filtered launcher and the sandbox's two steps.

// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use kyverno_runtime_bpf::egress::{EgressFilter, FilterFlags};
use kyverno_runtime_bpf::pins::{self, testing, Kind, PinError, Refusal};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

const SECCOMP_EXEC: &str = "--seccomp-exec";
const PID_NS: &str = "--pid-ns";
const PID1: &str = "--pid1";

/// The cleanup binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_kyverno-runtime");

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(SECCOMP_EXEC) => seccomp_exec(&args[2..]),
        Some(PID_NS) => pid_ns(&args[2..]),
        Some(PID1) => pid1(&args[2..]),
        // cargo test's own flags (--nocapture, ...) are ignored.
        _ => run_all(),
    }
}

type Case = (&'static str, fn(&Env) -> Result<(), String>);

/// The scratch directories of a run.
struct Env {
    /// A tmpfs mounted over a fresh temporary directory: everything but
    /// the ext4 case lives below it.
    scratch: PathBuf,
    /// A fresh temporary directory on the root filesystem (ext4 here).
    ext4: PathBuf,
}

fn run_all() -> ExitCode {
    if !nix::unistd::geteuid().is_root() {
        println!("cleanup_host: needs root (mounts, bpffs, BPF maps)");
        println!("0 passed, 1 failed");
        return ExitCode::FAILURE;
    }
    // Before anything is mounted: every mount below is private to this
    // process and its children, and goes with them.
    unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("making / private");
    // Removed non-recursively at the end (a recursive removal could walk
    // into a mount).
    let base = tempfile::Builder::new()
        .prefix("krt-cleanup-host.")
        .tempdir()
        .unwrap()
        .keep();
    let scratch = base.join("tmpfs");
    fs::create_dir(&scratch).unwrap();
    mount_fs("tmpfs", &scratch);
    let env = Env {
        scratch,
        ext4: tempfile::Builder::new()
            .prefix("krt-cleanup-host-ext4.")
            .tempdir()
            .unwrap()
            .keep(),
    };

    let cases: &[Case] = &[
        (
            "a tmpfs directory holding a file is refused, the file intact",
            tmpfs_dir_is_refused,
        ),
        (
            "an ext4 directory holding a file is refused, the file intact",
            ext4_dir_is_refused,
        ),
        (
            "a bpffs directory without the marker is refused, its pins intact",
            unmarked_is_refused,
        ),
        (
            "a forged marker is refused, the pins intact",
            forged_marker_is_refused,
        ),
        (
            "a bpffs root is refused even when it carries a marker",
            bpffs_root_is_refused,
        ),
        (
            "a symlink to a bpffs root or to a pin directory is refused",
            symlinks_are_refused,
        ),
        (
            "the seccomp filter kills a cleanup that unlinks (the control)",
            seccomp_control,
        ),
        (
            "our pins go, foreign pins stay and are named",
            foreign_pins_stay,
        ),
        (
            "a directory holding only our pins goes whole, the links detach",
            ours_go_whole,
        ),
        (
            "the daemon's claim refuses what it cannot mark, creating nothing",
            claim_refuses,
        ),
    ];
    let mut passed = 0;
    let mut failed = 0;
    for (name, case) in cases {
        let started = Instant::now();
        match case(&env) {
            Ok(()) => {
                passed += 1;
                println!("ok   {name} ({:.1}s)", started.elapsed().as_secs_f64());
            }
            Err(why) => {
                failed += 1;
                println!("FAIL {name}: {why}");
            }
        }
    }
    let (p, f) = sandbox(&env);
    passed += p;
    failed += f;
    // Every scratch mount goes with the tmpfs (and would with this mount
    // namespace anyway); then the empty directories, one by one.
    let _ = umount2(&env.scratch, MntFlags::MNT_DETACH);
    let _ = fs::remove_dir(&env.scratch);
    let _ = fs::remove_dir(&base);
    let _ = fs::remove_file(env.ext4.join("file"));
    let _ = fs::remove_dir(env.ext4.join("sub"));
    let _ = fs::remove_dir(&env.ext4);
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ---- helpers ----------------------------------------------------------------

fn mount_fs(fs_type: &str, at: &Path) {
    mount(
        Some(fs_type),
        at,
        Some(fs_type),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("mounting {fs_type} at {}: {e}", at.display()));
}

/// A new directory `name` of the scratch tmpfs with a fresh bpffs on it.
fn bpffs(env: &Env, name: &str) -> PathBuf {
    let dir = env.scratch.join(name);
    fs::create_dir(&dir).unwrap();
    mount_fs("bpf", &dir);
    dir
}

/// How a cleanup run ended.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `kyverno-runtime cleanup` (with `--pin-dir` when given), under
/// the seccomp filter when `filtered`.
fn cleanup(bin: &str, pin_dir: Option<&Path>, filtered: bool) -> Ran {
    // In the sandbox this binary is bound at /krt-test (its own path is
    // in the old root).
    let me = if Path::new("/krt-test").is_file() {
        PathBuf::from("/krt-test")
    } else {
        std::env::current_exe().unwrap()
    };
    let mut cmd = if filtered {
        let mut c = Command::new(me);
        c.arg(SECCOMP_EXEC).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.arg("cleanup");
    if let Some(dir) = pin_dir {
        cmd.arg("--pin-dir").arg(dir);
    }
    // stdin a pipe closed at once, not /dev/null: the sandbox has no /dev.
    let out = cmd
        .env_remove("KRT_PIN_DIR")
        .stdin(Stdio::piped())
        .output()
        .unwrap();
    Ran {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A refusal: exit status 2, one line on stderr naming the directory and
/// `why`, nothing on stdout, and (under the filter) no unlinking syscall.
fn refused(ran: &Ran, dir: &Path, why: &str) -> Result<(), String> {
    let line = format!("error: refusing {}: ", dir.display());
    let ok = ran.code == Some(2)
        && ran.stdout.is_empty()
        && ran.stderr.lines().count() == 1
        && ran.stderr.starts_with(&line)
        && ran.stderr.contains(why)
        && ran.stderr.trim_end().ends_with("nothing was removed");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{}: want exit 2 and one line '{line}...{why}...nothing was removed', got {ran:?}",
            dir.display()
        ))
    }
}

/// Everything under `dir`, without following symlinks: path -> what it
/// is (a file's content, a symlink's target, a pin's object id).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_dir() {
                walk(&path, out);
                "dir".to_owned()
            } else if meta.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&path).unwrap().display())
            } else {
                match fs::read(&path) {
                    Ok(bytes) => format!("file {:?}", String::from_utf8_lossy(&bytes)),
                    // A pin cannot be read: its inode says which it is.
                    Err(_) => format!("pin ino {}", meta.ino()),
                }
            };
            out.insert(path, what);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

fn unchanged(before: &BTreeMap<PathBuf, String>, dir: &Path) -> Result<(), String> {
    let after = snapshot(dir);
    if &after == before {
        Ok(())
    } else {
        Err(format!(
            "{} changed: {before:?} -> {after:?}",
            dir.display()
        ))
    }
}

/// The names directly in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// [`names`] of a bpffs root, without the iterators the kernel preloads
/// into every bpffs (`maps.debug`, `progs.debug`).
fn bpffs_names(root: &Path) -> Vec<String> {
    let mut out = names(root);
    out.retain(|n| n != "maps.debug" && n != "progs.debug");
    out
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A cgroup of this test under the cgroup v2 mount, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(tag: &str) -> Self {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = kyverno_runtime_compat::parse_mountinfo(&mountinfo)
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")
            .map(|m| m.mount_point)
            .expect("no cgroup2 mount");
        let dir = root.join(format!("krt-cleanup-host-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap();
        Cgroup(dir)
    }

    fn id(&self) -> u64 {
        fs::metadata(&self.0).unwrap().ino()
    }

    /// The BPF links attached to it.
    fn links(&self) -> usize {
        let id = self.id();
        libbpf_rs::query::LinkInfoIter::default()
            .filter(|l| {
                matches!(&l.info, libbpf_rs::query::LinkTypeInfo::Cgroup(c) if c.cgroup_id == id)
            })
            .count()
    }

    /// Waits (up to 5 s: a freed link goes after an RCU grace period)
    /// until no link is attached to it.
    fn detached(&self) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if self.links() == 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

/// Pins under `pin` what the daemon pins: the marker, the real egress
/// backend (its 15 maps, a filter link and a snooper link on `cg`), and
/// the open/exec maps (stand-ins made from the layout: the backend cannot
/// load on a kernel without BPF-LSM or fmod_ret). Returns how many pins.
fn daemon_pins(pin: &Path, cg: &Cgroup) -> Result<usize, String> {
    pins::claim(pin, &pins::DAEMON).map_err(err)?;
    let filter = EgressFilter::load_pinned(&pin.join(pins::EGRESS_DIR)).map_err(err)?;
    // The handles are dropped at once: only the pins hold the links.
    filter
        .attach_cgroup(&cg.0, 1, FilterFlags::default())
        .map_err(err)?;
    filter.attach_snoop(&cg.0).map_err(err)?;
    drop(filter);
    let oe = pin.join(pins::OPENEXEC_DIR);
    pins::claim(&oe, &pins::OPENEXEC).map_err(err)?;
    let maps = testing::pin_stand_in_maps(&oe, &pins::OPENEXEC)?;
    if cg.links() != 2 {
        return Err(format!("{} links attached, want 2", cg.links()));
    }
    // The root's, egress's and openexec's markers; egress's maps and two
    // links; the stand-ins.
    Ok(3 + pins::EGRESS_MAPS.len() + 2 + maps)
}

// ---- cases in the private mount namespace ---------------------------------

fn tmpfs_dir_is_refused(env: &Env) -> Result<(), String> {
    let dir = env.scratch.join("plain");
    fs::create_dir(&dir).map_err(err)?;
    fs::write(dir.join("file"), "precious").map_err(err)?;
    let before = snapshot(&dir);
    refused(
        &cleanup(BIN, Some(&dir), true),
        &dir,
        "not on a bpffs (filesystem magic 0x1021994)",
    )?;
    unchanged(&before, &dir)
}

fn ext4_dir_is_refused(env: &Env) -> Result<(), String> {
    let dir = env.ext4.as_path();
    fs::write(dir.join("file"), "precious").map_err(err)?;
    fs::create_dir(dir.join("sub")).map_err(err)?;
    let before = snapshot(dir);
    refused(
        &cleanup(BIN, Some(dir), true),
        dir,
        "not on a bpffs (filesystem magic 0xef53)",
    )?;
    unchanged(&before, dir)
}

fn unmarked_is_refused(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "unmarked");
    // Laid out exactly as ours, but never claimed: no marker.
    let dir = root.join("kyverno-runtime");
    fs::create_dir_all(dir.join("openexec")).map_err(err)?;
    testing::pin_stand_in_maps(&dir.join("openexec"), &pins::OPENEXEC)?;
    testing::pin_map(&dir.join("cilium_calls"), "cilium_calls")?;
    let before = snapshot(&root);
    refused(
        &cleanup(BIN, Some(&dir), true),
        &dir,
        "no krt_pin_layout marker",
    )?;
    unchanged(&before, &root)
}

fn forged_marker_is_refused(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "forged");
    let dir = root.join("kyverno-runtime");
    fs::create_dir(&dir).map_err(err)?;
    testing::pin_forged_marker(&dir)?;
    testing::pin_map(&dir.join("cilium_calls"), "cilium_calls")?;
    let other = root.join("other");
    fs::create_dir(&other).map_err(err)?;
    // A map where the marker should be, of another shape.
    testing::pin_map(&other.join(pins::MARKER), pins::MARKER)?;
    let before = snapshot(&root);
    refused(
        &cleanup(BIN, Some(&dir), true),
        &dir,
        "its krt_pin_layout is not a kyverno-runtime marker: its value does not start with",
    )?;
    refused(
        &cleanup(BIN, Some(&other), true),
        &other,
        "its krt_pin_layout is not a kyverno-runtime marker: a map",
    )?;
    unchanged(&before, &root)
}

fn bpffs_root_is_refused(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "root");
    // A marker at the root itself: only the mount-root check stands
    // between it and a removal.
    testing::write_marker_unchecked(&root, Kind::Daemon)?;
    testing::pin_map(&root.join("cilium_calls"), "cilium_calls")?;
    let ours = root.join("kyverno-runtime");
    pins::claim(&ours, &pins::DAEMON).map_err(err)?;
    let before = snapshot(&root);
    refused(
        &cleanup(BIN, Some(&root), true),
        &root,
        "it is the root of a mount",
    )?;
    let dotdot = ours.join("..");
    refused(
        &cleanup(BIN, Some(&dotdot), true),
        &dotdot,
        "it is the root of a mount",
    )?;
    unchanged(&before, &root)
}

fn symlinks_are_refused(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "linked");
    testing::write_marker_unchecked(&root, Kind::Daemon)?;
    let ours = root.join("kyverno-runtime");
    pins::claim(&ours, &pins::DAEMON).map_err(err)?;
    let to_root = env.scratch.join("link-to-bpffs-root");
    let to_ours = env.scratch.join("link-to-pin-dir");
    symlink(&root, &to_root).map_err(err)?;
    symlink(&ours, &to_ours).map_err(err)?;
    // A symlink inside the bpffs, to its own root.
    symlink("..", ours.join("up")).map_err(err)?;
    let before = snapshot(&root);
    refused(
        &cleanup(BIN, Some(&to_root), true),
        &to_root,
        "it is a symbolic link",
    )?;
    refused(
        &cleanup(BIN, Some(&to_ours), true),
        &to_ours,
        "it is a symbolic link",
    )?;
    // A trailing slash makes the kernel follow the link: then the mount
    // root check refuses.
    let slash = PathBuf::from(format!("{}/", to_root.display()));
    refused(
        &cleanup(BIN, Some(&slash), true),
        &slash,
        "it is the root of a mount",
    )?;
    let up = ours.join("up");
    refused(&cleanup(BIN, Some(&up), true), &up, "it is a symbolic link")?;
    unchanged(&before, &root)
}

fn seccomp_control(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "control");
    let pin = root.join("kyverno-runtime");
    pins::claim(&pin, &pins::DAEMON).map_err(err)?;
    let ran = cleanup(BIN, Some(&pin), true);
    if ran.signal == Some(libc::SIGSYS) {
        Ok(())
    } else {
        Err(format!("not killed by SIGSYS: {ran:?}"))
    }
}

fn foreign_pins_stay(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "foreign");
    let pin = root.join("kyverno-runtime");
    let cg = Cgroup::new("foreign");
    let ours = daemon_pins(&pin, &cg)?;
    // Another tool's entries, among ours.
    testing::pin_map(&pin.join("other_tool_map"), "other_tool_map")?;
    fs::create_dir(pin.join("other_dir")).map_err(err)?;
    testing::pin_map(&pin.join("other_dir").join("x"), "x")?;
    testing::pin_map(&pin.join("egress/maps/cilium_calls"), "cilium_calls")?;
    // A map where the layout has a link: not ours either.
    testing::pin_map(&pin.join("openexec/link_lsm_file_open"), "impostor")?;
    let ran = cleanup(BIN, Some(&pin), false);
    let p = pin.display();
    let want_lines = [
        format!("kept {p}/egress/maps/cilium_calls: not part of kyverno-runtime's pin layout"),
        format!("kept {p}/egress/maps: the directory still holds entries that are not ours"),
        format!("kept {p}/egress: the directory still holds entries that are not ours"),
        format!("kept {p}/openexec/link_lsm_file_open: the layout has a link of this name, but this is a map"),
        format!("kept {p}/openexec: the directory still holds entries that are not ours"),
        format!("kept {p}/other_dir: not part of kyverno-runtime's pin layout"),
        format!("kept {p}/other_tool_map: not part of kyverno-runtime's pin layout"),
        format!("kept {p}: the directory still holds entries that are not ours"),
    ];
    // Removed: every pin of ours; directories: links and snoop_links.
    let summary = format!(
        "removed {ours} pins and 2 directories under {p}; kept 8 entries that are not ours"
    );
    let mut problems = Vec::new();
    if ran.code != Some(0) {
        problems.push(format!("exit {:?}, want 0", ran.code));
    }
    if !ran.stdout.starts_with(&summary) {
        problems.push(format!("no summary '{summary}'"));
    }
    for line in &want_lines {
        if !ran.stdout.lines().any(|l| l == line) {
            problems.push(format!("no line '{line}'"));
        }
    }
    if ran.stdout.lines().count() != want_lines.len() + 1 {
        problems.push("other lines too".to_owned());
    }
    let left = snapshot(&pin);
    let left: Vec<String> = left
        .keys()
        .map(|k| k.strip_prefix(&pin).unwrap().display().to_string())
        .collect();
    let want_left = [
        "egress",
        "egress/maps",
        "egress/maps/cilium_calls",
        "openexec",
        "openexec/link_lsm_file_open",
        "other_dir",
        "other_dir/x",
        "other_tool_map",
    ];
    if left != want_left {
        problems.push(format!("left {left:?}, want {want_left:?}"));
    }
    if !cg.detached() {
        problems.push(format!("{} links still attached", cg.links()));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n      {ran:?}", problems.join("; ")))
    }
}

fn ours_go_whole(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "whole");
    testing::pin_map(&root.join("sibling"), "sibling")?;
    let pin = root.join("kyverno-runtime");
    let cg = Cgroup::new("whole");
    let ours = daemon_pins(&pin, &cg)?;
    let ran = cleanup(BIN, Some(&pin), false);
    let want = format!(
        "removed {ours} pins and 6 directories under {} (programs detach once no process holds them)\n",
        pin.display()
    );
    if ran.code != Some(0) || ran.stdout != want || !ran.stderr.is_empty() {
        return Err(format!("want exit 0 and '{want}', got {ran:?}"));
    }
    if bpffs_names(&root) != ["sibling"] {
        return Err(format!("left {:?} in the bpffs", names(&root)));
    }
    if !cg.detached() {
        return Err(format!("{} links still attached", cg.links()));
    }
    // Again: the directory is gone, nothing to do.
    let again = cleanup(BIN, Some(&pin), false);
    if again.code != Some(0) || !again.stdout.contains("does not exist: nothing to remove") {
        return Err(format!("second run: {again:?}"));
    }
    Ok(())
}

fn claim_refuses(env: &Env) -> Result<(), String> {
    let root = bpffs(env, "claim");
    let refusal = |dir: &Path, kind| match pins::claim(dir, kind) {
        Err(PinError::Refused { reason, .. }) => Ok(reason),
        other => Err(format!("claim {}: {other:?}", dir.display())),
    };
    let on_tmpfs = env.scratch.join("claimed/kyverno-runtime");
    if !matches!(refusal(&on_tmpfs, &pins::DAEMON)?, Refusal::NotBpffs { .. }) {
        return Err("tmpfs not refused as such".into());
    }
    if env.scratch.join("claimed").exists() {
        return Err("the refused claim created a directory".into());
    }
    if refusal(&root, &pins::DAEMON)? != Refusal::MountRoot {
        return Err("the bpffs root not refused as a mount root".into());
    }
    let foreign = root.join("cilium");
    fs::create_dir(&foreign).map_err(err)?;
    testing::pin_map(&foreign.join("cilium_calls"), "cilium_calls")?;
    let reason = refusal(&foreign, &pins::DAEMON)?;
    if reason != Refusal::ForeignEntries(vec!["cilium_calls".into()]) {
        return Err(format!("a foreign directory: {reason:?}"));
    }
    if names(&foreign) != ["cilium_calls"] {
        return Err(format!("a marker was written: {:?}", names(&foreign)));
    }
    let ours = root.join("kyverno-runtime");
    pins::claim(&ours, &pins::DAEMON).map_err(err)?;
    pins::claim(&ours, &pins::DAEMON).map_err(err)?;
    let reason = refusal(&ours, &pins::EGRESS)?;
    if reason
        != (Refusal::WrongKind {
            found: Kind::Daemon,
            want: Kind::Egress,
        })
    {
        return Err(format!("another kind: {reason:?}"));
    }
    Ok(())
}

// ---- the seccomp-filtered launcher ------------------------------------------

/// Installs a filter that kills the process at any syscall that unlinks
/// or renames, then executes `args` (the filter stays across exec).
fn seccomp_exec(args: &[String]) -> ExitCode {
    use seccompiler::{apply_filter, BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    let mut calls = vec![libc::SYS_unlinkat, libc::SYS_renameat2];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_unlink,
        libc::SYS_rmdir,
        libc::SYS_rename,
        libc::SYS_renameat,
    ]);
    #[cfg(target_arch = "aarch64")]
    calls.push(libc::SYS_renameat);
    let arch: TargetArch = std::env::consts::ARCH.try_into().unwrap();
    let filter = SeccompFilter::new(
        calls.into_iter().map(|n| (n, vec![])).collect(),
        SeccompAction::Allow,
        SeccompAction::KillProcess,
        arch,
    )
    .unwrap();
    let program: BpfProgram = filter.try_into().unwrap();
    apply_filter(&program).unwrap();
    let e = Command::new(&args[0]).args(&args[1..]).exec();
    eprintln!("exec {}: {e}", args[0]);
    ExitCode::from(127)
}

// ---- the pivoted sandbox ------------------------------------------------------

/// Runs the `/`-like cases in the sandbox and checks that its root (a
/// scratch tmpfs of this namespace, seen from here) is intact after.
/// Returns (passed, failed).
fn sandbox(env: &Env) -> (usize, usize) {
    const NAME: &str = "the pivoted sandbox";
    let newroot = env.scratch.join("newroot");
    fs::create_dir(&newroot).unwrap();
    mount_fs("tmpfs", &newroot);
    fs::write(newroot.join("victim"), "precious").unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .arg(PID_NS)
        .arg(&newroot)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    let passed = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    let mut failed = stdout.lines().filter(|l| l.starts_with("FAIL ")).count();
    if !out.status.success() && failed == 0 {
        println!("FAIL {NAME}: ended with {}", out.status);
        failed += 1;
    }
    if passed == 0 && failed == 0 {
        println!("FAIL {NAME}: ran no case");
        failed += 1;
    }
    match fs::read_to_string(newroot.join("victim")) {
        Ok(s) if s == "precious" => (passed, failed),
        other => {
            println!("FAIL {NAME}: its /victim is {other:?}");
            (passed, failed + 1)
        }
    }
}

/// Step 1: a new PID namespace, whose first child is its PID 1.
fn pid_ns(args: &[String]) -> ExitCode {
    unshare(CloneFlags::CLONE_NEWPID).expect("unshare(CLONE_NEWPID)");
    let status = Command::new(std::env::current_exe().unwrap())
        .arg(PID1)
        .args(args)
        .status()
        .unwrap();
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        _ => {
            println!("FAIL the sandbox's PID 1: {status}");
            ExitCode::FAILURE
        }
    }
}

/// Step 2, as PID 1 of the new PID namespace: a mount namespace of its
/// own whose root is pivoted into `args[0]` (a scratch tmpfs), a fresh
/// /proc (so /proc/1/root is this scratch root) and a bpffs at
/// /sys/fs/bpf; then the `/`-like inputs.
fn pid1(args: &[String]) -> ExitCode {
    let newroot = PathBuf::from(&args[0]);
    let me = std::env::current_exe().unwrap();
    unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    // The binaries' libraries, read-only; the two binaries themselves.
    for dir in ["usr", "etc"] {
        let at = newroot.join(dir);
        fs::create_dir(&at).unwrap();
        bind_read_only(Path::new("/").join(dir).as_path(), &at);
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        if Path::new("/").join(link).is_symlink() {
            symlink(target, newroot.join(link)).unwrap();
        }
    }
    for (file, from) in [("krt-bin", Path::new(BIN)), ("krt-test", me.as_path())] {
        fs::write(newroot.join(file), "").unwrap();
        bind_read_only(from, &newroot.join(file));
    }
    fs::create_dir(newroot.join("old")).unwrap();
    nix::unistd::pivot_root(&newroot, &newroot.join("old")).expect("pivot_root");
    nix::unistd::chdir("/").unwrap();
    umount2("/old", MntFlags::MNT_DETACH).unwrap();
    fs::remove_dir("/old").unwrap();
    fs::create_dir("/proc").unwrap();
    mount_fs("proc", Path::new("/proc"));
    fs::create_dir_all("/sys/fs/bpf").unwrap();
    mount_fs("bpf", Path::new("/sys/fs/bpf"));

    let mut failed = 0;
    let mut report = |name: &str, result: Result<(), String>| match result {
        Ok(()) => println!("ok   sandbox: {name}"),
        Err(why) => {
            failed += 1;
            println!("FAIL sandbox: {name}: {why}");
        }
    };
    report("set up (pid 1, / a scratch tmpfs)", sandbox_setup());
    let before_root = (names(Path::new("/")), fs::read_to_string("/victim").ok());
    let before_bpf = snapshot(Path::new("/sys/fs/bpf"));
    let inputs: &[(&str, &str)] = &[
        ("/", "not on a bpffs"),
        ("/proc/1/root", "it is a symbolic link"),
        ("/proc/1/root/", "not on a bpffs"),
        ("/proc/self/root", "it is a symbolic link"),
        ("/proc/1/root/sys/fs/bpf", "it is the root of a mount"),
        ("/sys/fs/bpf", "it is the root of a mount"),
        ("/sys/fs/bpf/", "it is the root of a mount"),
        (
            "/sys/fs/bpf/kyverno-runtime/..",
            "it is the root of a mount",
        ),
        (
            "/proc/1/root/sys/fs/bpf/kyverno-runtime/..",
            "it is the root of a mount",
        ),
        ("/bpf-link", "it is a symbolic link"),
        ("/bpf-link/", "it is the root of a mount"),
        ("/proc/1/root/victim", "not a directory"),
        ("/proc", "not on a bpffs"),
    ];
    for (input, why) in inputs {
        let dir = Path::new(input);
        report(
            &format!("{input} is refused ({why})"),
            refused(&cleanup("/krt-bin", Some(dir), true), dir, why),
        );
    }
    let after_root = (names(Path::new("/")), fs::read_to_string("/victim").ok());
    report(
        "/ and /victim are intact",
        if after_root == before_root {
            Ok(())
        } else {
            Err(format!("{before_root:?} -> {after_root:?}"))
        },
    );
    let bpf_kept = snapshot(Path::new("/sys/fs/bpf"));
    report(
        "the bpffs root is intact",
        if bpf_kept == before_bpf {
            Ok(())
        } else {
            Err(format!("{before_bpf:?} -> {bpf_kept:?}"))
        },
    );
    // The default --pin-dir, through this namespace's /proc/1/root.
    let ran = cleanup("/krt-bin", None, false);
    let want = format!(
        "removed {} pins and 2 directories under {}",
        2 + pins::OPENEXEC_MAPS.len(),
        pins::DEFAULT_PIN_DIR
    );
    report(
        "cleanup with no --pin-dir removes the default directory through /proc/1/root",
        if ran.code == Some(0)
            && ran.stdout.starts_with(&want)
            && bpffs_names(Path::new("/sys/fs/bpf")) == ["bpf-sibling", pins::MARKER]
        {
            Ok(())
        } else {
            Err(format!(
                "want '{want}', got {ran:?}; left {:?}",
                names(Path::new("/sys/fs/bpf"))
            ))
        },
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The sandbox's contents: a marker at the bpffs root (so the mount-root
/// check alone refuses it), a foreign pin beside ours, our daemon's
/// directory with the open/exec maps, and a symlink to the bpffs root.
fn sandbox_setup() -> Result<(), String> {
    if std::process::id() != 1 {
        return Err(format!("pid {}, not 1", std::process::id()));
    }
    let root = Path::new("/sys/fs/bpf");
    testing::write_marker_unchecked(root, Kind::Daemon)?;
    testing::pin_map(&root.join("bpf-sibling"), "bpf_sibling")?;
    let ours = root.join("kyverno-runtime");
    pins::claim(&ours, &pins::DAEMON).map_err(err)?;
    let oe = ours.join(pins::OPENEXEC_DIR);
    pins::claim(&oe, &pins::OPENEXEC).map_err(err)?;
    testing::pin_stand_in_maps(&oe, &pins::OPENEXEC)?;
    symlink(root, "/bpf-link").map_err(err)?;
    if fs::read_to_string("/proc/1/root/victim").map_err(err)? != "precious" {
        return Err("/proc/1/root is not the scratch root".into());
    }
    Ok(())
}

fn bind_read_only(from: &Path, to: &Path) {
    mount(
        Some(from),
        to,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("binding {}: {e}", from.display()));
    mount(
        None::<&str>,
        to,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("read-only {}: {e}", to.display()));
}
