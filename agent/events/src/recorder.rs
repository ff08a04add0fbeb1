//! The recorder: causes in through a bounded queue, Events out.
//!
//! [`RecorderHandle::finding_flushed`] and
//! [`RecorderHandle::condition_changed`] run on the caller's task (the
//! reporter's flush, the status flush) and never block: they build the
//! Event from redacted or sanitized values only and hand it to a bounded
//! queue, once its pod's and its policy's budgets (see [`crate::budget`])
//! admit it; what a budget refuses or the queue cannot hold is dropped and
//! counted. [`Recorder::run`] writes the queue, one Event at a time:
//!
//! - **create** it under its deterministic name (see [`crate::name`]);
//! - on **AlreadyExists**, its object and reason fired before: read the
//!   stored Event and add to its series (count and lastObservedTime) with a
//!   merge patch that carries the resourceVersion it read, so two writers
//!   cannot lose each other's occurrences. The note is not patched: it is
//!   immutable in `events.k8s.io/v1`, so the first occurrence's stays;
//! - a lost race, a missing Event (it expired in between), a throttle or a
//!   server error is retried a bounded number of times; anything else is
//!   logged and counted by reason ([`WriteFailure`]) in the metrics and the
//!   `on_write` hook, never raised to the caller.

use crate::budget::{Budget, Budgets, Refused};
use crate::event::{self, Emission, Reporting};
use crate::outcome::{DropReason, WriteFailure, WriteResult};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kyverno_runtime_metrics::{ApiResource, Metrics};
use kyverno_runtime_report::{Finding, FlushHook};
use kyverno_runtime_status::PolicyRef;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The `reportingController` of every Event this crate writes.
pub const REPORTING_CONTROLLER: &str = "kyverno-runtime";

/// The longest `reportingInstance` the API server accepts.
const MAX_INSTANCE_LEN: usize = 128;

/// Called with each drop's reason and how many causes it dropped. Runs on
/// the caller's or the recorder's task: quick, never blocking.
pub type DropHook = Arc<dyn Fn(DropReason, u64) + Send + Sync>;

/// Called once per Event write with its final outcome. Runs on the
/// recorder's task: quick, never blocking.
pub type WriteHook = Arc<dyn Fn(WriteResult) + Send + Sync>;

/// How a [`Recorder`] behaves.
#[derive(Clone)]
pub struct RecorderOptions {
    /// Every Event's `reportingController` ([`REPORTING_CONTROLLER`]).
    pub reporting_controller: String,
    /// Every Event's `reportingInstance`: this node's name (cut to the 128
    /// characters the API server accepts).
    pub reporting_instance: String,
    /// Events waiting to be written (1024); beyond it causes are dropped
    /// and counted.
    pub queue_capacity: usize,
    /// Attempts per Event before it is given up (3).
    pub max_attempts: u32,
    /// How long one Event's write may take, its retries included (10 s).
    pub write_timeout: Duration,
    /// How long the final drain on shutdown may take (5 s).
    pub shutdown_deadline: Duration,
    /// Events one pod may have written ([`Budget::POD`]); beyond it causes
    /// are dropped and counted ([`DropReason::PodBudget`]).
    pub pod_budget: Budget,
    /// Events one policy may have written, over all its pods and its
    /// policy errors ([`Budget::POLICY`]); beyond it causes are dropped
    /// and counted ([`DropReason::PolicyBudget`]).
    pub policy_budget: Budget,
    /// Pods, and policies, whose budgets are tracked at once (4096 each):
    /// bounds the budgets' memory.
    pub budget_keys: usize,
    /// Where every drop (`events_dropped_total{source="events"}`) and
    /// every write (`event_writes_total`, `event_writes_failed_total`) is
    /// counted.
    pub metrics: Option<Arc<Metrics>>,
    /// Told about every drop.
    pub on_drop: Option<DropHook>,
    /// Told about every write's outcome.
    pub on_write: Option<WriteHook>,
}

