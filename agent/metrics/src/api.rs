//! Whether the API server answers, as the daemon's own requests see it.
//!
//! Every watch (by resource), every status, Report and Event write, and a
//! small periodic probe (`GET /readyz?verbose`) record their successes and
//! failures here. When requests of kind unreachable or timeout have kept
//! failing for longer than a threshold, the daemon declares the API
//! unreachable: one warning naming what failed and since when, the gauges
//! `api_reachable` (0) and `api_unreachable_seconds`, and a line in the
//! `/healthz` body. When it answers again: one info line with the
//! outage's duration.
//!
//! A server that answers but says it is not ready (its storage, etcd, is
//! away; it is shutting down) fails every write and relist while every
//! connection succeeds, so the probe's readiness answer is a verdict of
//! its own: after the same threshold, one warning with the checks that
//! fail, `api_ready` 0 and a `/healthz` line; one info line when it is
//! ready again.
//!
//! A server that answers every write of a kind with a failure (5xx or 429
//! from an admission webhook that cannot be called, flow control, a
//! failing storage) is neither: after the same threshold that kind of
//! write is declared failing (one warning, a `/healthz` line), and its
//! failures are counted by reason; what the writers keep is theirs to say.
//!
//! Enforcement does not depend on the API (the kernel keeps its maps), so
//! an outage is something to say, not a reason to stop: `/healthz` keeps
//! its status code (see `server.rs`).
//!
//! A watch that resumes delivers nothing until something changes, so a
//! watch's failure streak cannot wait for its own next success: a probe
//! that succeeded after a resource's last failure ends that resource's
//! streak (the API answers; kube-runtime's backoff reconnects the watch,
//! and a watch that still fails starts a new streak).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long requests must keep failing as unreachable before the API is
/// declared unreachable: long enough that one slow request or a rolling
/// restart of a replicated API server says nothing, short enough to be
/// said within 30 s of the start of an outage.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(15);

/// What the daemon asks the API server for (`api_failures_total{resource}`,
/// `api_failing_seconds{resource}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ApiResource {
    /// The RuntimePolicy watch.
    policies,
    /// The Namespace watch.
    namespaces,
    /// The Pod watch (this node's pods).
    pods,
    /// The Service watch.
    services,
    /// The EndpointSlice watch.
    endpointslices,
    /// Status writes of this node's shard.
    status,
    /// OpenReports Report writes.
    reports,
    /// Kubernetes Event writes.
    events,
    /// The daemon's periodic `GET /readyz?verbose`.
    probe,
}

/// How a request failed (`api_failures_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ApiFailure {
    /// No connection, or it broke (refused, reset, DNS, TLS).
    unreachable,
    /// No answer in time.
    timeout,
    /// The server answered 429 or 5xx.
    server_error,
    /// The server answered with another refusal (4xx: RBAC, validation).
    refused,
    /// The server answered its readiness check with a failure (its
    /// storage is away, or it is shutting down).
    not_ready,
    /// Anything else (a decoding error, a failure whose kind is unknown).
    other,
}

impl ApiFailure {
    /// Whether this failure says the server cannot be reached; only these
    /// count towards an outage (a refusal is an answer).
    pub fn is_unreachable(self) -> bool {
        matches!(self, ApiFailure::unreachable | ApiFailure::timeout)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiFailureLabels {
    resource: ApiResource,
    reason: ApiFailure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiResourceLabels {
    resource: ApiResource,
}

struct Streak {
    since: Instant,
    last: Instant,
    failures: u64,
    kind: ApiFailure,
    /// When the first failure of kind unreachable/timeout of the streak
    /// came, if one did.
    unreachable_since: Option<Instant>,
    /// When the first not-ready answer of the streak came, if one did.
    not_ready_since: Option<Instant>,
}

#[derive(Default)]
struct Entry {
    streak: Option<Streak>,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<ApiResource, Entry>,
    /// The start of the declared outage.
    outage: Option<Instant>,
    /// The start of the declared not-ready period.
    not_ready: Option<Instant>,
    /// The readiness checks the last not-ready answer said failed.
    not_ready_checks: String,
    /// The writes declared failing (their streak passed the threshold).
    failing_writes: std::collections::BTreeSet<ApiResource>,
}

/// The API server is declared unreachable: since when, for how long, and
/// what failed. Its `Display` is the `/healthz` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// The first failure of the outage, as wall-clock seconds since the epoch.
    pub since_unix: u64,
    /// How long it has lasted.
    pub lasted: Duration,
    /// What is failing: `resource: reason xN`, one per resource.
    pub failing: Vec<String>,
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the API server is unreachable since {} ({} s): {}",
            rfc3339(self.since_unix),
            self.lasted.as_secs(),
            self.failing.join(", ")
        )
    }
}

