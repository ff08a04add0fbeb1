//! `kyverno-runtime daemon`: the single wiring site.
//!
//! It probes the kernel, loads the backends the plan names, and joins every
//! long-running part in one task group under the signal handler, the way
//! the specification's `runDaemon` does:
//!
//! ```text
//! metrics + /healthz (--metrics-addr)                    -> task
//! ClusterWatcher (Nodes, own DaemonSet and pods)         -> task -> ClusterView
//! FlushLoop (status shards, every --status-interval)     -> task (final flush on shutdown)
//! engine: RuntimePolicy + Namespace watches, synced
//!         -> then the Pod watch (spec.nodeName=NODE)     -> task
//!         -> open/exec, egress, protocol and DNS managers
//!         -> evaluationInterval re-evaluation
//! event plane (kyverno_runtime_plane::Collector)         -> task
//!   sources: openexec-observe, egress-observe (counter polls through
//!            the engine, every --drain-interval), openexec-denials,
//!            exec-trace, dnsquery (ring buffers, read as records arrive)
//!   -> attribution (cgroup id, pod uid, pid -> pod)
//!   -> monitor (policies' matchers, monitorFilter) -> Reports, push
//! ```
//!
//! A fatal error in any task shuts the whole daemon down (non-zero exit),
//! as does SIGTERM or SIGINT (zero exit, after a final status flush bounded
//! by `--shutdown-timeout`). Pinned BPF state is left in place across a
//! restart, and adopted and reconciled by the next start; it is removed
//! only when the daemon finds at shutdown that its own DaemonSet is gone
//! (an uninstall), or by `kyverno-runtime cleanup`.

mod api_health;
pub(crate) mod convert;
mod data;
mod data_guard;
mod dns_resolvers;
mod engine;
mod load;
mod losses;
mod nri;
mod pod_dirs;
mod resolve;
mod retry;
mod services;
mod startup_gate;
mod taint;
mod watches;

use anyhow::Context as _;
use clap::Args;
use engine::{Engine, Slot};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;
use kyverno_runtime_api::runtimepolicy::RuntimePolicyMode as Mode;
use kyverno_runtime_bpf::exectrace::ExecTracer;
use kyverno_runtime_bpf::openexec::Denial;
use kyverno_runtime_bpf::ring::RecordReader;
use kyverno_runtime_compat::OpenExecBackend;
use kyverno_runtime_metrics::{ApiResource, Health, Metrics};
use kyverno_runtime_metrics::{DropReason, SourceFailureReason};
use kyverno_runtime_plane::{Collector, Index, Monitor, PollSource, RingSource};
use kyverno_runtime_policy::values::BehaviorKind as Kind;
use kyverno_runtime_status::{ClusterWatcher, FlushLoop, Placement, Reports, StatusWriter};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use watches::lock;

pub use convert::parse_duration;
pub use startup_gate::run_as_gate;

/// The namespaces enforce policies leave alone: `--protected-namespaces`
/// and the daemon's own, unless `--enforce-protected-namespaces`.
fn protected_namespaces(args: &DaemonArgs) -> std::collections::BTreeSet<String> {
    if args.enforce_protected_namespaces {
        return std::collections::BTreeSet::new();
    }
    args.protected_namespaces
        .iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .chain(args.pod_namespace.clone())
        .collect()
}

/// A `--data-http-allow` prefix: an address or CIDR.
fn parse_prefix(s: &str) -> Result<kyverno_runtime_bpf::egress::Prefix, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("{s:?} is not an address or CIDR: {e}"))
}

