//! `conformance child TASK`: one workload process. It opens the workloads'
//! network namespace, moves itself into a container's cgroup (from then on
//! everything it does is the pod's, as the kernel sees it), joins that
//! network, performs one action and prints a [`ChildReport`] as JSON.
//!
//! The namespace is opened *before* joining the cgroup: under an open
//! default deny the pod may not open `/proc/...`, and the harness must not
//! be what a policy refuses.

use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

/// How long a TCP handshake may take. A SYN the egress filter drops is
/// retransmitted after 1 s and dropped again, so this always ends in a
/// timeout for a dropped connect and never for an allowed one in the
/// workloads' own network.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a DNS answer or a listener's data may take.
pub const RECV_TIMEOUT: Duration = Duration::from_millis(1500);

/// What a child is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildTask {
    /// The container cgroup's `cgroup.procs`.
    pub procs: PathBuf,
    /// The workloads' network namespace (`/proc/PID/fd/N`).
    pub netns: PathBuf,
    /// On a real node: the container's mount namespace
    /// (`/proc/PID/ns/mnt`), so the program and the file are the
    /// container's own, as `kubectl exec` would find them.
    #[serde(default)]
    pub mntns: Option<PathBuf>,
    /// On a real node: the node's cgroup namespace (`/proc/1/ns/cgroup`),
    /// joined first: a process may only move to a cgroup inside its own
    /// namespace's root, and the suite's pod has one of its own.
    #[serde(default)]
    pub cgroupns: Option<PathBuf>,
    /// The action.
    pub op: Op,
}

/// The actions a child performs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// Run `path` as `true` with `args`.
    Exec {
        /// The program.
        path: PathBuf,
        /// Its arguments.
        args: Vec<String>,
    },
    /// Open `path` read-only.
    Open {
        /// The file.
        path: PathBuf,
    },
    /// Connect (TCP) or send (UDP) to `to`, writing `payload`.
    Send {
        /// The destination; `None` to take the first answer of `resolve`.
        to: Option<SocketAddr>,
        /// Resolve a name first (resolver, name, AAAA?, port).
        resolve: Option<(SocketAddr, String, bool, u16)>,
        /// UDP instead of TCP.
        udp: bool,
        /// The bytes sent.
        payload: Vec<u8>,
    },
    /// Ask `resolver` for `name`.
    Resolve {
        /// The resolver.
        resolver: SocketAddr,
        /// The name.
        name: String,
        /// AAAA instead of A.
        ipv6: bool,
    },
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// exec/open: it worked. TCP: connected (and wrote). UDP: sent.
    Done,
    /// The kernel answered with this errno.
    Errno(i32),
    /// TCP: the handshake did not complete in [`CONNECT_TIMEOUT`].
    TimedOut,
    /// resolve: an answer (its rcode and addresses).
    Answer(u8, Vec<IpAddr>),
    /// resolve: no answer in [`RECV_TIMEOUT`].
    NoAnswer,
    /// The harness itself failed (a bad task, no such cgroup).
    Broken(String),
}

/// The child's report on stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildReport {
    /// For `Send` with `resolve`: what the resolver answered.
    pub resolved: Option<Outcome>,
    /// The action's outcome.
    pub outcome: Outcome,
}

/// The child's entry point: always prints a report; exits 0 unless even
/// that failed.
pub fn main(task: &str) -> ExitCode {
    let report = match serde_json::from_str::<ChildTask>(task) {
        Ok(task) => run(&task),
        Err(e) => ChildReport {
            resolved: None,
            outcome: Outcome::Broken(format!("bad task: {e}")),
        },
    };
    match serde_json::to_string(&report) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::from(2),
    }
}

fn broken(what: &str, e: impl std::fmt::Display) -> ChildReport {
    ChildReport {
        resolved: None,
        outcome: Outcome::Broken(format!("{what}: {e}")),
    }
}

/// Opens a namespace file, when there is one to open.
fn open_ns(path: Option<&PathBuf>) -> Result<Option<std::fs::File>, ChildReport> {
    match path {
        None => Ok(None),
        Some(p) => std::fs::File::open(p)
            .map(Some)
            .map_err(|e| broken(&format!("opening {}", p.display()), e)),
    }
}

