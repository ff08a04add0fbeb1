//! Scenarios as data: one YAML file per scenario under
//! `conformance/scenarios/`, read into [`RawScenario`] by serde and then
//! checked and turned into a [`Scenario`], whose steps are closed enums.
//!
//! Everything a run needs is in the file: the namespaces and their labels,
//! the pods (labels, containers, the runtime and cgroup driver whose
//! layout the kubelet half creates), the programs and files the workloads
//! use, a DNS resolver's answers, Services, the policies, and the ordered
//! steps: actions with their expected outcome, checks of what the cluster
//! and the daemon say, and mutations. A mistake is refused when the suite
//! loads, before anything boots, with the file and the field named
//! ([`Error::Invalid`]).

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every file a scenario creates for its workloads lives under this
/// directory, so a run on the host (a shared machine) touches nothing
/// else and removes what it made.
pub const FIXTURE_ROOT: &str = "/opt/krt-conformance";

/// How long an awaited step waits by default before it reports the last
/// observation as the difference.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(30);

/// The longest wait a step may ask for (a typo like `300m` would hang a
/// boot for hours).
pub const MAX_WITHIN: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------- the file

/// A scenario file as written (before the cross-references are checked).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawScenario {
    /// The scenario's name: the file name without `.yaml`.
    pub name: String,
    /// What the scenario proves, for the person reading a failure.
    pub description: String,
    /// Node classes where the scenario cannot run, each with the reason
    /// (printed as `n/a` in the matrix, never skipped silently).
    #[serde(default)]
    pub not_on: Vec<NotOn>,
    /// Namespaces, created with these labels (and relabelled by steps).
    pub namespaces: Vec<NamespaceDef>,
    /// Pods on this node.
    pub pods: Vec<PodDef>,
    /// Programs and files the workloads use.
    #[serde(default)]
    pub setup: Setup,
    /// A DNS resolver in the workloads' network.
    #[serde(default)]
    pub resolver: Option<ResolverDef>,
    /// Services (with one EndpointSlice per address family).
    #[serde(default)]
    pub services: Vec<ServiceDef>,
    /// Policies applied after the pods run.
    #[serde(default)]
    pub policies: Vec<PolicyDef>,
    /// What happens, in order.
    pub steps: Vec<RawStep>,
}

/// Where a scenario cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NotOn {
    /// The node class.
    pub nodes: NodeClass,
    /// Why: shown in the matrix, the JSON and the JUnit `skipped` message.
    pub reason: String,
}

/// What a node can do, as its probe measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeClass {
    /// The probe found an open/exec backend (BPF-LSM or fmod_ret): every VM.
    Capable,
    /// No open/exec backend (the build hosts: LSM and fmod_ret programs are
    /// refused), while network, protocol and DNS work.
    Restricted,
}

impl fmt::Display for NodeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeClass::Capable => "capable",
            NodeClass::Restricted => "restricted",
        })
    }
}

/// A namespace and its labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceDef {
    /// Its name.
    pub name: String,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The container runtime whose cgroup names and container ids a pod gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// containerd (`containerd://`, `cri-containerd-<id>.scope`).
    #[default]
    Containerd,
    /// CRI-O (`cri-o://`, `crio-<id>`).
    Crio,
    /// Docker through cri-dockerd (`docker://`, `docker-<id>.scope`).
    Docker,
}

/// The kubelet's cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// `kubepods/besteffort/pod<uid>/...`.
    #[default]
    Cgroupfs,
    /// `kubepods.slice/kubepods-besteffort.slice/...slice/...scope`.
    Systemd,
}

/// A pod on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodDef {
    /// Its name.
    pub name: String,
    /// Its namespace; may be left out when the scenario has one.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its containers' names; one `app` container when left out.
    #[serde(default)]
    pub containers: Vec<String>,
    /// The runtime whose layout its container cgroups get.
    #[serde(default)]
    pub runtime: Runtime,
    /// The cgroup driver whose layout its cgroups get.
    #[serde(default)]
    pub cgroup_driver: CgroupDriver,
}

