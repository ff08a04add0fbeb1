//! The probes, run against the kernel through the generated skeletons.
//!
//! No `unsafe` here: skeleton storage is a plain `MaybeUninit` the skeleton
//! initializes, counters are read with map lookups (a copy made by the
//! kernel) rather than through the skeleton's mmap'ed `.bss` reference,
//! which the kernel writes concurrently, and record layouts come from the
//! skeletons' `types` via `offset_of!`.

use std::cell::Cell;
use std::fs::File;
use std::mem::{offset_of, size_of, MaybeUninit};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libbpf_rs::skel::{OpenSkel as _, SkelBuilder as _};
use libbpf_rs::{MapCore, MapFlags, ObjectBuilder, ProgramInput, RingBufferBuilder};

use super::errno::ENOTSUPP;
use super::{packet, ProbeError, ProbeMap, ProbeProgram, ProgramProbe, Result, Stage};
use crate::libbpf_log::Capture;
use crate::skel::probe::{cgroup_skb_egress, exec_trace, fmod_ret_file_open, lsm_file_open, maps};

const OPEN_FAILED: &str = "open failed";
const LOAD_REFUSED: &str = "load refused";
const ATTACH_REFUSED: &str = "attach refused";

/// How long the exec probe waits for its child's record.
const EXEC_WAIT: Duration = Duration::from_secs(1);
/// One ring buffer poll, so the wait ends soon after the record arrives.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// Files opened to trigger the `file_open` hooks; the second is for
/// environments without /proc.
const OPEN_TRIGGERS: [&str; 2] = ["/proc/self/stat", "/"];

pub(super) fn probe_program(
    program: ProbeProgram,
    cgroup_dir: Option<&Path>,
) -> Result<ProgramProbe> {
    let capture = Capture::start();
    let result = match program {
        ProbeProgram::LsmFileOpen => lsm_file_open(),
        ProbeProgram::FmodRetFileOpen => fmod_ret_file_open(),
        ProbeProgram::CgroupSkbEgress => cgroup_skb_egress(cgroup_dir),
        ProbeProgram::RawTpSchedProcessExec => exec_trace(),
    };
    // Every object of the probe is dropped (detached, closed) by now.
    result.map_err(|e| e.with_log(capture.log()))
}

pub(super) fn probe_map(map: ProbeMap) -> Result<()> {
    let capture = Capture::start();
    map_probe(map).map_err(|e| e.with_log(capture.log()))
}

fn open_err(e: libbpf_rs::Error) -> ProbeError {
    ProbeError::libbpf(Stage::Open, OPEN_FAILED, &e)
}

fn load_err(e: libbpf_rs::Error) -> ProbeError {
    ProbeError::libbpf(Stage::Load, LOAD_REFUSED, &e)
}

fn attach_err(e: libbpf_rs::Error) -> ProbeError {
    ProbeError::libbpf(Stage::Attach, ATTACH_REFUSED, &e)
}

/// An object without the `.rodata` section it was written with: the build
/// is broken, not the kernel.
fn no_rodata() -> ProbeError {
    ProbeError::new(
        Stage::Open,
        None,
        "open failed: the object has no .rodata to set the target pid in",
    )
}

fn lsm_file_open() -> Result<ProgramProbe> {
    let mut object = MaybeUninit::uninit();
    let mut open = lsm_file_open::LsmFileOpenSkelBuilder::default()
        .open(&mut object)
        .map_err(open_err)?;
    open.maps
        .rodata_data
        .as_mut()
        .ok_or_else(no_rodata)?
        .target_tgid = std::process::id();
    let rodata = open.maps.rodata_data.as_mut().ok_or_else(no_rodata)?;
    (rodata.pidns_dev, rodata.pidns_ino) = own_pid_namespace();
    let skel = open.load().map_err(load_err)?;
    let link = skel
        .progs
        .krt_probe_lsm_file_open
        .attach_lsm()
        .map_err(attach_err)?;
    let ran = file_open_ran(
        &skel.maps.bss,
        offset_of!(lsm_file_open::types::bss, run_count),
    );
    drop(link);
    Ok(ProgramProbe { ran: Some(ran?) })
}

