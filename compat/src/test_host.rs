//! A [`Host`] that answers from recorded files, for the tests of what is
//! read (not what is loaded: it refuses every program and map).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use kyverno_runtime_bpf::probe::{ProbeError, ProbeMap, ProbeProgram, ProgramProbe, Stage};

use crate::host::Host;
use crate::view::{INIT_MOUNTINFO, SELF_MOUNTINFO};

/// Recorded files, and whether the process shares PID 1's mount namespace.
pub(crate) struct FixtureHost {
    pub(crate) files: HashMap<PathBuf, String>,
    pub(crate) beside_init: bool,
}

impl FixtureHost {
    /// A host process (or one in a VM): its table is the host's.
    pub(crate) fn beside_init(mountinfo: &str) -> Self {
        Self {
            files: HashMap::from([(PathBuf::from(SELF_MOUNTINFO), mountinfo.to_owned())]),
            beside_init: true,
        }
    }

    /// A hostPID pod: its own table, and PID 1's.
    pub(crate) fn in_a_pod(own: &str, init: &str) -> Self {
        Self {
            files: HashMap::from([
                (PathBuf::from(SELF_MOUNTINFO), own.to_owned()),
                (PathBuf::from(INIT_MOUNTINFO), init.to_owned()),
            ]),
            beside_init: false,
        }
    }
}

fn refused() -> ProbeError {
    ProbeError {
        stage: Stage::Load,
        errno: Some(libc::EPERM),
        message: "a fixture loads nothing".into(),
        verifier_log: None,
    }
}

impl Host for FixtureHost {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }
    fn exists(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
    fn mount_securityfs(&self, _: &Path) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
    fn create_probe_cgroup(&self, _: &Path) -> io::Result<PathBuf> {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
    fn remove_probe_cgroup(&self, _: &Path) -> io::Result<()> {
        Ok(())
    }
    fn probe_program(&self, _: ProbeProgram, _: Option<&Path>) -> Result<ProgramProbe, ProbeError> {
        Err(refused())
    }
    fn probe_map(&self, _: ProbeMap) -> Result<(), ProbeError> {
        Err(refused())
    }
    fn shares_init_mount_namespace(&self) -> bool {
        self.beside_init
    }
}
