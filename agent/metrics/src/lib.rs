//! The daemon's metrics and health endpoint.
//!
//! Every series lives under the `nirmata_runtime` namespace with the names
//! and labels of the Go original, so dashboards and alerts carry over.
//! Label values are closed enums wherever the original's are (drop reasons,
//! source failure reasons, report write results): a typo cannot create a
//! new series, and a new reason is a compile-time change.
//!
//! [`Metrics`] owns a private [`Registry`] (never a global one, so tests and
//! repeated wiring cannot collide). [`serve`] exposes `/metrics` and
//! `/healthz`; an empty address disables the endpoint, never the counters.

mod api;
mod health;
mod labels;
mod server;

pub use api::{ApiFailure, ApiHealth, ApiResource, NotReady, Outage, UNREACHABLE_AFTER};
pub use health::{Health, Unhealthy};
pub use labels::{
    BackendBehavior, BackendLoadResult, ContainerStartOutcome, DropReason, EventWriteFailure,
    EventWriteResult, GateOperation, KernelUpdateFailure, ReportWriteResult, SourceFailureReason,
};
pub use server::{serve, ServeError};

use labels::{
    BackendLabels, BackendLoadLabels, DropLabels, EventFailureLabels, EventResultLabels,
    HookLabels, KernelUpdateLabels, OperationLabels, PolicyBehaviorLabels, PolicyExpressionLabels,
    ProgramLabels, ReasonLabels, ResultLabels, SourceKindLabels, SourceLabels, SourceReasonLabels,
    StartOutcomeLabels,
};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

/// The metric namespace every series is registered under.
pub const NAMESPACE: &str = "nirmata_runtime";