fn fmod_ret_file_open() -> Result<ProgramProbe> {
    let mut object = MaybeUninit::uninit();
    let mut open = fmod_ret_file_open::FmodRetFileOpenSkelBuilder::default()
        .open(&mut object)
        .map_err(open_err)?;
    open.maps
        .rodata_data
        .as_mut()
        .ok_or_else(no_rodata)?
        .target_tgid = std::process::id();
    let rodata = open.maps.rodata_data.as_mut().ok_or_else(no_rodata)?;
    (rodata.pidns_dev, rodata.pidns_ino) = own_pid_namespace();
    let skel = open.load().map_err(load_err)?;
    // fmod_ret attaches through a BPF trampoline, like fentry/fexit.
    let link = skel
        .progs
        .krt_probe_fmod_ret_file_open
        .attach_trace()
        .map_err(attach_err)?;
    let ran = file_open_ran(
        &skel.maps.bss,
        offset_of!(fmod_ret_file_open::types::bss, run_count),
    );
    drop(link);
    Ok(ProgramProbe { ran: Some(ran?) })
}

/// Opens a file from this process and tells whether the attached program
/// counted it (its `run_count` at `offset` in `.bss`).
fn file_open_ran(bss: &dyn MapCore, offset: usize) -> Result<bool> {
    let mut last_err = None;
    let mut opened = false;
    for path in OPEN_TRIGGERS {
        match File::open(path) {
            Ok(_) => opened = true,
            Err(e) => last_err = Some((path, e)),
        }
    }
    if let (false, Some((path, e))) = (opened, last_err) {
        return Err(ProbeError::io(
            Stage::Run,
            &format!("cannot open {path} to trigger the hook"),
            &e,
        ));
    }
    Ok(read_u64(bss, offset, "run counter")? > 0)
}

fn cgroup_skb_egress(cgroup_dir: Option<&Path>) -> Result<ProgramProbe> {
    let mut object = MaybeUninit::uninit();
    let open = cgroup_skb_egress::CgroupSkbEgressSkelBuilder::default()
        .open(&mut object)
        .map_err(open_err)?;
    let skel = open.load().map_err(load_err)?;
    // Loaded first: "fails at Attach" then still proves the program loads.
    let Some(dir) = cgroup_dir else {
        return Err(ProbeError::new(
            Stage::Attach,
            None,
            "attach skipped: no cgroup v2 directory was given",
        ));
    };
    let cgroup = File::open(dir).map_err(|e| {
        ProbeError::io(
            Stage::Attach,
            &format!("cannot open cgroup directory {}", dir.display()),
            &e,
        )
    })?;
    let prog = &skel.progs.krt_probe_cgroup_skb_egress;
    let link = prog.attach_cgroup(cgroup.as_raw_fd()).map_err(attach_err)?;

    let frame = packet::ipv4_udp();
    let input = ProgramInput {
        data_in: Some(&frame),
        ..ProgramInput::default()
    };
    let ran = match prog.test_run(input) {
        Ok(out) => {
            let count = read_u64(
                &skel.maps.bss,
                offset_of!(cgroup_skb_egress::types::bss, packet_count),
                "packet counter",
            )?;
            // 1 is "pass"; the counter proves it was this program's verdict.
            Some(out.return_value == 1 && count > 0)
        }
        Err(e) => {
            let err = ProbeError::libbpf(Stage::Run, "test run failed", &e);
            match err.errno {
                // The kernel has no test run for this program type: attached,
                // but the probe cannot trigger it.
                Some(ENOTSUPP | libc::EOPNOTSUPP) => None,
                _ => return Err(err),
            }
        }
    };
    drop(link);
    Ok(ProgramProbe { ran })
}

