//! `kyverno-runtime crd`: the CRD manifests generated from the API types.

use anyhow::Context as _;
use clap::Args;
use kyverno_runtime_api::crd;
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `kyverno-runtime crd`.
#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Print every CRD the chart installs (RuntimePolicy and the OpenReports
    /// Report and ClusterReport), not only RuntimePolicy.
    #[arg(long)]
    pub all: bool,
    /// Write every CRD into the chart at this directory (normally
    /// charts/kyverno-runtime: RuntimePolicy into crds/, the OpenReports
    /// CRDs into files/openreports/) instead of printing.
    #[arg(long, value_name = "CHART_DIR")]
    pub write: Option<PathBuf>,
}

/// Prints or writes the CRDs.
pub fn run(args: CrdArgs) -> anyhow::Result<ExitCode> {
    if let Some(chart) = &args.write {
        for file in crd::all() {
            // `dir` is relative to the repository root; the chart is its
            // first two components.
            let sub = file.dir.trim_start_matches("charts/kyverno-runtime/");
            let dir = chart.join(sub);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(file.file_name);
            std::fs::write(&path, crd::to_yaml(&file.crd)?)
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.all {
        let docs: Vec<String> = crd::all()
            .iter()
            .map(|f| crd::to_yaml(&f.crd))
            .collect::<Result<_, _>>()?;
        crate::out!("{}", docs.join("---\n"))?;
    } else {
        crate::out!("{}", crd::to_yaml(&crd::runtime_policy())?)?;
    }
    Ok(ExitCode::SUCCESS)
}
