//! The backend plan: which backend serves each behavior, and why.
//!
//! [`derive_plan`] is a pure function of [`Measurements`], so every rule
//! here is tested against measurements recorded on real kernels.

use crate::measure::{MapId, Measurements, ProgramId};
use crate::Error;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A behavior a RuntimePolicy can enforce or observe, plus exec argv tracing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Behavior {
    /// File opens.
    Open,
    /// Program execution.
    Exec,
    /// Network egress by destination.
    Network,
    /// Application protocol of egress flows.
    Protocol,
    /// DNS questions (observation only).
    Dns,
    /// Per-exec records with argv, for monitor findings.
    ExecArgv,
}

impl Behavior {
    /// Every behavior, in report order.
    pub const ALL: [Behavior; 6] = [
        Behavior::Open,
        Behavior::Exec,
        Behavior::Network,
        Behavior::Protocol,
        Behavior::Dns,
        Behavior::ExecArgv,
    ];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Behavior::Open => "open",
            Behavior::Exec => "exec",
            Behavior::Network => "network",
            Behavior::Protocol => "protocol",
            Behavior::Dns => "dns",
            Behavior::ExecArgv => "execArgv",
        }
    }
}

/// A backend: the kernel mechanism that serves a behavior.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// BPF-LSM programs on file_open and bprm_check_security.
    BpfLsm,
    /// An fmod_ret program on security_file_open (no `bpf` in `lsm=`).
    FmodRet,
    /// A cgroup_skb egress filter with LPM tries.
    CgroupSkbEgress,
    /// A cgroup_skb first-segment protocol classifier.
    CgroupSkbClassifier,
    /// A cgroup_skb DNS question observer with a ring buffer.
    CgroupSkbDns,
    /// A raw_tp/sched_process_exec tracer with a ring buffer.
    RawTpExec,
    /// Nothing on this kernel can serve the behavior.
    None,
}

impl Backend {
    /// The stable identifier (`bpf_lsm`, `fmod_ret`, ...).
    pub fn id(self) -> &'static str {
        match self {
            Backend::BpfLsm => "bpf_lsm",
            Backend::FmodRet => "fmod_ret",
            Backend::CgroupSkbEgress => "cgroup_skb_egress",
            Backend::CgroupSkbClassifier => "cgroup_skb_classifier",
            Backend::CgroupSkbDns => "cgroup_skb_dns",
            Backend::RawTpExec => "raw_tp_exec",
            Backend::None => "none",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// The choice for open/exec enforcement an operator may force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenExecBackend {
    /// Let the probe decide (the default).
    #[default]
    Auto,
    /// Force BPF-LSM.
    BpfLsm,
    /// Force the fmod_ret fallback.
    FmodRet,
    /// Disable open/exec enforcement on this node.
    None,
}

impl FromStr for OpenExecBackend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(OpenExecBackend::Auto),
            "bpf_lsm" | "bpf-lsm" | "lsm" => Ok(OpenExecBackend::BpfLsm),
            "fmod_ret" | "fmod-ret" => Ok(OpenExecBackend::FmodRet),
            "none" => Ok(OpenExecBackend::None),
            other => Err(Error::UnknownBackend {
                value: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for OpenExecBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpenExecBackend::Auto => "auto",
            OpenExecBackend::BpfLsm => "bpf_lsm",
            OpenExecBackend::FmodRet => "fmod_ret",
            OpenExecBackend::None => "none",
        })
    }
}

/// Operator overrides of the derived plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overrides {
    /// `--open-exec`: which backend serves open and exec.
    pub open_exec: OpenExecBackend,
}

/// The backend serving one behavior, with a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    /// The backend (`none` when unavailable).
    pub backend: Backend,
    /// Whether the behavior can be served on this node.
    pub available: bool,
    /// Why this backend, or why none.
    pub reason: String,
    /// Whether an operator override chose the backend.
    pub forced: bool,
}

impl PlanEntry {
    fn chosen(backend: Backend, reason: String) -> Self {
        PlanEntry {
            backend,
            available: true,
            reason,
            forced: false,
        }
    }

    fn unavailable(reason: String) -> Self {
        PlanEntry {
            backend: Backend::None,
            available: false,
            reason,
            forced: false,
        }
    }
}

/// Which backend serves each behavior on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// File open enforcement and observation.
    pub open: PlanEntry,
    /// Exec enforcement and observation.
    pub exec: PlanEntry,
    /// Egress filtering by destination.
    pub network: PlanEntry,
    /// Application protocol classification.
    pub protocol: PlanEntry,
    /// DNS question observation.
    pub dns: PlanEntry,
    /// Exec argv tracing.
    pub exec_argv: PlanEntry,
}

