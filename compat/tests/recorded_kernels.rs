//! The plan derived from measurements recorded on real kernels.
//!
//! `fixtures/<series>-<lsm>.json` are `kyverno-runtime probe --json` outputs
//! recorded inside vmtest (`KRT_RECORD_FIXTURES=compat/tests/fixtures cargo
//! test -p kyverno-runtime --features vm-tests --test probe_matrix`);
//! `fixtures/host-6.18.json` was recorded on the build host. Re-deriving the
//! plan from them here keeps the derivation honest without a kernel.

// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use kyverno_runtime_compat::{derive_plan, Backend, Behavior, Measurements, Overrides, ProgramId};
use rstest::rstest;
use std::path::PathBuf;

fn recorded(name: &str) -> Measurements {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

const OTHERS: [(Behavior, Backend); 4] = [
    (Behavior::Network, Backend::CgroupSkbEgress),
    (Behavior::Protocol, Backend::CgroupSkbClassifier),
    (Behavior::Dns, Backend::CgroupSkbDns),
    (Behavior::ExecArgv, Backend::RawTpExec),
];

/// 5.10 refuses bpf_d_path in LSM programs, so its LSM probe (which, like
/// the real open/exec object, resolves the path) fails at load: fmod_ret
/// there with bpf in lsm= or not, and the reason quotes the verifier.
const NO_D_PATH_IN_LSM: &[&str] = &["5.10-bpf.json", "5.10-nobpf.json"];

/// Whether the fixture's kernel had bpf in its active LSM list.
fn bpf_listed(fixture: &str) -> bool {
    fixture.contains("-bpf")
}

#[rstest]
#[case::k5_10_bpf("5.10-bpf.json", Backend::FmodRet)]
#[case::k5_10_nobpf("5.10-nobpf.json", Backend::FmodRet)]
#[case::k6_1_bpf("6.1-bpf.json", Backend::BpfLsm)]
#[case::k6_1_nobpf("6.1-nobpf.json", Backend::FmodRet)]
#[case::k6_12_bpf("6.12-bpf.json", Backend::BpfLsm)]
#[case::k6_12_nobpf("6.12-nobpf.json", Backend::FmodRet)]
#[case::k7_bpf("7.x-bpf.json", Backend::BpfLsm)]
#[case::k7_nobpf("7.x-nobpf.json", Backend::FmodRet)]
#[case::host("host-6.18.json", Backend::None)]
fn recorded_kernel_plan(#[case] fixture: &str, #[case] open_exec: Backend) {
    let m = recorded(fixture);
    let plan = derive_plan(&m, &Overrides::default());
    assert_eq!(
        plan.open.backend, open_exec,
        "{fixture}: {}",
        plan.open.reason
    );
    assert_eq!(
        plan.exec.backend, open_exec,
        "{fixture}: {}",
        plan.exec.reason
    );
    assert_eq!(plan.open.available, open_exec != Backend::None);
    for (behavior, backend) in OTHERS {
        let entry = plan.entry(behavior);
        assert_eq!(
            entry.backend, backend,
            "{fixture} {behavior:?}: {}",
            entry.reason
        );
        assert!(entry.available);
    }
    match open_exec {
        // With bpf left out of lsm= the LSM program still loads and
        // attaches; only the run check shows it is inert.
        Backend::FmodRet if NO_D_PATH_IN_LSM.contains(&fixture) && bpf_listed(fixture) => {
            let lsm = m.program(ProgramId::LsmFileOpen);
            assert!(!lsm.loads, "{fixture}: {lsm:?}");
            assert!(
                plan.open
                    .reason
                    .contains("verifier: helper call is not allowed in probe"),
                "{fixture}: {}",
                plan.open.reason
            );
        }
        Backend::FmodRet => {
            let lsm = m.program(ProgramId::LsmFileOpen);
            assert!(!m.kernel.lsm.bpf_active, "{fixture}");
            assert!(
                plan.open
                    .reason
                    .contains("bpf is not in the active LSM list"),
                "{}",
                plan.open.reason
            );
            if NO_D_PATH_IN_LSM.contains(&fixture) {
                assert!(!lsm.loads, "{fixture}: {lsm:?}");
            } else {
                assert!(
                    lsm.loads && lsm.attaches && lsm.runs == Some(false),
                    "{fixture}: {lsm:?}"
                );
            }
        }
        Backend::BpfLsm => assert_eq!(m.program(ProgramId::LsmFileOpen).runs, Some(true)),
        // The build host: bpf is listed, but the kernel refuses the programs.
        _ => {
            assert!(m.kernel.lsm.bpf_active);
            for id in [ProgramId::LsmFileOpen, ProgramId::FmodRetFileOpen] {
                let failure = m.program(id).failure.unwrap();
                assert_eq!(failure.errno_name.as_deref(), Some("EPERM"));
                assert!(plan.open.reason.contains(&failure.message));
            }
        }
    }
}
