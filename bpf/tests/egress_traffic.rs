//! Real traffic through the attached cgroup_skb programs (needs root).
//!
//! Run with `cargo test -p kyverno-runtime-bpf --features host-tests --test
//! egress_traffic -- --test-threads=1`. Each test creates a cgroup under the
//! cgroup2 mount found in /proc/self/mountinfo, attaches a program to it,
//! and starts a child *of this very binary* (so the test needs no shell and
//! runs in a busybox-only vmtest guest): the child writes its pid into the
//! cgroup's `cgroup.procs`, then connects or sends over loopback to a
//! listener this process started. Nothing leaves loopback.
//!
//! A dropped TCP SYN shows as a connect timeout, so the child's connect
//! timeout is short ([`CONNECT_TIMEOUT`]) and every assertion is on an
//! outcome (connected / timed out / delivered / not delivered), never on a
//! duration. The listeners live in this process's cgroup, which no program
//! filters, so replies (SYN-ACKs) always leave.

// The helpers are test code too: a panic there is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/cgroup.rs"]
mod cgroup;
#[path = "common/dnsmsg.rs"]
mod dnsmsg;
#[path = "common/tlsmsg.rs"]
mod tlsmsg;

use std::fs;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cgroup::TempCgroup;
use kyverno_runtime_bpf::cgroup_attach::{CgroupAttachments, CgroupLink};
use kyverno_runtime_bpf::dns::{DnsObserver, DnsQuestion};
use kyverno_runtime_bpf::egress::{
    Domain, DomainVerdicts, EgressFilter, FilterFlags, Prefix, Stats, Verdict, DNS_TTL_MIN,
};
use kyverno_runtime_bpf::protocol::{
    ProtoFlags, ProtoKey, Protocol, ProtocolClassifier, Verdict as ProtoVerdict,
};

/// How long a child waits for a TCP handshake. A SYN the filter drops is
/// retransmitted after 1 s and dropped again, so 1.5 s always ends in a
/// timeout for a dropped connect and never for an allowed one on loopback.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long the parent waits for data that a dropped flow never delivers.
const RECV_TIMEOUT: Duration = Duration::from_millis(1500);

/// The environment variable that turns this binary into a traffic child.
const CHILD_ENV: &str = "KRT_EGRESS_TRAFFIC_CHILD";

// ---- cgroups ------------------------------------------------------------------

// ---- the child ------------------------------------------------------------------

/// What the child reports through its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// TCP: connected (and wrote the payload); UDP: the send succeeded.
    Done,
    /// TCP: the handshake did not complete in [`CONNECT_TIMEOUT`].
    TimedOut,
    /// The kernel refused the send or connect with an error (UDP: EPERM
    /// from the egress hook's drop).
    Refused,
    /// `resolve`: no answer with an A record arrived.
    NoAnswer,
}

const EXIT_DONE: i32 = 0;
const EXIT_TIMED_OUT: i32 = 10;
const EXIT_REFUSED: i32 = 11;
/// `resolve`: no answer (or no A record in it) arrived.
const EXIT_NO_ANSWER: i32 = 12;

/// The child's TCP connect: an [`Outcome`] exit code.
fn connect_code(addr: SocketAddr, payload: &[u8]) -> i32 {
    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(mut s) => {
            if !payload.is_empty() {
                s.write_all(payload).unwrap();
            }
            // Keep the connection until the parent has looked at what
            // arrived and closed its side (or gave up).
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut sink = [0u8; 64];
            let _ = s.read(&mut sink);
            EXIT_DONE
        }
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => EXIT_TIMED_OUT,
        Err(e) => {
            eprintln!("child: connect {addr}: {e}");
            EXIT_REFUSED
        }
    }
}

/// The child's `resolve`: asks the resolver at `resolver` for `name`'s A
/// record, as a stub resolver does (one UDP datagram, one answer), then
/// connects to the answered address on `port`.
fn resolve_then_connect(resolver: SocketAddr, name: &str, port: u16) -> i32 {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    s.send_to(&dnsmsg::query(0x6b72, name, dnsmsg::TYPE_A), resolver)
        .unwrap();
    let mut buf = [0u8; 512];
    let Ok((n, _)) = s.recv_from(&mut buf) else {
        return EXIT_NO_ANSWER;
    };
    let Some(addr) = dnsmsg::first_a(&buf[..n]) else {
        return EXIT_NO_ANSWER;
    };
    connect_code(SocketAddr::from((addr, port)), b"")
}

/// Keeps this thread on one of the CPUs it may run on: the filter caches
/// a socket's verdict per CPU, and a session's tests follow what a socket
/// cached, which on several CPUs would depend on where each send ran.
fn pin_to_one_cpu() {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let cpu = (0..CpuSet::count())
        .find(|&c| allowed.is_set(c).unwrap_or(false))
        .unwrap();
    let mut one = CpuSet::new();
    one.set(cpu).unwrap();
    sched_setaffinity(Pid::from_raw(0), &one).unwrap();
}

