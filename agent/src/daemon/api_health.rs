//! The daemon's side of [`ApiHealth`]: how a client or watch error is
//! classified, and the probe loop.
//!
//! A paused (or partitioned) API server makes no watch fail: the watches'
//! connections stay open and just go quiet, for up to the client's read
//! timeout (minutes). So the daemon also asks for `/readyz?verbose` every
//! few seconds with a short timeout, which every authenticated client may
//! read (`system:public-info-viewer`; the chart's ClusterRole grants it
//! too), and re-evaluates the verdict every second, so an outage is said
//! within [`UNREACHABLE_AFTER`] plus a few seconds of its start.
//!
//! `/readyz` rather than `/version`: a server whose etcd is away still
//! answers `/version`, and its watches may stay open, while every write
//! and relist fails; its readiness answer names the failing check. A
//! cluster that refuses `/readyz` (an answer too) still shows whether the
//! server can be reached.

use kube::runtime::watcher;
use kyverno_runtime_metrics::{ApiFailure, ApiResource, Metrics};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use kyverno_runtime_metrics::{ApiHealth, UNREACHABLE_AFTER};

/// How often the probe asks.
const PROBE_EVERY: Duration = Duration::from_secs(3);
/// How long a probe may take before it counts as a timeout: a server
/// whose etcd is away takes about 4 s to say so (two 2 s storage checks,
/// measured on kube-apiserver 1.37).
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// The kind of a client error: an answer (any status) or none.
pub(super) fn client_failure(e: &kube::Error) -> ApiFailure {
    match e {
        kube::Error::Api(status) => status_failure(status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            if timed_out(e) {
                ApiFailure::timeout
            } else {
                ApiFailure::unreachable
            }
        }
        _ => ApiFailure::other,
    }
}

/// The kind of a watch error.
pub(super) fn watch_failure(e: &watcher::Error) -> ApiFailure {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => client_failure(e),
        // The server answered (a 410 Gone is an ordinary relist).
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => ApiFailure::other,
    }
}

fn status_failure(code: u16) -> ApiFailure {
    match code {
        429 | 500..=599 => ApiFailure::server_error,
        _ => ApiFailure::refused,
    }
}

/// Whether an error's chain says it ran out of time (the client's
/// connect/read timeouts surface as an I/O `TimedOut` or tower's
/// "elapsed").
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        let text = err.to_string();
        if text.contains("timed out") || text.contains("elapsed") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// `GET /readyz?verbose`: the body lists every check, `[-]` before the
/// failing ones.
async fn readyz(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/readyz?verbose")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// The failing checks of a `/readyz?verbose` answer (`[-]etcd failed:
/// reason withheld`), joined; the first line of the body if it names none.
/// Bounded: the text goes into a log line and `/healthz`.
fn failing_checks(body: &str) -> String {
    let failing: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("[-]"))
        .take(8)
        .collect();
    let text = if failing.is_empty() {
        body.lines().next().unwrap_or("").trim().to_string()
    } else {
        failing.join(", ")
    };
    text.chars().take(512).collect()
}

/// Probes the API server and re-evaluates the verdict until `stop`.
pub(super) async fn run(
    client: kube::Client,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) {
    let api = metrics.clone();
    let probe = async move {
        let mut ticks = tokio::time::interval(PROBE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let started = api.api().now();
            match tokio::time::timeout(PROBE_TIMEOUT, readyz(&client)).await {
                Ok(Ok(_)) => api.api().succeeded(ApiResource::probe, started),
                Ok(Err(kube::Error::Api(status))) if status.code >= 500 => {
                    let checks = failing_checks(&status.message);
                    tracing::debug!(code = status.code, %checks, "API server not ready");
                    api.api().probe_not_ready(started, &checks);
                }
                // Refused (RBAC): the server answered; readiness is not
                // visible to this daemon.
                Ok(Err(kube::Error::Api(status))) => {
                    tracing::debug!(code = status.code, "API readiness probe refused");
                    api.api().succeeded(ApiResource::probe, started);
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "API probe failed");
                    api.api()
                        .failed(ApiResource::probe, client_failure(&e), started);
                }
                Err(_) => {
                    tracing::debug!(timeout = ?PROBE_TIMEOUT, "API probe timed out");
                    api.api()
                        .failed(ApiResource::probe, ApiFailure::timeout, started);
                }
            }
        }
    };
    let evaluate = async move {
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            ticks.tick().await;
            metrics.api().evaluate();
        }
    };
    tokio::select! {
        () = stop => {}
        () = probe => {}
        () = evaluate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_not_unreachable() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert_eq!(client_failure(&status(503)), ApiFailure::server_error);
        assert_eq!(client_failure(&status(403)), ApiFailure::refused);
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "read");
        assert_eq!(
            client_failure(&kube::Error::ReadEvents(io)),
            ApiFailure::timeout
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(
            client_failure(&kube::Error::ReadEvents(io)),
            ApiFailure::unreachable
        );
        assert_eq!(
            watch_failure(&watcher::Error::NoResourceVersion),
            ApiFailure::other
        );
    }

    #[test]
    fn a_readiness_answer_names_its_failing_checks() {
        // As kube-apiserver 1.37 answers with its etcd away.
        let body = "[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\n[+]etcd-readiness ok\n\
                    [-]informer-sync failed: reason withheld\nreadyz check failed";
        assert_eq!(
            failing_checks(body),
            "[-]etcd failed: reason withheld, [-]informer-sync failed: reason withheld"
        );
        assert_eq!(failing_checks("shutting down\nmore"), "shutting down");
        assert_eq!(failing_checks(""), "");
        assert_eq!(failing_checks(&"[-]x".repeat(10_000)).chars().count(), 512);
    }
}
