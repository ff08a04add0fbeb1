//! Loading the backends the probe's plan names, at start and (for a
//! load that failed where the kernel can serve it) again later from
//! [`super::retry`]: one loader per backend, so both paths load the same
//! way.

use super::dns_resolvers::{self, DnsResolver};
use super::engine::{self, Slot};
use super::DaemonArgs;
use kyverno_runtime_bpf::exectrace::ExecTracer;
use kyverno_runtime_bpf::openexec::Denial;
use kyverno_runtime_bpf::ring::RecordReader;
use kyverno_runtime_compat::{derive_plan, Backend, Behavior, LiveHost, Overrides, Plan, Prober};
use kyverno_runtime_enforce::egress::{EgressEnforcer, EgressManager};
use kyverno_runtime_enforce::lsm;
use kyverno_runtime_enforce::openexec::OpenExecManager;
use kyverno_runtime_metrics::SourceFailureReason;
use std::path::{Path, PathBuf};

/// What the kernel gave us: the plan and the backends.
pub(super) struct Loaded {
    pub(super) plan: Plan,
    pub(super) openexec: Slot<engine::OpenExec>,
    pub(super) egress: Slot<engine::Egress>,
    pub(super) protocol: Slot<engine::Protocol>,
    pub(super) dns: Slot<engine::Dns>,
    pub(super) dns_reader: Option<kyverno_runtime_bpf::dns::DnsReader>,
    /// The open/exec programs' refusal records, or why there are none.
    pub(super) denials: Result<RecordReader<Denial>, String>,
    /// The exec tracer, or why there is none (and what kind of failure).
    pub(super) tracer: Result<ExecTracer, (SourceFailureReason, String)>,
    /// Why open/exec runs on another backend than the plan's, if it does.
    pub(super) fallback: Option<String>,
}

/// What a backend's load needs from the flags, kept for the retries.
#[derive(Clone, Debug)]
pub(super) struct LoadConfig {
    /// `--pin-dir`: pinned backends claim it before they pin anything.
    pub(super) pin_dir: PathBuf,
    /// The open/exec backend the plan chose.
    pub(super) open_backend: Backend,
    /// `--dns-resolvers`, declared to every egress filter loaded.
    pub(super) dns_resolvers: Vec<DnsResolver>,
}

impl LoadConfig {
    /// The configuration of `args` under `plan`.
    pub(super) fn new(args: &DaemonArgs, plan: &Plan) -> Self {
        LoadConfig {
            pin_dir: args.pin_dir.clone(),
            open_backend: plan.entry(Behavior::Open).backend,
            dns_resolvers: args.dns_resolvers.clone(),
        }
    }
}

/// Loads the open/exec enforcer the plan chose (pinned under the claimed
/// pin directory), with why it fell back to another backend, if it did.
pub(super) fn load_openexec(
    cfg: &LoadConfig,
) -> Result<(engine::OpenExec, Option<String>), String> {
    claim_pin_dir(&cfg.pin_dir)?;
    let pins = cfg.pin_dir.join(kyverno_runtime_bpf::pins::OPENEXEC_DIR);
    let loaded = lsm::load_planned(cfg.open_backend, Some(&pins))
        .map_err(|e| format!("loading {}: {e}", cfg.open_backend.id()))?;
    let fallback = loaded.fallback.clone();
    OpenExecManager::new(loaded.open, loaded.exec)
        .map(|m| (m, fallback))
        .map_err(|e| format!("reading the pinned open/exec state: {e}"))
}

/// Loads the egress filter, pinned like open/exec so it keeps dropping
/// across a restart, and declares the DNS resolvers to it.
pub(super) fn load_egress(cfg: &LoadConfig) -> Result<engine::Egress, String> {
    claim_pin_dir(&cfg.pin_dir)?;
    let m = EgressEnforcer::load_pinned(&cfg.pin_dir.join(kyverno_runtime_bpf::pins::EGRESS_DIR))
        .and_then(EgressManager::new)
        .map_err(|e| format!("loading the egress filter: {e}"))?;
    declare_dns_resolvers(&m, &cfg.dns_resolvers);
    Ok(m)
}

/// Loads the protocol classifier (not pinned).
pub(super) fn load_protocol() -> Result<engine::Protocol, String> {
    kyverno_runtime_enforce::protocol::ProtocolManager::load()
        .map_err(|e| format!("loading the protocol classifier: {e}"))
}

/// Loads the DNS question observer (not pinned).
pub(super) fn load_dns() -> Result<engine::Dns, String> {
    kyverno_runtime_enforce::dns::DnsGateManager::load()
        .map_err(|e| format!("loading the DNS question observer: {e}"))
}

/// A slot from a plan entry and its loader: the loader runs only where
/// the plan says the kernel can serve the behavior.
fn slot<M>(available: bool, reason: &str, load: impl FnOnce() -> Result<M, String>) -> Slot<M> {
    if !available {
        return Slot::Unavailable(reason.to_owned());
    }
    match load() {
        Ok(m) => Slot::Ready(m),
        Err(e) => Slot::Unavailable(e),
    }
}

