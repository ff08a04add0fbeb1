//! Measuring the kernel: facts plus one load of every probe program and map.

use crate::facts::{self, KernelFacts, LsmFacts};
use crate::host::Host;
use crate::view::HostMounts;
use kyverno_runtime_bpf::probe::{ProbeError, ProbeMap, ProbeProgram, Stage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

/// Stable name of a probed program kind, as it appears in `probe --json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramId {
    /// `lsm/file_open`: the BPF-LSM backend's hook.
    LsmFileOpen,
    /// `fmod_ret/security_file_open`: the fallback backend's hook.
    FmodRetFileOpen,
    /// `cgroup_skb/egress`: egress filter, protocol classifier, DNS observer.
    CgroupSkbEgress,
    /// `raw_tp/sched_process_exec` with a ring buffer: exec argv tracing.
    RawTpSchedProcessExec,
}

impl ProgramId {
    /// Every program kind, in report order.
    pub const ALL: [ProgramId; 4] = [
        ProgramId::LsmFileOpen,
        ProgramId::FmodRetFileOpen,
        ProgramId::CgroupSkbEgress,
        ProgramId::RawTpSchedProcessExec,
    ];

    /// The section name a person recognises.
    pub fn section(self) -> &'static str {
        match self {
            ProgramId::LsmFileOpen => "lsm/file_open",
            ProgramId::FmodRetFileOpen => "fmod_ret/security_file_open",
            ProgramId::CgroupSkbEgress => "cgroup_skb/egress",
            ProgramId::RawTpSchedProcessExec => "raw_tp/sched_process_exec",
        }
    }

    fn bpf(self) -> ProbeProgram {
        match self {
            ProgramId::LsmFileOpen => ProbeProgram::LsmFileOpen,
            ProgramId::FmodRetFileOpen => ProbeProgram::FmodRetFileOpen,
            ProgramId::CgroupSkbEgress => ProbeProgram::CgroupSkbEgress,
            ProgramId::RawTpSchedProcessExec => ProbeProgram::RawTpSchedProcessExec,
        }
    }
}

/// Stable name of a probed map kind, as it appears in `probe --json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapId {
    /// `BPF_MAP_TYPE_LPM_TRIE`: IPv4/IPv6 prefixes of any length.
    LpmTrie,
    /// `BPF_MAP_TYPE_HASH_OF_MAPS`: per-policy inner maps.
    HashOfMaps,
    /// `BPF_MAP_TYPE_RINGBUF`: streaming records (exec argv, DNS questions).
    Ringbuf,
}

impl MapId {
    /// Every map kind, in report order.
    pub const ALL: [MapId; 3] = [MapId::LpmTrie, MapId::HashOfMaps, MapId::Ringbuf];

    /// The map type name a person recognises.
    pub fn type_name(self) -> &'static str {
        match self {
            MapId::LpmTrie => "lpm_trie",
            MapId::HashOfMaps => "hash_of_maps",
            MapId::Ringbuf => "ringbuf",
        }
    }

    fn bpf(self) -> ProbeMap {
        match self {
            MapId::LpmTrie => ProbeMap::LpmTrie,
            MapId::HashOfMaps => ProbeMap::HashOfMaps,
            MapId::Ringbuf => ProbeMap::RingBuf,
        }
    }
}

/// What happened when the probe tried one program or map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The object was accepted by the kernel (verifier passed, map created).
    pub loads: bool,
    /// The program was attached to its hook (always equal to `loads` for maps).
    pub attaches: bool,
    /// Whether the attached program was seen to run when triggered; `None`
    /// when the probe had no way to trigger it or never got that far.
    pub runs: Option<bool>,
    /// Why it failed, when it did.
    pub failure: Option<ProbeFailure>,
}

impl Outcome {
    /// Loaded, attached, and not seen to be inert: a backend may rely on it.
    pub fn usable(&self) -> bool {
        self.loads && self.attaches && self.runs != Some(false) && self.failure.is_none()
    }

    /// One line saying why the kind is not usable, for plan reasons.
    pub fn refusal(&self, what: &str) -> String {
        match &self.failure {
            Some(f) => match f.verifier_reason() {
                Some(why) => format!("{what}: {} (verifier: {why})", f.message),
                None => format!("{what}: {}", f.message),
            },
            None if self.runs == Some(false) => {
                format!("{what} loaded and attached but never ran when triggered")
            }
            None => format!("{what} is usable"),
        }
    }
}

/// A refusal, with what the kernel said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeFailure {
    /// The step that failed: `open`, `load`, `attach` or `run`.
    pub stage: String,
    /// The OS error number, when the failing call returned one.
    pub errno: Option<i32>,
    /// Its symbolic name (`EPERM`).
    pub errno_name: Option<String>,
    /// A one-line human reason.
    pub message: String,
    /// The tail of the verifier and libbpf log captured during a failed load.
    pub verifier_log: Option<String>,
}

