//! Shared harness of the VM-node tests (`daemon_vm`, `propose_vm`): a 6.12
//! guest booted with `bpf` in `lsm=` and joined to the local API server on
//! the host, in which the test plays the kubelet and the controllers and
//! runs the real daemon.
//!
//! - Host: [`apply_crds`], then [`boot_node`] (the guest's kubeconfig
//!   points at a forward of the API server; the test binary and the daemon
//!   go into the initramfs, stripped).
//! - Guest: [`Guest`] (a kube client with server-side apply, the node's
//!   objects, pods with containerd cgroups), [`Daemon`] (the daemon as a
//!   child, its log captured), [`wait_until`].
//! - Workload processes: [`child`] is what the test binary runs as
//!   `<bin> child <cgroup.procs> OP TARGET [OP TARGET]...`; it joins the
//!   cgroup, then does each operation in turn and exits 0 (all done), 13
//!   (one refused: EPERM, or a connection dropped) or 2 (another error).
//!   [`run_child`] and [`run_ops`] start it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The node the guest is.
pub const NODE: &str = "vm-6-12-bpf";
/// The daemon's namespace.
pub const SYSTEM_NS: &str = "kyverno-runtime";
/// The daemon's DaemonSet.
pub const DAEMONSET: &str = "kyverno-runtime";
/// Where the daemon pins its BPF objects.
pub const PINS: &str = "/sys/fs/bpf/kyverno-runtime";
/// The guest's kubeconfig.
pub const GUEST_KUBECONFIG: &str = "/etc/kyverno-runtime/kubeconfig";

/// The child's exit codes.
pub const CHILD_OK: u8 = 0;
/// One operation was refused.
pub const CHILD_REFUSED: u8 = 13;
/// Another error.
pub const CHILD_ERROR: u8 = 2;

// ================================================================ host

/// The local control plane, with the chart's CRDs applied and established.
pub fn apply_crds() -> &'static kyverno_runtime_testkube::LocalCluster {
    let cluster =
        kyverno_runtime_testkube::LocalCluster::get().expect("local control plane (ci/kube-up)");
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
    cluster
}

/// Boots the node and runs `<this test binary> <guest_args>` in it,
/// printing its output; `false` (with the console printed) when the guest
/// failed.
pub fn boot_node(cluster: &kyverno_runtime_testkube::LocalCluster, guest_args: &[&str]) -> bool {
    let daemon_bin = PathBuf::from(env!("CARGO_BIN_EXE_kyverno-runtime"));
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
    let exe = std::env::current_exe().unwrap();
    let me_name = exe.file_name().unwrap().to_string_lossy().into_owned();
    // A test binary's name carries a hash (`daemon_vm-0123abcd`); inside,
    // it is `/bin/<test name>`.
    let me_name = me_name.split('-').next().unwrap().to_string();
    let me = strip(&exe, &me_name);
    let daemon = strip(&daemon_bin, "kyverno-runtime");

    let cache = vmtest::Cache::from_env().unwrap();
    let kernel = vmtest::resolve_kernel(vmtest::KernelSeries::V6_12, &cache).unwrap();
    let mut command = vec![me_name];
    command.extend(guest_args.iter().map(|a| a.to_string()));
    let mut spec = vmtest::VmSpec::new(kernel, vmtest::LsmMode::Bpf, command);
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
    // One retry when the guest kernel itself panicked (TCG guests crash now
    // and then in timer code, even during boot, before any program of ours
    // loads); the crash is printed, not hidden.
    let outcome = match vmtest::run(&spec) {
        Err(e @ vmtest::Error::KernelPanic { .. }) => {
            println!("the guest kernel panicked; booting it again:\n{e}");
            vmtest::run(&spec).unwrap()
        }
        other => other.unwrap(),
    };
    print!("{}", outcome.output);
    if outcome.exit_code != 0 {
        eprintln!(
            "guest exited {} after {:?}; console:\n{}",
            outcome.exit_code, outcome.duration, outcome.console
        );
        return false;
    }
    println!("guest finished in {:.1}s", outcome.duration.as_secs_f64());
    true
}

// ================================================================ child

