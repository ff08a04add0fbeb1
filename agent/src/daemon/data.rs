//! The data-source fetcher: what a policy's `resource.get`,
//! `resource.list` and `http.get` calls read, fetched before the policy is
//! evaluated.
//!
//! The engine evaluates on the watch task, synchronously; it must not wait
//! on the network there. So it asks ([`Fetcher::request`]) and returns; a
//! task per request fetches every source of the policy concurrently, each
//! bounded ([`FETCH_TIMEOUT`], [`MAX_BODY_BYTES`], [`MAX_LIST_ITEMS`]; the
//! number of sources per policy is bounded when it compiles), and sends a
//! [`DataReady`] into the watch loop, which hands it to
//! `Engine::data_ready` to evaluate and program. A newer request for the
//! same policy (after a spec change) aborts the older one, and the engine
//! ignores an answer that is not for its latest request; an interval that
//! comes round while a fetch is under way waits for it.
//!
//! `resource.*` go through the daemon's own kube client and credentials
//! (its RBAC: the chart's `rbac.extraRules`), as raw GETs on the path the
//! apiVersion and resource name (no discovery, no kind needed), the body
//! read up to the size limit. `http.get` uses hyper's client over rustls
//! with the system's roots, the stack the kube client already links;
//! redirects are not followed, and link-local destinations (the cloud
//! metadata endpoints, 169.254.0.0/16 and fe80::/10) are refused, whether
//! named by address or resolved from a name.

use futures::AsyncReadExt as _;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use kyverno_runtime_policy::sources::{
    http_value, object_value, DataSet, DataSource, Fetched, FETCH_TIMEOUT, MAX_BODY_BYTES,
    MAX_LIST_ITEMS,
};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// What the engine asks for: every source of one policy, for its
/// evaluation number `epoch`.
#[derive(Clone, Debug)]
pub struct DataRequest {
    /// The policy's name.
    pub policy: String,
    /// Its uid (a recreated policy is another policy).
    pub uid: String,
    /// Which request of this policy this is.
    pub epoch: u64,
    /// What to fetch.
    pub sources: Vec<DataSource>,
}

/// The answer to a [`DataRequest`].
#[derive(Debug)]
pub struct DataReady {
    /// The policy's name.
    pub policy: String,
    /// Its uid.
    pub uid: String,
    /// The request's epoch.
    pub epoch: u64,
    /// Each source's result or failure.
    pub data: DataSet,
    /// How long the fetch took.
    pub took: Duration,
}

/// Fetches data sources on tasks of the daemon's runtime; see the module
/// docs.
pub struct Fetcher {
    client: kube::Client,
    http:
        Option<HttpClient<hyper_rustls::HttpsConnector<HttpConnector<NoLinkLocal>>, Empty<Bytes>>>,
    http_error: Option<String>,
    ready: mpsc::UnboundedSender<DataReady>,
    inflight: Mutex<HashMap<String, AbortHandle>>,
}

impl Fetcher {
    /// A fetcher using `client` for `resource.*`, answering on `ready`.
    /// Without the system's CA roots, `http.get` fails each fetch with the
    /// reason (and `resource.*` still work).
    pub fn new(client: kube::Client, ready: mpsc::UnboundedSender<DataReady>) -> Arc<Self> {
        let (http, http_error) = match https_client() {
            Ok(c) => (Some(c), None),
            Err(e) => {
                tracing::warn!(error = %e, "http.get data sources are unavailable");
                (None, Some(e))
            }
        };
        Arc::new(Fetcher {
            client,
            http,
            http_error,
            ready,
            inflight: Mutex::new(HashMap::new()),
        })
    }

