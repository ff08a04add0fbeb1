//! Tier 2+3: the daemon on the host against the real API server, with a
//! real pod cgroup: a network policy naming a cluster Service gets the
//! Service's ClusterIP and EndpointSlice addresses into the pod's filter
//! set, follows the EndpointSlice as it changes, and loses them when the
//! Service is deleted. The set is read from the daemon's pinned maps while
//! it runs (`EgressFilter::read_pinned_state`, which loads nothing).
//!
//! Needs root (a cgroup v2 directory, a bpffs mount, cgroup_skb programs)
//! and `--features kube-tests`. Service addresses are not loopback (the
//! API server refuses loopback endpoints), so this proves the programming,
//! not traffic: the kernel's use of set entries is proven with loopback
//! traffic elsewhere (egress_traffic, egress_host).
#![cfg(feature = "kube-tests")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use kyverno_runtime_bpf::egress::{EgressFilter, Prefix};
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const NODE: &str = "host-services-node";
const NS: &str = "svc-names";

fn cgroup2_root() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    kyverno_runtime_compat::parse_mountinfo(&text)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .expect("a cgroup2 mount")
}

struct Cleanup {
    cgroup_dirs: Vec<PathBuf>,
    bpffs: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Unmounting the bpffs drops every pin: the links detach.
        let _ = Command::new("umount").arg(&self.bpffs).status();
        for d in self.cgroup_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The allow prefixes and domains of `cgroup`'s set, as pinned now.
fn pinned_allow(pins: &Path, cgroup: u64) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let state = EgressFilter::read_pinned_state(pins).ok()?;
    let (set, _) = state.filters.get(&cgroup)?;
    let entries = state.sets.get(set).cloned().unwrap_or_default();
    Some((
        entries.allow.iter().map(Prefix::to_string).collect(),
        entries.domains.keys().map(ToString::to_string).collect(),
    ))
}