impl RecorderOptions {
    /// The defaults, for Events reported by `node`.
    pub fn new(node: impl Into<String>) -> Self {
        RecorderOptions {
            reporting_controller: REPORTING_CONTROLLER.into(),
            reporting_instance: node.into(),
            queue_capacity: 1024,
            max_attempts: 3,
            write_timeout: Duration::from_secs(10),
            shutdown_deadline: Duration::from_secs(5),
            pod_budget: Budget::POD,
            policy_budget: Budget::POLICY,
            budget_keys: 4096,
            metrics: None,
            on_drop: None,
            on_write: None,
        }
    }
}

impl fmt::Debug for RecorderOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecorderOptions")
            .field("reporting_controller", &self.reporting_controller)
            .field("reporting_instance", &self.reporting_instance)
            .field("queue_capacity", &self.queue_capacity)
            .field("max_attempts", &self.max_attempts)
            .field("write_timeout", &self.write_timeout)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .field("pod_budget", &self.pod_budget)
            .field("policy_budget", &self.policy_budget)
            .field("budget_keys", &self.budget_keys)
            .field("metrics", &self.metrics.is_some())
            .field("on_drop", &self.on_drop.is_some())
            .field("on_write", &self.on_write.is_some())
            .finish()
    }
}

/// What the handles share.
struct Shared {
    reporting: Reporting,
    budgets: Mutex<Budgets>,
    dropped: AtomicU64,
    metrics: Option<Arc<Metrics>>,
    on_drop: Option<DropHook>,
}

impl Shared {
    fn drop_causes(&self, reason: DropReason, n: u64) {
        if n == 0 {
            return;
        }
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.events_dropped("events", reason.metric(), n);
        }
        if let Some(hook) = &self.on_drop {
            hook(reason, n);
        }
    }

    /// Whether the budgets of `policy` (a uid, or a name when the uid is
    /// unknown) and `pod` (a uid) admit one more Event; a refusal is
    /// counted.
    fn admit(&self, policy_uid: Option<&str>, policy: &str, pod: Option<&str>) -> bool {
        // Uids and names apart, so a name can never spend a uid's budget.
        let policy = match policy_uid.filter(|u| !u.is_empty()) {
            Some(uid) => format!("uid:{uid}"),
            None => format!("name:{policy}"),
        };
        // A panic elsewhere while holding the lock leaves sound buckets.
        let refused = self
            .budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(&policy, pod, Instant::now());
        match refused {
            Ok(()) => true,
            Err(Refused::Pod) => {
                self.drop_causes(DropReason::PodBudget, 1);
                false
            }
            Err(Refused::Policy) => {
                self.drop_causes(DropReason::PolicyBudget, 1);
                false
            }
        }
    }
}

/// Hands causes to a [`Recorder`]. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct RecorderHandle {
    queue: mpsc::Sender<Emission>,
    shared: Arc<Shared>,
}

impl RecorderHandle {
    /// The reporter's flush sink ([`ReporterOptions::on_flush`]): called
    /// once per deduplicated finding on every flush, with its merged
    /// count.
    ///
    /// Emits `PolicyViolation` (the finding was enforced) or
    /// `PolicyWouldViolate` (monitor mode), a Warning regarding the pod,
    /// in its namespace, related to the policy. Only the finding's
    /// [redaction](Finding::redact) reaches the Event. A count of 0 (no
    /// new occurrence) emits nothing; a finding over its pod's or its
    /// policy's budget is dropped and counted.
    ///
    /// [`ReporterOptions::on_flush`]: kyverno_runtime_report::ReporterOptions::on_flush
    pub fn finding_flushed(&self, finding: &Finding, count: u64) {
        if count == 0 {
            return;
        }
        let redacted = finding.clone().redact();
        if !redacted.pod.is_addressable() {
            self.shared.drop_causes(DropReason::Unattributed, 1);
            return;
        }
        let admitted = self.shared.admit(
            Some(&redacted.policy_uid),
            &redacted.policy,
            Some(&redacted.pod.uid),
        );
        if admitted {
            let emission = event::for_finding(&redacted, count, &self.shared.reporting);
            self.enqueue(emission);
        }
    }