/// The child's `udp-session`: one UDP socket connected to `addr` for the
/// whole session (so its packets after the first can take its cached
/// verdict), driven by lines on stdin: `send` sends one datagram and
/// answers `sent` or `refused` (the egress hook's drop is EPERM to a
/// connected UDP socket); `resolve <name> <resolver>` asks a resolver, from
/// another socket, for `name` and answers `answered` or `no-answer`. Ends
/// at EOF.
fn udp_session(addr: SocketAddr) -> i32 {
    use std::io::BufRead as _;
    pin_to_one_cpu();
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.connect(addr).unwrap();
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let reply = match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["send"] => match s.send(b"krt-session") {
                Ok(_) => "sent",
                Err(e) if e.kind() == ErrorKind::PermissionDenied => "refused",
                Err(e) => panic!("child: send to {addr}: {e}"),
            },
            ["resolve", name, resolver] => {
                let q = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
                q.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
                q.send_to(
                    &dnsmsg::query(0x6b73, name, dnsmsg::TYPE_A),
                    resolver.parse::<SocketAddr>().unwrap(),
                )
                .unwrap();
                let mut buf = [0u8; 512];
                match q.recv_from(&mut buf) {
                    Ok((n, _)) if dnsmsg::first_a(&buf[..n]).is_some() => "answered",
                    _ => "no-answer",
                }
            }
            _ => panic!("child: unknown session command {line:?}"),
        };
        writeln!(out, "{reply}").unwrap();
        out.flush().unwrap();
    }
    EXIT_DONE
}

