//! The seam between the probe and the machine it runs on.

use kyverno_runtime_bpf::probe::{self as bpf, ProbeError, ProbeMap, ProbeProgram, ProgramProbe};
use std::io;
use std::path::{Path, PathBuf};

/// Everything the probe reads from, or does to, the machine.
///
/// [`LiveHost`] is the real implementation; tests substitute one that
/// answers from text and results recorded on real kernels.
pub trait Host {
    /// Reads a whole file (procfs, sysfs, securityfs).
    fn read_to_string(&self, path: &Path) -> io::Result<String>;
    /// Whether a path exists.
    fn exists(&self, path: &Path) -> bool;
    /// Mounts securityfs at `target`.
    fn mount_securityfs(&self, target: &Path) -> io::Result<()>;
    /// Creates a scratch child cgroup under the cgroup v2 mount, for the
    /// cgroup_skb attach probe.
    fn create_probe_cgroup(&self, v2_mount: &Path) -> io::Result<PathBuf>;
    /// Removes the scratch cgroup again.
    fn remove_probe_cgroup(&self, path: &Path) -> io::Result<()>;
    /// Loads, attaches and triggers one probe program (see
    /// [`kyverno_runtime_bpf::probe::probe_program`]).
    fn probe_program(
        &self,
        program: ProbeProgram,
        cgroup_dir: Option<&Path>,
    ) -> Result<ProgramProbe, ProbeError>;
    /// Creates and exercises one probe map.
    fn probe_map(&self, map: ProbeMap) -> Result<(), ProbeError>;
}

/// The machine this process runs on.
#[derive(Debug, Default, Clone, Copy)]
pub struct LiveHost;

impl Host for LiveHost {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn mount_securityfs(&self, target: &Path) -> io::Result<()> {
        nix::mount::mount(
            Some("securityfs"),
            target,
            Some("securityfs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(io::Error::from)
    }

    fn create_probe_cgroup(&self, v2_mount: &Path) -> io::Result<PathBuf> {
        let dir = v2_mount.join(format!("kyverno-runtime-probe-{}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => Ok(dir),
            // Left behind by a probe of ours that was killed: reuse it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(dir),
            Err(e) => Err(e),
        }
    }

    fn remove_probe_cgroup(&self, path: &Path) -> io::Result<()> {
        // A cgroup directory is removed with rmdir even though it "contains"
        // control files.
        std::fs::remove_dir(path)
    }

    fn probe_program(
        &self,
        program: ProbeProgram,
        cgroup_dir: Option<&Path>,
    ) -> Result<ProgramProbe, ProbeError> {
        bpf::probe_program(program, cgroup_dir)
    }

    fn probe_map(&self, map: ProbeMap) -> Result<(), ProbeError> {
        bpf::probe_map(map)
    }
}