/// Probes the kernel and loads every backend the plan names, one at a
/// time: loading a backend takes over libbpf's process-wide log callback
/// while it runs.
pub(super) fn load_backends(args: &DaemonArgs) -> Loaded {
    let overrides = Overrides {
        open_exec: args.open_exec,
    };
    let measurements = Prober::new(LiveHost).measurements().clone();
    let plan = derive_plan(&measurements, &overrides);
    for behavior in Behavior::ALL {
        let e = plan.entry(behavior);
        tracing::info!(behavior = behavior.name(), backend = e.backend.id(), available = e.available, reason = %e.reason, "backend plan");
    }
    if args.bpf_stats {
        if let Err(e) = kyverno_runtime_bpf::openexec::enable_bpf_stats(true) {
            tracing::warn!(error = %e, "could not enable kernel.bpf_stats_enabled");
        }
    }
    let cfg = LoadConfig::new(args, &plan);
    let open = plan.entry(Behavior::Open);
    let mut fallback = None;
    let openexec = slot(open.available, &open.reason, || {
        load_openexec(&cfg).map(|(m, why)| {
            fallback = why;
            m
        })
    });
    if let Slot::Unavailable(r) = &openexec {
        tracing::error!(reason = %r, "open/exec enforcement is not available on this node");
    }
    let denials = match &openexec {
        Slot::Ready(m) => m
            .open_backend()
            .set_denial_rate(args.denial_records_per_second)
            .and_then(|()| m.open_backend().denial_reader())
            .map_err(|e| format!("the refusal records: {e}")),
        Slot::Unavailable(r) => Err(r.clone()),
    };
    if let Err(r) = &denials {
        tracing::warn!(reason = %r, "per-occurrence refusal records are not available: refusals are counted only");
    }
    // The exec tracer needs the open/exec programs: they gate it by the
    // same policies and hand it the paths they resolved.
    let argv = plan.entry(Behavior::ExecArgv);
    let tracer = match &openexec {
        _ if !argv.available => Err((
            SourceFailureReason::InitializationFailed,
            argv.reason.clone(),
        )),
        Slot::Unavailable(r) => Err((
            SourceFailureReason::DependencyUnavailable,
            format!("needs the open/exec backend: {r}"),
        )),
        Slot::Ready(m) => m
            .open_backend()
            .exec_resolved_map()
            .map_err(|e| e.to_string())
            .and_then(|map| ExecTracer::load(Some(&map)).map_err(|e| e.to_string()))
            .map_err(|e| (SourceFailureReason::InitializationFailed, e)),
    };
    if let Err((_, r)) = &tracer {
        tracing::error!(reason = %r, "the exec tracer is not available: execs are observed without argv");
    }
    let net = plan.entry(Behavior::Network);
    let egress = slot(net.available, &net.reason, || load_egress(&cfg));
    if let Slot::Unavailable(r) = &egress {
        tracing::error!(reason = %r, "network enforcement is not available on this node");
    }
    let proto = plan.entry(Behavior::Protocol);
    let protocol = slot(proto.available, &proto.reason, load_protocol);
    let dns_entry = plan.entry(Behavior::Dns);
    let dns = slot(dns_entry.available, &dns_entry.reason, load_dns);
    let dns_reader = match &dns {
        Slot::Ready(m) => match m.reader() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %e, "opening the DNS question ring buffer failed: no dns observation");
                None
            }
        },
        Slot::Unavailable(_) => None,
    };
    for (what, slot) in [("protocol", protocol.reason()), ("dns", dns.reason())] {
        if let Some(r) = slot {
            tracing::error!(reason = %r, "{what} is not available on this node");
        }
    }
    Loaded {
        plan,
        openexec,
        egress,
        protocol,
        dns,
        dns_reader,
        denials,
        tracer,
        fallback,
    }
}

/// Declares `--dns-resolvers` to the egress filter, saying in the log
/// what was declared, what `auto` skipped, and when nothing is (domains
/// then learn nothing).
fn declare_dns_resolvers(m: &engine::Egress, specs: &[DnsResolver]) {
    let declared = dns_resolvers::declare(specs, Path::new("/etc/resolv.conf"));
    for why in &declared.skipped {
        tracing::warn!(skipped = %why, "--dns-resolvers: not declared");
    }
    let list = declared
        .addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match m.backend().kernel().filter().set_dns_resolvers(&declared.addrs) {
        Ok(()) if declared.addrs.is_empty() => tracing::warn!(
            "no DNS resolver is declared (--dns-resolvers): policies naming domains learn no addresses on this node"
        ),
        Ok(()) => tracing::info!(resolvers = %list, "DNS answers teach domain addresses only from these resolvers, to questions pods asked them"),
        Err(e) => tracing::error!(error = %e, resolvers = %list, "declaring the DNS resolvers failed: policies naming domains learn no addresses on this node"),
    }
}

/// Marks `pin_dir` as the daemon's pin directory (creating it), or says
/// why it cannot be one. Pins on any other filesystem fail, pins on a
/// bpffs private to a container die with it, and pins at a bpffs root
/// could not be told from other tools'; the chart therefore points below
/// the host's, through PID 1's root. Every pinned backend's load claims it
/// first (claiming a directory already marked as the daemon's is a
/// check), so a retry never pins where a claim was refused.
fn claim_pin_dir(pin_dir: &Path) -> Result<(), String> {
    use kyverno_runtime_bpf::pins::{self, PinError, Refusal};
    pins::claim(pin_dir, &pins::DAEMON).map_err(|e| match e {
        PinError::Refused {
            reason: Refusal::NotBpffs { .. },
            ..
        } => format!(
            "--pin-dir: {e} (mount a bpffs there, or in a container reach the host's through /proc/1/root/sys/fs/bpf)"
        ),
        e => format!("--pin-dir: {e}"),
    })
}
