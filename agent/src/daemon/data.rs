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
//! Each node fetches for itself (there is no cluster-wide fetcher): a
//! policy's sources when it changes, then every `evaluationInterval` plus
//! a random delay of up to a tenth of it (`Engine::evaluate`), so a fleet's
//! nodes spread their fetches over the interval instead of all asking at
//! its start; and a source several policies on the node read is fetched
//! once per [`SHARE_WINDOW`] and shared.
//!
//! `resource.*` go through the daemon's own kube client and credentials
//! (its RBAC: the chart's `rbac.extraRules`), as raw GETs on the path the
//! apiVersion and resource name (no discovery, no kind needed), the body
//! read up to the size limit. `http.get` uses hyper's client over rustls
//! with the system's roots, the stack the kube client already links;
//! redirects are not followed, and every destination address, named in the
//! URL or resolved from a name, must pass the [`DataGuard`]: never cloud
//! metadata or link-local, node and cluster-internal ranges only where the
//! operator allowed them (see [`super::data_guard`]).

use super::data_guard::DataGuard;
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
    http: Option<HttpClient<hyper_rustls::HttpsConnector<HttpConnector<Guarded>>, Empty<Bytes>>>,
    guard: Arc<DataGuard>,
    http_error: Option<String>,
    ready: mpsc::UnboundedSender<DataReady>,
    inflight: Mutex<HashMap<String, AbortHandle>>,
    /// Fetches started within [`SHARE_WINDOW`], by source: every policy on
    /// this node reading a source shares one fetch of it.
    recent: Mutex<HashMap<DataSource, (Instant, SharedFetch)>>,
}

/// One fetch of a source, awaited by every policy that asked for it.
type SharedFetch = futures::future::Shared<futures::future::BoxFuture<'static, Fetched>>;

/// How long a fetch of a source serves other policies on the node: the
/// policies that read one source (a list of registries, an allow-list)
/// fetch it once per window, not once each.
pub const SHARE_WINDOW: Duration = Duration::from_secs(5);

impl Fetcher {
    /// A fetcher using `client` for `resource.*`, answering on `ready`;
    /// `http.get` connects only where `guard` lets it. Without the
    /// system's CA roots, `http.get` fails each fetch with the reason (and
    /// `resource.*` still work).
    pub fn new(
        client: kube::Client,
        ready: mpsc::UnboundedSender<DataReady>,
        guard: DataGuard,
    ) -> Arc<Self> {
        let guard = Arc::new(guard);
        let (http, http_error) = match https_client(guard.clone()) {
            Ok(c) => (Some(c), None),
            Err(e) => {
                tracing::warn!(error = %e, "http.get data sources are unavailable");
                (None, Some(e))
            }
        };
        Arc::new(Fetcher {
            client,
            http,
            guard,
            http_error,
            ready,
            inflight: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
        })
    }