/// Flags of `kyverno-runtime daemon`; each has an environment variable.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// This node's name (the chart injects it from spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The namespace of the daemon's own DaemonSet (the chart injects it);
    /// with --daemonset-name it tells status which nodes must report.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The daemon's own DaemonSet (the chart injects it).
    #[arg(long, env = "DAEMONSET_NAME")]
    pub daemonset_name: Option<String>,
    /// Address of /metrics and /healthz; empty disables the endpoint (not
    /// the counters).
    #[arg(long, env = "KRT_METRICS_ADDR", default_value = ":9090")]
    pub metrics_addr: String,
    /// How often this node's status shards are written.
    #[arg(long, env = "KRT_STATUS_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub status_interval: Duration,
    /// How often the kernel counters are drained.
    #[arg(long, env = "KRT_DRAIN_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub drain_interval: Duration,
    /// Per-occurrence refusal records (pid, comm, path) each cgroup may
    /// send per second; refusals beyond are counted, not recorded, and 0
    /// records none.
    #[arg(long, env = "KRT_DENIAL_RECORDS_PER_SECOND", default_value_t = 50)]
    pub denial_records_per_second: u32,
    /// Node and cluster-internal prefixes (loopback, private, shared,
    /// unique local) `http.get` data sources may fetch from, comma-separated
    /// or repeated; none by default. Link-local and cloud metadata
    /// addresses are never fetched.
    #[arg(long, env = "KRT_DATA_HTTP_ALLOW", value_delimiter = ',', value_parser = parse_prefix)]
    pub data_http_allow: Vec<kyverno_runtime_bpf::egress::Prefix>,
    /// The DNS resolvers whose answers may teach policies naming domains
    /// their addresses, comma-separated or repeated: IP addresses, or
    /// `auto` (the nameservers of this process's /etc/resolv.conf, loopback
    /// skipped). An answer from any other address, or to no question the
    /// pod asked one of them, teaches nothing.
    #[arg(
        long,
        env = "KRT_DNS_RESOLVERS",
        value_delimiter = ',',
        default_value = "auto",
        value_parser = dns_resolvers::parse_dns_resolver
    )]
    pub dns_resolvers: Vec<dns_resolvers::DnsResolver>,
    /// Namespaces whose pods no enforce policy enforces on, comma-separated
    /// or repeated (the daemon's own namespace, `--pod-namespace`, is
    /// always one): a policy selecting their pods says so in its status,
    /// and monitor policies still observe them.
    #[arg(
        long,
        env = "KRT_PROTECTED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    pub protected_namespaces: Vec<String>,
    /// Enforce on the protected namespaces' pods too (the operator's
    /// explicit choice: one policy can then cut every node's daemon off
    /// the API server, or stop the cluster's control pods).
    #[arg(long, env = "KRT_ENFORCE_PROTECTED_NAMESPACES")]
    pub enforce_protected_namespaces: bool,
    /// Show the values a policy computed from fetched data in its status,
    /// its evaluation errors and the logs. Hidden by default: a policy
    /// author could otherwise read through the daemon what its service
    /// account reads.
    #[arg(long, env = "KRT_SHOW_DATA_VALUES")]
    pub show_data_values: bool,
    /// Events the event plane holds before it drops the newest (counted
    /// as buffer_full).
    #[arg(long, env = "KRT_EVENT_BUFFER", default_value_t = 65_536)]
    pub event_buffer: usize,
    /// bpffs directory where programs and maps are pinned so enforcement
    /// survives a restart of the daemon.
    /// The default is the host's bpffs through PID 1's root, which is the
    /// same directory on a node and the only way to it from the chart's
    /// pod (hostPID, no host mounts). It must be a directory below a bpffs
    /// root; the daemon marks it as its own before it pins anything.
    #[arg(
        long,
        env = "KRT_PIN_DIR",
        default_value = kyverno_runtime_bpf::pins::DEFAULT_PIN_DIR
    )]
    pub pin_dir: PathBuf,
    /// The cgroup v2 (or v1 fallback) root under which container cgroups
    /// are found; by default the cgroup mount in /proc/self/mountinfo.
    #[arg(long, env = "KRT_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,
    /// Force the open/exec backend instead of the probe's choice: auto,
    /// bpf_lsm, fmod_ret or none.
    #[arg(long, env = "KRT_OPEN_EXEC", default_value = "auto", value_parser = parse_open_exec)]
    pub open_exec: OpenExecBackend,
    /// Turn on the kernel's BPF run-time statistics (a few ns per program
    /// run) so /metrics reports the time spent in each program.
    #[arg(long, env = "KRT_BPF_STATS")]
    pub bpf_stats: bool,
    /// Upper bound on the shutdown: the final status flush and cleanup.
    #[arg(long, env = "KRT_SHUTDOWN_TIMEOUT", default_value = "8s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// Write OpenReports Reports (the chart's daemon.reports.enabled).
    #[arg(long, env = "KRT_REPORTS_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub reports_enabled: bool,
    /// How often Reports are flushed.
    #[arg(long, env = "KRT_REPORT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub report_interval: Duration,
    /// Emit Kubernetes Events (PolicyViolation, ...).
    #[arg(long, env = "KRT_EVENTS_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub events_enabled: bool,
    /// Stream findings to this collector (HOST:PORT) over mutual TLS.
    #[arg(long, env = "KRT_PUSH_TARGET")]
    pub push_target: Option<String>,
    /// CA certificate for the push target.
    #[arg(long, env = "KRT_PUSH_TLS_CA")]
    pub push_tls_ca: Option<PathBuf>,
    /// Client certificate for the push target.
    #[arg(long, env = "KRT_PUSH_TLS_CERT")]
    pub push_tls_cert: Option<PathBuf>,
    /// Client key for the push target.
    #[arg(long, env = "KRT_PUSH_TLS_KEY")]
    pub push_tls_key: Option<PathBuf>,
    /// A taint key (e.g. `kyverno-runtime.io/agent-not-ready`) the daemon
    /// removes from its Node once it has listed every policy, namespace and
    /// pod of the node and programmed them: with the kubelet's
    /// `registerWithTaints` putting `KEY:NoExecute` on a joining node, no
    /// workload runs there before the daemon enforces. Empty: off.
    #[arg(long, env = "KRT_STARTUP_TAINT", default_value = "")]
    pub startup_taint: String,
    /// The container runtime's NRI socket (containerd's and CRI-O's
    /// default: `/var/run/nri/nri.sock`): the daemon registers an NRI
    /// plugin there and programs each container before its process
    /// starts. Unset: off (containers are programmed once their Pod's
    /// status names them, after they started). An absent socket is tried
    /// again every second (a dropped registration at once).
    #[arg(long, env = "KRT_NRI_SOCKET")]
    pub nri_socket: Option<PathBuf>,
    /// The longest a container's start waits for the daemon (NRI): past
    /// it the start goes ahead and is counted late. At most 1.5s (the
    /// runtime drops a plugin that takes 2 s).
    #[arg(long, env = "KRT_NRI_ANSWER_WITHIN", default_value = "1s", value_parser = parse_duration)]
    pub nri_answer_within: Duration,
    /// Where no runtime hook announces containers before they start (no
    /// NRI socket, or NRI not registered yet or any more): bind each pod's
    /// own cgroup directory to the open/exec policies selecting the pod as
    /// soon as the kubelet creates it, and let the kernel decide for a
    /// container not known yet by its pod's directory, so it is enforced
    /// from its first instruction. Needs cgroup v2.
    #[arg(long, env = "KRT_POD_CGROUP_FALLBACK", default_value_t = true, action = clap::ArgAction::Set)]
    pub pod_cgroup_fallback: bool,
    /// The startup gate for a rebooted node: the daemon installs its binary
    /// as an NRI plugin the container runtime starts with itself, which
    /// refuses to create containers (the kubelet retries) until this daemon
    /// enforces again after the node booted. Off: a gate this daemon
    /// installed before is removed.
    #[arg(long, env = "KRT_STARTUP_GATE", default_value_t = false, action = clap::ArgAction::Set)]
    pub startup_gate: bool,
    /// The longest the startup gate holds containers after the runtime
    /// started; past it they are created (a daemon that does not come back
    /// must not keep a node's workloads down).
    #[arg(long, env = "KRT_STARTUP_GATE_HOLD_AT_MOST", default_value = "10m", value_parser = parse_duration)]
    pub startup_gate_hold_at_most: Duration,
    /// Namespaces the startup gate never holds, beside the daemon's own,
    /// kube-system and --protected-namespaces (comma-separated).
    #[arg(long, env = "KRT_STARTUP_GATE_NOT_HELD", value_delimiter = ',')]
    pub startup_gate_not_held: Vec<String>,
    /// The runtime's NRI plugin directory (containerd's `plugin_path`),
    /// where the startup gate is installed.
    #[arg(long, env = "KRT_NRI_PLUGIN_DIR", default_value = "/opt/nri/plugins")]
    pub nri_plugin_dir: PathBuf,
    /// The runtime's NRI plugin configuration directory (containerd's
    /// `plugin_config_path`), where the startup gate's configuration goes.
    #[arg(
        long,
        env = "KRT_NRI_PLUGIN_CONFIG_DIR",
        default_value = "/etc/nri/conf.d"
    )]
    pub nri_plugin_config_dir: PathBuf,
}