    /// The status flush's condition callback
    /// ([`FlushLoop::on_condition_changed`]): called for every condition a
    /// flush persisted whose status, reason or message changed.
    ///
    /// Emits `PolicyError`, a Warning regarding the RuntimePolicy (in
    /// `default`, where the Events of cluster-scoped objects live), when
    /// `Applied` or `TargetsValid` is now `False`; nothing for any other
    /// change. The condition's reason and message pass through
    /// [`sanitize`](kyverno_runtime_report::sanitize). A policy error over
    /// its policy's budget is dropped and counted.
    ///
    /// [`FlushLoop::on_condition_changed`]: kyverno_runtime_status::FlushLoop::on_condition_changed
    pub fn condition_changed(&self, policy: &PolicyRef, condition: &Condition) {
        if let Some(emission) = event::for_condition(policy, condition, &self.shared.reporting) {
            if self.shared.admit(policy.uid.as_deref(), &policy.name, None) {
                self.enqueue(emission);
            }
        }
    }

    /// [`finding_flushed`](Self::finding_flushed) as a reporter flush hook.
    pub fn flush_sink(&self) -> FlushHook {
        let handle = self.clone();
        Arc::new(move |finding, count| handle.finding_flushed(finding, count))
    }

    /// [`condition_changed`](Self::condition_changed) as a status flush
    /// callback.
    pub fn condition_callback(&self) -> impl Fn(&PolicyRef, &Condition) + Send + Sync + 'static {
        let handle = self.clone();
        move |policy, condition| handle.condition_changed(policy, condition)
    }

    /// Causes dropped since the recorder was made, for every reason.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Events waiting to be written.
    pub fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    fn enqueue(&self, emission: Emission) {
        match self.queue.try_send(emission) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared.drop_causes(DropReason::QueueFull, 1);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.shared.drop_causes(DropReason::Shutdown, 1);
            }
        }
    }
}

impl fmt::Debug for RecorderHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecorderHandle")
            .field("queued", &self.queued())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Writes Kubernetes Events (`events.k8s.io/v1`) for flushed findings and
/// for policy errors.
pub struct Recorder {
    writer: Writer,
    queue: mpsc::Receiver<Emission>,
    handle: RecorderHandle,
    shutdown_deadline: Duration,
}

/// What writes an Event.
struct Writer {
    client: kube::Client,
    max_attempts: u32,
    write_timeout: Duration,
    metrics: Option<Arc<Metrics>>,
    on_write: Option<WriteHook>,
}

impl Recorder {
    /// A recorder writing through `client` (which needs create, get and
    /// patch on `events.events.k8s.io` in the pods' namespaces and in
    /// `default`).
    pub fn new(client: kube::Client, options: RecorderOptions) -> Self {
        let RecorderOptions {
            reporting_controller,
            reporting_instance,
            queue_capacity,
            max_attempts,
            write_timeout,
            shutdown_deadline,
            pod_budget,
            policy_budget,
            budget_keys,
            metrics,
            on_drop,
            on_write,
        } = options;
        let mut instance = reporting_instance;
        if instance.len() > MAX_INSTANCE_LEN {
            let mut end = MAX_INSTANCE_LEN;
            while !instance.is_char_boundary(end) {
                end -= 1;
            }
            instance.truncate(end);
        }
        // A tokio channel of capacity 0 panics.
        let (tx, rx) = mpsc::channel(queue_capacity.max(1));
        Recorder {
            writer: Writer {
                client,
                max_attempts: max_attempts.max(1),
                write_timeout,
                metrics: metrics.clone(),
                on_write,
            },
            queue: rx,
            handle: RecorderHandle {
                queue: tx,
                shared: Arc::new(Shared {
                    reporting: Reporting {
                        controller: reporting_controller,
                        instance,
                    },
                    budgets: Mutex::new(Budgets::new(pod_budget, policy_budget, budget_keys)),
                    dropped: AtomicU64::new(0),
                    metrics,
                    on_drop,
                }),
            },
            shutdown_deadline,
        }
    }