impl ProbeFailure {
    /// The verifier's own reason in the captured log: the line before its
    /// "processed N insns" summary, e.g. "helper call is not allowed in
    /// probe" (5.10 refusing bpf_d_path in an LSM program).
    pub fn verifier_reason(&self) -> Option<&str> {
        kyverno_runtime_bpf::verifier_reason(self.verifier_log.as_deref()?)
    }
}

impl From<&ProbeError> for ProbeFailure {
    fn from(e: &ProbeError) -> Self {
        let stage = match e.stage {
            Stage::Open => "open",
            Stage::Load => "load",
            Stage::Attach => "attach",
            Stage::Run => "run",
        };
        ProbeFailure {
            stage: stage.to_string(),
            errno: e.errno,
            errno_name: e
                .errno
                .map(|n| format!("{:?}", nix::errno::Errno::from_raw(n))),
            message: e.message.clone(),
            verifier_log: e.verifier_log.clone(),
        }
    }
}

/// Everything the probe measured: the input of [`crate::derive_plan`].
///
/// This is also what `compat/tests/fixtures/*.json` record from real kernels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurements {
    /// Whether this binary was built with its BPF objects (clang present).
    pub bpf_objects_built: bool,
    /// Facts about the kernel.
    pub kernel: KernelFacts,
    /// One outcome per program kind.
    pub programs: BTreeMap<ProgramId, Outcome>,
    /// One outcome per map kind.
    pub maps: BTreeMap<MapId, Outcome>,
}

impl Measurements {
    /// The outcome for a program kind; a missing entry (an old recording)
    /// reads as not measured, hence not usable.
    pub fn program(&self, id: ProgramId) -> Outcome {
        self.programs.get(&id).cloned().unwrap_or_else(not_measured)
    }

    /// The outcome for a map kind, like [`Measurements::program`].
    pub fn map(&self, id: MapId) -> Outcome {
        self.maps.get(&id).cloned().unwrap_or_else(not_measured)
    }
}

fn not_measured() -> Outcome {
    Outcome {
        loads: false,
        attaches: false,
        runs: None,
        failure: Some(ProbeFailure {
            stage: "open".into(),
            errno: None,
            errno_name: None,
            message: "not measured".into(),
            verifier_log: None,
        }),
    }
}

const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const MOUNTINFO: &str = crate::view::SELF_MOUNTINFO;
pub(crate) const SECURITYFS: &str = "/sys/kernel/security";

/// Measures the kernel through `host`. Never fails: whatever cannot be
/// read or loaded is recorded as such, with the reason.
pub fn measure(host: &dyn Host) -> Measurements {
    // Our own table says whether securityfs is mounted where we read it;
    // the host's (the same one beside PID 1, PID 1's from a pod) where the
    // cgroups and bpffs are: the resolver reads that one too.
    let mounts = host
        .read_to_string(Path::new(MOUNTINFO))
        .map(|text| facts::parse_mountinfo(&text))
        .unwrap_or_default();
    let host_mounts = match HostMounts::read(host) {
        Ok(view) => view.mounts,
        Err(e) => {
            tracing::warn!(error = %e, "the host's mount table cannot be read: probing with this process's own");
            mounts.clone()
        }
    };
    let cgroup = facts::cgroup_facts(&host_mounts);
    let mounted_securityfs = mounts
        .iter()
        .any(|m| m.fs_type == "securityfs" && m.mount_point == Path::new(SECURITYFS));
    let (lsm, lockdown) = read_lsm(host, mounted_securityfs);
    let kernel = KernelFacts {
        release: host
            .read_to_string(Path::new(OSRELEASE))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})")),
        btf: host.exists(Path::new(BTF_VMLINUX)),
        lsm,
        lockdown,
        bpffs: facts::bpffs_facts(&host_mounts),
        cgroup,
    };

    let mut programs = BTreeMap::new();
    for id in ProgramId::ALL {
        let outcome = if id == ProgramId::CgroupSkbEgress {
            probe_cgroup_skb(host, kernel.cgroup.v2_mount.as_deref())
        } else {
            program_outcome(host.probe_program(id.bpf(), None))
        };
        programs.insert(id, outcome);
    }
    let maps = MapId::ALL
        .into_iter()
        .map(|id| {
            let outcome = match host.probe_map(id.bpf()) {
                Ok(()) => Outcome {
                    loads: true,
                    attaches: true,
                    runs: None,
                    failure: None,
                },
                Err(e) => refused(&e),
            };
            (id, outcome)
        })
        .collect();
    Measurements {
        bpf_objects_built: kyverno_runtime_bpf::probe::BPF_OBJECTS_BUILT,
        kernel,
        programs,
        maps,
    }
}