/// The API server answers but says it is not ready: since when, for how
/// long, and which of its checks fail. Its `Display` is the `/healthz` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The first not-ready answer, as wall-clock seconds since the epoch.
    pub since_unix: u64,
    /// How long it has lasted.
    pub lasted: Duration,
    /// The failing checks, as the server named them (`[-]etcd failed: ...`).
    pub checks: String,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the API server answers but is not ready since {} ({} s): {}",
            rfc3339(self.since_unix),
            self.lasted.as_secs(),
            self.checks
        )
    }
}

/// The daemon's writes, each declared failing on its own.
const WRITES: [ApiResource; 3] = [
    ApiResource::status,
    ApiResource::reports,
    ApiResource::events,
];

/// The tracker: shared by every component that talks to the API server.
pub struct ApiHealth {
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
    threshold: Duration,
    state: Mutex<State>,
    reachable: Gauge,
    unreachable_seconds: Gauge,
    ready: Gauge,
    failures: Family<ApiFailureLabels, Counter>,
    failing_seconds: Family<ApiResourceLabels, Gauge>,
}

impl ApiHealth {
    /// A tracker with the default threshold, reading the real clock.
    pub fn new() -> Self {
        Self::with_clock(UNREACHABLE_AFTER, Instant::now)
    }

    /// A tracker declaring an outage after `threshold`, reading time from
    /// `clock` (a test's manual clock; it must never go backwards).
    pub fn with_clock(
        threshold: Duration,
        clock: impl Fn() -> Instant + Send + Sync + 'static,
    ) -> Self {
        let reachable = Gauge::default();
        reachable.set(1);
        let ready = Gauge::default();
        ready.set(1);
        ApiHealth {
            clock: Box::new(clock),
            threshold,
            state: Mutex::new(State::default()),
            reachable,
            unreachable_seconds: Gauge::default(),
            ready,
            failures: Family::default(),
            failing_seconds: Family::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "api_reachable",
            "1 while the API server answers, 0 once requests have failed as unreachable \
             or timed out for longer than 15 s (enforcement goes on either way)",
            self.reachable.clone(),
        );
        registry.register(
            "api_unreachable_seconds",
            "How long the declared API server outage has lasted, from its first failure (0 when reachable)",
            self.unreachable_seconds.clone(),
        );
        registry.register(
            "api_ready",
            "1 unless the API server has answered its readiness check (/readyz) with a failure \
             (its storage away, a shutdown) for longer than 15 s",
            self.ready.clone(),
        );
        registry.register(
            "api_failures",
            "Failed requests to the API server, by resource (a watch, a write, the probe) and reason \
             (unreachable, timeout, server_error, refused, not_ready, other)",
            self.failures.clone(),
        );
        registry.register(
            "api_failing_seconds",
            "How long requests for a resource have kept failing (0 after a success)",
            self.failing_seconds.clone(),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain bookkeeping, consistent after every call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request for `resource` succeeded: its failure streak ends. A
    /// probe's success also ends every streak whose last failure came
    /// before `started` (when the probe was sent), except a write's that
    /// the server answered with a failure.
    pub fn succeeded(&self, resource: ApiResource, started: Instant) {
        let mut state = self.lock();
        if resource == ApiResource::probe {
            for (resource, entry) in &mut state.entries {
                // A write refused by an answering server is ended only by
                // a write of its own that succeeds.
                let answered_write = WRITES.contains(resource)
                    && entry
                        .streak
                        .as_ref()
                        .is_some_and(|s| !s.kind.is_unreachable());
                if !answered_write && entry.streak.as_ref().is_some_and(|s| s.last < started) {
                    entry.streak = None;
                }
            }
        }
        state.entries.entry(resource).or_default().streak = None;
    }

    /// A request for `resource`, sent at `started`, failed with `kind`.
    pub fn failed(&self, resource: ApiResource, kind: ApiFailure, started: Instant) {
        self.failures
            .get_or_create(&ApiFailureLabels {
                resource,
                reason: kind,
            })
            .inc();
        let mut state = self.lock();
        let entry = state.entries.entry(resource).or_default();
        let streak = entry.streak.get_or_insert(Streak {
            since: started,
            last: started,
            failures: 0,
            kind,
            unreachable_since: None,
            not_ready_since: None,
        });
        streak.failures += 1;
        streak.kind = kind;
        streak.last = streak.last.max(started);
        if kind.is_unreachable() && streak.unreachable_since.is_none() {
            streak.unreachable_since = Some(started);
        }
        if kind == ApiFailure::not_ready && streak.not_ready_since.is_none() {
            streak.not_ready_since = Some(started);
        }
    }

    /// The probe, sent at `started`, was answered "not ready"; `checks`
    /// are the failing checks the server named.
    pub fn probe_not_ready(&self, started: Instant, checks: &str) {
        self.failed(ApiResource::probe, ApiFailure::not_ready, started);
        let mut state = self.lock();
        state.not_ready_checks = checks.to_string();
        // An answer: whatever failed as unreachable before it was sent no
        // longer says the server cannot be reached (its streak goes on,
        // so how long it has failed is still told).
        for (resource, entry) in &mut state.entries {
            if let Some(streak) = entry.streak.as_mut() {
                if *resource == ApiResource::probe || streak.last < started {
                    streak.unreachable_since = None;
                }
            }
        }
    }

    /// A Report write ended with `result` (conflicts are answers). A
    /// failure is recorded by the caller with how it failed
    /// ([`ApiHealth::failed`]), not here.
    pub(crate) fn report_write(&self, result: crate::ReportWriteResult) {
        use crate::ReportWriteResult as R;
        match result {
            R::success | R::conflict => self.succeeded(ApiResource::reports, self.now()),
            R::error => {}
        }
    }

    /// A status write failed for `reason` (`status_writes_failed_total`'s
    /// label); losing every race is still an answer.
    pub(crate) fn status_write_failed(&self, reason: &str) {
        let kind = match reason {
            "conflicts" => return self.succeeded(ApiResource::status, self.now()),
            "unreachable" => ApiFailure::unreachable,
            "throttled" | "server_error" => ApiFailure::server_error,
            "refused" => ApiFailure::refused,
            _ => ApiFailure::other,
        };
        self.failed(ApiResource::status, kind, self.now());
    }

    /// An Event write failed for `reason`, after its retries.
    pub(crate) fn event_write_failed(&self, reason: crate::EventWriteFailure) {
        use crate::EventWriteFailure as E;
        let kind = match reason {
            E::unreachable => ApiFailure::unreachable,
            E::timeout => ApiFailure::timeout,
            E::throttled | E::server_error => ApiFailure::server_error,
            E::unauthorized
            | E::forbidden
            | E::not_found
            | E::conflict
            | E::invalid
            | E::refused => ApiFailure::refused,
        };
        self.failed(ApiResource::events, kind, self.now());
    }

    /// The current time on this tracker's clock.
    pub fn now(&self) -> Instant {
        (self.clock)()
    }

    /// Decides whether the API is unreachable now, updates the gauges, and
    /// logs a change (one warning at the start of an outage, one info line
    /// at its end). Call it periodically (the daemon's probe loop does,
    /// every second).
    pub fn evaluate(&self) -> Option<Outage> {
        let now = self.now();
        let mut state = self.lock();
        for (resource, entry) in &state.entries {
            let failing = entry
                .streak
                .as_ref()
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s.since));
            self.failing_seconds
                .get_or_create(&ApiResourceLabels {
                    resource: *resource,
                })
                .set(i64::try_from(failing.as_secs()).unwrap_or(i64::MAX));
        }
        let since = state
            .entries
            .values()
            .filter_map(|e| e.streak.as_ref()?.unreachable_since)
            .filter(|since| now.saturating_duration_since(*since) > self.threshold)
            .min();
        let was = state.outage;
        match (was, since) {
            (None, Some(since)) => {
                state.outage = Some(since);
                let outage = describe(&state, since, now);
                tracing::warn!(
                    since = %rfc3339(outage.since_unix),
                    lasted_s = outage.lasted.as_secs(),
                    failing = %outage.failing.join(", "),
                    "the API server is unreachable; enforcement goes on with what the kernel holds, \
                     changes made meanwhile apply once it answers"
                );
            }
            (Some(since), None) => {
                state.outage = None;
                tracing::info!(
                    outage_s = now.saturating_duration_since(since).as_secs(),
                    "the API server answers again"
                );
            }
            (Some(_), Some(_)) | (None, None) => {}
        }
        let not_ready_since = state
            .entries
            .get(&ApiResource::probe)
            .and_then(|e| e.streak.as_ref()?.not_ready_since)
            .filter(|since| now.saturating_duration_since(*since) > self.threshold);
        match (state.not_ready, not_ready_since) {
            (None, Some(since)) => {
                state.not_ready = Some(since);
                tracing::warn!(
                    lasted_s = now.saturating_duration_since(since).as_secs(),
                    checks = %state.not_ready_checks,
                    "the API server answers but is not ready; enforcement goes on with what the \
                     kernel holds, changes made meanwhile apply once it is ready"
                );
            }
            (Some(since), None) => {
                state.not_ready = None;
                tracing::info!(
                    not_ready_s = now.saturating_duration_since(since).as_secs(),
                    "the API server is ready again"
                );
            }
            (Some(_), Some(_)) | (None, None) => {}
        }
        self.ready.set(i64::from(state.not_ready.is_none()));
        for resource in WRITES {
            let streak = state.entries.get(&resource).and_then(|e| e.streak.as_ref());
            // Refused by an answering server; an unreachable one is the
            // outage's to say.
            let failing = streak.filter(|s| {
                !s.kind.is_unreachable() && now.saturating_duration_since(s.since) > self.threshold
            });
            match (state.failing_writes.contains(&resource), failing) {
                (false, Some(streak)) => {
                    tracing::warn!(
                        what = %resource,
                        reason = ?streak.kind,
                        failures = streak.failures,
                        lasted_s = now.saturating_duration_since(streak.since).as_secs(),
                        "writes to the API server keep failing; they are retried (see the writer's own lines for what is kept)"
                    );
                    state.failing_writes.insert(resource);
                }
                (true, None) => {
                    tracing::info!(what = %resource, "writes to the API server succeed again");
                    state.failing_writes.remove(&resource);
                }
                (true, Some(_)) | (false, None) => {}
            }
        }
        let outage = state.outage.map(|since| describe(&state, since, now));
        self.reachable.set(i64::from(outage.is_none()));
        self.unreachable_seconds.set(
            outage
                .as_ref()
                .map_or(0, |o| i64::try_from(o.lasted.as_secs()).unwrap_or(i64::MAX)),
        );
        outage
    }

