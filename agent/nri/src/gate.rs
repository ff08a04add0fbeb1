//! The startup gate (issue 34, the reboot case): a pre-installed NRI
//! plugin that the container runtime itself launches when it starts, so it
//! is there before the kubelet can start any container after a reboot.
//! Until the daemon says it enforces (a file on the node's `/run`, which a
//! reboot empties), it refuses the creation of every container outside the
//! namespaces it must never hold; the kubelet retries a refused creation,
//! so the pods wait instead of running unenforced.
//!
//! The daemon's own NRI plugin ([`crate::plugin`]) cannot do this: it
//! registers from the daemon's pod, which after a reboot starts together
//! with (not before) the node's other pods, and a pinned BPF state does not
//! survive the reboot. The gate is the daemon's own binary, copied into the
//! runtime's plugin directory by the daemon (`--startup-gate`); the runtime
//! runs it with the NRI environment ([`launched_by_runtime`]) and hands it
//! its configuration from its plugin configuration directory.
//!
//! It fails open: a configuration it cannot read, or a hold longer than
//! [`GateConfig::hold_at_most_seconds`] since the runtime started it (a
//! daemon that never comes back, a node whose daemon was removed without
//! its uninstall), lets containers be created; the runtime itself skips a
//! plugin that does not register.

use crate::api::{self, Event};
use crate::api_ttrpc;
use crate::plugin::{event_mask, serve};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use ttrpc::r#async::TtrpcContext;

/// The gate's plugin name: the runtime runs `INDEX-NAME` from its plugin
/// directory and passes the name in [`PLUGIN_NAME_ENV`].
pub const GATE_NAME: &str = "kyverno-runtime-gate";
/// The gate's index: first among the plugins, so a held creation reaches
/// no other plugin.
pub const GATE_INDEX: &str = "00";
/// The value of [`GateConfig::installed_by`] the daemon writes, which is
/// how it knows the plugin and its configuration are its own (it replaces
/// and removes only those).
pub const INSTALLED_BY: &str = "kyverno-runtime";
/// The held-counter file's name, beside the ready file (the gate writes
/// it, the daemon reads it).
pub const HELD_FILE_NAME: &str = "startup-gate.held";
/// Set by the runtime for a plugin it launched: the plugin's name.
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
/// Set by the runtime for a plugin it launched: the descriptor of the
/// plugin's connection.
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";

/// The gate's configuration: the JSON the daemon writes as the plugin's
/// configuration file, which the runtime hands the gate when it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GateConfig {
    /// Who wrote it: [`INSTALLED_BY`].
    pub installed_by: String,
    /// The file whose presence says the daemon enforces on this node (on
    /// the node's `/run`, so a reboot removes it).
    pub ready_file: PathBuf,
    /// Namespaces whose containers are never held: the daemon's own and
    /// the cluster's control pods (a gate that held the daemon would hold
    /// the node for ever).
    pub not_held_namespaces: BTreeSet<String>,
    /// The longest the gate holds containers after the runtime started it;
    /// past it, every creation goes ahead.
    pub hold_at_most_seconds: u64,
}

impl GateConfig {
    /// Reads the runtime's copy of the configuration file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Self =
            serde_json::from_str(text).map_err(|e| format!("the gate's configuration: {e}"))?;
        if config.installed_by != INSTALLED_BY {
            return Err(format!(
                "the gate's configuration: installedBy is {:?}, not {INSTALLED_BY:?}",
                config.installed_by
            ));
        }
        Ok(config)
    }

    /// The held-counter file beside the ready file: how many creations the
    /// gate refused since the runtime started it, for the daemon to report.
    pub fn held_file(&self) -> PathBuf {
        self.ready_file.with_file_name(HELD_FILE_NAME)
    }
}

/// What the gate does with one container's creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Created: why, in words.
    Pass(&'static str),
    /// Refused: the runtime fails the creation with this text, which the
    /// kubelet shows in the pod's events (and retries).
    Hold(String),
}

/// The gate's rule, alone: `config` as the runtime handed it (`None`: none
/// or unreadable), the container's namespace, whether the ready file is
/// there, and how long ago the runtime started the gate.
pub fn decide(
    config: Option<&GateConfig>,
    namespace: &str,
    ready: bool,
    since_start: Duration,
) -> Verdict {
    let Some(config) = config else {
        return Verdict::Pass("no configuration");
    };
    if config.not_held_namespaces.contains(namespace) {
        return Verdict::Pass("namespace not held");
    }
    if ready {
        return Verdict::Pass("the daemon enforces");
    }
    if since_start >= Duration::from_secs(config.hold_at_most_seconds) {
        return Verdict::Pass("held for as long as configured");
    }
    Verdict::Hold(format!(
        "kyverno-runtime startup gate: the node's policies are not enforced yet \
         (no {}); the container is created once the daemon enforces, at most {} s \
         after the runtime started",
        config.ready_file.display(),
        config.hold_at_most_seconds
    ))
}

/// The gate's plugin service.
struct Gate {
    started: Instant,
    config: Mutex<Option<GateConfig>>,
    held: AtomicU64,
}

impl Gate {
    fn verdict(&self, namespace: &str) -> Verdict {
        let config = self
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let ready = config
            .as_ref()
            .is_some_and(|c| c.ready_file.try_exists().unwrap_or(false));
        let verdict = decide(config.as_ref(), namespace, ready, self.started.elapsed());
        if let (Verdict::Hold(_), Some(config)) = (&verdict, &config) {
            let held = self.held.fetch_add(1, Ordering::Relaxed) + 1;
            // Best effort: the count is for the daemon's report; the
            // refusal itself is what holds the container.
            let _ = write_count(&config.held_file(), held);
        }
        verdict
    }
}

