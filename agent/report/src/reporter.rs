//! The reporter: findings in, OpenReports Reports out, one per pod or,
//! rolled up, one per controller.
//!
//! [`ReporterHandle::submit`] never blocks: it redacts the finding and
//! folds it into a buffer keyed by fingerprint, under a lock held only for
//! a map operation. [`Reporter::run`] flushes the buffer every interval
//! and once more on shutdown. A flush groups the findings by pod and
//! decides where each goes:
//!
//! - a pod that names no owner keeps its findings on its own Report;
//! - otherwise its controller chain is verified through the API (see
//!   `owners`), and a finding whose policy's
//!   `pod-policies.kyverno.io/autogen-controllers` (see [`Autogen`]) allows
//!   one of the verified controllers goes to the top-most such
//!   controller's Report (a CronJob's rather than its Job's), and is not
//!   repeated on the pod's; the rest stay on the pod's Report, marked with
//!   whether the owner verified ([`property::OWNER_VERIFIED`](crate::property::OWNER_VERIFIED)).
//!
//! A pod gone by the flush (deleted, or another pod of its name now) is
//! routed by the chain it verified with while it lived (`owners::recent`),
//! or, never verified, by the chain verified from the controller
//! reference the daemon's pod watch saw ([`ReporterHandle::saw_pod`]), so
//! its last findings still roll up. A pod's Report about another pod of
//! the same name is taken over only by the live pod of that name, read
//! through the API: a late write for a replaced pod is dropped and counted
//! ([`DropReason::Unattributed`]) rather than handing the live pod's
//! Report to a dead uid (`write.rs`).
//!
//! Per Report it reads what is stored, merges, skips the write if nothing
//! changed, and otherwise creates or replaces it with the resourceVersion
//! it read, starting over from a fresh read when another writer got there
//! first (a 409). That is what makes a controller's Report, which every
//! node with one of its pods writes, add up exactly.
//!
//! Next to the flush loop, `run` watches RuntimePolicies (metadata only)
//! for their roll-up settings, and removes a deleted policy's results from
//! the Reports holding them (found by their
//! [`POLICY_LABEL_PREFIX`](crate::POLICY_LABEL_PREFIX) label): at once
//! when the watch sees the deletion (after a delay spread over the nodes,
//! so one node does the work and the others find nothing left), and once
//! at start for policies deleted while no daemon ran.
//!
//! Nothing is lost silently. The buffer is bounded (`max_buffered`
//! distinct fingerprints) and shared fairly across pods (a flooding pod
//! gives up its own oldest entries to another pod's new one, see
//! `buffer.rs`); what does not fit, what has no pod to report on,
//! and what a write could not deliver is counted in
//! [`ReporterHandle::dropped`] and reported to the `on_drop` hook with a
//! [`DropReason`]. A write that may succeed later keeps its findings for
//! the next flush, at most `max_results` per pod (the most recent), since
//! no more fit in a Report anyway.
//!
//! Every flush first hands each deduplicated finding to the `on_flush`
//! hook ([`FlushHook`]), whatever becomes of the Report write after it:
//! that is how the Kubernetes Events recorder sees findings.
//!
//! A flush is cancel-safe: findings it took from the buffer and had not
//! written go back if its future is dropped (at shutdown, when the final
//! flush's deadline expires). The one imprecision is a write the API server
//! applied whose response never arrived: its findings are kept and counted
//! again on the next flush. An over-count was preferred to a loss.

mod cleanup;
mod write;

use write::Counted;

