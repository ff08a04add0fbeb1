//! Driver (b), protocol: the real protocol classifier (the
//! `cgroup_skb/egress` program of `bpf/protocol/classifier.bpf.c`), its
//! rule sets programmed by the real [`ProtocolManager`] from policies the
//! real compiler evaluated, judged with `BPF_PROG_TEST_RUN` on a frame of
//! every flow of [`universe::FLOWS`] and compared with the model's
//! refusal.
//!
//! How the classifier is driven (from `bpf/tests/protocol_test_run.rs`):
//!
//! - A flow is its cgroup and 5-tuple; its verdict is decided on its first
//!   data segment (TCP) or first datagram (UDP) and cached, and a rule
//!   change recomputes a cached verdict from the cached classification
//!   without looking at the payload again. So every frame here is the first
//!   packet of a flow no earlier frame of the run used (a fresh source port
//!   and destination, [`Tuples`]), and is classified afresh.
//! - A TCP segment without payload is not classified (it passes, deferred),
//!   so every TCP frame carries its evidence; an empty UDP datagram is
//!   unclassified, and so is one too short for a DNS header.
//! - Each flow is sent over IPv4 and IPv6 (the family comes from the
//!   EtherType), and `unclassified` over TCP and UDP.
//!
//! Before the first case a second classifier (the *witness*: another
//! loaded object, never attached, gating the scratch cgroup with no rule
//! and the observe flag) classifies one frame of every kind, and the run
//! refuses to start unless each is classified as the model's token; a
//! disagreement also says what the witness classified its frame as.
//!
//! The packets' cgroup is this process's (the kernel charges a test-run
//! skb to the caller), so the process moves into a scratch child cgroup
//! for the run and registers a pod on it, as the egress driver does; the
//! same single-thread rule applies. Each case upserts its policies,
//! checks every flow, deletes them, and checks that every frame of the
//! case (their cached flows) and a fresh one of every kind passes.

use crate::kernel_common::{mode, pod, pod_labels, run_driver, run_sequences, KernelCase};
use crate::model::{self, Event, Finding, Kind, Policy};
use crate::reporting::{self, Reporter, POD_UID};
use crate::{step_of, universe, userspace, Run};
use kyverno_runtime_bpf::frame::{tcp_segment_to, udp_datagram_to, PSH_ACK};
use kyverno_runtime_bpf::protocol::{ProtoFlags, ProtocolClassifier};
use kyverno_runtime_enforce::egress::ContainerCgroup;
use kyverno_runtime_enforce::protocol::{
    KernelProtocol, ProtocolManager, ProtocolObservation, ProtocolPolicy,
};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_plane::{Event as PlaneEvent, Facts};
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::values::BehaviorKind;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The driver's name, as `Run.driver` reports it.
const DRIVER: &str = "protocol-bpf";

/// The sequences driver's name.
const SEQUENCE_DRIVER: &str = "protocol-bpf-seq";

/// `BPF_PROG_TEST_RUN`'s return value for a dropped packet.
const DROP: u32 = 0;

/// The witness's rule set (its own object: no set of the manager's).
const WITNESS_SET: u32 = 1;

// ---- cases --------------------------------------------------------------------------

/// 1 to 8 policies of protocol behaviors only, from the universe's values.
pub fn protocol_policies() -> impl Strategy<Value = Vec<Policy>> {
    universe::policies_of(&[Kind::Protocol], universe::values_of)
}

// ---- payloads -----------------------------------------------------------------------

const SSH_BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.6 krt-differential\r\n";
const HTTP1_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";
/// The HTTP/2 cleartext preface, then an empty SETTINGS frame.
const HTTP2_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// Bytes that are no protocol's evidence.
const BINARY: &[u8] = b"\x00\x01krt-differential";