/// Programs and files for the workloads (under [`FIXTURE_ROOT`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Setup {
    /// Copies of busybox, run as `true`: they exit 0 whatever the
    /// arguments, so an exec's outcome is the kernel's alone.
    #[serde(default)]
    pub programs: Vec<String>,
    /// Files with a line of text, for open actions.
    #[serde(default)]
    pub files: Vec<String>,
}

/// A resolver in the workloads' network: A and AAAA answers from a table,
/// NXDOMAIN for any other name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResolverDef {
    /// Its address (port 53, UDP).
    #[serde(default = "default_resolver")]
    pub address: IpAddr,
    /// The TTL of every answer, in seconds.
    #[serde(default = "default_ttl")]
    pub ttl: u32,
    /// Names and their addresses.
    pub records: BTreeMap<String, Vec<IpAddr>>,
}

fn default_resolver() -> IpAddr {
    IpAddr::from([127, 0, 0, 53])
}

fn default_ttl() -> u32 {
    300
}

/// A Service with a ClusterIP and endpoints (one EndpointSlice per family).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceDef {
    /// Its name.
    pub name: String,
    /// Its namespace; may be left out when the scenario has one.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its ClusterIP (in the local API server's 10.96.0.0/16).
    #[serde(rename = "clusterIP")]
    pub cluster_ip: IpAddr,
    /// The Service's port (also the endpoints' port).
    pub port: u16,
    /// Endpoint addresses.
    #[serde(default)]
    pub endpoints: Vec<IpAddr>,
}

/// A RuntimePolicy: its name, annotations and spec as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyDef {
    /// Its name (cluster-scoped: unique across the suite).
    pub name: String,
    /// Its annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `spec`, checked against the RuntimePolicy types at load and against
    /// the CRD's schema (strict field validation) when applied.
    pub spec: serde_json::Value,
}

/// A step as written: exactly one kind, plus the common fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawStep {
    /// Action: run a program in a pod.
    #[serde(default)]
    pub exec: Option<ExecAction>,
    /// Action: open a file in a pod.
    #[serde(default)]
    pub open: Option<OpenAction>,
    /// Action: a connection from a pod.
    #[serde(default)]
    pub connect: Option<ConnectAction>,
    /// Action: a DNS question from a pod.
    #[serde(default)]
    pub resolve: Option<ResolveAction>,
    /// Check: a result in the pod's Report.
    #[serde(default)]
    pub report: Option<ReportCheck>,
    /// Check: a condition of a policy.
    #[serde(default)]
    pub condition: Option<ConditionCheck>,
    /// Check: this node's shard of a policy's status.
    #[serde(default)]
    pub shard: Option<ShardCheck>,
    /// Check: a series on the daemon's /metrics.
    #[serde(default)]
    pub metric: Option<MetricCheck>,
    /// Mutation: a pod's or namespace's labels.
    #[serde(default)]
    pub relabel: Option<Relabel>,
    /// Mutation: create or update a policy.
    #[serde(default)]
    pub apply_policy: Option<PolicyDef>,
    /// Mutation: delete a policy.
    #[serde(default)]
    pub delete_policy: Option<NameRef>,
    /// Mutation: delete a Service (its EndpointSlices stay).
    #[serde(default)]
    pub delete_service: Option<NameRef>,
    /// Mutation: stop the daemon (SIGTERM) and start it again.
    #[serde(default)]
    pub restart_daemon: Option<RawRestart>,
    /// An action's expected outcome.
    #[serde(default)]
    pub expect: Option<Expect>,
    /// With `expect: refused`: the errno (default EPERM).
    #[serde(default)]
    pub errno: Option<String>,
    /// Run this step only on nodes of this class.
    #[serde(default)]
    pub when: Option<NodeClass>,
    /// How long an awaited step waits (`30s` by default, `500ms`, `2m`).
    #[serde(default)]
    pub within: Option<String>,
}

