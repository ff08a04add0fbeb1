//! The kernel × LSM-mode matrix: one boot per configuration, each failing
//! on its own, and a table of what happened.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::kernel::{resolve_kernel, Kernel, KernelSeries};
use crate::vm::{
    self, GuestExpose, HostForward, LsmMode, VmOutcome, VmSpec, DEFAULT_MEMORY_MIB, DEFAULT_TIMEOUT,
};

/// What to run in every configuration: [`VmSpec`] without the kernel and
/// the LSM mode.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Host binaries, placed at `/bin/NAME`.
    pub binaries: Vec<PathBuf>,
    /// `(host, guest)` files or directories.
    pub files: Vec<(PathBuf, PathBuf)>,
    /// Environment for the command.
    pub env: Vec<(String, String)>,
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Per-boot timeout.
    pub timeout: Duration,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Extra qemu arguments.
    pub extra_qemu_args: Vec<String>,
    /// Host loopback ports the guest may reach ([`VmSpec::host_forwards`]).
    pub host_forwards: Vec<HostForward>,
    /// Guest ports the host may reach ([`VmSpec::exposes`]).
    pub exposes: Vec<GuestExpose>,
    /// Kernel modules loaded before the command ([`VmSpec::modules`]).
    pub modules: Vec<String>,
    /// How many times a configuration whose guest itself failed (a kernel
    /// panic, a hang, no sentinel) is booted again. Emulated guests crash
    /// now and then in timer code under TCG; one retry keeps such a crash
    /// from failing a whole run, and every earlier failure stays in
    /// [`MatrixEntry::retried_after`] so nothing is hidden.
    pub retries: u32,
}

impl Workload {
    /// A workload running `command` with default limits.
    pub fn new(command: Vec<String>) -> Self {
        Workload {
            binaries: Vec::new(),
            files: Vec::new(),
            env: Vec::new(),
            command,
            timeout: DEFAULT_TIMEOUT,
            memory_mib: DEFAULT_MEMORY_MIB,
            extra_qemu_args: Vec::new(),
            host_forwards: Vec::new(),
            exposes: Vec::new(),
            modules: Vec::new(),
            retries: 1,
        }
    }

    /// The boot of this workload on `kernel` in `lsm` mode.
    pub fn spec(&self, kernel: Kernel, lsm: LsmMode) -> VmSpec {
        VmSpec {
            kernel,
            lsm,
            binaries: self.binaries.clone(),
            files: self.files.clone(),
            env: self.env.clone(),
            command: self.command.clone(),
            timeout: self.timeout,
            memory_mib: self.memory_mib,
            extra_qemu_args: self.extra_qemu_args.clone(),
            host_forwards: self.host_forwards.clone(),
            relay: None,
            exposes: self.exposes.clone(),
            modules: self.modules.clone(),
            run_dir: None,
        }
    }
}

/// One configuration of the matrix and its result.
#[derive(Debug, Clone)]
pub struct MatrixEntry {
    /// The kernel series.
    pub series: KernelSeries,
    /// The LSM mode.
    pub lsm: LsmMode,
    /// The resolved kernel, unless resolution failed.
    pub kernel: Option<Kernel>,
    /// The boot's outcome or why it failed.
    pub result: Result<VmOutcome>,
    /// Failures of earlier boots of this configuration that were retried.
    pub retried_after: Vec<Error>,
}

impl MatrixEntry {
    /// Whether the configuration booted and its command exited 0.
    pub fn passed(&self) -> bool {
        matches!(&self.result, Ok(o) if o.exit_code == 0)
    }

    /// The cell for the `result` column.
    fn verdict(&self) -> String {
        let verdict = match &self.result {
            Ok(o) if o.exit_code == 0 => "ok".to_owned(),
            Ok(o) => format!("FAIL: exit {}", o.exit_code),
            Err(e) => format!("FAIL: {}", e.label()),
        };
        if self.retried_after.is_empty() {
            return verdict;
        }
        let earlier: Vec<&str> = self.retried_after.iter().map(Error::label).collect();
        format!("{verdict} (retried after {})", earlier.join(", "))
    }
}

/// Resolves each series once, then boots every series × mode configuration
/// in order. Nothing short-circuits: a kernel that fails to download or
/// boot is reported in its entries and the rest still run.
pub fn run_matrix(
    cache: &Cache,
    series: &[KernelSeries],
    modes: &[LsmMode],
    workload: &Workload,
) -> Vec<MatrixEntry> {
    run_matrix_with(cache, series, modes, workload, |_| {})
}

