//! The push sink against real collectors on loopback, over mutual TLS with
//! certificates generated here (two CAs, so a foreign client can be
//! refused).
//!
//! Timing assertions are upper bounds with slack; nothing waits on a fixed
//! sleep where a condition can be polled instead.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use kyverno_runtime_push::proto::finding_collector_client::FindingCollectorClient;
use kyverno_runtime_push::proto::finding_collector_server::FindingCollector;
use kyverno_runtime_push::proto::{self, Ack};
use kyverno_runtime_push::{
    CollectedFinding, Collector, DropHook, PushConfig, PushDrop, PushHandle, PushSink, ServerTls,
};
use kyverno_runtime_report::{sanitize, Decision, Finding};
use prost::Message as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::io::{AsyncReadExt as _, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

// ---------------------------------------------------------------- certificates

/// Every file the tests use, in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate from a CA the collector does not trust.
    foreign_cert: PathBuf,
    foreign_key: PathBuf,
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate and its key, as PEM.
fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let trusted = ca("kyverno-runtime test CA");
    let foreign = ca("somebody else's CA");
    let (server_cert, server_key) = leaf(
        &trusted,
        "collector",
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        &trusted,
        "node-a",
        &["node-a"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let (foreign_cert, foreign_key) = leaf(
        &foreign,
        "node-x",
        &["node-x"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    Pki {
        ca: write(d, "ca.pem", &trusted.pem()),
        server_cert: write(d, "server.pem", &server_cert),
        server_key: write(d, "server-key.pem", &server_key),
        client_cert: write(d, "client.pem", &client_cert),
        client_key: write(d, "client-key.pem", &client_key),
        foreign_cert: write(d, "foreign.pem", &foreign_cert),
        foreign_key: write(d, "foreign-key.pem", &foreign_key),
        dir,
    }
}

impl Pki {
    fn server_tls(&self) -> ServerTls {
        ServerTls {
            ca: self.ca.clone(),
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
        }
    }

    /// A sink configuration for `addr` with test-sized backoff.
    fn config(&self, addr: SocketAddr) -> PushConfig {
        let mut c = PushConfig::new(
            addr.to_string(),
            &self.ca,
            &self.client_cert,
            &self.client_key,
            "node-a",
        );
        c.backoff_initial = Duration::from_millis(100);
        c.backoff_max = Duration::from_millis(400);
        c.connect_timeout = Duration::from_secs(5);
        c
    }
}

// ---------------------------------------------------------------- helpers

fn finding(target: &str) -> Finding {
    Finding {
        policy: "no-tools".into(),
        target: target.into(),
        enforced: false,
        decision: Some(Decision::DefaultDenied),
        first_observed: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        last_observed: UNIX_EPOCH + Duration::from_secs(1_800_000_001),
        ..kyverno_runtime_report::fixtures::finding()
    }
}

/// The target carrying both secrets the redaction must remove.
const SECRET_TARGET: &str = "/usr/bin/mysql --password=hunter2 -H Bearer abc.def.ghi";
const SECRETS: [&str; 2] = ["hunter2", "abc.def.ghi"];

/// The collector's output, readable while it is being written.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Output {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl AsyncWrite for Output {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Something running in the background that stops when told.
struct Running<T> {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<T>,
}

impl<T> Running<T> {
    /// Stops it and waits (bounded) for it to end; returns how long that
    /// took.
    async fn stop(mut self) -> (T, Duration) {
        let started = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        let out = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("did not stop within 30 s")
            .unwrap();
        (out, started.elapsed())
    }
}

fn stop_signal() -> (
    oneshot::Sender<()>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}

/// A JSON-lines collector on `addr` (port 0 for any).
async fn collector(
    pki: &Pki,
    addr: SocketAddr,
) -> (
    SocketAddr,
    Output,
    Running<kyverno_runtime_push::Result<()>>,
) {
    serve(Collector::bind(addr, &pki.server_tls()).await.unwrap())
}

/// Serves JSON lines from a bound collector: its address, its output and
/// the running server.
fn serve(
    c: Collector,
) -> (
    SocketAddr,
    Output,
    Running<kyverno_runtime_push::Result<()>>,
) {
    let addr = c.local_addr();
    let out = Output::default();
    let (stop, signal) = stop_signal();
    let task = tokio::spawn(c.serve(out.clone(), signal));
    (
        addr,
        out,
        Running {
            stop: Some(stop),
            task,
        },
    )
}

fn run(sink: PushSink) -> Running<()> {
    let (stop, signal) = stop_signal();
    Running {
        stop: Some(stop),
        task: tokio::spawn(sink.run(signal)),
    }
}

/// Polls `cond` until it holds or `within` passes.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn parse(lines: &[String]) -> Vec<CollectedFinding> {
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn assert_no_secret(text: &[u8], context: &str) {
    for secret in SECRETS {
        assert!(
            !text.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret:?} leaked in {context}"
        );
    }
}

// ---------------------------------------------------------------- (a)

/// Findings arrive in the order they were submitted, one JSON line each,
/// redacted, with the fingerprint the Reports use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_arrive_in_order_and_redacted() {
    let pki = pki();
    let (addr, out, server) = collector(&pki, "127.0.0.1:0".parse().unwrap()).await;
    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);

    let mut sent = Vec::new();
    for i in 0..300 {
        let target = if i == 150 {
            SECRET_TARGET.to_owned()
        } else {
            format!("/usr/bin/tool-{i:03}")
        };
        sent.push(finding(&target));
        handle.submit(finding(&target));
    }
    until(Duration::from_secs(10), "300 lines", || {
        out.lines().len() >= 300
    })
    .await;

    let lines = out.lines();
    assert_eq!(lines.len(), 300);
    for line in &lines {
        assert_no_secret(line.as_bytes(), "a JSON line");
    }
    let got = parse(&lines);
    let want: Vec<String> = sent.iter().map(|f| sanitize(&f.target)).collect();
    let targets: Vec<String> = got.iter().map(|f| f.target.clone()).collect();
    assert_eq!(targets, want, "order or content changed");
    assert_eq!(
        got[150].target,
        "/usr/bin/mysql --password=*** -H Bearer ***"
    );
    for (g, f) in got.iter().zip(&sent) {
        assert_eq!(g.fingerprint, f.fingerprint().to_string());
        assert_eq!(g.node, "node-a");
        assert_eq!(g.behavior, "exec");
        assert_eq!(g.decision.as_deref(), Some("default-denied"));
        assert_eq!(g.pod.owner_kind.as_deref(), Some("StatefulSet"));
        assert_eq!(g.first_observed, "2027-01-15T08:00:00Z");
    }
    // camelCase on the line itself.
    assert!(lines[0].contains(r#""policyUid":"#) && lines[0].contains(r#""ownerKind":"#));

    let ((), _) = sending.stop().await;
    assert_eq!(handle.delivered(), 300);
    assert_eq!(handle.dropped(), 0);
    assert_eq!(handle.queued(), 0);
    let (result, _) = server.stop().await;
    result.unwrap();
}

/// A collector that records the decoded wire messages.
struct Recorder(mpsc::UnboundedSender<proto::Finding>);

#[tonic::async_trait]
impl FindingCollector for Recorder {
    async fn report(
        &self,
        request: tonic::Request<tonic::Streaming<proto::Finding>>,
    ) -> Result<tonic::Response<Ack>, tonic::Status> {
        let mut stream = request.into_inner();
        let mut received = 0;
        while let Some(m) = stream.message().await? {
            let _ = self.0.send(m);
            received += 1;
        }
        Ok(tonic::Response::new(Ack { received }))
    }
}

/// The secret is gone from the gRPC message itself, not only from the
/// collector's JSON (which redacts again on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_wire() {
    let pki = pki();
    let c = Collector::bind("127.0.0.1:0".parse().unwrap(), &pki.server_tls())
        .await
        .unwrap();
    let addr = c.local_addr();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_server, signal) = stop_signal();
    let server = tokio::spawn(c.serve_service(Recorder(tx), signal));

    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    handle.submit(finding(SECRET_TARGET));
    let mut pod_secret = finding("/bin/sh");
    pod_secret.pod.container = Some("token=hunter2".into());
    handle.submit(pod_secret);

    for _ in 0..2 {
        let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_no_secret(&message.encode_to_vec(), "the gRPC message");
        assert_eq!(message.node, "node-a");
    }
    sending.stop().await;
    let _ = stop_server.send(());
    server.await.unwrap().unwrap();
}

/// A finding per row of the redaction table, its argv the row's.
fn table_findings() -> Vec<(
    Finding,
    &'static kyverno_runtime_report::redaction_cases::Case,
)> {
    use kyverno_runtime_report::{redaction_cases::CASES, Process};
    CASES
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let mut f = finding(&format!("/usr/bin/tool-{i:03}"));
            f.process = Some(Process {
                pid: 7,
                comm: "tool".into(),
                argv: case.argv(),
            });
            (f, case)
        })
        .collect()
}

