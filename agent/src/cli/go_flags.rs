//! The Go original's daemon flags that this daemon has no flag of the same
//! name for (README, "Flags of the Go original").
//!
//! A DaemonSet written for the Go original passes them (the chart's
//! `daemon.extraArgs`, or a copied manifest): they are accepted, so the
//! daemon starts, and each says in the log what it does here. They are
//! hidden flags beside [`DaemonArgs`] rather than aliases on its fields so
//! that every trace of the original stays in this one file: the renamed
//! ones (`--observe-interval`, `--event-buffer-size`) set the field of the
//! new name. The original's integer `--log-level` and klog's `-v` are read
//! by [`log_filter`].

use crate::daemon::{parse_duration, DaemonArgs};
use clap::Args;
use std::time::Duration;

/// The cluster domain this daemon recognizes in Service names
/// (`kyverno_runtime_policy::values::DEFAULT_CLUSTER_DOMAIN`).
const CLUSTER_DOMAIN: &str = "cluster.local";

/// `kyverno-runtime daemon`: this daemon's flags and the Go original's.
#[derive(Debug, Args)]
pub struct DaemonCommand {
    #[command(flatten)]
    pub args: DaemonArgs,
    #[command(flatten)]
    pub go: GoDaemonFlags,
}

/// Flags of the Go original's daemon with no flag of the same name here;
/// hidden from `--help`, which documents only this daemon's flags.
#[derive(Debug, Default, Args)]
pub struct GoDaemonFlags {
    /// The Go original's name of --drain-interval.
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub observe_interval: Option<Duration>,
    /// The Go original's name of --event-buffer.
    #[arg(long, hide = true)]
    pub event_buffer_size: Option<usize>,
    /// The Go original's --cluster-domain: accepted; this daemon
    /// recognizes Service names under cluster.local only.
    #[arg(long, hide = true)]
    pub cluster_domain: Option<String>,
    /// The Go original's --source-restart-backoff: accepted and ignored;
    /// a failed event source is restarted after 1 s, doubling up to 60 s.
    #[arg(long, hide = true, value_parser = parse_duration)]
    pub source_restart_backoff: Option<Duration>,
}

impl DaemonCommand {
    /// The daemon's arguments with the Go original's flags applied, one
    /// log line for each given: what it does here.
    pub fn into_args(self) -> DaemonArgs {
        let Self { mut args, go } = self;
        // The Go name, when given, sets the value: it is the one an old
        // manifest or extraArgs carries, and the chart never renders the
        // new name for it.
        if let Some(d) = go.observe_interval {
            tracing::warn!("--observe-interval={d:?} is the Go original's name of --drain-interval: set as --drain-interval");
            args.drain_interval = d;
        }
        if let Some(n) = go.event_buffer_size {
            tracing::warn!("--event-buffer-size={n} is the Go original's name of --event-buffer: set as --event-buffer");
            args.event_buffer = n;
        }
        if let Some(domain) = &go.cluster_domain {
            if domain.trim().trim_end_matches('.') == CLUSTER_DOMAIN {
                tracing::info!(
                    "--cluster-domain={domain} (a flag of the Go original): Service names are recognized under cluster.local, as asked"
                );
            } else {
                // The domain only decides whether a name is a Service or an
                // external domain, and the short form works in any cluster.
                tracing::warn!(
                    "--cluster-domain={domain} is ignored (a flag of the Go original): Service names are recognized as NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local only; write NAME.NAMESPACE.svc (NAME.NAMESPACE.svc.{domain} is treated as an external domain name)"
                );
            }
        }
        if let Some(d) = go.source_restart_backoff {
            tracing::warn!(
                "--source-restart-backoff={d:?} is ignored (a flag of the Go original): a failed event source is restarted after 1s, the delay doubling up to 60s"
            );
        }
        args
    }
}

/// The Go original's integer `--log-level` (and klog's `-v`): 0 is info,
/// 1 debug, 2 and more trace (the original logged V(2) and above there);
/// below 0 the original raised zap's level: -1 warn, -2 and below error.
fn verbosity_level(v: i64) -> &'static str {
    match v {
        i64::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    }
}