/// Reads the active LSM list and lockdown mode, mounting securityfs first
/// when it is not mounted (a minimal host or a fresh VM).
fn read_lsm(host: &dyn Host, securityfs_mounted: bool) -> (LsmFacts, Option<String>) {
    let dir = Path::new(SECURITYFS);
    let mut mounted_now = false;
    let mut mount_error = None;
    if !securityfs_mounted {
        match host.mount_securityfs(dir) {
            Ok(()) => mounted_now = true,
            Err(e) => mount_error = Some(format!("mounting securityfs at {SECURITYFS}: {e}")),
        }
    }
    let lockdown = host
        .read_to_string(&dir.join("lockdown"))
        .ok()
        .and_then(|t| facts::parse_lockdown(&t));
    let lsm = match host.read_to_string(&dir.join("lsm")) {
        Ok(text) => {
            let active = facts::parse_active_lsms(&text);
            LsmFacts {
                bpf_active: active.iter().any(|l| l == "bpf"),
                active: Some(active),
                mounted_securityfs: mounted_now,
                error: None,
            }
        }
        Err(e) => LsmFacts {
            active: None,
            bpf_active: false,
            mounted_securityfs: mounted_now,
            error: Some(match mount_error {
                Some(m) => format!("{m}; reading {SECURITYFS}/lsm: {e}"),
                None => format!("reading {SECURITYFS}/lsm: {e}"),
            }),
        },
    };
    (lsm, lockdown)
}

fn probe_cgroup_skb(host: &dyn Host, v2_mount: Option<&Path>) -> Outcome {
    let Some(v2) = v2_mount else {
        return program_outcome(host.probe_program(ProbeProgram::CgroupSkbEgress, None));
    };
    match host.create_probe_cgroup(v2) {
        Ok(dir) => {
            let outcome =
                program_outcome(host.probe_program(ProbeProgram::CgroupSkbEgress, Some(&dir)));
            if let Err(e) = host.remove_probe_cgroup(&dir) {
                tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove the probe cgroup");
            }
            outcome
        }
        Err(e) => Outcome {
            loads: false,
            attaches: false,
            runs: None,
            failure: Some(ProbeFailure {
                stage: "attach".into(),
                errno: e.raw_os_error(),
                errno_name: e
                    .raw_os_error()
                    .map(|n| format!("{:?}", nix::errno::Errno::from_raw(n))),
                message: format!("cannot create a probe cgroup under {}: {e}", v2.display()),
                verifier_log: None,
            }),
        },
    }
}

fn program_outcome(
    result: Result<kyverno_runtime_bpf::probe::ProgramProbe, ProbeError>,
) -> Outcome {
    match result {
        Ok(p) => Outcome {
            loads: true,
            attaches: true,
            runs: p.ran,
            failure: None,
        },
        Err(e) => refused(&e),
    }
}

fn refused(e: &ProbeError) -> Outcome {
    let reached_attach = matches!(e.stage, Stage::Attach | Stage::Run);
    Outcome {
        loads: reached_attach,
        attaches: e.stage == Stage::Run,
        runs: if e.stage == Stage::Run {
            Some(false)
        } else {
            None
        },
        failure: Some(ProbeFailure::from(e)),
    }
}

/// Measures once and keeps the answer: loading probe programs costs
/// verifier time and briefly attaches hooks, so a process does it once.
pub struct Prober<H: Host> {
    host: H,
    measured: OnceLock<Measurements>,
}

impl<H: Host> Prober<H> {
    /// A prober over `host` that has not measured yet.
    pub fn new(host: H) -> Self {
        Prober {
            host,
            measured: OnceLock::new(),
        }
    }

