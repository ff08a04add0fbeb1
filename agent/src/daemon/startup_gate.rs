//! The daemon's side of the startup gate (`--startup-gate`, the chart's
//! `daemon.startupGate`; the gate itself is
//! [`kyverno_runtime_nri::gate`]): the daemon copies its own binary into
//! the container runtime's NRI plugin directory with the gate's
//! configuration beside it, and once it enforces (its first full
//! reconcile done, and its own NRI plugin registered when it has one) it
//! writes the ready file that opens the gate. After a reboot the runtime
//! starts the gate before the kubelet can start a container, and the ready
//! file (on the node's `/run`) is gone until this daemon writes it again.
//!
//! What it writes on the node it can prove its own: the plugin only where
//! no plugin of that name is, or where the configuration beside it says
//! [`INSTALLED_BY`]; the same proof before it removes them (at an
//! uninstall, or when the gate is turned off).

use kyverno_runtime_nri::gate::{GateConfig, GATE_INDEX, GATE_NAME, HELD_FILE_NAME, INSTALLED_BY};
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The gate's files on the node, as this process reaches them.
#[derive(Clone, Debug)]
pub struct GatePaths {
    /// `PLUGIN_DIR/00-kyverno-runtime-gate`.
    pub plugin: PathBuf,
    /// `CONFIG_DIR/00-kyverno-runtime-gate.conf`.
    pub config: PathBuf,
    /// The ready file.
    pub ready: PathBuf,
    /// The count of held creations the gate writes beside it.
    pub held: PathBuf,
}

impl GatePaths {
    /// The files under `plugin_dir` and `config_dir` (the runtime's NRI
    /// `plugin_path` and `plugin_config_path`) and at `ready_file`, every
    /// one a node path reached through `host_root`.
    pub fn new(host_root: &Path, plugin_dir: &Path, config_dir: &Path, ready_file: &Path) -> Self {
        let name = format!("{GATE_INDEX}-{GATE_NAME}");
        let reach = |p: &Path| kyverno_runtime_compat::reach(host_root, p);
        let ready = reach(ready_file);
        Self {
            plugin: reach(&plugin_dir.join(&name)),
            config: reach(&config_dir.join(format!("{name}.conf"))),
            held: ready.with_file_name(HELD_FILE_NAME),
            ready,
        }
    }

    /// Whether the configuration there is this daemon's (the proof that
    /// the plugin beside it is too).
    fn ours(&self) -> bool {
        std::fs::read_to_string(&self.config)
            .ok()
            .and_then(|text| GateConfig::parse(&text).ok())
            .is_some()
    }
}

/// Installs the gate: `config` (its `readyFile` a node path) and a copy of
/// `exe`. Refuses, touching nothing, a plugin of that name that is not
/// this daemon's. Says what it did.
pub fn install(paths: &GatePaths, config: &GateConfig, exe: &Path) -> Result<&'static str, String> {
    let plugin_there = paths.plugin.symlink_metadata().is_ok();
    if plugin_there && !paths.ours() {
        return Err(format!(
            "{} exists and {} does not say installedBy {INSTALLED_BY:?}: not replaced",
            paths.plugin.display(),
            paths.config.display()
        ));
    }
    let text = serde_json::to_string_pretty(config).map_err(|e| e.to_string())?;
    // The configuration first: the gate never starts without it (and
    // without it, it would let everything through).
    write_replacing(&paths.config, text.as_bytes(), 0o644)?;
    if plugin_there && same_contents(exe, &paths.plugin).unwrap_or(false) {
        return Ok("already installed");
    }
    // Streamed, not read whole: the binary is larger than the daemon's
    // memory limit leaves room for (measured: a debug build read whole
    // got the daemon OOM-killed).
    let binary = std::fs::File::open(exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
    write_replacing(&paths.plugin, binary, 0o755)?;
    Ok(if plugin_there {
        "replaced"
    } else {
        "installed"
    })
}

/// Removes the gate when the configuration says it is this daemon's;
/// `Ok(false)`: none of ours there. The gate the runtime is running stays
/// running until the runtime restarts, so the ready file is written, not
/// removed: that gate then holds nothing (measured: a gate removed with
/// its ready file held every new container on the node for its 10
/// minutes). `/run` empties at the next boot, when no gate starts.
pub fn remove(paths: &GatePaths) -> Result<bool, String> {
    if !paths.ours() {
        return Ok(false);
    }
    open(paths)?;
    // The plugin first: a configuration without its plugin is inert.
    for path in [&paths.plugin, &paths.config, &paths.held] {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", path.display())),
        }
    }
    Ok(true)
}