/// `n` as a big-endian 16-bit length field (the payloads here are small).
fn u16be(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

/// One TLS extension: its type, its body's length and the body.
fn extension(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut e = kind.to_be_bytes().to_vec();
    e.extend_from_slice(&u16be(body.len()));
    e.extend_from_slice(body);
    e
}

/// A ClientHello in one TLS record: SNI, then (when `alpn` is given) an
/// ALPN extension offering those names in order, then
/// supported_versions.
fn client_hello(alpn: Option<&[&[u8]]>) -> Vec<u8> {
    let host = b"example.com";
    let mut sni = vec![0u8]; // host_name
    sni.extend_from_slice(&u16be(host.len()));
    sni.extend_from_slice(host);
    let mut body = u16be(sni.len()).to_vec();
    body.extend_from_slice(&sni);
    let mut exts = extension(0, &body);
    if let Some(names) = alpn {
        let mut list = Vec::new();
        for n in names {
            list.push(u8::try_from(n.len()).unwrap_or(u8::MAX));
            list.extend_from_slice(n);
        }
        let mut body = u16be(list.len()).to_vec();
        body.extend_from_slice(&list);
        exts.extend_from_slice(&extension(16, &body));
    }
    // supported_versions: TLS 1.3, TLS 1.2.
    exts.extend_from_slice(&extension(43, &[4, 0x03, 0x04, 0x03, 0x03]));

    let mut hello = vec![0x03, 0x03]; // legacy_version
    hello.extend_from_slice(&[0x5a; 32]); // random
    hello.push(32);
    hello.extend_from_slice(&[0xa5; 32]); // legacy_session_id
    hello.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]); // cipher_suites
    hello.extend_from_slice(&[1, 0]); // compression: null
    hello.extend_from_slice(&u16be(exts.len()));
    hello.extend_from_slice(&exts);

    let mut hs = vec![1u8]; // client_hello
    let len = u32::try_from(hello.len()).unwrap_or(u32::MAX).to_be_bytes();
    hs.extend_from_slice(&len[1..]);
    hs.extend_from_slice(&hello);

    let mut record = vec![22, 0x03, 0x01];
    record.extend_from_slice(&u16be(hs.len()));
    record.extend_from_slice(&hs);
    record
}

/// A standard query (RD set) for `name`, type A, class IN; the name's
/// labels as spelled (case kept: lowercasing is the observers' job; empty
/// labels, a trailing dot's included, are left out, so `"a.b."` and
/// `"a.b"` are the same bytes).
pub(crate) fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap_or(u8::MAX));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

/// A QUIC version 1 Initial, padded to 1200 bytes as clients send it.
fn quic_initial() -> Vec<u8> {
    let mut p = vec![0xc3, 0, 0, 0, 1];
    p.push(8);
    p.extend_from_slice(&[0x11; 8]); // DCID
    p.push(0); // SCID length
    p.push(0); // token length
    p.extend_from_slice(&[0x44, 0x9e]); // length (varint)
    p.resize(1200, 0);
    p
}

// ---- frames -------------------------------------------------------------------------

/// Source ports and destinations no earlier frame of the run used: the
/// classifier caches a verdict per 5-tuple, and a reused tuple would be
/// judged by its old classification.
#[derive(Debug, Default)]
pub(crate) struct Tuples {
    next: u64,
}

impl Tuples {
    /// Ports 1024..65535 for each destination of 198.18.0.0/15 (IPv4) or
    /// 2001:db8:1::/64 (IPv6) in turn: unique for 8 billion frames.
    pub(crate) fn fresh(&mut self, v6: bool, port: u16) -> (u16, SocketAddr) {
        const PORTS: u64 = 65535 - 1024;
        let n = self.next;
        self.next += 1;
        let sport = 1024 + u16::try_from(n % PORTS).unwrap_or(0);
        let host = n / PORTS;
        let ip = if v6 {
            IpAddr::V6(Ipv6Addr::from(
                0x2001_0db8_0001_0000_0000_0000_0000_0000u128 | u128::from(host),
            ))
        } else {
            let low = u32::try_from(host % (1 << 17)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(198, 18, 0, 0)) + low,
            ))
        };
        (sport, SocketAddr::new(ip, port))
    }
}

/// One way of sending a flow: its transport, destination port and first
/// payload.
#[derive(Clone, Debug)]
struct FrameKind {
    /// How it is described in a disagreement.
    label: &'static str,
    udp: bool,
    port: u16,
    payload: Vec<u8>,
}

impl FrameKind {
    fn tcp(label: &'static str, port: u16, payload: Vec<u8>) -> Self {
        Self {
            label,
            udp: false,
            port,
            payload,
        }
    }

    fn udp(label: &'static str, port: u16, payload: Vec<u8>) -> Self {
        Self {
            label,
            udp: true,
            port,
            payload,
        }
    }

    /// The first packet of a fresh flow of this kind.
    fn frame(&self, tuples: &mut Tuples, v6: bool) -> Frame {
        let (sport, dst) = tuples.fresh(v6, self.port);
        let bytes = if self.udp {
            udp_datagram_to(sport, dst, &self.payload)
        } else {
            tcp_segment_to(sport, dst, PSH_ACK, &self.payload)
        };
        Frame {
            what: format!(
                "{} ({} {sport} -> {dst})",
                self.label,
                if self.udp { "udp" } else { "tcp" }
            ),
            bytes,
        }
    }
}