/// A program run in a pod's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecAction {
    /// The pod.
    pub pod: String,
    /// The container; the pod's first when left out.
    #[serde(default)]
    pub container: Option<String>,
    /// The program's absolute path.
    pub path: String,
    /// Its arguments (argv[0] is `true`, so a busybox copy exits 0).
    #[serde(default)]
    pub args: Vec<String>,
}

/// A file opened (read-only) in a pod's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpenAction {
    /// The pod.
    pub pod: String,
    /// The container; the pod's first when left out.
    #[serde(default)]
    pub container: Option<String>,
    /// The file's absolute path.
    pub path: String,
}

/// The transport of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// TCP: delivered when the listener accepted it (and got the payload).
    #[default]
    Tcp,
    /// UDP: delivered when the datagram arrived.
    Udp,
}

/// What a connection sends first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// Nothing (TCP: the handshake alone; UDP: an empty datagram is not
    /// useful, so a line of text).
    #[default]
    None,
    /// An ssh client's banner (`SSH-2.0-...`).
    Ssh,
    /// A TLS 1.3 ClientHello offering `alpn`.
    Tls,
    /// A line of text nothing classifies.
    Text,
}

/// A connection from a pod, to an address or to a name its resolver
/// answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectAction {
    /// The pod.
    pub pod: String,
    /// The container; the pod's first when left out.
    #[serde(default)]
    pub container: Option<String>,
    /// `ADDR:PORT` (`[V6]:PORT` for IPv6).
    #[serde(default)]
    pub to: Option<SocketAddr>,
    /// A name to resolve through the scenario's resolver first.
    #[serde(default)]
    pub name: Option<String>,
    /// The port with `name`.
    #[serde(default)]
    pub port: Option<u16>,
    /// With `name`: ask for AAAA instead of A.
    #[serde(default)]
    pub ipv6: bool,
    /// TCP or UDP.
    #[serde(default)]
    pub transport: Transport,
    /// What is sent first.
    #[serde(default)]
    pub send: Payload,
    /// The ALPN a ClientHello offers (`h2` when left out).
    #[serde(default)]
    pub alpn: Option<String>,
}

/// A DNS question from a pod to the scenario's resolver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResolveAction {
    /// The pod.
    pub pod: String,
    /// The container; the pod's first when left out.
    #[serde(default)]
    pub container: Option<String>,
    /// The name asked.
    pub name: String,
    /// AAAA instead of A.
    #[serde(default)]
    pub ipv6: bool,
}

/// A result in a pod's Report (`kyverno-runtime-<pod>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReportCheck {
    /// The pod.
    pub pod: String,
    /// The policy.
    pub policy: String,
    /// The behavior (the result's `rule`).
    pub behavior: String,
    /// The `target` property.
    pub target: String,
    /// `fail` or `warn`.
    #[serde(default)]
    pub result: Option<String>,
    /// The `enforced` property: refused (true) or would deny (false).
    #[serde(default)]
    pub enforced: Option<bool>,
    /// The exact `count` (held for a few report intervals once reached).
    #[serde(default)]
    pub count: Option<u64>,
    /// The least `count`.
    #[serde(default)]
    pub min_count: Option<u64>,
    /// No such result (checked after a few report intervals).
    #[serde(default)]
    pub absent: bool,
    /// Other properties, compared exactly.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// A condition of a policy (cluster-wide).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConditionCheck {
    /// The policy.
    pub policy: String,
    /// The condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// A piece of the message.
    #[serde(default)]
    pub message_contains: Option<String>,
}