/// Every row of the redaction table reaches the collector, over mutual
/// TLS, as a gRPC message whose argv is the row's redaction and whose
/// bytes hold none of the row's secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_the_redaction_table_reaches_the_wire() {
    let pki = pki();
    let c = Collector::bind("127.0.0.1:0".parse().unwrap(), &pki.server_tls())
        .await
        .unwrap();
    let addr = c.local_addr();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_server, signal) = stop_signal();
    let server = tokio::spawn(c.serve_service(Recorder(tx), signal));
    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    let rows = table_findings();
    for (f, _) in &rows {
        handle.submit(f.clone());
    }
    let mut bytes = 0;
    for (_, case) in &rows {
        let message = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        let encoded = message.encode_to_vec();
        bytes += encoded.len();
        for secret in case.secrets {
            assert!(
                !encoded
                    .windows(secret.len())
                    .any(|w| w == secret.as_bytes()),
                "{}: {secret} in the gRPC message",
                case.rule
            );
        }
        assert_eq!(
            message.process.unwrap().argv,
            case.redacted,
            "{}",
            case.rule
        );
    }
    println!("{} gRPC messages, {bytes} bytes, no secret", rows.len());
    sending.stop().await;
    let _ = stop_server.send(());
    server.await.unwrap().unwrap();
}