/// The child's side: not a test unless [`CHILD_ENV`] is set, when it joins
/// the cgroup, does its one operation and exits with an [`Outcome`] code.
#[test]
fn traffic_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('\t');
    let (dir, op, addr, payload) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap_or(""),
    );
    let payload = unhex(payload);
    fs::write(
        Path::new(dir).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    let addr: SocketAddr = addr.parse().unwrap();
    let code = match op {
        "tcp" => connect_code(addr, &payload),
        "resolve" => {
            // The payload is "<name> <port>".
            let text = String::from_utf8(payload).unwrap();
            let (name, port) = text.split_once(' ').unwrap();
            resolve_then_connect(addr, name, port.parse().unwrap())
        }
        "udp-session" => udp_session(addr),
        "udp" => {
            let local: SocketAddr = if addr.is_ipv4() {
                (Ipv4Addr::LOCALHOST, 0).into()
            } else {
                (Ipv6Addr::LOCALHOST, 0).into()
            };
            let s = UdpSocket::bind(local).unwrap();
            match s.send_to(&payload, addr) {
                Ok(_) => EXIT_DONE,
                Err(e) => {
                    eprintln!("child: send to {addr}: {e}");
                    EXIT_REFUSED
                }
            }
        }
        other => panic!("unknown child op {other}"),
    };
    std::process::exit(code);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Starts a child in `cg` doing `op` to `addr` with `payload`.
fn spawn_child(cg: &TempCgroup, op: &str, addr: SocketAddr, payload: &[u8]) -> std::process::Child {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args([
            "--exact",
            "traffic_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}\t{op}\t{addr}\t{}", cg.0.display(), hex(payload)),
        )
        .spawn()
        .unwrap()
}

fn outcome_of(child: std::process::Child) -> Outcome {
    let status = child.wait_with_output().unwrap().status;
    match status.code() {
        Some(EXIT_DONE) => Outcome::Done,
        Some(EXIT_TIMED_OUT) => Outcome::TimedOut,
        Some(EXIT_REFUSED) => Outcome::Refused,
        Some(EXIT_NO_ANSWER) => Outcome::NoAnswer,
        _ => panic!("traffic child failed: {status}"),
    }
}

// ---- probes -------------------------------------------------------------------------

/// A TCP connect from `cg` to a listener on `ip`: whether it connected.
fn tcp_connects(cg: &TempCgroup, ip: IpAddr) -> bool {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let child = spawn_child(cg, "tcp", addr, b"");
    // Accept (non-blocking, bounded) so a connected child is released.
    listener.set_nonblocking(true).unwrap();
    let mut accepted = None;
    let deadline = Instant::now() + CONNECT_TIMEOUT + Duration::from_secs(1);
    while accepted.is_none() && Instant::now() < deadline {
        match listener.accept() {
            Ok((s, _)) => accepted = Some(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    drop(accepted); // the child's read sees EOF and exits
    match outcome_of(child) {
        Outcome::Done => true,
        Outcome::TimedOut | Outcome::Refused => false,
        Outcome::NoAnswer => panic!("a tcp child does not resolve"),
    }
}

/// A UDP datagram from `cg` to a socket on `ip`: whether it arrived.
fn udp_delivers(cg: &TempCgroup, ip: IpAddr) -> bool {
    let sock = UdpSocket::bind((ip, 0)).unwrap();
    sock.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    let addr = sock.local_addr().unwrap();
    let child = spawn_child(cg, "udp", addr, b"krt-ping");
    let outcome = outcome_of(child);
    let mut buf = [0u8; 64];
    let got = match sock.recv_from(&mut buf) {
        Ok((n, _)) => &buf[..n] == b"krt-ping",
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(e) => panic!("recv: {e}"),
    };
    // A delivered datagram was sent; a dropped one may or may not have
    // made send fail (the hook's drop is EPERM to UDP on these kernels).
    if got {
        assert_eq!(outcome, Outcome::Done);
    }
    got
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A child in a cgroup holding one connected UDP socket (`udp-session`),
/// and the socket on this side that its datagrams are sent to.
struct UdpSession {
    child: std::process::Child,
    /// `None` once closed (EOF ends the child).
    commands: Option<std::process::ChildStdin>,
    replies: std::io::BufReader<std::process::ChildStdout>,
    receiver: UdpSocket,
}

impl UdpSession {
    fn start(cg: &TempCgroup, ip: Ipv4Addr) -> Self {
        use std::process::Stdio;
        let receiver = UdpSocket::bind((ip, 0)).unwrap();
        receiver.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "traffic_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!(
                    "{}\tudp-session\t{}\t",
                    cg.0.display(),
                    receiver.local_addr().unwrap()
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let commands = child.stdin.take();
        let replies = std::io::BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            commands,
            replies,
            receiver,
        }
    }

    /// Sends `command` and returns the child's reply line, skipping the
    /// test harness's own lines (the child runs with `--nocapture`, so
    /// that its replies reach the pipe instead of the harness's capture).
    fn ask(&mut self, command: &str) -> String {
        use std::io::BufRead as _;
        let commands = self.commands.as_mut().unwrap();
        writeln!(commands, "{command}").unwrap();
        commands.flush().unwrap();
        loop {
            let mut line = String::new();
            assert_ne!(
                self.replies.read_line(&mut line).unwrap(),
                0,
                "the session child ended"
            );
            // The harness's "test traffic_child ... " has no newline, so
            // the first reply ends its line.
            let last = line.split_whitespace().last().unwrap_or_default();
            if ["sent", "refused", "answered", "no-answer"].contains(&last) {
                return last.to_owned();
            }
        }
    }

    /// One datagram over the session's socket: whether it arrived.
    fn delivers(&mut self) -> bool {
        let reply = self.ask("send");
        let mut buf = [0u8; 64];
        let got = match self.receiver.recv_from(&mut buf) {
            Ok((n, _)) => &buf[..n] == b"krt-session",
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
            Err(e) => panic!("recv: {e}"),
        };
        if got {
            assert_eq!(reply, "sent");
        }
        got
    }
}

impl Drop for UdpSession {
    fn drop(&mut self) {
        drop(self.commands.take());
        let _ = self.child.wait();
    }
}

// ---- the egress filter ----------------------------------------------------------------

/// A filter attached to a fresh cgroup with one set.
struct Egress {
    filter: EgressFilter,
    cg: TempCgroup,
    link: Option<CgroupLink>,
}

const SET: u32 = 7;

impl Egress {
    /// Programs the set's entries, then its flags, then attaches (the
    /// spec's order).
    fn new(tag: &str, allow: &[&str], deny: &[&str], flags: FilterFlags) -> Self {
        let filter = EgressFilter::load().unwrap();
        for p in allow {
            filter
                .insert(SET, Verdict::Allow, p.parse::<Prefix>().unwrap())
                .unwrap();
        }
        for p in deny {
            filter
                .insert(SET, Verdict::Deny, p.parse::<Prefix>().unwrap())
                .unwrap();
        }
        let cg = TempCgroup::new(&format!("traffic-{tag}"));
        let link = filter.attach_cgroup(&cg.0, SET, flags).unwrap();
        assert_eq!(link.cgroup_id(), cg.id());
        assert_eq!(link.program(), "krt_egress");
        Self {
            filter,
            cg,
            link: Some(link),
        }
    }

    fn stats(&self) -> Stats {
        self.filter.read_stats().unwrap()
    }

    /// Asserts TCP and UDP to `addr` both pass or both drop, and that each
    /// drop was counted.
    fn expect(&self, addr: &str, passes: bool) {
        let before = self.stats();
        let tcp = tcp_connects(&self.cg, ip(addr));
        let udp = udp_delivers(&self.cg, ip(addr));
        let after = self.stats();
        assert_eq!(
            (tcp, udp),
            (passes, passes),
            "{addr}: expected {} (tcp, udp); stats {after:?}",
            if passes { "pass" } else { "drop" }
        );
        if passes {
            assert!(after.passed() > before.passed(), "{addr}: {after:?}");
        } else {
            // At least the SYN and the datagram (SYN retransmits add more).
            assert!(
                after.dropped() >= before.dropped() + 2,
                "{addr}: drops not counted: {before:?} -> {after:?}"
            );
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            // Revoke, then detach.
            assert!(self.filter.detach_cgroup(link).unwrap());
        }
    }
}

#[test]
fn a_v4_host_entry_drops_that_address_only() {
    let e = Egress::new("v4-32", &[], &["127.0.0.2/32"], FilterFlags::default());
    e.expect("127.0.0.2", false);
    e.expect("127.0.0.3", true);
    e.expect("::1", true);
    assert!(e.stats().denied >= 2);
}

#[test]
fn a_v4_slash_8_drops_all_of_loopback_but_not_v6() {
    let e = Egress::new("v4-8", &[], &["127.0.0.0/8"], FilterFlags::default());
    e.expect("127.0.0.1", false);
    e.expect("127.9.8.7", false);
    e.expect("::1", true);
}

#[test]
fn a_v6_host_entry_drops_that_address_only() {
    let e = Egress::new("v6-128", &[], &["::1/128"], FilterFlags::default());
    e.expect("::1", false);
    e.expect("127.0.0.1", true);
}

#[test]
fn a_v6_slash_64_drops_what_it_contains() {
    let e = Egress::new("v6-64", &[], &["::/64"], FilterFlags::default());
    e.expect("::1", false);
    e.expect("127.0.0.1", true);
    // A /64 that does not contain ::1 decides nothing for it.
    let other = Egress::new(
        "v6-64-other",
        &[],
        &["2001:db8::/64"],
        FilterFlags::default(),
    );
    other.expect("::1", true);
}

#[test]
fn default_deny_passes_only_the_allow_list() {
    let flags = FilterFlags {
        default_deny: true,
        observe: false,
        domains: false,
    };
    let e = Egress::new("dd", &["127.0.0.2/32", "::1/128"], &[], flags);
    e.expect("127.0.0.2", true);
    e.expect("::1", true);
    e.expect("127.0.0.3", false);
    e.expect("127.0.0.1", false);
    let s = e.stats();
    assert!(s.allowed >= 2 && s.default_denied >= 2, "{s:?}");
}

#[test]
fn an_explicit_deny_beats_a_wider_allow() {
    let flags = FilterFlags {
        default_deny: true,
        observe: false,
        domains: false,
    };
    let e = Egress::new("deny-beats", &["127.0.0.0/8"], &["127.0.0.5/32"], flags);
    e.expect("127.0.0.4", true);
    e.expect("127.0.0.5", false);
}

#[test]
fn observation_counts_real_destinations() {
    let flags = FilterFlags {
        default_deny: false,
        observe: true,
        domains: false,
    };
    let e = Egress::new("observe", &[], &["127.0.0.6/32"], flags);
    e.expect("127.0.0.6", false);
    e.expect("127.0.0.7", true);
    let obs = e.filter.drain_observations().unwrap();
    let denied: u64 = obs
        .iter()
        .filter(|o| o.destination == ip("127.0.0.6") && o.decision.dropped())
        .map(|o| o.count)
        .sum();
    let passed: u64 = obs
        .iter()
        .filter(|o| o.destination == ip("127.0.0.7") && !o.decision.dropped())
        .map(|o| o.count)
        .sum();
    assert!(denied >= 2 && passed >= 2, "{obs:?}");
    assert!(obs.iter().all(|o| o.set_id == SET));
}

#[test]
fn a_detached_cgroup_is_no_longer_filtered() {
    let mut e = Egress::new("detach", &[], &["127.0.0.8/32"], FilterFlags::default());
    e.expect("127.0.0.8", false);
    let link = e.link.take().unwrap();
    assert!(e.filter.detach_cgroup(link).unwrap());
    assert!(tcp_connects(&e.cg, ip("127.0.0.8")));
}

#[test]
fn attachments_are_keyed_by_path_and_coexist() {
    // The egress filter and the classifier on one cgroup, as the agent
    // attaches them: both run, and either can drop.
    let filter = EgressFilter::load().unwrap();
    let classifier = ProtocolClassifier::load().unwrap();
    let cg = TempCgroup::new("traffic-multi");
    filter
        .insert(SET, Verdict::Deny, "127.0.0.9/32".parse().unwrap())
        .unwrap();
    let mut egress_links = CgroupAttachments::new();
    let mut proto_links = CgroupAttachments::new();
    assert!(egress_links
        .attach_with(&cg.0, |d| filter.attach_cgroup(
            d,
            SET,
            FilterFlags::default()
        ))
        .unwrap());
    // A second attach of the same path is a no-op, not a second link.
    assert!(!egress_links
        .attach_with(&cg.0, |d| filter.attach_cgroup(
            d,
            SET,
            FilterFlags::default()
        ))
        .unwrap());
    assert!(proto_links
        .attach_with(&cg.0, |d| classifier.attach_cgroup(
            d,
            1,
            ProtoFlags::default()
        ))
        .unwrap());
    assert!(!tcp_connects(&cg, ip("127.0.0.9")));
    assert!(tcp_connects(&cg, ip("127.0.0.10")));
    assert!(classifier.read_stats().unwrap().packets > 0);
    let link = egress_links.take(&cg.0).unwrap();
    assert!(filter.detach_cgroup(link).unwrap());
    assert!(tcp_connects(&cg, ip("127.0.0.9")));
    let link = proto_links.take(&cg.0).unwrap();
    assert!(classifier.detach_cgroup(link).unwrap());
}

// ---- the protocol classifier ----------------------------------------------------------

/// A child in `cg` connects to `listener` and writes `payload`; returns the
/// bytes the listener received (empty if the first segment was dropped).
fn stream_received(cg: &TempCgroup, listener: &TcpListener, payload: &[u8]) -> Vec<u8> {
    let child = spawn_child(cg, "tcp", listener.local_addr().unwrap(), payload);
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < payload.len() {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    drop(conn);
    // The handshake has no payload: it passed whatever the verdict.
    assert_eq!(outcome_of(child), Outcome::Done);
    got
}

#[test]
fn an_ssh_stream_is_dropped_and_tls_to_the_same_port_passes() {
    let classifier = ProtocolClassifier::load().unwrap();
    classifier
        .insert(1, ProtoVerdict::Deny, ProtoKey::any(Protocol::Ssh))
        .unwrap();
    let cg = TempCgroup::new("traffic-proto");
    let link = classifier
        .attach_cgroup(&cg.0, 1, ProtoFlags::default())
        .unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();

    let ssh = b"SSH-2.0-OpenSSH_9.6 krt-test\r\n";
    assert_eq!(stream_received(&cg, &listener, ssh), b"");
    let hello = tlsmsg::client_hello(&[b"h2"]);
    assert_eq!(stream_received(&cg, &listener, &hello), hello);

    let s = classifier.read_stats().unwrap();
    assert_eq!(s.ssh, 1, "{s:?}");
    assert_eq!(s.tls, 1, "{s:?}");
    // The first segment and at least one retransmit of the ssh flow.
    assert!(s.drops >= 1, "{s:?}");

    // The same over IPv6.
    let listener6 = TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
    assert_eq!(stream_received(&cg, &listener6, ssh), b"");
    assert_eq!(stream_received(&cg, &listener6, &hello), hello);
    assert!(classifier.detach_cgroup(link).unwrap());
}

// ---- the DNS observer -------------------------------------------------------------------

fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

#[test]
fn questions_to_a_loopback_resolver_are_decoded() {
    let observer = DnsObserver::load().unwrap();
    let mut reader = observer.reader().unwrap();
    let cg = TempCgroup::new("traffic-dns");
    let link = observer.attach_admitted(&cg.0).unwrap();
    assert_eq!(link.cgroup_id(), cg.id());

    // The resolver: this test's own socket on 127.0.0.1:53.
    let resolver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 53)).unwrap();
    resolver.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    let resolver_addr = resolver.local_addr().unwrap();
    for name in ["Real.Example.ORG", "second.example"] {
        let child = spawn_child(&cg, "udp", resolver_addr, &dns_query(name));
        assert_eq!(outcome_of(child), Outcome::Done);
        let mut buf = [0u8; 512];
        let (n, _) = resolver.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], dns_query(name), "observing never drops");
    }

    let deadline = Instant::now() + Duration::from_secs(3);
    let mut got: Vec<DnsQuestion> = Vec::new();
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(reader.poll_questions(Duration::from_millis(100)).unwrap());
    }
    let q = |name: &str| DnsQuestion {
        cgroup_id: cg.id(),
        qname: name.into(),
    };
    assert_eq!(got, [q("real.example.org"), q("second.example")]);
    let stats = observer.read_stats().unwrap();
    assert_eq!((stats.ringbuf_full, stats.name_unreadable), (0, 0));
    assert_eq!(reader.undecodable(), 0);

    // Revoked, then detached: a further question is not observed.
    assert!(observer.revoke_and_detach(link).unwrap());
    let child = spawn_child(&cg, "udp", resolver_addr, &dns_query("after.example"));
    assert_eq!(outcome_of(child), Outcome::Done);
    let mut buf = [0u8; 512];
    resolver.recv_from(&mut buf).unwrap();
    assert_eq!(
        reader.poll_questions(Duration::from_millis(200)).unwrap(),
        []
    );
}

