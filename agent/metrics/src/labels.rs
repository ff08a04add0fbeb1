//! Label sets. Closed reasons are enums, so only the documented values can
//! ever appear; names supplied at run time (policy, source) are strings.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};

/// Why observations were dropped (`events_dropped_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DropReason {
    /// The collector's buffer was full; the newest event was dropped.
    buffer_full,
    /// No pod matched the event.
    unattributed,
    /// The kernel denied something no tracked enforce policy explains.
    unattributed_kernel_deny,
    /// A ring buffer reservation failed in the kernel.
    ringbuf_full,
    /// The DNS observer could not read a question name.
    name_unreadable,
    /// Userspace could not decode a kernel record.
    undecodable,
    /// The push sink's queue was full; the oldest finding was dropped.
    queue_full,
    /// The push sink could not send a finding.
    send_failed,
    /// A kernel-side rate limit suppressed per-occurrence records.
    rate_limited,
    /// The API server refused a Report write in a way retrying cannot fix.
    write_failed,
    /// Findings still unwritten when the shutdown deadline passed.
    shutdown,
    /// Findings of a policy deleted before they were written.
    policy_deleted,
    /// The DNS answer snooper could not read a response to its end (a
    /// truncated or malformed message, a name over the key width, other
    /// than one question): what it carried after that was not learned.
    answer_unreadable,
    /// Answer records or CNAMEs beyond the snooper's bounded walk: not
    /// learned.
    walk_limit,
    /// The learned-address map refused an address.
    learn_failed,
    /// A DNS response that answers no question the pod asked a declared
    /// resolver (from an undeclared address or loopback, a wrong id or
    /// port, unasked, late, a second answer, or another question): nothing
    /// learned (issue 37: forged answers open nothing).
    answer_unsolicited,
    /// A pod's DNS question to an address that is not a declared resolver
    /// (`--dns-resolvers`): its answer will teach nothing.
    question_undeclared,
    /// A pod's DNS questions over its per-second budget, or unreadable:
    /// not noted, so their answers teach nothing.
    question_not_noted,
    /// A kernel map of per-key counters had no room for a new key: the
    /// occurrence was not counted anywhere (the open/exec observation map,
    /// the protocol classifier's decision map, a failed egress insert).
    map_full,
    /// The bounded (least-recently-used) egress observation map evicted a
    /// key before a drain read it: that destination's count was lost.
    evicted,
    /// A container sent to more distinct destinations in one drain interval
    /// than its share of the egress observation map (the map's size over
    /// the containers filtered): those were not counted, so that it evicts
    /// no other container's counts. Under source `dnssnoop`: an address a
    /// DNS answer gave a pod whose filter set held its share of the
    /// learned-address map (the map's size over the sets in use): not
    /// learned, so that it displaces nothing another pod learned.
    over_share,
    /// A DNS response dropped before the pod read it: an address an
    /// enforced policy denies by name could not be learned (the pod's set
    /// held its share of the learned-address map), and the pod is never
    /// told an address it could not be stopped from reaching.
    answer_refused,
    /// A Kubernetes Event over its policy's budget (issue 38): not written,
    /// so that one policy cannot flood the API server with Events.
    policy_budget,
    /// A Kubernetes Event over its pod's budget (issue 38): not written, so
    /// that one pod cannot flood the API server with Events.
    pod_budget,
}

/// Why an event source failed (`source_failures_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SourceFailureReason {
    /// Its constructor failed; a daemon restart is needed.
    InitializationFailed,
    /// Its reader failed; the collector restarts it with backoff.
    ReaderFailed,
    /// It returned although its context had not ended.
    UnexpectedExit,
    /// Something it depends on (the open/exec manager) is unavailable.
    DependencyUnavailable,
}

/// What the daemon asked of the exec tracer's cgroup gate
/// (`exec_trace_gate_failures_total{operation}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum GateOperation {
    /// Letting a cgroup's execs be traced.
    admit,
    /// Stopping them.
    revoke,
}

/// How a Report write ended (`report_writes_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReportWriteResult {
    /// Created or updated.
    success,
    /// Lost an optimistic-concurrency race and was retried.
    conflict,
    /// Failed.
    error,
}

/// How a Kubernetes Event write succeeded (`event_writes_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EventWriteResult {
    /// A new Event was created.
    created,
    /// An existing Event's series was added to.
    patched,
}

/// Why a Kubernetes Event write failed after its retries
/// (`event_writes_failed_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EventWriteFailure {
    /// 401: the API server did not accept the daemon's credentials.
    unauthorized,
    /// 403: RBAC (or an admission policy) refused the write.
    forbidden,
    /// 404: the namespace (or the Event, between its read and its patch)
    /// does not exist.
    not_found,
    /// 409: the series patch kept losing races.
    conflict,
    /// 400 or 422: the API server found the Event invalid.
    invalid,
    /// Another 4xx refusal.
    refused,
    /// 429: throttled on every attempt.
    throttled,
    /// 5xx on every attempt.
    server_error,
    /// No usable answer: a transport, TLS or decoding error.
    unreachable,
    /// The write, retries included, ran out of its time.
    timeout,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceKindLabels {
    source: String,
    kind: String,
}