/// Every series the daemon exports.
pub struct Metrics {
    registry: Registry,
    events_ingested: Family<SourceKindLabels, Counter>,
    events_dropped: Family<DropLabels, Counter>,
    attribution_misses: Counter,
    findings_emitted: Family<PolicyBehaviorLabels, Counter>,
    monitor_filter_eval_errors: Family<PolicyExpressionLabels, Counter>,
    report_writes: Family<ResultLabels, Counter>,
    status_writes_failed: Family<ReasonLabels, Counter>,
    event_writes: Family<EventResultLabels, Counter>,
    event_writes_failed: Family<EventFailureLabels, Counter>,
    source_available: Family<SourceLabels, Gauge>,
    source_failures: Family<SourceReasonLabels, Counter>,
    pods_unresolved: Gauge,
    exec_trace_gate_failures: Family<OperationLabels, Counter>,
    bpf_run_time: Family<ProgramLabels, Counter<f64, AtomicU64>>,
    bpf_run_count: Family<ProgramLabels, Counter>,
    backend_load_attempts: Family<BackendLoadLabels, Counter>,
    backend_available: Family<BackendLabels, Gauge>,
    kernel_updates_failed: Family<KernelUpdateLabels, Counter>,
    container_start_hook: Family<HookLabels, Gauge>,
    container_starts: Family<StartOutcomeLabels, Counter>,
    container_start_answer: Histogram,
    pod_cgroup_decisions: Counter,
    /// Whether the API server answers (see [`ApiHealth`]).
    api: ApiHealth,
    /// The kernel's cumulative (run_time_ns, run_cnt) per program name as
    /// of the last [`Metrics::record_bpf_program_stats`] call.
    bpf_last_seen: Mutex<HashMap<String, (u64, u64)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every series in a fresh private registry.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(NAMESPACE);
        let m = Metrics {
            events_ingested: Family::default(),
            events_dropped: Family::default(),
            attribution_misses: Counter::default(),
            findings_emitted: Family::default(),
            monitor_filter_eval_errors: Family::default(),
            report_writes: Family::default(),
            status_writes_failed: Family::default(),
            event_writes: Family::default(),
            event_writes_failed: Family::default(),
            source_available: Family::default(),
            source_failures: Family::default(),
            pods_unresolved: Gauge::default(),
            exec_trace_gate_failures: Family::default(),
            bpf_run_time: Family::default(),
            bpf_run_count: Family::default(),
            kernel_updates_failed: Family::default(),
            backend_load_attempts: Family::default(),
            backend_available: Family::default(),
            container_start_hook: Family::default(),
            container_starts: Family::default(),
            // 1 ms to 2 s (the runtime's own limit), doubling.
            container_start_answer: Histogram::new(exponential_buckets(0.001, 2.0, 12)),
            pod_cgroup_decisions: Counter::default(),
            api: ApiHealth::new(),
            bpf_last_seen: Mutex::new(HashMap::new()),
            registry: Registry::default(),
        };
        registry.register(
            "events_ingested",
            "Observations that entered the collector, by source and kind",
            m.events_ingested.clone(),
        );
        registry.register(
            "events_dropped",
            "Observations lost, by source and reason; nothing is dropped silently",
            m.events_dropped.clone(),
        );
        registry.register(
            "attribution_misses",
            "Events that could not be attributed to a pod",
            m.attribution_misses.clone(),
        );
        registry.register(
            "findings_emitted",
            "Findings handed to the sinks, by policy and behavior",
            m.findings_emitted.clone(),
        );
        registry.register(
            "monitor_filter_eval_errors",
            "monitorFilter expressions that failed to evaluate (the finding was reported anyway)",
            m.monitor_filter_eval_errors.clone(),
        );
        registry.register(
            "report_writes",
            "OpenReports Report writes, by result",
            m.report_writes.clone(),
        );
        registry.register(
            "status_writes_failed",
            "RuntimePolicy status writes of this node's shard that failed, by reason \
             (unreachable, throttled, server_error, refused, conflicts)",
            m.status_writes_failed.clone(),
        );
        registry.register(
            "event_writes",
            "Kubernetes Event writes that succeeded, by result (created, patched)",
            m.event_writes.clone(),
        );
        registry.register(
            "event_writes_failed",
            "Kubernetes Event writes that failed after their retries, by reason \
             (unauthorized, forbidden, not_found, conflict, invalid, refused, throttled, \
             server_error, unreachable, timeout)",
            m.event_writes_failed.clone(),
        );
        registry.register(
            "source_available",
            "1 while an event source's reader is usable, 0 while starting or failed",
            m.source_available.clone(),
        );
        registry.register(
            "source_failures",
            "Event source failures, by source and reason",
            m.source_failures.clone(),
        );
        registry.register(
            "pods_unresolved",
            "Running pods on this node with a container whose cgroup was not found (not enforced or observed there)",
            m.pods_unresolved.clone(),
        );
        registry.register(
            "exec_trace_gate_failures",
            "Failed admits and revokes of a cgroup in the exec tracer's gate, by operation (each is retried; an unadmitted cgroup's execs are counted without argv)",
            m.exec_trace_gate_failures.clone(),
        );
        registry.register(
            "bpf_program_run_time_seconds",
            "Time the kernel spent running each BPF program (kernel.bpf_stats_enabled)",
            m.bpf_run_time.clone(),
        );
        registry.register(
            "bpf_program_runs",
            "Times the kernel ran each BPF program (kernel.bpf_stats_enabled)",
            m.bpf_run_count.clone(),
        );
        registry.register(
            "backend_load_attempts",
            "Loads of a backend the probe found the kernel can serve, by behavior and result \
             (a failed one is retried with backoff until it loads)",
            m.backend_load_attempts.clone(),
        );
        registry.register(
            "backend_available",
            "1 while a backend is loaded and enforcing, 0 while it is not (see backend_load_attempts)",
            m.backend_available.clone(),
        );
        registry.register(
            "kernel_updates_failed",
            "Kernel updates that failed while a policy was programmed, by backend and reason \
             (map_full: a node-wide map is at its capacity); the node's shard of the policy \
             names the map, and the update is tried again on the next change",
            m.kernel_updates_failed.clone(),
        );
        registry.register(
            "container_start_hook",
            "1 while this hook covers containers before their process starts (hook=nri: the NRI \
             plugin is registered and the runtime announces each container; hook=pod-cgroup: \
             pods' own cgroup directories are bound to open/exec policies as the kubelet creates \
             them), 0 while it does not; with neither, the daemon learns a container from its \
             Pod's status, after it started",
            m.container_start_hook.clone(),
        );
        registry.register(
            "container_starts",
            "Container starts the runtime announced, by the answer (enforced: programmed before \
             the process started; late: answered at the bound, programmed after; not_held: a \
             namespace the daemon never holds)",
            m.container_starts.clone(),
        );
        registry.register(
            "container_start_answer_seconds",
            "Time from the runtime's announcement of a container start to the daemon's answer \
             (the start waits for it; bounded by --nri-answer-within)",
            m.container_start_answer.clone(),
        );
        registry.register(
            "container_start_pod_cgroup_decisions",
            "Open and exec decisions the kernel took for a container not known yet through its \
             pod's cgroup directory (hook=pod-cgroup)",
            m.pod_cgroup_decisions.clone(),
        );
        m.api.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Whether `hook` (`nri`) announces container starts now.
    pub fn set_container_start_hook(&self, hook: &str, registered: bool) {
        self.container_start_hook
            .get_or_create(&HookLabels::new(hook))
            .set(i64::from(registered));
    }