/// One frame sent, with what it is for a message.
#[derive(Clone, Debug)]
struct Frame {
    what: String,
    bytes: Vec<u8>,
}

/// A flow of the universe and the ways it is sent.
#[derive(Clone, Debug)]
struct Flow {
    protocol: &'static str,
    alpn: Option<&'static str>,
    kinds: Vec<FrameKind>,
}

impl Flow {
    fn event(&self) -> Event {
        Event::Protocol {
            protocol: self.protocol,
            alpn: self.alpn,
        }
    }

    /// The flow as a policy would name it (`tls/h2`, `ssh`).
    fn token(&self) -> String {
        match self.alpn {
            Some(a) => format!("{}/{a}", self.protocol),
            None => self.protocol.to_owned(),
        }
    }
}

/// The frames the classifier names `protocol` (with `alpn`), the model's
/// vocabulary; an error for a flow this driver has no frame of.
fn flow(protocol: &'static str, alpn: Option<&'static str>) -> Result<Flow, String> {
    let kinds = match (protocol, alpn) {
        ("ssh", None) => vec![FrameKind::tcp("SSH banner", 22, SSH_BANNER.to_vec())],
        ("tls", None) => vec![FrameKind::tcp(
            "ClientHello without ALPN",
            443,
            client_hello(None),
        )],
        ("tls", Some(first)) => {
            // The first offered name decides; the universe's other ALPNs
            // follow it, so a rule naming one of those must not match.
            let mut names: Vec<&[u8]> = vec![first.as_bytes()];
            names.extend(
                universe::FLOWS
                    .iter()
                    .filter_map(|(_, a)| *a)
                    .filter(|a| *a != first)
                    .map(str::as_bytes),
            );
            vec![FrameKind::tcp(
                "ClientHello offering ALPN",
                443,
                client_hello(Some(&names)),
            )]
        }
        ("dns", None) => vec![FrameKind::udp("DNS query", 53, dns_query("example.com"))],
        ("http/1.1", None) => vec![FrameKind::tcp(
            "HTTP/1.1 request",
            80,
            HTTP1_REQUEST.to_vec(),
        )],
        ("http/2", None) => vec![FrameKind::tcp("HTTP/2 preface", 80, HTTP2_PREFACE.to_vec())],
        ("quic", None) => vec![FrameKind::udp("QUIC v1 Initial", 443, quic_initial())],
        ("unclassified", None) => vec![
            FrameKind::tcp("binary bytes", 9000, BINARY.to_vec()),
            // Too short for a DNS header, and no QUIC long header.
            FrameKind::udp("a short datagram", 9000, b"hello".to_vec()),
            // An empty datagram is a whole first datagram with no evidence
            // (an empty TCP segment would be deferred, not classified).
            FrameKind::udp("an empty datagram", 9000, Vec::new()),
        ],
        _ => return Err(format!("no frame for the flow {protocol:?} {alpn:?}")),
    };
    Ok(Flow {
        protocol,
        alpn,
        kinds,
    })
}

// ---- the product --------------------------------------------------------------------

/// The manager over the kernel classifier, the witness, one pod on the
/// scratch cgroup, and every flow of the universe.
struct Kernel {
    manager: ProtocolManager<KernelProtocol>,
    witness: ProtocolClassifier,
    flows: Vec<Flow>,
    tuples: Tuples,
    /// The frames probed since the last [`KernelCase::check_empty`].
    sent: Vec<Frame>,
    reporter: Reporter,
}

impl Kernel {
    fn new(cgroup: ContainerCgroup) -> Result<Self, String> {
        let backend = KernelProtocol::load().map_err(|e| format!("loading: {e}"))?;
        let mut manager = ProtocolManager::new(backend);
        let witness = ProtocolClassifier::load().map_err(|e| format!("loading: {e}"))?;
        // No rule: every flow passes, and is counted (observe).
        witness
            .set_filter(
                cgroup.id,
                WITNESS_SET,
                ProtoFlags {
                    default_deny: false,
                    observe: true,
                },
            )
            .map_err(|e| format!("gating the witness: {e}"))?;
        if let Some(f) = manager.upsert_pod(pod(cgroup)).first() {
            return Err(f.to_string());
        }
        let flows = universe::FLOWS
            .iter()
            .map(|(p, a)| flow(p, *a))
            .collect::<Result<Vec<_>, _>>()?;
        let mut k = Self {
            manager,
            witness,
            flows,
            tuples: Tuples::default(),
            sent: Vec::new(),
            reporter: Reporter::new(pod_labels()),
        };
        k.preflight()?;
        Ok(k)
    }