impl SourceKindLabels {
    pub(crate) fn new(source: &str, kind: &str) -> Self {
        SourceKindLabels {
            source: source.into(),
            kind: kind.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DropLabels {
    source: String,
    reason: DropReason,
}

impl DropLabels {
    pub(crate) fn new(source: &str, reason: DropReason) -> Self {
        DropLabels {
            source: source.into(),
            reason,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyBehaviorLabels {
    policy: String,
    behavior: String,
}

impl PolicyBehaviorLabels {
    pub(crate) fn new(policy: &str, behavior: &str) -> Self {
        PolicyBehaviorLabels {
            policy: policy.into(),
            behavior: behavior.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyExpressionLabels {
    policy: String,
    expression: String,
}

impl PolicyExpressionLabels {
    pub(crate) fn new(policy: &str, expression: &str) -> Self {
        PolicyExpressionLabels {
            policy: policy.into(),
            expression: expression.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    result: ReportWriteResult,
}

impl ResultLabels {
    pub(crate) fn new(result: ReportWriteResult) -> Self {
        ResultLabels { result }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    operation: GateOperation,
}

impl OperationLabels {
    pub(crate) fn new(operation: GateOperation) -> Self {
        OperationLabels { operation }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    source: String,
}

impl SourceLabels {
    pub(crate) fn new(source: &str) -> Self {
        SourceLabels {
            source: source.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceReasonLabels {
    source: String,
    reason: SourceFailureReason,
}

impl SourceReasonLabels {
    pub(crate) fn new(source: &str, reason: SourceFailureReason) -> Self {
        SourceReasonLabels {
            source: source.into(),
            reason,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProgramLabels {
    program: String,
}

impl ProgramLabels {
    pub(crate) fn new(program: &str) -> Self {
        ProgramLabels {
            program: program.into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventResultLabels {
    result: EventWriteResult,
}

impl EventResultLabels {
    pub(crate) fn new(result: EventWriteResult) -> Self {
        EventResultLabels { result }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventFailureLabels {
    reason: EventWriteFailure,
}

impl EventFailureLabels {
    pub(crate) fn new(reason: EventWriteFailure) -> Self {
        EventFailureLabels { reason }
    }
}

/// A loadable backend, by the behaviors it serves
/// (`backend_load_attempts_total{behavior}`, `backend_available{behavior}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BackendBehavior {
    /// The open/exec enforcer (BPF-LSM or fmod_ret): one load serves both.
    open_exec,
    /// The cgroup_skb egress filter.
    network,
    /// The cgroup_skb protocol classifier.
    protocol,
    /// The DNS question observer.
    dns,
}

/// How a backend's load ended (`backend_load_attempts_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BackendLoadResult {
    /// Loaded and handed to the engine.
    success,
    /// Failed; retried with backoff.
    failure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendLabels {
    behavior: BackendBehavior,
}

impl BackendLabels {
    pub(crate) fn new(behavior: BackendBehavior) -> Self {
        BackendLabels { behavior }
    }
}

/// Why a kernel update of a policy failed
/// (`kernel_updates_failed_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum KernelUpdateFailure {
    /// A map is at its capacity (node-wide).
    map_full,
    /// The kernel refused the operation otherwise.
    kernel,
    /// Anything else the backend refused.
    other,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KernelUpdateLabels {
    behavior: BackendBehavior,
    reason: KernelUpdateFailure,
}

impl KernelUpdateLabels {
    pub(crate) fn new(behavior: BackendBehavior, reason: KernelUpdateFailure) -> Self {
        KernelUpdateLabels { behavior, reason }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendLoadLabels {
    behavior: BackendBehavior,
    result: BackendLoadResult,
}

impl BackendLoadLabels {
    pub(crate) fn new(behavior: BackendBehavior, result: BackendLoadResult) -> Self {
        BackendLoadLabels { behavior, result }
    }
}

/// What the NRI plugin's answer to a container start was
/// (`container_starts_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ContainerStartOutcome {
    /// The container was programmed before its process started.
    enforced,
    /// The answer's bound passed first: the start went ahead and the
    /// container was programmed after (a window, as without NRI).
    late,
    /// Not held: a namespace the daemon never holds (its own, the
    /// cluster's control pods); programmed meanwhile.
    not_held,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StartOutcomeLabels {
    outcome: ContainerStartOutcome,
}

impl StartOutcomeLabels {
    pub(crate) fn new(outcome: ContainerStartOutcome) -> Self {
        StartOutcomeLabels { outcome }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HookLabels {
    hook: String,
}

impl HookLabels {
    pub(crate) fn new(hook: &str) -> Self {
        HookLabels { hook: hook.into() }
    }
}