    /// Starts fetching `request` on the current runtime, aborting an older
    /// request for the same policy still in flight.
    pub fn request(self: &Arc<Self>, request: DataRequest) {
        let me = self.clone();
        let policy = request.policy.clone();
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let fetches = request.sources.iter().map(|s| me.shared_fetch(s));
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

    /// Fetches `source`, or joins the fetch of it another policy started
    /// within [`SHARE_WINDOW`] (its result when it is done). A request
    /// aborted by its policy's change leaves the shared fetch to the
    /// others.
    async fn shared_fetch(self: &Arc<Self>, source: &DataSource) -> Fetched {
        use futures::FutureExt as _;
        let shared = {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            recent.retain(|_, (started, _)| started.elapsed() < SHARE_WINDOW);
            match recent.get(source) {
                Some((_, fetch)) => fetch.clone(),
                None => {
                    let (me, s) = (self.clone(), source.clone());
                    let fetch = async move { me.fetch(&s).await }.boxed().shared();
                    recent.insert(source.clone(), (Instant::now(), fetch.clone()));
                    fetch
                }
            }
        };
        shared.await
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
        // An address in the URL is connected to without the resolver (the
        // connector parses it), so it is checked here.
        if let Some(ip) = uri
            .host()
            .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
        {
            self.guard.check(ip)?;
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

fn https_client(
    guard: Arc<DataGuard>,
) -> Result<HttpClient<hyper_rustls::HttpsConnector<HttpConnector<Guarded>>, Empty<Bytes>>, String>
{
    let mut http = HttpConnector::new_with_resolver(Guarded {
        resolver: GaiResolver::new(),
        guard,
    });
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

/// The system resolver, with the addresses the guard refuses removed from
/// every answer: the connector connects only to what is left (a name
/// resolving to none left fails, saying why).
#[derive(Clone)]
struct Guarded {
    resolver: GaiResolver,
    guard: Arc<DataGuard>,
}

type Addrs = std::vec::IntoIter<SocketAddr>;

impl tower_service::Service<Name> for Guarded {
    type Response = Addrs;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Addrs, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.resolver.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolving = self.resolver.call(name);
        let guard = self.guard.clone();
        Box::pin(async move {
            let mut refused = Vec::new();
            let addrs: Vec<SocketAddr> = resolving
                .await?
                .filter(|a| match guard.check(a.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused.push(why);
                        false
                    }
                })
                .collect();
            if addrs.is_empty() {
                return Err(std::io::Error::other(format!(
                    "no address it resolves to may be fetched: {}",
                    refused.join("; ")
                )));
            }
            Ok(addrs.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kyverno_runtime_bpf::egress::Prefix;
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A loopback HTTP server answering `{}` to every request; counts the
    /// connections it accepted.
    fn server() -> (u16, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().map_while(Result::ok) {
                count.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
            }
        });
        (port, accepted)
    }

    /// What fetching each URL gives with `allow`, on a runtime of its own.
    fn fetch_all(allow: &[&str], urls: &[String]) -> Vec<Result<(), String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Never used: `http.get` only.
            let client =
                kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                    .unwrap();
            let (tx, _rx) = mpsc::unbounded_channel();
            let guard =
                DataGuard::new(allow.iter().map(|p| p.parse::<Prefix>().unwrap()).collect());
            let fetcher = Fetcher::new(client, tx, guard);
            let mut out = Vec::new();
            for url in urls {
                let source = DataSource::HttpGet { url: url.clone() };
                out.push(fetcher.fetch(&source).await.map(|_| ()));
            }
            out
        })
    }

    #[test]
    fn http_get_reaches_an_internal_address_only_when_allowed_in_any_form() {
        let (port, accepted) = server();
        let urls: Vec<String> = [
            format!("http://127.0.0.1:{port}/"),
            // The same loopback address as IPv4-mapped IPv6: the connector
            // would reach the IPv4 listener.
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            // Forms the system resolver reads as 127.0.0.1.
            format!("http://localhost:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("http://0177.0.0.1:{port}/"),
        ]
        .into();
        for (url, got) in urls.iter().zip(fetch_all(&[], &urls)) {
            let why = got.expect_err(url);
            assert!(why.contains("loopback"), "{url}: {why}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "nothing connected");

        // Allowed: each form reaches the server.
        for (url, got) in urls
            .iter()
            .zip(fetch_all(&["127.0.0.0/8", "::1/128"], &urls))
        {
            assert_eq!(got, Ok(()), "{url}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), urls.len());
    }

    #[test]
    fn policies_reading_one_source_share_one_fetch_on_a_node() {
        let (port, accepted) = server();
        let url = format!("http://127.0.0.1:{port}/list");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answers = rt.block_on(async {
            let client =
                kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                    .unwrap();
            let (tx, mut rx) = mpsc::unbounded_channel();
            let guard = DataGuard::new(vec!["127.0.0.0/8".parse::<Prefix>().unwrap()]);
            let fetcher = Fetcher::new(client, tx, guard);
            let source = DataSource::HttpGet { url: url.clone() };
            let other = DataSource::HttpGet {
                url: format!("{url}?other"),
            };
            for (i, sources) in [
                vec![source.clone()],
                vec![source.clone(), other.clone()],
                vec![other],
            ]
            .into_iter()
            .enumerate()
            {
                fetcher.request(DataRequest {
                    policy: format!("p{i}"),
                    uid: format!("u{i}"),
                    epoch: 1,
                    sources,
                });
            }
            let mut answers = Vec::new();
            for _ in 0..3 {
                answers.push(rx.recv().await.unwrap());
            }
            answers
        });
        let source = DataSource::HttpGet { url: url.clone() };
        for a in &answers {
            assert!(!a.data.is_empty(), "{}: {:?}", a.policy, a.data);
            if a.policy != "p2" {
                assert!(
                    matches!(a.data.get(&source), Some(Ok(_))),
                    "{}: {:?}",
                    a.policy,
                    a.data
                );
            }
        }
        // Three policies, four reads of two sources: two fetches.
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn http_get_never_reaches_a_metadata_address_even_when_everything_is_allowed() {
        let urls: Vec<String> = [
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:169.254.169.254]/latest/meta-data/",
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
            "http://[fd00:ec2::254]/latest/meta-data/",
            "http://100.100.100.200/latest/meta-data/",
            // The decimal form, read by the resolver.
            "http://2852039166/latest/meta-data/",
        ]
        .map(str::to_owned)
        .into();
        for (url, got) in urls.iter().zip(fetch_all(&["0.0.0.0/0", "::/0"], &urls)) {
            let why = got.expect_err(url);
            assert!(why.contains("never fetched"), "{url}: {why}");
        }
    }
}