    /// Starts fetching `request` on the current runtime, aborting an older
    /// request for the same policy still in flight.
    pub fn request(self: &Arc<Self>, request: DataRequest) {
        let me = self.clone();
        let policy = request.policy.clone();
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let fetches = request.sources.iter().map(|s| me.fetch(s));
            let results = futures::future::join_all(fetches).await;
            let mut data = DataSet::new();
            for (source, result) in request.sources.iter().zip(results) {
                if let Err(e) = &result {
                    tracing::warn!(policy = %request.policy, %source, error = %e, "data source fetch failed");
                }
                data.insert(source.clone(), result);
            }
            let ready = DataReady {
                policy: request.policy.clone(),
                uid: request.uid,
                epoch: request.epoch,
                data,
                took: start.elapsed(),
            };
            // The watch loop is gone only at shutdown.
            let _ = me.ready.send(ready);
            me.lock().remove(&request.policy);
        });
        if let Some(old) = self.lock().insert(policy, task.abort_handle()) {
            old.abort();
        }
    }

    /// Aborts what is in flight for `policy` (deleted).
    pub fn cancel(&self, policy: &str) {
        if let Some(old) = self.lock().remove(policy) {
            old.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn fetch(&self, source: &DataSource) -> Fetched {
        let fetch = async {
            match source {
                DataSource::HttpGet { url } => self.http_get(url).await,
                _ => self.resource(source).await,
            }
        };
        match tokio::time::timeout(FETCH_TIMEOUT, fetch).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {}s", FETCH_TIMEOUT.as_secs())),
        }
    }

    async fn resource(&self, source: &DataSource) -> Fetched {
        let (path, list) = match source {
            DataSource::ResourceGet {
                resource,
                namespace,
                name,
                ..
            } => (
                format!("{}/{name}", collection(source, resource, namespace)),
                false,
            ),
            DataSource::ResourceList {
                resource,
                namespace,
                ..
            } => (
                format!(
                    "{}?limit={MAX_LIST_ITEMS}",
                    collection(source, resource, namespace)
                ),
                true,
            ),
            DataSource::HttpGet { .. } => return Err("not a resource".into()),
        };
        let request = hyper::Request::get(&path)
            .header(hyper::header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(|e| format!("bad request path {path}: {e}"))?;
        let body = match self.client.request_stream(request).await {
            Ok(body) => body,
            // The Kyverno SDK's get returns null for a missing object.
            Err(kube::Error::Api(s)) if s.code == 404 && !list => {
                return Ok(cel::Value::Null);
            }
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 401 => {
                return Err(format!(
                    "permission denied: {} (grant it with the chart's rbac.extraRules)",
                    s.message
                ));
            }
            Err(e) => return Err(e.to_string()),
        };
        let mut bytes = Vec::new();
        body.take(MAX_BODY_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| format!("reading the response: {e}"))?;
        if bytes.len() > MAX_BODY_BYTES {
            return Err(format!(
                "the response is larger than {MAX_BODY_BYTES} bytes"
            ));
        }
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("the response is not JSON: {e}"))?;
        if list {
            let cont = json["metadata"]["continue"].as_str().unwrap_or_default();
            if !cont.is_empty() {
                return Err(format!(
                    "more than {MAX_LIST_ITEMS} items; list a narrower set (a namespace)"
                ));
            }
        }
        Ok(object_value(&json))
    }

    async fn http_get(&self, url: &str) -> Fetched {
        let Some(client) = &self.http else {
            return Err(self
                .http_error
                .clone()
                .unwrap_or_else(|| "no HTTP client".into()));
        };
        let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
        if let Some(ip) = uri
            .host()
            .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
        {
            if link_local(ip) {
                return Err(format!(
                    "{ip} is link-local (cloud metadata endpoints are refused)"
                ));
            }
        }
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!("the response is larger than {MAX_BODY_BYTES} bytes")
                } else {
                    format!("reading the response: {e}")
                }
            })?
            .to_bytes();
        Ok(http_value(status, &body))
    }
}

/// `/api/v1[/namespaces/NS]/RESOURCE` or `/apis/GROUP/VERSION[...]`.
fn collection(source: &DataSource, resource: &str, namespace: &str) -> String {
    let (group, version) = source.group_version().unwrap_or(("", "v1"));
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    if namespace.is_empty() {
        format!("{base}/{resource}")
    } else {
        format!("{base}/namespaces/{namespace}/{resource}")
    }
}

fn link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn https_client() -> Result<
    HttpClient<hyper_rustls::HttpsConnector<HttpConnector<NoLinkLocal>>, Empty<Bytes>>,
    String,
> {
    let mut http = HttpConnector::new_with_resolver(NoLinkLocal(GaiResolver::new()));
    http.enforce_http(false);
    http.set_connect_timeout(Some(FETCH_TIMEOUT));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("loading the system's CA roots: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build(https))
}

/// The system resolver, with link-local addresses removed from every
/// answer (a name resolving only to one fails to connect).
#[derive(Clone)]
struct NoLinkLocal(GaiResolver);

type Addrs = std::vec::IntoIter<SocketAddr>;

impl tower_service::Service<Name> for NoLinkLocal {
    type Response = Addrs;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Addrs, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolving = self.0.call(name);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = resolving.await?.filter(|a| !link_local(a.ip())).collect();
            if addrs.is_empty() {
                return Err(std::io::Error::other(
                    "no usable address (link-local addresses, the cloud metadata endpoints, are refused)",
                ));
            }
            Ok(addrs.into_iter())
        })
    }
}