/// The reference collector's JSON lines for the same findings carry none
/// of the secrets either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_the_redaction_table_reaches_the_collectors_output() {
    let pki = pki();
    let (addr, out, server) = collector(&pki, "127.0.0.1:0".parse().unwrap()).await;
    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    let rows = table_findings();
    for (f, _) in &rows {
        handle.submit(f.clone());
    }
    until(Duration::from_secs(10), "every row", || {
        out.lines().len() >= rows.len()
    })
    .await;
    let text = out.lines().join("\n");
    for secret in kyverno_runtime_report::redaction_cases::all_secrets() {
        assert!(!text.contains(secret), "{secret} in the collector's output");
    }
    sending.stop().await;
    let (result, _) = server.stop().await;
    result.unwrap();
}

// ---------------------------------------------------------------- (b)

/// A client certificate from another CA is refused: nothing arrives, and
/// the sink reports the failure (and keeps retrying, which is what a
/// rotated-in-later certificate needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_refused() {
    let pki = pki();
    let (addr, out, server) = collector(&pki, "127.0.0.1:0".parse().unwrap()).await;
    let mut config = pki.config(addr);
    config.cert = pki.foreign_cert.clone();
    config.key = pki.foreign_key.clone();
    let sink = PushSink::new(config, None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    // The stream takes a finding and then fails (or fails first and
    // retries with it until one takes it): either way it ends up counted.
    // In TLS 1.3 the client sends its certificate after its side of the
    // handshake is done, so the collector's alert races the reset of the
    // connection it closes: on a loaded machine the client can read the
    // reset first (seen in CI). A few findings give the alert its chance.
    let mut submitted = 0;
    let failure = loop {
        handle.submit(finding("/usr/bin/curl"));
        submitted += 1;
        until(Duration::from_secs(10), "a reported failure", || {
            handle.failures() >= submitted && handle.dropped() == submitted
        })
        .await;
        let failure = handle.last_failure().unwrap();
        eprintln!("foreign client, attempt {submitted}: {failure}");
        if failure.contains("UnknownCA") || submitted == 5 {
            break failure;
        }
    };
    // The collector's TLS alert, not only hyper's "connection closed".
    assert!(failure.contains("UnknownCA"), "{failure}");
    assert!(
        out.lines().is_empty(),
        "a finding arrived: {:?}",
        out.lines()
    );
    assert_eq!(handle.delivered(), 0);
    assert_eq!(handle.dropped_by(PushDrop::SendFailed), submitted);
    sending.stop().await;

    // The collector is unharmed: a trusted client still gets through.
    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let good = sink.handle();
    let sending = run(sink);
    good.submit(finding("/usr/bin/wget"));
    until(Duration::from_secs(10), "the trusted client's line", || {
        out.lines().len() == 1
    })
    .await;
    sending.stop().await;
    server.stop().await.0.unwrap();
}