impl Plan {
    /// The entry for one behavior.
    pub fn entry(&self, behavior: Behavior) -> &PlanEntry {
        match behavior {
            Behavior::Open => &self.open,
            Behavior::Exec => &self.exec,
            Behavior::Network => &self.network,
            Behavior::Protocol => &self.protocol,
            Behavior::Dns => &self.dns,
            Behavior::ExecArgv => &self.exec_argv,
        }
    }
}

/// Derives the plan from what was measured, then applies the overrides.
pub fn derive_plan(m: &Measurements, overrides: &Overrides) -> Plan {
    let bpf_lsm = bpf_lsm_viability(m);
    let fmod_ret = fmod_ret_viability(m);
    let derived = match (&bpf_lsm, &fmod_ret) {
        (Ok(why), _) => PlanEntry::chosen(Backend::BpfLsm, why.clone()),
        (Err(lsm_why), Ok(why)) => PlanEntry::chosen(
            Backend::FmodRet,
            format!("{why} (BPF-LSM unavailable: {lsm_why})"),
        ),
        (Err(lsm_why), Err(fmod_why)) => {
            PlanEntry::unavailable(format!("BPF-LSM: {lsm_why}; fmod_ret: {fmod_why}"))
        }
    };
    let open = apply_override(derived, overrides.open_exec, &bpf_lsm, &fmod_ret);
    let mut exec = open.clone();
    if exec.backend == Backend::FmodRet {
        exec.reason.push_str(
            "; an exec is decided where the kernel opens the file for execution (the exec bit in its flags) and enforced at security_bprm_check",
        );
    }

    let skb = cgroup_skb_viability(m);
    let network = match (&skb, lpm_viability(m)) {
        (Ok(why), Ok(lpm)) => PlanEntry::chosen(Backend::CgroupSkbEgress, format!("{why}; {lpm}")),
        (Err(why), _) => PlanEntry::unavailable(why.clone()),
        (Ok(_), Err(why)) => PlanEntry::unavailable(why),
    };
    let protocol = match &skb {
        Ok(why) => PlanEntry::chosen(
            Backend::CgroupSkbClassifier,
            format!("{why}; classifies the first data segment of each flow"),
        ),
        Err(why) => PlanEntry::unavailable(why.clone()),
    };
    let ringbuf = m.map(MapId::Ringbuf);
    let dns = match (&skb, ringbuf.usable()) {
        (Ok(why), true) => PlanEntry::chosen(
            Backend::CgroupSkbDns,
            format!("{why}; questions stream through a ring buffer"),
        ),
        (Err(why), _) => PlanEntry::unavailable(why.clone()),
        (Ok(_), false) => PlanEntry::unavailable(ringbuf.refusal("ringbuf map")),
    };
    let raw_tp = m.program(ProgramId::RawTpSchedProcessExec);
    let exec_argv = if !raw_tp.usable() {
        PlanEntry::unavailable(raw_tp.refusal(ProgramId::RawTpSchedProcessExec.section()))
    } else if !ringbuf.usable() {
        PlanEntry::unavailable(ringbuf.refusal("ringbuf map"))
    } else {
        PlanEntry::chosen(
            Backend::RawTpExec,
            format!(
                "{} loaded, attached and {}; records stream through a ring buffer",
                ProgramId::RawTpSchedProcessExec.section(),
                ran_phrase(raw_tp.runs)
            ),
        )
    };
    Plan {
        open,
        exec,
        network,
        protocol,
        dns,
        exec_argv,
    }
}

fn ran_phrase(runs: Option<bool>) -> &'static str {
    match runs {
        Some(true) => "ran when triggered",
        _ => "was not triggered",
    }
}

