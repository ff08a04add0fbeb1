//! The real daemon as the DaemonSet would run it on this node: the same
//! binary, NODE_NAME, POD_NAMESPACE and DAEMONSET_NAME set, short intervals
//! so a scenario sees status, drains and Reports within seconds, its log
//! kept for failure messages.

use anyhow::{bail, Context as _};
use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Log lines kept (the tail goes into a failure's log).
const KEPT: usize = 4000;

/// How the daemon is started on this node.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The binary.
    pub bin: PathBuf,
    /// NODE_NAME.
    pub node: String,
    /// POD_NAMESPACE (the DaemonSet's).
    pub system_namespace: String,
    /// DAEMONSET_NAME.
    pub daemonset: String,
    /// --pin-dir.
    pub pin_dir: PathBuf,
    /// --metrics-addr.
    pub metrics_addr: String,
    /// Echo the log (`KRT_VERBOSE`).
    pub verbose: bool,
    /// --dns-resolvers (none: the daemon's default, `auto`).
    pub dns_resolvers: Vec<std::net::IpAddr>,
}

/// The running daemon.
pub struct Daemon {
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
    /// The flags beyond the defaults it was started with.
    pub extra: Vec<String>,
}

impl Daemon {
    /// Starts it with the default flags plus `extra`.
    pub fn start(cfg: &DaemonConfig, extra: &[String]) -> anyhow::Result<Daemon> {
        let mut child = Command::new(&cfg.bin)
            .args([
                "daemon",
                "--metrics-addr",
                &cfg.metrics_addr,
                "--status-interval",
                "1s",
                "--drain-interval",
                "1s",
                "--report-interval",
                "1s",
                "--pin-dir",
            ])
            .arg(&cfg.pin_dir)
            .args((!cfg.dns_resolvers.is_empty()).then(|| {
                let list: Vec<String> = cfg.dns_resolvers.iter().map(ToString::to_string).collect();
                format!("--dns-resolvers={}", list.join(","))
            }))
            .args(extra)
            .env("NODE_NAME", &cfg.node)
            .env("POD_NAMESPACE", &cfg.system_namespace)
            .env("DAEMONSET_NAME", &cfg.daemonset)
            .env("KRT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", cfg.bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (sink, verbose) = (log.clone(), cfg.verbose);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if verbose {
                    eprintln!("daemon| {line}");
                }
                if let Ok(mut l) = sink.lock() {
                    l.push_back(line);
                    if l.len() > KEPT {
                        l.pop_front();
                    }
                }
            }
        });
        Ok(Daemon {
            child,
            log,
            extra: extra.to_vec(),
        })
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> Vec<String> {
        match self.log.lock() {
            Ok(l) => l.iter().skip(l.len().saturating_sub(n)).cloned().collect(),
            Err(_) => Vec::new(),
        }
    }

    fn has(&self, needle: &str) -> bool {
        self.log
            .lock()
            .is_ok_and(|l| l.iter().any(|x| x.contains(needle)))
    }

    /// Whether it has exited (and how).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until its log has a line containing `needle`.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while !self.has(needle) {
            if let Some(s) = self.exited() {
                bail!(
                    "the daemon exited ({s}) before logging {needle:?}:\n{}",
                    self.tail(30).join("\n")
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "the daemon did not log {needle:?} within {timeout:?}:\n{}",
                    self.tail(30).join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// SIGTERM, and waits for the exit (SIGKILL after `timeout`).
    pub fn terminate(mut self, timeout: Duration) -> anyhow::Result<(ExitStatus, Duration)> {
        let start = Instant::now();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        loop {
            if let Some(s) = self.exited() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Ok((s, start.elapsed()));
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!(
                    "the daemon did not exit within {timeout:?} of SIGTERM:\n{}",
                    self.tail(30).join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A node half that failed must not leave its daemon running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
