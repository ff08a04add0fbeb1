//! Real boots under qemu (feature `vm-tests`): downloads kernels on a cold
//! cache, then boots them under TCG (or KVM where a probe boot works).
//!
//! Run with
//! `cargo test -p vmtest --features vm-tests -- --test-threads=1`
//! (one guest at a time: the build machines have two cores).

// Helpers outside #[test] fns panic too: in a test file a panic is the report.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use vmtest::{
    lsm_list_has_bpf, render_table, resolve_kernel, run, run_matrix, Cache, Error, Kernel,
    KernelSeries, LsmMode, VmSpec, Workload,
};

fn kernel_6_1() -> Kernel {
    let cache = Cache::from_env().expect("cache dir");
    resolve_kernel(KernelSeries::V6_1, &cache).expect("resolve 6.1")
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn bpf_mode_has_bpf_in_active_lsm_list() {
    let spec = VmSpec::new(
        kernel_6_1(),
        LsmMode::Bpf,
        argv(&["cat", "/sys/kernel/security/lsm"]),
    );
    let out = run(&spec).expect("boot");
    assert_eq!(out.exit_code, 0, "console:\n{}", out.console);
    assert!(lsm_list_has_bpf(&out.output), "lsm list: {:?}", out.output);
    assert_eq!(out.guest_lsm.as_deref(), Some(out.output.trim()));
}

#[test]
fn nobpf_mode_leaves_bpf_out() {
    let spec = VmSpec::new(
        kernel_6_1(),
        LsmMode::NoBpf,
        argv(&["cat", "/sys/kernel/security/lsm"]),
    );
    let out = run(&spec).expect("boot");
    assert_eq!(out.exit_code, 0, "console:\n{}", out.console);
    assert!(!lsm_list_has_bpf(&out.output), "lsm list: {:?}", out.output);
    assert!(
        out.output.contains("capability"),
        "lsm list: {:?}",
        out.output
    );
}

#[test]
fn exit_status_and_exact_output_come_back() {
    let spec = VmSpec::new(
        kernel_6_1(),
        LsmMode::Bpf,
        argv(&[
            "sh",
            "-c",
            "printf 'out\\n\\tno newline'; printf 'err\\r\\n' >&2; exit 3",
        ]),
    );
    let out = run(&spec).expect("boot");
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.output, "out\n\tno newlineerr\r\n");
    assert_eq!(out.output_bytes, out.output.as_bytes());
}

#[test]
fn host_binary_runs_with_its_libraries() {
    // A dynamically linked host binary: runs only if ldd's libraries and the
    // loader were put at the right paths.
    let mut spec = VmSpec::new(kernel_6_1(), LsmMode::Bpf, argv(&["nproc"]));
    spec.binaries.push("/usr/bin/nproc".into());
    let out = run(&spec).expect("boot");
    assert_eq!(out.exit_code, 0, "output: {}", out.output);
    assert_eq!(out.output, format!("{}\n", vmtest::GUEST_CPUS));

    let mut spec = VmSpec::new(
        kernel_6_1(),
        LsmMode::Bpf,
        argv(&["sh", "-c", "echo \"$GREETING\""]),
    );
    spec.env.push(("GREETING".into(), "it's here".into()));
    assert_eq!(run(&spec).expect("boot").output, "it's here\n");
}

#[test]
fn tiny_timeout_is_a_timeout_not_a_hang() {
    let mut spec = VmSpec::new(kernel_6_1(), LsmMode::Bpf, argv(&["sleep", "600"]));
    spec.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = run(&spec).expect_err("must time out");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn guest_kernel_panic_is_reported() {
    let spec = VmSpec::new(
        kernel_6_1(),
        LsmMode::Bpf,
        argv(&["sh", "-c", "echo c > /proc/sysrq-trigger"]),
    );
    match run(&spec) {
        Err(Error::KernelPanic { panic_line, .. }) => {
            assert!(panic_line.contains("sysrq"), "{panic_line}")
        }
        other => panic!("expected a kernel panic, got {other:?}"),
    }
}

#[test]
fn bogus_series_fails_to_resolve_cleanly() {
    let err = "4.19"
        .parse::<KernelSeries>()
        .expect_err("4.19 is not a series");
    assert!(
        matches!(&err, Error::UnknownSeries(s) if s == "4.19"),
        "{err}"
    );

    // An unreachable mirror on a cold cache: a download error naming the
    // series and carrying apt's output, not a hang or a panic.
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path()).with_mirror("http://mirror.invalid/debian");
    match resolve_kernel(KernelSeries::V5_10, &cache) {
        Err(e @ Error::Download { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("5.10") && msg.contains("apt-get update"),
                "{msg}"
            );
            assert!(msg.contains("mirror.invalid"), "apt tail missing: {msg}");
        }
        other => panic!("expected a download error, got {other:?}"),
    }
}

#[test]
fn matrix_on_one_kernel() {
    let cache = Cache::from_env().unwrap();
    let entries = run_matrix(
        &cache,
        &[KernelSeries::V6_1],
        &LsmMode::ALL,
        &Workload::new(argv(&["cat", "/sys/kernel/security/lsm"])),
    );
    let table = render_table(&entries);
    assert_eq!(entries.len(), 2, "{table}");
    for e in &entries {
        let out = e.result.as_ref().expect("boot");
        assert_eq!(
            lsm_list_has_bpf(&out.output),
            e.lsm.expects_bpf(),
            "{table}"
        );
    }
    assert!(table.contains("6.1.0-"), "{table}");
}

#[test]
fn stale_lists_and_unreachable_mirror_fall_back_to_cached_kernel() {
    // A cache holding only an extracted kernel (its metadata pointing at the
    // real cache's vmlinuz), no lists, and a mirror that cannot be reached:
    // the refresh fails and the cached kernel of the series is used.
    let real = kernel_6_1();
    let dir = tempfile::tempdir().unwrap();
    let kdir = dir.path().join("kernels").join(&real.version);
    std::fs::create_dir_all(&kdir).unwrap();
    std::fs::write(
        kdir.join("kernel.json"),
        serde_json::to_string(&real).unwrap(),
    )
    .unwrap();
    let cache = Cache::new(dir.path()).with_mirror("http://mirror.invalid/debian");
    assert_eq!(resolve_kernel(KernelSeries::V6_1, &cache).unwrap(), real);
    assert!(matches!(
        resolve_kernel(KernelSeries::V5_10, &cache),
        Err(Error::Download { .. })
    ));
}
