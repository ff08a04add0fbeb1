//! The engine: each kind of step, run against the real daemon and the real
//! API server, with its expectation compared to what was observed.
//!
//! Awaited steps (actions, Report results, conditions, shards, metrics)
//! are retried until they hold or their `within` passes, because the
//! daemon applies a change asynchronously; the difference reported is the
//! last observation. So a scenario proves enforcement first (a refusal
//! cannot come early) and absence after ("allowed" for another pod once
//! the refusal is in force). An exact Report count, once reached, and an
//! absent result are read again [`SETTLE`] later (before the next step
//! that is not a check, or at the end), so neither passes by being read
//! too early; consecutive checks share that wait.

use super::kubelet::RunningPod;
use super::net::{Listener, Resolver};
use super::NodeHalf;
use crate::child::{ChildReport, ChildTask, Op, Outcome};
use anyhow::{bail, Context as _};
use conformance::scenario::{
    describe_expectation, Action, ConditionCheck, Expect, MetricCheck, Payload, PolicyDef,
    ReportCheck, Scenario, ShardCheck, Step, StepKind, Transport, OPEN_EXEC_OF_NODE,
};
use conformance::wire;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kyverno_runtime_api::openreports::{Report, ReportResult};
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;

use std::time::{Duration, Instant};

/// How long after it held an exact count or an absence is read again (a
/// few report and drain intervals of 1 s).
const SETTLE: Duration = Duration::from_secs(3);
/// The pause between two tries of an awaited step.
const RETRY: Duration = Duration::from_millis(250);

/// One scenario's live state on this node.
pub struct ScenarioRun {
    /// Its running pods.
    pub pods: Vec<RunningPod>,
    /// Its resolvers (one in the shared network, or one per pod on a
    /// real node).
    pub resolvers: Vec<Resolver>,
    /// What happened, step by step.
    pub log: Vec<String>,
    /// Report checks to read again once [`SETTLE`] has passed.
    deferred: Vec<Deferred>,
}

/// A pod's new labels, recorded after a relabel.
type PodLabels = (String, BTreeMap<String, String>);

/// A Report check that held, to be read again later.
struct Deferred {
    label: String,
    check: ReportCheck,
    since: Instant,
}

impl ScenarioRun {
    /// Nothing running yet.
    pub fn new() -> ScenarioRun {
        ScenarioRun {
            pods: Vec::new(),
            resolvers: Vec::new(),
            log: Vec::new(),
            deferred: Vec::new(),
        }
    }

    fn pod(&self, name: &str) -> anyhow::Result<&RunningPod> {
        self.pods
            .iter()
            .find(|p| p.def.name == name)
            .with_context(|| format!("no running pod {name}"))
    }
}

/// Applies a RuntimePolicy (create or update).
pub fn apply_policy(cluster: &super::Cluster, p: &PolicyDef) -> anyhow::Result<()> {
    cluster
        .apply(
            &cluster.all::<RuntimePolicy>(),
            &p.name,
            serde_json::json!({"apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
                "metadata": {"name": p.name, "annotations": p.annotations},
                "spec": p.spec}),
        )
        .with_context(|| format!("applying policy {}", p.name))?;
    Ok(())
}

/// What an action did, as the expectation is phrased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Observed {
    Allowed,
    Refused(String),
    Delivered(String),
    Dropped(String),
    Answered(Vec<IpAddr>),
    Nxdomain,
    /// Neither: the harness or the network did something unexpected.
    Other(String),
}

impl Observed {
    pub(super) fn matches(&self, expect: Expect, errno: &str) -> bool {
        match (self, expect) {
            (Observed::Allowed, Expect::Allowed) => true,
            (Observed::Refused(e), Expect::Refused) => e == errno,
            (Observed::Delivered(_), Expect::Delivered) => true,
            (Observed::Dropped(_), Expect::Dropped) => true,
            (Observed::Answered(_), Expect::Answered) => true,
            (Observed::Nxdomain, Expect::Nxdomain) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Observed::Allowed => f.write_str("allowed"),
            Observed::Refused(e) => write!(f, "refused ({e})"),
            Observed::Delivered(d) => write!(f, "delivered ({d})"),
            Observed::Dropped(d) => write!(f, "dropped ({d})"),
            Observed::Answered(a) => write!(
                f,
                "answered {}",
                a.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Observed::Nxdomain => f.write_str("nxdomain"),
            Observed::Other(o) => write!(f, "neither: {o}"),
        }
    }
}

fn errno_name(n: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(n))
}

