//! Tier 4: the real daemon in a VM node joined to the local API server.
//!
//! The host half starts the local control plane (ci/kube-up), boots a 6.12
//! guest with `bpf` in `lsm=` whose only network is a forward to that API
//! server, and runs this same program inside. The guest half plays the
//! kubelet and the controllers: it registers the Node, the daemon's
//! DaemonSet and pod, creates container cgroups in the cgroupfs layout
//! containerd uses, starts workload processes in them and writes their Pod
//! objects; then it runs `kyverno-runtime daemon` and checks what an
//! operator would:
//!
//! - `demo`: an enforce policy refuses an exec, a monitor policy over
//!   network egress observes a connection, and both reach the pod's Report;
//!   the host half then prints `kubectl get rpol` and the Report.
//! - `restart` (also runs `demo` first): SIGTERM, and while no daemon runs
//!   the denied exec stays denied (pinned programs and maps); a policy
//!   deleted meanwhile still applies until the next daemon has adopted and
//!   reconciled the pins, then stops; deleting the DaemonSet (an uninstall)
//!   makes the next shutdown remove every pin, and the exec is allowed.
//!
//! `daemon_vm [demo|restart]` on the host; `daemon_vm guest MODE` inside.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODE: &str = "vm-6-12-bpf";
const SYSTEM_NS: &str = "kyverno-runtime";
const DAEMONSET: &str = "kyverno-runtime";
const APP_NS: &str = "demo";
const PINS: &str = "/sys/fs/bpf/kyverno-runtime";
const FORBIDDEN: &str = "/usr/local/bin/forbidden";
const OTHER: &str = "/usr/local/bin/other";
/// A program the exec-monitor example reports, with its arguments.
const TOOL: &str = "/usr/local/bin/tool";
const GUEST_KUBECONFIG: &str = "/etc/kyverno-runtime/kubeconfig";
/// A monitor policy watches egress to this address; the workload connects.
const WATCHED: &str = "127.0.0.2";
const WATCHED_PORT: u16 = 8080;
/// An enforce policy of the restart check denies egress to this address.
const DENIED_NET: &str = "127.0.0.4";

const CHILD_OK: u8 = 0;
const CHILD_REFUSED: u8 = 13;
const CHILD_ERROR: u8 = 2;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("guest") => guest(args.get(1).map_or("restart", String::as_str)),
        Some("child") => child(&args[1..]),
        Some(mode @ ("demo" | "restart")) => host(mode),
        None => host("restart"),
        // libtest-style flags (`cargo test` passes some): run the default.
        Some(other) if other.starts_with('-') => host("restart"),
        Some(other) => {
            eprintln!("usage: daemon_vm [demo|restart] (got {other})");
            ExitCode::from(2)
        }
    }
}

// ================================================================ host