/// `child <cgroup.procs> OP TARGET [OP TARGET]...`: joins the cgroup, then
/// does each operation:
///
/// - `exec PATH`: runs PATH (a busybox copy) as `true`;
/// - `storm N`: runs /bin/busybox as `true` N times in a row;
/// - `open PATH`: reads the file;
/// - `connect IP:PORT`: a TCP connection, bounded (a dropped SYN is
///   retried, not reported, so a timeout counts as refused);
/// - `ssh IP:PORT`: connects and sends an SSH banner (the classifier names
///   the flow `ssh`);
/// - `http IP:PORT`: connects and sends an HTTP/1.1 request line;
/// - `dns NAME`: one DNS question (type A) to 127.0.0.1:53.
pub fn child(args: &[String]) -> ExitCode {
    let Some((procs, ops)) = args.split_first() else {
        return ExitCode::from(CHILD_ERROR);
    };
    if ops.is_empty() || ops.len() % 2 != 0 {
        eprintln!("child: OP TARGET pairs expected, got {ops:?}");
        return ExitCode::from(CHILD_ERROR);
    }
    if let Err(e) = std::fs::write(procs, std::process::id().to_string()) {
        eprintln!("child: joining {procs}: {e}");
        return ExitCode::from(CHILD_ERROR);
    }
    for pair in ops.chunks(2) {
        let (op, target) = (pair[0].as_str(), pair[1].as_str());
        match operation(op, target) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(1) => return ExitCode::from(CHILD_REFUSED),
            Err(e) => {
                eprintln!("child: {op} {target}: {e}");
                return ExitCode::from(CHILD_ERROR);
            }
        }
    }
    ExitCode::from(CHILD_OK)
}

fn operation(op: &str, target: &str) -> std::io::Result<()> {
    use std::io::Write;
    let send =
        |bytes: &[u8]| std::net::TcpStream::connect(target).and_then(|mut s| s.write_all(bytes));
    match op {
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
        // `storm N`: N execs of the static busybox as `true`, one after
        // the other (the exec trace records each).
        "storm" => {
            let n: u32 = target.parse().map_err(std::io::Error::other)?;
            for _ in 0..n {
                let s = Command::new("/bin/busybox").arg0("true").status()?;
                if !s.success() {
                    return Err(std::io::Error::other("the program failed"));
                }
            }
            Ok(())
        }
        "open" => std::fs::read(target).map(drop),
        // The target listens on loopback: in this guest nothing but a
        // drop can make the connection time out.
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
        "ssh" => send(b"SSH-2.0-OpenSSH_9.6\r\n"),
        "http" => send(b"GET /inventory HTTP/1.1\r\nHost: inventory\r\n\r\n"),
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
    }
}

/// How a child's operations ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// All done.
    Done,
    /// One was refused.
    Refused,
}

/// Runs `ops` in a child that joined the cgroup of `procs`.
pub fn run_ops(procs: &Path, ops: &[(&str, &str)]) -> Outcome {
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(&me);
    cmd.args(["child", procs.to_str().unwrap()]);
    for (op, target) in ops {
        cmd.args([op, target]);
    }
    let status = cmd.status().unwrap();
    match status.code() {
        Some(0) => Outcome::Done,
        Some(13) => Outcome::Refused,
        other => panic!("child {ops:?} failed ({other:?})"),
    }
}

/// Runs one operation in a child that joined the cgroup of `procs`.
pub fn run_child(procs: &Path, op: &str, target: &str) -> Outcome {
    run_ops(procs, &[(op, target)])
}

// ================================================================ guest

/// The guest's view of the cluster.
pub struct Guest {
    /// The runtime the client's calls block on.
    pub rt: tokio::runtime::Runtime,
    /// A client from KUBECONFIG.
    pub client: kube::Client,
}

impl Guest {
    /// A client from KUBECONFIG.
    pub fn connect() -> Guest {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(kube::Client::try_default())
            .expect("a client from KUBECONFIG");
        Guest { rt, client }
    }

    /// Server-side apply of `value` as `name`.
    pub fn ssa<K>(&self, api: &Api<K>, name: &str, value: serde_json::Value) -> K
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

