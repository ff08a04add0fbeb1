//! The conformance suite: the same RuntimePolicy scenarios, end to end, on
//! every kernel of the matrix (5.10, 6.1, 6.12, 7.x, each booted with and
//! without `bpf` in `lsm=`) and on the host as a restricted node, all as
//! nodes of one real API server.
//!
//! The claim users buy is "this policy does the same thing on every kernel
//! we support"; this crate is where that claim is tested:
//!
//! - [`scenario`]: scenarios as data, one YAML file each under
//!   `conformance/scenarios/`, checked at load with the file and field
//!   named in every error, and the `--break` test mode that flips one
//!   expected outcome so a run must fail;
//! - [`results`]: what a run found, as a matrix (scenario by
//!   configuration, pass or FAIL with the first difference), JUnit XML
//!   and JSON;
//! - [`config`]: the configurations, their node names (`k6-12-bpf`) and
//!   the open/exec backend each must use;
//! - [`wire`] and [`prom`]: the bytes the workloads send (DNS questions and
//!   answers, an ssh banner, a TLS ClientHello with an ALPN) and the
//!   reading of the daemon's /metrics.
//!
//! The binary (`cargo run -p conformance -- --help`) is the runner: it
//! starts the local API server, boots each configuration in `vmtest`, plays
//! the kubelet inside (container cgroups in a real runtime's layout,
//! workload processes in them, Pod objects and their status), runs the real
//! daemon there, executes the scenarios in sequence, and prints the matrix.

pub mod config;
pub mod prom;
pub mod results;
pub mod scenario;
pub mod wire;

use std::path::PathBuf;

/// Errors of loading scenarios and of `--break`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The scenario directory holds no `*.yaml`.
    #[error("no scenarios (*.yaml) in {0}")]
    NoScenarios(PathBuf),
    /// The YAML does not fit the schema (serde names the field and line).
    #[error("{file}: {message}")]
    Syntax {
        /// The scenario file.
        file: String,
        /// serde's message.
        message: String,
    },
    /// The YAML fits the schema but says something impossible.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The scenario file.
        file: String,
        /// The field's path, e.g. `steps[3].exec.pod`.
        field: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// `--scenario` names no scenario.
    #[error("no scenario named {name:?} (there are: {known})")]
    UnknownScenario {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// `--break` cannot flip anything where it was pointed.
    #[error("--break: {0}")]
    Break(String),
    /// A configuration name that is not `KERNEL-LSM`.
    #[error("{0}")]
    Config(String),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