    /// A handle to hand causes over with.
    pub fn handle(&self) -> RecorderHandle {
        self.handle.clone()
    }

    /// [`RecorderHandle::finding_flushed`].
    pub fn finding_flushed(&self, finding: &Finding, count: u64) {
        self.handle.finding_flushed(finding, count);
    }

    /// [`RecorderHandle::condition_changed`].
    pub fn condition_changed(&self, policy: &PolicyRef, condition: &Condition) {
        self.handle.condition_changed(policy, condition);
    }

    /// Writes queued Events until `shutdown` completes, then drains what is
    /// queued (the write in progress included) within
    /// `shutdown_deadline`. What is still queued after that, and anything
    /// handed over afterwards, is counted as dropped
    /// ([`DropReason::Shutdown`]).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Recorder {
            writer,
            mut queue,
            handle,
            shutdown_deadline,
        } = self;
        let shared = Arc::clone(&handle.shared);
        // Our own sender must not keep the queue open.
        drop(handle);
        tokio::pin!(shutdown);
        let mut held = Held::new(HELD_MAX);
        loop {
            let step = if held.is_empty() {
                tokio::select! {
                    biased;
                    () = &mut shutdown => Step::Stop,
                    next = queue.recv() => next.map_or(Step::Stop, Step::Write),
                }
            } else {
                // The API server did not answer: what arrives meanwhile
                // waits behind what is held, and the oldest is tried again
                // when its backoff is up.
                tokio::select! {
                    biased;
                    () = &mut shutdown => Step::Stop,
                    () = tokio::time::sleep_until(held.due) => Step::Retry,
                    next = queue.recv() => next.map_or(Step::Stop, Step::Hold),
                }
            };
            let emission = match step {
                Step::Stop => break,
                Step::Hold(emission) => {
                    held.push_back(emission, &shared);
                    continue;
                }
                Step::Write(emission) => emission,
                Step::Retry => match held.pop_front() {
                    Some(emission) => emission,
                    None => continue,
                },
            };
            let write = writer.write(emission);
            tokio::pin!(write);
            tokio::select! {
                biased;
                outcome = &mut write => held.settle(outcome),
                () = &mut shutdown => {
                    return finish(&writer, &mut queue, held, write, shutdown_deadline, &shared).await;
                }
            }
        }
        finish(
            &writer,
            &mut queue,
            held,
            std::future::ready(None),
            shutdown_deadline,
            &shared,
        )
        .await;
    }
}

/// What the recorder's loop does next.
enum Step {
    /// Shut down.
    Stop,
    /// Write a new Event.
    Write(Emission),
    /// Hold a new Event behind those already held.
    Hold(Emission),
    /// Try the oldest held Event again.
    Retry,
}

/// Events held at most while the API server does not answer; past it the
/// newest is dropped and counted ([`DropReason::QueueFull`]).
const HELD_MAX: usize = 1024;
/// The first wait before a held Event is tried again; it doubles.
const HOLD_FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between tries of a held Event.
const HOLD_MAX_RETRY: Duration = Duration::from_secs(30);

/// Events whose write failed only because the API server did not answer
/// (unreachable, timed out, 5xx or 429 on every attempt), oldest first.
/// They are written once it answers again, in order (issue 34: an outage
/// of the API server loses no Event); only shutdown or more than
/// [`HELD_MAX`] of them drop any, counted.
struct Held {
    events: std::collections::VecDeque<Emission>,
    max: usize,
    /// When the oldest is tried again.
    due: tokio::time::Instant,
    /// The wait after the next failed try.
    backoff: Duration,
}