    /// The declared outage, as of the last [`ApiHealth::evaluate`].
    pub fn outage(&self) -> Option<Outage> {
        let now = self.now();
        let state = self.lock();
        state.outage.map(|since| describe(&state, since, now))
    }

    /// The writes declared failing, as of the last [`ApiHealth::evaluate`]:
    /// one `/healthz` line each (`write status failing since T (N s):
    /// server_error x4`).
    pub fn failing_writes(&self) -> Vec<String> {
        let now = self.now();
        let state = self.lock();
        state
            .failing_writes
            .iter()
            .filter_map(|resource| {
                let streak = state.entries.get(resource)?.streak.as_ref()?;
                let lasted = now.saturating_duration_since(streak.since);
                Some(format!(
                    "{resource} failing since {} ({} s): {:?} x{}",
                    rfc3339(wall_since(lasted)),
                    lasted.as_secs(),
                    streak.kind,
                    streak.failures
                ))
            })
            .collect()
    }

    /// The declared not-ready period, as of the last [`ApiHealth::evaluate`].
    pub fn not_ready(&self) -> Option<NotReady> {
        let now = self.now();
        let state = self.lock();
        let since = state.not_ready?;
        let lasted = now.saturating_duration_since(since);
        Some(NotReady {
            since_unix: wall_since(lasted),
            lasted,
            checks: state.not_ready_checks.clone(),
        })
    }
}

