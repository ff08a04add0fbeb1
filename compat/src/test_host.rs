//! A [`Host`] that answers from recorded files and records what was done
//! to it: the probe's tests and the host view's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use kyverno_runtime_bpf::probe::{ProbeError, ProbeMap, ProbeProgram, ProgramProbe, Stage};

use crate::host::Host;
use crate::measure::SECURITYFS;
use crate::view::{INIT_MOUNTINFO, SELF_MOUNTINFO};

/// Recorded files, what the fake kernel does, and the log of what was
/// asked of it.
#[derive(Default)]
pub(crate) struct FakeHost {
    pub(crate) files: HashMap<PathBuf, String>,
    pub(crate) securityfs_mountable: bool,
    pub(crate) log: RefCell<Vec<String>>,
    pub(crate) lsm_runs: bool,
    /// In a pod: its own mount namespace, not PID 1's.
    pub(crate) in_a_pod: bool,
}

impl FakeHost {
    /// With `text` at `path`.
    pub(crate) fn file(mut self, path: &str, text: &str) -> Self {
        self.files.insert(PathBuf::from(path), text.to_string());
        self
    }

    /// A host process (or one in a VM): its table is the host's.
    pub(crate) fn beside_init(mountinfo: &str) -> Self {
        FakeHost::default().file(SELF_MOUNTINFO, mountinfo)
    }

    /// A hostPID pod: its own table, and PID 1's.
    pub(crate) fn in_a_pod(own: &str, init: &str) -> Self {
        FakeHost {
            in_a_pod: true,
            ..FakeHost::default()
        }
        .file(SELF_MOUNTINFO, own)
        .file(INIT_MOUNTINFO, init)
    }
}

impl Host for FakeHost {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        // securityfs files exist only once it is mounted.
        let mounted = self
            .files
            .get(Path::new(SELF_MOUNTINFO))
            .is_some_and(|t| t.contains("securityfs"))
            || self.log.borrow().iter().any(|l| l == "mount securityfs");
        if path.starts_with(SECURITYFS) && !mounted {
            return Err(io::ErrorKind::NotFound.into());
        }
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }
    fn exists(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
    fn mount_securityfs(&self, _: &Path) -> io::Result<()> {
        if self.securityfs_mountable {
            self.log.borrow_mut().push("mount securityfs".into());
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        }
    }
    fn create_probe_cgroup(&self, v2: &Path) -> io::Result<PathBuf> {
        self.log
            .borrow_mut()
            .push(format!("mkdir {}", v2.display()));
        Ok(v2.join("probe"))
    }
    fn remove_probe_cgroup(&self, path: &Path) -> io::Result<()> {
        self.log
            .borrow_mut()
            .push(format!("rmdir {}", path.display()));
        Ok(())
    }
    fn probe_program(
        &self,
        p: ProbeProgram,
        cgroup: Option<&Path>,
    ) -> Result<ProgramProbe, ProbeError> {
        self.log
            .borrow_mut()
            .push(format!("probe {p:?} {cgroup:?}"));
        match p {
            ProbeProgram::LsmFileOpen => Ok(ProgramProbe {
                ran: Some(self.lsm_runs),
            }),
            ProbeProgram::FmodRetFileOpen => Err(ProbeError {
                stage: Stage::Load,
                errno: Some(libc::EPERM),
                message: "load refused: EPERM (Operation not permitted)".into(),
                verifier_log: Some("libbpf: failed to load".into()),
            }),
            _ => Ok(ProgramProbe { ran: Some(true) }),
        }
    }
    fn probe_map(&self, m: ProbeMap) -> Result<(), ProbeError> {
        self.log.borrow_mut().push(format!("map {m:?}"));
        Ok(())
    }
    fn shares_init_mount_namespace(&self) -> bool {
        !self.in_a_pod
    }
}
