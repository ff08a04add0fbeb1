//! Tier 2: `kyverno-runtime probe` on the host kernel (needs root).
//!
//! Everywhere, the plan must agree with what the probe measured. With
//! `KRT_EXPECT_HOST=restricted` (set by `ci/test` on the build machines,
//! whose kernel refuses LSM and fmod_ret programs, see shared/MACHINE.md)
//! it must also say exactly that: open/exec unavailable with the refusal
//! measured, and network, protocol, dns and exec tracing available.
// A test harness: a panic is the failure report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use kyverno_runtime_compat::{Backend, ProbeReport, ProgramId};
use std::process::Command;

fn probe(extra: &[&str]) -> ProbeReport {
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["probe", "--json"])
        .args(extra)
        .env("KRT_LOG", "warn")
        .output()
        .expect("run kyverno-runtime probe");
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("probe --json parses as ProbeReport")
}

#[test]
fn plan_agrees_with_measurements() {
    let report = probe(&[]);
    println!("{}", report.to_table());
    let m = &report.measurements;
    let plan = &report.plan;
    assert!(m.bpf_objects_built, "binary was built without BPF objects");
    assert_eq!(
        plan.open.backend, plan.exec.backend,
        "open and exec share a backend"
    );
    assert_eq!(plan.open.available, plan.exec.available);

    let lsm = m.program(ProgramId::LsmFileOpen);
    let fmod = m.program(ProgramId::FmodRetFileOpen);
    match plan.open.backend {
        Backend::BpfLsm => assert!(lsm.usable() && m.kernel.lsm.bpf_active),
        Backend::FmodRet => assert!(fmod.usable() && !(lsm.usable() && m.kernel.lsm.bpf_active)),
        Backend::None => {
            assert!(!plan.open.available);
            for failure in [&lsm.failure, &fmod.failure].into_iter().flatten() {
                assert!(
                    plan.open.reason.contains(&failure.message),
                    "reason {:?} must quote the measured refusal {:?}",
                    plan.open.reason,
                    failure.message
                );
            }
        }
        other => panic!("open served by {other}"),
    }
    let skb = m.program(ProgramId::CgroupSkbEgress);
    assert_eq!(
        plan.network.available,
        skb.usable() && m.kernel.cgroup.v2_mount.is_some()
    );

    match std::env::var("KRT_EXPECT_HOST").as_deref() {
        Ok("restricted") => assert_restricted(&report),
        Ok(other) => panic!("unknown KRT_EXPECT_HOST={other:?} (expected `restricted`)"),
        Err(_) => println!("KRT_EXPECT_HOST unset: checked consistency only"),
    }
}

/// The build machines' kernel: LSM and fmod_ret refused, the rest works.
fn assert_restricted(report: &ProbeReport) {
    let m = &report.measurements;
    let plan = &report.plan;
    for id in [ProgramId::LsmFileOpen, ProgramId::FmodRetFileOpen] {
        let failure = m.program(id).failure.expect("refused on this host");
        assert_eq!(failure.stage, "load", "{id:?}");
        assert_eq!(failure.errno_name.as_deref(), Some("EPERM"), "{id:?}");
    }
    for entry in [&plan.open, &plan.exec] {
        assert_eq!(entry.backend, Backend::None);
        assert!(!entry.available);
        assert!(entry.reason.contains("EPERM"), "{}", entry.reason);
        assert!(
            entry.reason.contains("BPF-LSM") && entry.reason.contains("fmod_ret"),
            "{}",
            entry.reason
        );
    }
    assert_eq!(plan.network.backend, Backend::CgroupSkbEgress);
    assert_eq!(plan.protocol.backend, Backend::CgroupSkbClassifier);
    assert_eq!(plan.dns.backend, Backend::CgroupSkbDns);
    assert_eq!(plan.exec_argv.backend, Backend::RawTpExec);
    for entry in [&plan.network, &plan.protocol, &plan.dns, &plan.exec_argv] {
        assert!(entry.available, "{}", entry.reason);
    }
}

#[test]
fn override_forces_the_open_exec_backend_and_says_so() {
    let report = probe(&["--open-exec=fmod_ret"]);
    assert_eq!(report.plan.open.backend, Backend::FmodRet);
    assert!(report.plan.open.forced);
    assert!(
        report
            .plan
            .open
            .reason
            .starts_with("forced by --open-exec=fmod_ret"),
        "{}",
        report.plan.open.reason
    );
    assert_eq!(report.overrides.open_exec, "fmod_ret");
    // Overriding open/exec changes nothing else.
    let auto = probe(&[]);
    assert_eq!(report.plan.network, auto.plan.network);
}

/// The probe in a PID namespace of its own, as the daemon's is in a hostPID
/// pod on a node that runs in one (kind's nodes, ci/node-up's): the kernel
/// numbers the probe's exec child in the initial namespace, the probe in
/// its own, and before issue 25's fix it concluded the exec tracer "never
/// ran". Its programs number tasks in the prober's namespace now, so the
/// plan is the same as outside it.
#[test]
fn a_probe_in_a_pid_namespace_of_its_own_measures_what_one_outside_does() {
    let outside = probe(&[]);
    let out = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount",
            "--propagation",
            "private",
            "--mount-proc",
        ])
        .arg(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["probe", "--json"])
        .env("KRT_LOG", "warn")
        .output()
        .expect("run kyverno-runtime probe under unshare");
    assert!(
        out.status.success(),
        "probe in a PID namespace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inside: ProbeReport = serde_json::from_slice(&out.stdout).expect("probe --json parses");
    for id in ProgramId::ALL {
        assert_eq!(
            inside.measurements.program(id).runs,
            outside.measurements.program(id).runs,
            "{id:?} runs inside a PID namespace as outside"
        );
    }
    assert_eq!(inside.plan.exec_argv, outside.plan.exec_argv);
    assert_eq!(inside.plan.open, outside.plan.open);
}