/// Wall-clock seconds since the epoch, `lasted` ago.
fn wall_since(lasted: Duration) -> u64 {
    SystemTime::now()
        .checked_sub(lasted)
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Default for ApiHealth {
    fn default() -> Self {
        Self::new()
    }
}

fn describe(state: &State, since: Instant, now: Instant) -> Outage {
    let lasted = now.saturating_duration_since(since);
    let wall = wall_since(lasted);
    let failing = state
        .entries
        .iter()
        .filter_map(|(resource, entry)| {
            let s = entry.streak.as_ref()?;
            let what = resource.to_string();
            Some(format!("{what}: {:?} x{}", s.kind, s.failures))
        })
        .collect();
    Outage {
        since_unix: wall,
        lasted,
        failing,
    }
}

impl fmt::Display for ApiResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = match self {
            ApiResource::policies => ("watch", "runtimepolicies"),
            ApiResource::namespaces => ("watch", "namespaces"),
            ApiResource::pods => ("watch", "pods"),
            ApiResource::services => ("watch", "services"),
            ApiResource::endpointslices => ("watch", "endpointslices"),
            ApiResource::status => ("write", "status"),
            ApiResource::reports => ("write", "reports"),
            ApiResource::events => ("write", "events"),
            ApiResource::probe => ("probe", "/readyz"),
        };
        write!(f, "{kind} {name}")
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of seconds since the epoch (UTC), without a
/// date crate: the civil-from-days algorithm (H. Hinnant).
fn rfc3339(unix: u64) -> String {
    let days = unix / 86_400;
    let rem = unix % 86_400;
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn manual() -> (ApiHealth, impl Fn(Duration)) {
        let now = Arc::new(Mutex::new(Instant::now()));
        let clock = {
            let now = now.clone();
            move || *now.lock().unwrap()
        };
        let advance = move |d: Duration| *now.lock().unwrap() += d;
        (
            ApiHealth::with_clock(Duration::from_secs(15), clock),
            advance,
        )
    }

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn unreachable_past_the_threshold_is_an_outage_until_a_probe_succeeds() {
        let (api, advance) = manual();
        let t0 = api.now();
        api.failed(ApiResource::probe, ApiFailure::timeout, t0);
        api.failed(ApiResource::pods, ApiFailure::unreachable, t0);
        advance(Duration::from_secs(15));
        assert_eq!(api.evaluate(), None, "exactly the threshold is not yet");
        advance(Duration::from_secs(1));
        let outage = api.evaluate().unwrap();
        assert_eq!(outage.lasted, Duration::from_secs(16));
        assert_eq!(
            outage.failing,
            ["watch pods: unreachable x1", "probe /readyz: timeout x1"]
        );
        assert!(outage.to_string().contains("unreachable since"), "{outage}");
        assert_eq!(api.reachable.get(), 0);
        assert_eq!(api.unreachable_seconds.get(), 16);
        // The API answers: the probe's success ends the watch's streak too.
        let probe = api.now();
        advance(Duration::from_secs(1));
        api.succeeded(ApiResource::probe, probe);
        assert_eq!(api.evaluate(), None);
        assert_eq!(api.reachable.get(), 1);
        assert_eq!(api.unreachable_seconds.get(), 0);
    }

    #[test]
    fn refusals_are_answers_not_an_outage() {
        let (api, advance) = manual();
        api.failed(ApiResource::status, ApiFailure::refused, api.now());
        advance(Duration::from_secs(60));
        api.failed(ApiResource::status, ApiFailure::server_error, api.now());
        assert_eq!(api.evaluate(), None);
        assert_eq!(
            api.failing_seconds
                .get_or_create(&ApiResourceLabels {
                    resource: ApiResource::status,
                })
                .get(),
            60
        );
    }

    #[test]
    fn a_failure_after_the_probe_was_sent_is_not_ended_by_it() {
        let (api, advance) = manual();
        let probe = api.now();
        advance(Duration::from_secs(1));
        api.failed(ApiResource::events, ApiFailure::unreachable, api.now());
        api.succeeded(ApiResource::probe, probe);
        advance(Duration::from_secs(20));
        assert!(api.evaluate().is_some());
        api.succeeded(ApiResource::events, api.now());
        assert_eq!(api.evaluate(), None);
    }

    #[test]
    fn not_ready_past_the_threshold_is_said_apart_from_unreachable() {
        let (api, advance) = manual();
        let t0 = api.now();
        api.probe_not_ready(t0, "[-]etcd failed: reason withheld");
        // A write fails meanwhile: an answer, not an outage.
        api.failed(ApiResource::status, ApiFailure::server_error, t0);
        advance(Duration::from_secs(15));
        assert_eq!(api.evaluate(), None);
        assert_eq!(api.not_ready(), None, "exactly the threshold is not yet");
        advance(Duration::from_secs(1));
        api.probe_not_ready(api.now(), "[-]etcd failed: reason withheld");
        assert_eq!(api.evaluate(), None, "the server answers: not unreachable");
        let not_ready = api.not_ready().unwrap();
        assert_eq!(not_ready.lasted, Duration::from_secs(16));
        assert_eq!(
            not_ready.to_string().split_once(" since ").unwrap().0,
            "the API server answers but is not ready"
        );
        assert!(not_ready
            .to_string()
            .ends_with("(16 s): [-]etcd failed: reason withheld"));
        assert_eq!((api.reachable.get(), api.ready.get()), (1, 0));
        // Ready again: the probe's success ends the period and the write's
        // streak that came before it.
        let probe = api.now();
        advance(Duration::from_secs(1));
        api.succeeded(ApiResource::probe, probe);
        assert_eq!(api.evaluate(), None);
        assert_eq!(api.not_ready(), None);
        assert_eq!(api.ready.get(), 1);
    }

    #[test]
    fn a_not_ready_answer_ends_an_outage_but_not_what_failed() {
        let (api, advance) = manual();
        let t0 = api.now();
        api.failed(ApiResource::probe, ApiFailure::unreachable, t0);
        api.failed(ApiResource::pods, ApiFailure::unreachable, t0);
        advance(Duration::from_secs(20));
        assert!(api.evaluate().is_some());
        // The server is back, its storage is not.
        api.probe_not_ready(api.now(), "[-]etcd failed");
        assert_eq!(api.evaluate(), None, "it answers: no longer unreachable");
        assert_eq!(api.reachable.get(), 1);
        assert_eq!(
            api.failing_seconds
                .get_or_create(&ApiResourceLabels {
                    resource: ApiResource::pods,
                })
                .get(),
            20,
            "the watch has still failed for 20 s"
        );
    }

    #[test]
    fn a_write_failing_past_the_threshold_is_declared_until_one_succeeds() {
        let (api, advance) = manual();
        api.failed(ApiResource::reports, ApiFailure::server_error, api.now());
        advance(Duration::from_secs(10));
        api.failed(ApiResource::reports, ApiFailure::server_error, api.now());
        api.evaluate();
        assert!(api.failing_writes().is_empty(), "10 s is not yet");
        advance(Duration::from_secs(6));
        api.failed(ApiResource::reports, ApiFailure::server_error, api.now());
        api.evaluate();
        let lines = api.failing_writes();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("write reports failing since "),
            "{lines:?}"
        );
        assert!(lines[0].ends_with("(16 s): server_error x3"), "{lines:?}");
        assert_eq!(api.outage(), None, "the server answers");
        // The server answers its probe: that says nothing of the writes.
        let probe = api.now();
        advance(Duration::from_secs(1));
        api.succeeded(ApiResource::probe, probe);
        api.evaluate();
        assert_eq!(api.failing_writes().len(), 1);
        api.succeeded(ApiResource::reports, api.now());
        api.evaluate();
        assert!(api.failing_writes().is_empty());
    }
}