/// This node's shard of a policy's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShardCheck {
    /// The policy.
    pub policy: String,
    /// `enforcementAvailable`.
    #[serde(default)]
    pub enforcement_available: Option<bool>,
    /// `observationAvailable`.
    #[serde(default)]
    pub observation_available: Option<bool>,
    /// `podsMatched`.
    #[serde(default)]
    pub pods_matched: Option<bool>,
    /// A piece of `message`.
    #[serde(default)]
    pub message_contains: Option<String>,
    /// `message` is absent.
    #[serde(default)]
    pub no_message: bool,
    /// Backends by behavior; [`OPEN_EXEC_OF_NODE`] stands for the backend
    /// this configuration must use for open and exec.
    #[serde(default)]
    pub backends: BTreeMap<String, String>,
    /// Event source states by name (`Available`, `Starting`, `Failed`).
    #[serde(default)]
    pub event_sources: BTreeMap<String, String>,
}

/// In a shard check's `backends`: the open/exec backend the runner's table
/// says this configuration must use (bpf_lsm, fmod_ret, or none on a
/// restricted node).
pub const OPEN_EXEC_OF_NODE: &str = "$openExec";

/// A series on the daemon's /metrics (its value summed over the series
/// whose labels include `labels`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricCheck {
    /// The series name, e.g. `nirmata_runtime_findings_emitted_total`.
    pub name: String,
    /// Labels the series must carry.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The least value.
    #[serde(default)]
    pub at_least: Option<f64>,
    /// The exact value.
    #[serde(default)]
    pub equals: Option<f64>,
}

/// New labels for a pod or a namespace (replacing the old ones).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Relabel {
    /// The pod.
    #[serde(default)]
    pub pod: Option<String>,
    /// The namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The labels it has afterwards.
    pub labels: BTreeMap<String, String>,
}

/// A reference by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NameRef {
    /// The name.
    pub name: String,
}

/// A daemon restart as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRestart {
    /// Actions checked over and over from before the SIGTERM until the new
    /// daemon has listed its pods: each must have its outcome every time.
    #[serde(default)]
    pub throughout: Vec<RawStep>,
    /// Mutations made while no daemon runs, then actions tried once each
    /// (after the mutations, still with no daemon), in order.
    #[serde(default)]
    pub while_down: Vec<RawStep>,
    /// Extra flags for the new daemon (until the next restart).
    #[serde(default)]
    pub args: Vec<String>,
}

/// An action's expected outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    /// exec, open: the kernel let it happen.
    Allowed,
    /// exec, open: the kernel refused it with the step's errno.
    Refused,
    /// connect: the listener got the connection and what was sent.
    Delivered,
    /// connect: it never arrived.
    Dropped,
    /// resolve: an answer with an address.
    Answered,
    /// resolve: NXDOMAIN.
    Nxdomain,
}

impl Expect {
    /// The opposite outcome (what `--break` expects instead).
    pub fn flipped(self) -> Expect {
        match self {
            Expect::Allowed => Expect::Refused,
            Expect::Refused => Expect::Allowed,
            Expect::Delivered => Expect::Dropped,
            Expect::Dropped => Expect::Delivered,
            Expect::Answered => Expect::Nxdomain,
            Expect::Nxdomain => Expect::Answered,
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expect::Allowed => "allowed",
            Expect::Refused => "refused",
            Expect::Delivered => "delivered",
            Expect::Dropped => "dropped",
            Expect::Answered => "answered",
            Expect::Nxdomain => "nxdomain",
        })
    }
}

// ---------------------------------------------------------------- checked

/// A checked scenario: every reference resolves, every step has one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scenario {
    /// The name (the file's stem).
    pub name: String,
    /// The file it came from (relative to the repository when it can be).
    pub file: String,
    /// What it proves.
    pub description: String,
    /// Where it cannot run, and why.
    pub not_on: Vec<NotOn>,
    /// Its namespaces.
    pub namespaces: Vec<NamespaceDef>,
    /// Its pods, each with its namespace filled in and at least one
    /// container.
    pub pods: Vec<PodDef>,
    /// Programs and files.
    pub setup: Setup,
    /// The resolver.
    pub resolver: Option<ResolverDef>,
    /// Services, each with its namespace filled in.
    pub services: Vec<ServiceDef>,
    /// Policies applied after the pods run.
    pub policies: Vec<PolicyDef>,
    /// The steps.
    pub steps: Vec<Step>,
}