/// The label of a step in messages: `step 3 (exec /x in ns/web)`.
pub(super) fn label(step: &Step, run: &ScenarioRun) -> String {
    let what = match &step.kind {
        StepKind::Action { action, .. } => {
            let ns = run
                .pods
                .iter()
                .find(|p| p.def.name == action.pod())
                .map(|p| p.namespace().to_string())
                .unwrap_or_default();
            format!("{action} in {ns}/{}", action.pod())
        }
        StepKind::Report(r) => format!(
            "report of pod {}: {} {} {}",
            r.pod, r.policy, r.behavior, r.target
        ),
        StepKind::Condition(c) => format!("condition {} of {}", c.type_, c.policy),
        StepKind::Shard(s) => format!("this node's shard of {}", s.policy),
        StepKind::Metric(m) => format!("metric {}{:?}", m.name, m.labels),
        StepKind::Relabel(r) => match (&r.pod, &r.namespace) {
            (Some(p), _) => format!("relabel pod {p}"),
            (_, Some(n)) => format!("relabel namespace {n}"),
            _ => "relabel".into(),
        },
        StepKind::ApplyPolicy(p) => format!("apply policy {}", p.name),
        StepKind::DeletePolicy(p) => format!("delete policy {p}"),
        StepKind::DeleteService(s) => format!("delete Service {s}"),
        StepKind::RestartDaemon(_) => "restart the daemon".into(),
    };
    let broken = if step.broken {
        ", flipped by --break"
    } else {
        ""
    };
    format!("step {} ({what}{broken})", step.number)
}

impl NodeHalf {
    /// Runs one step; an error is the scenario's first difference.
    pub(super) fn step(
        &mut self,
        s: &Scenario,
        step: &Step,
        run: &mut ScenarioRun,
    ) -> anyhow::Result<()> {
        let label = label(step, run);
        // Anything but a check may change what the deferred checks read
        // (an action adds to a count, a deleted policy's results go).
        let check = matches!(
            step.kind,
            StepKind::Report(_) | StepKind::Condition(_) | StepKind::Shard(_) | StepKind::Metric(_)
        );
        if !check {
            self.settle(run)?;
        }
        let started = Instant::now();
        let result = match &step.kind {
            StepKind::Action {
                action,
                expect,
                errno,
            } => self.await_action(s, run, action, *expect, errno, step.within),
            StepKind::Report(r) => self.await_report(run, r, step.within).inspect(|_| {
                if r.absent || r.count.is_some() {
                    run.deferred.push(Deferred {
                        label: label.clone(),
                        check: r.clone(),
                        since: Instant::now(),
                    });
                }
            }),
            StepKind::Condition(c) => self.await_condition(c, step.within),
            StepKind::Shard(c) => self.await_shard(c, step.within),
            StepKind::Metric(m) => self.await_metric(m, step.within),
            StepKind::Relabel(_)
            | StepKind::ApplyPolicy(_)
            | StepKind::DeletePolicy(_)
            | StepKind::DeleteService(_) => {
                self.mutation(s, run, &step.kind).map(|(what, update)| {
                    if let Some((pod, labels)) = update {
                        if let Some(p) = run.pods.iter_mut().find(|p| p.def.name == pod) {
                            p.def.labels = labels;
                        }
                    }
                    what
                })
            }
            StepKind::RestartDaemon(r) => self.restart(s, run, r),
        };
        match result {
            Ok(what) => {
                run.log.push(format!(
                    "{label}: {what} [{:.1}s]",
                    started.elapsed().as_secs_f64()
                ));
                Ok(())
            }
            Err(e) => {
                run.log.push(format!(
                    "{label}: FAILED [{:.1}s]",
                    started.elapsed().as_secs_f64()
                ));
                Err(e.context(label))
            }
        }
    }

