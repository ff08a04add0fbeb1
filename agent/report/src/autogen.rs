//! Which pod controllers a policy's findings roll up to: Kyverno's
//! `pod-policies.kyverno.io/autogen-controllers` annotation, read the way
//! Kyverno reads it.
//!
//! Kyverno applies a rule written for Pods to the controllers that make
//! them, because the controller is what a person fixes and one result per
//! replica fills etcd. A RuntimePolicy's findings are about pods too; the
//! same annotation says which controllers they are reported on:
//!
//! - absent or `all`: every supported controller ([`ControllerKind::ALL`]);
//! - `none`: none, every finding stays on its pod's Report;
//! - a comma-separated list of kinds (`Deployment,StatefulSet`): those.
//!
//! A ReplicaSet is never a roll-up target on its own (Kyverno excludes it:
//! a Deployment's ReplicaSets come and go with every rollout, so a Report
//! on one would be orphaned by the next); a Deployment is reached through
//! its ReplicaSet, a CronJob through its Job. The chart's
//! ValidatingAdmissionPolicy refuses an unknown kind when the policy is
//! applied; [`Autogen::parse`] still names the ones it ignores, for a
//! cluster where that policy is not installed.

use std::collections::BTreeSet;
use std::fmt;

/// The annotation on a RuntimePolicy that selects roll-up targets.
pub const AUTOGEN_ANNOTATION: &str = "pod-policies.kyverno.io/autogen-controllers";

/// A controller a finding can be rolled up to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerKind {
    /// `apps/v1` Deployment, through its ReplicaSet.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `apps/v1` DaemonSet.
    DaemonSet,
    /// `batch/v1` Job.
    Job,
    /// `batch/v1` CronJob, through its Job.
    CronJob,
}

impl ControllerKind {
    /// Every supported kind: what `all` means.
    pub const ALL: [ControllerKind; 5] = [
        ControllerKind::Deployment,
        ControllerKind::StatefulSet,
        ControllerKind::DaemonSet,
        ControllerKind::Job,
        ControllerKind::CronJob,
    ];

    /// The kind as Kubernetes spells it (and as the annotation lists it).
    pub fn as_str(self) -> &'static str {
        match self {
            ControllerKind::Deployment => "Deployment",
            ControllerKind::StatefulSet => "StatefulSet",
            ControllerKind::DaemonSet => "DaemonSet",
            ControllerKind::Job => "Job",
            ControllerKind::CronJob => "CronJob",
        }
    }

    /// The kind's `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            ControllerKind::Deployment
            | ControllerKind::StatefulSet
            | ControllerKind::DaemonSet => "apps/v1",
            ControllerKind::Job | ControllerKind::CronJob => "batch/v1",
        }
    }

    /// The kind named exactly `kind` (case-sensitive, as Kyverno compares
    /// kinds), if it is a supported one.
    pub fn from_kind(kind: &str) -> Option<ControllerKind> {
        ControllerKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for ControllerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy's roll-up setting: the controller kinds its findings are
/// reported on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autogen {
    kinds: BTreeSet<ControllerKind>,
}

impl Default for Autogen {
    /// `all`, as an absent annotation means.
    fn default() -> Self {
        Autogen::all()
    }
}

impl Autogen {
    /// Every supported controller (the annotation absent, or `all`).
    pub fn all() -> Autogen {
        Autogen {
            kinds: ControllerKind::ALL.into_iter().collect(),
        }
    }

    /// No roll-up (`none`): findings stay on their pods' Reports.
    pub fn none() -> Autogen {
        Autogen {
            kinds: BTreeSet::new(),
        }
    }

    /// Reads the annotation's value (`None`: the annotation is absent), and
    /// returns the entries it ignored because they name no supported kind.
    ///
    /// Entries are separated by commas and trimmed; empty entries are
    /// skipped, so an empty value means no controller, as it does in
    /// Kyverno (the chart's admission policy refuses it and asks for
    /// `none`).
    pub fn parse(value: Option<&str>) -> (Autogen, Vec<String>) {
        let value = match value.map(str::trim) {
            None | Some("all") => return (Autogen::all(), Vec::new()),
            Some("none") => return (Autogen::none(), Vec::new()),
            Some(v) => v,
        };
        let mut kinds = BTreeSet::new();
        let mut unknown = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match ControllerKind::from_kind(entry) {
                Some(kind) => {
                    kinds.insert(kind);
                }
                None => unknown.push(entry.to_string()),
            }
        }
        (Autogen { kinds }, unknown)
    }

    /// Whether findings roll up to controllers of `kind`.
    pub fn allows(&self, kind: ControllerKind) -> bool {
        self.kinds.contains(&kind)
    }

    /// Whether no controller is a roll-up target.
    pub fn is_none(&self) -> bool {
        self.kinds.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use ControllerKind::*;

    fn kinds(a: &Autogen) -> Vec<ControllerKind> {
        ControllerKind::ALL
            .into_iter()
            .filter(|k| a.allows(*k))
            .collect()
    }

    #[test]
    fn absent_and_all_mean_every_supported_controller() {
        for value in [None, Some("all"), Some(" all ")] {
            let (a, unknown) = Autogen::parse(value);
            assert_eq!(kinds(&a), ControllerKind::ALL, "{value:?}");
            assert!(unknown.is_empty());
        }
        assert_eq!(Autogen::default(), Autogen::all());
    }

    #[test]
    fn none_and_empty_mean_no_roll_up() {
        for value in ["none", "", " , "] {
            let (a, unknown) = Autogen::parse(Some(value));
            assert!(a.is_none(), "{value:?}");
            assert!(unknown.is_empty());
        }
    }

    #[test]
    fn a_list_limits_the_kinds_and_names_what_it_ignores() {
        let (a, unknown) = Autogen::parse(Some("StatefulSet"));
        assert_eq!(kinds(&a), [StatefulSet]);
        assert!(unknown.is_empty());

        let (a, unknown) = Autogen::parse(Some(" Deployment ,CronJob,,Job"));
        assert_eq!(kinds(&a), [Deployment, Job, CronJob]);
        assert!(unknown.is_empty());

        // A bare ReplicaSet is never a target; kinds are case-sensitive,
        // as in Kyverno.
        let (a, unknown) = Autogen::parse(Some("ReplicaSet,deployment,DaemonSet,Pod"));
        assert_eq!(kinds(&a), [DaemonSet]);
        assert_eq!(unknown, ["ReplicaSet", "deployment", "Pod"]);
    }

    #[test]
    fn kinds_and_api_versions() {
        for kind in ControllerKind::ALL {
            assert_eq!(ControllerKind::from_kind(kind.as_str()), Some(kind));
        }
        assert_eq!(ControllerKind::from_kind("ReplicaSet"), None);
        assert_eq!(Deployment.api_version(), "apps/v1");
        assert_eq!(CronJob.api_version(), "batch/v1");
        assert_eq!(Job.to_string(), "Job");
    }
}