/// Opens the gate (writes the ready file); returns how many creations the
/// gate held since the runtime started it.
pub fn open(paths: &GatePaths) -> Result<u64, String> {
    write_replacing(
        &paths.ready,
        &b"kyverno-runtime enforces on this node\n"[..],
        0o644,
    )?;
    Ok(std::fs::read_to_string(&paths.held)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0))
}

/// Writes `bytes` at `path` through a file beside it and a rename, so the
/// runtime never launches (or reads) half a file. The file beside it is
/// not executable until renamed, and the runtime's discovery skips what is
/// not executable: a crash between the two leaves nothing it would run.
fn write_replacing(path: &Path, mut from: impl std::io::Read, mode: u32) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(".{}.kyverno-runtime.tmp", name.to_string_lossy()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut file| {
            std::io::copy(&mut from, &mut file)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)))
        .and_then(|()| std::fs::rename(&tmp, path))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing {}: {e}", path.display())
    })
}

/// Whether the two files hold the same bytes.
fn same_contents(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// The ready file on the node: on `/run`, which a reboot empties.
pub const READY_FILE: &str = "/run/kyverno-runtime/startup-gate.ready";
/// Namespaces the gate never holds whatever the flags say: the cluster's
/// own pods (the network and the proxy the daemon may need to reach the
/// API server run there).
const ALWAYS_NOT_HELD: &str = "kube-system";

/// The gate as the daemon's flags configure it, its files reached through
/// `host_root`; `not_held`: the daemon's own and protected namespaces.
pub fn configured(
    args: &super::DaemonArgs,
    host_root: &Path,
    not_held: impl IntoIterator<Item = String>,
) -> (GatePaths, GateConfig) {
    let paths = GatePaths::new(
        host_root,
        &args.nri_plugin_dir,
        &args.nri_plugin_config_dir,
        Path::new(READY_FILE),
    );
    let not_held_namespaces = not_held
        .into_iter()
        .chain(args.startup_gate_not_held.iter().cloned())
        .chain([ALWAYS_NOT_HELD.to_string()])
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    let config = GateConfig {
        installed_by: INSTALLED_BY.to_string(),
        ready_file: PathBuf::from(READY_FILE),
        not_held_namespaces,
        hold_at_most_seconds: args.startup_gate_hold_at_most.as_secs(),
    };
    (paths, config)
}

/// At the daemon's start: installs the gate when `enabled`, otherwise
/// removes one this daemon installed before. Logs what it did.
pub fn set_up(paths: &GatePaths, config: &GateConfig, enabled: bool) {
    if !enabled {
        match remove(paths) {
            Ok(true) => {
                tracing::info!(plugin = %paths.plugin.display(), "startup gate off: removed the gate installed before")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e, "startup gate off: the gate installed before could not be removed")
            }
        }
        return;
    }
    let installed = std::env::current_exe()
        .map_err(|e| format!("the daemon's own binary: {e}"))
        .and_then(|exe| install(paths, config, &exe));
    match installed {
        Ok(what) => tracing::info!(
            plugin = %paths.plugin.display(),
            config = %paths.config.display(),
            hold_at_most_s = config.hold_at_most_seconds,
            not_held = ?config.not_held_namespaces,
            "startup gate {what}: after a reboot the runtime holds new containers until this daemon enforces (it takes effect when the runtime next starts)"
        ),
        Err(e) => {
            tracing::error!(error = %e, "startup gate: not installed; after a reboot, containers may start before this daemon enforces")
        }
    }
}

/// Opens the gate once the daemon enforces: `reconciled` (its first full
/// reconcile programmed) and, when the daemon has an NRI plugin,
/// `registered` (starts wait for the daemon from then on). Returns at
/// `stop` too.
pub async fn open_when_enforcing(
    paths: GatePaths,
    mut reconciled: tokio::sync::watch::Receiver<bool>,
    registered: Option<tokio::sync::watch::Receiver<bool>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let ready = async {
        if reconciled.wait_for(|r| *r).await.is_err() {
            return false;
        }
        if let Some(mut registered) = registered {
            tracing::info!(
                "startup gate: reconciled; waiting for the NRI plugin's registration to open it"
            );
            if registered.wait_for(|r| *r).await.is_err() {
                return false;
            }
        }
        true
    };
    tokio::select! {
        ready = ready => {
            if !ready {
                return;
            }
        }
        () = stop => return,
    }
    match open(&paths) {
        Ok(held) => {
            tracing::info!(ready_file = %paths.ready.display(), held, "startup gate open: the daemon enforces; container creations held since the runtime started: {held}")
        }
        Err(e) => {
            tracing::error!(error = %e, "startup gate: the ready file could not be written; the gate holds containers until its bound")
        }
    }
}