    /// The measurements, taken on first call.
    pub fn measurements(&self) -> &Measurements {
        self.measured.get_or_init(|| measure(&self.host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_host::FakeHost;

    const UNIFIED: &str = "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn mounts_securityfs_when_absent_and_reads_the_lsm_list() {
        let host = FakeHost {
            securityfs_mountable: true,
            lsm_runs: true,
            ..Default::default()
        }
        .file(MOUNTINFO, UNIFIED)
        .file(OSRELEASE, "6.1.0-37-cloud-amd64\n")
        .file(BTF_VMLINUX, "")
        .file(
            "/sys/kernel/security/lsm",
            "lockdown,capability,landlock,yama,bpf",
        )
        .file(
            "/sys/kernel/security/lockdown",
            "[none] integrity confidentiality\n",
        );
        let m = measure(&host);
        assert_eq!(m.kernel.release, "6.1.0-37-cloud-amd64");
        assert!(m.kernel.btf);
        assert!(m.kernel.lsm.mounted_securityfs);
        assert!(m.kernel.lsm.bpf_active);
        assert_eq!(m.kernel.lockdown.as_deref(), Some("none"));
        assert_eq!(
            m.kernel.cgroup.v2_mount.as_deref(),
            Some(Path::new("/sys/fs/cgroup"))
        );
        assert_eq!(m.program(ProgramId::LsmFileOpen).runs, Some(true));
        let fmod = m.program(ProgramId::FmodRetFileOpen);
        assert!(!fmod.loads && !fmod.usable());
        let failure = fmod.failure.unwrap();
        assert_eq!(
            (
                failure.stage.as_str(),
                failure.errno,
                failure.errno_name.as_deref()
            ),
            ("load", Some(1), Some("EPERM"))
        );
        assert_eq!(
            failure.verifier_log.as_deref(),
            Some("libbpf: failed to load")
        );
        // The cgroup_skb probe ran inside a scratch cgroup that was removed afterwards.
        let log = host.log.borrow();
        let mkdir = log
            .iter()
            .position(|l| l == "mkdir /sys/fs/cgroup")
            .unwrap();
        let probe = log
            .iter()
            .position(|l| l.starts_with("probe CgroupSkbEgress Some(\"/sys/fs/cgroup/probe\")"))
            .unwrap();
        let rmdir = log
            .iter()
            .position(|l| l == "rmdir /sys/fs/cgroup/probe")
            .unwrap();
        assert!(mkdir < probe && probe < rmdir, "{log:?}");
        assert_eq!(log.iter().filter(|l| l.starts_with("map ")).count(), 3);
    }

    #[test]
    fn an_unmountable_securityfs_is_reported_not_fatal() {
        let host = FakeHost::default().file(OSRELEASE, "5.10.0-35-cloud-amd64");
        let m = measure(&host);
        assert_eq!(m.kernel.lsm.active, None);
        assert!(!m.kernel.lsm.bpf_active);
        let error = m.kernel.lsm.error.unwrap();
        assert!(
            error.contains("mounting securityfs")
                && error.contains("reading /sys/kernel/security/lsm"),
            "{error}"
        );
        assert_eq!(m.kernel.cgroup.layout, crate::CgroupLayout::None);
        assert!(!m.kernel.btf);
        // Without a cgroup v2 mount no scratch cgroup is made.
        assert!(!host.log.borrow().iter().any(|l| l.starts_with("mkdir")));
    }

    #[test]
    fn an_already_mounted_securityfs_is_not_mounted_again() {
        let mountinfo =
            format!("{UNIFIED}30 22 0:7 / /sys/kernel/security rw - securityfs securityfs rw\n");
        let host = FakeHost {
            securityfs_mountable: true,
            ..Default::default()
        }
        .file(MOUNTINFO, &mountinfo)
        .file("/sys/kernel/security/lsm", "capability,bpf");
        let m = measure(&host);
        assert!(!m.kernel.lsm.mounted_securityfs);
        assert!(m.kernel.lsm.bpf_active);
        assert!(!host.log.borrow().iter().any(|l| l == "mount securityfs"));
    }

    #[test]
    fn a_pod_probes_the_hosts_cgroup_v2_and_bpffs_not_its_own_mounts() {
        let host_table = format!(
            "{}99 23 0:40 / /sys/fs/bpf rw,relatime - bpf bpf rw\n",
            include_str!("../tests/fixtures/mountinfo-hybrid-host.txt")
        );
        let host = FakeHost::in_a_pod(
            include_str!("../tests/fixtures/mountinfo-hybrid-pod.txt"),
            &host_table,
        );
        let m = measure(&host);
        assert_eq!(m.kernel.cgroup.layout, crate::CgroupLayout::Hybrid);
        assert_eq!(
            m.kernel.cgroup.v2_mount.as_deref(),
            Some(Path::new("/proc/1/root/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            m.kernel.bpffs.path.as_deref(),
            Some(Path::new("/proc/1/root/sys/fs/bpf"))
        );
    }

    #[test]
    fn the_prober_measures_once() {
        let prober = Prober::new(FakeHost::default().file(MOUNTINFO, UNIFIED));
        let first = prober.measurements().clone();
        let second = prober.measurements();
        assert_eq!(&first, second);
        let probes = prober
            .host
            .log
            .borrow()
            .iter()
            .filter(|l| l.starts_with("probe "))
            .count();
        assert_eq!(probes, ProgramId::ALL.len());
    }
}
