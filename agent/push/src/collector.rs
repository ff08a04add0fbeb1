//! The reference collector: the receiving end of the push stream, over
//! mutual TLS only, writing each finding as one JSON line.
//!
//! It is what `kyverno-runtime collector` runs, what the tests push to, and
//! a template for a real one: [`Collector::serve_service`] puts any
//! implementation of the generated
//! [`FindingCollector`](crate::proto::finding_collector_server::FindingCollector)
//! behind the same TLS listener.
//!
//! Every connection must present a client certificate that chains to the
//! CA file; there is no plaintext mode. With
//! [`Collector::bind_node_identity`], each finding must also come from a
//! certificate that names its node (a DNS name of its subject alternative
//! names, matched as webpki matches a server's), so one node cannot report
//! for another. Handshakes run in tasks of their
//! own, each bounded, so a client that connects and says nothing holds up
//! nobody. On shutdown the collector stops accepting, lets open streams
//! finish for [`SHUTDOWN_GRACE`] (a daemon closes its streams often, see
//! [`PushSink`](crate::PushSink)), then closes whatever is left.

use crate::abort::{Abortable, Connections};
use crate::error::{Error, Result};
use crate::proto::finding_collector_server::{FindingCollector, FindingCollectorServer};
use crate::proto::{self, Ack};
use crate::tls::Identity;
use crate::wire::{CollectedFinding, ReceivedFinding};
use rustls::pki_types::{CertificateDer, ServerName};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

/// How long open streams may run on after shutdown before their
/// connections are closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The collector's TLS files (PEM).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The CA certificate(s) that sign the daemons' client certificates.
    pub ca: PathBuf,
    /// The collector's certificate chain; its names must include the host
    /// the daemons dial.
    pub cert: PathBuf,
    /// The collector certificate's private key.
    pub key: PathBuf,
}

/// A collector bound to its address, not yet serving.
///
/// Binding first and serving second lets a caller learn the address (for
/// `127.0.0.1:0`) before the first connection can arrive.
///
/// Every connection must present a client certificate that chains to the
/// CA file; there is no plaintext mode. Handshakes run in tasks of their
/// own, each bounded by [`HANDSHAKE_TIMEOUT`]. On shutdown the collector
/// stops accepting (the port closes), lets open streams finish for
/// [`SHUTDOWN_GRACE`], then closes whatever is left and returns.
pub struct Collector {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    local_addr: SocketAddr,
    bind_node_identity: bool,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// Reads and checks the TLS files (failing with the file's name, as
    /// [`PushSink::new`](crate::PushSink::new) does), then listens.
    pub async fn bind(addr: SocketAddr, tls: &ServerTls) -> Result<Collector> {
        let config = Identity::load(&tls.ca, &tls.cert, &tls.key)?.server_config()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Collector {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            local_addr,
            bind_node_identity: false,
        })
    }

    /// Accepts a finding only from a client certificate that names its
    /// node (see the [module docs](self)): needs a certificate per node;
    /// a stream with another node's finding is refused
    /// (`PERMISSION_DENIED`, logged) at that finding.
    pub fn bind_node_identity(mut self, on: bool) -> Self {
        self.bind_node_identity = on;
        self
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, writing each received finding to
    /// `out` as one JSON line ([`CollectedFinding`], flushed per line).
    ///
    /// A message that is not a valid finding is skipped and logged, and not
    /// counted in the stream's [`Ack`]. A write error stops the collector
    /// and is returned, since a collector that cannot store what it
    /// receives must not acknowledge it.
    pub async fn serve<W>(self, out: W, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let failure = Arc::new(OutputFailure::default());
        let service = JsonLines {
            out: Arc::new(tokio::sync::Mutex::new(out)),
            failure: failure.clone(),
            bind_node_identity: self.bind_node_identity,
        };
        let stop = async {
            tokio::select! {
                () = shutdown => {}
                () = failure.wait() => {}
            }
        };
        self.serve_service(service, stop).await?;
        match failure.take() {
            Some(source) => Err(Error::Output { source }),
            None => Ok(()),
        }
    }

    /// Serves `service` behind this collector's mutual TLS until `shutdown`
    /// completes (then as described on [`Collector`]).
    pub async fn serve_service<S>(
        self,
        service: S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()>
    where
        S: FindingCollector,
    {
        let conns = Arc::new(Connections::default());
        let (tx, rx) = mpsc::channel::<ServerConn>(16);
        let accept = tokio::spawn(accept_loop(
            self.listener,
            self.acceptor,
            self.local_addr,
            conns.clone(),
            tx,
        ));
        // tonic drops this stream when it stops accepting, which ends the
        // accept loop and closes the listening socket.
        let incoming = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|conn| (Ok::<_, io::Error>(conn), rx))
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = Server::builder()
            .add_service(FindingCollectorServer::new(service))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.await;
            });
        let mut server = pin!(server);
        let result = tokio::select! {
            result = &mut server => result,
            () = shutdown => {
                let _ = stop_tx.send(());
                match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                    Ok(result) => result,
                    Err(_) => {
                        tracing::info!("streams still open after the shutdown grace; closing their connections");
                        conns.abort_all();
                        // With its connections failing, the server returns
                        // at once; the bound is only a guard.
                        tokio::time::timeout(Duration::from_secs(1), &mut server)
                            .await
                            .unwrap_or(Ok(()))
                    }
                }
            }
        };
        conns.abort_all();
        accept.abort();
        // Wait for the task to be gone, so the port is closed when this
        // returns (a restarted collector can bind it again).
        let _ = accept.await;
        result.map_err(|source| Error::Serve { source })
    }
}

