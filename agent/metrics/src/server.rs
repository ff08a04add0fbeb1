//! The `/metrics` and `/healthz` HTTP endpoint.

use crate::{Health, Metrics};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why the endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("binding the metrics endpoint to {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("serving metrics")]
    Serve(#[source] std::io::Error),
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `/metrics` and `/healthz` on `addr` until `shutdown` completes.
/// `None` (an empty `--metrics-addr`) serves nothing and returns at once
/// after `shutdown`; the counters keep counting either way. `on_bound`
/// receives the bound address (port 0 picks a free one).
pub async fn serve(
    addr: Option<SocketAddr>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Some(addr) = addr else {
        shutdown.await;
        return Ok(());
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    on_bound(listener.local_addr().map_err(ServeError::Serve)?);
    let api = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let (health, api) = (health.clone(), api.clone());
                async move {
                    // An unreachable API server is said in the body but
                    // keeps the status code: the daemon still enforces
                    // with what the kernel holds, and a kubelet that
                    // restarted it on a failing probe would only add a
                    // restart (and a relist storm when the API returns)
                    // to the outage of every node at once.
                    let outage = [
                        api.api().outage().map(|o| o.to_string()),
                        api.api().not_ready().map(|n| n.to_string()),
                    ]
                    .into_iter()
                    .flatten()
                    .chain(api.api().failing_writes())
                    .map(|line| format!("{line}\n"))
                    .collect::<String>();
                    match health.check() {
                        Ok(()) => (StatusCode::OK, format!("ok\n{outage}")).into_response(),
                        Err(reasons) => {
                            let body: String = reasons.iter().map(|r| format!("{r}\n")).collect();
                            (StatusCode::SERVICE_UNAVAILABLE, body + &outage).into_response()
                        }
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServeError::Serve)
}