    /// Every frame kind, over both families, is classified as its flow's
    /// token, and passes while no policy is programmed.
    fn preflight(&mut self) -> Result<(), String> {
        let flows = self.flows.clone();
        for f in &flows {
            for kind in &f.kinds {
                for v6 in [false, true] {
                    let frame = kind.frame(&mut self.tuples, v6);
                    let seen = self.classify(&frame.bytes)?;
                    if seen != [f.token()] {
                        return Err(format!(
                            "the frame for {} ({}) is classified as {seen:?}",
                            f.token(),
                            frame.what
                        ));
                    }
                    if self.dropped(&frame.bytes)? {
                        return Err(format!("{} is dropped with no policy", frame.what));
                    }
                }
            }
        }
        Ok(())
    }

    /// What the witness classifies `frame` as, in the policy vocabulary
    /// (`tls/h2`, `http/1.1`, `unclassified`): one entry per flow counted.
    fn classify(&self, frame: &[u8]) -> Result<Vec<String>, String> {
        self.witness
            .test_run(frame)
            .map_err(|e| format!("witness test run: {e}"))?;
        let events = self
            .witness
            .drain_events()
            .map_err(|e| format!("witness drain: {e}"))?;
        Ok(events
            .iter()
            .map(ProtocolObservation::from_event)
            .flat_map(|o| {
                let token = match &o.alpn {
                    Some(a) => format!("{}/{a}", o.protocol),
                    None => o.protocol.to_owned(),
                };
                std::iter::repeat_n(token, usize::try_from(o.count).unwrap_or(usize::MAX))
            })
            .collect())
    }

    /// Whether the manager's classifier drops `frame`.
    fn dropped(&self, frame: &[u8]) -> Result<bool, String> {
        self.manager
            .kernel()
            .classifier()
            .test_run(frame)
            .map(|verdict| verdict == DROP)
            .map_err(|e| format!("test run: {e}"))
    }

    /// The findings the real monitor makes of what the classifier's
    /// counters drained, as the daemon makes them (engine/observe.rs).
    fn drained_findings(&mut self) -> Result<BTreeSet<Finding>, String> {
        let drained = self.manager.drain();
        if let Some(e) = drained.errors.first() {
            return Err(format!("draining: {e}"));
        }
        let events = drained
            .observations
            .into_iter()
            .map(|o| {
                let mut e = PlaneEvent::new(
                    "egress-observe",
                    Facts::Protocol {
                        protocol: o.protocol,
                        alpn: o.alpn,
                    },
                );
                e.cgroup = Some(o.cgroup);
                e.count = o.count;
                e.kernel = Some(o.decision.into());
                e
            })
            .collect();
        Ok(self.reporter.findings(events))
    }

    /// Every frame of `flow`, on a fresh tuple over both families, passes
    /// or drops as the model says, and the findings of the drained
    /// counters after each are the model's.
    fn probe_flow(&mut self, policies: &[Policy], f: &Flow) -> Result<(), String> {
        let want = model::decide(policies, &f.event());
        let reported = reporting::reported(&want);
        // What earlier frames left counted is not this flow's.
        self.drained_findings()?;
        for kind in &f.kinds {
            for v6 in [false, true] {
                let frame = kind.frame(&mut self.tuples, v6);
                let dropped = self.dropped(&frame.bytes)?;
                let verb = |refused| if refused { "drops" } else { "passes" };
                if dropped != want.refused {
                    // The same bytes on a fresh tuple, through the
                    // witness: whether the frame is the model's flow.
                    let again = kind.frame(&mut self.tuples, v6);
                    let seen = self
                        .classify(&again.bytes)
                        .unwrap_or_else(|e| vec![format!("(unknown: {e})")]);
                    return Err(format!(
                        "{} over {}: the kernel {} it, the model {} it (its findings: {:?}); \
                         the witness classifies the frame as {seen:?}",
                        f.token(),
                        frame.what,
                        verb(dropped),
                        verb(want.refused),
                        want.findings
                    ));
                }
                let found = self.drained_findings()?;
                if found != reported {
                    return Err(format!(
                        "{} over {} ({} by the kernel): the findings of the drained counters \
                         are {found:?}, the model's {reported:?}",
                        f.token(),
                        frame.what,
                        verb(dropped)
                    ));
                }
                self.sent.push(frame);
            }
        }
        Ok(())
    }
}