fn host(mode: &str) -> ExitCode {
    let cluster =
        kyverno_runtime_testkube::LocalCluster::get().expect("local control plane (ci/kube-up)");
    let daemon_bin = PathBuf::from(env!("CARGO_BIN_EXE_kyverno-runtime"));
    // The CRDs from the chart, and the example policies, as an operator
    // would apply them.
    let repo = kyverno_runtime_testkube::repo_root();
    for dir in [
        "charts/kyverno-runtime/crds",
        "charts/kyverno-runtime/files/openreports",
    ] {
        let dir = repo.join(dir);
        cluster
            .kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                dir.to_str().unwrap(),
            ])
            .unwrap();
    }
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/runtimepolicies.runtime.nirmata.io",
            "crd/reports.openreports.io",
        ])
        .unwrap();

    // Left by an interrupted restart check: not part of the demo.
    cluster
        .kubectl_ok(&[
            "delete",
            "rpol",
            "demo-deny-other",
            "demo-deny-net",
            "demo-watch-dns-ssh",
            "--ignore-not-found",
        ])
        .unwrap();
    for example in [
        "examples/deny-exec.yaml",
        "examples/watch-egress.yaml",
        "examples/watch-exec.yaml",
    ] {
        println!("$ kubectl apply -f {example}");
        let path = repo.join(example);
        print!(
            "{}",
            cluster
                .kubectl_ok(&["apply", "-f", path.to_str().unwrap()])
                .unwrap()
        );
    }

    // The guest's kubeconfig: the admin one, pointed at the forward.
    let mut config: serde_json::Value = serde_json::from_str(
        &cluster
            .kubectl_ok(&["config", "view", "--raw", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_string();
    let port: u16 = server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    config["clusters"][0]["cluster"]["server"] =
        format!("https://{}:{port}", vmtest::FORWARD_ADDR).into();
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    std::fs::write(&kubeconfig, config.to_string()).unwrap();

    // Stripped copies keep the initramfs (and so the boot) small.
    let bins = work.path().join("bin");
    std::fs::create_dir_all(&bins).unwrap();
    let strip = |from: &Path, name: &str| {
        let to = bins.join(name);
        let ok = Command::new("strip")
            .arg("--strip-debug")
            .arg(from)
            .arg("-o")
            .arg(&to)
            .status()
            .unwrap();
        assert!(ok.success(), "strip {}", from.display());
        to
    };
    let me = strip(&std::env::current_exe().unwrap(), "daemon_vm");
    let daemon = strip(&daemon_bin, "kyverno-runtime");

    let cache = vmtest::Cache::from_env().unwrap();
    let kernel = vmtest::resolve_kernel(vmtest::KernelSeries::V6_12, &cache).unwrap();
    let mut spec = vmtest::VmSpec::new(
        kernel,
        vmtest::LsmMode::Bpf,
        vec!["daemon_vm".into(), "guest".into(), mode.into()],
    );
    spec.binaries = vec![me, daemon];
    spec.files = vec![(kubeconfig, PathBuf::from(GUEST_KUBECONFIG))];
    spec.env = vec![
        ("KUBECONFIG".into(), GUEST_KUBECONFIG.into()),
        (
            "KRT_VERBOSE".into(),
            std::env::var("KRT_VERBOSE").unwrap_or_default(),
        ),
    ];
    spec.host_forwards = vec![vmtest::HostForward::new(port, port)];
    spec.memory_mib = 1024;
    spec.timeout = Duration::from_secs(900);
    println!(
        "booting {} (lsm=bpf) as node {NODE}, API server {server} forwarded to {}:{port}",
        spec.kernel.version,
        vmtest::FORWARD_ADDR
    );
    let outcome = vmtest::run(&spec).unwrap();
    print!("{}", outcome.output);
    if outcome.exit_code != 0 {
        eprintln!(
            "guest exited {} after {:?}; console:\n{}",
            outcome.exit_code, outcome.duration, outcome.console
        );
        return ExitCode::FAILURE;
    }
    println!("guest finished in {:.1}s", outcome.duration.as_secs_f64());
    if mode == "demo" {
        println!("\n$ kubectl get rpol");
        print!("{}", cluster.kubectl_ok(&["get", "rpol"]).unwrap());
        println!("\n$ kubectl get rpol demo-deny-exec -o jsonpath='{{.status.nodes}}'");
        println!(
            "{}",
            cluster
                .kubectl_ok(&[
                    "get",
                    "rpol",
                    "demo-deny-exec",
                    "-o",
                    "jsonpath={.status.nodes}"
                ])
                .unwrap()
        );
        println!("\n$ kubectl get events -n {APP_NS} --field-selector reason=PolicyViolation");
        print!(
            "{}",
            cluster
                .kubectl_ok(&[
                    "get",
                    "events",
                    "-n",
                    APP_NS,
                    "--field-selector",
                    "reason=PolicyViolation"
                ])
                .unwrap()
        );
        println!("\n$ kubectl get reports -n {APP_NS}");
        print!(
            "{}",
            cluster
                .kubectl_ok(&["get", "reports", "-n", APP_NS])
                .unwrap()
        );
        let report = cluster
            .kubectl_ok(&[
                "get",
                "report",
                "kyverno-runtime-web",
                "-n",
                APP_NS,
                "-o",
                "json",
            ])
            .unwrap();
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        println!("\nReport {APP_NS}/kyverno-runtime-web results:");
        println!(
            "{:<22} {:<9} {:<28} {:<7} {:<9} {:>5}",
            "POLICY", "BEHAVIOR", "TARGET", "RESULT", "ENFORCED", "COUNT"
        );
        for r in report["results"].as_array().into_iter().flatten() {
            let p = &r["properties"];
            println!(
                "{:<22} {:<9} {:<28} {:<7} {:<9} {:>5}",
                r["policy"].as_str().unwrap_or(""),
                r["rule"].as_str().unwrap_or(""),
                p["target"].as_str().unwrap_or(""),
                r["result"].as_str().unwrap_or(""),
                p["enforced"].as_str().unwrap_or(""),
                p["count"].as_str().unwrap_or(""),
            );
        }
    }
    ExitCode::SUCCESS
}

// ================================================================ child

/// `child <cgroup.procs> exec <path>` / `child <cgroup.procs> connect
/// <ip:port>`: joins the cgroup, does the operation, exits 0, 13 (EPERM)
/// or 2.
fn child(args: &[String]) -> ExitCode {
    let [procs, op, target] = args else {
        return ExitCode::from(CHILD_ERROR);
    };
    if let Err(e) = std::fs::write(procs, std::process::id().to_string()) {
        eprintln!("child: joining {procs}: {e}");
        return ExitCode::from(CHILD_ERROR);
    }
    let result = match op.as_str() {
        // A busybox copy run as `true`.
        "exec" => Command::new(target).arg0("true").status().and_then(|s| {
            if s.success() {
                Ok(())
            } else {
                Err(std::io::Error::other("the program failed"))
            }
        }),
        // `run "<path> <args>..."`: a busybox copy run as `true` with
        // these arguments (the exec tracer records them).
        "run" => {
            let mut words = target.split(' ');
            let path = words.next().unwrap_or_default();
            Command::new(path)
                .arg0("true")
                .args(words)
                .status()
                .and_then(|s| {
                    if s.success() {
                        Ok(())
                    } else {
                        Err(std::io::Error::other("the program failed"))
                    }
                })
        }
        // A dropped SYN is retried, not reported, so a bounded wait that
        // times out counts as refused (the target listens on loopback: in
        // this guest nothing else can make it time out).
        "connect" => target
            .parse()
            .map_err(std::io::Error::other)
            .and_then(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)))
            .map(drop)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    std::io::Error::from_raw_os_error(1)
                } else {
                    e
                }
            }),
        // An ssh client's first bytes: the classifier names the flow `ssh`.
        "ssh" => std::net::TcpStream::connect(target.as_str()).and_then(|mut s| {
            use std::io::Write;
            s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n")
        }),
        // One DNS question (type A) for `target` to the loopback resolver.
        "dns" => std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| {
            let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
            for label in target.split('.') {
                q.push(u8::try_from(label.len()).unwrap_or(63));
                q.extend_from_slice(label.as_bytes());
            }
            q.extend_from_slice(&[0, 0, 1, 0, 1]);
            s.send_to(&q, ("127.0.0.1", 53)).map(drop)
        }),
        _ => Err(std::io::Error::other("unknown op")),
    };
    match result {
        Ok(()) => ExitCode::from(CHILD_OK),
        Err(e) if e.raw_os_error() == Some(1) => ExitCode::from(CHILD_REFUSED),
        Err(e) => {
            eprintln!("child: {op} {target}: {e}");
            ExitCode::from(CHILD_ERROR)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    Refused,
}

fn run_child(procs: &Path, op: &str, target: &str) -> Outcome {
    let status = Command::new("/bin/daemon_vm")
        .args(["child", procs.to_str().unwrap(), op, target])
        .status()
        .unwrap();
    match status.code() {
        Some(0) => Outcome::Done,
        Some(13) => Outcome::Refused,
        other => panic!("child {op} {target} failed ({other:?})"),
    }
}

// ================================================================ guest

struct Guest {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Guest {
    fn ssa<K>(&self, api: &Api<K>, name: &str, value: serde_json::Value) -> K
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        self.rt
            .block_on(api.patch(
                name,
                &PatchParams::apply("daemon-vm").force(),
                &Patch::Apply(value),
            ))
            .unwrap_or_else(|e| panic!("applying {name}: {e}"))
    }

    fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    fn ns<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }
}