/// Whether BPF-LSM can enforce, with the reason either way.
fn bpf_lsm_viability(m: &Measurements) -> Result<String, String> {
    if !m.kernel.btf {
        return Err("the kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    let lsm = m.program(ProgramId::LsmFileOpen);
    let section = ProgramId::LsmFileOpen.section();
    match &m.kernel.lsm.active {
        Some(active) if !m.kernel.lsm.bpf_active => {
            return Err(format!(
                "bpf is not in the active LSM list ({})",
                active.join(",")
            ));
        }
        Some(_) => {}
        // The list is unreadable: only a program seen running proves the
        // hook is live, since an LSM program attaches even when inert.
        None if lsm.usable() && lsm.runs == Some(true) => {
            return Ok(format!(
                "{section} loaded, attached and ran (active LSM list unreadable: {})",
                m.kernel.lsm.error.as_deref().unwrap_or("unknown error")
            ));
        }
        None if lsm.usable() => {
            return Err(format!(
                "the active LSM list is unreadable ({}) and {section} was not seen to run",
                m.kernel.lsm.error.as_deref().unwrap_or("unknown error")
            ));
        }
        None => {}
    }
    if !lsm.usable() {
        return Err(lsm.refusal(section));
    }
    Ok(format!(
        "bpf is in the active LSM list; {section} loaded, attached and {}",
        ran_phrase(lsm.runs)
    ))
}

/// Whether the fmod_ret fallback can enforce, with the reason either way.
fn fmod_ret_viability(m: &Measurements) -> Result<String, String> {
    if !m.kernel.btf {
        return Err("the kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    let fmod = m.program(ProgramId::FmodRetFileOpen);
    let section = ProgramId::FmodRetFileOpen.section();
    if !fmod.usable() {
        return Err(fmod.refusal(section));
    }
    Ok(format!(
        "{section} loaded, attached and {}",
        ran_phrase(fmod.runs)
    ))
}

/// Whether cgroup_skb programs can be attached to container cgroups.
fn cgroup_skb_viability(m: &Measurements) -> Result<String, String> {
    let Some(v2) = &m.kernel.cgroup.v2_mount else {
        return Err(format!(
            "no cgroup v2 hierarchy is mounted (cgroup layout: {}); cgroup_skb programs attach only to cgroup v2",
            m.kernel.cgroup.layout.name()
        ));
    };
    let skb = m.program(ProgramId::CgroupSkbEgress);
    let section = ProgramId::CgroupSkbEgress.section();
    if !skb.usable() {
        return Err(skb.refusal(section));
    }
    Ok(format!(
        "{section} attached under {} and {}",
        v2.display(),
        ran_phrase(skb.runs)
    ))
}

fn lpm_viability(m: &Measurements) -> Result<String, String> {
    let lpm = m.map(MapId::LpmTrie);
    if lpm.usable() {
        Ok("LPM tries hold IPv4 and IPv6 prefixes of any length".into())
    } else {
        Err(lpm.refusal("lpm_trie map"))
    }
}

fn apply_override(
    derived: PlanEntry,
    forced: OpenExecBackend,
    bpf_lsm: &Result<String, String>,
    fmod_ret: &Result<String, String>,
) -> PlanEntry {
    let (backend, viability) = match forced {
        OpenExecBackend::Auto => return derived,
        OpenExecBackend::BpfLsm => (Backend::BpfLsm, Some(bpf_lsm)),
        OpenExecBackend::FmodRet => (Backend::FmodRet, Some(fmod_ret)),
        OpenExecBackend::None => (Backend::None, None),
    };
    let verdict = match viability {
        Some(Err(why)) => format!(" although the probe found it unusable: {why}"),
        _ => String::new(),
    };
    PlanEntry {
        backend,
        available: backend != Backend::None,
        reason: format!(
            "forced by --open-exec={forced}{verdict} (the probe chose {}: {})",
            derived.backend, derived.reason
        ),
        forced: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{BpffsFacts, CgroupFacts, CgroupLayout, KernelFacts, LsmFacts};
    use crate::measure::{Outcome, ProbeFailure};
    use std::collections::BTreeMap;

    fn ok(runs: Option<bool>) -> Outcome {
        Outcome {
            loads: true,
            attaches: true,
            runs,
            failure: None,
        }
    }

    fn refused(stage: &str, errno: i32, name: &str) -> Outcome {
        Outcome {
            loads: stage != "load",
            attaches: false,
            runs: None,
            failure: Some(ProbeFailure {
                stage: stage.into(),
                errno: Some(errno),
                errno_name: Some(name.into()),
                message: format!("{stage} refused: {name}"),
                verifier_log: None,
            }),
        }
    }

    /// A kernel where everything works and bpf is an active LSM.
    fn healthy() -> Measurements {
        let programs = ProgramId::ALL
            .into_iter()
            .map(|id| (id, ok(Some(true))))
            .collect();
        let maps = MapId::ALL.into_iter().map(|id| (id, ok(None))).collect();
        Measurements {
            bpf_objects_built: true,
            kernel: KernelFacts {
                release: "6.1.0-test".into(),
                btf: true,
                lsm: LsmFacts {
                    active: Some(vec!["lockdown".into(), "capability".into(), "bpf".into()]),
                    bpf_active: true,
                    mounted_securityfs: false,
                    error: None,
                },
                lockdown: Some("none".into()),
                cgroup: CgroupFacts {
                    layout: CgroupLayout::Unified,
                    v2_mount: Some("/sys/fs/cgroup".into()),
                },
                bpffs: BpffsFacts {
                    mounted: true,
                    path: Some("/sys/fs/bpf".into()),
                },
            },
            programs,
            maps,
        }
    }

    fn without_bpf_lsm(mut m: Measurements) -> Measurements {
        m.kernel.lsm.active = Some(vec!["lockdown".into(), "capability".into()]);
        m.kernel.lsm.bpf_active = false;
        // What a real kernel does: the LSM program loads and attaches, then never runs.
        m.programs.insert(ProgramId::LsmFileOpen, ok(Some(false)));
        m
    }

    #[test]
    fn bpf_lsm_when_bpf_is_active_and_the_program_runs() {
        let plan = derive_plan(&healthy(), &Overrides::default());
        assert_eq!(plan.open.backend, Backend::BpfLsm);
        assert_eq!(plan.exec.backend, Backend::BpfLsm);
        assert!(
            plan.open.reason.contains("active LSM list"),
            "{}",
            plan.open.reason
        );
        assert_eq!(plan.network.backend, Backend::CgroupSkbEgress);
        assert_eq!(plan.protocol.backend, Backend::CgroupSkbClassifier);
        assert_eq!(plan.dns.backend, Backend::CgroupSkbDns);
        assert_eq!(plan.exec_argv.backend, Backend::RawTpExec);
        assert!(Behavior::ALL
            .iter()
            .all(|b| plan.entry(*b).available && !plan.entry(*b).forced));
    }

    #[test]
    fn fmod_ret_when_bpf_is_not_in_the_lsm_list() {
        let plan = derive_plan(&without_bpf_lsm(healthy()), &Overrides::default());
        assert_eq!(plan.open.backend, Backend::FmodRet);
        assert_eq!(plan.exec.backend, Backend::FmodRet);
        assert!(
            plan.open
                .reason
                .contains("bpf is not in the active LSM list (lockdown,capability)"),
            "{}",
            plan.open.reason
        );
        assert!(
            plan.exec.reason.contains("exec bit"),
            "{}",
            plan.exec.reason
        );
    }

    #[test]
    fn an_lsm_program_that_attaches_but_never_runs_is_not_trusted() {
        // bpf claimed active, yet the hook never fired: do not enforce with it.
        let mut m = healthy();
        m.programs.insert(ProgramId::LsmFileOpen, ok(Some(false)));
        let plan = derive_plan(&m, &Overrides::default());
        assert_eq!(plan.open.backend, Backend::FmodRet);
        assert!(
            plan.open.reason.contains("never ran"),
            "{}",
            plan.open.reason
        );
    }

    #[test]
    fn unreadable_lsm_list_is_decided_by_the_run_check() {
        let mut m = healthy();
        m.kernel.lsm = LsmFacts {
            active: None,
            bpf_active: false,
            mounted_securityfs: false,
            error: Some("EACCES".into()),
        };
        assert_eq!(
            derive_plan(&m, &Overrides::default()).open.backend,
            Backend::BpfLsm
        );
        m.programs.insert(ProgramId::LsmFileOpen, ok(None));
        let plan = derive_plan(&m, &Overrides::default());
        assert_eq!(plan.open.backend, Backend::FmodRet);
        assert!(
            plan.open.reason.contains("not seen to run"),
            "{}",
            plan.open.reason
        );
    }

    #[test]
    fn none_when_both_hooks_are_refused_quoting_both_refusals() {
        let mut m = healthy();
        m.programs
            .insert(ProgramId::LsmFileOpen, refused("load", 1, "EPERM"));
        m.programs.insert(
            ProgramId::FmodRetFileOpen,
            refused("attach", 524, "ENOTSUPP"),
        );
        let plan = derive_plan(&m, &Overrides::default());
        assert_eq!(plan.open.backend, Backend::None);
        assert!(!plan.open.available && !plan.exec.available);
        assert_eq!(
            plan.open.reason,
            "BPF-LSM: lsm/file_open: load refused: EPERM; fmod_ret: fmod_ret/security_file_open: attach refused: ENOTSUPP"
        );
        assert!(
            plan.network.available,
            "other behaviors do not depend on the LSM hooks"
        );
    }

    #[test]
    fn no_btf_rules_out_both_open_exec_backends() {
        let mut m = healthy();
        m.kernel.btf = false;
        let plan = derive_plan(&m, &Overrides::default());
        assert_eq!(plan.open.backend, Backend::None);
        assert!(plan.open.reason.contains("no BTF"), "{}", plan.open.reason);
    }

    #[test]
    fn legacy_cgroups_rule_out_every_cgroup_skb_backend() {
        let mut m = healthy();
        m.kernel.cgroup = CgroupFacts {
            layout: CgroupLayout::Legacy,
            v2_mount: None,
        };
        let plan = derive_plan(&m, &Overrides::default());
        for b in [Behavior::Network, Behavior::Protocol, Behavior::Dns] {
            let e = plan.entry(b);
            assert_eq!(e.backend, Backend::None, "{b:?}");
            assert!(e.reason.contains("cgroup layout: legacy"), "{}", e.reason);
        }
        assert!(plan.exec_argv.available);
        assert!(plan.open.available);
    }

    #[test]
    fn each_map_gates_only_what_needs_it() {
        let mut m = healthy();
        m.maps.insert(MapId::LpmTrie, refused("load", 22, "EINVAL"));
        let plan = derive_plan(&m, &Overrides::default());
        assert!(
            !plan.network.available && plan.network.reason.contains("lpm_trie"),
            "{}",
            plan.network.reason
        );
        assert!(plan.protocol.available && plan.dns.available);

        let mut m = healthy();
        m.maps.insert(MapId::Ringbuf, refused("load", 22, "EINVAL"));
        let plan = derive_plan(&m, &Overrides::default());
        assert!(!plan.dns.available && !plan.exec_argv.available);
        assert!(plan.dns.reason.contains("ringbuf"), "{}", plan.dns.reason);
        assert!(plan.network.available && plan.protocol.available);
    }

    #[test]
    fn exec_tracing_needs_the_raw_tp_program() {
        let mut m = healthy();
        m.programs.insert(
            ProgramId::RawTpSchedProcessExec,
            refused("attach", 95, "EOPNOTSUPP"),
        );
        let plan = derive_plan(&m, &Overrides::default());
        assert_eq!(plan.exec_argv.backend, Backend::None);
        assert!(
            plan.exec_argv
                .reason
                .starts_with("raw_tp/sched_process_exec: attach refused"),
            "{}",
            plan.exec_argv.reason
        );
    }

    #[test]
    fn missing_measurements_read_as_unusable() {
        let mut m = healthy();
        m.programs.clear();
        m.maps = BTreeMap::new();
        let plan = derive_plan(&m, &Overrides::default());
        assert!(Behavior::ALL.iter().all(|b| !plan.entry(*b).available));
    }

    #[test]
    fn overrides_force_a_backend_and_keep_the_probe_verdict_in_the_reason() {
        let forced = Overrides {
            open_exec: OpenExecBackend::FmodRet,
        };
        let plan = derive_plan(&healthy(), &forced);
        assert_eq!(plan.open.backend, Backend::FmodRet);
        assert!(plan.open.forced && plan.exec.forced);
        assert!(
            plan.open
                .reason
                .starts_with("forced by --open-exec=fmod_ret (the probe chose bpf_lsm"),
            "{}",
            plan.open.reason
        );

        let forced = Overrides {
            open_exec: OpenExecBackend::BpfLsm,
        };
        let plan = derive_plan(&without_bpf_lsm(healthy()), &forced);
        assert_eq!(plan.open.backend, Backend::BpfLsm);
        assert!(
            plan.open.reason.contains(
                "although the probe found it unusable: bpf is not in the active LSM list"
            ),
            "{}",
            plan.open.reason
        );

        let plan = derive_plan(
            &healthy(),
            &Overrides {
                open_exec: OpenExecBackend::None,
            },
        );
        assert_eq!(plan.open.backend, Backend::None);
        assert!(!plan.open.available && plan.open.forced);
    }

    #[test]
    fn override_values_parse() {
        assert_eq!(
            "fmod_ret".parse::<OpenExecBackend>().ok(),
            Some(OpenExecBackend::FmodRet)
        );
        assert_eq!(
            "bpf-lsm".parse::<OpenExecBackend>().ok(),
            Some(OpenExecBackend::BpfLsm)
        );
        assert_eq!(
            "auto".parse::<OpenExecBackend>().ok(),
            Some(OpenExecBackend::Auto)
        );
        assert_eq!(
            "none".parse::<OpenExecBackend>().ok(),
            Some(OpenExecBackend::None)
        );
        let err = "kprobe".parse::<OpenExecBackend>().unwrap_err().to_string();
        assert!(
            err.contains("\"kprobe\"") && err.contains("fmod_ret"),
            "{err}"
        );
    }
}