fn parse_open_exec(s: &str) -> Result<OpenExecBackend, String> {
    s.parse()
        .map_err(|e: kyverno_runtime_compat::Error| e.to_string())
}

/// Parses `--metrics-addr`: empty is "no endpoint", `:PORT` is every
/// address on PORT (as the Go original writes it), `HOST:PORT` one
/// address. An IPv6 host may come without brackets (the chart substitutes
/// the pod's IP, `$(POD_IP):PORT`): the part after the last `:` is the
/// port.
fn metrics_addr(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let port_only = s
        .strip_prefix(':')
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let full = if port_only {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    if let Ok(addr) = full.parse() {
        return Ok(Some(addr));
    }
    let unbracketed = full.rsplit_once(':').and_then(|(host, port)| {
        let ip: std::net::Ipv6Addr = host.parse().ok()?;
        Some(SocketAddr::from((ip, port.parse::<u16>().ok()?)))
    });
    unbracketed
        .map(Some)
        .with_context(|| format!("--metrics-addr {s:?} is not HOST:PORT or :PORT"))
}

/// Refuses what this build cannot do, before anything is loaded: a daemon
/// that silently ignores a configured sink is worse than one that says so.
fn refuse_unbuilt(args: &DaemonArgs) -> anyhow::Result<()> {
    if args.events_enabled && !args.reports_enabled {
        // Finding Events are emitted from the reporter's flush.
        anyhow::bail!("--events-enabled needs --reports-enabled=true (Events are emitted from the reporter's flush)");
    }
    if args.node_name.trim().is_empty() {
        anyhow::bail!("--node-name (NODE_NAME) is empty");
    }
    if args.nri_answer_within > kyverno_runtime_nri::MAX_ANSWER_WITHIN {
        anyhow::bail!(
            "--nri-answer-within (KRT_NRI_ANSWER_WITHIN): {:?} is more than {:?}; the runtime drops an NRI plugin that takes 2 s",
            args.nri_answer_within,
            kyverno_runtime_nri::MAX_ANSWER_WITHIN
        );
    }
    if let Some(socket) = args.nri_socket.as_ref().filter(|s| !s.is_absolute()) {
        anyhow::bail!(
            "--nri-socket (KRT_NRI_SOCKET): {} is not an absolute path on the node",
            socket.display()
        );
    }
    Ok(())
}

/// Runs the daemon until a signal or a fatal error.
pub fn run(args: DaemonArgs) -> anyhow::Result<ExitCode> {
    refuse_unbuilt(&args)?;
    let metrics_addr = metrics_addr(&args.metrics_addr)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(args, metrics_addr))
}

/// What the event plane's sources are built from.
struct Sources {
    has_openexec: bool,
    openexec_reason: Option<String>,
    has_egress: bool,
    egress_reason: Option<String>,
    dns_reason: Option<String>,
    dns_reader: Option<kyverno_runtime_bpf::dns::DnsReader>,
    denials: Result<RecordReader<Denial>, String>,
    tracer: Option<Arc<ExecTracer>>,
}

/// The policies a loss of records of `kinds` in `mode` touches, read from
/// the engine when the loss is said.
fn affected(
    engine: &watches::SharedEngine,
    mode: Option<Mode>,
    kinds: &'static [Kind],
) -> impl Fn() -> Vec<String> + Send + 'static {
    let e = engine.clone();
    move || lock(&e).policies_with(mode, kinds)
}