/// [`run_matrix`], calling `progress` after each configuration (the CLI
/// prints a line per boot so a long matrix is not silent).
pub fn run_matrix_with(
    cache: &Cache,
    series: &[KernelSeries],
    modes: &[LsmMode],
    workload: &Workload,
    mut progress: impl FnMut(&MatrixEntry),
) -> Vec<MatrixEntry> {
    let mut entries = Vec::new();
    for &s in series {
        let kernel = resolve_kernel(s, cache);
        for &lsm in modes {
            let entry = match &kernel {
                Ok(k) => {
                    let (result, retried_after) =
                        run_with_retries(&workload.spec(k.clone(), lsm), workload.retries);
                    MatrixEntry {
                        series: s,
                        lsm,
                        kernel: Some(k.clone()),
                        result,
                        retried_after,
                    }
                }
                Err(e) => MatrixEntry {
                    series: s,
                    lsm,
                    kernel: None,
                    result: Err(e.clone()),
                    retried_after: Vec::new(),
                },
            };
            progress(&entry);
            entries.push(entry);
        }
    }
    entries
}

/// Boots `spec`, booting again up to `retries` times while the guest itself
/// failed (a panic, a hang, no sentinel: [`Error::is_guest_failure`]),
/// with the earlier failures. A command that ran and exited non-zero is
/// never retried.
pub fn run_with_retries(spec: &VmSpec, retries: u32) -> (Result<VmOutcome>, Vec<Error>) {
    let mut earlier = Vec::new();
    loop {
        let result = vm::run(spec);
        match result {
            Err(e) if e.is_guest_failure() && earlier.len() < retries as usize => {
                tracing::warn!(
                    kernel = %spec.kernel.version,
                    lsm = %spec.lsm,
                    error = %e,
                    "guest failed; booting this configuration again"
                );
                earlier.push(e);
            }
            result => return (result, earlier),
        }
    }
}

/// Renders the matrix as a plain-text table:
/// `kernel | lsm | version | guest lsm | exit | time | result`.
pub fn render_table(entries: &[MatrixEntry]) -> String {
    let header = [
        "kernel",
        "lsm",
        "version",
        "guest lsm",
        "exit",
        "time",
        "result",
    ];
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            let (lsm_list, exit, time) = match &e.result {
                Ok(o) => (
                    o.guest_lsm.clone().unwrap_or_else(|| "?".to_owned()),
                    o.exit_code.to_string(),
                    format!("{:.1}s", o.duration.as_secs_f64()),
                ),
                Err(_) => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            };
            [
                e.series.to_string(),
                e.lsm.to_string(),
                e.kernel
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |k| k.version.clone()),
                lsm_list,
                exit,
                time,
                e.verdict(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join(" | ").trim_end().to_owned()
    };
    let mut out = line(&header);
    out.push('\n');
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("-+-"));
    out.push('\n');
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
        out.push('\n');
    }
    out
}

/// A matrix entry as JSON: the configuration, the kernel, and either the
/// outcome or the error's kind and message.
#[derive(Debug, Serialize)]
pub struct EntryJson<'a> {
    /// The kernel series.
    pub series: KernelSeries,
    /// The LSM mode.
    pub lsm: LsmMode,
    /// The resolved kernel.
    pub kernel: Option<&'a Kernel>,
    /// Whether the configuration passed.
    pub passed: bool,
    /// The outcome, when the guest booted and reported.
    pub outcome: Option<&'a VmOutcome>,
    /// The error's label, when it did not.
    pub error_kind: Option<&'static str>,
    /// The error's message, when it did not.
    pub error: Option<String>,
}

impl<'a> From<&'a MatrixEntry> for EntryJson<'a> {
    fn from(e: &'a MatrixEntry) -> Self {
        let (outcome, error_kind, error) = match &e.result {
            Ok(o) => (Some(o), None, None),
            Err(err) => (None, Some(err.label()), Some(err.to_string())),
        };
        EntryJson {
            series: e.series,
            lsm: e.lsm,
            kernel: e.kernel.as_ref(),
            passed: e.passed(),
            outcome,
            error_kind,
            error,
        }
    }
}