/// The `tracing` filter for `--log-level` and `-v`: `-v N` wins (a klog
/// verbosity), then a `--log-level` that is a bare integer (the Go
/// original's verbosity), then `--log-level` as a filter.
pub fn log_filter(log_level: &str, v: Option<i64>) -> String {
    if let Some(v) = v {
        return verbosity_level(v).to_owned();
    }
    match log_level.trim().parse::<i64>() {
        Ok(n) => verbosity_level(n).to_owned(),
        Err(_) => log_level.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};
    use std::time::Duration;

    /// Every flag of the Go original's daemon (cmd/kyverno-runtime/daemon.go:
    /// its six flags; cobra's -h aside), each as the original's chart or a
    /// user writes it, plus klog's -v.
    #[test]
    fn every_flag_of_the_go_original_parses_and_maps() {
        let cli = Cli::try_parse_from([
            "kyverno-runtime",
            "daemon",
            "--node-name=n",
            "--log-level=2",
            "--metrics-addr=:19090",
            "--cluster-domain=corp.example",
            "--observe-interval=1m30s",
            "--event-buffer-size",
            "4096",
            "--source-restart-backoff=5s",
            "-v",
            "4",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.log.log_level, "2");
        assert_eq!(cli.log.v, Some(4));
        let Command::Daemon(d) = cli.command else {
            panic!("not the daemon: {:?}", cli.command)
        };
        assert_eq!(d.go.cluster_domain.as_deref(), Some("corp.example"));
        assert_eq!(d.go.source_restart_backoff, Some(Duration::from_secs(5)));
        let d = d.into_args();
        assert_eq!(d.metrics_addr, ":19090");
        assert_eq!(d.drain_interval, Duration::from_secs(90));
        assert_eq!(d.event_buffer, 4096);
        // Flags the original does not have keep their defaults: no NRI
        // plugin unless asked for.
        assert_eq!(d.nri_socket, None);
    }

    /// The chart's `--nri-socket` (daemon.nri) parses to the path.
    #[test]
    fn the_nri_socket_is_optional_and_taken_as_written() {
        let cli = Cli::try_parse_from([
            "kyverno-runtime",
            "daemon",
            "--node-name=n",
            "--nri-socket=/var/run/nri/nri.sock",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let Command::Daemon(d) = cli.command else {
            panic!("not the daemon: {:?}", cli.command)
        };
        assert_eq!(
            d.into_args().nri_socket.as_deref(),
            Some(std::path::Path::new("/var/run/nri/nri.sock"))
        );
    }

    /// `--v=N` (klog's long form) and `-vN` parse too.
    #[test]
    fn klog_verbosity_forms() {
        for form in [&["--v=3"][..], &["--v", "3"], &["-v3"], &["-v=3"]] {
            let mut args = vec!["kyverno-runtime", "daemon", "--node-name=n"];
            args.extend_from_slice(form);
            let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{form:?}: {e}"));
            assert_eq!(cli.log.v, Some(3), "{form:?}");
        }
    }

    #[test]
    fn integer_log_levels_are_the_go_originals_verbosity() {
        assert_eq!(log_filter("0", None), "info");
        assert_eq!(log_filter("1", None), "debug");
        assert_eq!(log_filter(" 2", None), "trace");
        assert_eq!(log_filter("-1", None), "warn");
        assert_eq!(log_filter("-5", None), "error");
        assert_eq!(log_filter("info,kube=warn", None), "info,kube=warn");
        // -v wins over --log-level: the chart always renders --log-level.
        assert_eq!(log_filter("info", Some(1)), "debug");
        assert_eq!(log_filter("warn", Some(0)), "info");
    }

    /// The Go-original flags stay out of `--help`.
    #[test]
    fn go_original_flags_are_hidden() {
        let cmd = Cli::command();
        let daemon = cmd
            .find_subcommand("daemon")
            .unwrap_or_else(|| panic!("no daemon subcommand"));
        let mut hidden = 0;
        for arg in daemon.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(
                id,
                "observe_interval"
                    | "event_buffer_size"
                    | "cluster_domain"
                    | "source_restart_backoff"
            ) {
                assert!(arg.is_hide_set(), "{id} is shown in --help");
                hidden += 1;
            }
        }
        assert_eq!(hidden, 4);
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