use crate::autogen::Autogen;
use crate::buffer::FindingBuffer;
use crate::error::{is_retryable, Error, Result};
use crate::finding::{is_dns1123_subdomain, Finding, Fingerprint};
use crate::merge::{desired_pod_report, PodKey, Subject};
use crate::owners::{
    self, Chain, Controller, NamedOwner, Owners, RecentChains, SeenPods, KEEP_CHAINS_FOR,
    MAX_REMEMBERED,
};
use crate::policies::{Policies, PolicyState};
use crate::result::OwnerMark;
use crate::sanitize::sanitize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Why findings were dropped (`events_dropped_total{source="reporter",reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The buffer held `max_buffered` distinct findings already (the new
    /// finding of the pod holding most, or that pod's oldest, evicted for
    /// another pod's), or a failed pod's retained findings exceeded
    /// `max_results`.
    BufferFull,
    /// The finding names no pod a Report can be written for: not a valid
    /// pod identity, or a pod replaced by another of the same name (a
    /// StatefulSet's pod recreated) whose Report it is now, when the
    /// finding does not roll up to a controller.
    Unattributed,
    /// The API server refused the write in a way retrying cannot change.
    WriteFailed,
    /// Submitted after the reporter stopped, or still unwritten when the
    /// final flush ran out of time.
    Shutdown,
    /// The finding's policy was deleted before it was written: writing it
    /// would put back results the cleanup removes.
    PolicyDeleted,
}

impl DropReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::BufferFull => "buffer_full",
            DropReason::Unattributed => "unattributed",
            DropReason::WriteFailed => "write_failed",
            DropReason::Shutdown => "shutdown",
            DropReason::PolicyDeleted => "policy_deleted",
        }
    }
}

/// How one Report write attempt ended (`report_writes_total{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteResult {
    /// The Report did not exist and was created.
    Created,
    /// The Report was replaced.
    Updated,
    /// The merge equals what is stored: no write was made.
    Unchanged,
    /// Another writer changed the Report in between; retried from a fresh
    /// read.
    Conflict,
    /// The write (or the read before it) failed.
    Error,
}

impl WriteResult {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteResult::Created => "created",
            WriteResult::Updated => "updated",
            WriteResult::Unchanged => "unchanged",
            WriteResult::Conflict => "conflict",
            WriteResult::Error => "error",
        }
    }
}

/// Called with each drop's reason and how many findings it dropped. Runs on
/// the submitting or flushing task: it must be quick and must not block.
pub type DropHook = Arc<dyn Fn(DropReason, u64) + Send + Sync>;

/// Called once per write attempt outcome (a conflict, then the retry's
/// outcome). Runs on the flushing task: quick, never blocking.
pub type WriteHook = Arc<dyn Fn(WriteResult) + Send + Sync>;

/// Called with the API server's error of every write that failed on one
/// (after [`WriteHook`]'s [`WriteResult::Error`]), so the caller can tell
/// a refusal from a 5xx or no answer. Runs on the flushing task: quick,
/// never blocking.
pub type WriteErrorHook = Arc<dyn Fn(&kube::Error) + Send + Sync>;

/// Called by every flush once per deduplicated finding, before the
/// Report writes and whatever their outcome, with the finding and the
/// occurrences it gained since the last flush (its merged count; see
/// [`ReporterOptions::on_flush`]). Runs on the flushing task: quick,
/// never blocking (hand work to a channel).
pub type FlushHook = Arc<dyn Fn(&Finding, u64) + Send + Sync>;