/// Adds every source the node can run to the collector, and registers the
/// others as failed with the reason (so status says why, not just "no").
fn add_sources(
    collector: &mut Collector,
    engine: &watches::SharedEngine,
    args: &DaemonArgs,
    s: Sources,
) {
    let init = SourceFailureReason::InitializationFailed;
    if s.has_openexec {
        let e = engine.clone();
        collector.add_source(Box::new(PollSource::new(
            engine::OPENEXEC_SOURCE,
            args.drain_interval,
            move || lock(&e).poll_openexec(),
        )));
    } else {
        let reason = s.openexec_reason.unwrap_or_default();
        collector.register_failed(engine::OPENEXEC_SOURCE, init, &reason);
    }
    match s.denials {
        Ok(reader) => {
            // What the per-cgroup budget or a full ring left out is still
            // counted (as a counter observation), but its detail is not.
            let e = engine.clone();
            let mut seen: Option<(u64, u64)> = None;
            let losses = Box::new(move || {
                let Some(stats) = lock(&e).openexec_stats() else {
                    return Vec::new();
                };
                let now = (stats.denials_rate_limited, stats.denials_ringbuf_full);
                let before = seen.replace(now).unwrap_or(now);
                vec![
                    (DropReason::rate_limited, now.0.saturating_sub(before.0)),
                    (DropReason::ringbuf_full, now.1.saturating_sub(before.1)),
                ]
            });
            let log = losses::LossLog::new(
                engine::DENIALS_SOURCE,
                "open/exec refusal records",
                "the refusals are still counted in the findings of the enforce policies \
                 named, without their detail",
                losses::LOSS_LOG_INTERVAL,
            );
            let losses = losses::logged(
                log,
                losses,
                affected(engine, Some(Mode::Enforce), &[Kind::Exec, Kind::Open]),
            );
            collector.add_source(Box::new(
                RingSource::new(engine::DENIALS_SOURCE, reader, |d| {
                    vec![engine::denial_event(d)]
                })
                .with_losses(losses),
            ));
        }
        Err(reason) => collector.register_failed(engine::DENIALS_SOURCE, init, &reason),
    }
    if let Some(tracer) = s.tracer {
        match tracer.reader() {
            Ok(reader) => {
                let mut seen: Option<u64> = None;
                let losses = Box::new(move || match tracer.read_stats() {
                    Ok(stats) => {
                        let before = seen.replace(stats.ringbuf_full).unwrap_or(0);
                        vec![(
                            DropReason::ringbuf_full,
                            stats.ringbuf_full.saturating_sub(before),
                        )]
                    }
                    Err(_) => Vec::new(),
                });
                let log = losses::LossLog::new(
                    engine::EXEC_TRACE_SOURCE,
                    "exec records",
                    "the findings of the monitor policies named miss those execs",
                    losses::LOSS_LOG_INTERVAL,
                );
                let losses = losses::logged(
                    log,
                    losses,
                    affected(engine, Some(Mode::Monitor), &[Kind::Exec]),
                );
                collector.add_source(Box::new(
                    RingSource::new(engine::EXEC_TRACE_SOURCE, reader, engine::exec_events)
                        .with_losses(losses),
                ));
            }
            Err(e) => collector.register_failed(engine::EXEC_TRACE_SOURCE, init, &e.to_string()),
        }
    }
    if s.has_egress {
        let e = engine.clone();
        collector.add_source(Box::new(PollSource::new(
            engine::EGRESS_SOURCE,
            args.drain_interval,
            move || lock(&e).poll_egress(),
        )));
    } else {
        let reason = s.egress_reason.unwrap_or_default();
        collector.register_failed(engine::EGRESS_SOURCE, init, &reason);
    }
    match s.dns_reader {
        Some(reader) => {
            let e = engine.clone();
            collector.add_source(Box::new(
                RingSource::new(engine::DNS_SOURCE, reader.into_records(), |q| {
                    vec![engine::dns_event(q)]
                })
                .with_losses(losses::logged(
                    losses::LossLog::new(
                        engine::DNS_SOURCE,
                        "DNS question records",
                        "the DNS findings of the policies named miss those questions",
                        losses::LOSS_LOG_INTERVAL,
                    ),
                    Box::new(move || lock(&e).dns_losses()),
                    affected(engine, None, &[Kind::Dns]),
                )),
            ));
        }
        None => {
            let reason = s
                .dns_reason
                .unwrap_or_else(|| "the DNS question ring buffer could not be opened".into());
            collector.register_failed(engine::DNS_SOURCE, init, &reason);
        }
    }
}