/// Binds `addr` and serves JSON lines to `out` until `shutdown` completes:
/// [`Collector::bind`] then [`Collector::serve`].
pub async fn serve<W>(
    addr: SocketAddr,
    tls: ServerTls,
    out: W,
    shutdown: impl Future<Output = ()>,
) -> Result<()>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    Collector::bind(addr, &tls)
        .await?
        .serve(out, shutdown)
        .await
}

/// The collector's output as the CLI names it: `-` is standard output,
/// anything else a file that is created or appended to (never truncated:
/// restarting a collector must not lose what it wrote before).
pub async fn open_output(path: &Path) -> Result<Box<dyn AsyncWrite + Unpin + Send>> {
    if path == Path::new("-") {
        return Ok(Box::new(tokio::io::stdout()));
    }
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .map_err(|source| Error::OpenOutput {
            path: path.to_owned(),
            source,
        })?;
    Ok(Box::new(file))
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    local_addr: SocketAddr,
    conns: Arc<Connections>,
    tx: mpsc::Sender<ServerConn>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, typically: wait instead of
                    // spinning on the same error.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, conns, tx) = (acceptor.clone(), conns.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let certificate = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| Arc::new(c.clone().into_owned()));
                    let conn = ServerConn {
                        io: Abortable::new(tls, conns.track()),
                        info: PeerInfo {
                            tcp: TcpConnectInfo {
                                local_addr: Some(local_addr),
                                remote_addr: Some(peer),
                            },
                            certificate,
                        },
                    };
                    let _ = tx.send(conn).await;
                }
                // A refused client certificate, a plaintext client, a port
                // scanner: worth a line, never a stop.
                Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Who is on the other end of a stream: its address and the client
/// certificate it authenticated with. A service finds it in the request's
/// extensions (`request.extensions().get::<PeerInfo>()`).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The connection's addresses.
    pub tcp: TcpConnectInfo,
    /// The client's end-entity certificate (DER).
    pub certificate: Option<Arc<CertificateDer<'static>>>,
}

impl PeerInfo {
    /// Whether the client certificate names `node`: one of its subject
    /// alternative names matches it as a DNS name.
    pub fn names_node(&self, node: &str) -> bool {
        let (Some(der), Ok(name)) = (&self.certificate, ServerName::try_from(node)) else {
            return false;
        };
        webpki::EndEntityCert::try_from(der.as_ref())
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }
}

/// An accepted, authenticated connection, in the shape tonic serves.
struct ServerConn {
    io: Abortable<tokio_rustls::server::TlsStream<TcpStream>>,
    info: PeerInfo,
}

impl Connected for ServerConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for ServerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.get_ref().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The first output error, which stops the collector.
#[derive(Default)]
struct OutputFailure {
    error: Mutex<Option<io::Error>>,
    notify: Notify,
}

impl OutputFailure {
    fn set(&self, e: io::Error) {
        let mut error = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if error.is_none() {
            *error = Some(e);
        }
        drop(error);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    async fn wait(&self) {
        loop {
            let mut notified = pin!(self.notify.notified());
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    fn take(&self) -> Option<io::Error> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// The reference service: one JSON line per finding.
struct JsonLines<W> {
    // One writer for every stream, so lines from concurrent daemons never
    // interleave.
    out: Arc<tokio::sync::Mutex<W>>,
    failure: Arc<OutputFailure>,
    bind_node_identity: bool,
}

#[tonic::async_trait]
impl<W> FindingCollector for JsonLines<W>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    async fn report(
        &self,
        request: Request<Streaming<proto::Finding>>,
    ) -> std::result::Result<Response<Ack>, Status> {
        let info = request.extensions().get::<PeerInfo>().cloned();
        let peer = info.as_ref().and_then(|i| i.tcp.remote_addr);
        let mut stream = request.into_inner();
        let mut received = 0u64;
        while let Some(message) = stream.message().await? {
            let finding = match ReceivedFinding::try_from(message) {
                Ok(finding) => finding,
                Err(e) => {
                    tracing::warn!(?peer, error = %e, "skipping a malformed finding");
                    continue;
                }
            };
            if self.bind_node_identity
                && !info.as_ref().is_some_and(|i| i.names_node(&finding.node))
            {
                tracing::warn!(?peer, node = %finding.node, "refusing a finding for a node its client certificate does not name");
                return Err(Status::permission_denied(format!(
                    "the client certificate does not name node {:?}: findings are bound to \
                     their sender's identity",
                    finding.node
                )));
            }
            let line = CollectedFinding::from(finding);
            let mut bytes = serde_json::to_vec(&line)
                .map_err(|e| Status::internal(format!("encoding a finding as JSON: {e}")))?;
            bytes.push(b'\n');
            let mut out = self.out.lock().await;
            let written = async {
                out.write_all(&bytes).await?;
                out.flush().await
            };
            if let Err(e) = written.await {
                // Returned by `serve` (Error::Output), whose caller says
                // it once: `kyverno-runtime collector` as an error line,
                // or not at all when stdout's reader went away.
                tracing::debug!(error = %e, "writing the collector output failed; stopping");
                self.failure.set(e);
                return Err(Status::unavailable("the collector cannot store findings"));
            }
            received += 1;
        }
        Ok(Response::new(Ack { received }))
    }
}
