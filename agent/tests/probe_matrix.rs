//! Tier 4: the probe on every kernel of the matrix, booted with and without
//! `bpf` in `lsm=` (vmtest, qemu). Asserts the plan each configuration must
//! give, prints the matrix table, and fails naming every configuration that
//! differed.
//!
//! `KRT_KERNELS=5.10,6.1` narrows the kernel list; `KRT_RECORD_FIXTURES=DIR`
//! writes each configuration's `probe --json` output there (that is how
//! `compat/tests/fixtures/` was recorded).
// A test harness: a panic is the failure report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use kyverno_runtime_compat::{Backend, ProbeReport, ProgramId};
use std::path::PathBuf;
use std::time::Duration;
use vmtest::{Cache, KernelSeries, LsmMode, Workload};

const DEFAULT_KERNELS: &str = "5.10,6.1,6.12,7.x";

/// The binary under test, stripped so the initramfs stays small.
fn guest_binary() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_BIN_EXE_kyverno-runtime"));
    // vmtest places a binary at /bin/<file name>.
    let dir = std::env::temp_dir().join(format!("kyverno-runtime-vm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dst = dir.join("kyverno-runtime");
    let status = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(&src)
        .arg("-o")
        .arg(&dst)
        .status()
        .expect("run strip");
    assert!(status.success(), "strip failed");
    dst
}

/// What a configuration must give, or the first difference.
///
/// 5.10 is the one kernel whose BPF-LSM cannot serve open/exec even with
/// `bpf` in `lsm=`: LSM programs may not call `bpf_d_path` before 5.11, so
/// the probe's LSM program is refused at load and the plan is fmod_ret.
fn check(series: KernelSeries, lsm: LsmMode, report: &ProbeReport) -> Result<(), String> {
    let plan = &report.plan;
    let no_d_path_in_lsm = series == KernelSeries::V5_10;
    let want = match lsm {
        LsmMode::Bpf if !no_d_path_in_lsm => Backend::BpfLsm,
        _ => Backend::FmodRet,
    };
    for (name, entry) in [("open", &plan.open), ("exec", &plan.exec)] {
        if entry.backend != want || !entry.available {
            return Err(format!(
                "{name}: want {want}, got {} ({})",
                entry.backend, entry.reason
            ));
        }
    }
    let lsm_probe = report.measurements.program(ProgramId::LsmFileOpen);
    match lsm {
        LsmMode::Bpf if no_d_path_in_lsm => {
            let refused = lsm_probe.failure.as_ref().is_some_and(|f| {
                f.verifier_log
                    .as_deref()
                    .is_some_and(|log| log.contains("helper call is not allowed"))
            });
            if !refused {
                return Err(format!(
                    "lsm/file_open (with bpf_d_path) should be refused by the 5.10 verifier: {lsm_probe:?}"
                ));
            }
        }
        LsmMode::Bpf if lsm_probe.runs != Some(true) => {
            return Err(format!(
                "lsm/file_open did not run with bpf in lsm=: {lsm_probe:?}"
            ));
        }
        LsmMode::NoBpf if report.measurements.kernel.lsm.bpf_active => {
            return Err("bpf is active although lsm= left it out".into());
        }
        _ => {}
    }
    for (name, entry, backend) in [
        ("network", &plan.network, Backend::CgroupSkbEgress),
        ("protocol", &plan.protocol, Backend::CgroupSkbClassifier),
        ("dns", &plan.dns, Backend::CgroupSkbDns),
        ("execArgv", &plan.exec_argv, Backend::RawTpExec),
    ] {
        if entry.backend != backend || !entry.available {
            return Err(format!(
                "{name}: want {backend}, got {} ({})",
                entry.backend, entry.reason
            ));
        }
    }
    Ok(())
}

#[test]
fn every_kernel_gives_the_plan_it_must() {
    let kernels = std::env::var("KRT_KERNELS").unwrap_or_else(|_| DEFAULT_KERNELS.into());
    let series = vmtest::parse_series_list(&kernels).expect("KRT_KERNELS");
    let record = std::env::var_os("KRT_RECORD_FIXTURES").map(PathBuf::from);
    let cache = Cache::from_env().expect("vmtest cache");
    let binary = guest_binary();

    let mut workload = Workload::new(vec![
        "kyverno-runtime".into(),
        "probe".into(),
        "--json".into(),
    ]);
    workload.binaries = vec![binary.clone()];
    // Logs off: the command's output must be the JSON document alone.
    workload.env = vec![("KRT_LOG".into(), "off".into())];
    workload.timeout = Duration::from_secs(240);
    let entries = vmtest::run_matrix_with(
        &cache,
        &series,
        &[LsmMode::Bpf, LsmMode::NoBpf],
        &workload,
        |e| {
            eprintln!("vmtest: {}/{} done", e.series, e.lsm);
        },
    );
    // The stripped binary and the directory made for it, nothing else.
    let _ = std::fs::remove_file(&binary);
    if let Some(dir) = binary.parent() {
        let _ = std::fs::remove_dir(dir);
    }

    let mut rows = vec![format!(
        "{:<6} {:<6} {:<28} {:<9} {:<18} {:<22} {:<15} {:<11} RESULT",
        "KERNEL", "LSM", "VERSION", "OPEN/EXEC", "NETWORK", "PROTOCOL", "DNS", "EXEC-ARGV"
    )];
    let mut failures = Vec::new();
    for entry in &entries {
        let label = format!("{}/{}", entry.series, entry.lsm);
        let version = entry.kernel.as_ref().map_or("-", |k| k.version.as_str());
        let verdict = match &entry.result {
            Err(e) => Err(format!("vm: {e}")),
            Ok(o) if o.exit_code != 0 => Err(format!("probe exited {}: {}", o.exit_code, o.output)),
            Ok(o) => match serde_json::from_str::<ProbeReport>(&o.output) {
                Err(e) => Err(format!("output is not probe JSON ({e}): {}", o.output)),
                Ok(report) => {
                    if let Some(dir) = &record {
                        let file = dir.join(format!("{}-{}.json", entry.series, entry.lsm));
                        std::fs::write(&file, &o.output).expect("record fixture");
                    }
                    Ok(report)
                }
            },
        };
        let retried: Vec<String> = entry.retried_after.iter().map(|e| e.to_string()).collect();
        if !retried.is_empty() {
            // Visible in the log: a guest crash is retried once, never hidden.
            println!("{label}: booted again after: {}", retried.join("; "));
        }
        match verdict.and_then(|r| check(entry.series, entry.lsm, &r).map(|()| r)) {
            Ok(r) => {
                let p = &r.plan;
                rows.push(format!(
                    "{:<6} {:<6} {:<28} {:<9} {:<18} {:<22} {:<15} {:<11} ok{}",
                    entry.series.to_string(),
                    entry.lsm.to_string(),
                    version,
                    p.open.backend.id(),
                    p.network.backend.id(),
                    p.protocol.backend.id(),
                    p.dns.backend.id(),
                    p.exec_argv.backend.id(),
                    if retried.is_empty() { "" } else { " (retried)" },
                ));
            }
            Err(difference) => {
                rows.push(format!(
                    "{:<6} {:<6} {:<28} FAIL: {}",
                    entry.series.to_string(),
                    entry.lsm.to_string(),
                    version,
                    difference.lines().next().unwrap_or_default()
                ));
                failures.push(format!("{label}: {difference}"));
            }
        }
    }
    println!("\n{}\n", rows.join("\n"));
    assert_eq!(
        entries.len(),
        series.len() * 2,
        "one entry per configuration"
    );
    assert!(
        failures.is_empty(),
        "configurations that differ:\n{}",
        failures.join("\n")
    );
}