    /// The cluster-scoped API of `K`.
    pub fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// The API of `K` in `ns`.
    pub fn ns<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A namespace with labels, and its default ServiceAccount (no
    /// controller creates it here).
    pub fn namespace(&self, ns: &str, labels: serde_json::Value) {
        self.ssa(&self.all::<Namespace>(), ns, serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}));
        self.ssa(&self.ns::<ServiceAccount>(ns), "default", serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}));
    }

    /// What a kubelet and the DaemonSet controller write for this node:
    /// the Node, the daemon's namespace, DaemonSet (with its status) and
    /// pod.
    pub fn register_node(&self) {
        self.ssa(
            &self.all::<Node>(),
            NODE,
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        );
        self.namespace(SYSTEM_NS, serde_json::json!({}));
        let ds = self.ssa(&self.ns::<DaemonSet>(SYSTEM_NS), DAEMONSET, serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DAEMONSET},
            "spec": {"selector": {"matchLabels": {"app": "kyverno-runtime"}},
                     "template": {"metadata": {"labels": {"app": "kyverno-runtime"}},
                                  "spec": {"containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}}}));
        let ds_uid = ds.metadata.uid.clone().unwrap();
        self.rt.block_on(self.ns::<DaemonSet>(SYSTEM_NS).patch_status(DAEMONSET, &PatchParams::default(), &Patch::Merge(serde_json::json!({
            "status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1, "observedGeneration": ds.metadata.generation}})))).unwrap();
        self.ssa(&self.ns::<Pod>(SYSTEM_NS), "kyverno-runtime-vm", serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kyverno-runtime-vm", "labels": {"app": "kyverno-runtime"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMONSET, "uid": ds_uid, "controller": true}]},
            "spec": {"nodeName": NODE, "containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}));
    }

    /// A running pod as a kubelet makes one: the Pod object (`metadata`
    /// as given, bound to this node, one container `app`), its container
    /// cgroup in containerd's cgroupfs layout, then the status. Returns the
    /// cgroup's `cgroup.procs`.
    pub fn run_pod(
        &self,
        ns: &str,
        name: &str,
        metadata: serde_json::Value,
        container: &str,
    ) -> PathBuf {
        let pods = self.ns::<Pod>(ns);
        let mut metadata = metadata;
        metadata["name"] = name.into();
        let pod = self.ssa(
            &pods,
            name,
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox"}]}}),
        );
        let uid = pod.metadata.uid.clone().unwrap();
        let cgroup = PathBuf::from(format!(
            "/sys/fs/cgroup/kubepods/besteffort/pod{uid}/{container}"
        ));
        std::fs::create_dir_all(&cgroup).unwrap();
        self.rt.block_on(pods.patch_status(name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"status": {
            "phase": "Running", "qosClass": "BestEffort",
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "busybox@sha256:0",
                                   "containerID": format!("containerd://{container}"), "state": {"running": {}}}]}})))).unwrap();
        cgroup.join("cgroup.procs")
    }
}

/// The daemon as a child, its stderr collected (and echoed with
/// KRT_VERBOSE).
pub struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `kyverno-runtime daemon` as this node's daemon pod, with short
    /// intervals.
    pub fn start() -> Daemon {
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

    /// Sends `SIG` (`STOP`, `CONT`, ...) with kill(1).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Its log lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// The last `n` lines of its log, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(n)..].join("\n")
    }

    /// Whether a log line contains `needle`.
    pub fn has(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits for a log line containing `needle`; panics with the log when
    /// the daemon exits first or `timeout` passes.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) {
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

    /// SIGTERM, and the time it took to exit 0, and its log.
    pub fn terminate(mut self) -> (Duration, Vec<String>) {
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

/// The text of the daemon's /metrics (its address in [`Daemon::start`]),
/// or a note that it could not be read.
pub fn metrics() -> String {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:9090") else {
        return "(no /metrics)".into();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// Polls `f` until it returns `Some`; panics after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    wait_for(what, timeout, || f().ok_or_else(String::new))
}

/// Polls `f` until it returns `Ok`; panics after `timeout` with the last
/// `Err`, which says what was still missing.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        let missing = match f() {
            Ok(v) => return v,
            Err(missing) => missing,
        };
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}\n{missing}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
