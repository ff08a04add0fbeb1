//! What became of a cause: dropped (and why), or written (and how), and
//! the metric label of each, so nothing is lost silently.

use kyverno_runtime_metrics::{DropReason as MetricDrop, EventWriteFailure, EventWriteResult};

/// Why a cause was dropped without an Event
/// (`events_dropped_total{source="events",reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The queue held `queue_capacity` Events already.
    QueueFull,
    /// The finding names no pod an Event could be about.
    Unattributed,
    /// Handed over after the recorder stopped, or still queued when its
    /// final drain ran out of time.
    Shutdown,
    /// Its policy's Event budget was spent
    /// ([`RecorderOptions::policy_budget`](crate::RecorderOptions::policy_budget)).
    PolicyBudget,
    /// Its pod's Event budget was spent
    /// ([`RecorderOptions::pod_budget`](crate::RecorderOptions::pod_budget)).
    PodBudget,
}

impl DropReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Unattributed => "unattributed",
            DropReason::Shutdown => "shutdown",
            DropReason::PolicyBudget => "policy_budget",
            DropReason::PodBudget => "pod_budget",
        }
    }

    /// The `events_dropped_total` reason.
    pub fn metric(self) -> MetricDrop {
        match self {
            DropReason::QueueFull => MetricDrop::queue_full,
            DropReason::Unattributed => MetricDrop::unattributed,
            DropReason::Shutdown => MetricDrop::shutdown,
            DropReason::PolicyBudget => MetricDrop::policy_budget,
            DropReason::PodBudget => MetricDrop::pod_budget,
        }
    }
}

/// Why an Event write failed, after its retries
/// (`event_writes_failed_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteFailure {
    /// 401: the daemon's credentials were not accepted.
    Unauthorized,
    /// 403: RBAC (or an admission policy) refused the write.
    Forbidden,
    /// 404: the namespace does not exist, or the Event kept vanishing
    /// between its read and its patch.
    NotFound,
    /// 409: the series patch kept losing races.
    Conflict,
    /// 400 or 422: the Event was found invalid.
    Invalid,
    /// Another 4xx.
    Refused,
    /// 429 on every attempt.
    Throttled,
    /// 5xx on every attempt.
    ServerError,
    /// No usable answer: a transport, TLS or decoding error.
    Unreachable,
    /// The write, retries included, ran out of its time.
    Timeout,
}

impl WriteFailure {
    /// Whether the API server did not answer (as opposed to refusing): the
    /// write may succeed as is once it does, so the Event is held.
    pub fn server_away(self) -> bool {
        matches!(
            self,
            WriteFailure::Unreachable
                | WriteFailure::Timeout
                | WriteFailure::ServerError
                | WriteFailure::Throttled
        )
    }

    /// The API health's kind of this failure.
    pub(crate) fn api_failure(self) -> kyverno_runtime_metrics::ApiFailure {
        use kyverno_runtime_metrics::ApiFailure;
        match self {
            WriteFailure::Unreachable => ApiFailure::unreachable,
            WriteFailure::Timeout => ApiFailure::timeout,
            WriteFailure::ServerError | WriteFailure::Throttled => ApiFailure::server_error,
            _ => ApiFailure::refused,
        }
    }

    /// The failure `error` is.
    pub fn of(error: &kube::Error) -> WriteFailure {
        match error {
            kube::Error::Api(status) => match status.code {
                401 => WriteFailure::Unauthorized,
                403 => WriteFailure::Forbidden,
                404 => WriteFailure::NotFound,
                409 => WriteFailure::Conflict,
                400 | 422 => WriteFailure::Invalid,
                429 => WriteFailure::Throttled,
                500..=599 => WriteFailure::ServerError,
                _ => WriteFailure::Refused,
            },
            kube::Error::Auth(_) => WriteFailure::Unauthorized,
            _ => WriteFailure::Unreachable,
        }
    }

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteFailure::Unauthorized => "unauthorized",
            WriteFailure::Forbidden => "forbidden",
            WriteFailure::NotFound => "not_found",
            WriteFailure::Conflict => "conflict",
            WriteFailure::Invalid => "invalid",
            WriteFailure::Refused => "refused",
            WriteFailure::Throttled => "throttled",
            WriteFailure::ServerError => "server_error",
            WriteFailure::Unreachable => "unreachable",
            WriteFailure::Timeout => "timeout",
        }
    }

    /// The `event_writes_failed_total` reason.
    pub fn metric(self) -> EventWriteFailure {
        match self {
            WriteFailure::Unauthorized => EventWriteFailure::unauthorized,
            WriteFailure::Forbidden => EventWriteFailure::forbidden,
            WriteFailure::NotFound => EventWriteFailure::not_found,
            WriteFailure::Conflict => EventWriteFailure::conflict,
            WriteFailure::Invalid => EventWriteFailure::invalid,
            WriteFailure::Refused => EventWriteFailure::refused,
            WriteFailure::Throttled => EventWriteFailure::throttled,
            WriteFailure::ServerError => EventWriteFailure::server_error,
            WriteFailure::Unreachable => EventWriteFailure::unreachable,
            WriteFailure::Timeout => EventWriteFailure::timeout,
        }
    }
}

