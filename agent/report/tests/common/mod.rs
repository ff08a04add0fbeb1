//! What the API-tier tests of the reporter share: the local cluster with
//! the CRDs applied, clients, a tower layer that interferes with the next
//! Report write, and a recorder of write outcomes.
// A test harness: a panic is the failure report. Not every test binary
// uses every helper.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod rollup;
pub mod workloads;

use kyverno_runtime_api::openreports::report_crd;
use kyverno_runtime_report::{ReporterOptions, WriteResult};
use kyverno_runtime_testkube::LocalCluster;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

/// Applies `yaml` (server-side) with the cluster's kubectl.
pub fn apply_yaml(cluster: &LocalCluster, yaml: &str) {
    let mut child = cluster
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The cluster, with the Report and RuntimePolicy CRDs applied and
/// established (generated from the Rust types, not read from the chart).
pub fn cluster() -> &'static LocalCluster {
    static READY: OnceLock<()> = OnceLock::new();
    let cluster = LocalCluster::get().expect("local control plane (ci/kube-up)");
    READY.get_or_init(|| {
        for crd in [report_crd(), kyverno_runtime_api::crd::runtime_policy()] {
            apply_yaml(cluster, &kyverno_runtime_api::crd::to_yaml(&crd).unwrap());
        }
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/reports.openreports.io",
                "crd/runtimepolicies.runtime.nirmata.io",
            ])
            .unwrap();
    });
    cluster
}

pub async fn config() -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster().kubeconfig).unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

pub async fn client() -> kube::Client {
    kube::Client::try_from(config().await).unwrap()
}

/// A client whose next Report write first runs `interfere`'s action.
pub async fn client_with(interfere: &Interfere) -> kube::Client {
    kube::client::ClientBuilder::try_from(config().await)
        .unwrap()
        .with_layer(interfere)
        .build()
}

pub fn ignore_not_found<T>(r: Result<T, kube::Error>) {
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("{e}"),
    }
}

pub fn ignore_conflict<T>(r: Result<T, kube::Error>) {
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
}

/// Records every write outcome the reporter reports.
#[derive(Clone, Default)]
pub struct Writes(Arc<Mutex<Vec<WriteResult>>>);

impl Writes {
    pub fn options(&self) -> ReporterOptions {
        let seen = self.0.clone();
        ReporterOptions {
            on_write: Some(Arc::new(move |r| seen.lock().unwrap().push(r))),
            ..ReporterOptions::default()
        }
    }
    pub fn take(&self) -> Vec<WriteResult> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A tower layer that runs a one-shot action before the next Report write
/// (POST or PUT) its client sends.
#[derive(Clone, Default)]
pub struct Interfere {
    next: Arc<Mutex<Option<Action>>>,
}

pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

pub enum Action {
    /// Run this to completion, then send the write.
    Before(BoxFuture),
    /// Fail the write as if the connection had dropped.
    Fail,
}

impl Interfere {
    pub fn arm(&self, action: Action) {
        *self.next.lock().unwrap() = Some(action);
    }
    pub fn is_armed(&self) -> bool {
        self.next.lock().unwrap().is_some()
    }
}

impl<S> tower::Layer<S> for Interfere {
    type Service = InterfereService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        InterfereService {
            inner,
            interfere: self.clone(),
        }
    }
}

pub struct InterfereService<S> {
    inner: S,
    interfere: Interfere,
}

impl<S, B> tower::Service<http::Request<B>> for InterfereService<S>
where
    S: tower::Service<http::Request<B>, Error = tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let write = matches!(*req.method(), http::Method::POST | http::Method::PUT)
            && req.uri().path().contains("/reports");
        let action = if write {
            self.interfere.next.lock().unwrap().take()
        } else {
            None
        };
        // The inner future sends nothing until it is polled, so the write
        // leaves only after the action is done.
        let fut = self.inner.call(req);
        Box::pin(async move {
            match action {
                Some(Action::Fail) => Err("injected connection failure".into()),
                Some(Action::Before(before)) => {
                    before.await;
                    fut.await
                }
                None => fut.await,
            }
        })
    }
}