fn exec_trace() -> Result<ProgramProbe> {
    let mut object = MaybeUninit::uninit();
    let mut open = exec_trace::ExecTraceSkelBuilder::default()
        .open(&mut object)
        .map_err(open_err)?;
    let rodata = open.maps.rodata_data.as_mut().ok_or_else(no_rodata)?;
    (rodata.pidns_dev, rodata.pidns_ino) = own_pid_namespace();
    let skel = open.load().map_err(load_err)?;
    let link = skel
        .progs
        .krt_probe_exec_trace
        .attach_raw_tracepoint("sched_process_exec")
        .map_err(attach_err)?;

    // Records are kept in the ring until consumed, so the consumer can be
    // set up once the child's pid is known.
    let child = run_short_child()?;
    let seen = Cell::new(false);
    let mut builder = RingBufferBuilder::new();
    builder
        .add(&skel.maps.krt_exec_events, |record: &[u8]| {
            // Every exec on the host lands here; only ours counts.
            if exec_record_pid(record) == Some(child) {
                seen.set(true);
            }
            0
        })
        .map_err(|e| ProbeError::libbpf(Stage::Run, "ring buffer setup failed", &e))?;
    let ring = builder
        .build()
        .map_err(|e| ProbeError::libbpf(Stage::Run, "ring buffer setup failed", &e))?;

    let deadline = Instant::now() + EXEC_WAIT;
    while !seen.get() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if let Err(e) = ring.poll(left.min(POLL_SLICE)) {
            let err = ProbeError::libbpf(Stage::Run, "ring buffer poll failed", &e);
            if err.errno != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }
    drop(ring);
    drop(link);
    Ok(ProgramProbe {
        ran: Some(seen.get()),
    })
}

/// The nsfs device and inode of this process's PID namespace, so that the
/// probe programs number tasks as it does (`krt_probe_tgid` in probe.h);
/// (0, 0), the initial namespace's numbers, when it cannot be read.
fn own_pid_namespace() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// Runs a short child to completion and returns its pid: `/bin/true`, or
/// `/bin/sh -c :`, or, where neither exists (the daemon's image has no
/// other program, issue 25), this executable again with `--version`. That
/// comes last: a program that does not answer `--version` and exit (a test
/// program with its own `main`) would run whole again, probe again, and so
/// on.
fn run_short_child() -> Result<u32> {
    let spawn = |prog: &std::path::Path, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let mut child = spawn(std::path::Path::new("/bin/true"), &[])
        .or_else(|_| spawn(std::path::Path::new("/bin/sh"), &["-c", ":"]))
        .or_else(|_| spawn(std::path::Path::new("/proc/self/exe"), &["--version"]))
        .map_err(|e| {
            ProbeError::io(
                Stage::Run,
                "cannot run /bin/true, /bin/sh or this executable",
                &e,
            )
        })?;
    let pid = child.id();
    // Its exit status does not matter: exec happened or spawn had failed.
    child
        .wait()
        .map_err(|e| ProbeError::io(Stage::Run, "cannot wait for the exec child", &e))?;
    Ok(pid)
}

/// The `pid` of a `struct krt_exec_event` record, if it is long enough.
fn exec_record_pid(record: &[u8]) -> Option<u32> {
    let at = offset_of!(exec_trace::types::krt_exec_event, pid);
    let bytes = record.get(at..at + size_of::<u32>())?;
    bytes.try_into().ok().map(u32::from_ne_bytes)
}

/// The `u64` at byte `offset` of a global-data map (`.bss`): one lookup of
/// its single element.
fn read_u64(map: &dyn MapCore, offset: usize, what: &str) -> Result<u64> {
    let value = map
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .map_err(|e| ProbeError::libbpf(Stage::Run, &format!("reading the {what} failed"), &e))?
        .ok_or_else(|| {
            ProbeError::new(
                Stage::Run,
                None,
                format!("reading the {what} failed: no value"),
            )
        })?;
    u64_at(&value, offset).ok_or_else(|| {
        ProbeError::new(
            Stage::Run,
            None,
            format!("reading the {what} failed: value of {} bytes", value.len()),
        )
    })
}

fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    let b = bytes.get(offset..offset.checked_add(size_of::<u64>())?)?;
    b.try_into().ok().map(u64::from_ne_bytes)
}

/// Map names in `bpf/probe/maps.bpf.c`.
const LPM_TRIE: &str = "krt_probe_lpm";
const INNER_HASH: &str = "krt_probe_inner";
const HASH_OF_MAPS: &str = "krt_probe_outer";
const RING_BUF: &str = "krt_probe_ringbuf";

/// 2001:db8::/64 (documentation prefix) and an address inside it.
const LPM_PREFIX: (u32, [u8; 16]) = (
    64,
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
);
const LPM_HOST: (u32, [u8; 16]) = (
    128,
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
);
const LPM_VALUE: u32 = 7;