// ---------------------------------------------------------------- (c)

/// A plaintext gRPC client (tonic without TLS) gets nothing through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_is_refused() {
    let pki = pki();
    let (addr, out, server) = collector(&pki, "127.0.0.1:0".parse().unwrap()).await;
    let message = proto::Finding {
        policy: "p".into(),
        behavior: proto::Behavior::Exec as i32,
        pod: Some(proto::PodIdentity::default()),
        target: "/bin/sh".into(),
        first_observed: Some(prost_types::Timestamp::default()),
        last_observed: Some(prost_types::Timestamp::default()),
        fingerprint: "0".repeat(64),
        node: "plain".into(),
        ..Default::default()
    };
    let attempt = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        FindingCollectorClient::new(channel)
            .report(futures::stream::iter([message]))
            .await
            .map(|ack| ack.into_inner().received)
            .map_err(|s| s.to_string())
    };
    let result = tokio::time::timeout(Duration::from_secs(15), attempt)
        .await
        .expect("the plaintext attempt hung");
    eprintln!("plaintext client: {result:?}");
    assert!(result.is_err(), "plaintext was accepted: {result:?}");
    assert!(out.lines().is_empty());
    server.stop().await.0.unwrap();
}

// ---------------------------------------------------------------- (d)

/// A TLS listener that completes the handshake and then never reads: the
/// client's HTTP/2 flow-control window shuts after 64 KiB and stays shut.
async fn deaf_collector(
    pki: &Pki,
) -> (
    SocketAddr,
    Arc<Mutex<Vec<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>>,
) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server_cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(tls) = acceptor.accept(tcp).await {
                keep.lock().unwrap().push(tls);
            }
        }
    });
    (addr, held)
}