impl Guest {
    /// Deletes the workload pod and its Report a previous run left (the
    /// pod with grace 0: no kubelet here confirms a graceful delete).
    fn remove_leftovers(&self) {
        let pods = self.ns::<Pod>(APP_NS);
        let reports = self.ns::<Report>(APP_NS);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = self.rt.block_on(pods.delete("web", &now));
        let _ = self
            .rt
            .block_on(reports.delete("kyverno-runtime-web", &DeleteParams::default()));
        wait_until(
            "the old pod and Report to be gone",
            Duration::from_secs(30),
            || {
                let pod = self.rt.block_on(pods.get_opt("web")).ok()?;
                let report = self
                    .rt
                    .block_on(reports.get_opt("kyverno-runtime-web"))
                    .ok()?;
                (pod.is_none() && report.is_none()).then_some(())
            },
        );
    }
}

/// The daemon as a child, its stderr collected (and echoed with
/// KRT_VERBOSE).
struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn start() -> Daemon {
        let mut child = Command::new("/bin/kyverno-runtime")
            .args([
                "daemon",
                "--metrics-addr",
                "127.0.0.1:9090",
                "--status-interval",
                "2s",
                "--drain-interval",
                "2s",
                "--report-interval",
                "2s",
                "--events-enabled=true",
                "--pin-dir",
                PINS,
            ])
            .env("NODE_NAME", NODE)
            .env("POD_NAMESPACE", SYSTEM_NS)
            .env("DAEMONSET_NAME", DAEMONSET)
            .env("KRT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let verbose = std::env::var("KRT_VERBOSE").is_ok_and(|v| !v.is_empty());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if verbose {
                    eprintln!("daemon| {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Daemon { child, log }
    }

    fn has(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.has(needle) {
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!(
                    "daemon exited ({s}) before {needle:?}:\n{}",
                    self.log.lock().unwrap().join("\n")
                );
            }
            assert!(
                start.elapsed() < timeout,
                "no {needle:?} after {timeout:?}:\n{}",
                self.log.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn terminate(mut self) -> (Duration, Vec<String>) {
        let start = Instant::now();
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = self.child.wait().unwrap();
        let took = start.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        let log = self.log.lock().unwrap().clone();
        assert!(
            status.success(),
            "daemon exit {status}:\n{}",
            log.join("\n")
        );
        (took, log)
    }
}

/// The daemon's event-plane series, for a failure message.
fn metrics_of_interest() -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:9090") else {
        return "(no /metrics)".into();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.contains("events_")
                    || l.contains("findings_")
                    || l.contains("monitor_filter"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn guest(mode: &str) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(kube::Client::try_default())
        .expect("a client from KUBECONFIG");
    let g = Guest { rt, client };
    let started = Instant::now();

    // Exec targets: copies of the static busybox.
    std::fs::create_dir_all("/usr/local/bin").unwrap();
    for t in [FORBIDDEN, OTHER, TOOL] {
        std::fs::copy("/bin/busybox", t).unwrap();
    }
    // A listener for the watched destination, so the connection succeeds
    // (monitor mode refuses nothing).
    let listener = std::net::TcpListener::bind((WATCHED, WATCHED_PORT)).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            drop(s)
        }
    });

    // A previous run's pod and Report must not answer for this one.
    g.remove_leftovers();

    // The cluster objects a kubelet and the controllers would write.
    g.ssa(
        &g.all::<Node>(),
        NODE,
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    );
    for (ns, labels) in [
        (SYSTEM_NS, serde_json::json!({})),
        (APP_NS, serde_json::json!({"team": "payments"})),
    ] {
        g.ssa(&g.all::<Namespace>(), ns, serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}));
        g.ssa(&g.ns::<ServiceAccount>(ns), "default", serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}));
    }
    let ds = g.ssa(&g.ns::<DaemonSet>(SYSTEM_NS), DAEMONSET, serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DAEMONSET},
        "spec": {"selector": {"matchLabels": {"app": "kyverno-runtime"}},
                 "template": {"metadata": {"labels": {"app": "kyverno-runtime"}},
                              "spec": {"containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}}}));
    let ds_uid = ds.metadata.uid.clone().unwrap();
    g.rt.block_on(g.ns::<DaemonSet>(SYSTEM_NS).patch_status(DAEMONSET, &PatchParams::default(), &Patch::Merge(serde_json::json!({
        "status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1, "observedGeneration": ds.metadata.generation}})))).unwrap();
    g.ssa(&g.ns::<Pod>(SYSTEM_NS), "kyverno-runtime-vm", serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kyverno-runtime-vm", "labels": {"app": "kyverno-runtime"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMONSET, "uid": ds_uid, "controller": true}]},
        "spec": {"nodeName": NODE, "containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}));

    // The example policies are applied by the host half; the restart check
    // adds one that it deletes while no daemon runs.
    let policies = g.all::<RuntimePolicy>();
    if mode == "restart" {
        g.ssa(
            &policies,
            "demo-deny-other",
            serde_json::json!({
            "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
            "metadata": {"name": "demo-deny-other"},
            "spec": {"mode": "enforce", "podSelector": {"matchLabels": {"app": "web"}},
                     "behaviors": [{"exec": {"deny": {"values": [OTHER]}}}]}}),
        );
        // And a network deny, enforced by the pinned egress filter.
        g.ssa(
            &policies,
            "demo-deny-net",
            serde_json::json!({
            "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
            "metadata": {"name": "demo-deny-net"},
            "spec": {"mode": "enforce", "podSelector": {"matchLabels": {"app": "web"}},
                     "behaviors": [{"network": {"deny": {"values": [format!("{DENIED_NET}/32")]}}}]}}),
        );
        let listener = std::net::TcpListener::bind((DENIED_NET, WATCHED_PORT)).unwrap();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                drop(s)
            }
        });
    }

    // The workload pod: its object, then its container cgroup (cgroupfs
    // driver, containerd), then the status a kubelet writes.
    let pods = g.ns::<Pod>(APP_NS);
    let pod = g.ssa(
        &pods,
        "web",
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox"}]}}),
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let container = "4d3c2b1a".repeat(8);
    let cgroup = PathBuf::from(format!(
        "/sys/fs/cgroup/kubepods/besteffort/pod{uid}/{container}"
    ));
    std::fs::create_dir_all(&cgroup).unwrap();
    let procs = cgroup.join("cgroup.procs");
    g.rt.block_on(pods.patch_status("web", &PatchParams::default(), &Patch::Merge(serde_json::json!({"status": {
        "phase": "Running", "qosClass": "BestEffort",
        "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "busybox@sha256:0",
                               "containerID": format!("containerd://{container}"), "state": {"running": {}}}]}})))).unwrap();
    println!(
        "[{:>5.1}s] pod {APP_NS}/web running in {}",
        started.elapsed().as_secs_f64(),
        cgroup.display()
    );
    assert_eq!(
        run_child(&procs, "exec", FORBIDDEN),
        Outcome::Done,
        "allowed before any daemon runs"
    );

    let mut daemon = Daemon::start();
    daemon.wait_log("pods on this node listed", Duration::from_secs(120));
    wait_until(
        "the exec deny to take effect",
        Duration::from_secs(60),
        || (run_child(&procs, "exec", FORBIDDEN) == Outcome::Refused).then_some(()),
    );
    println!("[{:>5.1}s] $ {FORBIDDEN}   (in {APP_NS}/web)\n         refused: Operation not permitted (EPERM), policy demo-deny-exec", started.elapsed().as_secs_f64());
    if mode == "restart" {
        wait_until("the second exec deny", Duration::from_secs(30), || {
            (run_child(&procs, "exec", OTHER) == Outcome::Refused).then_some(())
        });
        let denied = format!("{DENIED_NET}:{WATCHED_PORT}");
        wait_until("the network deny", Duration::from_secs(30), || {
            (run_child(&procs, "connect", &denied) == Outcome::Refused).then_some(())
        });
        println!(
            "         $ connect {denied}: dropped (SYN never delivered), policy demo-deny-net"
        );
    }
    assert_eq!(
        run_child(&procs, "exec", "/bin/busybox"),
        Outcome::Done,
        "an exec no policy denies"
    );
    // Outside the pod's cgroup nothing is enforced.
    let outside = PathBuf::from("/sys/fs/cgroup/outside");
    std::fs::create_dir_all(&outside).unwrap();
    assert_eq!(
        run_child(&outside.join("cgroup.procs"), "exec", FORBIDDEN),
        Outcome::Done
    );

    // The watched connection goes through (monitor) and becomes a finding.
    let dest = format!("{WATCHED}:{WATCHED_PORT}");
    assert_eq!(run_child(&procs, "connect", &dest), Outcome::Done);
    println!("[{:>5.1}s] $ connect {dest}   (in {APP_NS}/web)\n         allowed (monitor policy demo-watch-egress)", started.elapsed().as_secs_f64());
    let reports = g.ns::<Report>(APP_NS);
    let results = wait_until(
        "the Report with both findings",
        Duration::from_secs(90),
        || {
            let r =
                g.rt.block_on(reports.get_opt("kyverno-runtime-web"))
                    .ok()??;
            let results = r.spec.results.clone().unwrap_or_default();
            let has = |policy: &str, target: &str| {
                results.iter().any(|x| {
                    x.policy == policy
                        && x.properties
                            .as_ref()
                            .and_then(|p| p.get("target"))
                            .is_some_and(|t| t == target)
                })
            };
            (has("demo-deny-exec", FORBIDDEN) && has("demo-watch-egress", WATCHED))
                .then_some(results)
        },
    );
    for r in &results {
        let p = r.properties.clone().unwrap_or_default();
        println!(
            "         report: {} {} {} enforced={} count={}",
            r.policy,
            r.rule.clone().unwrap_or_default(),
            p.get("target").cloned().unwrap_or_default(),
            p.get("enforced").cloned().unwrap_or_default(),
            p.get("count").cloned().unwrap_or_default()
        );
    }
    // The exec monitor: the tracer's record, its argv redacted, a health
    // check left out by the policy's monitorFilter.
    let traced = |g: &Guest| -> Option<kyverno_runtime_api::openreports::ReportResult> {
        let r =
            g.rt.block_on(reports.get_opt("kyverno-runtime-web"))
                .ok()??;
        r.spec
            .results
            .clone()
            .unwrap_or_default()
            .into_iter()
            .find(|x| {
                x.policy == "demo-watch-exec"
                    && x.properties
                        .as_ref()
                        .and_then(|p| p.get("target"))
                        .is_some_and(|t| t == TOOL)
            })
    };
    let count = |r: &kyverno_runtime_api::openreports::ReportResult| -> u64 {
        r.properties
            .as_ref()
            .and_then(|p| p.get("count"))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    };
    let first = wait_until(
        "the traced exec in the Report",
        Duration::from_secs(90),
        || {
            assert_eq!(
                run_child(&procs, "run", &format!("{TOOL} --token=s3cr3t -v")),
                Outcome::Done
            );
            traced(&g)
        },
    );
    // Quiet for two report intervals, so the count read is final.
    std::thread::sleep(Duration::from_secs(5));
    let first = traced(&g).unwrap_or(first);
    // Three health checks, then the same call once more: only the last is
    // a finding, so the count grows by exactly one.
    for _ in 0..3 {
        assert_eq!(
            run_child(&procs, "run", &format!("{TOOL} --health")),
            Outcome::Done
        );
    }
    assert_eq!(
        run_child(&procs, "run", &format!("{TOOL} --token=s3cr3t -v")),
        Outcome::Done
    );
    let grown = wait_until("the next traced exec", Duration::from_secs(30), || {
        traced(&g).filter(|r| count(r) > count(&first))
    });
    // Two more report intervals: nothing else arrives.
    std::thread::sleep(Duration::from_secs(5));
    let last = traced(&g).unwrap_or_else(|| grown.clone());
    assert_eq!(
        count(&last),
        count(&first) + 1,
        "the health checks were not filtered out by the monitorFilter; the daemon's counters:\n{}",
        metrics_of_interest()
    );
    let p = last.properties.clone().unwrap_or_default();
    let argv = p.get("argv").cloned().unwrap_or_default();
    println!(
        "[{:>5.1}s] $ {TOOL} --token=s3cr3t -v   (in {APP_NS}/web; 3x {TOOL} --health, filtered out)\n         report: demo-watch-exec exec {TOOL} enforced={} count={} pid={} comm={} argv={argv:?}",
        started.elapsed().as_secs_f64(),
        p.get("enforced").cloned().unwrap_or_default(),
        count(&last),
        p.get("pid").cloned().unwrap_or_default(),
        p.get("comm").cloned().unwrap_or_default(),
    );
    assert!(
        argv.starts_with("true --token=") && argv.ends_with(" -v"),
        "{argv}"
    );
    assert!(
        !argv.contains("s3cr3t"),
        "the argv reached the Report unredacted: {argv}"
    );

    // The refusal is also a Kubernetes Event on the pod.
    let events = g.ns::<k8s_openapi::api::events::v1::Event>(APP_NS);
    let event = wait_until(
        "a PolicyViolation Event on the pod",
        Duration::from_secs(60),
        || {
            let list = g.rt.block_on(events.list(&Default::default())).ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PolicyViolation")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
            })
        },
    );
    println!(
        "         event: {} {}",
        event.reason.clone().unwrap_or_default(),
        event.note.clone().unwrap_or_default()
    );
    // Status shows this node enforcing with the BPF-LSM backend.
    let rp = wait_until("this node's shard", Duration::from_secs(30), || {
        let rp = g.rt.block_on(policies.get("demo-deny-exec")).ok()?;
        let shard = rp
            .status
            .as_ref()?
            .nodes
            .iter()
            .find(|s| s.node_name == NODE)?
            .clone();
        (shard.enforcement_available == Some(true)).then_some(shard)
    });
    let exec_backend = rp
        .backends
        .iter()
        .find(|b| b.behavior == "exec")
        .map(|b| b.backend.clone());
    assert_eq!(exec_backend.as_deref(), Some("bpf_lsm"), "{rp:?}");
    if mode == "restart" {
        // Protocol and DNS observation through the same daemon: a monitor
        // policy reporting every question and ssh flows.
        g.ssa(
            &policies,
            "demo-watch-dns-ssh",
            serde_json::json!({
            "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
            "metadata": {"name": "demo-watch-dns-ssh"},
            "spec": {"mode": "monitor", "podSelector": {"matchLabels": {"app": "web"}},
                     "behaviors": [{"dns": {"deny": {"values": ["*"]}}},
                                   {"protocol": {"deny": {"values": ["ssh"]}}}]}}),
        );
        let resolver = std::net::UdpSocket::bind("127.0.0.1:53").unwrap();
        let ssh_listener = std::net::TcpListener::bind("127.0.0.1:2222").unwrap();
        std::thread::spawn(move || {
            for s in ssh_listener.incoming().flatten() {
                drop(s)
            }
        });
        let results = wait_until(
            "dns and protocol findings in the Report",
            Duration::from_secs(90),
            || {
                // Repeated until the policy is programmed (the first tries may
                // come before the daemon has seen it).
                assert_eq!(run_child(&procs, "dns", "www.example.com"), Outcome::Done);
                assert_eq!(run_child(&procs, "ssh", "127.0.0.1:2222"), Outcome::Done);
                let r =
                    g.rt.block_on(reports.get_opt("kyverno-runtime-web"))
                        .ok()??;
                let results = r.spec.results.clone().unwrap_or_default();
                let has = |rule: &str, target: &str| {
                    results.iter().any(|x| {
                        x.policy == "demo-watch-dns-ssh"
                            && x.rule.as_deref() == Some(rule)
                            && x.properties
                                .as_ref()
                                .and_then(|p| p.get("target"))
                                .is_some_and(|t| t == target)
                    })
                };
                (has("dns", "www.example.com") && has("protocol", "ssh")).then_some(results)
            },
        );
        drop(resolver);
        for r in results.iter().filter(|r| r.policy == "demo-watch-dns-ssh") {
            let p = r.properties.clone().unwrap_or_default();
            println!(
                "         report: {} {} {} count={}",
                r.policy,
                r.rule.clone().unwrap_or_default(),
                p.get("target").cloned().unwrap_or_default(),
                p.get("count").cloned().unwrap_or_default()
            );
        }
        g.rt.block_on(policies.delete("demo-watch-dns-ssh", &DeleteParams::default()))
            .unwrap();
    }
    if mode == "demo" {
        let (took, _) = daemon.terminate();
        println!(
            "[{:>5.1}s] daemon stopped in {took:?}",
            started.elapsed().as_secs_f64()
        );
        return ExitCode::SUCCESS;
    }

    // ---- restart: no gap, adoption, reconciliation ------------------------
    let stop = Arc::new(AtomicBool::new(false));
    let allowed_during_restart = Arc::new(Mutex::new(Vec::new()));
    let checks = Arc::new(Mutex::new(0u32));
    let poller = {
        let (stop, allowed, checks, procs) = (
            stop.clone(),
            allowed_during_restart.clone(),
            checks.clone(),
            procs.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if run_child(&procs, "exec", FORBIDDEN) == Outcome::Done
                    || run_child(&procs, "connect", &format!("{DENIED_NET}:{WATCHED_PORT}"))
                        == Outcome::Done
                {
                    allowed.lock().unwrap().push(Instant::now());
                }
                *checks.lock().unwrap() += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let (took, _) = daemon.terminate();
    println!(
        "[{:>5.1}s] SIGTERM: daemon stopped in {took:?}; pins kept: {}",
        started.elapsed().as_secs_f64(),
        Path::new(PINS).join("openexec").exists()
    );
    assert!(
        Path::new(PINS).join("openexec").exists(),
        "the pins must survive a restart"
    );
    g.rt.block_on(policies.delete("demo-deny-other", &DeleteParams::default()))
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        run_child(&procs, "exec", FORBIDDEN),
        Outcome::Refused,
        "no daemon: still denied"
    );
    assert_eq!(
        run_child(&procs, "exec", OTHER),
        Outcome::Refused,
        "deleted while no daemon ran: the kernel still holds it"
    );
    println!("[{:>5.1}s] no daemon running: {FORBIDDEN} refused, {OTHER} (policy deleted meanwhile) still refused", started.elapsed().as_secs_f64());
    let mut daemon = Daemon::start();
    daemon.wait_log("reconciling pinned state", Duration::from_secs(120));
    wait_until(
        "the deleted policy to stop applying",
        Duration::from_secs(30),
        || (run_child(&procs, "exec", OTHER) == Outcome::Done).then_some(()),
    );
    stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    let gaps = allowed_during_restart.lock().unwrap().len();
    println!("[{:>5.1}s] new daemon reconciled: {OTHER} allowed; {FORBIDDEN} and {DENIED_NET} refused in all {} checks across the restart", started.elapsed().as_secs_f64(), checks.lock().unwrap());
    assert_eq!(
        gaps, 0,
        "the denied exec was allowed {gaps} time(s) during the restart"
    );
    assert_eq!(run_child(&procs, "exec", FORBIDDEN), Outcome::Refused);

    // ---- uninstall: the DaemonSet goes, the pins go ------------------------
    g.rt.block_on(
        g.ns::<DaemonSet>(SYSTEM_NS)
            .delete(DAEMONSET, &DeleteParams::default()),
    )
    .unwrap();
    daemon.wait_log(
        "the daemon's DaemonSet was deleted",
        Duration::from_secs(30),
    );
    let (_, log) = daemon.terminate();
    assert!(
        log.iter().any(|l| l.contains("removed every pin")),
        "{}",
        log.join("\n")
    );
    assert!(!Path::new(PINS).exists(), "pins left after the uninstall");
    wait_until(
        "the exec to be allowed after the uninstall",
        Duration::from_secs(10),
        || (run_child(&procs, "exec", FORBIDDEN) == Outcome::Done).then_some(()),
    );
    wait_until(
        "the connection to be allowed after the uninstall",
        Duration::from_secs(10),
        || {
            (run_child(&procs, "connect", &format!("{DENIED_NET}:{WATCHED_PORT}")) == Outcome::Done)
                .then_some(())
        },
    );
    println!(
        "[{:>5.1}s] DaemonSet deleted, SIGTERM: every pin removed, {FORBIDDEN} and {DENIED_NET} allowed again",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
