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
    /// Whether this process shares PID 1's mount namespace, so that its
    /// own mount table is the host's (see [`crate::HostMounts`]). `true`
    /// when it cannot tell: its own view is then all it has.
    fn shares_init_mount_namespace(&self) -> bool;
}

/// The machine this process runs on.
#[derive(Debug, Default, Clone, Copy)]
pub struct LiveHost;

/// The most bytes [`LiveHost`] reads of one file: the largest it reads is
/// the mount table, far below this on any node.
pub const MAX_HOST_FILE_BYTES: u64 = 16 * 1024 * 1024;

impl Host for LiveHost {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        use io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)?
            .take(MAX_HOST_FILE_BYTES + 1)
            .read_to_string(&mut text)?;
        if text.len() as u64 > MAX_HOST_FILE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than {MAX_HOST_FILE_BYTES} bytes"),
            ));
        }
        Ok(text)
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

    fn shares_init_mount_namespace(&self) -> bool {
        match (
            std::fs::read_link("/proc/1/ns/mnt"),
            std::fs::read_link("/proc/self/ns/mnt"),
        ) {
            (Ok(init), Ok(own)) => init == own,
            // Unreadable (not root, no hostPID): our own view is all there is.
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_file_over_the_bound_is_refused() {
        let path = std::env::temp_dir().join(format!("krt-host-bound-{}", std::process::id()));
        let made = std::fs::File::create(&path).and_then(|f| f.set_len(MAX_HOST_FILE_BYTES + 1));
        let read = LiveHost.read_to_string(&path);
        let _ = std::fs::remove_file(&path);
        made.unwrap_or_else(|e| panic!("{e}"));
        let err = read.err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("larger than 16777216 bytes"));
        assert!(LiveHost.read_to_string(Path::new("/dev/zero")).is_err());
    }
}