/// Writes `count` to `path` through a file beside it and a rename, so a
/// reader never sees half a number.
fn write_count(path: &Path, count: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("held.tmp");
    std::fs::write(&tmp, format!("{count}\n"))?;
    std::fs::rename(&tmp, path)
}

#[async_trait]
impl api_ttrpc::Plugin for Gate {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        // Unreadable: no configuration, so nothing is held (fail open).
        let config = GateConfig::parse(&req.config).ok();
        if let Some(c) = &config {
            if let Some(dir) = c.ready_file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
        }
        *self.config.lock().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(api::ConfigureResponse {
            events: event_mask(&[Event::CREATE_CONTAINER]),
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        Ok(api::SynchronizeResponse {
            more: req.more,
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        Ok(api::Empty::default())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let namespace = req.pod.as_ref().map(|p| p.namespace.as_str()).unwrap_or("");
        match self.verdict(namespace) {
            Verdict::Pass(_) => Ok(api::CreateContainerResponse::default()),
            // Not a deadline or a closed connection: the runtime fails
            // this creation and keeps the plugin.
            Verdict::Hold(text) => Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                ttrpc::Code::UNAVAILABLE,
                text,
            ))),
        }
    }
}

/// The connection a runtime that launched this process as its plugin
/// `GATE_INDEX-GATE_NAME` handed it, or `None` when this process is not
/// that plugin (then it is the daemon's binary run as itself). An `Err`:
/// launched as the gate, without a usable connection.
pub fn launched_by_runtime() -> Option<Result<std::os::unix::net::UnixStream, String>> {
    if std::env::var_os(PLUGIN_NAME_ENV)? != GATE_NAME {
        return None;
    }
    Some(inherited_connection())
}

fn inherited_connection() -> Result<std::os::unix::net::UnixStream, String> {
    let fd: std::os::fd::RawFd = std::env::var(PLUGIN_SOCKET_ENV)
        .map_err(|_| format!("{PLUGIN_SOCKET_ENV} is not set"))?
        .trim()
        .parse()
        .map_err(|_| format!("{PLUGIN_SOCKET_ENV} is not a descriptor number"))?;
    // 0 to 2 are the standard streams, never the plugin's connection.
    if fd < 3 {
        return Err(format!("{PLUGIN_SOCKET_ENV} names descriptor {fd}"));
    }
    // Closed, or not a socket: refused here, before anything owns it
    // (the descriptor's link in /proc stats as what it refers to).
    let meta = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
        return Err(format!("descriptor {fd} is not a socket"));
    }
    #[allow(unsafe_code)]
    // SAFETY: the descriptor is open and a socket (checked above), handed
    // to this process by the runtime for this one use, and taken once,
    // before the process opens anything: nothing else owns it.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok(std::os::unix::net::UnixStream::from(owned))
}

/// Runs the gate over `connection` until the runtime closes it (the
/// runtime stopping); `Err` with why it could not register.
pub async fn run(connection: std::os::unix::net::UnixStream) -> Result<String, String> {
    connection
        .set_nonblocking(true)
        .map_err(|e| format!("the runtime's connection: {e}"))?;
    let trunk = tokio::net::UnixStream::from_std(connection)
        .map_err(|e| format!("the runtime's connection: {e}"))?;
    let gate = Arc::new(Gate {
        started: Instant::now(),
        config: Mutex::new(None),
        held: AtomicU64::new(0),
    });
    serve(trunk, GATE_NAME, GATE_INDEX, gate).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GateConfig {
        GateConfig {
            installed_by: INSTALLED_BY.to_string(),
            ready_file: PathBuf::from("/run/kyverno-runtime/startup-gate.ready"),
            not_held_namespaces: BTreeSet::from(["kube-system".to_string()]),
            hold_at_most_seconds: 600,
        }
    }

    #[test]
    fn a_container_waits_until_the_daemon_enforces() {
        let c = config();
        let early = Duration::from_secs(5);
        assert!(matches!(
            decide(Some(&c), "shop", false, early),
            Verdict::Hold(text) if text.contains("/run/kyverno-runtime/startup-gate.ready")
        ));
        assert_eq!(
            decide(Some(&c), "shop", true, early),
            Verdict::Pass("the daemon enforces")
        );
    }

    #[test]
    fn the_namespaces_it_must_not_hold_are_never_held() {
        assert_eq!(
            decide(Some(&config()), "kube-system", false, Duration::ZERO),
            Verdict::Pass("namespace not held")
        );
    }

    #[test]
    fn it_fails_open_past_its_bound_and_without_a_configuration() {
        let c = config();
        assert_eq!(
            decide(Some(&c), "shop", false, Duration::from_secs(600)),
            Verdict::Pass("held for as long as configured")
        );
        assert_eq!(
            decide(None, "shop", false, Duration::ZERO),
            Verdict::Pass("no configuration")
        );
    }

    #[test]
    fn a_configuration_is_its_own_only_when_it_says_so() {
        let text = serde_json::to_string(&config()).unwrap();
        assert_eq!(GateConfig::parse(&text), Ok(config()));
        let foreign = text.replace(INSTALLED_BY, "someone-else");
        assert!(GateConfig::parse(&foreign)
            .unwrap_err()
            .contains("installedBy"));
        assert!(GateConfig::parse("").is_err());
        assert!(GateConfig::parse("{\"installedBy\": \"kyverno-runtime\"}").is_err());
    }
}
