//! The real monitor as every driver's reporter: it is given each policy as
//! the daemon gives it, handed the events the daemon would hand it (made
//! from what the product decided or drained), and its findings are read
//! back in the model's terms ([`Finding`]).

use crate::model::{Decision, Finding, Kind, Mode, Outcome, Policy};
use kyverno_runtime_api::runtimepolicy::RuntimePolicyMode;
use kyverno_runtime_plane::collector::Sink as _;
use kyverno_runtime_plane::{Event as PlaneEvent, FindingSink, Monitor, MonitorPolicy, PodRef};
use kyverno_runtime_policy::compile::{CompiledPolicy, EvaluationResult};
use kyverno_runtime_report as report;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

/// The pod's identity as findings name it.
pub(crate) const POD_UID: &str = "pod-uid";

/// Takes the monitor's findings.
#[derive(Default)]
struct Capture(Mutex<Vec<report::Finding>>);

impl FindingSink for Capture {
    fn submit(&self, finding: report::Finding) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(finding);
    }
}

impl Capture {
    fn take(&self) -> Vec<report::Finding> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The real monitor for the one pod (`default/web`, labelled as
/// `crate::userspace::spec` selectors expect), with a sink that keeps
/// what it reports.
pub(crate) struct Reporter {
    monitor: Monitor,
    capture: Arc<Capture>,
    pod: Arc<PodRef>,
}

impl Reporter {
    /// A monitor with no policy, the pod's namespace known.
    pub(crate) fn new(pod_labels: BTreeMap<String, String>) -> Self {
        let capture = Arc::new(Capture::default());
        let monitor = Monitor::new(vec![capture.clone() as Arc<dyn FindingSink>], None);
        monitor.set_namespace("default", BTreeMap::new());
        Self {
            monitor,
            capture,
            pod: Arc::new(PodRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: POD_UID.into(),
                labels: pod_labels,
                ..PodRef::default()
            }),
        }
    }

    /// Gives the monitor `p` as the daemon does, compiled and evaluated.
    pub(crate) fn set_policy(
        &self,
        p: &Policy,
        compiled: &CompiledPolicy,
        result: &EvaluationResult,
    ) {
        self.monitor.set_policy(MonitorPolicy::new(
            p.name.clone(),
            p.name.clone(),
            match p.mode {
                Mode::Monitor => RuntimePolicyMode::Monitor,
                Mode::Enforce => RuntimePolicyMode::Enforce,
            },
            compiled.target.clone(),
            result,
            Vec::new(),
        ));
    }

    /// Takes the policy of that name away.
    pub(crate) fn remove_policy(&self, name: &str) {
        self.monitor.remove_policy(name);
    }

    /// The findings the monitor makes of the pod's `events`.
    pub(crate) fn findings(&self, events: Vec<PlaneEvent>) -> BTreeSet<Finding> {
        self.findings_by_target(events)
            .into_values()
            .flatten()
            .collect()
    }

    /// The findings the monitor makes of the pod's `events`, by the
    /// target they name (a path, an address).
    pub(crate) fn findings_by_target(
        &self,
        events: Vec<PlaneEvent>,
    ) -> BTreeMap<String, BTreeSet<Finding>> {
        for mut e in events {
            e.pod = Some(self.pod.clone());
            self.monitor.handle(&e);
        }
        let mut out: BTreeMap<String, BTreeSet<Finding>> = BTreeMap::new();
        for f in self.capture.take() {
            out.entry(f.target.clone()).or_default().insert(finding(f));
        }
        out
    }
}

/// A captured finding in the model's terms.
fn finding(f: report::Finding) -> Finding {
    Finding {
        policy: f.policy,
        kind: match f.behavior {
            report::Behavior::Network => Kind::Network,
            report::Behavior::Open => Kind::Open,
            report::Behavior::Exec => Kind::Exec,
            report::Behavior::Protocol => Kind::Protocol,
            report::Behavior::Dns => Kind::Dns,
        },
        enforced: f.enforced,
        decision: match f.decision {
            Some(report::Decision::Denied) => Decision::Denied,
            Some(report::Decision::DefaultDenied) => Decision::DefaultDenied,
            None => Decision::Unexpected,
        },
    }
}

/// The model's findings as a Report carries them ([`Decision::reported`]).
pub(crate) fn reported(outcome: &Outcome) -> BTreeSet<Finding> {
    outcome
        .findings
        .iter()
        .map(|f| Finding {
            decision: f.decision.reported(),
            ..f.clone()
        })
        .collect()
}
