//! `conformance node --plan FILE`: one node of the cluster, in a guest or
//! on the host. It registers the node and the DaemonSet's pod on it (what
//! the DaemonSet controller would), runs the probe and the real daemon,
//! then runs each scenario of the plan in sequence, each in its own
//! namespaces, and prints one result line per scenario for the runner:
//!
//! ```text
//! @@krt-conformance node {"kernel": ..., "openExec": ...}
//! @@krt-conformance cell {"scenario": ..., "verdict": "pass", ...}
//! ```
//!
//! A scenario that fails does not stop the node: its objects are removed
//! and the next one runs. Only a failure of the node itself (no API
//! server, no daemon) ends it early, with a non-zero exit.

mod cluster;
mod daemon;
mod kubelet;
mod net;
mod realpod;
mod restart;
mod steps;

use anyhow::{bail, Context as _};
use cluster::Cluster;
use conformance::results::{Cell, Verdict, BACKEND_ROW};
use conformance::scenario::{NodeClass, Scenario, StepKind};
use daemon::{Daemon, DaemonConfig};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node as NodeObject, Pod, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// The prefix of the lines the runner reads from a node's output.
pub const MARK: &str = "@@krt-conformance";

/// What the runner hands a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The node's name.
    pub node: String,
    /// Its configuration, for messages (`6.12 lsm=bpf`).
    pub config: String,
    /// The open/exec backend it must use, when known.
    pub expected_open_exec: Option<String>,
    /// The daemon binary.
    pub daemon: PathBuf,
    /// This binary (for workload children).
    pub me: PathBuf,
    /// A busybox to copy as the scenarios' programs.
    pub busybox: PathBuf,
    /// Where this node mounts a bpffs of its own for the daemon's pins.
    pub bpffs: PathBuf,
    /// The daemon's --metrics-addr.
    pub metrics_addr: String,
    /// The DaemonSet's namespace.
    pub system_namespace: String,
    /// Print every step and echo the daemon's log.
    pub verbose: bool,
    /// The scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// A real node: the suite runs in a pod there, its pods are started by
    /// the node's kubelet and runtime, the daemon is the chart's.
    #[serde(default)]
    pub real: Option<RealNode>,
}

/// What the node half needs on a real node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RealNode {
    /// The namespace of the chart's DaemonSet.
    pub daemon_namespace: String,
    /// The image of the scenarios' containers (busybox, present on the
    /// node).
    pub workload_image: String,
}

/// The DaemonSet's name.
const DAEMONSET: &str = "kyverno-runtime";

/// What the node half prints first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    /// The kernel release.
    pub kernel: String,
    /// The open/exec backend its probe chose.
    pub open_exec: String,
}

/// The node half's entry point.
pub fn main(plan: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(plan).with_context(|| format!("reading {}", plan.display()))?;
    let plan: Plan = serde_json::from_str(&text).context("reading the plan")?;
    let mut node = NodeHalf::setup(plan)?;
    let result = node.run_all();
    node.teardown();
    result?;
    Ok(ExitCode::SUCCESS)
}

fn emit<T: Serialize>(kind: &str, value: &T) {
    match serde_json::to_string(value) {
        Ok(json) => println!("{MARK} {kind} {json}"),
        Err(e) => println!("{MARK} error cannot serialize a {kind}: {e}"),
    }
}

/// One node's state across scenarios.
pub struct NodeHalf {
    plan: Plan,
    cluster: Cluster,
    /// The workloads' shared network; `None` on a real node, where each
    /// pod has its own.
    sandbox: Option<net::Sandbox>,
    cgroup_root: PathBuf,
    daemon_cfg: DaemonConfig,
    daemon: Option<Daemon>,
    class: NodeClass,
    open_exec: String,
    started: Instant,
    bpffs_mounted: bool,
    /// The fixture files and directories this node created, in order:
    /// teardown removes exactly these, newest first (a directory only
    /// once empty), never anything that was there before.
    fixtures_made: Vec<PathBuf>,
}