fn prefixes(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn shard_message(cluster: &kyverno_runtime_testkube::LocalCluster) -> Option<String> {
    let rp = get_json(cluster, &["rpol", "svc-allow"])?;
    rp["status"]["nodes"]
        .as_array()?
        .iter()
        .find(|s| s["nodeName"] == NODE)
        .map(|s| s["message"].as_str().unwrap_or_default().to_string())
}

fn slice_manifest(name: &str, kind: &str, addresses: &[&str]) -> String {
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("  - addresses: [\"{a}\"]\n"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {NS}\n  labels: {{kubernetes.io/service-name: api}}\naddressType: {kind}\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n{}",
        endpoints.concat()
    )
}

#[test]
fn a_service_name_follows_the_service_and_its_endpoint_slices() {
    let cluster = cluster();
    let dir = tempdir();
    let bpffs = dir.path().join("bpffs");
    std::fs::create_dir_all(&bpffs).unwrap();
    assert!(Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&bpffs)
        .status()
        .unwrap()
        .success());

    namespace(cluster, NS, "team: svc");
    for kind in ["service", "endpointslice"] {
        let _ = cluster.kubectl_output(&["delete", kind, "--all", "-n", NS]);
    }
    apply(
        cluster,
        &format!("apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: svc-allow\nspec:\n  mode: enforce\n  podSelector: {{matchLabels: {{app: svc-web}}}}\n  behaviors:\n  - network:\n      allow: {{values: [\"api.{NS}.svc\", \"allowed.test\"]}}\n      deny: {{values: [\"*\"]}}\n"),
    );
    let _ = cluster.kubectl_output(&[
        "delete",
        "pod",
        "svc-web",
        "-n",
        NS,
        "--grace-period=0",
        "--force",
    ]);
    let id = "5f".repeat(32);
    let uid = running_pod(
        cluster,
        NS,
        "svc-web",
        NODE,
        "app: svc-web",
        &format!("containerd://{id}"),
    );
    let root = cgroup2_root();
    let pod_dir = root.join(format!("kubepods/besteffort/pod{uid}"));
    let container = pod_dir.join(&id);
    let mut created = Vec::new();
    for d in [
        root.join("kubepods"),
        root.join("kubepods/besteffort"),
        pod_dir.clone(),
        container.clone(),
    ] {
        if !d.exists() {
            std::fs::create_dir(&d).unwrap();
            created.push(d);
        }
    }
    let _cleanup = Cleanup {
        cgroup_dirs: created,
        bpffs: bpffs.clone(),
    };
    let cgroup = std::fs::metadata(&container).unwrap().ino();

    let pins = bpffs.join("kyverno-runtime");
    let egress_pins = pins.join("egress");
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            "",
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--reports-enabled=false",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log(
        "Services and EndpointSlices listed",
        Duration::from_secs(30),
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(30));

    // No Service yet: the set holds the domain and nothing for the
    // Service, and the shard says which name is unresolved.
    let (allow, domains) = wait_for("the pod's set", Duration::from_secs(20), || {
        pinned_allow(&egress_pins, cgroup)
    });
    assert!(allow.is_empty(), "{allow:?}");
    assert_eq!(domains, prefixes(&["allowed.test"]));
    let message = wait_for(
        "the unresolved Service in the shard",
        Duration::from_secs(20),
        || shard_message(cluster).filter(|m| m.contains(&format!("api.{NS}.svc"))),
    );
    println!("shard before the Service exists: {message}");

    // The Service (a fixed ClusterIP in the server's range) and two
    // EndpointSlices, IPv4 and IPv6.
    let started = Instant::now();
    apply(
        cluster,
        &format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: api\n  namespace: {NS}\nspec:\n  clusterIP: 10.96.7.7\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n"),
    );
    apply(
        cluster,
        &slice_manifest("api-v4", "IPv4", &["10.244.1.7", "10.244.2.8"]),
    );
    apply(cluster, &slice_manifest("api-v6", "IPv6", &["fd00:244::7"]));
    let want = prefixes(&[
        "10.96.7.7/32",
        "10.244.1.7/32",
        "10.244.2.8/32",
        "fd00:244::7/128",
    ]);
    wait_for(
        "the Service's addresses in the set",
        Duration::from_secs(20),
        || pinned_allow(&egress_pins, cgroup).filter(|(a, _)| *a == want),
    );
    println!(
        "ClusterIP and endpoints programmed {:?} after the apply",
        started.elapsed()
    );
    wait_for(
        "the shard without the unresolved name",
        Duration::from_secs(20),
        || {
            shard_message(cluster)
                .filter(|m| !m.contains("Services without addresses"))
                .map(|_| ())
        },
    );

    // An endpoint replaced: the set follows by diff.
    let changed = Instant::now();
    apply(
        cluster,
        &slice_manifest("api-v4", "IPv4", &["10.244.1.7", "10.244.3.9"]),
    );
    let want = prefixes(&[
        "10.96.7.7/32",
        "10.244.1.7/32",
        "10.244.3.9/32",
        "fd00:244::7/128",
    ]);
    wait_for(
        "the changed endpoint in the set",
        Duration::from_secs(20),
        || pinned_allow(&egress_pins, cgroup).filter(|(a, _)| *a == want),
    );
    println!(
        "EndpointSlice change followed {:?} after the apply",
        changed.elapsed()
    );

    // The Service deleted: every address goes, though its slices remain.
    let deleted = Instant::now();
    cluster
        .kubectl_ok(&["delete", "service", "api", "-n", NS])
        .unwrap();
    wait_for("the addresses removed", Duration::from_secs(20), || {
        pinned_allow(&egress_pins, cgroup).filter(|(a, _)| a.is_empty())
    });
    println!(
        "Service deletion removed its addresses {:?} after the delete",
        deleted.elapsed()
    );
    let (_, domains) = pinned_allow(&egress_pins, cgroup).unwrap();
    assert_eq!(domains, prefixes(&["allowed.test"]), "the domain stays");

    let (status, took, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    println!("daemon stopped in {took:?}");
    assert!(
        log.iter().any(|l| l.contains("the Service has no address")),
        "the unresolved Service is logged"
    );
    for kind in ["endpointslice", "service"] {
        let _ = cluster.kubectl_output(&["delete", kind, "--all", "-n", NS]);
    }
    let _ = cluster.kubectl_output(&["delete", "rpol", "svc-allow"]);
    let _ = cluster.kubectl_output(&[
        "delete",
        "pod",
        "svc-web",
        "-n",
        NS,
        "--grace-period=0",
        "--force",
    ]);
}
