//! Driver (a) and (d): the real compiler, the real managers over the
//! reference backends (`FakeEnforcer`: the state a kernel backend would be
//! programmed with, decided in userspace) and the real monitor, checked
//! against the model ([`crate::model`]).
//!
//! What each event is checked on:
//!
//! - open, exec, network: the refusal the managers' programmed state
//!   makes for the pod's cgroup, and the findings the monitor makes of the
//!   event with that refusal;
//! - protocol: the monitor's findings, given the model's refusal (the
//!   classifier decides in the kernel; its driver is the BPF one);
//! - dns: the monitor's findings (dns never refuses).

use crate::model::{self, Cluster, Event, Finding, Mode, Outcome, Policy};
use crate::reporting::{Reporter, POD_UID};
use kyverno_runtime_api::runtimepolicy::RuntimePolicySpec;
use kyverno_runtime_bpf::egress::Domain;
use kyverno_runtime_compat::{Backend, Behavior as CompatBehavior};
use kyverno_runtime_enforce::egress::{
    ContainerCgroup, Destination, EgressManager, NetworkPod, NetworkPolicy,
};
use kyverno_runtime_enforce::fake::FakeEnforcer;
use kyverno_runtime_enforce::names::ServiceName;
use kyverno_runtime_enforce::openexec::{self, OpenExecManager, OpenExecPolicy, Pod};
use kyverno_runtime_enforce::{PolicyId, Program};
use kyverno_runtime_plane::{Event as PlaneEvent, Facts, KernelVerdict};
use kyverno_runtime_policy::compile::{CompiledPolicy, EvaluationResult};
use kyverno_runtime_policy::rule::{self, BehaviorLists, Matches};
use kyverno_runtime_policy::values::{AbsPath, BehaviorKind};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

/// The pod every event comes from: one container cgroup.
const CGROUP: u64 = 1;

type OpenExec = OpenExecManager<FakeEnforcer<AbsPath>, FakeEnforcer<AbsPath>>;

/// The product's layers from the compiler to the managers and the monitor,
/// for one pod.
pub struct System {
    openexec: OpenExec,
    egress: EgressManager<FakeEnforcer<Destination>>,
    reporter: Reporter,
    cluster: Cluster,
}

/// What the product did with one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The refusal its programmed state makes (`None`: not decided here).
    pub refused: Option<bool>,
    /// The monitor's findings.
    pub findings: BTreeSet<Finding>,
}

/// Why a case could not even be run.
#[derive(Debug)]
pub struct SetupError(pub String);

fn labels(selects: bool) -> BTreeMap<String, String> {
    [(
        "app".to_owned(),
        if selects { "web" } else { "other" }.to_owned(),
    )]
    .into()
}

/// The spec a user would write for `p` (its selector selects the pod
/// exactly when `p.selects`).
pub fn spec(p: &Policy) -> serde_json::Value {
    let behaviors: Vec<serde_json::Value> = p
        .behaviors
        .iter()
        .map(|b| {
            let mut lists = serde_json::Map::new();
            if !b.allow.is_empty() {
                lists.insert("allow".into(), serde_json::json!({"values": b.allow}));
            }
            if !b.deny.is_empty() {
                lists.insert("deny".into(), serde_json::json!({"values": b.deny}));
            }
            serde_json::json!({ b.kind.as_str(): lists })
        })
        .collect();
    serde_json::json!({
        "mode": match p.mode { Mode::Monitor => "monitor", Mode::Enforce => "enforce" },
        "podSelector": {"matchLabels": {"app": if p.selects { "web" } else { "nobody" }}},
        "behaviors": behaviors,
    })
}

/// Compiles and evaluates `p` as the daemon does (its literal values, so
/// no data is needed).
pub fn compile(p: &Policy) -> Result<(CompiledPolicy, EvaluationResult), SetupError> {
    let spec: RuntimePolicySpec = serde_json::from_value(spec(p))
        .map_err(|e| SetupError(format!("{}: the spec does not parse: {e}", p.name)))?;
    let compiled = CompiledPolicy::compile(&spec).map_err(|e| {
        SetupError(format!(
            "{}: the compiler refused a valid policy: {}",
            p.name,
            joined(&e)
        ))
    })?;
    let result = compiled
        .evaluate()
        .map_err(|e| SetupError(format!("{}: evaluation failed: {}", p.name, joined(&e))))?;
    Ok((compiled, result))
}