/// A checked step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Its 1-based number in the file (nested steps of a restart have the
    /// restart's number).
    pub number: usize,
    /// What it does.
    pub kind: StepKind,
    /// Nodes of this class only.
    pub when: Option<NodeClass>,
    /// How long it may wait.
    #[serde(with = "millis")]
    pub within: Duration,
    /// Set by `--break`: this step's expectation was flipped.
    #[serde(default)]
    pub broken: bool,
}

/// The kinds of step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    /// Run an action; its outcome must become (and then be) `expect`.
    Action {
        /// The action.
        action: Action,
        /// The outcome.
        expect: Expect,
        /// With `Refused`: the errno's name.
        errno: String,
    },
    /// A Report result.
    Report(ReportCheck),
    /// A policy condition.
    Condition(ConditionCheck),
    /// This node's shard.
    Shard(ShardCheck),
    /// A metric.
    Metric(MetricCheck),
    /// New labels.
    Relabel(Relabel),
    /// Create or update a policy.
    ApplyPolicy(PolicyDef),
    /// Delete a policy.
    DeletePolicy(String),
    /// Delete a Service.
    DeleteService(String),
    /// Restart the daemon.
    RestartDaemon(Restart),
}

/// A checked restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    /// Actions (steps of kind `Action`) that must hold throughout.
    pub throughout: Vec<Step>,
    /// Mutations and single-try actions while no daemon runs.
    pub while_down: Vec<Step>,
    /// Extra daemon flags.
    pub args: Vec<String>,
}

/// An action a workload process performs in its pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// exec.
    Exec(ExecAction),
    /// open.
    Open(OpenAction),
    /// connect.
    Connect(ConnectAction),
    /// resolve.
    Resolve(ResolveAction),
}

impl Scenario {
    /// Why the scenario cannot run on a real node (a real kubelet and
    /// container runtime with the chart's daemon), or `None` when it can:
    /// there the runtime, not the scenario, lays out the cgroups, and the
    /// suite does not own the daemon's process to restart it or pass it
    /// flags (a restart only for the other class of node does not count).
    pub fn real_node_gap(&self, class: NodeClass) -> Option<String> {
        if let Some(p) = self
            .pods
            .iter()
            .find(|p| p.runtime != Runtime::Containerd || p.cgroup_driver != CgroupDriver::Cgroupfs)
        {
            return Some(format!(
                "pod {} asks for a runtime or cgroup driver of its own; a real node's runtime lays out its cgroups",
                p.name
            ));
        }
        if self.steps.iter().any(|s| {
            matches!(s.kind, StepKind::RestartDaemon(_)) && s.when.is_none_or(|w| w == class)
        }) {
            return Some(
                "it restarts the daemon with flags of its own; on a real node the chart's DaemonSet runs it"
                    .into(),
            );
        }
        None
    }
}

impl Action {
    /// The pod it runs in.
    pub fn pod(&self) -> &str {
        match self {
            Action::Exec(a) => &a.pod,
            Action::Open(a) => &a.pod,
            Action::Connect(a) => &a.pod,
            Action::Resolve(a) => &a.pod,
        }
    }