async fn run_async(args: DaemonArgs, metrics_addr: Option<SocketAddr>) -> anyhow::Result<ExitCode> {
    let loaded = load::load_backends(&args);
    let mut backends = kyverno_runtime_status::backends(&loaded.plan);
    if let Some(reason) = &loaded.fallback {
        retry::with_fallback(&mut backends, reason);
    }
    crate::cli::input::check_kubeconfig()?;
    let mut config = kube::Config::infer()
        .await
        .context("connecting to the API server (in-cluster config or KUBECONFIG)")?;
    // kube's default retry layer re-sends a request answered 429, 503 or
    // 504 up to 15 times, its backoff growing to minutes (about 164 s in
    // all), before the caller sees the answer: a throttled status, Report
    // or Event write would stall its loop that long with nothing said
    // (issue 34, item 6). The daemon's write loops retry each kind with
    // their own bounded backoff and count every refusal (api_health), so
    // they see each answer.
    config.default_retry = false;
    let client = kube::Client::try_from(config)
        .context("connecting to the API server (in-cluster config or KUBECONFIG)")?;

    let metrics = Arc::new(Metrics::new());
    // A load that failed where the kernel can serve the behavior is retried
    // (issue 25); the shard says so meanwhile.
    let retries = retry::Retries::from_start(
        &loaded,
        load::LoadConfig::new(&args, &loaded.plan),
        metrics.clone(),
    );
    retries.mark(&mut backends);
    let health = Arc::new(Health::new(args.drain_interval.saturating_mul(3)));
    let reports = Reports::new();
    let resolver = resolve::CgroupResolver::new(args.cgroup_root.clone())
        .context("finding the cgroup mount")?;
    // The push sink reads its CA, certificate and key now: a daemon that
    // cannot push must not start as if it could.
    let push = match &args.push_target {
        None => None,
        Some(target) => {
            let (Some(ca), Some(cert), Some(key)) =
                (&args.push_tls_ca, &args.push_tls_cert, &args.push_tls_key)
            else {
                anyhow::bail!("--push-target needs --push-tls-ca, --push-tls-cert and --push-tls-key (mutual TLS only)");
            };
            let m = metrics.clone();
            let on_drop: kyverno_runtime_push::DropHook = Arc::new(move |reason, n| {
                use kyverno_runtime_metrics::DropReason as M;
                use kyverno_runtime_push::PushDrop as P;
                let reason = match reason {
                    P::QueueFull => M::queue_full,
                    P::SendFailed => M::send_failed,
                    P::Shutdown => M::shutdown,
                };
                m.events_dropped("pushsink", reason, n);
            });
            let config = kyverno_runtime_push::PushConfig::new(
                target.clone(),
                ca.clone(),
                cert.clone(),
                key.clone(),
                args.node_name.clone(),
            );
            Some(
                kyverno_runtime_push::PushSink::new(config, Some(on_drop))
                    .context("--push-target")?,
            )
        }
    };
    let recorder = args.events_enabled.then(|| {
        // The recorder counts its own drops (budgets, queue, shutdown) and
        // every write, failures by reason.
        let options = kyverno_runtime_events::RecorderOptions {
            metrics: Some(metrics.clone()),
            ..kyverno_runtime_events::RecorderOptions::new(args.node_name.clone())
        };
        kyverno_runtime_events::Recorder::new(client.clone(), options)
    });
    let reporter = args.reports_enabled.then(|| {
        let (m1, m2, m3) = (metrics.clone(), metrics.clone(), metrics.clone());
        kyverno_runtime_report::Reporter::new(
            client.clone(),
            kyverno_runtime_report::ReporterOptions {
                interval: args.report_interval,
                on_drop: Some(Arc::new(move |reason, n| {
                    use kyverno_runtime_metrics::DropReason as M;
                    use kyverno_runtime_report::DropReason as R;
                    let reason = match reason {
                        R::BufferFull => M::buffer_full,
                        R::Unattributed => M::unattributed,
                        R::WriteFailed => M::write_failed,
                        R::Shutdown => M::shutdown,
                        R::PolicyDeleted => M::policy_deleted,
                    };
                    m1.events_dropped("reporter", reason, n);
                })),
                on_write: Some(Arc::new(move |result| {
                    use kyverno_runtime_metrics::ReportWriteResult as M;
                    use kyverno_runtime_report::WriteResult as R;
                    match result {
                        R::Created | R::Updated => m2.report_write(M::success),
                        R::Conflict => m2.report_write(M::conflict),
                        R::Error => m2.report_write(M::error),
                        R::Unchanged => {}
                    }
                })),
                // How a write failed (refused, 5xx, no answer), for the
                // API health.
                on_write_error: Some(Arc::new(move |e| {
                    let api = m3.api();
                    api.failed(
                        ApiResource::reports,
                        api_health::client_failure(e),
                        api.now(),
                    );
                })),
                on_flush: recorder.as_ref().map(|r| r.handle().flush_sink()),
                // Spreads the cleanup of a deleted policy's results over
                // the nodes.
                node: args.node_name.clone(),
                ..Default::default()
            },
        )
    });
    if reporter.is_none() {
        tracing::info!("--reports-enabled=false: findings are counted, not written");
    }

    // The event plane: attribution, then the monitor, whose findings go to
    // the reporter and the push stream.
    let sinks = engine::FindingSinks {
        reporter: reporter.as_ref().map(|r| r.handle()),
        push: push.as_ref().map(|p| p.handle()),
    };
    // A refusal by a policy's old lists can reach the monitor one drain
    // after the policy was reprogrammed: its old form explains it that long.
    let monitor = Arc::new(
        Monitor::new(vec![Arc::new(sinks)], Some(metrics.clone()))
            .with_previous_grace(args.drain_interval.saturating_mul(2)),
    );
    let index = Arc::new(Index::new(
        Some(metrics.clone()),
        "/proc",
        resolver.v2_root(),
    ));
    let mut collector = Collector::new(args.event_buffer, Some(metrics.clone()));
    collector.add_stage(index.clone());
    collector.add_sink(monitor.clone());
    {
        let health = health.clone();
        collector.on_heartbeat(move || health.collector_tick());
    }
    let tracer = match loaded.tracer {
        Ok(t) => Some(Arc::new(t)),
        Err((kind, reason)) => {
            collector.register_failed(engine::EXEC_TRACE_SOURCE, kind, &reason);
            None
        }
    };
    let has_openexec = matches!(loaded.openexec, Slot::Ready(_));
    let has_egress =
        matches!(loaded.egress, Slot::Ready(_)) || matches!(loaded.protocol, Slot::Ready(_));
    let openexec_reason = loaded.openexec.reason().map(str::to_string);
    let egress_reason = loaded.egress.reason().map(str::to_string);
    let dns_reason = loaded.dns.reason().map(str::to_string);
    let engine = Arc::new(Mutex::new(Engine::new(engine::Parts {
        node: args.node_name.clone(),
        backends,
        openexec: loaded.openexec,
        egress: loaded.egress,
        protocol: loaded.protocol,
        dns: loaded.dns,
        resolver,
        reports: reports.clone(),
        metrics: metrics.clone(),
        plane: engine::Plane {
            index,
            monitor,
            tracer: tracer.clone().map(|t| -> Arc<dyn engine::ExecGate> { t }),
            sources: collector.states(),
        },
    })));
    add_sources(
        &mut collector,
        &engine,
        &args,
        Sources {
            has_openexec,
            openexec_reason,
            has_egress,
            egress_reason,
            dns_reason,
            dns_reader: loaded.dns_reader,
            denials: loaded.denials,
            tracer,
        },
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        // Resolves once shutdown is asked for (or the sender is gone).
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut tasks: JoinSet<(&'static str, anyhow::Result<()>)> = JoinSet::new();

    {
        let (metrics, health, stop) = (metrics.clone(), health.clone(), stopped(stop_rx.clone()));
        tasks.spawn(async move {
            let r = kyverno_runtime_metrics::serve(
                metrics_addr,
                metrics,
                health,
                |addr| tracing::info!(%addr, "serving /metrics and /healthz"),
                stop,
            )
            .await
            .map_err(anyhow::Error::from);
            ("metrics", r)
        });
    }

    {
        // Says when the API server stops answering (see api_health).
        let (client, metrics, stop) = (client.clone(), metrics.clone(), stopped(stop_rx.clone()));
        tasks.spawn(async move {
            api_health::run(client, metrics, stop).await;
            ("api health", Ok(()))
        });
    }

    let placement = match (&args.pod_namespace, &args.daemonset_name) {
        (Some(namespace), Some(daemonset)) => Some(Placement {
            namespace: namespace.clone(),
            daemonset: daemonset.clone(),
            pod_selector: None,
        }),
        _ => {
            tracing::warn!("POD_NAMESPACE or DAEMONSET_NAME unset: which nodes must report is unknown, so availability reads Unknown");
            None
        }
    };
    // Whether our DaemonSet was deleted, as its watch delivered it: by the
    // time SIGTERM arrives on `helm uninstall` the RBAC objects may already
    // be gone, so the answer must be known before, not asked after.
    let uninstalling = Arc::new(AtomicBool::new(false));
    // The startup gate's files on the node (through PID 1's root in a
    // pod): installed or removed now, opened once the daemon enforces,
    // removed at an uninstall.
    let (gate_paths, gate_config) = startup_gate::configured(
        &args,
        &kyverno_runtime_compat::HostMounts::locate(&kyverno_runtime_compat::LiveHost).1,
        protected_namespaces(&args)
            .into_iter()
            .chain(args.pod_namespace.clone()),
    );
    startup_gate::set_up(&gate_paths, &gate_config, args.startup_gate);
    if let Some(p) = placement.clone() {
        let (client, flag, stop) = (
            client.clone(),
            uninstalling.clone(),
            stopped(stop_rx.clone()),
        );
        tasks.spawn(async move {
            tokio::select! {
                () = watch_own_daemonset(client, p, flag) => ("daemonset watch", Err(anyhow::anyhow!("the DaemonSet watch ended"))),
                () = stop => ("daemonset watch", Ok(())),
            }
        });
    }
    let view = match placement.clone() {
        Some(p) => {
            let (watcher, view) = ClusterWatcher::new(client.clone(), p);
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                tokio::select! {
                    () = watcher.run() => ("cluster watcher", Err(anyhow::anyhow!("the cluster watch ended"))),
                    () = stop => ("cluster watcher", Ok(())),
                }
            });
            view
        }
        None => watch::channel(Default::default()).1,
    };

    // The Events recorder stops last: the reporter's and the status loop's
    // final flushes hand it their last Events.
    let (status_done_tx, status_done_rx) = watch::channel(false);
    let (reporter_done_tx, reporter_done_rx) = watch::channel(false);
    {
        let writer = StatusWriter::new(client.clone(), args.node_name.clone());
        let (failed, written) = (metrics.clone(), metrics.clone());
        let mut flush = FlushLoop::new(writer, reports.clone(), view)
            .interval(args.status_interval)
            .on_write_failed(move |e| failed.status_write_failed(e.metric_label()))
            .on_write_ok(move || written.status_write_ok());
        if let Some(r) = &recorder {
            flush = flush.on_condition_changed(r.handle().condition_callback());
        }
        let stop = stopped(stop_rx.clone());
        // The loop's final flush runs after `stop`; the shutdown deadline
        // below bounds it when the API server is unreachable.
        tasks.spawn(async move {
            flush.run(stop).await;
            let _ = status_done_tx.send(true);
            ("status flush", Ok(()))
        });
    }

    {
        // Data sources are fetched on their own tasks and handed to the
        // engine through the watch loop.
        let (data_tx, data_rx) = tokio::sync::mpsc::unbounded_channel();
        let guard = data_guard::DataGuard::new(args.data_http_allow.clone());
        watches::lock(&engine).set_fetcher(data::Fetcher::new(client.clone(), data_tx, guard));
        watches::lock(&engine).set_protected_namespaces(protected_namespaces(&args));
        watches::lock(&engine).set_show_data_values(args.show_data_values);
        if let Some(r) = &reporter {
            watches::lock(&engine).set_reporter(r.handle());
        }
        let (reconciled_tx, reconciled_rx) = watch::channel(false);
        let watches = watches::Watches {
            client: client.clone(),
            node: args.node_name.clone(),
            health: health.clone(),
            metrics: metrics.clone(),
            data: Some(data_rx),
            reconciled: Some(reconciled_tx),
        };
        let reconciled_for_gate = reconciled_rx.clone();
        let key = args.startup_taint.trim().to_string();
        if !key.is_empty() {
            let (client, node, stop, done) = (
                client.clone(),
                args.node_name.clone(),
                stopped(stop_rx.clone()),
                stopped(stop_rx.clone()),
            );
            tasks.spawn(async move {
                taint::remove_when_reconciled(client, node, key, reconciled_rx, stop).await;
                // Its work is done once; it waits for the shutdown like
                // every task (one that ends early is fatal).
                done.await;
                ("startup taint", Ok(()))
            });
        }
        if args.pod_cgroup_fallback {
            let hierarchies = {
                let mut e = watches::lock(&engine);
                e.open_exec_loaded().then(|| {
                    e.enable_pod_cgroup_fallback();
                    e.resolver_hierarchies()
                })
            };
            match hierarchies {
                Some(h) => pod_dirs::spawn(engine.clone(), h)
                    .context("starting the pod directory watcher's thread")?,
                None => tracing::info!("pod directory fallback off: open/exec enforcement is not available on this node"),
            }
        }
        let mut nri_registered = None;
        if let Some(nri_socket) = &args.nri_socket {
            watches::lock(&engine).enable_runtime_hook();
            let not_held = protected_namespaces(&args)
                .into_iter()
                .chain(args.pod_namespace.clone())
                .collect();
            let containers = Arc::new(
                nri::NriContainers::new(engine.clone(), metrics.clone(), not_held)
                    .context("starting the NRI plugin's engine worker")?,
            );
            nri_registered = Some(containers.registered());
            // A path on the node: in a pod (hostPID, no host mounts) it is
            // reached through PID 1's root, as the cgroup mounts are.
            let (_, host_root) =
                kyverno_runtime_compat::HostMounts::locate(&kyverno_runtime_compat::LiveHost);
            let socket = kyverno_runtime_compat::reach(&host_root, nri_socket);
            tracing::info!(socket = %socket.display(), "NRI: registering a plugin with the container runtime");
            let mut config = kyverno_runtime_nri::Config::new(socket);
            config.answer_within = args.nri_answer_within;
            let stop = stopped(stop_rx.clone());
            // Its own thread and runtime: the runtime drops a plugin that
            // has not answered in 2 s, and the daemon's two workers can
            // both be held by the engine's lock (a watch batch programming
            // ten starting pods on the emulated guest held them past 2 s,
            // and containerd closed the plugin: `context deadline
            // exceeded`). Here the bound's timer fires whatever they do.
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
            std::thread::Builder::new()
                .name("nri-plugin".into())
                .spawn(move || {
                    let ran = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map(|runtime| {
                            runtime.block_on(async move {
                                tokio::select! {
                                    () = kyverno_runtime_nri::run(config, containers) => {}
                                    _ = stop => {}
                                }
                            })
                        })
                        .context("starting the NRI plugin's runtime");
                    let _ = done_tx.send(ran);
                })
                .context("starting the NRI plugin's thread")?;
            tasks.spawn(async move {
                let ran = done_rx
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the NRI plugin's thread ended")));
                ("NRI plugin", ran)
            });
        }
        if args.startup_gate {
            let (paths, stop, done) = (
                gate_paths.clone(),
                stopped(stop_rx.clone()),
                stopped(stop_rx.clone()),
            );
            tasks.spawn(async move {
                startup_gate::open_when_enforcing(paths, reconciled_for_gate, nri_registered, stop)
                    .await;
                done.await;
                ("startup gate", Ok(()))
            });
        }
        let (e, stop) = (engine.clone(), stopped(stop_rx.clone()));
        tasks.spawn(async move {
            retries.run(e, stop).await;
            ("backend retries", Ok(()))
        });
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            let r = watches.run(engine, stop).await;
            ("engine", r)
        });
        // The plane's sources drain the kernel once more at stop; the
        // reporter and the push stream stop after it, so their final
        // flushes hold that last window.
        let (plane_done_tx, plane_done_rx) = watch::channel(false);
        let plane_stop = stop_rx.clone();
        tasks.spawn(async move {
            collector.run(plane_stop).await;
            let _ = plane_done_tx.send(true);
            ("event plane", Ok(()))
        });
        let plane_done_for_reporter = plane_done_rx.clone();
        match reporter {
            Some(reporter) => {
                tasks.spawn(async move {
                    reporter.run(stopped(plane_done_for_reporter)).await;
                    let _ = reporter_done_tx.send(true);
                    ("reporter", Ok(()))
                });
            }
            None => {
                let _ = reporter_done_tx.send(true);
            }
        }
        if let Some(push) = push {
            // Stops after the plane, so its final drain is streamed too.
            let done = plane_done_rx.clone();
            tasks.spawn(async move {
                push.run(stopped(done)).await;
                ("push sink", Ok(()))
            });
        }
        if let Some(recorder) = recorder {
            tasks.spawn(async move {
                let both = async move {
                    stopped(status_done_rx).await;
                    stopped(reporter_done_rx).await;
                };
                recorder.run(both).await;
                ("events", Ok(()))
            });
        }
    }

    let mut exit = ExitCode::SUCCESS;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        Some(joined) = tasks.join_next() => {
            // Every task runs until shutdown: one that ends first is fatal,
            // whatever it returned.
            match joined {
                Ok((name, Ok(()))) => tracing::error!(task = name, "a daemon task ended unexpectedly; shutting down"),
                Ok((name, Err(e))) => tracing::error!(task = name, error = %format!("{e:#}"), "a daemon task failed; shutting down"),
                Err(e) => tracing::error!(error = %e, "a daemon task panicked; shutting down"),
            }
            exit = ExitCode::FAILURE;
        }
    }
    let started = tokio::time::Instant::now();
    let _ = stop_tx.send(true);
    let joined = tokio::time::timeout(args.shutdown_timeout, async {
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((name, Err(e))) => tracing::warn!(task = name, error = %format!("{e:#}"), "task failed while stopping"),
                Ok((name, Ok(()))) => tracing::debug!(task = name, "task stopped"),
                Err(e) => tracing::warn!(error = %e, "task panicked while stopping"),
            }
        }
    })
    .await;
    if joined.is_err() {
        tracing::warn!(timeout = ?args.shutdown_timeout, "tasks still running at the shutdown deadline (the final status flush may be lost)");
        tasks.abort_all();
    }
    if uninstalling.load(Ordering::SeqCst) {
        // The gate first: two files, before the pins' longer work, within
        // the grace period the kubelet gives the pod.
        match startup_gate::remove(&gate_paths) {
            Ok(true) => {
                tracing::info!(plugin = %gate_paths.plugin.display(), "DaemonSet deleted (uninstall): removed the startup gate")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e, "DaemonSet deleted (uninstall): the startup gate could not be removed; remove it on the node")
            }
        }
        remove_pins(&args.pin_dir);
    } else {
        tracing::info!(pin_dir = %args.pin_dir.display(), "pins kept for the next daemon to adopt");
    }
    tracing::info!(elapsed = ?started.elapsed(), "stopped");
    Ok(exit)
}