/// How a [`Reporter`] behaves.
#[derive(Clone)]
pub struct ReporterOptions {
    /// Time between flushes (10 s: what bounds how far a Report lags).
    pub interval: Duration,
    /// Results per Report; beyond it the oldest go (500).
    pub max_results: usize,
    /// How long the final flush on shutdown may take (5 s), well inside a
    /// pod's default 30 s termination grace period.
    pub shutdown_deadline: Duration,
    /// Distinct findings the buffer holds between flushes (10 000: a few MB
    /// at most, every string being bounded by redaction).
    pub max_buffered: usize,
    /// Writes tried per Report per flush before giving up on conflicts (5).
    pub max_write_attempts: u32,
    /// Told about every drop (for `events_dropped_total`).
    pub on_drop: Option<DropHook>,
    /// Told about every write attempt (for `report_writes_total`).
    pub on_write: Option<WriteHook>,
    /// Told how every failed write failed (for the API health).
    pub on_write_error: Option<WriteErrorHook>,
    /// Told about every deduplicated finding of every flush (the
    /// Kubernetes Events recorder's entry point), after deduplication and
    /// before the write, so a failed write does not hide a finding from
    /// it.
    ///
    /// The finding is the one the reporter buffered, which was
    /// [redacted](Finding::redact) at submission (the raw finding is never
    /// kept); its fingerprint is the raw finding's. The count is its merged
    /// occurrence count for this flush. A finding kept over from a failed
    /// write is presented again on the next flush with only the
    /// occurrences it gained since (possibly 0), so what the hook adds up
    /// is what happened, not how often a write failed.
    pub on_flush: Option<FlushHook>,
    /// The node this reporter runs on: where in `cleanup_spread` its
    /// cleanup of a deleted policy's results starts.
    pub node: String,
    /// The cleanup after a policy's deletion starts at a delay between
    /// zero and this (30 s), the same for a node every time and spread
    /// over the nodes, so the first node does the work and the others find
    /// nothing left to do.
    pub cleanup_spread: Duration,
    /// How long the owner lookups that verify a pod's controller chain,
    /// and a policy's roll-up setting read outside the watch, are cached
    /// (30 s).
    pub lookup_ttl: Duration,
}

impl Default for ReporterOptions {
    fn default() -> Self {
        ReporterOptions {
            interval: Duration::from_secs(10),
            max_results: 500,
            shutdown_deadline: Duration::from_secs(5),
            max_buffered: 10_000,
            max_write_attempts: 5,
            on_drop: None,
            on_write: None,
            on_write_error: None,
            on_flush: None,
            node: String::new(),
            cleanup_spread: Duration::from_secs(30),
            lookup_ttl: Duration::from_secs(30),
        }
    }
}

impl fmt::Debug for ReporterOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReporterOptions")
            .field("interval", &self.interval)
            .field("max_results", &self.max_results)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .field("max_buffered", &self.max_buffered)
            .field("max_write_attempts", &self.max_write_attempts)
            .field("on_drop", &self.on_drop.is_some())
            .field("on_write", &self.on_write.is_some())
            .field("on_write_error", &self.on_write_error.is_some())
            .field("on_flush", &self.on_flush.is_some())
            .field("node", &self.node)
            .field("cleanup_spread", &self.cleanup_spread)
            .field("lookup_ttl", &self.lookup_ttl)
            .finish()
    }
}

/// What one flush did, per Report.
#[derive(Debug, Default)]
pub struct Flushed {
    /// One entry per Report that had findings: pods' in namespace/name
    /// order, then controllers'.
    pub outcomes: Vec<PodOutcome>,
}

/// How one Report (a pod's or a controller's) fared in a flush.
#[derive(Debug)]
pub struct PodOutcome {
    /// The Report's namespace (its pod's or controller's).
    pub namespace: String,
    /// The Report's name.
    pub report: String,
    /// Distinct findings this flush had for the Report (for a
    /// controller's, the findings of all its pods).
    pub findings: usize,
    /// The final outcome of the write (`Created`, `Updated`, `Unchanged`),
    /// or why it failed.
    pub result: Result<WriteResult>,
}

/// What the handles and the flush loop share.
struct Shared {
    buffer: Mutex<FindingBuffer>,
    /// Occurrences of buffered findings that an earlier flush handed to
    /// the `on_flush` hook already (findings kept over from a failed
    /// write). Kept only when there is such a hook, and only for findings
    /// in the buffer.
    announced: Mutex<HashMap<Fingerprint, u64>>,
    /// Whether to keep `announced` (there is an `on_flush` hook).
    track_announced: bool,
    dropped: AtomicU64,
    closed: AtomicBool,
    max_buffered: usize,
    max_results: usize,
    on_drop: Option<DropHook>,
    /// What the pod watch saw of recent pods, for the findings of those
    /// gone before their chain was verified (see `owners::recent`).
    seen: SeenPods,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FindingBuffer> {
        // Every critical section is one map operation or a whole-map swap,
        // so a panic inside one cannot leave the map half-updated: use it.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn drop_findings(&self, reason: DropReason, count: u64) {
        if count == 0 {
            return;
        }
        self.dropped.fetch_add(count, Ordering::Relaxed);
        if let Some(hook) = &self.on_drop {
            hook(reason, count);
        }
    }

