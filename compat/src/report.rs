//! The probe report: what `kyverno-runtime probe` prints.
//!
//! The JSON form is a stable, versioned schema documented in
//! `docs/probe-json.md` and pinned by `compat/tests/schema.rs`. Adding a
//! field is compatible; renaming or removing one bumps [`SCHEMA_VERSION`].

use crate::measure::{MapId, Measurements, Outcome, ProgramId};
use crate::plan::{derive_plan, Behavior, Overrides, Plan};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Version of the `probe --json` schema.
pub const SCHEMA_VERSION: u32 = 1;

/// The full probe report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    /// [`SCHEMA_VERSION`] of this document.
    pub schema_version: u32,
    /// What was measured.
    #[serde(flatten)]
    pub measurements: Measurements,
    /// The overrides in force, as the operator spelled them.
    pub overrides: OverridesReport,
    /// The plan derived from the measurements and overrides.
    pub plan: Plan,
}

/// The overrides section of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OverridesReport {
    /// `--open-exec` (`auto` when not forced).
    pub open_exec: String,
}

impl ProbeReport {
    /// Builds the report: derives the plan from `measurements` under `overrides`.
    pub fn new(measurements: Measurements, overrides: &Overrides) -> Self {
        let plan = derive_plan(&measurements, overrides);
        ProbeReport {
            schema_version: SCHEMA_VERSION,
            measurements,
            overrides: OverridesReport {
                open_exec: overrides.open_exec.to_string(),
            },
            plan,
        }
    }

    /// Renders the report as tables for a person.
    pub fn to_table(&self) -> String {
        let m = &self.measurements;
        let k = &m.kernel;
        let mut out = String::new();
        let lsm = match &k.lsm.active {
            Some(list) => format!(
                "{}{}",
                list.join(","),
                if k.lsm.bpf_active {
                    ""
                } else {
                    "  (bpf absent)"
                }
            ),
            None => format!(
                "unknown: {}",
                k.lsm.error.as_deref().unwrap_or("unreadable")
            ),
        };
        let cgroup = match &k.cgroup.v2_mount {
            Some(p) => format!("{}, v2 at {}", k.cgroup.layout.name(), p.display()),
            None => format!("{}, no cgroup v2 mount", k.cgroup.layout.name()),
        };
        let bpffs = match &k.bpffs.path {
            Some(p) => format!("mounted at {}", p.display()),
            None => "not mounted".to_string(),
        };
        let rows = [
            ("kernel", k.release.clone()),
            ("btf", yes_no(k.btf).to_string()),
            ("lsm", lsm),
            (
                "lockdown",
                k.lockdown.clone().unwrap_or_else(|| "n/a".into()),
            ),
            ("cgroup", cgroup),
            ("bpffs", bpffs),
        ];
        for (name, value) in rows {
            let _ = writeln!(out, "{name:<10} {value}");
        }
        if !m.bpf_objects_built {
            let _ = writeln!(out, "warning    this binary was built without BPF objects");
        }

        let _ = writeln!(
            out,
            "\n{:<30} {:<6} {:<8} {:<5} DETAIL",
            "PROGRAM", "LOADS", "ATTACHES", "RUNS"
        );
        for id in ProgramId::ALL {
            let o = m.program(id);
            let _ = writeln!(
                out,
                "{:<30} {:<6} {:<8} {:<5} {}",
                id.section(),
                yes_no(o.loads),
                yes_no(o.attaches),
                runs(&o),
                detail(&o)
            );
        }
        let _ = writeln!(out, "\n{:<30} {:<8} DETAIL", "MAP", "CREATES");
        for id in MapId::ALL {
            let o = m.map(id);
            let _ = writeln!(
                out,
                "{:<30} {:<8} {}",
                id.type_name(),
                yes_no(o.loads),
                detail(&o)
            );
        }
        let _ = writeln!(
            out,
            "\n{:<10} {:<22} {:<9} REASON",
            "BEHAVIOR", "BACKEND", "AVAILABLE"
        );
        for behavior in Behavior::ALL {
            let e = self.plan.entry(behavior);
            let backend = if e.forced {
                format!("{} (forced)", e.backend)
            } else {
                e.backend.to_string()
            };
            let _ = writeln!(
                out,
                "{:<10} {:<22} {:<9} {}",
                behavior.name(),
                backend,
                yes_no(e.available),
                e.reason
            );
        }
        out
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn runs(o: &Outcome) -> &'static str {
    match o.runs {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

fn detail(o: &Outcome) -> String {
    match &o.failure {
        Some(f) => f.message.clone(),
        None if o.runs == Some(false) => "attached but never ran".into(),
        None => String::new(),
    }
}
