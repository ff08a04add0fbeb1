//! `kyverno-runtime collector`: the reference receiver of the push stream
//! (`--push-target`). Listens with mutual TLS only, writes every finding it
//! receives as one JSON line, and runs until SIGINT or SIGTERM.
//!
//! It is meant for trying the push stream out, for tests, and as the model
//! of a real collector; the JSON schema is
//! `kyverno_runtime_push::CollectedFinding`.

use anyhow::Context as _;
use clap::Args;
use kyverno_runtime_push::{open_output, Collector, ServerTls};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `kyverno-runtime collector`.
#[derive(Debug, Args)]
pub struct CollectorArgs {
    /// Address to listen on (port 0 picks a free one; the bound address is
    /// printed on stderr).
    #[arg(long, env = "KRT_COLLECTOR_LISTEN", default_value = "127.0.0.1:4317")]
    pub listen: SocketAddr,
    /// CA certificate (PEM) that the daemons' client certificates must be
    /// signed by; a client without one is refused.
    #[arg(long, env = "KRT_COLLECTOR_TLS_CA", value_name = "FILE")]
    pub tls_ca: PathBuf,
    /// The collector's certificate (PEM). Its names must include the host
    /// the daemons dial (their --push-target).
    #[arg(long, env = "KRT_COLLECTOR_TLS_CERT", value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// The collector certificate's private key (PEM).
    #[arg(long, env = "KRT_COLLECTOR_TLS_KEY", value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Accept a finding only from a client certificate that names its
    /// node (a DNS subject alternative name): one node cannot report for
    /// another. Needs a certificate per node, not the chart's shared one.
    #[arg(long, env = "KRT_COLLECTOR_BIND_NODE_IDENTITY")]
    pub bind_node_identity: bool,
    /// Where findings go, one JSON object per line: a file (created or
    /// appended to) or `-` for standard output.
    #[arg(
        long,
        env = "KRT_COLLECTOR_OUTPUT",
        value_name = "FILE|-",
        default_value = "-"
    )]
    pub output: PathBuf,
}

/// Runs the collector until SIGINT or SIGTERM.
pub fn run(args: CollectorArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: CollectorArgs) -> anyhow::Result<ExitCode> {
    let to_stdout = args.output == std::path::Path::new("-");
    let tls = ServerTls {
        ca: args.tls_ca,
        cert: args.tls_cert,
        key: args.tls_key,
    };
    // The TLS files are checked (and named when bad) before anything
    // listens.
    let collector = Collector::bind(args.listen, &tls)
        .await?
        .bind_node_identity(args.bind_node_identity);
    let out = open_output(&args.output).await?;
    // Installed before the address is announced, so a supervisor that
    // signals as soon as it reads the line is not too early.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    eprintln!(
        "kyverno-runtime collector listening on {} (mutual TLS)",
        collector.local_addr()
    );
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
    };
    match collector.serve(out, shutdown).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // Standard output failed: ends as every command's does (super::out):
        // the reader gone, quietly with 141; anything else, one error line.
        Err(kyverno_runtime_push::Error::Output { source }) if to_stdout => {
            Err(super::out::StdoutError(source).into())
        }
        Err(e) => Err(e.into()),
    }
}