impl KernelCase for Kernel {
    /// Compiles `p` as the daemon does and upserts its protocol part; the
    /// monitor is given it too.
    fn apply(&mut self, p: &Policy) -> Result<(), String> {
        let (compiled, result) = userspace::compile(p).map_err(|e| e.0)?;
        let outcome = self.manager.upsert_policy(ProtocolPolicy {
            id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
            name: p.name.clone(),
            mode: mode(p.mode),
            target: compiled.target.clone(),
            protocol: BehaviorLists::merge(&result, BehaviorKind::Protocol),
        });
        self.reporter.set_policy(p, &compiled, &result);
        if !outcome.rejections.is_empty() || !outcome.failures.is_empty() {
            return Err(format!("{}: protocol not programmed: {outcome:?}", p.name));
        }
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        let id = PolicyId::new(name.to_owned()).map_err(|e| e.to_string())?;
        self.reporter.remove_policy(name);
        match self.manager.delete_policy(&id).first() {
            Some(f) => Err(f.to_string()),
            None => Ok(()),
        }
    }

    fn probe(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        for f in self.flows.clone() {
            checked.set(checked.get() + 1);
            self.probe_flow(policies, &f)?;
        }
        Ok(())
    }

    /// The pod holds no set and no attachment, and every frame sent since
    /// the last check (their flows cached, some as dropped) and a fresh one
    /// of every kind passes. Takes the counted flows, so they do not pile
    /// up.
    fn check_empty(&mut self) -> Result<(), String> {
        let drained = self.manager.drain();
        if let Some(e) = drained.errors.first() {
            return Err(format!("draining: {e}"));
        }
        if let Some(set) = self.manager.programmed(POD_UID) {
            return Err(format!(
                "deleted every policy, the pod still has a set: {set:?}"
            ));
        }
        let attached: Vec<u64> = self.manager.kernel().attached().collect();
        if !attached.is_empty() {
            return Err(format!(
                "deleted every policy, still attached to {attached:?}"
            ));
        }
        let mut sent = std::mem::take(&mut self.sent);
        for f in self.flows.clone() {
            for kind in &f.kinds {
                for v6 in [false, true] {
                    sent.push(kind.frame(&mut self.tuples, v6));
                }
            }
        }
        for frame in &sent {
            if self.dropped(&frame.bytes)? {
                return Err(format!(
                    "after every policy was deleted, {} is still dropped (a stale entry)",
                    frame.what
                ));
            }
        }
        Ok(())
    }
}

/// Driver (b), protocol: about `cases` (policy set, flow) pairs, each
/// policy set drawn from the protocol universe (seeded with `seed`),
/// programmed by the real [`ProtocolManager`] over the real kernel
/// classifier and judged by it (`BPF_PROG_TEST_RUN`) on the first packet
/// of a fresh flow of every kind of [`universe::FLOWS`], over IPv4 and
/// IPv6, against the refusal of [`model::decide`]; the classifier's
/// counters drained after each frame are made findings by the real
/// monitor, as the daemon makes them, and compared with the model's.
/// After each set its policies are deleted and every frame must pass
/// again.
///
/// Needs root and a cgroup v2 mount (otherwise the run has no cases and
/// says why); moves this process into a scratch child cgroup for the run
/// (moved back and removed on the way out), so it must be called with no
/// other thread running.
pub fn kernel_protocol(cases: u64, seed: u64) -> Run {
    // The replay scenario of a disagreement probes every flow.
    let every: Vec<Event> = universe::FLOWS
        .iter()
        .map(|(protocol, alpn)| Event::Protocol {
            protocol,
            alpn: *alpn,
        })
        .collect();
    run_driver(
        DRIVER,
        cases,
        seed,
        universe::FLOWS.len(),
        protocol_policies(),
        every,
        Kernel::new,
    )
}

/// Driver (d), protocol: about `cases` (step, flow) pairs over sequences
/// of protocol policy steps (add, edit, mode switch, selector change,
/// delete), every flow probed after each step as [`kernel_protocol`] does,
/// against the model over the policies then current. Same needs as
/// [`kernel_protocol`].
pub fn kernel_protocol_sequences(cases: u64, seed: u64) -> Run {
    run_sequences(
        SEQUENCE_DRIVER,
        cases,
        seed,
        universe::FLOWS.len(),
        step_of(&[Kind::Protocol], universe::values_of),
        Kernel::new,
    )
}