impl NodeHalf {
    fn setup(plan: Plan) -> anyhow::Result<NodeHalf> {
        let started = Instant::now();
        let cluster = Cluster::connect()?;
        if plan.real.is_some() {
            return Ok(NodeHalf {
                daemon_cfg: DaemonConfig {
                    bin: plan.daemon.clone(),
                    node: plan.node.clone(),
                    system_namespace: plan.system_namespace.clone(),
                    daemonset: DAEMONSET.into(),
                    pin_dir: plan.bpffs.clone(),
                    metrics_addr: plan.metrics_addr.clone(),
                    verbose: plan.verbose,
                    dns_resolvers: Vec::new(),
                },
                plan,
                cluster,
                sandbox: None,
                cgroup_root: realpod::node_cgroup2_root()?,
                daemon: None,
                class: NodeClass::Capable,
                open_exec: String::new(),
                started,
                bpffs_mounted: false,
                fixtures_made: Vec::new(),
            });
        }
        std::fs::create_dir_all(&plan.bpffs)
            .with_context(|| format!("creating {}", plan.bpffs.display()))?;
        let mounted = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&plan.bpffs)
            .status()
            .context("running mount")?;
        if !mounted.success() {
            bail!("mounting a bpffs at {}", plan.bpffs.display());
        }
        let daemon_cfg = DaemonConfig {
            bin: plan.daemon.clone(),
            node: plan.node.clone(),
            system_namespace: plan.system_namespace.clone(),
            daemonset: DAEMONSET.into(),
            pin_dir: plan.bpffs.join("kyverno-runtime"),
            metrics_addr: plan.metrics_addr.clone(),
            verbose: plan.verbose,
            // The scenarios' resolvers are on the sandbox's loopback, which
            // the daemon's `auto` never trusts: declared explicitly, as on
            // a test node.
            dns_resolvers: plan
                .scenarios
                .iter()
                .filter_map(|s| s.resolver.as_ref().map(|r| r.address))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let sandbox = net::Sandbox::create().context("creating the workloads' network")?;
        let cgroup_root = kubelet::cgroup2_root()?;
        let node = NodeHalf {
            plan,
            cluster,
            sandbox: Some(sandbox),
            cgroup_root,
            daemon_cfg,
            daemon: None,
            class: NodeClass::Capable,
            open_exec: String::new(),
            started,
            bpffs_mounted: true,
            fixtures_made: Vec::new(),
        };
        node.register()?;
        Ok(node)
    }