/// Shutdown is bounded even when the collector accepted the stream and
/// stopped reading: the deadline closes the connection out from under the
/// blocked stream, and everything not confirmed is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_when_the_collector_stops_reading() {
    let pki = pki();
    let (addr, held) = deaf_collector(&pki).await;
    let mut config = pki.config(addr);
    let deadline = Duration::from_secs(2);
    config.shutdown_deadline = deadline;
    // The stall watchdog must not end the stream first.
    config.stall_timeout = Duration::from_secs(120);
    let total = 3000u64;
    let sink = PushSink::new(config, None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    // ~250 bytes a message: far more than the 64 KiB window.
    let long = "/var/lib/application/data/".repeat(8);
    for i in 0..total {
        handle.submit(finding(&format!("{long}{i}")));
    }
    until(
        Duration::from_secs(10),
        "the stream to take findings",
        || handle.queued() < total as usize,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = handle.queued();
    assert!(
        queued > 0,
        "the window should have shut with findings queued"
    );

    let ((), elapsed) = sending.stop().await;
    eprintln!("stuck collector: run() returned {elapsed:?} after shutdown (deadline {deadline:?}); {queued} were queued");
    assert!(
        elapsed < deadline + Duration::from_secs(2),
        "took {elapsed:?}"
    );
    assert!(
        elapsed >= deadline - Duration::from_millis(50),
        "ended before the deadline: {elapsed:?}"
    );
    assert_eq!(handle.delivered(), 0);
    assert_eq!(handle.queued(), 0);
    let unconfirmed = handle.dropped_by(PushDrop::SendFailed);
    let left = handle.dropped_by(PushDrop::Shutdown);
    eprintln!(
        "stuck collector: {unconfirmed} unconfirmed (send_failed), {left} left queued (shutdown)"
    );
    assert_eq!(unconfirmed + left, total);
    assert!(unconfirmed > 0 && left > 0);

    // The connection was really closed, not left to hyper's tasks: the
    // deaf side now reads what was sent and then the end.
    let mut conn = held
        .lock()
        .unwrap()
        .pop()
        .expect("a connection was accepted");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the client never closed the connection");
}

// ---------------------------------------------------------------- (e)

/// With nothing listening, the queue keeps the newest 4096 and counts the
/// rest; shutdown counts what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_costs_the_oldest_findings_and_counts_them() {
    let pki = pki();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let hooked = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let seen = hooked.clone();
    let hook: DropHook = Arc::new(move |reason, n| {
        let i = PushDrop::ALL.iter().position(|r| *r == reason).unwrap();
        seen[i].fetch_add(n, Ordering::SeqCst);
    });
    let sink = PushSink::new(pki.config(addr), Some(hook)).unwrap();
    let handle: PushHandle = sink.handle();
    let sending = run(sink);

    let started = Instant::now();
    for i in 0..10_000 {
        handle.submit(finding(&format!("/usr/bin/tool-{i}")));
    }
    let submit_time = started.elapsed();
    let queued = handle.queued();
    let full = handle.dropped_by(PushDrop::QueueFull);
    eprintln!("dead collector: 10000 submitted in {submit_time:?}: queued {queued}, dropped queue_full {full}, dropped total {}", handle.dropped());
    assert_eq!(queued, 4096);
    assert_eq!(full, 5904);
    assert_eq!(handle.dropped(), 5904);
    assert_eq!(hooked[0].load(Ordering::SeqCst), 5904);
    // Let it fail to connect a few times: nothing is taken or lost by that.
    until(Duration::from_secs(10), "connection failures", || {
        handle.failures() >= 2
    })
    .await;
    assert_eq!(handle.queued(), 4096);
    assert_eq!(handle.dropped_by(PushDrop::SendFailed), 0);

    let ((), elapsed) = sending.stop().await;
    assert!(elapsed < PushConfig::DEFAULT_SHUTDOWN_DEADLINE + Duration::from_secs(2));
    let shutdown = handle.dropped_by(PushDrop::Shutdown);
    eprintln!(
        "dead collector: after shutdown: dropped shutdown {shutdown}, total {}",
        handle.dropped()
    );
    assert_eq!(shutdown, 4096);
    assert_eq!(hooked[2].load(Ordering::SeqCst), 4096);
    assert_eq!(handle.dropped(), 10_000);
    // After the sink stopped, a submission is counted, not kept.
    handle.submit(finding("/late"));
    assert_eq!(handle.queued(), 0);
    assert_eq!(handle.dropped_by(PushDrop::Shutdown), 4097);
}

// ---------------------------------------------------------------- (f)

