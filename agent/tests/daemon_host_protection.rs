//! Tier 2+3: self-protection on the host's kernel, with a real pod cgroup
//! and the real API server (issue 37, finding 4). An enforce policy that
//! selects every namespace must not enforce on the pods of a protected
//! namespace (the daemon's own, `kube-system`): its shard says so and the
//! pod's traffic is untouched; with `--enforce-protected-namespaces` the
//! operator opts in and the same policy refuses.
//!
//! Needs root (a cgroup v2 directory, a bpffs mount, cgroup_skb programs)
//! and `--features kube-tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::host::HostPod;
use common::*;
use std::time::Duration;

const NODE: &str = "host-protect-node";
const NS: &str = "host-protected";
const POLICY: &str = "host-protect";

/// Tries a TCP connection from inside `cgroup`; true if it connected.
fn connects_from(cgroup: &std::path::Path, addr: &str) -> bool {
    common::host::connects_within(cgroup, addr, "0.5")
}

fn start(pod: &HostPod, extra: &[&str]) -> Daemon {
    let pins = pod.pins();
    let mut args = vec![
        "--metrics-addr",
        "",
        "--status-interval",
        "1s",
        "--pin-dir",
        pins.to_str().unwrap(),
        "--protected-namespaces",
        NS,
    ];
    args.extend_from_slice(extra);
    let cluster = cluster();
    let mut daemon = Daemon::start(
        &args,
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));
    daemon
}

#[test]
fn an_enforce_policy_leaves_a_protected_namespace_alone_unless_the_operator_opts_in() {
    let cluster = cluster();
    let dir = tempdir();
    let listener = std::net::TcpListener::bind("127.0.0.13:0").unwrap();
    let denied = listener.local_addr().unwrap().to_string();
    namespace(cluster, NS, "team: protected");
    // Every namespace, as a careless policy would say.
    apply(
        cluster,
        &format!(
            "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {POLICY}\nspec:\n  mode: enforce\n  namespaceSelector: {{}}\n  podSelector: {{matchLabels: {{app: {POLICY}}}}}\n  behaviors:\n  - network: {{deny: {{values: [\"127.0.0.13/32\"]}}}}\n"
        ),
    );
    force_delete_pod(cluster, NS, "protected-web");
    let id = "5d".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "protected-web",
        NODE,
        &format!("app: {POLICY}"),
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);
    let container = &pod.container;

    // Protected: the shard says so, and the pod's traffic is untouched.
    let daemon = start(&pod, &[]);
    let message = wait_for(
        "the shard naming the protected pod",
        Duration::from_secs(30),
        || {
            let s = shard(cluster, POLICY, NODE)?;
            let m = s["message"].as_str()?.to_owned();
            m.contains("not enforced").then_some(m)
        },
    );
    println!("protected: shard message {message:?}");
    assert!(
        message.contains(&format!("first: {NS}/protected-web")),
        "{message}"
    );
    for probe in 0..5 {
        assert!(
            connects_from(container, &denied),
            "probe {probe}: {denied} refused in a protected namespace"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());

    // The operator opts in: the same policy refuses, and says nothing more.
    let daemon = start(&pod, &["--enforce-protected-namespaces"]);
    wait_for("the destination refused", Duration::from_secs(30), || {
        (!connects_from(container, &denied)).then_some(())
    });
    wait_for(
        "the shard without the notice",
        Duration::from_secs(30),
        || {
            let s = shard(cluster, POLICY, NODE)?;
            let m = s["message"].as_str().unwrap_or_default();
            (s["enforcementAvailable"] == true && !m.contains("not enforced")).then_some(())
        },
    );
    println!("opted in: {denied} refused");
    let (status, _, _) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success());
    cluster.kubectl_ok(&["delete", "rpol", POLICY]).unwrap();
    force_delete_pod(cluster, NS, "protected-web");
}