fn run(task: &ChildTask) -> ChildReport {
    use nix::sched::{setns, CloneFlags};
    // Every namespace is opened before the cgroup is joined (see above).
    let opened = (|| {
        Ok::<_, ChildReport>((
            open_ns(Some(&task.netns))?,
            open_ns(task.mntns.as_ref())?,
            open_ns(task.cgroupns.as_ref())?,
        ))
    })();
    let (netns, mntns, cgroupns) = match opened {
        Ok((Some(net), mnt, cgroup)) => (net, mnt, cgroup),
        Ok((None, _, _)) => return broken("opening the network namespace", "no path"),
        Err(report) => return report,
    };
    if let Some(ns) = cgroupns {
        if let Err(e) = setns(&ns, CloneFlags::CLONE_NEWCGROUP) {
            return broken("joining the node's cgroup namespace", e);
        }
    }
    if let Err(e) = std::fs::write(&task.procs, std::process::id().to_string()) {
        return broken(&format!("joining {}", task.procs.display()), e);
    }
    if let Err(e) = setns(&netns, CloneFlags::CLONE_NEWNET) {
        return broken("joining the workloads' network", e);
    }
    drop(netns);
    if let Some(ns) = mntns {
        if let Err(e) = setns(&ns, CloneFlags::CLONE_NEWNS) {
            return broken("joining the container's mounts", e);
        }
        if let Err(e) = std::env::set_current_dir("/") {
            return broken("entering the container's root", e);
        }
    }
    let done = |outcome| ChildReport {
        resolved: None,
        outcome,
    };
    match &task.op {
        Op::Exec { path, args } => {
            done(match Command::new(path).arg0("true").args(args).status() {
                Ok(s) if s.success() => Outcome::Done,
                Ok(s) => Outcome::Broken(format!("{} exited {s}", path.display())),
                Err(e) => errno_of(&e),
            })
        }
        Op::Open { path } => done(match std::fs::File::open(path) {
            Ok(_) => Outcome::Done,
            Err(e) => errno_of(&e),
        }),
        Op::Resolve {
            resolver,
            name,
            ipv6,
        } => done(resolve(*resolver, name, *ipv6)),
        Op::Send {
            to,
            resolve: by_name,
            udp,
            payload,
        } => {
            let (resolved, to) = match (to, by_name) {
                (Some(to), _) => (None, *to),
                (None, Some((resolver, name, ipv6, port))) => {
                    let answer = resolve(*resolver, name, *ipv6);
                    let first = match &answer {
                        Outcome::Answer(0, addrs) => addrs.first().copied(),
                        _ => None,
                    };
                    match first {
                        Some(ip) => (Some(answer), SocketAddr::new(ip, *port)),
                        None => {
                            return ChildReport {
                                resolved: Some(answer),
                                outcome: Outcome::Broken(format!("{name} did not resolve")),
                            }
                        }
                    }
                }
                (None, None) => return broken("send", "no destination"),
            };
            let outcome = if *udp {
                send_udp(to, payload)
            } else {
                send_tcp(to, payload)
            };
            ChildReport { resolved, outcome }
        }
    }
}

fn errno_of(e: &std::io::Error) -> Outcome {
    match e.raw_os_error() {
        Some(n) => Outcome::Errno(n),
        None => Outcome::Broken(e.to_string()),
    }
}

fn resolve(resolver: SocketAddr, name: &str, ipv6: bool) -> Outcome {
    let local: SocketAddr = if resolver.is_ipv6() {
        "[::]:0".parse().unwrap_or(resolver)
    } else {
        "0.0.0.0:0".parse().unwrap_or(resolver)
    };
    let sock = match UdpSocket::bind(local) {
        Ok(s) => s,
        Err(e) => return errno_of(&e),
    };
    if let Err(e) = sock.set_read_timeout(Some(RECV_TIMEOUT)) {
        return errno_of(&e);
    }
    let qtype = if ipv6 {
        conformance::wire::TYPE_AAAA
    } else {
        conformance::wire::TYPE_A
    };
    let id = u16::try_from(std::process::id() & 0xffff).unwrap_or(7);
    if let Err(e) = sock.send_to(&conformance::wire::query(id, name, qtype), resolver) {
        return errno_of(&e);
    }
    let mut buf = [0u8; 1500];
    match sock.recv_from(&mut buf) {
        Ok((n, _)) => match conformance::wire::read_answer(&buf[..n]) {
            Some((rcode, addrs)) => Outcome::Answer(rcode, addrs),
            None => Outcome::Broken("an unreadable answer".into()),
        },
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Outcome::NoAnswer
        }
        Err(e) => errno_of(&e),
    }
}

fn send_tcp(to: SocketAddr, payload: &[u8]) -> Outcome {
    match TcpStream::connect_timeout(&to, CONNECT_TIMEOUT) {
        Ok(mut s) => {
            if !payload.is_empty() {
                if let Err(e) = s.write_all(payload) {
                    return errno_of(&e);
                }
            }
            // Keep the connection until the listener has read what
            // arrived and closed its side (or gave up).
            let _ = s.set_read_timeout(Some(RECV_TIMEOUT * 3));
            let mut sink = [0u8; 64];
            let _ = s.read(&mut sink);
            Outcome::Done
        }
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            Outcome::TimedOut
        }
        Err(e) => errno_of(&e),
    }
}

fn send_udp(to: SocketAddr, payload: &[u8]) -> Outcome {
    let local: SocketAddr = if to.is_ipv6() {
        "[::]:0".parse().unwrap_or(to)
    } else {
        "0.0.0.0:0".parse().unwrap_or(to)
    };
    let sock = match UdpSocket::bind(local) {
        Ok(s) => s,
        Err(e) => return errno_of(&e),
    };
    match sock.send_to(payload, to) {
        Ok(_) => Outcome::Done,
        Err(e) => errno_of(&e),
    }
}