/// An error with its causes, as the binary prints it.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// Every bad TLS file fails construction, naming the file.
#[tokio::test]
async fn bad_tls_files_fail_construction_naming_the_file() {
    let pki = pki();
    let d = pki.dir.path();
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let missing = d.join("missing.pem");
    let garbage = write(d, "garbage.pem", "this is not a certificate\n");
    let broken = write(
        d,
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    );
    let unreadable = d.join("a-directory");
    std::fs::create_dir(&unreadable).unwrap();

    type Change = fn(&mut PushConfig, &Path);
    let cases: Vec<(&str, &Path, Change, &str)> = vec![
        (
            "missing CA",
            &missing,
            |c, p| c.ca = p.into(),
            "No such file",
        ),
        (
            "unreadable CA",
            &unreadable,
            |c, p| c.ca = p.into(),
            "Is a directory",
        ),
        (
            "CA without a certificate",
            &garbage,
            |c, p| c.ca = p.into(),
            "holds no certificate",
        ),
        ("broken CA", &broken, |c, p| c.ca = p.into(), "is not PEM"),
        (
            "missing certificate",
            &missing,
            |c, p| c.cert = p.into(),
            "certificate file",
        ),
        (
            "certificate without one",
            &garbage,
            |c, p| c.cert = p.into(),
            "holds no certificate",
        ),
        (
            "missing key",
            &missing,
            |c, p| c.key = p.into(),
            "private key file",
        ),
        (
            "key file without a key",
            &garbage,
            |c, p| c.key = p.into(),
            "holds no private key",
        ),
    ];
    for (what, path, change, says) in cases {
        let mut config = pki.config(addr);
        change(&mut config, path);
        let err = chain(&PushSink::new(config, None).unwrap_err());
        eprintln!("{what}: {err}");
        assert!(err.contains(&path.display().to_string()), "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    }

    // A key that belongs to another certificate names both files.
    let mut config = pki.config(addr);
    config.key = pki.server_key.clone();
    let err = chain(&PushSink::new(config, None).unwrap_err());
    eprintln!("mismatched key: {err}");
    assert!(err.contains("KeyMismatch"), "{err}");
    assert!(
        err.contains(&pki.client_cert.display().to_string()),
        "{err}"
    );
    assert!(err.contains(&pki.server_key.display().to_string()), "{err}");

    // The collector checks its files the same way.
    let mut tls = pki.server_tls();
    tls.key = missing.clone();
    let err = Collector::bind("127.0.0.1:0".parse().unwrap(), &tls)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("private key file"),
        "{err}"
    );
}

// ---------------------------------------------------------------- (g)

/// After the collector goes away and comes back on the same address,
/// delivery resumes without losing what was queued meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_resumes_after_the_collector_comes_back() {
    let pki = pki();
    let (addr, first_out, first) = collector(&pki, "127.0.0.1:0".parse().unwrap()).await;
    let mut config = pki.config(addr);
    // Streams close soon after their first finding, so the first
    // collector's graceful stop does not wait on this client.
    config.stream_max_age = Duration::from_millis(200);
    let sink = PushSink::new(config, None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);

    handle.submit(finding("/before"));
    until(Duration::from_secs(10), "the first line", || {
        first_out.lines().len() == 1
    })
    .await;
    let (result, stopped_in) = first.stop().await;
    result.unwrap();
    eprintln!("first collector stopped in {stopped_in:?}");

    // Queued while nothing listens: the sink fails, backs off, retries.
    handle.submit(finding("/while-down"));
    let failures_before = handle.failures();
    until(Duration::from_secs(10), "failed reconnects", || {
        handle.failures() >= failures_before + 2
    })
    .await;
    assert_eq!(handle.queued(), 1);

    let (_, second_out, second) = collector(&pki, addr).await;
    until(
        Duration::from_secs(10),
        "delivery to the second collector",
        || second_out.lines().len() == 1,
    )
    .await;
    handle.submit(finding("/after"));
    until(Duration::from_secs(10), "the next line", || {
        second_out.lines().len() == 2
    })
    .await;
    let got = parse(&second_out.lines());
    assert_eq!(got[0].target, "/while-down");
    assert_eq!(got[1].target, "/after");

    sending.stop().await;
    assert_eq!(handle.delivered(), 3);
    assert_eq!(handle.dropped(), 0);
    eprintln!(
        "reconnect: {} failures while the collector was away",
        handle.failures()
    );
    second.stop().await.0.unwrap();
}

// ---------------------------------------------------------------- stall

/// A stream the collector stopped reading is abandoned after the stall
/// timeout (its findings counted), and the sink reconnects instead of
/// waiting on it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_abandoned_and_retried() {
    let pki = pki();
    let (addr, held) = deaf_collector(&pki).await;
    let mut config = pki.config(addr);
    config.stall_timeout = Duration::from_millis(400);
    config.shutdown_deadline = Duration::from_millis(500);
    let sink = PushSink::new(config, None).unwrap();
    let handle = sink.handle();
    let sending = run(sink);
    let long = "/var/lib/application/data/".repeat(8);
    for i in 0..3000 {
        handle.submit(finding(&format!("{long}{i}")));
    }
    until(Duration::from_secs(10), "a second connection", || {
        held.lock().unwrap().len() >= 2
    })
    .await;
    let failure = handle.last_failure().unwrap();
    eprintln!("stalled: {failure}");
    assert!(failure.contains("no progress"), "{failure}");
    assert!(handle.dropped_by(PushDrop::SendFailed) > 0);
    assert_eq!(handle.delivered(), 0);
    sending.stop().await;
}

