//! The fault tier's rig (issue 34): a control plane of the test's own
//! whose processes it may stop, kill and restart, and a connect loop in a
//! pod's cgroup that records every connect's outcome.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use super::{root, wait_for};
use kyverno_runtime_testkube::LocalCluster;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The control plane of this test only; stopped (`ci/kube-down --dir`)
/// when dropped, after a SIGCONT in case a failure left it paused.
pub struct OwnCluster {
    dir: PathBuf,
    /// The cluster, for kubectl.
    pub cluster: LocalCluster,
    restarted: Vec<std::process::Child>,
}

/// A process of the control plane, by its pid file's name.
#[derive(Clone, Copy)]
pub enum Part {
    /// kube-apiserver.
    Apiserver,
    /// etcd.
    Etcd,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Apiserver => "kube-apiserver",
            Part::Etcd => "etcd",
        }
    }
}

impl OwnCluster {
    /// Starts a control plane in `dir` (`ci/kube-up --dir`).
    pub fn up(dir: PathBuf) -> OwnCluster {
        let out = Command::new(root().join("ci/kube-up"))
            .arg("--dir")
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "ci/kube-up --dir {}", dir.display());
        let env = String::from_utf8(out.stdout).unwrap();
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap()
                .to_string()
        };
        let cluster = LocalCluster {
            kubeconfig: var("KUBECONFIG").into(),
            bin: var("KRT_KUBE_BIN").into(),
        };
        OwnCluster {
            dir,
            cluster,
            restarted: Vec::new(),
        }
    }

    /// `part`'s PID, from this directory's pid file only, checked against
    /// its command line (which names this directory).
    pub fn pid(&self, part: Part) -> String {
        let pid = std::fs::read_to_string(self.dir.join(format!("{}.pid", part.name()))).unwrap();
        let pid = pid.trim().to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(
            String::from_utf8_lossy(&cmdline).contains(&format!("{}/", self.dir.display())),
            "pid {pid} is not this test's {}",
            part.name()
        );
        pid
    }

    pub fn signal(&self, part: Part, signal: &str) {
        let pid = self.pid(part);
        assert!(Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap()
            .success());
    }

    /// SIGKILLs `part`; returns its command line for [`Self::restart`].
    pub fn kill(&mut self, part: Part) -> Vec<String> {
        let pid = self.pid(part);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        self.signal(part, "KILL");
        // Reap it if this test started it (a restart).
        let pid_n: u32 = pid.parse().unwrap();
        if let Some(i) = self.restarted.iter().position(|c| c.id() == pid_n) {
            let _ = self.restarted.remove(i).wait();
        }
        wait_for(
            "the killed process to exit",
            Duration::from_secs(10),
            || {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
                stat.is_none_or(|s| s.contains(") Z ")).then_some(())
            },
        );
        args
    }

    /// Starts `part` again with `args`, in its own process group, its PID
    /// in the pid file (so `ci/kube-down` stops it).
    pub fn restart(&mut self, part: Part, args: &[String]) {
        use std::os::unix::process::CommandExt as _;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join(format!("{}.log", part.name())))
            .unwrap();
        let child = Command::new(&args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap();
        std::fs::write(
            self.dir.join(format!("{}.pid", part.name())),
            format!("{}\n", child.id()),
        )
        .unwrap();
        self.restarted.push(child);
    }

    pub fn ready(&self) -> bool {
        self.cluster
            .kubectl_output(&["get", "--raw", "/readyz", "--request-timeout=2s"])
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("kube-apiserver.pid")) {
            let _ = Command::new("kill").args(["-CONT", pid.trim()]).status();
        }
        let _ = Command::new(root().join("ci/kube-down"))
            .arg("--dir")
            .arg(&self.dir)
            .status();
        for mut child in self.restarted.drain(..) {
            let _ = child.wait();
        }
    }
}

/// One connect attempt of the loop: to the denied address or the allowed
/// one, whether it connected, and when (seconds since the epoch).
#[derive(Clone, Copy)]
pub struct Sample {
    denied: bool,
    connected: bool,
    at: f64,
}

impl Sample {
    fn violates(self) -> bool {
        self.denied == self.connected
    }
}

/// A bash loop in the pod's cgroup connecting to both addresses in turn
/// (1 s timeout: a dropped SYN shows as the timeout), for the whole test.
pub struct ConnectLoop {
    child: std::process::Child,
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl ConnectLoop {
    pub fn start(cgroup: &Path, denied: SocketAddr, allowed: SocketAddr) -> ConnectLoop {
        let try_ = |a: SocketAddr| {
            format!(
                "timeout 1 bash -c 'exec 3<>/dev/tcp/{}/{}' 2>/dev/null",
                a.ip(),
                a.port()
            )
        };
        let script = format!(
            "echo $$ > {}/cgroup.procs || exit 1\nwhile :; do\n  if {}; then echo \"D 1 $EPOCHREALTIME\"; else echo \"D 0 $EPOCHREALTIME\"; fi\n  if {}; then echo \"A 1 $EPOCHREALTIME\"; else echo \"A 0 $EPOCHREALTIME\"; fi\n  sleep 0.1\ndone",
            cgroup.display(),
            try_(denied),
            try_(allowed)
        );
        use std::os::unix::process::CommandExt as _;
        // Its own process group, so that its children go with it.
        let mut child = Command::new("bash")
            .args(["-c", &script])
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut f = line.split(' ');
                let (Some(who), Some(ok), Some(at)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                sink.lock().unwrap().push(Sample {
                    denied: who == "D",
                    connected: ok == "1",
                    at: at.parse().unwrap_or(0.0),
                });
            }
        });
        ConnectLoop { child, samples }
    }

    pub fn len(&self) -> usize {
        self.samples.lock().unwrap().len()
    }

    /// From sample `from` on: (denied connected, allowed refused, samples,
    /// the longest run of consecutive violations in seconds).
    pub fn since(&self, from: usize) -> (usize, usize, usize, f64) {
        let samples = self.samples.lock().unwrap();
        let window = &samples[from.min(samples.len())..];
        let leaked = window.iter().filter(|s| s.denied && s.connected).count();
        let refused = window.iter().filter(|s| !s.denied && !s.connected).count();
        let (mut longest, mut run_start): (f64, Option<f64>) = (0.0, None);
        for (i, s) in window.iter().enumerate() {
            if s.violates() {
                let start = *run_start.get_or_insert(window[i.saturating_sub(1)].at);
                longest = longest.max(s.at - start);
            } else {
                run_start = None;
            }
        }
        (leaked, refused, window.len(), longest)
    }
}

impl Drop for ConnectLoop {
    fn drop(&mut self) {
        // The group: a connect in flight must not keep the cgroup busy.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for_ok<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// `GET /healthz`: the status code and the body.
pub fn healthz(addr: SocketAddr) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}