fn map_probe(map: ProbeMap) -> Result<()> {
    let wanted: &[&str] = match map {
        ProbeMap::LpmTrie => &[LPM_TRIE],
        ProbeMap::HashOfMaps => &[INNER_HASH, HASH_OF_MAPS],
        ProbeMap::RingBuf => &[RING_BUF],
    };
    // The generic object API, not the skeleton: the skeleton expects every
    // map of the object to have been created.
    let mut open = ObjectBuilder::default()
        .open_memory(maps::OBJECT)
        .map_err(open_err)?;
    for mut m in open.maps_mut() {
        let keep = m.name().to_str().is_some_and(|n| wanted.contains(&n));
        m.set_autocreate(keep).map_err(open_err)?;
    }
    let obj = open.load().map_err(load_err)?;
    let find = |name: &str| {
        obj.maps()
            .find(|m| m.name().to_str() == Some(name))
            .ok_or_else(|| {
                ProbeError::new(
                    Stage::Load,
                    None,
                    format!("load failed: map {name} was not created"),
                )
            })
    };
    let run_err = |what: &str, e: libbpf_rs::Error| ProbeError::libbpf(Stage::Run, what, &e);

    match map {
        ProbeMap::LpmTrie => {
            let lpm = find(LPM_TRIE)?;
            lpm.update(
                &lpm_key(LPM_PREFIX),
                &LPM_VALUE.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| run_err("LPM trie update failed", e))?;
            let found = lpm
                .lookup(&lpm_key(LPM_HOST), MapFlags::ANY)
                .map_err(|e| run_err("LPM trie lookup failed", e))?;
            if found.as_deref() == Some(&LPM_VALUE.to_ne_bytes()[..]) {
                Ok(())
            } else {
                Err(ProbeError::new(
                    Stage::Run,
                    None,
                    format!("LPM trie lookup of 2001:db8::1 returned {found:?}, not the 2001:db8::/64 entry"),
                ))
            }
        }
        ProbeMap::HashOfMaps => {
            let inner = find(INNER_HASH)?;
            let outer = find(HASH_OF_MAPS)?;
            // Userspace inserts a map by its fd (the kernel stores the map).
            let inner_fd = inner.as_fd().as_raw_fd();
            outer
                .update(&1u32.to_ne_bytes(), &inner_fd.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| run_err("inserting the inner map failed", e))?;
            // ...and reads back the inner map's id.
            match outer.lookup(&1u32.to_ne_bytes(), MapFlags::ANY) {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(ProbeError::new(
                    Stage::Run,
                    None,
                    "hash of maps lost the inserted inner map",
                )),
                Err(e) => Err(run_err("hash of maps lookup failed", e)),
            }
        }
        ProbeMap::RingBuf => find(RING_BUF).map(drop),
    }
}

/// A `struct krt_lpm_v6_key` as the kernel reads it.
fn lpm_key((prefixlen, addr): (u32, [u8; 16])) -> Vec<u8> {
    type Key = maps::types::krt_lpm_v6_key;
    let mut key = vec![0u8; size_of::<Key>()];
    let p = offset_of!(Key, prefixlen);
    key[p..p + size_of::<u32>()].copy_from_slice(&prefixlen.to_ne_bytes());
    let a = offset_of!(Key, addr);
    key[a..a + addr.len()].copy_from_slice(&addr);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpm_key_matches_the_c_layout() {
        let key = lpm_key(LPM_PREFIX);
        assert_eq!(key.len(), 20, "u32 prefixlen + 16 address bytes");
        assert_eq!(&key[..4], &64u32.to_ne_bytes());
        assert_eq!(&key[4..8], &[0x20, 0x01, 0x0d, 0xb8]);
    }

    #[test]
    fn exec_record_pid_reads_the_skeleton_layout() {
        let mut record = vec![0u8; size_of::<exec_trace::types::krt_exec_event>()];
        record[..4].copy_from_slice(&4242u32.to_ne_bytes());
        record[4..8].copy_from_slice(b"true");
        assert_eq!(exec_record_pid(&record), Some(4242));
        assert_eq!(exec_record_pid(&record[..3]), None);
    }

    #[test]
    fn u64_at_is_bounds_checked() {
        let v = 99u64.to_ne_bytes();
        assert_eq!(u64_at(&v, 0), Some(99));
        assert_eq!(u64_at(&v, 1), None);
        assert_eq!(u64_at(&v, usize::MAX), None);
    }
}