/// How one Event write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteResult {
    /// A new Event was created.
    Created,
    /// Its object and reason fired before: its Event's series was patched.
    Patched,
    /// The write failed (after its retries); logged and counted.
    Failed(WriteFailure),
}

impl WriteResult {
    /// The metric label value: the result, or the failure's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteResult::Created => "created",
            WriteResult::Patched => "patched",
            WriteResult::Failed(f) => f.as_str(),
        }
    }

    /// Counts this outcome in `metrics`.
    pub(crate) fn count(self, metrics: &kyverno_runtime_metrics::Metrics) {
        match self {
            WriteResult::Created => metrics.event_write(EventWriteResult::created),
            WriteResult::Patched => metrics.event_write(EventWriteResult::patched),
            WriteResult::Failed(f) => metrics.event_write_failed(f.metric()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            Status::failure("refused", "Reason").with_code(code),
        ))
    }

    #[test]
    fn every_refusal_has_its_reason() {
        for (code, want) in [
            (401, WriteFailure::Unauthorized),
            (403, WriteFailure::Forbidden),
            (404, WriteFailure::NotFound),
            (409, WriteFailure::Conflict),
            (400, WriteFailure::Invalid),
            (422, WriteFailure::Invalid),
            (405, WriteFailure::Refused),
            (429, WriteFailure::Throttled),
            (500, WriteFailure::ServerError),
            (503, WriteFailure::ServerError),
        ] {
            assert_eq!(WriteFailure::of(&api(code)), want, "{code}");
        }
        let transport = kube::Error::Service(Box::new(std::io::Error::other("refused")));
        assert_eq!(WriteFailure::of(&transport), WriteFailure::Unreachable);
    }

    #[test]
    fn every_outcome_is_counted_under_its_label() {
        let metrics = kyverno_runtime_metrics::Metrics::new();
        WriteResult::Created.count(&metrics);
        WriteResult::Patched.count(&metrics);
        WriteResult::Patched.count(&metrics);
        WriteResult::Failed(WriteFailure::Forbidden).count(&metrics);
        WriteResult::Failed(WriteFailure::Timeout).count(&metrics);
        let text = metrics.encode();
        for line in [
            "nirmata_runtime_event_writes_total{result=\"created\"} 1",
            "nirmata_runtime_event_writes_total{result=\"patched\"} 2",
            "nirmata_runtime_event_writes_failed_total{reason=\"forbidden\"} 1",
            "nirmata_runtime_event_writes_failed_total{reason=\"timeout\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
        // Labels agree with the metric crate's.
        for f in [
            WriteFailure::Unauthorized,
            WriteFailure::Forbidden,
            WriteFailure::NotFound,
            WriteFailure::Conflict,
            WriteFailure::Invalid,
            WriteFailure::Refused,
            WriteFailure::Throttled,
            WriteFailure::ServerError,
            WriteFailure::Unreachable,
            WriteFailure::Timeout,
        ] {
            assert_eq!(format!("{:?}", f.metric()), f.as_str());
        }
        for d in [
            DropReason::QueueFull,
            DropReason::Unattributed,
            DropReason::Shutdown,
            DropReason::PolicyBudget,
            DropReason::PodBudget,
        ] {
            assert_eq!(format!("{:?}", d.metric()), d.as_str());
        }
    }
}