/// The uninstall: removes the daemon's pins with the code of
/// `kyverno-runtime cleanup` (only what its layout names, in a directory
/// it marked) and logs what it removed, kept and failed to remove.
fn remove_pins(pin_dir: &std::path::Path) {
    let pin_dir_shown = pin_dir.display();
    match kyverno_runtime_bpf::pins::remove(pin_dir) {
        Ok(r) if r.absent => {
            tracing::info!(pin_dir = %pin_dir_shown, "DaemonSet deleted (uninstall): nothing was pinned")
        }
        Ok(r) => {
            for kept in &r.kept {
                tracing::warn!(path = %kept.path.display(), reason = %kept.reason, "uninstall: kept an entry of the pin directory that is not the daemon's");
            }
            for failed in &r.failed {
                tracing::error!(path = %failed.path.display(), op = failed.op, error = %failed.error, "uninstall: a pin could not be removed");
            }
            if r.is_complete() {
                tracing::info!(pin_dir = %pin_dir_shown, pins = r.removed_pins.len(), directories = r.removed_dirs.len(), "DaemonSet deleted (uninstall): removed every pin")
            } else {
                tracing::warn!(pin_dir = %pin_dir_shown, summary = %r, "DaemonSet deleted (uninstall): removed the daemon's pins, kept the rest")
            }
        }
        Err(e) => {
            tracing::error!(pin_dir = %pin_dir_shown, error = %e, "DaemonSet deleted (uninstall): the pins were not removed")
        }
    }
}