// ---------------------------------------------------------------- identity

/// With `bind_node_identity`, a finding must come from a certificate that
/// names its node: node-a's certificate delivers node-a's findings, and a
/// daemon that says it is node-b with node-a's certificate gets nothing
/// through (issue 37: one node must not report for another). Without it,
/// the shared-certificate deployment of the chart keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_for_a_node_its_certificate_does_not_name_is_refused() {
    let pki = pki();
    let (addr, out, server) = serve(
        Collector::bind("127.0.0.1:0".parse().unwrap(), &pki.server_tls())
            .await
            .unwrap()
            .bind_node_identity(true),
    );

    // node-b, with node-a's certificate.
    let mut config = pki.config(addr);
    config.node = "node-b".into();
    let sink = PushSink::new(config, None).unwrap();
    let forger = sink.handle();
    let sending = run(sink);
    forger.submit(finding("/usr/bin/curl"));
    until(Duration::from_secs(10), "the refusal", || {
        forger.failures() >= 1
    })
    .await;
    let failure = forger.last_failure().unwrap();
    eprintln!("node-b with node-a's certificate: {failure}");
    assert!(
        failure.contains("does not name node \"node-b\""),
        "{failure}"
    );
    assert_eq!(forger.delivered(), 0);
    sending.stop().await;
    assert!(out.lines().is_empty(), "{:?}", out.lines());

    // node-a, with its own certificate.
    let sink = PushSink::new(pki.config(addr), None).unwrap();
    let honest = sink.handle();
    let sending = run(sink);
    honest.submit(finding("/usr/bin/wget"));
    until(Duration::from_secs(10), "node-a's line", || {
        out.lines().len() == 1
    })
    .await;
    assert_eq!(parse(&out.lines())[0].node, "node-a");
    sending.stop().await;
    server.stop().await.0.unwrap();
}

/// The daemon's side of TLS: a collector whose certificate another CA
/// signed, or that names another host, gets nothing, and the sink says
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_refuses_a_collector_of_another_ca_or_another_name() {
    let pki = pki();
    let d = pki.dir.path();
    // A collector whose certificate names another host.
    let issuer = ca("kyverno-runtime test CA (elsewhere)");
    let (cert, key) = leaf(
        &issuer,
        "collector",
        &["collector.elsewhere.example"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let elsewhere = ServerTls {
        ca: pki.ca.clone(),
        cert: write(d, "elsewhere.pem", &cert),
        key: write(d, "elsewhere-key.pem", &key),
    };
    let elsewhere_ca = write(d, "elsewhere-ca.pem", &issuer.pem());
    for (what, client_ca, want) in [
        // The sink trusts only its own CA: this collector's is another.
        ("another CA", pki.ca.clone(), "UnknownIssuer"),
        // The sink trusts the collector's CA, but dials 127.0.0.1, which
        // the certificate does not name.
        (
            "another name",
            elsewhere_ca.clone(),
            "certificate not valid for name \"127.0.0.1\"",
        ),
    ] {
        let (addr, out, server) = serve(
            Collector::bind("127.0.0.1:0".parse().unwrap(), &elsewhere)
                .await
                .unwrap(),
        );
        let mut config = pki.config(addr);
        config.ca = client_ca;
        let sink = PushSink::new(config, None).unwrap();
        let handle = sink.handle();
        let sending = run(sink);
        handle.submit(finding("/usr/bin/curl"));
        until(Duration::from_secs(10), "a reported failure", || {
            handle.failures() >= 1
        })
        .await;
        let failure = handle.last_failure().unwrap();
        eprintln!("{what}: {failure}");
        assert!(failure.contains(want), "{what}: {failure}");
        assert_eq!(handle.delivered(), 0, "{what}");
        assert!(out.lines().is_empty(), "{what}: {:?}", out.lines());
        sending.stop().await;
        server.stop().await.0.unwrap();
    }
}
