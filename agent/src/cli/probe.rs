//! `kyverno-runtime probe`: the kernel capability table and backend plan.

use anyhow::Context as _;
use clap::Args;
use kyverno_runtime_compat::{
    LiveHost, Measurements, OpenExecBackend, Overrides, ProbeReport, Prober,
};
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `kyverno-runtime probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print the report as JSON (schema: docs/probe-json.md).
    #[arg(long)]
    pub json: bool,
    /// Force the open/exec backend instead of the probe's choice:
    /// auto, bpf_lsm, fmod_ret or none.
    #[arg(long, env = "KRT_OPEN_EXEC", default_value = "auto", value_parser = parse_open_exec)]
    pub open_exec: OpenExecBackend,
    /// Derive the plan from recorded measurements (a `probe --json` file)
    /// instead of probing this kernel.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
}

fn parse_open_exec(s: &str) -> Result<OpenExecBackend, String> {
    s.parse()
        .map_err(|e: kyverno_runtime_compat::Error| e.to_string())
}

/// Probes (or reads recorded measurements) and prints the report.
pub fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let overrides = Overrides {
        open_exec: args.open_exec,
    };
    let measurements = match &args.from {
        Some(path) => {
            let text = super::input::read_text(path)?;
            let m: Measurements = serde_json::from_str(&text)
                .with_context(|| format!("{} is not probe JSON", path.display()))?;
            m
        }
        None => Prober::new(LiveHost).measurements().clone(),
    };
    let report = ProbeReport::new(measurements, &overrides);
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        crate::out!("{}", report.to_table())?;
    }
    Ok(ExitCode::SUCCESS)
}
