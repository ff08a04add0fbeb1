//! The flush loop: every interval (30 s by default) and once on shutdown,
//! write this node's report on every policy it knows.
//!
//! The daemon keeps [`Reports`] current as policies are compiled, attached
//! and matched; the loop does not flush on each such change, because a
//! burst of pod events would otherwise become a burst of writes from every
//! node at once. What the interval batches, the writer's conflict retries
//! then make converge. The final flush on shutdown is what lets a rollout
//! leave the last state of this node behind instead of up to 30 s older.

use crate::{ClusterView, Error, Flushed, NodeReport, StatusWriter};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

/// The default flush interval (the specification's 30 s).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// Which policy a persisted condition belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef {
    /// The policy's name (RuntimePolicy is cluster-scoped).
    pub name: String,
    /// Its uid as read by the flush that persisted the change; Kubernetes
    /// Events name the object they are about by it.
    pub uid: Option<String>,
}

/// Called once for every condition a flush persisted whose status, reason
/// or message changed.
pub type ConditionCallback = Arc<dyn Fn(&PolicyRef, &Condition) + Send + Sync>;

/// This node's current report on each policy, shared between the parts of
/// the daemon that learn things and the flush loop that writes them.
#[derive(Clone, Default)]
pub struct Reports {
    inner: Arc<Mutex<BTreeMap<String, NodeReport>>>,
}

impl Reports {
    /// No policies yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeReport>> {
        // A panic while holding the lock cannot leave a map half-updated
        // (every operation is a single insert or remove), so the data is
        // still sound and status keeps flowing.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets this node's report on `policy`, replacing any earlier one.
    pub fn set(&self, policy: impl Into<String>, report: NodeReport) {
        self.lock().insert(policy.into(), report);
    }

    /// Changes this node's report on `policy` in place (starting from an
    /// empty report), so independent parts of the daemon can each update
    /// their own fields.
    pub fn update(&self, policy: &str, f: impl FnOnce(&mut NodeReport)) {
        f(self.lock().entry(policy.to_string()).or_default());
    }

    /// Stops reporting on `policy` (it was deleted).
    pub fn remove(&self, policy: &str) {
        self.lock().remove(policy);
    }

    /// A copy of every report, so no lock is held across a write.
    pub fn snapshot(&self) -> Vec<(String, NodeReport)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Flushes this node's reports on an interval and on shutdown.
pub struct FlushLoop {
    writer: StatusWriter,
    reports: Reports,
    view: watch::Receiver<ClusterView>,
    interval: Duration,
    on_change: Option<ConditionCallback>,
    on_failure: Option<FailureCallback>,
    on_success: Option<SuccessCallback>,
}

/// What [`FlushLoop::on_write_ok`] calls.
type SuccessCallback = Arc<dyn Fn() + Send + Sync>;

/// What [`FlushLoop::on_write_failed`] calls.
type FailureCallback = Arc<dyn Fn(&Error) + Send + Sync>;

impl FlushLoop {
    /// A loop writing `reports` through `writer`, judging shards against
    /// the latest `view` (from [`crate::ClusterWatcher`]).
    pub fn new(writer: StatusWriter, reports: Reports, view: watch::Receiver<ClusterView>) -> Self {
        FlushLoop {
            writer,
            reports,
            view,
            interval: DEFAULT_INTERVAL,
            on_change: None,
            on_failure: None,
            on_success: None,
        }
    }

    /// Flushes every `interval` instead of every 30 s.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Calls `f` for every write of a policy's status that failed (a
    /// policy deleted before its write is not a failure), so that the
    /// daemon counts them by [`Error::metric_label`] beside the log line.
    /// It runs on the loop's task: it must be quick.
    pub fn on_write_failed(mut self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.on_failure = Some(Arc::new(f));
        self
    }

    /// Calls `f` for every policy whose status flush succeeded (written,
    /// or already as it should be), so that the daemon can tell when
    /// status writes that failed go through again. It runs on the loop's
    /// task: it must be quick.
    pub fn on_write_ok(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_success = Some(Arc::new(f));
        self
    }

    /// Calls `f` for every condition a flush persisted whose status,
    /// reason or message changed. It runs on the loop's task: it must be
    /// quick and must not block (hand work to a channel).
    pub fn on_condition_changed(
        mut self,
        f: impl Fn(&PolicyRef, &Condition) + Send + Sync + 'static,
    ) -> Self {
        self.on_change = Some(Arc::new(f));
        self
    }

    /// Flushes every interval until `shutdown` completes, then once more.
    /// The first flush comes one interval after the start: the daemon's
    /// first reports are not settled at once, and a restart of every
    /// daemon must not become a write storm. Bound the whole call with a
    /// deadline if the API server may be unreachable at shutdown; the final
    /// flush, like every other, retries only conflicts.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticks = tokio::time::interval_at(start, self.interval);
        // A flush slower than the interval delays the next one instead of
        // queueing a catch-up burst.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                // Shutdown first: a due tick must not delay it.
                biased;
                () = &mut shutdown => break,
                _ = ticks.tick() => {
                    self.flush_all().await;
                }
            }
        }
        tracing::debug!(node = %self.writer.node(), "final status flush on shutdown");
        self.flush_all().await;
    }

    /// Writes this node's report on every policy once, calling the
    /// condition callback for what each write changed. A failure of one
    /// policy does not stop the others; a policy deleted since its report
    /// was set is skipped quietly (its status went with it).
    pub async fn flush_all(&self) -> Vec<(String, Result<Flushed, Error>)> {
        let view = self.view.borrow().clone();
        let mut results = Vec::new();
        for (policy, report) in self.reports.snapshot() {
            let result = self.writer.flush(&policy, &report, &view).await;
            match &result {
                Ok(flushed) => {
                    if let Some(callback) = &self.on_success {
                        callback();
                    }
                    if let Some(callback) = &self.on_change {
                        let policy_ref = PolicyRef {
                            name: policy.clone(),
                            uid: flushed.uid.clone(),
                        };
                        for condition in &flushed.changed {
                            callback(&policy_ref, condition);
                        }
                    }
                }
                Err(e) if e.is_not_found() => {
                    tracing::debug!(policy, "policy deleted before its status flush");
                }
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.metric_label(), "status flush failed");
                    if let Some(callback) = &self.on_failure {
                        callback(e);
                    }
                }
            }
            results.push((policy, result));
        }
        results
    }
}
