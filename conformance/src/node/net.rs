//! The workloads' network: one network namespace the node half creates,
//! as a pod sandbox's, holding every address a scenario uses (on `lo`),
//! the listeners that tell delivered from dropped, and the scenario's DNS
//! resolver. Traffic never leaves it, on a VM or on the host: the cgroup
//! programs judge a socket by its cgroup, whatever network it is in, so
//! the pods' filters apply exactly as in the node's own network.
//!
//! The harness's own sockets (listeners, the resolver) are made by
//! threads of this process that joined the namespace; this process is in
//! no pod's cgroup, so nothing filters their replies.

use anyhow::{bail, Context as _};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{ErrorKind, Read as _};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sched::{setns, unshare, CloneFlags};

use crate::child::{CONNECT_TIMEOUT, RECV_TIMEOUT};

/// The workloads' network namespace.
#[derive(Debug)]
pub struct Sandbox {
    ns: Arc<File>,
    path: PathBuf,
    added: Mutex<BTreeSet<IpAddr>>,
}

impl Sandbox {
    /// Creates the namespace (a thread unshares, opens its namespace and
    /// exits; the open file keeps the namespace) and brings `lo` up.
    pub fn create() -> anyhow::Result<Sandbox> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let made = (|| -> anyhow::Result<File> {
                unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
                File::open("/proc/thread-self/ns/net").context("opening the new namespace")
            })();
            let _ = tx.send(made);
        });
        let ns = rx.recv().context("the namespace thread died")??;
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            ns.as_raw_fd()
        ));
        let sandbox = Sandbox {
            ns: Arc::new(ns),
            path,
            added: Mutex::new(BTreeSet::new()),
        };
        sandbox.ip(&["link", "set", "lo", "up"])?;
        Ok(sandbox)
    }

    /// A real pod's network namespace, that of its process `pid` (seen
    /// through the node's PIDs): addresses, listeners and the resolver go
    /// there, made by this process, which is in no selected pod.
    pub fn of_process(pid: u32) -> anyhow::Result<Sandbox> {
        let from = format!("/proc/{pid}/ns/net");
        let ns = File::open(&from).with_context(|| format!("opening {from}"))?;
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            ns.as_raw_fd()
        ));
        Ok(Sandbox {
            ns: Arc::new(ns),
            path,
            added: Mutex::new(BTreeSet::new()),
        })
    }

    /// The path a child opens to join the namespace.
    pub fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Runs `f` on a thread that joined the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> JoinHandle<anyhow::Result<T>> {
        let ns = self.ns.clone();
        std::thread::spawn(move || {
            setns(ns.as_ref(), CloneFlags::CLONE_NEWNET)
                .context("joining the workloads' network")?;
            f()
        })
    }

    fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let shown = args.join(" ");
        self.spawn(move || {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .context("running ip")?;
            if !out.status.success() {
                bail!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("ip {shown}: the thread panicked"))?
    }

    /// Puts `ip` on `lo` (once), unless `lo` already answers for it
    /// (127.0.0.0/8, ::1).
    pub fn add_address(&self, ip: IpAddr) -> anyhow::Result<()> {
        let local = match ip {
            IpAddr::V4(a) => a.is_loopback(),
            IpAddr::V6(a) => a.is_loopback(),
        };
        let mut added = self.added.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        if local || added.contains(&ip) {
            return Ok(());
        }
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        self.ip(&["addr", "add", &format!("{ip}/{prefix}"), "dev", "lo"])?;
        added.insert(ip);
        Ok(())
    }
}

/// What a listener saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived {
    /// TCP: a connection was accepted; UDP: a datagram arrived.
    pub accepted: bool,
    /// The bytes that arrived.
    pub bytes: usize,
}

/// A listener bound in the sandbox, waiting for one connection or datagram
/// until the workload process has finished.
pub struct Listener {
    done: Arc<AtomicBool>,
    handle: JoinHandle<anyhow::Result<Arrived>>,
}

/// Binds `addr`, retrying while a v6 address just added is still settling.
fn bind_retrying<T>(
    addr: SocketAddr,
    bind: impl Fn(SocketAddr) -> std::io::Result<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match bind(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline && e.kind() == ErrorKind::AddrNotAvailable => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => bail!("binding {addr}: {e}"),
        }
    }
}