    fn submit(&self, finding: Finding) {
        if self.closed.load(Ordering::Relaxed) {
            self.drop_findings(DropReason::Shutdown, 1);
            return;
        }
        let mut finding = finding.redact();
        finding.normalize_window();
        if !finding.pod.is_addressable() {
            self.drop_findings(DropReason::Unattributed, 1);
            return;
        }
        let fingerprint = finding.fingerprint_of_redacted();
        let full = { self.lock().insert(self.max_buffered, fingerprint, finding) };
        if full {
            self.drop_findings(DropReason::BufferFull, 1);
        }
    }

    fn take(&self) -> HashMap<Fingerprint, Finding> {
        self.lock().take()
    }

    fn lock_announced(&self) -> MutexGuard<'_, HashMap<Fingerprint, u64>> {
        // One map operation or a swap per critical section, as `lock`.
        self.announced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What earlier flushes announced of the findings just taken.
    fn take_announced(&self) -> HashMap<Fingerprint, u64> {
        if !self.track_announced {
            return HashMap::new();
        }
        std::mem::take(&mut *self.lock_announced())
    }

    /// Puts findings that could not be written back for the next flush: at
    /// most `max_results` per pod, the most recent, and only as many
    /// distinct findings as the buffer holds.
    ///
    /// The cap is per pod whatever the groups are: a controller's group
    /// holds the findings of many pods, which fold into fewer results.
    fn requeue(&self, groups: impl IntoIterator<Item = BTreeMap<Fingerprint, Finding>>) {
        let mut by_pod: BTreeMap<PodKey, Vec<(Fingerprint, Finding)>> = BTreeMap::new();
        for (fingerprint, finding) in groups.into_iter().flatten() {
            by_pod
                .entry(PodKey::of(&finding))
                .or_default()
                .push((fingerprint, finding));
        }
        let mut over_cap = 0u64;
        let mut keep = Vec::new();
        for mut group in by_pod.into_values() {
            if group.len() > self.max_results {
                group.sort_by_key(|(_, f)| std::cmp::Reverse(f.last_observed));
                over_cap += (group.len() - self.max_results) as u64;
                group.truncate(self.max_results);
            }
            keep.extend(group);
        }
        let mut full = 0u64;
        let mut kept = Vec::new();
        {
            let mut buffer = self.lock();
            for (fingerprint, finding) in keep {
                let count = finding.count;
                if buffer.insert(self.max_buffered, fingerprint, finding) {
                    full += 1;
                } else if self.track_announced {
                    kept.push((fingerprint, count));
                }
            }
        }
        if !kept.is_empty() {
            // These were announced by the flush that took them; the next
            // flush announces only what they gain in between.
            let mut announced = self.lock_announced();
            for (fingerprint, count) in kept {
                let seen = announced.entry(fingerprint).or_default();
                *seen = seen.saturating_add(count);
            }
        }
        self.drop_findings(DropReason::BufferFull, over_cap + full);
    }
}

/// Which Report a group of findings is written to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Dest {
    Pod(PodKey),
    Controller(Controller),
}

/// The findings a flush took and has not settled yet, by destination:
/// put back into the buffer when dropped, so a cancelled flush loses
/// nothing.
struct Pending<'a> {
    shared: &'a Shared,
    groups: BTreeMap<Dest, BTreeMap<Fingerprint, Finding>>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let groups = std::mem::take(&mut self.groups);
        if !groups.is_empty() {
            self.shared.requeue(groups.into_values());
        }
    }
}

