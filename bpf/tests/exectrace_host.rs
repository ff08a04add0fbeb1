//! The exec tracer on the running kernel (needs root and a cgroup v2
//! mount): a real exec in an admitted cgroup is reported with its argv,
//! and the same exec outside the gate produces no record.
//!
//! The exec'ing process is a shell that first moves itself into the test
//! cgroup and then `exec`s the program, so the traced exec happens inside
//! the cgroup and the shell's own start (outside it) is not in the gate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;

use cgroup::TempCgroup;
use std::process::Command;
use std::time::{Duration, Instant};

use kyverno_runtime_bpf::cgroup_attach::cgroup_id;
use kyverno_runtime_bpf::exectrace::{ExecRecord, ExecTracer, ARGV_SLOTS, ARG_LEN};
use kyverno_runtime_bpf::ring::RecordReader;

/// Runs `/bin/echo args...` from a shell that first joins `cg` (or stays
/// where it is for `None`); returns the echo's pid.
fn exec_echo(cg: Option<&TempCgroup>, args: &[&str]) -> u32 {
    let join = cg.map_or(String::new(), |c| {
        format!("echo $$ > {}/cgroup.procs && ", c.0.display())
    });
    let mut quoted = String::new();
    for a in args {
        quoted.push_str(&format!(" '{a}'"));
    }
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{join}exec /bin/echo{quoted} > /dev/null"))
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    pid
}

/// Records for `cgroup` until `want` arrived or `wait` passed.
fn records(reader: &mut RecordReader<ExecRecord>, want: usize, wait: Duration) -> Vec<ExecRecord> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        got.extend(reader.poll(Duration::from_millis(100)).unwrap());
    }
    got
}

#[test]
fn an_exec_in_the_gate_is_reported_with_its_argv_and_one_outside_is_not() {
    let tracer = ExecTracer::load(None).unwrap();
    let mut reader = tracer.reader().unwrap();
    let cg = TempCgroup::new("exectrace-gate");
    let id = cgroup_id(&cg.0).unwrap();
    tracer.admit(id).unwrap();

    let pid = exec_echo(Some(&cg), &["hello", "", "world with spaces"]);
    let got: Vec<ExecRecord> = records(&mut reader, 1, Duration::from_secs(5))
        .into_iter()
        .filter(|r| r.cgroup_id == id)
        .collect();
    assert_eq!(got.len(), 1, "{got:#?}");
    let r = &got[0];
    assert_eq!(r.pid, pid, "the shell's pid is the exec'ed echo's");
    assert_eq!(r.comm, "echo");
    assert_eq!(r.filename, "/bin/echo");
    assert_eq!(r.argc, 4);
    assert_eq!(r.argv, ["/bin/echo", "hello", "", "world with spaces"]);
    assert!(!r.truncation.any(), "{:?}", r.truncation);
    assert_eq!(r.ppid, std::process::id());

    // The same exec from a shell that stays outside the gate.
    exec_echo(None, &["outside"]);
    // One inside again, so there is something to wait for: the record of
    // the outside exec would have been committed before it.
    exec_echo(Some(&cg), &["marker"]);
    let after = records(&mut reader, 1, Duration::from_secs(5));
    assert!(
        after.iter().all(|r| !r.argv.iter().any(|a| a == "outside")),
        "{after:#?}"
    );
    assert_eq!(
        after.iter().filter(|r| r.cgroup_id == id).count(),
        1,
        "{after:#?}"
    );

    // Revoked: no more records from the cgroup.
    assert!(tracer.revoke(id).unwrap());
    exec_echo(Some(&cg), &["revoked"]);
    assert!(records(&mut reader, 1, Duration::from_millis(800)).is_empty());
    let stats = tracer.read_stats().unwrap();
    assert_eq!(stats.ringbuf_full, 0);
    assert_eq!(reader.undecodable(), 0);
}

#[test]
fn long_and_many_arguments_are_cut_and_flagged() {
    let tracer = ExecTracer::load(None).unwrap();
    let mut reader = tracer.reader().unwrap();
    let cg = TempCgroup::new("exectrace-long");
    let id = cgroup_id(&cg.0).unwrap();
    tracer.admit(id).unwrap();

    // 127 bytes fill a slot exactly; 300 bytes need the skip; then more
    // arguments than there are slots.
    let exact = "e".repeat(ARG_LEN - 1);
    let long = "l".repeat(300);
    let args: Vec<String> = [exact.clone(), long, "after".into()]
        .into_iter()
        .chain((0..10).map(|i| format!("a{i}")))
        .collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    exec_echo(Some(&cg), &refs);
    let got: Vec<ExecRecord> = records(&mut reader, 1, Duration::from_secs(5))
        .into_iter()
        .filter(|r| r.cgroup_id == id)
        .collect();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.argc as usize, 1 + args.len());
    assert_eq!(r.argv.len(), ARGV_SLOTS);
    assert_eq!(r.argv[1], exact, "an argument of 127 bytes is whole");
    assert_eq!(
        r.argv[2],
        "l".repeat(ARG_LEN - 1),
        "a longer one is its prefix"
    );
    assert_eq!(r.argv[3], "after", "the argument after a long one is found");
    assert_eq!(r.argv[7], "a3");
    assert!(r.truncation.arg && r.truncation.argv, "{:?}", r.truncation);
    assert!(tracer.read_stats().unwrap().argv_truncated >= 1);
}
