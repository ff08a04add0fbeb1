//! Boots stock Debian kernels under qemu with a small initramfs and runs a
//! command inside: the VM tier of kyverno-runtime's tests.
//!
//! Every enforcement claim (BPF-LSM denies an `open`, the fmod_ret fallback
//! takes over when `bpf` is not in the LSM list, …) must hold on the kernels
//! users run, so the tests run on real Debian cloud kernels rather than the
//! host's: [`resolve_kernel`] finds and downloads the newest kernel of a
//! [`KernelSeries`] through a private apt configuration, [`run`] boots it
//! with an initramfs holding busybox, the caller's binaries and their
//! libraries, and returns the command's exact output and exit status, and
//! [`run_matrix`] does that for every series × [`LsmMode`].
//!
//! ```no_run
//! use vmtest::{resolve_kernel, run, Cache, KernelSeries, LsmMode, VmSpec};
//!
//! # fn main() -> vmtest::Result<()> {
//! let cache = Cache::from_env()?;
//! let kernel = resolve_kernel(KernelSeries::V6_1, &cache)?;
//! let spec = VmSpec::new(kernel, LsmMode::NoBpf, vec!["cat".into(), "/sys/kernel/security/lsm".into()]);
//! let outcome = run(&spec)?;
//! assert!(!outcome.output.split(',').any(|l| l == "bpf"));
//! # Ok(())
//! # }
//! ```
//!
//! A guest can reach chosen TCP ports on the host's loopback and nothing
//! else ([`VmSpec::host_forwards`], [`HostForward`]): qemu's user-mode
//! network with `restrict=on`, a virtio NIC whose driver comes from the
//! kernel's own package ([`modules`]), and a relay program per connection
//! ([`relay`]).
//!
//! Failures are per boot and typed ([`Error`]): a download failure, a
//! kernel panic, a timeout (qemu is killed) or a guest that never reported.
//!
//! Environment: `KRT_CACHE_DIR` / `XDG_CACHE_HOME` / `HOME` choose the cache
//! ([`Cache::from_env`]), `VMTEST_MIRROR` overrides the mirror taken from the
//! machine's apt configuration, `VMTEST_ACCEL=tcg|kvm` forces the
//! accelerator ([`accel_for`]), `VMTEST_BUSYBOX` names the busybox to use,
//! `VMTEST_RELAY` the relay program ([`relay::locate`]).

pub mod apt;
mod cache;
pub mod debversion;
mod error;
pub mod initramfs;
mod kernel;
mod matrix;
pub mod modules;
pub mod relay;
mod vm;

pub use cache::Cache;
pub use error::{Error, Result};
pub use kernel::{
    cached_kernels, find_vmlinuz, newest_image, parse_series_list, resolve_kernel,
    vmlinuz_candidates, Kernel, KernelSeries,
};
pub use matrix::{
    render_json, render_table, run_matrix, run_matrix_with, run_with_retries, EntryJson,
    MatrixEntry, Workload,
};
pub use vm::{
    accel_for, classify, kernel_cmdline, lsm_list_has_bpf, netdev_args, parse_lsm_list, qemu_args,
    run, run_with_accel, Accel, GuestExpose, HostForward, LsmMode, QemuEnd, Report, VmOutcome,
    VmSpec, DEFAULT_MEMORY_MIB, DEFAULT_TIMEOUT, FORWARD_ADDR, GUEST_ADDR, GUEST_CPUS,
    GUEST_PREFIX,
};