/// Where a pod's findings go, from its verified owners.
#[derive(Debug)]
enum Route {
    /// The pod's own Report, with its
    /// [`property::OWNER_VERIFIED`](crate::property::OWNER_VERIFIED) mark.
    Pod(Option<OwnerMark>),
    /// Its verified controllers, nearest first: each finding goes to the
    /// top-most one its policy rolls up to, else stays on the pod's Report
    /// (naming the verified `owner`).
    Controllers {
        owner: NamedOwner,
        chain: Vec<Controller>,
    },
    /// The API failed in a way worth retrying: keep the findings for the
    /// next flush rather than put them on the wrong Report.
    Retry,
}

/// What a flush knows about a policy of a rolled-up finding.
#[derive(Debug)]
enum Setting {
    Live(Autogen),
    Deleted,
    Retry,
}

/// Submits findings to a [`Reporter`]. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct ReporterHandle {
    shared: Arc<Shared>,
}

impl ReporterHandle {
    /// Buffers a finding for the next flush.
    ///
    /// The finding is [redacted](Finding::redact) first, so the raw argv or
    /// path it may carry never waits in memory; one with the fingerprint of
    /// a buffered finding is folded into it (counts add, the window
    /// widens). A finding naming no addressable pod, one that does not fit
    /// the buffer, or one submitted after the reporter stopped is dropped
    /// and counted.
    pub fn submit(&self, finding: Finding) {
        self.shared.submit(finding);
    }

    /// Notes what the pod watch saw of `pod` (call it on every apply and
    /// delete the watch delivers): its namespace, name, labels and
    /// controller reference, by uid, for 15 minutes (at most 20 000 pods,
    /// the least recently seen forgotten). No API call: this is read only
    /// when the pod's first findings are flushed after it is gone, to
    /// verify its chain from its owner up (see `owners::recent`).
    pub fn saw_pod(&self, pod: &k8s_openapi::api::core::v1::Pod) {
        self.shared.seen.saw(pod);
    }

    /// Findings dropped since the reporter was made, for every reason.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Distinct findings waiting for the next flush.
    pub fn buffered(&self) -> usize {
        self.shared.lock().len()
    }
}

impl fmt::Debug for ReporterHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReporterHandle")
            .field("buffered", &self.buffered())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Writes buffered findings into OpenReports Reports: one per pod, or one
/// per controller for the findings its policy rolls up.
pub struct Reporter {
    client: kube::Client,
    shared: Arc<Shared>,
    interval: Duration,
    shutdown_deadline: Duration,
    max_write_attempts: u32,
    on_write: Option<WriteHook>,
    on_write_error: Option<WriteErrorHook>,
    on_flush: Option<FlushHook>,
    owners: Owners,
    /// The chains of pods verified recently, for their findings flushed
    /// after they are gone (see `owners::recent`).
    recent: RecentChains,
    policies: Policies,
    counted: Mutex<Counted>,
    node: String,
    cleanup_spread: Duration,
}

impl Reporter {
    /// A reporter writing through `client`, which needs get, create,
    /// update and list on `reports.openreports.io`; get on pods,
    /// replicasets, deployments, statefulsets, daemonsets, jobs and
    /// cronjobs (verifying owners); and get, list and watch on
    /// runtimepolicies (their roll-up settings).
    pub fn new(client: kube::Client, options: ReporterOptions) -> Self {
        let ReporterOptions {
            interval,
            max_results,
            shutdown_deadline,
            max_buffered,
            max_write_attempts,
            on_drop,
            on_write,
            on_write_error,
            on_flush,
            node,
            cleanup_spread,
            lookup_ttl,
        } = options;
        Reporter {
            owners: Owners::new(client.clone(), lookup_ttl, 20_000),
            recent: RecentChains::new(KEEP_CHAINS_FOR, MAX_REMEMBERED),
            policies: Policies::new(client.clone(), lookup_ttl),
            counted: Mutex::new(Counted::default()),
            node,
            cleanup_spread,
            client,
            shared: Arc::new(Shared {
                buffer: Mutex::new(FindingBuffer::default()),
                announced: Mutex::new(HashMap::new()),
                track_announced: on_flush.is_some(),
                dropped: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                max_buffered,
                // A Report with room for nothing would drop every finding.
                max_results: max_results.max(1),
                on_drop,
                seen: SeenPods::new(KEEP_CHAINS_FOR, MAX_REMEMBERED),
            }),
            // A zero interval would make `tokio::time::interval` panic.
            interval: interval.max(Duration::from_millis(1)),
            shutdown_deadline,
            max_write_attempts: max_write_attempts.max(1),
            on_write,
            on_write_error,
            on_flush,
        }
    }