/// Follows the daemon's own DaemonSet and raises `deleted` once it is gone
/// or has a deletionTimestamp: that is an uninstall (`helm uninstall`
/// deletes the DaemonSet, then its pods get SIGTERM), and nothing will adopt
/// the pins, so the shutdown removes them. A rolling update or a drain
/// leaves the DaemonSet in place and the pins stay for the next daemon. A
/// watch that errors leaves the flag as it was: keeping enforcement in place
/// is the safe mistake.
async fn watch_own_daemonset(client: kube::Client, placement: Placement, deleted: Arc<AtomicBool>) {
    use futures::StreamExt as _;
    use kube::runtime::watcher::{self, Event};
    use kube::runtime::WatchStreamExt as _;
    let api: Api<DaemonSet> = Api::namespaced(client, &placement.namespace);
    let config =
        watcher::Config::default().fields(&format!("metadata.name={}", placement.daemonset));
    let mut seen_in_list = false;
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => seen_in_list = false,
            Ok(Event::InitApply(ds) | Event::Apply(ds)) => {
                seen_in_list = true;
                if ds.metadata.deletion_timestamp.is_some() {
                    deleted.store(true, Ordering::SeqCst);
                }
            }
            // A relist without it: it was deleted while the watch was down.
            Ok(Event::InitDone) if !seen_in_list => deleted.store(true, Ordering::SeqCst),
            Ok(Event::InitDone) => {}
            Ok(Event::Delete(_)) => {
                tracing::info!("the daemon's DaemonSet was deleted: the pins go at shutdown");
                deleted.store(true, Ordering::SeqCst);
            }
            Err(e) => tracing::warn!(error = %e, "DaemonSet watch error (retrying)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::metrics_addr;

    #[test]
    fn metrics_addr_takes_every_form_the_chart_and_users_write() {
        let ok = [
            ("", None),
            (":9090", Some("0.0.0.0:9090")),
            ("10.244.1.7:9090", Some("10.244.1.7:9090")),
            ("[fd00::7]:9090", Some("[fd00::7]:9090")),
            // The chart's $(POD_IP):PORT on an IPv6 pod.
            ("fd00::7:9090", Some("[fd00::7]:9090")),
            ("::1:9090", Some("[::1]:9090")),
        ];
        for (input, want) in ok {
            let got = metrics_addr(input).unwrap_or_else(|e| panic!("{input}: {e:#}"));
            assert_eq!(got.map(|a| a.to_string()).as_deref(), want, "{input}");
        }
        for bad in [
            "9090",
            "host:9090",
            "10.0.0.1:",
            "fd00::7",
            "10.0.0.1:99999",
        ] {
            assert!(metrics_addr(bad).is_err(), "{bad}");
        }
    }
}