impl Held {
    fn new(max: usize) -> Self {
        Held {
            events: std::collections::VecDeque::new(),
            max,
            due: tokio::time::Instant::now(),
            backoff: HOLD_FIRST_RETRY,
        }
    }

    fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    fn len(&self) -> usize {
        self.events.len()
    }

    fn pop_front(&mut self) -> Option<Emission> {
        self.events.pop_front()
    }

    /// Holds a new Event, or drops it (counted) when [`HELD_MAX`] are held.
    fn push_back(&mut self, emission: Emission, shared: &Shared) {
        if self.events.len() >= self.max {
            shared.drop_causes(DropReason::QueueFull, 1);
            return;
        }
        self.events.push_back(emission);
    }

    /// What a write's outcome means for the held Events: one to hold (it
    /// goes first again, and the next try waits longer), or a success (the
    /// server answers: the rest are tried at once).
    fn settle(&mut self, outcome: Option<Emission>) {
        let now = tokio::time::Instant::now();
        match outcome {
            Some(emission) => {
                if self.events.is_empty() {
                    tracing::warn!(
                        "the API server does not take Events now (unreachable, timing out, or answering 5xx or 429): they are held and written once it does"
                    );
                }
                self.events.push_front(emission);
                self.due = now + self.backoff;
                self.backoff = (self.backoff * 2).min(HOLD_MAX_RETRY);
            }
            None => {
                if !self.events.is_empty() {
                    tracing::debug!(
                        held = self.events.len(),
                        "the API server answers again: writing the held Events"
                    );
                }
                self.due = now;
                self.backoff = HOLD_FIRST_RETRY;
            }
        }
    }
}

/// The shutdown drain: the write `in_flight`, then what is held, then what
/// is queued, within `deadline` (one try each: the server had its chance);
/// what is left is counted.
async fn finish(
    writer: &Writer,
    queue: &mut mpsc::Receiver<Emission>,
    mut held: Held,
    in_flight: impl Future<Output = Option<Emission>>,
    deadline: Duration,
    shared: &Shared,
) {
    // From here on a hand-over fails at once (and is counted).
    queue.close();
    let mut unwritten = 0u64;
    let drain = async {
        if in_flight.await.is_some() {
            unwritten += 1;
        }
        while let Some(emission) = held.pop_front() {
            if writer.write(emission).await.is_some() {
                unwritten += 1;
            }
        }
        while let Some(emission) = queue.recv().await {
            if writer.write(emission).await.is_some() {
                unwritten += 1;
            }
        }
    };
    if tokio::time::timeout(deadline, drain).await.is_err() {
        tracing::warn!(deadline = ?deadline, "Event drain ran out of time at shutdown");
    }
    let mut left = unwritten + u64::try_from(held.len()).unwrap_or(u64::MAX);
    while queue.try_recv().is_ok() {
        left += 1;
    }
    if left > 0 {
        tracing::warn!(events = left, "Events not written before shutdown");
    }
    shared.drop_causes(DropReason::Shutdown, left);
}

impl Writer {
    fn wrote(&self, result: WriteResult) {
        if let Some(metrics) = &self.metrics {
            result.count(metrics);
        }
        if let Some(hook) = &self.on_write {
            hook(result);
        }
    }

