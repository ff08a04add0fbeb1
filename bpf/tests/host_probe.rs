//! Privileged probe tests against the host kernel (tier 2: needs root).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests`. The
//! expectations are this build machine's kernel (shared/MACHINE.md): cgroup
//! skb, raw_tp and the three map types work; lsm and fmod_ret programs are
//! refused at load with EPERM. A machine where that differs fails here on
//! purpose: update MACHINE.md and these assertions together.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kyverno_runtime_bpf::{
    probe_map, probe_program, ProbeMap, ProbeProgram, ProgramProbe, Stage, BPF_OBJECTS_BUILT,
};

/// A child cgroup of the cgroup v2 mount, removed on drop.
struct TempCgroup(PathBuf);

impl TempCgroup {
    fn new(tag: &str) -> Self {
        let root =
            cgroup2_mount().unwrap_or_else(|| panic!("no cgroup2 mount in /proc/self/mountinfo"));
        let dir = root.join(format!("krt-bpf-test-{tag}-{}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        // cgroupfs directories are removed with rmdir, never recursively.
        if let Err(e) = fs::remove_dir(&self.0) {
            eprintln!("cannot remove {}: {e}", self.0.display());
        }
    }
}

/// The mount point of the first cgroup2 filesystem (field 5 of a
/// mountinfo line whose filesystem type, after " - ", is cgroup2).
fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

#[test]
fn objects_are_built() {
    // A runtime check, not a const assert: a stub build should fail here
    // with this message, not refuse to compile the tests.
    if !BPF_OBJECTS_BUILT {
        panic!("host tests need the real BPF objects: install clang and rebuild");
    }
}

#[test]
fn cgroup_skb_egress_loads_attaches_and_runs() {
    let cgroup = TempCgroup::new("skb");
    let probe = probe_program(ProbeProgram::CgroupSkbEgress, Some(cgroup.path()));
    assert_eq!(probe, Ok(ProgramProbe { ran: Some(true) }));
}

#[test]
fn cgroup_skb_egress_without_a_cgroup_fails_at_attach() {
    let err = probe_program(ProbeProgram::CgroupSkbEgress, None).unwrap_err();
    assert_eq!(err.stage, Stage::Attach);
    assert_eq!(err.errno, None);
    assert!(err.message.contains("no cgroup v2 directory"), "{err}");
}

#[test]
fn cgroup_skb_egress_on_a_missing_cgroup_fails_at_attach_with_enoent() {
    let err = probe_program(
        ProbeProgram::CgroupSkbEgress,
        Some(Path::new(
            "/sys/fs/cgroup/unified/krt-bpf-test-does-not-exist",
        )),
    )
    .unwrap_err();
    assert_eq!(err.stage, Stage::Attach);
    assert_eq!(err.errno, Some(libc::ENOENT), "{err}");
}

#[test]
fn raw_tp_exec_trace_delivers_the_childs_record() {
    let probe = probe_program(ProbeProgram::RawTpSchedProcessExec, None);
    assert_eq!(probe, Ok(ProgramProbe { ran: Some(true) }));
}

#[test]
fn all_probe_maps_are_created_and_used() {
    for map in ProbeMap::ALL {
        assert_eq!(probe_map(map), Ok(()), "{map}");
    }
}

#[test]
fn lsm_and_fmod_ret_are_refused_at_load_with_eperm() {
    for program in [ProbeProgram::LsmFileOpen, ProbeProgram::FmodRetFileOpen] {
        let err = probe_program(program, None).unwrap_err();
        eprintln!(
            "{program}: {err}\n--- log ---\n{}",
            err.verifier_log.as_deref().unwrap_or("")
        );
        assert_eq!(err.stage, Stage::Load, "{program}: {err}");
        assert_eq!(err.errno, Some(libc::EPERM), "{program}: {err}");
        assert_eq!(err.message, "load refused: EPERM (Operation not permitted)");
        let log = err.verifier_log.expect("libbpf logs why the load failed");
        assert!(
            log.len() <= 4 * 1024 + 256,
            "log is trimmed, got {} bytes",
            log.len()
        );
    }
}

#[test]
fn probes_leave_nothing_loaded() {
    let cgroup = TempCgroup::new("leak");
    for program in ProbeProgram::ALL {
        let _ = probe_program(program, Some(cgroup.path()));
    }
    for map in ProbeMap::ALL {
        let _ = probe_map(map);
    }
    // Other tests of this binary may be mid-probe, and the kernel frees a
    // program shortly after its last fd closes: wait for the count to drop.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<_> = libbpf_rs::query::ProgInfoIter::default()
            .filter(|p| p.name.to_string_lossy().starts_with("krt_probe_"))
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "probe programs still loaded: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