    /// The container it runs in, if named.
    pub fn container(&self) -> Option<&str> {
        match self {
            Action::Exec(a) => a.container.as_deref(),
            Action::Open(a) => a.container.as_deref(),
            Action::Connect(a) => a.container.as_deref(),
            Action::Resolve(a) => a.container.as_deref(),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Exec(a) => {
                write!(f, "exec {}", a.path)?;
                for arg in &a.args {
                    write!(f, " {arg}")?;
                }
                Ok(())
            }
            Action::Open(a) => write!(f, "open {}", a.path),
            Action::Connect(a) => {
                let transport = match a.transport {
                    Transport::Tcp => "tcp",
                    Transport::Udp => "udp",
                };
                match (&a.to, &a.name) {
                    (Some(to), _) => write!(f, "connect {transport} {to}")?,
                    (None, Some(name)) => write!(
                        f,
                        "connect {transport} {name}:{} ({})",
                        a.port.unwrap_or_default(),
                        if a.ipv6 { "AAAA" } else { "A" }
                    )?,
                    (None, None) => write!(f, "connect {transport} ?")?,
                }
                match a.send {
                    Payload::None => Ok(()),
                    Payload::Ssh => write!(f, " sending an ssh banner"),
                    Payload::Tls => write!(
                        f,
                        " sending a TLS ClientHello (ALPN {})",
                        a.alpn.as_deref().unwrap_or("h2")
                    ),
                    Payload::Text => write!(f, " sending text"),
                }
            }
            Action::Resolve(a) => write!(
                f,
                "resolve {} ({})",
                a.name,
                if a.ipv6 { "AAAA" } else { "A" }
            ),
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Parses `500ms`, `30s`, `2m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

// ---------------------------------------------------------------- loading

/// Loads every `*.yaml` in `dir` (sorted by name) and checks them one by
/// one and together (a policy or namespace name used by two scenarios
/// would let them interfere).
pub fn load_dir(dir: &Path) -> Result<Vec<Scenario>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::NoScenarios(dir.to_path_buf()));
    }
    load_files(&files)
}

/// Loads the scenario files `files` (a replay: e.g. what the generated
/// differential wrote for a disagreement) and checks them one by one and
/// together.
pub fn load_files(files: &[PathBuf]) -> Result<Vec<Scenario>> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|source| Error::Read {
            path: file.clone(),
            source,
        })?;
        out.push(parse(file, &text)?);
    }
    check_together(&out)?;
    Ok(out)
}

/// Parses and checks one scenario file's text.
pub fn parse(file: &Path, text: &str) -> Result<Scenario> {
    let shown = display_path(file);
    let raw: RawScenario = serde_yaml::from_str(text).map_err(|e| Error::Syntax {
        file: shown.clone(),
        message: e.to_string(),
    })?;
    Checker { file: &shown }.scenario(file, raw)
}

fn display_path(file: &Path) -> String {
    let text = file.display().to_string();
    match text.find("conformance/scenarios/") {
        Some(at) => text[at..].to_string(),
        None => text,
    }
}

fn check_together(all: &[Scenario]) -> Result<()> {
    let mut policies: BTreeMap<&str, &str> = BTreeMap::new();
    let mut namespaces: BTreeMap<&str, &str> = BTreeMap::new();
    for s in all {
        let mut names: BTreeSet<&str> = s.policies.iter().map(|p| p.name.as_str()).collect();
        for step in &s.steps {
            if let StepKind::ApplyPolicy(p) = &step.kind {
                names.insert(&p.name);
            }
        }
        for name in names {
            if let Some(other) = policies.insert(name, &s.file) {
                return Err(Error::Invalid {
                    file: s.file.clone(),
                    field: "policies".into(),
                    message: format!("policy {name:?} is also used by {other}; policies are cluster-scoped, so each scenario names its own"),
                });
            }
        }
        for ns in &s.namespaces {
            if let Some(other) = namespaces.insert(&ns.name, &s.file) {
                return Err(Error::Invalid {
                    file: s.file.clone(),
                    field: "namespaces".into(),
                    message: format!(
                        "namespace {:?} is also used by {other}; each scenario has its own",
                        ns.name
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The behaviors a Report result names.
pub const BEHAVIORS: [&str; 5] = ["exec", "open", "network", "protocol", "dns"];

/// The errnos a refusal may expect.
pub const KNOWN_ERRNOS: [&str; 3] = ["EPERM", "EACCES", "ENOENT"];

mod breaking;
mod check;
#[cfg(test)]
mod tests;

pub use breaking::{break_one, describe_expectation};
use check::Checker;