    /// Reads the deferred Report checks again once [`SETTLE`] has passed
    /// since the last of them held: an exact count must not have grown,
    /// an absent result must not have appeared.
    pub(super) fn settle(&self, run: &mut ScenarioRun) -> anyhow::Result<()> {
        let Some(last) = run.deferred.iter().map(|d| d.since).max() else {
            return Ok(());
        };
        let wait = SETTLE.saturating_sub(last.elapsed());
        std::thread::sleep(wait);
        for d in std::mem::take(&mut run.deferred) {
            let (found, _) = self.read_report(run, &d.check)?;
            let changed = match (&found, d.check.absent, d.check.count) {
                (Some(x), true, _) => Some(format!("the result appeared: {}", summarize(x))),
                (None, false, _) => Some("the result disappeared".to_string()),
                (Some(x), false, Some(want)) => {
                    let count: u64 = prop(x, "count").and_then(|n| n.parse().ok()).unwrap_or(0);
                    (count != want)
                        .then(|| format!("count {count}, expected {want}: {}", summarize(x)))
                }
                _ => None,
            };
            if let Some(why) = changed {
                run.log.push(format!("{}: FAILED when read again", d.label));
                bail!(
                    "{}: read again {:.1}s later, {why}",
                    d.label,
                    d.since.elapsed().as_secs_f64()
                );
            }
            run.log.push(format!(
                "{}: still so {:.1}s later (waited {:.1}s for it)",
                d.label,
                d.since.elapsed().as_secs_f64(),
                wait.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// The Report result a check looks for, and a summary of all.
    fn read_report(
        &self,
        run: &ScenarioRun,
        c: &ReportCheck,
    ) -> anyhow::Result<(Option<ReportResult>, Vec<String>)> {
        let pod = run.pod(&c.pod)?;
        let reports = self.cluster.ns::<Report>(pod.namespace());
        let name = format!("kyverno-runtime-{}", c.pod);
        let results = self
            .cluster
            .get(&reports, &name)?
            .and_then(|r| r.spec.results)
            .unwrap_or_default();
        let summary = results.iter().map(summarize).collect();
        let found = results.into_iter().find(|x| {
            x.policy == c.policy
                && x.rule.as_deref() == Some(c.behavior.as_str())
                && prop(x, "target") == Some(c.target.as_str())
        });
        Ok((found, summary))
    }

    // ------------------------------------------------------------ actions

    fn await_action(
        &self,
        s: &Scenario,
        run: &ScenarioRun,
        action: &Action,
        expect: Expect,
        errno: &str,
        within: Duration,
    ) -> anyhow::Result<String> {
        let start = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            let seen = self.attempt(s, run, action)?;
            if seen.matches(expect, errno) {
                return Ok(format!("{seen} (try {tries})"));
            }
            if start.elapsed() >= within {
                let want = describe_expectation(&StepKind::Action {
                    action: action.clone(),
                    expect,
                    errno: errno.to_string(),
                });
                bail!(
                    "expected {want}, observed {seen} ({tries} tries over {:.1}s)",
                    start.elapsed().as_secs_f64()
                );
            }
            std::thread::sleep(RETRY);
        }
    }

    /// One try of an action by a workload process in its pod.
    pub(super) fn attempt(
        &self,
        s: &Scenario,
        run: &ScenarioRun,
        action: &Action,
    ) -> anyhow::Result<Observed> {
        let pod = run.pod(action.pod())?;
        let procs = pod.procs(action.container())?;
        let sandbox = match (&pod.sandbox, &self.sandbox) {
            (Some(own), _) => own.as_ref(),
            (None, Some(shared)) => shared,
            (None, None) => bail!("pod {} has no network", pod.def.name),
        };
        // On a real node the program and the file are the container's.
        let mntns = pod
            .pid(action.container())?
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/mnt")));
        let cgroupns = mntns
            .is_some()
            .then(|| PathBuf::from(super::realpod::NODE_CGROUPNS));
        let task = |op: Op| ChildTask {
            procs: procs.clone(),
            netns: sandbox.path().clone(),
            mntns: mntns.clone(),
            cgroupns: cgroupns.clone(),
            op,
        };
        match action {
            Action::Exec(a) => {
                let r = self.child(&task(Op::Exec {
                    path: a.path.clone().into(),
                    args: a.args.clone(),
                }))?;
                Ok(plain(&r.outcome))
            }
            Action::Open(a) => {
                let r = self.child(&task(Op::Open {
                    path: a.path.clone().into(),
                }))?;
                Ok(plain(&r.outcome))
            }
            Action::Resolve(a) => {
                let resolver = s.resolver.as_ref().context("no resolver")?;
                let r = self.child(&task(Op::Resolve {
                    resolver: SocketAddr::new(resolver.address, 53),
                    name: a.name.clone(),
                    ipv6: a.ipv6,
                }))?;
                Ok(match r.outcome {
                    Outcome::Answer(0, addrs) if !addrs.is_empty() => Observed::Answered(addrs),
                    Outcome::Answer(3, _) => Observed::Nxdomain,
                    Outcome::Answer(rcode, _) => {
                        Observed::Other(format!("rcode {rcode} and no address"))
                    }
                    Outcome::NoAnswer => Observed::Other("no answer".into()),
                    Outcome::Errno(n) => {
                        Observed::Other(format!("the question was refused: {}", errno_name(n)))
                    }
                    other => Observed::Other(format!("{other:?}")),
                })
            }
            Action::Connect(a) => {
                let udp = a.transport == Transport::Udp;
                let payload = match (a.send, udp) {
                    (Payload::None, false) => Vec::new(),
                    (Payload::None | Payload::Text, _) => wire::TEXT.to_vec(),
                    (Payload::Ssh, _) => wire::SSH_BANNER.to_vec(),
                    (Payload::Tls, _) => wire::client_hello(a.alpn.as_deref().unwrap_or("h2")),
                };
                let (to, resolve) = match (&a.to, &a.name, a.port) {
                    (Some(to), _, _) => (*to, None),
                    (None, Some(name), Some(port)) => {
                        let r = s.resolver.as_ref().context("no resolver")?;
                        // The listener waits where the resolver's answer
                        // points; an unknown name gets none.
                        let ip = r
                            .records
                            .get(name)
                            .and_then(|addrs| addrs.iter().find(|ip| ip.is_ipv6() == a.ipv6))
                            .copied()
                            .with_context(|| format!("the resolver has no answer for {name}"))?;
                        (
                            SocketAddr::new(ip, port),
                            Some((SocketAddr::new(r.address, 53), name.clone(), a.ipv6, port)),
                        )
                    }
                    _ => bail!("a connect without a destination"),
                };
                sandbox.add_address(to.ip())?;
                let listener = Listener::start(sandbox, to, udp, payload.len())?;
                let expected = payload.len();
                let r = self.child(&task(Op::Send {
                    to: resolve.is_none().then_some(to),
                    resolve,
                    udp,
                    payload,
                }))?;
                let arrived = listener.finish()?;
                if let Some(res) = &r.resolved {
                    if !matches!(res, Outcome::Answer(0, _)) {
                        return Ok(Observed::Other(format!(
                            "{} did not resolve: {res:?}",
                            a.name.as_deref().unwrap_or("?")
                        )));
                    }
                }
                Ok(match r.outcome {
                    Outcome::TimedOut => Observed::Dropped("the handshake timed out".into()),
                    Outcome::Errno(1) => {
                        Observed::Dropped("the kernel refused the send: EPERM".into())
                    }
                    Outcome::Errno(n) => {
                        Observed::Other(format!("the send failed: {}", errno_name(n)))
                    }
                    Outcome::Done if udp => {
                        if arrived.accepted {
                            Observed::Delivered(format!("{} bytes arrived", arrived.bytes))
                        } else {
                            Observed::Dropped("sent, nothing arrived".into())
                        }
                    }
                    Outcome::Done => {
                        if arrived.accepted && arrived.bytes >= expected {
                            Observed::Delivered(format!(
                                "accepted, {} of {expected} bytes arrived",
                                arrived.bytes
                            ))
                        } else if arrived.accepted {
                            Observed::Dropped(format!(
                                "accepted, {} of {expected} bytes arrived",
                                arrived.bytes
                            ))
                        } else {
                            Observed::Other("connected, yet the listener saw no connection".into())
                        }
                    }
                    other => Observed::Other(format!("{other:?}")),
                })
            }
        }
    }

    fn child(&self, task: &ChildTask) -> anyhow::Result<ChildReport> {
        let json = serde_json::to_string(task)?;
        let out = Command::new(&self.plan.me)
            .arg("child")
            .arg(&json)
            .output()
            .context("running a workload process")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default();
        let report: ChildReport = serde_json::from_str(line).with_context(|| {
            format!(
                "the workload process said {:?} (stderr {:?})",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        if let Outcome::Broken(why) = &report.outcome {
            bail!("the workload process could not run: {why}");
        }
        Ok(report)
    }

    // ------------------------------------------------------------ checks

    fn await_report(
        &self,
        run: &ScenarioRun,
        c: &ReportCheck,
        within: Duration,
    ) -> anyhow::Result<String> {
        let start = Instant::now();
        if c.absent {
            // Read now and again after the settle (see `settle`).
            if let (Some(found), _) = self.read_report(run, c)? {
                bail!("expected no such result, observed {}", summarize(&found));
            }
            return Ok("absent so far".into());
        }
        let mismatch = |x: &ReportResult| -> Option<String> {
            let count: u64 = prop(x, "count").and_then(|n| n.parse().ok()).unwrap_or(0);
            if let Some(want) = c.count {
                if count != want {
                    return Some(format!("count {count}, expected {want}"));
                }
            }
            if let Some(min) = c.min_count {
                if count < min {
                    return Some(format!("count {count}, expected at least {min}"));
                }
            }
            if let Some(result) = &c.result {
                let got = x.result.as_ref().and_then(|r| serde_json::to_value(r).ok());
                if got.as_ref().and_then(|v| v.as_str()) != Some(result.as_str()) {
                    return Some(format!("result {got:?}, expected {result}"));
                }
            }
            if let Some(enforced) = c.enforced {
                if prop(x, "enforced") != Some(if enforced { "true" } else { "false" }) {
                    return Some(format!(
                        "enforced {:?}, expected {enforced}",
                        prop(x, "enforced")
                    ));
                }
            }
            for (k, v) in &c.properties {
                if prop(x, k) != Some(v.as_str()) {
                    return Some(format!("{k} {:?}, expected {v:?}", prop(x, k)));
                }
            }
            None
        };
        loop {
            let (found, summary) = self.read_report(run, c)?;
            let verdict = match &found {
                Some(x) => mismatch(x),
                None => Some(format!(
                    "no such result (the Report has: {})",
                    if summary.is_empty() {
                        "nothing".into()
                    } else {
                        summary.join("; ")
                    }
                )),
            };
            match (verdict, found) {
                (None, Some(x)) => return Ok(summarize(&x)),
                (Some(why), found) if start.elapsed() >= within => {
                    let seen = found.as_ref().map(summarize).unwrap_or_default();
                    bail!(
                        "expected {}, observed {why} {seen}",
                        describe_expectation(&StepKind::Report(c.clone()))
                    );
                }
                _ => std::thread::sleep(RETRY),
            }
        }
    }

    fn policy(&self, name: &str) -> anyhow::Result<Option<RuntimePolicy>> {
        self.cluster.get(&self.cluster.all::<RuntimePolicy>(), name)
    }

    fn await_condition(&self, c: &ConditionCheck, within: Duration) -> anyhow::Result<String> {
        let start = Instant::now();
        loop {
            let p = self.policy(&c.policy)?;
            let cond = p
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|x| x.type_ == c.type_))
                .cloned();
            let (ok, seen) = match &cond {
                None => (false, "no such condition".to_string()),
                Some(x) => (
                    x.status == c.status
                        && c.reason.as_ref().is_none_or(|r| *r == x.reason)
                        && c.message_contains
                            .as_ref()
                            .is_none_or(|m| x.message.contains(m.as_str())),
                    format!(
                        "{}={} reason={} message={:?}",
                        x.type_, x.status, x.reason, x.message
                    ),
                ),
            };
            if ok {
                return Ok(seen);
            }
            if start.elapsed() >= within {
                let mut want = format!("{}={}", c.type_, c.status);
                if let Some(r) = &c.reason {
                    want.push_str(&format!(" reason={r}"));
                }
                if let Some(m) = &c.message_contains {
                    want.push_str(&format!(" message containing {m:?}"));
                }
                bail!("expected {want}, observed {seen}");
            }
            std::thread::sleep(RETRY);
        }
    }

    fn await_shard(&self, c: &ShardCheck, within: Duration) -> anyhow::Result<String> {
        let start = Instant::now();
        let open_exec = self
            .plan
            .expected_open_exec
            .clone()
            .unwrap_or_else(|| self.open_exec.clone());
        loop {
            let p = self.policy(&c.policy)?;
            let shard = p
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.nodes.iter().find(|n| n.node_name == self.plan.node))
                .cloned();
            let verdict: Result<String, String> = match &shard {
                None => Err("no shard for this node".into()),
                Some(sh) => {
                    let mut diffs = Vec::new();
                    let mut flag = |name: &str, want: Option<bool>, got: Option<bool>| {
                        if let Some(w) = want {
                            if got != Some(w) {
                                diffs.push(format!("{name} {got:?}, expected {w}"));
                            }
                        }
                    };
                    flag(
                        "enforcementAvailable",
                        c.enforcement_available,
                        sh.enforcement_available,
                    );
                    flag(
                        "observationAvailable",
                        c.observation_available,
                        sh.observation_available,
                    );
                    flag("podsMatched", c.pods_matched, sh.pods_matched);
                    let message = sh.message.clone().unwrap_or_default();
                    if let Some(m) = &c.message_contains {
                        if !message.contains(m.as_str()) {
                            diffs.push(format!("message {message:?} without {m:?}"));
                        }
                    }
                    if c.no_message && sh.message.is_some() {
                        diffs.push(format!("a message {message:?}, expected none"));
                    }
                    for (behavior, want) in &c.backends {
                        let want = if want == OPEN_EXEC_OF_NODE {
                            &open_exec
                        } else {
                            want
                        };
                        let got = sh
                            .backends
                            .iter()
                            .find(|b| &b.behavior == behavior)
                            .map(|b| b.backend.as_str());
                        if got != Some(want.as_str()) {
                            diffs.push(format!("backend of {behavior} {got:?}, expected {want}"));
                        }
                    }
                    for (name, want) in &c.event_sources {
                        let got = sh
                            .event_sources
                            .iter()
                            .find(|e| &e.name == name)
                            .and_then(|e| serde_json::to_value(e.state).ok())
                            .and_then(|v| v.as_str().map(str::to_string));
                        if got.as_deref() != Some(want.as_str()) {
                            diffs.push(format!("event source {name} {got:?}, expected {want}"));
                        }
                    }
                    if diffs.is_empty() {
                        Ok(format!(
                            "enforcementAvailable={:?} observationAvailable={:?} podsMatched={:?} message={:?}",
                            sh.enforcement_available, sh.observation_available, sh.pods_matched, sh.message
                        ))
                    } else {
                        Err(diffs.join("; "))
                    }
                }
            };
            match verdict {
                Ok(seen) => return Ok(seen),
                Err(why) if start.elapsed() >= within => {
                    bail!("expected {}, observed {why}", describe_shard(c))
                }
                Err(_) => std::thread::sleep(RETRY),
            }
        }
    }

    fn scrape(&self) -> anyhow::Result<String> {
        let mut s = std::net::TcpStream::connect(&self.plan.metrics_addr)
            .with_context(|| format!("connecting to /metrics at {}", self.plan.metrics_addr))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    }

    fn await_metric(&self, m: &MetricCheck, within: Duration) -> anyhow::Result<String> {
        let start = Instant::now();
        loop {
            let samples = conformance::prom::parse(&self.scrape()?);
            let (value, series) = conformance::prom::sum(&samples, &m.name, &m.labels);
            let ok = match (m.at_least, m.equals) {
                (Some(min), _) => series > 0 && value >= min,
                (_, Some(eq)) => series > 0 && (value - eq).abs() < f64::EPSILON,
                _ => false,
            };
            if ok {
                return Ok(format!("{value} over {series} series"));
            }
            if start.elapsed() >= within {
                let want = match (m.at_least, m.equals) {
                    (Some(min), _) => format!("at least {min}"),
                    (_, Some(eq)) => format!("exactly {eq}"),
                    _ => String::new(),
                };
                bail!("expected {want}, observed {value} over {series} series");
            }
            std::thread::sleep(RETRY);
        }
    }

    // ------------------------------------------------------------ mutations

    /// A mutation; a pod's new labels are returned for the caller to
    /// record (a later relabel re-sends the whole object).
    pub(super) fn mutation(
        &self,
        s: &Scenario,
        run: &ScenarioRun,
        kind: &StepKind,
    ) -> anyhow::Result<(String, Option<PodLabels>)> {
        let c = &self.cluster;
        match kind {
            StepKind::Relabel(r) => {
                if let Some(pod) = &r.pod {
                    let running = run.pod(pod)?;
                    let ns = running.namespace().to_string();
                    if let Some(real) = &self.plan.real {
                        // The whole object again, with the new labels
                        // (what the pod was made with, or the apply would
                        // ask to change an immutable spec).
                        let mut def = running.def.clone();
                        def.labels = r.labels.clone();
                        c.apply(
                            &c.ns::<Pod>(&ns),
                            pod,
                            super::realpod::manifest(&def, &self.plan.node, &real.workload_image),
                        )?;
                        return Ok((
                            format!("labels now {:?}", r.labels),
                            Some((pod.clone(), r.labels.clone())),
                        ));
                    }
                    let containers: Vec<serde_json::Value> = running
                        .def
                        .containers
                        .iter()
                        .map(|c| serde_json::json!({"name": c, "image": "busybox"}))
                        .collect();
                    // The whole object this manager owns, with the new
                    // labels (an apply without spec would give up spec).
                    c.apply(
                        &c.ns::<Pod>(&ns),
                        pod,
                        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": pod, "namespace": ns, "labels": r.labels},
                            "spec": {"nodeName": self.plan.node, "containers": containers}}),
                    )?;
                    Ok((
                        format!("labels now {:?}", r.labels),
                        Some((pod.clone(), r.labels.clone())),
                    ))
                } else if let Some(ns) = &r.namespace {
                    c.apply(
                        &c.all::<Namespace>(),
                        ns,
                        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": r.labels}}),
                    )?;
                    Ok((format!("labels now {:?}", r.labels), None))
                } else {
                    bail!("a relabel without pod or namespace")
                }
            }
            StepKind::ApplyPolicy(p) => apply_policy(c, p).map(|()| ("applied".into(), None)),
            StepKind::DeletePolicy(p) => c
                .delete(&c.all::<RuntimePolicy>(), p)
                .map(|()| ("deleted".into(), None)),
            StepKind::DeleteService(name) => {
                let ns = s
                    .services
                    .iter()
                    .find(|x| &x.name == name)
                    .and_then(|x| x.namespace.clone())
                    .unwrap_or_default();
                c.delete(&c.ns::<k8s_openapi::api::core::v1::Service>(&ns), name)
                    .map(|()| ("deleted".into(), None))
            }
            _ => bail!("not a mutation"),
        }
    }
}

fn plain(o: &Outcome) -> Observed {
    match o {
        Outcome::Done => Observed::Allowed,
        Outcome::Errno(n) => Observed::Refused(errno_name(*n)),
        other => Observed::Other(format!("{other:?}")),
    }
}

fn prop<'a>(r: &'a ReportResult, key: &str) -> Option<&'a str> {
    r.properties
        .as_ref()
        .and_then(|p| p.get(key))
        .map(String::as_str)
}

fn summarize(r: &ReportResult) -> String {
    let result = r
        .result
        .as_ref()
        .and_then(|x| serde_json::to_value(x).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "[{} {} {} result={result} enforced={} count={}]",
        r.policy,
        r.rule.as_deref().unwrap_or_default(),
        prop(r, "target").unwrap_or_default(),
        prop(r, "enforced").unwrap_or_default(),
        prop(r, "count").unwrap_or_default()
    )
}

fn describe_shard(c: &ShardCheck) -> String {
    let mut parts = vec![describe_expectation(&StepKind::Shard(c.clone()))];
    if let Some(m) = &c.message_contains {
        parts.push(format!("a message containing {m:?}"));
    }
    if c.no_message {
        parts.push("no message".into());
    }
    for (b, v) in &c.backends {
        parts.push(format!("{b} on {v}"));
    }
    for (n, v) in &c.event_sources {
        parts.push(format!("source {n} {v}"));
    }
    parts.retain(|p| !p.is_empty());
    parts.join(", ")
}
