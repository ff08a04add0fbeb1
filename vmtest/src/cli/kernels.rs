//! `vmtest kernels`: resolve and download kernels, print their versions.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use vmtest::{resolve_kernel, Cache, KernelSeries};

/// Arguments of `vmtest kernels`.
#[derive(Debug, Args)]
pub struct KernelsArgs {
    /// Kernel series to resolve, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5.10,6.1,6.12,7.x", value_parser = super::series_arg)]
    pub series: Vec<KernelSeries>,

    /// Print the resolved kernels as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Resolves every series; exits 1 if any failed.
pub fn exec(args: KernelsArgs) -> anyhow::Result<ExitCode> {
    let cache = Cache::from_env()?;
    let mut failed = false;
    let mut resolved = Vec::new();
    for series in args.series {
        let started = Instant::now();
        match resolve_kernel(series, &cache) {
            Ok(k) => {
                if !args.json {
                    println!(
                        "{:<5} {:<9} {:<28} {:<14} {:>5.1}s  {}",
                        k.series.name(),
                        k.series.suite(),
                        k.version,
                        k.package_version,
                        started.elapsed().as_secs_f64(),
                        k.vmlinuz.display()
                    );
                }
                resolved.push(k);
            }
            Err(e) => {
                failed = true;
                eprintln!("vmtest: kernel {series}: {e}");
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&resolved)?);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