// ---- the DNS answer snooper ---------------------------------------------------------

/// A resolver on `<addr>:53`, in this process (whose cgroup nothing
/// filters): answers an A question for a name of its table with that
/// address and TTL, anything else with NXDOMAIN. Stopped on drop.
struct Resolver {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Resolver {
    fn start(ip: Ipv4Addr, table: &[(&str, Ipv4Addr, u32)]) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let sock = UdpSocket::bind((ip, 53)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let table: Vec<(String, Ipv4Addr, u32)> = table
            .iter()
            .map(|(n, a, t)| ((*n).to_owned(), *a, *t))
            .collect();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopping.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Some(name) = dnsmsg::question_name(&buf[..n]) else {
                    continue;
                };
                let id = u16::from_be_bytes([buf[0], buf[1]]);
                let mut r = match table.iter().find(|(t, _, _)| *t == name) {
                    Some((_, a, ttl)) => {
                        let mut r = dnsmsg::Response::new(&name, dnsmsg::TYPE_A);
                        r.a(&dnsmsg::ptr(dnsmsg::QNAME_AT), *ttl, *a);
                        r
                    }
                    None => dnsmsg::Response::new(&name, dnsmsg::TYPE_A).rcode(3),
                };
                r.bytes[..2].copy_from_slice(&id.to_be_bytes());
                let _ = sock.send_to(&r.bytes, from);
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child in `cg` resolves `name` through `resolver`, then connects to
/// the answered address (where a listener on `answer` waits): whether it
/// connected.
fn resolves_and_connects(cg: &TempCgroup, resolver: &Resolver, name: &str, answer: IpAddr) -> bool {
    let listener = TcpListener::bind((answer, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let child = spawn_child(
        cg,
        "resolve",
        resolver.addr,
        format!("{name} {port}").as_bytes(),
    );
    listener.set_nonblocking(true).unwrap();
    let mut accepted = None;
    let deadline = Instant::now() + RECV_TIMEOUT + CONNECT_TIMEOUT + Duration::from_secs(1);
    while accepted.is_none() && Instant::now() < deadline {
        match listener.accept() {
            Ok((s, _)) => accepted = Some(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    drop(accepted);
    match outcome_of(child) {
        Outcome::Done => true,
        Outcome::TimedOut | Outcome::Refused => false,
        Outcome::NoAnswer => panic!("{name}: no answer reached the child"),
    }
}

/// A filter with its snooper attached to a fresh cgroup, in the order the
/// agent attaches them: the snooper, then the set and flags, then the
/// filter, with [`DECLARED_RESOLVERS`] declared. Detached in the reverse
/// order on drop.
struct Snooped {
    filter: EgressFilter,
    cg: TempCgroup,
    links: Option<(CgroupLink, CgroupLink)>,
}

/// The resolvers the snooping tests declare (their answers may teach);
/// 127.0.3.53 is the undeclared one.
const DECLARED_RESOLVERS: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, 53)),
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, 53)),
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, 54)),
];

impl Snooped {
    fn new(
        tag: &str,
        allow: &[&str],
        domains: &[(&str, DomainVerdicts)],
        flags: FilterFlags,
    ) -> Self {
        let filter = EgressFilter::load().unwrap();
        if let Some(e) = filter.snoop_error() {
            panic!("the snooper did not load: {e}");
        }
        for p in allow {
            filter
                .insert(SET, Verdict::Allow, p.parse::<Prefix>().unwrap())
                .unwrap();
        }
        for (i, (name, verdicts)) in domains.iter().enumerate() {
            filter
                .set_domain(
                    SET,
                    &Domain::new(name).unwrap(),
                    *verdicts,
                    u32::try_from(i + 1).unwrap(),
                )
                .unwrap();
        }
        filter.set_dns_resolvers(&DECLARED_RESOLVERS).unwrap();
        let cg = TempCgroup::new(&format!("traffic-{tag}"));
        let snoop = filter.attach_snoop(&cg.0).unwrap();
        assert_eq!(snoop.program(), "krt_dns_snoop");
        let egress = filter.attach_cgroup(&cg.0, SET, flags).unwrap();
        Self {
            filter,
            cg,
            links: Some((egress, snoop)),
        }
    }
}

impl Drop for Snooped {
    fn drop(&mut self) {
        if let Some((egress, snoop)) = self.links.take() {
            assert!(self.filter.detach_cgroup(egress).unwrap());
            self.filter.release_snoop(snoop).unwrap();
        }
    }
}

/// A default deny whose allow list names domains.
const DOMAINS_DEFAULT_DENY: FilterFlags = FilterFlags {
    default_deny: true,
    observe: false,
    domains: true,
};

/// Waits until no address `filter` learned has time left (an answer with
/// a TTL of 1 s answered at `answered` counts for the [`DNS_TTL_MIN`]
/// minimum), failing after 5 s more; returns how long after `answered`.
fn wait_for_learned_expiry(filter: &EgressFilter, answered: Instant) -> Duration {
    let deadline = answered + DNS_TTL_MIN + Duration::from_secs(5);
    while filter
        .learned()
        .unwrap()
        .iter()
        .any(|l| l.remaining.is_some())
    {
        assert!(
            Instant::now() < deadline,
            "the learned address never expired"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    answered.elapsed()
}

#[test]
fn an_answered_address_opens_a_default_deny_until_its_ttl_ends() {
    let allowed = Ipv4Addr::new(127, 0, 0, 20);
    let other = Ipv4Addr::new(127, 0, 0, 21);
    let resolver = Resolver::start(
        Ipv4Addr::new(127, 0, 1, 53),
        &[("allowed.test", allowed, 1), ("other.test", other, 300)],
    );
    let allow = DomainVerdicts {
        allow: true,
        deny: false,
        observe: false,
    };
    // The resolver itself is an address the policy allows.
    let s = Snooped::new(
        "snoop-dd",
        &["127.0.1.53/32"],
        &[("allowed.test", allow)],
        DOMAINS_DEFAULT_DENY,
    );

    assert!(
        !tcp_connects(&s.cg, IpAddr::V4(allowed)),
        "before any answer the default deny holds"
    );
    let resolved = Instant::now();
    assert!(
        resolves_and_connects(&s.cg, &resolver, "allowed.test", IpAddr::V4(allowed)),
        "the answer for allowed.test opens its address, before the first connect"
    );
    assert!(
        !resolves_and_connects(&s.cg, &resolver, "other.test", IpAddr::V4(other)),
        "an address answered for a name no policy allows stays dropped"
    );
    let snoop = s.filter.read_snoop_stats().unwrap();
    assert_eq!(
        (
            snoop.responses,
            snoop.learned,
            snoop.unnamed,
            snoop.unreadable()
        ),
        (2, 1, 1, 0),
        "{snoop:?}"
    );
    let learned = s.filter.learned().unwrap();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(learned[0].addr, IpAddr::V4(allowed));

    // The answer's TTL of 1 s counts for the 5 s minimum; then the
    // address is dropped again.
    let expired_after = wait_for_learned_expiry(&s.filter, resolved);
    assert!(
        !tcp_connects(&s.cg, IpAddr::V4(allowed)),
        "after the TTL the default deny holds again"
    );
    let stats = s.filter.read_stats().unwrap();
    assert!(
        stats.learned_hits >= 1 && stats.learned_expired >= 1,
        "{stats:?}"
    );
    println!(
        "allowed.test learned and connected; other.test dropped; expired {expired_after:?} after the answer (TTL 1 s, minimum {DNS_TTL_MIN:?}); snooper {snoop:?}"
    );
}

#[test]
fn an_undeclared_resolvers_answer_opens_nothing() {
    // Issue 37, finding 1, over real sockets: a resolver on an address the
    // node does not declare (what a pod answering itself is) answers
    // allowed.test with an address the default deny then still drops.
    let target = Ipv4Addr::new(127, 0, 0, 23);
    let rogue = Resolver::start(
        Ipv4Addr::new(127, 0, 3, 53),
        &[("allowed.test", target, 300)],
    );
    let allow = DomainVerdicts {
        allow: true,
        deny: false,
        observe: false,
    };
    let s = Snooped::new(
        "snoop-rogue",
        &["127.0.3.53/32"],
        &[("allowed.test", allow)],
        DOMAINS_DEFAULT_DENY,
    );
    assert!(
        !resolves_and_connects(&s.cg, &rogue, "allowed.test", IpAddr::V4(target)),
        "an undeclared resolver's answer opens nothing"
    );
    let snoop = s.filter.read_snoop_stats().unwrap();
    assert_eq!(
        (
            snoop.responses,
            snoop.learned,
            snoop.untrusted_source,
            snoop.questions_undeclared
        ),
        (1, 0, 1, 1),
        "{snoop:?}"
    );
    assert_eq!(s.filter.learned().unwrap(), []);
    println!("the rogue resolver's answer was refused: {snoop:?}");
}

#[test]
fn a_deny_by_domain_drops_the_answered_address() {
    let denied = Ipv4Addr::new(127, 0, 0, 22);
    let resolver = Resolver::start(
        Ipv4Addr::new(127, 0, 2, 53),
        &[("denied.test", denied, 300)],
    );
    let deny = DomainVerdicts {
        allow: false,
        deny: true,
        observe: false,
    };
    let flags = FilterFlags {
        default_deny: false,
        observe: false,
        domains: true,
    };
    let s = Snooped::new("snoop-deny", &[], &[("denied.test", deny)], flags);
    assert!(
        tcp_connects(&s.cg, IpAddr::V4(denied)),
        "nothing denies the address before it is answered for denied.test"
    );
    assert!(
        !resolves_and_connects(&s.cg, &resolver, "denied.test", IpAddr::V4(denied)),
        "the answer for denied.test denies its address"
    );
    assert!(
        !tcp_connects(&s.cg, IpAddr::V4(denied)),
        "and it stays denied"
    );
    let stats = s.filter.read_stats().unwrap();
    assert!(stats.denied >= 2 && stats.learned_hits >= 2, "{stats:?}");
    assert_eq!(s.filter.read_snoop_stats().unwrap().learned, 1);
}

// ---- cached verdicts --------------------------------------------------------------

/// A socket's packets after its first take its cached verdict; each change
/// to the set's entries or to the cgroup's flags reaches that socket at
/// its very next packet.
#[test]
fn a_policy_change_reaches_a_socket_that_already_sent() {
    let dst = Ipv4Addr::new(127, 0, 0, 30);
    let host = Prefix::host(IpAddr::V4(dst));
    let default_deny = FilterFlags {
        default_deny: true,
        ..FilterFlags::default()
    };
    let e = Egress::new("cache-policy", &["127.0.0.30/32"], &[], default_deny);
    let mut s = UdpSession::start(&e.cg, dst);

    let before = e.stats();
    for _ in 0..3 {
        assert!(s.delivers(), "allowed");
    }
    let after = e.stats();
    assert_eq!(after.allowed - before.allowed, 3, "{after:?}");
    assert!(
        after.cached - before.cached >= 1,
        "the 2nd and 3rd datagrams take the verdict the 1st cached: {before:?} -> {after:?}"
    );

    e.filter.remove(SET, Verdict::Allow, host).unwrap();
    assert!(!s.delivers(), "allow entry removed: the default deny");
    assert!(!s.delivers(), "... cached as such");
    e.filter.insert(SET, Verdict::Allow, host).unwrap();
    assert!(s.delivers(), "allow entry back");
    e.filter.insert(SET, Verdict::Deny, host).unwrap();
    assert!(!s.delivers(), "a deny entry beats the allow entry");
    e.filter.remove(SET, Verdict::Deny, host).unwrap();
    e.filter.remove(SET, Verdict::Allow, host).unwrap();
    assert!(!s.delivers(), "nothing allows it");
    e.filter
        .set_filter(e.cg.id(), SET, FilterFlags::default())
        .unwrap();
    assert!(s.delivers(), "the cgroup's flags no longer deny by default");
    e.filter.set_filter(e.cg.id(), SET, default_deny).unwrap();
    assert!(!s.delivers(), "default deny again");

    let end = e.stats();
    assert!(end.cached > after.cached, "{end:?}");
    assert_eq!(end.cache_failed, 0, "{end:?}");
    println!("cached verdicts followed every change; stats {end:?}");
}

/// An answer that teaches a set an address reaches a socket whose packets
/// to it were cached as dropped, and the cached verdict the learned
/// address made ends with the address's TTL.
#[test]
fn a_learned_address_reaches_a_socket_that_already_sent_until_its_ttl_ends() {
    let dst = Ipv4Addr::new(127, 0, 0, 31);
    let resolver = Resolver::start(Ipv4Addr::new(127, 0, 1, 54), &[("cached.test", dst, 1)]);
    let allow = DomainVerdicts {
        allow: true,
        deny: false,
        observe: false,
    };
    let snooped = Snooped::new(
        "cache-learned",
        &["127.0.1.54/32"],
        &[("cached.test", allow)],
        DOMAINS_DEFAULT_DENY,
    );
    let mut s = UdpSession::start(&snooped.cg, dst);

    assert!(!s.delivers(), "before any answer the default deny holds");
    assert!(!s.delivers(), "... cached as such");
    assert_eq!(
        s.ask(&format!("resolve cached.test {}", resolver.addr)),
        "answered"
    );
    let answered = Instant::now();
    assert!(
        s.delivers(),
        "the answer reaches the socket's cached verdict"
    );
    let before = snooped.filter.read_stats().unwrap();
    assert!(s.delivers(), "and is cached in turn");
    let after = snooped.filter.read_stats().unwrap();
    assert_eq!(after.cached - before.cached, 1, "{after:?}");

    // TTL 1 s counts for the 5 s minimum: then the cached verdict ends too.
    let expired_after = wait_for_learned_expiry(&snooped.filter, answered);
    assert!(!s.delivers(), "after the TTL the default deny holds again");
    println!(
        "learned, delivered, expired after {expired_after:?}; stats {:?}",
        snooped.filter.read_stats().unwrap()
    );
}
