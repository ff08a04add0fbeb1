//! The network manager's host tests: policies, a pod of one container
//! cgroup, and a child process that connects from a cgroup.

use super::{join_cgroup, TempCgroup};
use kyverno_runtime_enforce::egress::{ContainerCgroup, NetworkPod, NetworkPolicy};
use kyverno_runtime_enforce::openexec::{BehaviorLists, Mode};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::FieldPath;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The environment variable that turns a test binary into a connect child.
const CHILD_ENV: &str = "KRT_EGRESS_CONNECT_CHILD";
/// A dropped SYN is retransmitted after 1 s and dropped again: 1.5 s ends
/// in a timeout for a dropped connect and never for one allowed on
/// loopback.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);

/// The body of each suite's `connect_child` test: in a child started by
/// [`connects`] it joins the cgroup and connects (exit 0 connected, 10
/// not); anywhere else it does nothing.
pub fn connect_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, addr) = spec.split_once('\t').unwrap();
    join_cgroup(Path::new(dir));
    let addr: SocketAddr = addr.parse().unwrap();
    let code = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(_) => 0,
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => 10,
        Err(e) => {
            eprintln!("child: connect {addr}: {e}");
            11
        }
    };
    std::process::exit(code);
}

/// Whether a child in `cg` connects to a listener on the host at `ip` (the
/// calling binary must have a `connect_child` test running
/// [`connect_child`]).
pub fn connects(cg: &TempCgroup, ip: &str) -> bool {
    let ip: IpAddr = ip.parse().unwrap();
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "connect_child", "--nocapture", "-q"])
        .env(CHILD_ENV, format!("{}\t{addr}", cg.0.display()))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    match status.code() {
        Some(0) => true,
        Some(10 | 11) => false,
        _ => panic!("child failed: {status}"),
    }
}

pub fn pid(id: &str) -> PolicyId {
    PolicyId::new(id).unwrap()
}

/// An enforce policy for every pod with one network behavior.
pub fn policy(id: &str, allow: &[&str], deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        id: pid(id),
        name: id.into(),
        mode: Mode::Enforce,
        target: PodTarget::everything(),
        network: Some(BehaviorLists {
            field: FieldPath::spec()
                .field("behaviors")
                .index(0)
                .field("network"),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

/// A pod (named by its uid) whose one container is `cg`.
pub fn pod(uid: &str, cg: &TempCgroup) -> NetworkPod {
    NetworkPod {
        uid: uid.into(),
        namespace: "default".into(),
        name: uid.into(),
        labels: BTreeMap::new(),
        namespace_labels: BTreeMap::new(),
        cgroups: vec![ContainerCgroup {
            id: cg.id(),
            path: cg.0.clone(),
        }],
    }
}
