//! The protocol manager over the kernel classifier, with real loopback
//! traffic (needs root and a cgroup v2 mount): policies and a pod in,
//! first data segments dropped or delivered and classified flows drained
//! out. Run with `cargo test -p kyverno-runtime-enforce --features
//! host-tests --test protocol_host`.
//!
//! The pod's "container" is a cgroup this test creates under the cgroup2
//! mount; a child of this binary joins it, connects to a listener of this
//! process on 127.0.0.1 and writes one payload. The handshake has no
//! payload and always passes; a dropped flow shows as a listener that
//! receives nothing. Assertions are on outcomes, never on durations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// The ClientHello builder the BPF crate's tests use.
#[path = "../../../bpf/tests/common/tlsmsg.rs"]
mod tlsmsg;

use common::{join_cgroup, TempCgroup};

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kyverno_runtime_enforce::egress::{ContainerCgroup, NetworkPod};
use kyverno_runtime_enforce::openexec::{BehaviorLists, Mode};
use kyverno_runtime_enforce::protocol::{ProtocolManager, ProtocolObservation, ProtocolPolicy};
use kyverno_runtime_enforce::{Decision, PolicyId};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{FieldPath, Reason};

const CHILD_ENV: &str = "KRT_PROTOCOL_HOST_CHILD";
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long the listener waits for a first segment a drop never delivers.
const RECV_TIMEOUT: Duration = Duration::from_millis(1500);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The child: joins the cgroup, connects, writes the payload and holds the
/// connection until the parent closes it; exit 0 when all of that worked.
#[test]
fn stream_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('\t');
    let (dir, addr, payload) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        unhex(parts.next().unwrap_or("")),
    );
    join_cgroup(Path::new(dir));
    let addr: SocketAddr = addr.parse().unwrap();
    let code = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(mut s) => {
            s.write_all(&payload).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut sink = [0u8; 64];
            let _ = s.read(&mut sink);
            0
        }
        Err(e) => {
            eprintln!("child: connect {addr}: {e}");
            10
        }
    };
    std::process::exit(code);
}

/// A child in `cg` connects to `listener` and writes `payload`; returns
/// what the listener received (empty when the first segment was dropped).
fn stream_received(cg: &TempCgroup, listener: &TcpListener, payload: &[u8]) -> Vec<u8> {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stream_child", "--nocapture", "-q"])
        .env(
            CHILD_ENV,
            format!(
                "{}\t{}\t{}",
                cg.0.display(),
                listener.local_addr().unwrap(),
                hex(payload)
            ),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
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
    let status = child.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(0), "the handshake passes: {status}");
    got
}

const SSH_BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.6 krt-protocol-host\r\n";

fn policy(id: &str, mode: Mode, allow: &[&str], deny: &[&str]) -> ProtocolPolicy {
    ProtocolPolicy {
        id: PolicyId::new(id).unwrap(),
        name: id.into(),
        mode,
        target: PodTarget::everything(),
        protocol: Some(BehaviorLists {
            field: FieldPath::spec()
                .field("behaviors")
                .index(0)
                .field("protocol"),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

/// The flows of `obs` with this classification and decision.
fn flows(
    obs: &[ProtocolObservation],
    protocol: &str,
    alpn: Option<&str>,
    decision: Decision,
) -> u64 {
    obs.iter()
        .filter(|o| o.protocol == protocol && o.alpn.as_deref() == alpn && o.decision == decision)
        .map(|o| o.count)
        .sum()
}

#[test]
fn ssh_is_dropped_tls_passes_and_a_monitor_policy_observes() {
    let cg = TempCgroup::new("protocol-host", "flows");
    let mut m = ProtocolManager::load().unwrap();
    assert!(m
        .upsert_pod(NetworkPod {
            uid: "pod-1".into(),
            namespace: "default".into(),
            name: "web".into(),
            labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            cgroups: vec![ContainerCgroup {
                id: cg.id(),
                path: cg.0.clone(),
            }],
        })
        .is_empty());
    assert_eq!(m.kernel().attached().count(), 0, "no policy: not attached");

    // Enforce: deny ssh. `unclassified` is observation vocabulary, refused
    // as a value with its field path; the rest is programmed.
    let out = m.upsert_policy(policy(
        "deny-ssh",
        Mode::Enforce,
        &[],
        &["ssh", "unclassified"],
    ));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert_eq!(out.rejections.len(), 1);
    assert_eq!(out.rejections[0].path, "spec.behaviors[0].protocol.deny");
    assert_eq!(out.rejections[0].reason, Reason::Unclassified);
    assert_eq!(m.kernel().attached().collect::<Vec<_>>(), [cg.id()]);

    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let hello = tlsmsg::client_hello(&[b"h2"]);
    assert_eq!(
        stream_received(&cg, &listener, SSH_BANNER),
        b"",
        "the ssh banner is dropped"
    );
    assert_eq!(
        stream_received(&cg, &listener, &hello),
        hello,
        "a ClientHello to the same port passes"
    );
    // No monitor policy: the refused flow is counted (an enforce-only
    // pod's refusals become findings), the allowed one is not.
    let d = m.drain();
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(d.observations.len(), 1, "{:?}", d.observations);
    assert_eq!(
        flows(&d.observations, "ssh", None, Decision::Denied),
        1,
        "{:?}",
        d.observations
    );

    // A monitor policy joins: the union still drops ssh, and now observes.
    let out = m.upsert_policy(policy("watch", Mode::Monitor, &[], &["ssh"]));
    assert!(out.failures.is_empty() && out.rejections.is_empty());
    assert_eq!(stream_received(&cg, &listener, SSH_BANNER), b"");
    assert_eq!(stream_received(&cg, &listener, &hello), hello);
    let d = m.drain();
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(d.events_lost, 0);
    assert!(
        d.observations.iter().all(|o| o.cgroup == cg.id()),
        "{:?}",
        d.observations
    );
    assert_eq!(
        flows(&d.observations, "ssh", None, Decision::Denied),
        1,
        "{:?}",
        d.observations
    );
    assert_eq!(
        flows(&d.observations, "tls", Some("h2"), Decision::Unmatched),
        1,
        "{:?}",
        d.observations
    );
    assert!(d.observations.iter().all(|o| o.protocol != "unclassified"));
    let ssh = d.observations.iter().find(|o| o.protocol == "ssh").unwrap();
    assert!(ssh.matches_value("ssh") && !ssh.matches_value("tls"));
    assert_eq!(
        m.pod_of_cgroup(ssh.cgroup).map(|p| p.uid.as_str()),
        Some("pod-1")
    );

    // The enforce policy gone: ssh passes, observed as unmatched.
    assert!(m
        .delete_policy(&PolicyId::new("deny-ssh").unwrap())
        .is_empty());
    assert_eq!(stream_received(&cg, &listener, SSH_BANNER), SSH_BANNER);
    let d = m.drain();
    assert_eq!(
        flows(&d.observations, "ssh", None, Decision::Unmatched),
        1,
        "{:?}",
        d.observations
    );

    // No protocol policy left: revoked and detached.
    assert!(m.delete_policy(&PolicyId::new("watch").unwrap()).is_empty());
    assert_eq!(m.kernel().attached().count(), 0);
    assert!(m.programmed("pod-1").is_none());
    assert_eq!(stream_received(&cg, &listener, SSH_BANNER), SSH_BANNER);
    assert!(m.drain().observations.is_empty());

    let stats = m.stats().unwrap();
    assert!(stats.ssh >= 3 && stats.tls >= 2, "{stats:?}");
    assert!(stats.drops >= 2, "{stats:?}");
}