    /// The Node, the DaemonSet (desiring this node only: the nodes of a
    /// run come one after the other) and its pod here.
    fn register(&self) -> anyhow::Result<()> {
        let c = &self.cluster;
        let node = &self.plan.node;
        let sys = &self.plan.system_namespace;
        c.apply(
            &c.all::<NodeObject>(),
            node,
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
                "labels": {"kubernetes.io/hostname": node, "krt-conformance/config": self.plan.config.replace([' ', '='], "-")}}}),
        )?;
        self.namespace(sys, &Default::default())?;
        let ds = c.apply(
            &c.ns::<DaemonSet>(sys),
            DAEMONSET,
            serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DAEMONSET},
                "spec": {"selector": {"matchLabels": {"app": "kyverno-runtime"}},
                         "template": {"metadata": {"labels": {"app": "kyverno-runtime"}},
                                      "spec": {"containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}}}),
        )?;
        // Pods an earlier boot of this node left (a guest that crashed
        // mid-scenario is booted again): this run's node name is the
        // runner's own, so every workload pod bound to it is one a
        // scenario made, and would be matched, unresolved, by the next
        // scenarios' policies.
        let stale = c
            .block_on(
                c.every_namespace::<Pod>().list(
                    &kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")),
                ),
            )
            .context("listing the pods bound to this node")?;
        for p in stale.items {
            let (Some(ns), Some(name)) =
                (p.metadata.namespace.as_deref(), p.metadata.name.as_deref())
            else {
                continue;
            };
            if ns != sys.as_str() {
                println!("   removing {ns}/{name}, left on this node by an earlier boot");
                c.delete(&c.ns::<Pod>(ns), name)?;
            }
        }
        let pods = c.ns::<Pod>(sys);
        let list = c
            .block_on(pods.list(&Default::default()))
            .context("listing the DaemonSet's pods")?;
        for p in list.items {
            let on = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if on != Some(node.as_str()) {
                if let Some(name) = p.metadata.name.as_deref() {
                    c.delete(&pods, name)?;
                }
            }
        }
        let uid = ds
            .metadata
            .uid
            .clone()
            .context("the DaemonSet has no uid")?;
        let pod_name = format!("kyverno-runtime-{node}");
        c.apply(
            &pods,
            &pod_name,
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "labels": {"app": "kyverno-runtime"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMONSET, "uid": uid, "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "daemon", "image": "kyverno-runtime"}]}}),
        )?;
        c.patch_status(
            &c.ns::<DaemonSet>(sys),
            DAEMONSET,
            serde_json::json!({"status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1,
                "numberMisscheduled": 0, "numberReady": 1, "observedGeneration": ds.metadata.generation}}),
        )?;
        Ok(())
    }

    fn namespace(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        let c = &self.cluster;
        c.apply(
            &c.all::<Namespace>(),
            name,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}),
        )?;
        // No controller manager makes it, and the ServiceAccount admission
        // plugin refuses pods without it.
        c.apply(
            &c.ns::<ServiceAccount>(name),
            "default",
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )?;
        Ok(())
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The probe's open/exec backend (the daemon runs the same probe).
    fn probe(&mut self) -> anyhow::Result<()> {
        let out = Command::new(&self.plan.daemon)
            .args(["probe", "--json"])
            .output()
            .context("running the probe")?;
        if !out.status.success() {
            bail!("the probe failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("reading the probe's JSON")?;
        let backend = |b: &str| {
            json["plan"][b]["backend"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        };
        let (open, exec) = (backend("open"), backend("exec"));
        self.open_exec = open.clone();
        self.class = conformance::config::Config::class_of(&open);
        let kernel = json["kernel"]["release"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        emit(
            "node",
            &NodeLine {
                kernel: kernel.clone(),
                open_exec: open.clone(),
            },
        );
        let reason = json["plan"]["open"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (verdict, difference) = match &self.plan.expected_open_exec {
            Some(want) if *want != open || *want != exec => (
                Verdict::Fail,
                Some(format!("expected open and exec on {want}, the probe chose open={open} exec={exec} ({reason})")),
            ),
            _ if open != exec => (
                Verdict::Fail,
                Some(format!("open ({open}) and exec ({exec}) are served by different backends")),
            ),
            _ => (Verdict::Pass, None),
        };
        println!(
            "[{:>6.1}s] node {} ({}, kernel {kernel}): open/exec backend {open} ({}); {}",
            self.elapsed(),
            self.plan.node,
            self.plan.config,
            self.class,
            if verdict == Verdict::Pass {
                "as expected".to_string()
            } else {
                "NOT as expected".to_string()
            }
        );
        emit(
            "cell",
            &Cell {
                scenario: BACKEND_ROW.into(),
                node: self.plan.node.clone(),
                verdict,
                difference,
                shown: Some(open.clone()),
                seconds: 0.0,
                log: vec![format!("probe: open={open} exec={exec}: {reason}")],
            },
        );
        Ok(())
    }

    fn start_daemon(&mut self, extra: &[String]) -> anyhow::Result<()> {
        let mut d = Daemon::start(&self.daemon_cfg, extra)?;
        d.wait_log("pods on this node listed", Duration::from_secs(180))?;
        self.daemon = Some(d);
        Ok(())
    }

    fn stop_daemon(&mut self) -> anyhow::Result<Duration> {
        match self.daemon.take() {
            Some(d) => {
                let (status, took) = d.terminate(Duration::from_secs(20))?;
                if !status.success() {
                    bail!("the daemon exited {status} on SIGTERM");
                }
                Ok(took)
            }
            None => Ok(Duration::ZERO),
        }
    }

    fn run_all(&mut self) -> anyhow::Result<()> {
        self.probe()?;
        if let Some(real) = self.plan.real.clone() {
            let pod = self.attach_daemon(&real)?;
            println!(
                "[{:>6.1}s] the chart's daemon {}/{pod} runs here, /metrics at {}; {} scenarios",
                self.elapsed(),
                real.daemon_namespace,
                self.plan.metrics_addr,
                self.plan.scenarios.len()
            );
        } else {
            self.start_daemon(&[])?;
            println!(
                "[{:>6.1}s] daemon running; {} scenarios",
                self.elapsed(),
                self.plan.scenarios.len()
            );
        }
        let scenarios = self.plan.scenarios.clone();
        for s in &scenarios {
            let cell = self.run_scenario(s);
            let shown = match cell.verdict {
                Verdict::Pass => "pass".to_string(),
                Verdict::Fail => {
                    format!("FAIL: {}", cell.difference.as_deref().unwrap_or_default())
                }
                Verdict::NotApplicable => {
                    format!("n/a: {}", cell.difference.as_deref().unwrap_or_default())
                }
            };
            println!(
                "[{:>6.1}s] {} {} ({:.1}s)",
                self.elapsed(),
                s.name,
                shown,
                cell.seconds
            );
            if self.plan.verbose || cell.verdict == Verdict::Fail {
                for l in &cell.log {
                    println!("           {l}");
                }
            }
            emit("cell", &cell);
            if self.plan.real.is_some() {
                continue;
            }
            // The next scenario starts from the defaults and a live daemon.
            let healthy = self.daemon.as_mut().is_some_and(|d| d.exited().is_none());
            let default_flags = self.daemon.as_ref().is_some_and(|d| d.extra.is_empty());
            if !healthy || !default_flags {
                let _ = self.stop_daemon();
                self.start_daemon(&[])?;
            }
        }
        if self.plan.real.is_none() {
            let took = self.stop_daemon()?;
            println!(
                "[{:>6.1}s] daemon stopped in {:.1}s",
                self.elapsed(),
                took.as_secs_f64()
            );
        }
        Ok(())
    }

    /// On a real node: the chart's daemon pod here, Ready, whose /metrics
    /// the checks read; its DNS resolvers must hold the scenarios' (the
    /// daemon learns nothing from another resolver's answers).
    fn attach_daemon(&mut self, real: &RealNode) -> anyhow::Result<String> {
        let c = &self.cluster;
        let deadline = Instant::now() + Duration::from_secs(180);
        let pod = loop {
            let list = c
                .block_on(
                    c.ns::<Pod>(&real.daemon_namespace).list(
                        &kube::api::ListParams::default()
                            .fields(&format!("spec.nodeName={}", self.plan.node)),
                    ),
                )
                .context("listing the daemon's pods")?;
            let ready = list.items.into_iter().find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            if let Some(p) = ready {
                break p;
            }
            if Instant::now() > deadline {
                bail!(
                    "no Ready pod of the chart's DaemonSet on {} in namespace {} (helm install first)",
                    self.plan.node,
                    real.daemon_namespace
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .context("the daemon's pod has no IP")?;
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .context("the daemon's pod has no container")?;
        let port = container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .map(|p| p.container_port)
            .context("the daemon's container has no port named metrics")?;
        let args = container.args.clone().unwrap_or_default().join(" ");
        let resolvers: std::collections::BTreeSet<String> = self
            .plan
            .scenarios
            .iter()
            .filter_map(|s| s.resolver.as_ref().map(|r| r.address.to_string()))
            .collect();
        for r in resolvers {
            let listed = args
                .split_whitespace()
                .filter_map(|a| a.strip_prefix("--dns-resolvers="))
                .any(|l| l.split(',').any(|x| x == r));
            if !listed {
                bail!(
                    "the daemon's --dns-resolvers lacks {r}, the scenarios' resolver (install the chart with daemon.dns.resolvers including it)"
                );
            }
        }
        self.plan.metrics_addr = format!("{ip}:{port}");
        Ok(name)
    }

    fn run_scenario(&mut self, s: &Scenario) -> Cell {
        let started = Instant::now();
        let mut cell = Cell {
            scenario: s.name.clone(),
            node: self.plan.node.clone(),
            verdict: Verdict::Pass,
            difference: None,
            shown: None,
            seconds: 0.0,
            log: Vec::new(),
        };
        if let Some(n) = s.not_on.iter().find(|n| n.nodes == self.class) {
            cell.verdict = Verdict::NotApplicable;
            cell.difference = Some(format!("not on {} nodes: {}", n.nodes, n.reason));
            return cell;
        }
        if let Some(gap) = self
            .plan
            .real
            .as_ref()
            .and_then(|_| s.real_node_gap(self.class))
        {
            cell.verdict = Verdict::NotApplicable;
            cell.difference = Some(format!("not on real nodes: {gap}"));
            return cell;
        }
        let mut run = steps::ScenarioRun::new();
        let outcome = self.scenario_body(s, &mut run);
        if let Err(e) = self.cleanup(s, &mut run) {
            run.log.push(format!("cleanup: {e:#}"));
        }
        cell.log = std::mem::take(&mut run.log);
        if let Err(e) = outcome {
            cell.verdict = Verdict::Fail;
            let mut difference = format!("{e:#}");
            if let Some(d) = self.daemon.as_mut() {
                if let Some(status) = d.exited() {
                    difference.push_str(&format!(" (the daemon had exited: {status})"));
                }
            }
            cell.difference = Some(difference);
            if let Some(d) = &self.daemon {
                cell.log.push("daemon log (last 40 lines):".into());
                cell.log
                    .extend(d.tail(40).into_iter().map(|l| format!("  {l}")));
            }
        }
        cell.seconds = started.elapsed().as_secs_f64();
        cell
    }

    fn scenario_body(&mut self, s: &Scenario, run: &mut steps::ScenarioRun) -> anyhow::Result<()> {
        // What an interrupted earlier run may have left.
        self.cleanup(s, run).context("removing leftovers")?;
        if self.plan.real.is_none() {
            self.fixtures(s)?;
        }
        for ns in &s.namespaces {
            self.namespace(&ns.name, &ns.labels)?;
        }
        if let (Some(r), Some(sandbox)) = (&s.resolver, &self.sandbox) {
            for addrs in r.records.values() {
                for a in addrs {
                    sandbox.add_address(*a)?;
                }
            }
            run.resolvers.push(net::Resolver::start(sandbox, r)?);
        }
        for svc in &s.services {
            self.service(svc)?;
        }
        for p in &s.pods {
            let pod = match &self.plan.real {
                None => kubelet::start(&self.cluster, &self.plan.node, &self.cgroup_root, p),
                Some(real) => realpod::start(
                    &self.cluster,
                    &self.plan.node,
                    &self.cgroup_root,
                    p,
                    &real.workload_image,
                    &s.setup,
                ),
            }
            .with_context(|| format!("starting pod {}", p.name))?;
            // On a real node each pod has its own network: the resolver
            // answers in each.
            if let (Some(r), Some(sandbox)) = (&s.resolver, &pod.sandbox) {
                run.resolvers.push(net::Resolver::start(sandbox, r)?);
            }
            run.log.push(format!(
                "pod {}/{} running in {}",
                pod.namespace(),
                p.name,
                pod.containers
                    .iter()
                    .map(|(_, d)| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            run.pods.push(pod);
        }
        for p in &s.policies {
            steps::apply_policy(&self.cluster, p)?;
            run.log.push(format!("policy {} applied", p.name));
        }
        for step in &s.steps {
            if let Some(when) = step.when {
                if when != self.class {
                    run.log.push(format!(
                        "step {}: only on {when} nodes, this one is {}",
                        step.number, self.class
                    ));
                    continue;
                }
            }
            self.step(s, step, run)?;
        }
        self.settle(run)
    }

    fn fixtures(&mut self, s: &Scenario) -> anyhow::Result<()> {
        for p in &s.setup.programs {
            let path = Path::new(p);
            self.fixture_parents(path)?;
            if !path.exists() {
                std::fs::copy(&self.plan.busybox, path)
                    .with_context(|| format!("copying busybox to {p}"))?;
                self.fixtures_made.push(path.to_owned());
            }
        }
        for f in &s.setup.files {
            let path = Path::new(f);
            self.fixture_parents(path)?;
            let existed = path.exists();
            std::fs::write(path, b"krt-conformance fixture\n")
                .with_context(|| format!("writing {f}"))?;
            if !existed {
                self.fixtures_made.push(path.to_owned());
            }
        }
        Ok(())
    }

    /// Creates the missing parent directories of `path`, recording each.
    fn fixture_parents(&mut self, path: &Path) -> anyhow::Result<()> {
        let Some(dir) = path.parent() else {
            return Ok(());
        };
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        self.fixtures_made.extend(missing.into_iter().rev());
        Ok(())
    }

    fn service(&self, svc: &conformance::scenario::ServiceDef) -> anyhow::Result<()> {
        let c = &self.cluster;
        let ns = svc.namespace.clone().unwrap_or_default();
        // (On a real node a connect puts its destination on the pod's own
        // loopback when it runs.)
        if let Some(sandbox) = &self.sandbox {
            sandbox.add_address(svc.cluster_ip)?;
        }
        c.apply(
            &c.ns::<k8s_openapi::api::core::v1::Service>(&ns),
            &svc.name,
            serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc.name, "namespace": ns},
                "spec": {"clusterIP": svc.cluster_ip.to_string(),
                         "ports": [{"name": "p", "port": svc.port, "targetPort": svc.port, "protocol": "TCP"}]}}),
        )?;
        for (family, v6) in [("IPv4", false), ("IPv6", true)] {
            let addrs: Vec<String> = svc
                .endpoints
                .iter()
                .filter(|a| a.is_ipv6() == v6)
                .map(ToString::to_string)
                .collect();
            if addrs.is_empty() {
                continue;
            }
            for a in svc.endpoints.iter().filter(|a| a.is_ipv6() == v6) {
                if let Some(sandbox) = &self.sandbox {
                    sandbox.add_address(*a)?;
                }
            }
            let name = slice_name(&svc.name, v6);
            let endpoints: Vec<serde_json::Value> = addrs
                .iter()
                .map(|a| serde_json::json!({"addresses": [a]}))
                .collect();
            c.apply(
                &c.ns::<EndpointSlice>(&ns),
                &name,
                serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc.name}},
                    "addressType": family,
                    "ports": [{"name": "p", "port": svc.port, "protocol": "TCP"}],
                    "endpoints": endpoints}),
            )?;
        }
        Ok(())
    }

    /// Removes what a scenario made: policies first (so the daemon lets
    /// go of the pods), then pods and their cgroups, Reports, Services.
    fn cleanup(&mut self, s: &Scenario, run: &mut steps::ScenarioRun) -> anyhow::Result<()> {
        let c = &self.cluster;
        let policies = c.all::<RuntimePolicy>();
        let mut names: Vec<&str> = s.policies.iter().map(|p| p.name.as_str()).collect();
        for step in &s.steps {
            if let StepKind::ApplyPolicy(p) = &step.kind {
                names.push(&p.name);
            }
        }
        for name in names {
            c.delete(&policies, name)?;
        }
        run.resolvers.clear();
        for pod in std::mem::take(&mut run.pods) {
            kubelet::stop(c, &pod)?;
        }
        for p in &s.pods {
            let ns = p.namespace.as_deref().unwrap_or_default();
            c.delete(&c.ns::<Pod>(ns), &p.name)?;
            c.delete(&c.ns::<Report>(ns), &format!("kyverno-runtime-{}", p.name))?;
        }
        for svc in &s.services {
            let ns = svc.namespace.as_deref().unwrap_or_default();
            c.delete(&c.ns::<k8s_openapi::api::core::v1::Service>(ns), &svc.name)?;
            for v6 in [false, true] {
                c.delete(&c.ns::<EndpointSlice>(ns), &slice_name(&svc.name, v6))?;
            }
        }
        Ok(())
    }

    fn teardown(&mut self) {
        if self.daemon.is_some() {
            let _ = self.stop_daemon();
        }
        if self.bpffs_mounted {
            // Unmounting drops every pin: the programs detach.
            let _ = Command::new("umount").arg(&self.plan.bpffs).status();
            let _ = std::fs::remove_dir(&self.plan.bpffs);
            self.bpffs_mounted = false;
        }
        // Only what this node created, newest first; a directory that
        // still holds something else stays.
        for made in std::mem::take(&mut self.fixtures_made).iter().rev() {
            let _ = match std::fs::symlink_metadata(made) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(made),
                Ok(_) => std::fs::remove_file(made),
                Err(_) => Ok(()),
            };
        }
    }
}

fn slice_name(service: &str, v6: bool) -> String {
    format!("{service}-{}", if v6 { "v6" } else { "v4" })
}
