//! Shared harness of the daemon tests: the daemon as a child process with
//! its log captured, and the Kubernetes objects a kubelet and the
//! controllers would write (there is only an API server here).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use kyverno_runtime_testkube::{repo_root, LocalCluster};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod faults;
pub mod host;
pub mod pki;
pub mod throttle;

/// The local control plane, with every CRD the chart ships applied.
pub fn cluster() -> &'static LocalCluster {
    let cluster = LocalCluster::get().expect("local control plane (ci/kube-up)");
    let out = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["crd", "--all"])
        .output()
        .unwrap();
    assert!(out.status.success());
    apply(cluster, &String::from_utf8(out.stdout).unwrap());
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

/// `kubectl apply --server-side` of a manifest.
pub fn apply(cluster: &LocalCluster, manifest: &str) {
    if let Err(e) = cluster.kubectl_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        manifest,
    ) {
        panic!("kubectl apply failed: {e}\n{manifest}");
    }
}

/// This node's shard (`status.nodes[]`) of policy `policy`, as the API
/// has it now.
pub fn shard(cluster: &LocalCluster, policy: &str, node: &str) -> Option<serde_json::Value> {
    let rp = get_json(cluster, &["rpol", policy])?;
    rp["status"]["nodes"]
        .as_array()?
        .iter()
        .find(|s| s["nodeName"] == node)
        .cloned()
}

/// A `kubectl get -o json` as a value.
pub fn get_json(cluster: &LocalCluster, args: &[&str]) -> Option<serde_json::Value> {
    let mut full = vec!["get", "-o", "json"];
    full.extend_from_slice(args);
    let out = cluster.kubectl_output(&full).unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A namespace with labels.
pub fn namespace(cluster: &LocalCluster, name: &str, labels: &str) {
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels: {{{labels}}}\n"
        ),
    );
    // No kube-controller-manager creates it, and the ServiceAccount
    // admission plugin refuses pods without it.
    apply(
        cluster,
        &format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: {name}\n"),
    );
}

/// Creates a pod bound to `node` and writes its status as a kubelet would:
/// Running, with one container whose id is `container_id`.
pub fn running_pod(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    node: &str,
    labels: &str,
    container_id: &str,
) -> String {
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{{labels}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: main\n    image: busybox\n"
        ),
    );
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "qosClass": "BestEffort",
        "containerStatuses": [{
            "name": "main", "ready": true, "restartCount": 0, "image": "busybox",
            "imageID": "busybox@sha256:0", "containerID": container_id,
            "state": {"running": {}}
        }]
    }});
    cluster
        .kubectl_ok(&[
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ])
        .unwrap();
    get_json(cluster, &["pod", name, "-n", namespace]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Deletes pod `name` at once if a previous run left it (no kubelet here
/// finishes a graceful deletion).
pub fn force_delete_pod(cluster: &LocalCluster, namespace: &str, name: &str) {
    let _ = cluster.kubectl_output(&[
        "delete",
        "pod",
        name,
        "-n",
        namespace,
        "--grace-period=0",
        "--force",
    ]);
}

/// The daemon as a child process, its stderr collected line by line.
pub struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `kyverno-runtime daemon ARGS` with `env` on top of ours.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"));
        cmd.arg("daemon")
            .args(args)
            .env("KRT_LOG", "info,kyverno_runtime=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("KRT_VERBOSE").is_some() {
                    eprintln!("daemon| {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Daemon { child, log }
    }

    /// A copy of the log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            if self.log().iter().any(|l| l.contains(needle)) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the daemon exited ({status}) before logging {needle:?}:\n{}",
                    self.log().join("\n")
                );
            }
            assert!(
                start.elapsed() < timeout,
                "no {needle:?} in the daemon's log after {timeout:?}:\n{}",
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the daemon to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            assert!(
                start.elapsed() < timeout,
                "the daemon still runs after {timeout:?}:\n{}",
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the exit.
    pub fn terminate(mut self, timeout: Duration) -> (ExitStatus, Duration, Vec<String>) {
        let pid = i32::try_from(self.child.id()).unwrap();
        let start = Instant::now();
        // kill(1) rather than kill(2), which keeps the tests free of unsafe.
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader thread collect the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return (status, start.elapsed(), self.log());
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the daemon did not exit within {timeout:?} of SIGTERM:\n{}",
                    self.log().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A test that failed half-way must not leave its daemon running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The daemon on this host's kernel for `pod`'s node `node`: pins on the
/// pod's bpffs, status and drains every second, data sources on loopback
/// allowed (they are internal: refused unless allowed), `/metrics` on
/// `metrics` (empty: none).
pub fn host_daemon(
    cluster: &LocalCluster,
    node: &str,
    pod: &host::HostPod,
    metrics: &str,
) -> Daemon {
    let pins = pod.pins();
    Daemon::start(
        &[
            "--data-http-allow",
            "127.0.0.0/8",
            "--metrics-addr",
            metrics,
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", node),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    )
}

/// A fresh temporary directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The repository root.
pub fn root() -> PathBuf {
    repo_root()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A loopback HTTP server the test controls: it serves `body` as JSON, or,
/// once told to fail, drops every connection unanswered.
pub struct ListServer {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    state: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    delay: std::sync::Arc<std::sync::Mutex<Duration>>,
}

impl ListServer {
    /// Listens on a free loopback port, serving `body`.
    pub fn start(body: &str) -> ListServer {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(std::sync::Mutex::new(Some(body.to_string())));
        let delay = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
        let shared = state.clone();
        let slow = delay.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let wait = *slow.lock().unwrap();
                std::thread::sleep(wait);
                let body = shared.lock().unwrap().clone();
                let Some(body) = body else {
                    drop(conn);
                    continue;
                };
                // The request head, up to its blank line.
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        ListServer { addr, state, delay }
    }

    /// Answers each request only after `wait` from now on (a slow source).
    pub fn delay(&self, wait: Duration) {
        *self.delay.lock().unwrap() = wait;
    }

    /// Serves `body` from now on.
    pub fn serve(&self, body: &str) {
        *self.state.lock().unwrap() = Some(body.to_string());
    }

    /// Drops every connection from now on.
    pub fn fail(&self) {
        *self.state.lock().unwrap() = None;
    }
}

/// The text of /metrics at `addr`.
pub fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of the first series whose line holds every one of `parts`.
pub fn series(text: &str, parts: &[&str]) -> Option<u64> {
    text.lines()
        .find(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The sum of every series whose line holds every one of `parts` (0 when
/// none does).
pub fn series_sum(text: &str, parts: &[&str]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A loopback address with a port nothing listens on now.
pub fn free_loopback() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
