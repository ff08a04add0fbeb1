//! The dns gate manager over the kernel DNS question observer, with real
//! loopback datagrams (needs root and a cgroup v2 mount): policies and a
//! pod in, decoded questions from the manager's reader out. Run with
//! `cargo test -p kyverno-runtime-enforce --features host-tests --test
//! dns_host`.
//!
//! The pod's "container" is a cgroup this test creates under the cgroup2
//! mount; a child of this binary joins it and sends one DNS query to a
//! "resolver", a UDP socket of this process on 127.0.0.1:53 (the observer
//! reads datagrams to port 53 only). Observing never drops: every query
//! reaches the resolver whatever the gate says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{join_cgroup, TempCgroup};

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kyverno_runtime_bpf::dns::{DnsQuestion, DnsReader};
use kyverno_runtime_enforce::dns::{judge_name, DnsGateManager, DnsPolicy, NameVerdict};
use kyverno_runtime_enforce::egress::{ContainerCgroup, NetworkPod};
use kyverno_runtime_enforce::openexec::{BehaviorLists, Mode};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::FieldPath;

const CHILD_ENV: &str = "KRT_DNS_HOST_CHILD";

/// A standard query (RD set) for `name`, type A, class IN.
fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x4b, 0x52, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

/// The child: joins the cgroup and sends one query; exit 0 when sent.
#[test]
fn query_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, rest) = spec.split_once('\t').unwrap();
    let (addr, name) = rest.split_once('\t').unwrap();
    join_cgroup(Path::new(dir));
    let addr: SocketAddr = addr.parse().unwrap();
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let code = match s.send_to(&dns_query(name), addr) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("child: send to {addr}: {e}");
            10
        }
    };
    std::process::exit(code);
}

/// A resolver on 127.0.0.1:53 (retried briefly in case another test
/// process holds the port).
fn resolver() -> UdpSocket {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match UdpSocket::bind((Ipv4Addr::LOCALHOST, 53)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_millis(1500)))
                    .unwrap();
                return s;
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("binding 127.0.0.1:53: {e}"),
        }
    }
}

/// A child in `cg` asks `resolver` for `name`; the query arrives whether
/// or not it is observed.
fn ask(cg: &TempCgroup, resolver: &UdpSocket, name: &str) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "query_child", "--nocapture", "-q"])
        .env(
            CHILD_ENV,
            format!(
                "{}\t{}\t{name}",
                cg.0.display(),
                resolver.local_addr().unwrap()
            ),
        )
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "child: {status}");
    let mut buf = [0u8; 512];
    let (n, _) = resolver.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], dns_query(name), "observing never drops");
}

/// Every question the reader has within `wait`, stopping early once
/// `want` have arrived.
fn questions(reader: &mut DnsReader, want: usize, wait: Duration) -> Vec<DnsQuestion> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    while got.len() < want.max(1) && Instant::now() < deadline {
        got.extend(reader.poll_questions(Duration::from_millis(100)).unwrap());
    }
    got
}

fn policy(id: &str, allow: &[&str], deny: &[&str]) -> DnsPolicy {
    DnsPolicy {
        id: PolicyId::new(id).unwrap(),
        name: id.into(),
        mode: Mode::Monitor,
        target: PodTarget::everything(),
        dns: Some(BehaviorLists {
            field: FieldPath::spec().field("behaviors").index(0).field("dns"),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

#[test]
fn a_gated_pods_questions_are_read_until_its_policy_goes() {
    let cg = TempCgroup::new("dns-host", "gate");
    let mut m = DnsGateManager::load().unwrap();
    let mut reader = m.reader().unwrap();
    let resolver = resolver();
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

    // An inert behavior (nothing on either side) observes nothing.
    assert!(m
        .upsert_policy(policy("inert", &[], &[]))
        .failures
        .is_empty());
    assert!(m.observed().is_empty());
    ask(&cg, &resolver, "before.example.com");
    assert_eq!(
        questions(&mut reader, 0, Duration::from_millis(300)),
        [],
        "an unselected pod's questions never enter the buffer"
    );

    // An expected set: the pod is attached and admitted.
    let out = m.upsert_policy(policy("expect", &["*.example.org"], &[]));
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    assert!(out.rejections.is_empty());
    assert_eq!(m.observed(), [cg.id()].into());
    assert_eq!(m.kernel().attached().collect::<Vec<_>>(), [cg.id()]);

    ask(&cg, &resolver, "www.example.com");
    let got = questions(&mut reader, 1, Duration::from_secs(3));
    assert_eq!(
        got,
        [DnsQuestion {
            cgroup_id: cg.id(),
            qname: "www.example.com".into(),
        }]
    );
    // The daemon's judgement: www.example.com is not in the expected set.
    let verdicts = m.verdicts(got[0].cgroup_id, &got[0].qname);
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert_eq!(verdicts[0].policy.as_str(), "expect");
    assert_eq!(verdicts[0].verdict, NameVerdict::Unexpected);
    assert!(verdicts[0].verdict.reported());
    let lists = policy("expect", &["*.example.org"], &[]).dns.unwrap();
    assert_eq!(judge_name(&lists, "a.example.org"), NameVerdict::Expected);

    // The policy deleted: the pod is revoked and detached, and a new
    // question produces no record.
    assert!(m
        .delete_policy(&PolicyId::new("expect").unwrap())
        .is_empty());
    assert!(m.observed().is_empty());
    assert_eq!(m.kernel().attached().count(), 0);
    ask(&cg, &resolver, "after.example.com");
    assert_eq!(questions(&mut reader, 0, Duration::from_millis(300)), []);

    let stats = m.stats().unwrap();
    assert_eq!((stats.ringbuf_full, stats.name_unreadable), (0, 0));
    assert_eq!(reader.undecodable(), 0);
}