impl Listener {
    /// Binds `addr` (TCP or UDP) and waits, in its own thread, for one
    /// connection and `expect` bytes on it (or one datagram), until
    /// [`Listener::finish`] says the sender is done.
    pub fn start(
        sandbox: &Sandbox,
        addr: SocketAddr,
        udp: bool,
        expect: usize,
    ) -> anyhow::Result<Listener> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        // Whatever happens, never longer than a slow guest's handshake.
        let limit = Instant::now() + CONNECT_TIMEOUT + RECV_TIMEOUT + Duration::from_secs(5);
        let handle = sandbox.spawn(move || {
            if udp {
                let sock = match bind_retrying(addr, UdpSocket::bind) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return Err(e);
                    }
                };
                let _ = ready_tx.send(Ok(()));
                sock.set_read_timeout(Some(Duration::from_millis(20)))?;
                let mut buf = [0u8; 2048];
                loop {
                    // Checked before the read, so a datagram sent just
                    // before the sender finished is still read once.
                    let last = finished.load(Ordering::SeqCst) || Instant::now() > limit;
                    if let Ok((n, _)) = sock.recv_from(&mut buf) {
                        return Ok(Arrived {
                            accepted: true,
                            bytes: n,
                        });
                    }
                    if last {
                        return Ok(Arrived {
                            accepted: false,
                            bytes: 0,
                        });
                    }
                }
            }
            let listener = match bind_retrying(addr, TcpListener::bind) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            listener.set_nonblocking(true)?;
            let mut conn = loop {
                let last = finished.load(Ordering::SeqCst) || Instant::now() > limit;
                match listener.accept() {
                    Ok((c, _)) => break c,
                    Err(e) if e.kind() == ErrorKind::WouldBlock && !last => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => {
                        return Ok(Arrived {
                            accepted: false,
                            bytes: 0,
                        })
                    }
                }
            };
            conn.set_nonblocking(false)?;
            conn.set_read_timeout(Some(RECV_TIMEOUT))?;
            let mut got = 0;
            let mut buf = [0u8; 4096];
            while got < expect {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(_) => break,
                }
            }
            Ok(Arrived {
                accepted: true,
                bytes: got,
            })
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Listener { done, handle }),
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => match handle.join() {
                Ok(Err(e)) => Err(e),
                _ => bail!("the listener for {addr} died"),
            },
        }
    }

    /// What arrived; called once the sender has finished.
    pub fn finish(self) -> anyhow::Result<Arrived> {
        self.done.store(true, Ordering::SeqCst);
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("the listener panicked"))?
    }
}

/// The scenario's resolver: answers from its table until dropped.
pub struct Resolver {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Resolver {
    /// Starts the resolver at `def.address`:53 in the sandbox.
    pub fn start(
        sandbox: &Sandbox,
        def: &conformance::scenario::ResolverDef,
    ) -> anyhow::Result<Resolver> {
        sandbox.add_address(def.address)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stopping, table, ttl, addr) = (
            stop.clone(),
            def.records.clone(),
            def.ttl,
            SocketAddr::new(def.address, 53),
        );
        let handle = sandbox.spawn(move || {
            let sock = match UdpSocket::bind(addr) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("binding the resolver at {addr}: {e}")));
                    bail!("binding the resolver at {addr}: {e}");
                }
            };
            let _ = ready_tx.send(Ok(()));
            sock.set_read_timeout(Some(Duration::from_millis(100)))?;
            let mut buf = [0u8; 1500];
            while !stopping.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Some((_, name, _, _)) = conformance::wire::read_query(&buf[..n]) else {
                    continue;
                };
                let addrs = table.get(&name).map(Vec::as_slice);
                if let Some(reply) = conformance::wire::answer(&buf[..n], addrs, ttl) {
                    let _ = sock.send_to(&reply, from);
                }
            }
            Ok(())
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Resolver {
                stop,
                handle: Some(handle),
            }),
            Ok(Err(e)) => bail!("{e}"),
            Err(_) => bail!("the resolver thread died"),
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