    /// A handle to submit findings with.
    pub fn handle(&self) -> ReporterHandle {
        ReporterHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Flushes every interval until `shutdown` completes, then once more
    /// within `shutdown_deadline`, so the last window is not lost on a
    /// rollout. The first flush comes one interval after the start.
    /// Meanwhile it watches RuntimePolicies for their roll-up settings and
    /// removes the results of deleted ones (see the module docs).
    ///
    /// A flush in progress when `shutdown` completes is abandoned (its
    /// unwritten findings go back to the buffer) and the final flush starts
    /// on its own fresh deadline, so a slow API server cannot stretch
    /// shutdown beyond it. Whatever is still unwritten after the final
    /// flush is counted as dropped ([`DropReason::Shutdown`]), and so is
    /// anything submitted afterwards.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (cleanup_tx, cleanup_rx) = tokio::sync::mpsc::unbounded_channel();
        // Neither of these ends on its own; should one, the flush loop
        // still runs to shutdown.
        let watch = async {
            self.policies.watch(cleanup_tx).await;
            std::future::pending::<()>().await;
        };
        let cleanup = async {
            self.cleanup_loop(cleanup_rx).await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            () = self.flush_loop(shutdown) => {}
            () = watch => {}
            () = cleanup => {}
        }
    }

    async fn flush_loop(&self, shutdown: impl Future<Output = ()>) {
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticks = tokio::time::interval_at(start, self.interval);
        // A flush slower than the interval delays the next one instead of
        // queueing a catch-up burst.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = ticks.tick() => {
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        _ = self.flush() => {}
                    }
                }
            }
        }
        tracing::debug!("final Report flush on shutdown");
        if tokio::time::timeout(self.shutdown_deadline, self.flush())
            .await
            .is_err()
        {
            tracing::warn!(
                deadline = ?self.shutdown_deadline,
                "final Report flush ran out of time"
            );
        }
        self.shared.closed.store(true, Ordering::Relaxed);
        let left = self.shared.take().len() as u64;
        if left > 0 {
            tracing::warn!(findings = left, "findings not written before shutdown");
        }
        self.shared.drop_findings(DropReason::Shutdown, left);
    }

    /// Writes every buffered finding now, to its pod's or its controller's
    /// Report. A Report whose write fails does not stop the others; see
    /// [`Flushed`] for what happened to each. Every finding is handed to
    /// the `on_flush` hook first.
    pub async fn flush(&self) -> Flushed {
        let mut pending = Pending {
            shared: &self.shared,
            groups: BTreeMap::new(),
        };
        let taken = self.shared.take();
        let announced = self.shared.take_announced();
        for (fingerprint, finding) in taken {
            pending
                .groups
                .entry(Dest::Pod(PodKey::of(&finding)))
                .or_default()
                .insert(fingerprint, finding);
        }
        if let Some(hook) = &self.on_flush {
            for (fingerprint, finding) in pending.groups.values().flatten() {
                let seen = announced.get(fingerprint).copied().unwrap_or(0);
                hook(finding, finding.count.saturating_sub(seen));
            }
        }
        self.drop_retired(&mut pending);
        let (routes, settings) = self.route(&pending).await;
        let marks = self.regroup(&mut pending, routes, &settings);
        self.owners.prune();
        self.recent.prune();
        self.shared.seen.prune();

        let dests: Vec<Dest> = pending.groups.keys().cloned().collect();
        let mut flushed = Flushed::default();
        for dest in dests {
            let Some(findings) = pending.groups.get(&dest) else {
                continue;
            };
            let count = findings.len();
            let (subject, result) = match &dest {
                Dest::Pod(pod) => {
                    let mark = marks.get(pod);
                    let max = self.shared.max_results;
                    let result = self
                        .write(Subject::Pod(pod), Some(pod), |stored| {
                            desired_pod_report(stored, pod, findings, max, mark)
                        })
                        .await;
                    (Subject::Pod(pod), result)
                }
                Dest::Controller(controller) => (
                    Subject::Controller(controller),
                    self.write_controller(controller, findings).await,
                ),
            };
            let outcome_namespace = subject.namespace().to_string();
            let outcome_report = subject.report_name();
            let findings = pending.groups.remove(&dest).unwrap_or_default();
            match &result {
                Ok(_) => {}
                Err(e @ Error::Superseded { .. }) => {
                    tracing::info!(error = %e, findings = count, "findings of a pod replaced by another of its name; dropping them");
                    self.shared
                        .drop_findings(DropReason::Unattributed, count as u64);
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, findings = count, "Report write failed; keeping its findings for the next flush");
                    self.shared.requeue([findings]);
                }
                Err(e) => {
                    tracing::warn!(error = %e, findings = count, "Report write refused; dropping its findings");
                    self.shared
                        .drop_findings(DropReason::WriteFailed, count as u64);
                }
            }
            flushed.outcomes.push(PodOutcome {
                namespace: outcome_namespace,
                report: outcome_report,
                findings: count,
                result,
            });
        }
        flushed
    }

    /// Drops (and counts) the findings of policies known to be deleted.
    fn drop_retired(&self, pending: &mut Pending<'_>) {
        let mut dropped = 0u64;
        for findings in pending.groups.values_mut() {
            findings.retain(|_, f| {
                let keep = !self.policies.is_retired(&f.policy_uid);
                dropped += u64::from(!keep);
                keep
            });
        }
        pending.groups.retain(|_, findings| !findings.is_empty());
        self.shared
            .drop_findings(DropReason::PolicyDeleted, dropped);
    }

    /// Where each pod's findings go: its verified owners, and the roll-up
    /// settings of the policies of those that may roll up. Pods whose
    /// findings name no owner are not looked up (they stay on their
    /// Report).
    async fn route(
        &self,
        pending: &Pending<'_>,
    ) -> (HashMap<PodKey, Route>, HashMap<String, Setting>) {
        let mut routes = HashMap::new();
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        for (dest, findings) in &pending.groups {
            let Dest::Pod(pod) = dest else {
                continue;
            };
            if findings.values().all(|f| f.pod.owner_kind.is_none()) {
                continue;
            }
            let resolved = owners::resolve_remembering(
                &self.owners,
                &self.recent,
                &self.shared.seen,
                &pod.namespace,
                &pod.name,
                &pod.uid,
            )
            .await;
            let route = match resolved {
                Ok(Chain::NoOwner) => Route::Pod(None),
                Ok(Chain::Unverified(why)) => {
                    tracing::debug!(namespace = %pod.namespace, pod = %pod.name, reason = ?why, "the pod's claimed owner did not verify; its findings stay on its Report");
                    Route::Pod(Some(OwnerMark::Unverified))
                }
                Ok(Chain::Verified {
                    owner,
                    rollup: chain,
                }) => {
                    // What a Report can name as its scope: a controller
                    // whose identity the chokepoint would alter is not
                    // addressable (no real one is like that).
                    let chain: Vec<Controller> = chain
                        .into_iter()
                        .filter(|c| {
                            sanitize(&c.name) == c.name
                                && sanitize(&c.uid) == c.uid
                                && is_dns1123_subdomain(&c.name)
                        })
                        .collect();
                    if chain.is_empty() {
                        Route::Pod(Some(OwnerMark::Verified(owner)))
                    } else {
                        for f in findings.values() {
                            wanted.insert(f.policy_uid.clone(), f.policy.clone());
                        }
                        Route::Controllers { owner, chain }
                    }
                }
                Err(e) if is_retryable(&e) => {
                    tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %e, "could not read the pod's owners; keeping its findings for the next flush");
                    Route::Retry
                }
                Err(e) => {
                    tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %e, "reading the pod's owners was refused; its findings stay on its Report, marked unverified (does the ClusterRole grant get on pods and their controllers?)");
                    Route::Pod(Some(OwnerMark::Unverified))
                }
            };
            routes.insert(pod.clone(), route);
        }
        let mut settings = HashMap::new();
        for (uid, name) in wanted {
            let setting = match self.policies.state(&name, &uid).await {
                Ok(PolicyState::Live(autogen)) => Setting::Live(autogen),
                Ok(PolicyState::Deleted) => Setting::Deleted,
                Err(e) if is_retryable(&e) => {
                    tracing::warn!(policy = %name, error = %e, "could not read the policy's roll-up setting; keeping its findings for the next flush");
                    Setting::Retry
                }
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "reading the policy's roll-up setting was refused; rolling up to every controller, as without the annotation");
                    Setting::Live(Autogen::all())
                }
            };
            settings.insert(uid, setting);
        }
        (routes, settings)
    }

    /// Moves each pod's findings to their destinations per `routes`,
    /// keeps the ones to retry for the next flush, drops those of deleted
    /// policies, and returns the owner marks of the pods that keep
    /// findings on their own Reports.
    fn regroup(
        &self,
        pending: &mut Pending<'_>,
        routes: HashMap<PodKey, Route>,
        settings: &HashMap<String, Setting>,
    ) -> HashMap<PodKey, OwnerMark> {
        let mut marks = HashMap::new();
        let mut retry = Vec::new();
        let mut deleted = 0u64;
        for (pod, route) in routes {
            let Some(findings) = pending.groups.remove(&Dest::Pod(pod.clone())) else {
                continue;
            };
            let chain = match route {
                Route::Retry => {
                    retry.push(findings);
                    continue;
                }
                Route::Pod(mark) => {
                    if let Some(mark) = mark {
                        marks.insert(pod.clone(), mark);
                    }
                    pending.groups.insert(Dest::Pod(pod), findings);
                    continue;
                }
                Route::Controllers { owner, chain } => {
                    marks.insert(pod.clone(), OwnerMark::Verified(owner));
                    chain
                }
            };
            let mut later = BTreeMap::new();
            for (fingerprint, finding) in findings {
                let dest = match settings.get(&finding.policy_uid) {
                    Some(Setting::Retry) => {
                        later.insert(fingerprint, finding);
                        continue;
                    }
                    Some(Setting::Deleted) => {
                        deleted += 1;
                        continue;
                    }
                    Some(Setting::Live(autogen)) => chain
                        .iter()
                        .rev()
                        .find(|c| autogen.allows(c.kind))
                        .map_or_else(|| Dest::Pod(pod.clone()), |c| Dest::Controller(c.clone())),
                    None => Dest::Pod(pod.clone()),
                };
                pending
                    .groups
                    .entry(dest)
                    .or_default()
                    .insert(fingerprint, finding);
            }
            if !later.is_empty() {
                retry.push(later);
            }
        }
        if !retry.is_empty() {
            self.shared.requeue(retry);
        }
        self.shared
            .drop_findings(DropReason::PolicyDeleted, deleted);
        marks
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("interval", &self.interval)
            .field("shutdown_deadline", &self.shutdown_deadline)
            .field("max_write_attempts", &self.max_write_attempts)
            .field("handle", &self.handle())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