/// The matrix as a JSON array of [`EntryJson`].
pub fn render_json(entries: &[MatrixEntry]) -> Result<String> {
    let rows: Vec<EntryJson<'_>> = entries.iter().map(EntryJson::from).collect();
    serde_json::to_string_pretty(&rows).map_err(|e| Error::metadata("<matrix json>", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::Accel;

    fn kernel(series: KernelSeries, version: &str) -> Kernel {
        Kernel {
            series,
            version: version.into(),
            package: format!("linux-image-{version}"),
            package_version: "1".into(),
            vmlinuz: PathBuf::from("/k"),
        }
    }

    fn outcome(exit_code: i32, lsm: &str, secs: f64) -> VmOutcome {
        VmOutcome {
            exit_code,
            output: lsm.into(),
            output_bytes: lsm.as_bytes().to_vec(),
            guest_lsm: Some(lsm.into()),
            console: String::new(),
            duration: Duration::from_secs_f64(secs),
            accel: Accel::Tcg,
        }
    }

    fn entries() -> Vec<MatrixEntry> {
        vec![
            MatrixEntry {
                series: KernelSeries::V6_1,
                lsm: LsmMode::Bpf,
                kernel: Some(kernel(KernelSeries::V6_1, "6.1.0-50-cloud-amd64")),
                result: Ok(outcome(
                    0,
                    "lockdown,capability,landlock,yama,apparmor,bpf",
                    3.27,
                )),
                retried_after: Vec::new(),
            },
            MatrixEntry {
                series: KernelSeries::V6_1,
                lsm: LsmMode::NoBpf,
                kernel: Some(kernel(KernelSeries::V6_1, "6.1.0-50-cloud-amd64")),
                result: Ok(outcome(3, "lockdown,capability,landlock,yama", 2.96)),
                retried_after: Vec::new(),
            },
            MatrixEntry {
                series: KernelSeries::V7,
                lsm: LsmMode::Bpf,
                kernel: None,
                result: Err(Error::Download {
                    series: KernelSeries::V7,
                    step: "apt-get update (sid)".into(),
                    status: "exit 100".into(),
                    apt_tail: "E: Failed to fetch".into(),
                }),
                retried_after: Vec::new(),
            },
        ]
    }

    #[test]
    fn a_retried_configuration_says_what_it_was_retried_after() {
        let mut entry = entries().remove(0);
        let panic = Error::KernelPanic {
            panic_line: "Kernel panic - not syncing: Fatal exception in interrupt".into(),
            console_tail: String::new(),
        };
        assert!(panic.is_guest_failure());
        entry.retried_after.push(panic);
        assert!(entry.passed());
        assert_eq!(entry.verdict(), "ok (retried after kernel panic)");
        assert!(
            !Error::NoCacheDir.is_guest_failure(),
            "harness errors are not retried"
        );
    }

    #[test]
    fn table() {
        let want = "\
kernel | lsm   | version              | guest lsm                                      | exit | time | result
-------+-------+----------------------+------------------------------------------------+------+------+----------------------
6.1    | bpf   | 6.1.0-50-cloud-amd64 | lockdown,capability,landlock,yama,apparmor,bpf | 0    | 3.3s | ok
6.1    | nobpf | 6.1.0-50-cloud-amd64 | lockdown,capability,landlock,yama              | 3    | 3.0s | FAIL: exit 3
7.x    | bpf   | -                    | -                                              | -    | -    | FAIL: download failed
";
        assert_eq!(render_table(&entries()), want);
    }

    #[test]
    fn json_and_passed() {
        let e = entries();
        assert!(e[0].passed());
        assert!(!e[1].passed());
        assert!(!e[2].passed());
        let json: serde_json::Value = serde_json::from_str(&render_json(&e).unwrap()).unwrap();
        assert_eq!(json[0]["series"], "6.1");
        assert_eq!(json[0]["lsm"], "bpf");
        assert_eq!(json[0]["outcome"]["exit_code"], 0);
        assert_eq!(json[0]["outcome"]["accel"], "tcg");
        assert_eq!(json[0]["outcome"]["duration"], 3.27);
        assert_eq!(json[2]["error_kind"], "download failed");
        assert!(json[2]["outcome"].is_null());
    }

    #[test]
    fn workload_to_spec() {
        let mut w = Workload::new(vec!["true".into()]);
        w.env.push(("A".into(), "b".into()));
        let spec = w.spec(
            kernel(KernelSeries::V5_10, "5.10.0-32-cloud-amd64"),
            LsmMode::NoBpf,
        );
        assert_eq!(spec.lsm, LsmMode::NoBpf);
        assert_eq!(spec.env, w.env);
        assert_eq!(spec.timeout, DEFAULT_TIMEOUT);
    }
}