    /// Writes one Event, retries included, within `write_timeout`. Returns
    /// it when the write failed only because the API server did not answer
    /// (see [`Held`]): it is to be tried again later, and is not counted
    /// as failed (the attempt is, in the API health).
    async fn write(&self, emission: Emission) -> Option<Emission> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), emission.namespace());
        let outcome =
            tokio::time::timeout(self.write_timeout, self.write_retrying(&api, &emission)).await;
        let failure = match outcome {
            Ok(Ok(result)) => {
                self.wrote(result);
                return None;
            }
            Ok(Err(error)) => {
                let failure = WriteFailure::of(&error);
                if !failure.server_away() {
                    tracing::warn!(namespace = emission.namespace(), event = emission.name(), reason = failure.as_str(), error = %error, "Event write failed");
                }
                failure
            }
            Err(_) => WriteFailure::Timeout,
        };
        if failure.server_away() {
            tracing::debug!(
                namespace = emission.namespace(),
                event = emission.name(),
                reason = failure.as_str(),
                "Event write held: the API server did not answer"
            );
            if let Some(metrics) = &self.metrics {
                let api = metrics.api();
                api.failed(ApiResource::events, failure.api_failure(), api.now());
            }
            return Some(emission);
        }
        self.wrote(WriteResult::Failed(failure));
        None
    }

    async fn write_retrying(
        &self,
        api: &Api<Event>,
        emission: &Emission,
    ) -> Result<WriteResult, kube::Error> {
        let mut attempt = 1;
        loop {
            match write_once(api, emission).await {
                Ok(result) => return Ok(result),
                Err(failure) if failure.retry && attempt < self.max_attempts => {
                    tracing::debug!(namespace = emission.namespace(), event = emission.name(), attempt, error = %failure.error, "Event write failed; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(failure) => return Err(failure.error),
            }
        }
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("max_attempts", &self.writer.max_attempts)
            .field("write_timeout", &self.writer.write_timeout)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// A failed write attempt, and whether another may succeed.
struct Failure {
    error: kube::Error,
    retry: bool,
}

impl Failure {
    /// A failure of the create: a throttle, a server or transport error
    /// may pass; a refusal (a namespace that does not exist, a forbidden
    /// or invalid Event) will not.
    fn of_create(error: kube::Error) -> Failure {
        let retry = match &error {
            kube::Error::Api(s) => s.code == 429 || s.code >= 500,
            _ => true,
        };
        Failure { error, retry }
    }

    /// A failure of the read or patch of a stored Event: also a lost race
    /// (409) or an Event gone in between (404: it expired; the next
    /// attempt creates it again).
    fn of_update(error: kube::Error) -> Failure {
        let retry = match &error {
            kube::Error::Api(s) => matches!(s.code, 404 | 409 | 429) || s.code >= 500,
            _ => true,
        };
        Failure { error, retry }
    }
}

fn is_already_exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}

/// Creates the Event, or adds to the series of the stored one.
async fn write_once(api: &Api<Event>, emission: &Emission) -> Result<WriteResult, Failure> {
    match api.create(&PostParams::default(), &emission.event).await {
        Ok(_) => return Ok(WriteResult::Created),
        Err(error) if is_already_exists(&error) => {}
        Err(error) => return Err(Failure::of_create(error)),
    }
    let name = emission.name();
    let stored = api.get(name).await.map_err(Failure::of_update)?;
    let patch = series_patch(&stored, emission);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Failure::of_update)?;
    Ok(WriteResult::Patched)
}

/// The merge patch that adds `emission`'s occurrences to `stored`'s series,
/// conditional on the resourceVersion it was read at.
pub(crate) fn series_patch(stored: &Event, emission: &Emission) -> serde_json::Value {
    // An Event without a series has happened once.
    let (count, last) = match &stored.series {
        Some(s) => (s.count.max(1), Some(&s.last_observed_time)),
        None => (1, None),
    };
    let count = count.saturating_add(emission.occurrences.max(1)).max(2);
    let observed: &MicroTime = match last {
        Some(last) if last.0 > emission.observed.0 => last,
        _ => &emission.observed,
    };
    serde_json::json!({
        "metadata": { "resourceVersion": stored.metadata.resource_version },
        "series": { "count": count, "lastObservedTime": observed },
    })
}

/// A short wait that grows with the attempt.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50 * u64::from(attempt.min(10)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::events::v1::EventSeries;
    use k8s_openapi::jiff::Timestamp;
    use kyverno_runtime_report::{Behavior, PodIdentity};
    use std::sync::Mutex;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn at(secs: i64) -> MicroTime {
        MicroTime(Timestamp::from_second(secs).unwrap())
    }

    fn emission(occurrences: i32, observed: i64) -> Emission {
        Emission {
            event: Event::default(),
            occurrences,
            observed: at(observed),
        }
    }

    fn stored(series: Option<(i32, i64)>) -> Event {
        let mut e = Event::default();
        e.metadata.resource_version = Some("42".into());
        e.series = series.map(|(count, last)| EventSeries {
            count,
            last_observed_time: at(last),
        });
        e
    }

    #[test]
    fn series_patches_add_occurrences() {
        let p = series_patch(&stored(None), &emission(1, 100));
        assert_eq!(p["series"]["count"], 2);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(
            p["series"]["lastObservedTime"],
            serde_json::to_value(at(100)).unwrap()
        );
        let p = series_patch(&stored(Some((5, 200))), &emission(3, 100));
        assert_eq!(p["series"]["count"], 8);
        assert_eq!(
            p["series"]["lastObservedTime"],
            serde_json::to_value(at(200)).unwrap(),
            "the latest observation stays"
        );
        let p = series_patch(&stored(Some((i32::MAX, 1))), &emission(3, 100));
        assert_eq!(p["series"]["count"], i32::MAX, "saturates");
        assert!(p.get("note").is_none(), "the note is immutable");
    }

    fn finding(namespace: &str) -> Finding {
        Finding {
            policy: "p".into(),
            policy_uid: "u".into(),
            behavior: Behavior::Open,
            pod: PodIdentity {
                namespace: namespace.into(),
                name: "web-0".into(),
                uid: "aaaa-bbbb".into(),
                container: None,
                owner_kind: None,
                owner_name: None,
            },
            target: "/etc/shadow".into(),
            enforced: false,
            decision: None,
            count: 1,
            first_observed: UNIX_EPOCH,
            last_observed: SystemTime::now(),
            process: None,
            matched: Vec::new(),
        }
    }

    type Drops = Arc<Mutex<Vec<(DropReason, u64)>>>;

    fn recorder(capacity: usize) -> (Recorder, Drops) {
        let drops: Drops = Arc::default();
        let seen = Arc::clone(&drops);
        let options = RecorderOptions {
            queue_capacity: capacity,
            metrics: Some(Arc::new(Metrics::new())),
            on_drop: Some(Arc::new(move |r, n| seen.lock().unwrap().push((r, n)))),
            ..RecorderOptions::new("node-a")
        };
        // Never used: nothing here is written.
        let client = kube::Client::new(Refuse, "default");
        (Recorder::new(client, options), drops)
    }

    /// A client service that is never called.
    #[derive(Clone)]
    struct Refuse;

    impl tower::Service<http::Request<kube::client::Body>> for Refuse {
        type Response = http::Response<kube::client::Body>;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
            std::future::ready(Err(std::io::Error::other("no API server in a unit test")))
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_blocking() {
        let (recorder, drops) = recorder(2);
        let handle = recorder.handle();
        handle.finding_flushed(&finding("shop"), 1);
        recorder.finding_flushed(&finding("shop"), 2);
        handle.finding_flushed(&finding("shop"), 3);
        assert_eq!(handle.queued(), 2);
        assert_eq!(handle.dropped(), 1);
        assert_eq!(*drops.lock().unwrap(), [(DropReason::QueueFull, 1)]);
    }

    #[tokio::test]
    async fn nothing_new_emits_nothing_and_unattributed_findings_are_counted() {
        let (recorder, drops) = recorder(8);
        let handle = recorder.handle();
        handle.finding_flushed(&finding("shop"), 0);
        assert_eq!(handle.queued(), 0);
        handle.finding_flushed(&finding("Not A Namespace"), 1);
        assert_eq!(handle.queued(), 0);
        assert_eq!(*drops.lock().unwrap(), [(DropReason::Unattributed, 1)]);
    }

    #[tokio::test]
    async fn causes_after_shutdown_are_counted() {
        let (recorder, drops) = recorder(8);
        let handle = recorder.handle();
        recorder.run(std::future::ready(())).await;
        handle.finding_flushed(&finding("shop"), 1);
        assert_eq!(*drops.lock().unwrap(), [(DropReason::Shutdown, 1)]);
    }

    /// Issue 38 (11): one pod cannot take the whole queue (and the API
    /// server's attention): its causes beyond its budget are dropped, and
    /// every one is counted, by reason, in the metrics.
    #[tokio::test]
    async fn one_pods_causes_are_budgeted_and_counted() {
        let (recorder, drops) = recorder(10_000);
        let handle = recorder.handle();
        for i in 0..1000 {
            let mut f = finding("shop");
            f.target = format!("/usr/bin/tool-{i}");
            handle.finding_flushed(&f, 1);
        }
        // Another pod of the same policy still gets its Events.
        let mut other = finding("shop");
        other.pod.uid = "cccc-dddd".into();
        handle.finding_flushed(&other, 1);
        let burst = Budget::POD.burst as usize;
        assert_eq!(handle.queued(), burst + 1);
        assert_eq!(handle.queued() as u64 + handle.dropped(), 1001);
        let dropped = 1000 - burst as u64;
        assert_eq!(
            *drops.lock().unwrap(),
            vec![(DropReason::PodBudget, 1); dropped as usize]
        );
        let text = recorder.handle.shared.metrics.as_ref().unwrap().encode();
        let line = format!(
            "nirmata_runtime_events_dropped_total{{source=\"events\",reason=\"pod_budget\"}} {dropped}"
        );
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }

    /// Issue 38 (11): one policy cannot take the whole queue either, even
    /// spread over many pods, and its policy errors share its budget.
    #[tokio::test]
    async fn one_policys_causes_are_budgeted_and_counted() {
        let (recorder, drops) = recorder(10_000);
        let handle = recorder.handle();
        for i in 0..1000 {
            let mut f = finding("shop");
            f.pod.name = format!("web-{i}");
            f.pod.uid = format!("uid-{i}");
            handle.finding_flushed(&f, 1);
        }
        let policy = PolicyRef {
            name: "p".into(),
            uid: Some("u".into()),
        };
        let failed = Condition {
            type_: "Applied".into(),
            status: "False".into(),
            reason: "CompileFailed".into(),
            message: "bad".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            ),
            observed_generation: None,
        };
        handle.condition_changed(&policy, &failed);
        // Another policy is not affected.
        let mut other = finding("shop");
        other.policy_uid = "v".into();
        handle.finding_flushed(&other, 1);
        let burst = Budget::POLICY.burst as usize;
        assert_eq!(handle.queued(), burst + 1);
        assert_eq!(handle.queued() as u64 + handle.dropped(), 1002);
        let drops = drops.lock().unwrap();
        assert_eq!(drops.len(), 1001 - burst);
        assert!(drops.iter().all(|d| *d == (DropReason::PolicyBudget, 1)));
    }

    #[tokio::test]
    async fn reporting_instance_is_bounded() {
        let options = RecorderOptions::new("n".repeat(300));
        assert_eq!(options.reporting_controller, REPORTING_CONTROLLER);
        let recorder = Recorder::new(kube::Client::new(Refuse, "default"), options);
        let reporting = &recorder.handle.shared.reporting;
        assert_eq!(reporting.instance, "n".repeat(MAX_INSTANCE_LEN));
        assert_eq!(DropReason::QueueFull.as_str(), "queue_full");
        assert_eq!(WriteResult::Patched.as_str(), "patched");
        assert_eq!(
            WriteResult::Failed(WriteFailure::Forbidden).as_str(),
            "forbidden"
        );
    }
}
