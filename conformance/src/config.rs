//! The configurations of a run: a kernel series booted with or without
//! `bpf` in `lsm=`, or the host; each is one node of the cluster, named for
//! what it is, and each must use a known open/exec backend.

use crate::scenario::NodeClass;
use std::fmt;
use vmtest::{KernelSeries, LsmMode};

/// Where a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// A guest of that series, booted in that LSM mode.
    Vm {
        /// The kernel series.
        series: KernelSeries,
        /// `bpf` in `lsm=` or not.
        lsm: LsmMode,
    },
    /// The machine the runner runs on.
    Host,
}

impl Config {
    /// The node's name: `k5-10-bpf`, `k7-x-nobpf`, `host`.
    pub fn node_name(self) -> String {
        match self {
            Config::Vm { series, lsm } => {
                format!("k{}-{}", series.name().replace('.', "-"), lsm.name())
            }
            Config::Host => "host".to_string(),
        }
    }

    /// The open/exec backend this configuration must use, when the suite
    /// knows it: BPF-LSM where `bpf` is active and the kernel lets LSM
    /// programs resolve paths (5.11+), fmod_ret otherwise. The host is
    /// whatever its probe finds, unless `KRT_EXPECT_HOST=restricted` (CI)
    /// demands `none`.
    pub fn expected_open_exec(self, expect_host_restricted: bool) -> Option<&'static str> {
        match self {
            Config::Vm {
                series: KernelSeries::V5_10,
                ..
            } => Some("fmod_ret"),
            Config::Vm {
                lsm: LsmMode::Bpf, ..
            } => Some("bpf_lsm"),
            Config::Vm {
                lsm: LsmMode::NoBpf,
                ..
            } => Some("fmod_ret"),
            Config::Host => expect_host_restricted.then_some("none"),
        }
    }

    /// The node class a probe's open/exec backend makes.
    pub fn class_of(open_exec_backend: &str) -> NodeClass {
        if open_exec_backend == "none" {
            NodeClass::Restricted
        } else {
            NodeClass::Capable
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Config::Vm { series, lsm } => write!(f, "{} lsm={}", series.name(), lsm.name()),
            Config::Host => f.write_str("host"),
        }
    }
}

/// The VM configurations of `kernels × modes`, in that order (a kernel's
/// two modes together, as `vmtest matrix` orders them).
pub fn matrix(kernels: &[KernelSeries], modes: &[LsmMode]) -> Vec<Config> {
    let mut out = Vec::new();
    for &series in kernels {
        for &lsm in modes {
            out.push(Config::Vm { series, lsm });
        }
    }
    out
}

/// Parses `SERIES-LSM` (`6.12-bpf`, `5.10-nobpf`).
pub fn parse(s: &str) -> crate::Result<Config> {
    let bad = || {
        crate::Error::Config(format!(
            "{s:?} is not KERNEL-LSM, e.g. 6.12-bpf or 5.10-nobpf"
        ))
    };
    let (series, lsm) = s.trim().rsplit_once('-').ok_or_else(bad)?;
    Ok(Config::Vm {
        series: series.parse().map_err(|_| bad())?,
        lsm: lsm.parse().map_err(|_| bad())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_for_kernel_and_mode() {
        let names: Vec<String> = matrix(&KernelSeries::ALL, &LsmMode::ALL)
            .into_iter()
            .map(Config::node_name)
            .collect();
        assert_eq!(
            names,
            [
                "k5-10-bpf",
                "k5-10-nobpf",
                "k6-1-bpf",
                "k6-1-nobpf",
                "k6-12-bpf",
                "k6-12-nobpf",
                "k7-x-bpf",
                "k7-x-nobpf"
            ]
        );
        assert_eq!(Config::Host.node_name(), "host");
    }

    #[test]
    fn configurations_parse() {
        assert_eq!(
            parse("6.12-bpf").unwrap(),
            Config::Vm {
                series: KernelSeries::V6_12,
                lsm: LsmMode::Bpf
            }
        );
        assert_eq!(parse("7.x-nobpf").unwrap().node_name(), "k7-x-nobpf");
        assert!(parse("6.12").is_err());
        assert!(parse("6.2-bpf").is_err());
    }

    #[test]
    fn the_backend_table_follows_the_probe_rules() {
        let backend = |series, lsm| Config::Vm { series, lsm }.expected_open_exec(false);
        assert_eq!(backend(KernelSeries::V5_10, LsmMode::Bpf), Some("fmod_ret"));
        assert_eq!(backend(KernelSeries::V6_1, LsmMode::Bpf), Some("bpf_lsm"));
        assert_eq!(backend(KernelSeries::V7, LsmMode::NoBpf), Some("fmod_ret"));
        assert_eq!(Config::Host.expected_open_exec(false), None);
        assert_eq!(Config::Host.expected_open_exec(true), Some("none"));
        assert_eq!(Config::class_of("none"), NodeClass::Restricted);
        assert_eq!(Config::class_of("fmod_ret"), NodeClass::Capable);
    }
}