    /// `n` more open/exec decisions were taken through a pod's directory.
    pub fn pod_cgroup_decisions(&self, n: u64) {
        self.pod_cgroup_decisions.inc_by(n);
    }

    /// A container start the runtime announced was answered after `waited`.
    pub fn container_start_answered(&self, waited: std::time::Duration) {
        self.container_start_answer.observe(waited.as_secs_f64());
    }

    /// A container start the runtime announced was answered with `outcome`.
    pub fn container_start(&self, outcome: ContainerStartOutcome) {
        self.container_starts
            .get_or_create(&StartOutcomeLabels::new(outcome))
            .inc();
    }

    /// Sets how many running pods on this node have a container whose
    /// cgroup was not found.
    pub fn set_pods_unresolved(&self, pods: i64) {
        self.pods_unresolved.set(pods);
    }

    /// An `operation` on the exec tracer's cgroup gate failed.
    pub fn exec_trace_gate_failure(&self, operation: GateOperation) {
        self.exec_trace_gate_failures
            .get_or_create(&OperationLabels::new(operation))
            .inc();
    }

    /// `count` observations from `source` of `kind` entered the collector.
    pub fn events_ingested(&self, source: &str, kind: &str, count: u64) {
        self.events_ingested
            .get_or_create(&SourceKindLabels::new(source, kind))
            .inc_by(count);
    }

    /// `count` observations from `source` were lost for `reason`.
    pub fn events_dropped(&self, source: &str, reason: DropReason, count: u64) {
        self.events_dropped
            .get_or_create(&DropLabels::new(source, reason))
            .inc_by(count);
    }

    /// An event matched no pod.
    pub fn attribution_miss(&self) {
        self.attribution_misses.inc();
    }

    /// A finding of `policy` on `behavior` went to the sinks.
    pub fn finding_emitted(&self, policy: &str, behavior: &str) {
        self.findings_emitted
            .get_or_create(&PolicyBehaviorLabels::new(policy, behavior))
            .inc();
    }

    /// A monitorFilter expression of `policy` named `expression` failed.
    pub fn monitor_filter_eval_error(&self, policy: &str, expression: &str) {
        self.monitor_filter_eval_errors
            .get_or_create(&PolicyExpressionLabels::new(policy, expression))
            .inc();
    }

    /// A Report write finished with `result`.
    pub fn report_write(&self, result: ReportWriteResult) {
        self.api.report_write(result);
        self.report_writes
            .get_or_create(&ResultLabels::new(result))
            .inc();
    }

    /// A status flush of one policy succeeded (written, or already as it
    /// should be): status writes that failed go through again.
    pub fn status_write_ok(&self) {
        self.api.succeeded(ApiResource::status, self.api.now());
    }