/// Errors as one line.
fn joined<E: std::fmt::Display>(errors: &[E]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl System {
    /// A pod (its cgroup bound nowhere yet) and no policy, in `cluster`
    /// (its Services listed, as the daemon's watch does).
    pub fn new(cluster: &Cluster) -> Result<Self, SetupError> {
        let fake = |b| FakeEnforcer::new(b, Backend::BpfLsm);
        let mut openexec =
            OpenExecManager::new(fake(CompatBehavior::Open), fake(CompatBehavior::Exec))
                .map_err(|e| SetupError(e.to_string()))?;
        let mut egress = EgressManager::new(FakeEnforcer::new(
            CompatBehavior::Network,
            Backend::CgroupSkbEgress,
        ))
        .map_err(|e| SetupError(e.to_string()))?;
        openexec.reconcile_adopted(&BTreeSet::new());
        egress.reconcile_adopted(&BTreeSet::new());
        for (namespace, name, addrs) in &cluster.services {
            egress.set_service_addresses(
                ServiceName::new(namespace.clone(), name.clone()),
                Some(addrs.iter().copied().collect()),
            );
        }
        egress.services_synced();
        let pod_labels = labels(true);
        openexec.upsert_pod(Pod {
            uid: POD_UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            labels: pod_labels.clone(),
            namespace_labels: BTreeMap::new(),
            cgroups: vec![CGROUP],
        });
        egress.upsert_pod(NetworkPod {
            uid: POD_UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            labels: pod_labels.clone(),
            namespace_labels: BTreeMap::new(),
            cgroups: vec![ContainerCgroup {
                id: CGROUP,
                path: PathBuf::from("/sys/fs/cgroup/differential"),
            }],
        });
        Ok(System {
            openexec,
            egress,
            reporter: Reporter::new(pod_labels),
            cluster: cluster.clone(),
        })
    }

    /// Adds or replaces a policy, as the daemon programs one.
    pub fn apply(&mut self, p: &Policy) -> Result<(), SetupError> {
        let (compiled, result) = compile(p)?;
        let id = PolicyId::new(p.name.clone()).map_err(|e| SetupError(e.to_string()))?;
        let mode = match p.mode {
            Mode::Monitor => openexec::Mode::Monitor,
            Mode::Enforce => openexec::Mode::Enforce,
        };
        let outcome = self.openexec.upsert_policy(OpenExecPolicy {
            id: id.clone(),
            name: p.name.clone(),
            mode,
            target: compiled.target.clone(),
            open: BehaviorLists::merge(&result, BehaviorKind::Open),
            exec: BehaviorLists::merge(&result, BehaviorKind::Exec),
        });
        if !outcome.is_clean() {
            return Err(SetupError(format!(
                "{}: open/exec not programmed: {outcome:?}",
                p.name
            )));
        }
        let outcome = self.egress.upsert_policy(NetworkPolicy {
            id,
            name: p.name.clone(),
            mode,
            target: compiled.target.clone(),
            network: BehaviorLists::merge(&result, BehaviorKind::Network),
        });
        if !outcome.rejections.is_empty() || !outcome.failures.is_empty() {
            return Err(SetupError(format!(
                "{}: network not programmed: {outcome:?}",
                p.name
            )));
        }
        self.reporter.set_policy(p, &compiled, &result);
        Ok(())
    }

    /// Deletes a policy.
    pub fn delete(&mut self, name: &str) -> Result<(), SetupError> {
        let id = PolicyId::new(name.to_owned()).map_err(|e| SetupError(e.to_string()))?;
        let failures = self.openexec.delete_policy(&id);
        let more = self.egress.delete_policy(&id);
        if !failures.is_empty() || !more.is_empty() {
            return Err(SetupError(format!("{name}: not unprogrammed")));
        }
        self.reporter.remove_policy(name);
        Ok(())
    }

    /// What the kernel's DNS answer snooper would have learned for the
    /// pod's set, standing in for it (the fake backend learns nothing; the
    /// egress-bpf driver runs the real snooper): each address the pod's
    /// answers gave a domain that some program bound to the pod names, on
    /// any side (an observer's domains included), under that name.
    fn learned(&self) -> BTreeMap<IpAddr, Domain> {
        let named: BTreeSet<&Domain> = self
            .egress
            .programmed()
            .values()
            .filter(|h| h.cgroups.contains(&CGROUP))
            .flat_map(|h| match &h.program {
                Program::Enforce(r) => r.allow.iter().chain(&r.deny).collect::<Vec<_>>(),
                Program::Observe(watch) => watch.iter().collect(),
            })
            .filter_map(|d| match d {
                Destination::Domain(d) => Some(d),
                Destination::Prefix(_) => None,
            })
            .collect();
        let mut out = BTreeMap::new();
        for (name, addrs) in &self.cluster.domains {
            let Ok(domain) = Domain::new(name) else {
                continue;
            };
            if named.contains(&domain) {
                for a in addrs {
                    out.insert(*a, domain.clone());
                }
            }
        }
        out
    }

    /// The kernel's decision as the programmed state makes it, if this
    /// driver decides the event's kind.
    fn kernel(&self, event: &Event) -> Option<KernelVerdict> {
        let decision = match event {
            Event::Open(p) | Event::Exec(p) => {
                let path = AbsPath::parse(p).ok()?;
                let backend = if matches!(event, Event::Open(_)) {
                    self.openexec.open_backend()
                } else {
                    self.openexec.exec_backend()
                };
                backend.decide(CGROUP, &path)
            }
            Event::Connect(dest) => {
                network_decision(self.egress.programmed(), &self.learned(), *dest)
            }
            Event::Protocol { .. } | Event::Dns(_) => return None,
        };
        Some(decision.into())
    }

    /// What the product does with `event`; `model` stands in for the
    /// kernel where this driver does not decide (protocol). An exec is its
    /// binary's open first, as in the kernel (see [`model::decide_in`]).
    pub fn observe(&self, event: &Event, model: &Outcome) -> Observed {
        if let Event::Exec(p) = event {
            let open = self.observe_one(&Event::Open(p.clone()), model);
            if open.refused == Some(true) {
                return open;
            }
            let mut exec = self.observe_one(event, model);
            exec.findings.extend(open.findings);
            return exec;
        }
        self.observe_one(event, model)
    }

    fn observe_one(&self, event: &Event, model: &Outcome) -> Observed {
        let kernel = self.kernel(event);
        let verdict = kernel.or(match event {
            Event::Protocol { .. } => Some(if model.refused {
                KernelVerdict::Denied
            } else {
                KernelVerdict::Allowed
            }),
            _ => None,
        });
        let facts = match event {
            // The names the monitor judges Service values by, as the
            // daemon's drain fills them.
            Event::Connect(dest) => Facts::Net {
                dest: *dest,
                port: Some(443),
                names: {
                    let mut names = self.egress.destination_names().of(CGROUP, *dest);
                    names.extend(self.learned().get(dest).map(ToString::to_string));
                    names
                },
            },
            Event::Open(p) => Facts::Open { path: p.clone() },
            Event::Exec(p) => Facts::Exec {
                filename: p.clone(),
                argv: vec![p.clone()],
            },
            Event::Protocol { protocol, alpn } => Facts::Protocol {
                protocol,
                alpn: alpn.map(str::to_owned),
            },
            Event::Dns(q) => Facts::Dns { qname: q.clone() },
        };
        let mut e = PlaneEvent::new("differential", facts);
        e.cgroup = Some(CGROUP);
        // The kernel reports refusals; the observe path reports the rest
        // (the monitor judges both).
        e.kernel = verdict.filter(|v| v.refused());
        let findings = self.reporter.findings(vec![e]);
        Observed {
            refused: kernel.map(KernelVerdict::refused),
            findings,
        }
    }
}

/// The rule over the network programs bound to the pod's cgroup, each
/// prefix matched by containment (as the kernel's tries do).
fn network_decision(
    programmed: &BTreeMap<PolicyId, kyverno_runtime_enforce::Held<Destination>>,
    learned: &BTreeMap<IpAddr, Domain>,
    dest: IpAddr,
) -> kyverno_runtime_enforce::Decision {
    let hit = |set: &BTreeSet<Destination>| {
        set.iter().any(|d| match d {
            Destination::Prefix(p) => p.contains(dest),
            Destination::Domain(d) => learned.get(&dest) == Some(d),
        })
    };
    rule::decide(
        programmed
            .values()
            .filter(|h| h.cgroups.contains(&CGROUP))
            .filter_map(|h| match &h.program {
                Program::Enforce(r) => Some(Matches {
                    deny: hit(&r.deny),
                    allow: hit(&r.allow),
                    default_deny: r.default_deny,
                }),
                Program::Observe(_) => None,
            }),
    )
}

/// One disagreement between the product and the model.
#[derive(Clone, Debug)]
pub struct Disagreement {
    /// The event.
    pub event: Event,
    /// What the model says.
    pub model: Outcome,
    /// What the product did.
    pub product: Observed,
}

/// Checks `event` against the model over `policies` (the current set).
pub fn check(system: &System, policies: &[Policy], event: &Event) -> Option<Disagreement> {
    let want = model::decide_in(&system.cluster, policies, event);
    let got = system.observe(event, &want);
    let refused_differs = got.refused.is_some_and(|r| r != want.refused);
    let reported = crate::reporting::reported(&want);
    (refused_differs || got.findings != reported).then(|| Disagreement {
        event: event.clone(),
        model: want,
        product: got,
    })
}