/// Runs this process as the gate the runtime launched, over `connection`.
pub fn run_as_gate(
    connection: Result<std::os::unix::net::UnixStream, String>,
) -> std::process::ExitCode {
    use std::io::Write as _;
    // The runtime discards the plugin's output; what it fails on is said
    // anyway, for a person who runs it by hand.
    let ran = connection.and_then(|c| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the gate's runtime: {e}"))?
            .block_on(kyverno_runtime_nri::gate::run(c))
    });
    match ran {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "kyverno-runtime startup gate: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn setup() -> (tempfile::TempDir, GatePaths, GateConfig, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let paths = GatePaths::new(
            root.path(),
            Path::new("/opt/nri/plugins"),
            Path::new("/etc/nri/conf.d"),
            Path::new("/run/kyverno-runtime/startup-gate.ready"),
        );
        let config = GateConfig {
            installed_by: INSTALLED_BY.to_string(),
            ready_file: PathBuf::from("/run/kyverno-runtime/startup-gate.ready"),
            not_held_namespaces: BTreeSet::from(["kube-system".to_string()]),
            hold_at_most_seconds: 600,
        };
        let exe = root.path().join("kyverno-runtime");
        std::fs::write(&exe, b"the daemon's binary").unwrap();
        (root, paths, config, exe)
    }

    #[test]
    fn installed_where_the_runtime_looks_executable_with_its_configuration() {
        let (root, paths, config, exe) = setup();
        assert_eq!(install(&paths, &config, &exe), Ok("installed"));
        let plugin = root.path().join("opt/nri/plugins/00-kyverno-runtime-gate");
        assert_eq!(std::fs::read(&plugin).unwrap(), b"the daemon's binary");
        let mode = std::fs::metadata(&plugin).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        let conf = root
            .path()
            .join("etc/nri/conf.d/00-kyverno-runtime-gate.conf");
        let written = GateConfig::parse(&std::fs::read_to_string(conf).unwrap()).unwrap();
        assert_eq!(written, config);
        // Nothing else: no temporary file is left where the runtime
        // discovers plugins.
        let names: Vec<_> = std::fs::read_dir(root.path().join("opt/nri/plugins"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["00-kyverno-runtime-gate"]);
        assert_eq!(install(&paths, &config, &exe), Ok("already installed"));
        std::fs::write(&exe, b"a newer binary").unwrap();
        assert_eq!(install(&paths, &config, &exe), Ok("replaced"));
        assert_eq!(std::fs::read(&plugin).unwrap(), b"a newer binary");
    }

    #[test]
    fn a_plugin_of_that_name_it_did_not_install_is_left_alone() {
        let (_root, paths, config, exe) = setup();
        std::fs::create_dir_all(paths.plugin.parent().unwrap()).unwrap();
        std::fs::write(&paths.plugin, b"someone else's").unwrap();
        assert!(install(&paths, &config, &exe)
            .unwrap_err()
            .contains("not replaced"));
        assert_eq!(remove(&paths), Ok(false));
        assert_eq!(std::fs::read(&paths.plugin).unwrap(), b"someone else's");
        assert!(!paths.config.exists());
    }

    #[test]
    fn removed_only_when_its_own_leaving_the_running_gate_open() {
        let (_root, paths, config, exe) = setup();
        install(&paths, &config, &exe).unwrap();
        std::fs::create_dir_all(paths.ready.parent().unwrap()).unwrap();
        std::fs::write(&paths.held, "3\n").unwrap();
        let other = paths.ready.with_file_name("someone-elses");
        std::fs::write(&other, "kept").unwrap();
        // Removed before the daemon ever opened it: the gate the runtime
        // runs until it restarts must still let containers through.
        assert!(!paths.ready.exists());
        assert_eq!(remove(&paths), Ok(true));
        for p in [&paths.plugin, &paths.config, &paths.held] {
            assert!(!p.exists(), "{} left", p.display());
        }
        assert!(
            paths.ready.exists(),
            "the running gate would hold everything"
        );
        assert!(other.exists());
        assert_eq!(remove(&paths), Ok(false));
    }

    #[test]
    fn opening_says_how_many_creations_were_held() {
        let (_root, paths, _config, _exe) = setup();
        std::fs::create_dir_all(paths.ready.parent().unwrap()).unwrap();
        std::fs::write(&paths.held, "3\n").unwrap();
        assert_eq!(open(&paths), Ok(3));
        assert!(paths.ready.exists());
    }
}