    /// A status write of this node's shard failed for `reason` (the
    /// status writer's `Error::metric_label`).
    pub fn status_write_failed(&self, reason: &str) {
        self.api.status_write_failed(reason);
        self.status_writes_failed
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A Kubernetes Event write succeeded with `result`.
    pub fn event_write(&self, result: EventWriteResult) {
        self.api.succeeded(ApiResource::events, self.api.now());
        self.event_writes
            .get_or_create(&EventResultLabels::new(result))
            .inc();
    }

    /// A Kubernetes Event write failed for `reason`, after its retries.
    pub fn event_write_failed(&self, reason: EventWriteFailure) {
        self.api.event_write_failed(reason);
        self.event_writes_failed
            .get_or_create(&EventFailureLabels::new(reason))
            .inc();
    }

    /// Whether `source`'s reader is usable now.
    pub fn set_source_available(&self, source: &str, available: bool) {
        self.source_available
            .get_or_create(&SourceLabels::new(source))
            .set(i64::from(available));
    }

    /// `source` failed for `reason`.
    pub fn source_failure(&self, source: &str, reason: SourceFailureReason) {
        self.source_failures
            .get_or_create(&SourceReasonLabels::new(source, reason))
            .inc();
    }

    /// Adds run time and runs of `program` since the last call (deltas).
    /// The kernel's own numbers are cumulative: feed those to
    /// [`Metrics::record_bpf_program_stats`] instead, and do not mix the two
    /// for one program.
    pub fn bpf_program_ran(&self, program: &str, run_time_ns: u64, runs: u64) {
        let labels = ProgramLabels::new(program);
        // Precision: f64 holds every integer nanosecond count below 2^53 ns (104 days) exactly.
        self.bpf_run_time
            .get_or_create(&labels)
            .inc_by(run_time_ns as f64 / 1e9);
        self.bpf_run_count.get_or_create(&labels).inc_by(runs);
    }

    /// Records the kernel's statistics of the loaded BPF programs: one
    /// `(name, run_time_ns, run_cnt)` per program, as `bpf_prog_info`
    /// reports them — cumulative since the program was loaded, and only
    /// counted while `kernel.bpf_stats_enabled` is on (both stay 0 when it
    /// is off, which is exported as is: the series exists, and not
    /// advancing is the kernel not providing the numbers).
    ///
    /// Call it with the whole set each time (the daemon's poll of its own
    /// programs). Programs sharing a name are summed, since the metric is
    /// per name. The difference from the previous call is what the counters
    /// advance by; a total that went down means the program was replaced
    /// (reloaded, its kernel counters restarted), so the new total is taken
    /// as what ran since — the same reading Prometheus gives a counter reset.
    pub fn record_bpf_program_stats<'a>(
        &self,
        programs: impl IntoIterator<Item = (&'a str, u64, u64)>,
    ) {
        let mut totals: HashMap<&str, (u64, u64)> = HashMap::new();
        for (name, run_time_ns, run_cnt) in programs {
            let t = totals.entry(name).or_default();
            t.0 = t.0.saturating_add(run_time_ns);
            t.1 = t.1.saturating_add(run_cnt);
        }
        // Counters only go up and a poisoned map still holds sound totals.
        let mut last_seen = self
            .bpf_last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, (run_time_ns, run_cnt)) in totals {
            let (prev_ns, prev_cnt) = last_seen.get(name).copied().unwrap_or((0, 0));
            let reset = run_time_ns < prev_ns || run_cnt < prev_cnt;
            let (d_ns, d_cnt) = if reset {
                (run_time_ns, run_cnt)
            } else {
                (run_time_ns - prev_ns, run_cnt - prev_cnt)
            };
            self.bpf_program_ran(name, d_ns, d_cnt);
            last_seen.insert(name.to_string(), (run_time_ns, run_cnt));
        }
    }

    /// A load of `behavior`'s backend ended with `result`.
    pub fn backend_load_attempt(&self, behavior: BackendBehavior, result: BackendLoadResult) {
        self.backend_load_attempts
            .get_or_create(&BackendLoadLabels::new(behavior, result))
            .inc();
    }

    /// A kernel update of `behavior`'s backend failed for `reason` while a
    /// policy was programmed.
    pub fn kernel_update_failed(&self, behavior: BackendBehavior, reason: KernelUpdateFailure) {
        self.kernel_updates_failed
            .get_or_create(&KernelUpdateLabels::new(behavior, reason))
            .inc();
    }

    /// Whether `behavior`'s backend is loaded now.
    pub fn set_backend_available(&self, behavior: BackendBehavior, available: bool) {
        self.backend_available
            .get_or_create(&BackendLabels::new(behavior))
            .set(i64::from(available));
    }

    /// Whether the API server answers: every watch, write and probe
    /// records its outcome here (the writes above do so themselves).
    pub fn api(&self) -> &ApiHealth {
        &self.api
    }

    /// Declares `source` so it is exported (at 0) before its first event.
    pub fn declare_source(&self, source: &str) {
        self.set_source_available(source, false);
    }

    /// The registry in OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug
        // in a metric type, and a scrape must never take the daemon down.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}
