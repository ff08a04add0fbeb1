//! Test fixture for the real local control plane.
//!
//! Tests that talk to Kubernetes run against a real kube-apiserver and etcd
//! on loopback, never a fake. `ci/kube-up` builds (once, cached outside the
//! work tree) and starts them; this fixture finds that cluster:
//!
//! - if `KUBECONFIG` and `KRT_KUBE_BIN` are set (as `eval "$(ci/kube-up)"`
//!   leaves them, which is what `ci/test` does), it uses that cluster;
//! - otherwise it runs `ci/kube-up` itself, which reuses a healthy cluster
//!   already running in the default directory in a fraction of a second.
//!
//! The cluster outlives the test process on purpose, so the next test
//! binary starts in milliseconds; `ci/kube-down` stops it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// Errors of the fixture.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `ci/kube-up` could not be run or failed.
    #[error("ci/kube-up failed: {0}")]
    KubeUp(String),
    /// kubectl could not be started.
    #[error("running kubectl: {0}")]
    Spawn(#[from] std::io::Error),
    /// kubectl exited non-zero.
    #[error("kubectl {args} failed: {stderr}")]
    Kubectl {
        /// The arguments.
        args: String,
        /// What kubectl printed on stderr.
        stderr: String,
    },
}

/// The result type of the fixture.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A running local control plane.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    /// The admin kubeconfig (client certificate in group system:masters).
    pub kubeconfig: PathBuf,
    /// The directory holding kubectl, kube-apiserver and etcd.
    pub bin: PathBuf,
}

/// The repository root, found from this crate's manifest directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl LocalCluster {
    /// The cluster for this test process, started or found on first use.
    pub fn get() -> Result<&'static LocalCluster> {
        static CLUSTER: OnceLock<std::result::Result<LocalCluster, String>> = OnceLock::new();
        CLUSTER
            .get_or_init(|| Self::find().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::KubeUp(e.clone()))
    }

    fn find() -> Result<LocalCluster> {
        if let (Some(kubeconfig), Some(bin)) = (
            std::env::var_os("KUBECONFIG"),
            std::env::var_os("KRT_KUBE_BIN"),
        ) {
            return Ok(LocalCluster {
                kubeconfig: kubeconfig.into(),
                bin: bin.into(),
            });
        }
        let script = repo_root().join("ci/kube-up");
        let out = Command::new(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| Error::KubeUp(format!("{}: {e}", script.display())))?;
        if !out.status.success() {
            return Err(Error::KubeUp(format!(
                "{} exited {}",
                script.display(),
                out.status
            )));
        }
        let exports = String::from_utf8_lossy(&out.stdout);
        let var = |name: &str| {
            exports.lines().find_map(|l| {
                l.strip_prefix("export ")?
                    .strip_prefix(name)?
                    .strip_prefix('=')
                    .map(|v| v.trim_matches('\'').trim_matches('"').to_string())
            })
        };
        match (var("KUBECONFIG"), var("KRT_KUBE_BIN")) {
            (Some(kubeconfig), Some(bin)) => Ok(LocalCluster {
                kubeconfig: kubeconfig.into(),
                bin: bin.into(),
            }),
            _ => Err(Error::KubeUp(format!(
                "no KUBECONFIG/KRT_KUBE_BIN in its output: {exports}"
            ))),
        }
    }

    /// A kubectl command bound to this cluster (our own kubectl build, not
    /// whatever is on PATH).
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig).stdin(Stdio::null());
        cmd
    }

    /// Runs kubectl with `args` and returns its output, whatever the exit status.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<Output> {
        Ok(self.kubectl().args(args).output()?)
    }

    /// Runs kubectl with `args` and `input` on its standard input (a
    /// manifest for `apply -f -`), failing unless it exits 0; returns
    /// stdout.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        use std::io::Write as _;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        Self::checked(args, out)
    }

    /// Runs kubectl with `args`, failing unless it exits 0; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl_output(args)?;
        Self::checked(args, out)
    }

    fn checked(args: &[&str], out: Output) -> Result<String> {
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Kubectl {
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }
}
