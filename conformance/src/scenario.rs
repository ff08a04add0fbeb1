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
    /// Mutations made while no daemon runs.
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
    /// Mutations while no daemon runs.
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
    let mut out = Vec::new();
    for file in &files {
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

struct Checker<'a> {
    file: &'a str,
}

impl Checker<'_> {
    fn bad(&self, field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Invalid {
            file: self.file.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn scenario(&self, path: &Path, raw: RawScenario) -> Result<Scenario> {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if raw.name != stem {
            return Err(self.bad(
                "name",
                format!(
                    "{:?} must be the file's name without .yaml ({stem:?})",
                    raw.name
                ),
            ));
        }
        self.dns_label("name", &raw.name)?;
        if raw.description.trim().is_empty() {
            return Err(self.bad("description", "say what the scenario proves"));
        }
        for (i, n) in raw.not_on.iter().enumerate() {
            if n.reason.trim().is_empty() {
                return Err(self.bad(format!("notOn[{i}].reason"), "give the reason"));
            }
        }
        if raw.namespaces.is_empty() {
            return Err(self.bad("namespaces", "at least one namespace"));
        }
        let mut ns_names = BTreeSet::new();
        for (i, ns) in raw.namespaces.iter().enumerate() {
            self.dns_label(&format!("namespaces[{i}].name"), &ns.name)?;
            if !ns_names.insert(ns.name.clone()) {
                return Err(self.bad(
                    format!("namespaces[{i}].name"),
                    format!("{:?} twice", ns.name),
                ));
            }
        }
        let only_ns = (raw.namespaces.len() == 1).then(|| raw.namespaces[0].name.clone());
        let namespace_of = |field: String, given: &Option<String>| -> Result<String> {
            match (given, &only_ns) {
                (Some(ns), _) if ns_names.contains(ns) => Ok(ns.clone()),
                (Some(ns), _) => {
                    Err(self.bad(field, format!("no namespace {ns:?} in this scenario")))
                }
                (None, Some(ns)) => Ok(ns.clone()),
                (None, None) => {
                    Err(self.bad(field, "name the namespace: the scenario has several"))
                }
            }
        };
        let mut pods = Vec::new();
        let mut pod_names = BTreeSet::new();
        for (i, p) in raw.pods.iter().enumerate() {
            self.dns_label(&format!("pods[{i}].name"), &p.name)?;
            if !pod_names.insert(p.name.clone()) {
                return Err(self.bad(
                    format!("pods[{i}].name"),
                    format!(
                        "{:?} twice (steps name pods without their namespace)",
                        p.name
                    ),
                ));
            }
            let mut pod = p.clone();
            pod.namespace = Some(namespace_of(format!("pods[{i}].namespace"), &p.namespace)?);
            if pod.containers.is_empty() {
                pod.containers.push("app".into());
            }
            let mut seen = BTreeSet::new();
            for (j, c) in pod.containers.iter().enumerate() {
                self.dns_label(&format!("pods[{i}].containers[{j}]"), c)?;
                if !seen.insert(c) {
                    return Err(
                        self.bad(format!("pods[{i}].containers[{j}]"), format!("{c:?} twice"))
                    );
                }
            }
            pods.push(pod);
        }
        for (i, p) in raw.setup.programs.iter().enumerate() {
            self.fixture(&format!("setup.programs[{i}]"), p)?;
        }
        for (i, p) in raw.setup.files.iter().enumerate() {
            self.fixture(&format!("setup.files[{i}]"), p)?;
        }
        if let Some(r) = &raw.resolver {
            if r.records.is_empty() {
                return Err(self.bad("resolver.records", "at least one name"));
            }
            for name in r.records.keys() {
                if name.is_empty()
                    || name.len() > 253
                    || name.split('.').any(|l| l.is_empty() || l.len() > 63)
                {
                    return Err(self.bad(format!("resolver.records.{name}"), "not a domain name"));
                }
            }
        }
        let mut services = Vec::new();
        for (i, s) in raw.services.iter().enumerate() {
            self.dns_label(&format!("services[{i}].name"), &s.name)?;
            let mut svc = s.clone();
            svc.namespace = Some(namespace_of(
                format!("services[{i}].namespace"),
                &s.namespace,
            )?);
            if !matches!(s.cluster_ip, IpAddr::V4(a) if a.octets()[0] == 10 && a.octets()[1] == 96)
            {
                return Err(self.bad(
                    format!("services[{i}].clusterIP"),
                    "must be in the local API server's Service range 10.96.0.0/16",
                ));
            }
            services.push(svc);
        }
        let mut policy_names = BTreeSet::new();
        for (i, p) in raw.policies.iter().enumerate() {
            self.policy(&format!("policies[{i}]"), p)?;
            if !policy_names.insert(p.name.clone()) {
                return Err(self.bad(format!("policies[{i}].name"), format!("{:?} twice", p.name)));
            }
        }
        let ctx = Context {
            pods: &pods,
            namespaces: &ns_names,
            services: &services,
            resolver: raw.resolver.as_ref(),
            policies: policy_names,
        };
        if raw.steps.is_empty() {
            return Err(self.bad("steps", "at least one step"));
        }
        let mut steps = Vec::new();
        let mut ctx = ctx;
        for (i, s) in raw.steps.iter().enumerate() {
            steps.push(self.step(&format!("steps[{i}]"), i + 1, s, &mut ctx, Nesting::Top)?);
        }
        Ok(Scenario {
            name: raw.name,
            file: self.file.to_string(),
            description: raw.description.trim().to_string(),
            not_on: raw.not_on,
            namespaces: raw.namespaces,
            pods,
            setup: raw.setup,
            resolver: raw.resolver,
            services,
            policies: raw.policies,
            steps,
        })
    }

    fn dns_label(&self, field: &str, s: &str) -> Result<()> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        if ok {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!("{s:?} is not a DNS label (a-z, 0-9, '-', at most 63)"),
            ))
        }
    }

    fn fixture(&self, field: &str, path: &str) -> Result<()> {
        let under = Path::new(path)
            .strip_prefix(FIXTURE_ROOT)
            .ok()
            .filter(|rest| !rest.as_os_str().is_empty());
        if under.is_none() || path.contains("/../") || path.ends_with("/..") {
            return Err(self.bad(
                field,
                format!("{path:?} must be a file under {FIXTURE_ROOT}/ (the only place a run creates files)"),
            ));
        }
        Ok(())
    }

    fn policy(&self, field: &str, p: &PolicyDef) -> Result<()> {
        if p.name.is_empty()
            || p.name.len() > 253
            || !p
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(self.bad(
                format!("{field}.name"),
                format!("{:?} is not an object name", p.name),
            ));
        }
        serde_json::from_value::<kyverno_runtime_api::runtimepolicy::RuntimePolicySpec>(
            p.spec.clone(),
        )
        .map_err(|e| {
            self.bad(
                format!("{field}.spec"),
                format!("not a RuntimePolicy spec: {e}"),
            )
        })?;
        Ok(())
    }

    fn step(
        &self,
        field: &str,
        number: usize,
        raw: &RawStep,
        ctx: &mut Context<'_>,
        nesting: Nesting,
    ) -> Result<Step> {
        let mut kinds: Vec<&str> = Vec::new();
        let mut note = |set: bool, name: &'static str| {
            if set {
                kinds.push(name);
            }
        };
        note(raw.exec.is_some(), "exec");
        note(raw.open.is_some(), "open");
        note(raw.connect.is_some(), "connect");
        note(raw.resolve.is_some(), "resolve");
        note(raw.report.is_some(), "report");
        note(raw.condition.is_some(), "condition");
        note(raw.shard.is_some(), "shard");
        note(raw.metric.is_some(), "metric");
        note(raw.relabel.is_some(), "relabel");
        note(raw.apply_policy.is_some(), "applyPolicy");
        note(raw.delete_policy.is_some(), "deletePolicy");
        note(raw.delete_service.is_some(), "deleteService");
        note(raw.restart_daemon.is_some(), "restartDaemon");
        let kind = match kinds.as_slice() {
            [one] => *one,
            [] => return Err(self.bad(field, "a step needs one of exec, open, connect, resolve, report, condition, shard, metric, relabel, applyPolicy, deletePolicy, deleteService, restartDaemon")),
            many => return Err(self.bad(field, format!("one kind per step, got {}", many.join(", ")))),
        };
        let within = match &raw.within {
            None => DEFAULT_WITHIN,
            Some(w) => match parse_duration(w) {
                Some(d) if d <= MAX_WITHIN && !d.is_zero() => d,
                Some(_) => {
                    return Err(self.bad(
                        format!("{field}.within"),
                        format!("{w:?} is outside 1ms..{}s", MAX_WITHIN.as_secs()),
                    ))
                }
                None => {
                    return Err(self.bad(
                        format!("{field}.within"),
                        format!("{w:?} is not a duration like 500ms, 30s or 2m"),
                    ))
                }
            },
        };
        let is_action = matches!(kind, "exec" | "open" | "connect" | "resolve");
        if !is_action && (raw.expect.is_some() || raw.errno.is_some()) {
            return Err(self.bad(
                format!("{field}.expect"),
                format!("only actions have an expected outcome ({kind} is not one)"),
            ));
        }
        let allowed_here = match nesting {
            Nesting::Top => true,
            Nesting::Throughout => is_action,
            Nesting::WhileDown => matches!(
                kind,
                "relabel" | "applyPolicy" | "deletePolicy" | "deleteService"
            ),
        };
        if !allowed_here {
            let what = match nesting {
                Nesting::Throughout => "restartDaemon.throughout holds actions only",
                Nesting::WhileDown => "restartDaemon.whileDown holds mutations only (relabel, applyPolicy, deletePolicy, deleteService)",
                Nesting::Top => "",
            };
            return Err(self.bad(field, what));
        }
        if nesting != Nesting::Top && (raw.when.is_some() || raw.within.is_some()) {
            return Err(self.bad(
                field,
                "nested steps take the restart's `when` and have no `within`",
            ));
        }
        let kind = if is_action {
            let action = if let Some(a) = &raw.exec {
                self.pod_ref(
                    &format!("{field}.exec"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.absolute(&format!("{field}.exec.path"), &a.path)?;
                Action::Exec(a.clone())
            } else if let Some(a) = &raw.open {
                self.pod_ref(
                    &format!("{field}.open"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.absolute(&format!("{field}.open.path"), &a.path)?;
                Action::Open(a.clone())
            } else if let Some(a) = &raw.connect {
                self.pod_ref(
                    &format!("{field}.connect"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                self.connect(&format!("{field}.connect"), a, ctx)?;
                Action::Connect(a.clone())
            } else if let Some(a) = &raw.resolve {
                self.pod_ref(
                    &format!("{field}.resolve"),
                    &a.pod,
                    a.container.as_deref(),
                    ctx,
                )?;
                if ctx.resolver.is_none() {
                    return Err(
                        self.bad(format!("{field}.resolve"), "the scenario has no resolver")
                    );
                }
                Action::Resolve(a.clone())
            } else {
                return Err(self.bad(field, "no action"));
            };
            let expect = raw.expect.ok_or_else(|| {
                self.bad(
                    format!("{field}.expect"),
                    "an action needs an expected outcome",
                )
            })?;
            let fits = match &action {
                Action::Exec(_) | Action::Open(_) => {
                    matches!(expect, Expect::Allowed | Expect::Refused)
                }
                Action::Connect(_) => matches!(expect, Expect::Delivered | Expect::Dropped),
                Action::Resolve(_) => matches!(expect, Expect::Answered | Expect::Nxdomain),
            };
            if !fits {
                let want = match &action {
                    Action::Exec(_) | Action::Open(_) => "allowed or refused",
                    Action::Connect(_) => "delivered or dropped",
                    Action::Resolve(_) => "answered or nxdomain",
                };
                return Err(self.bad(
                    format!("{field}.expect"),
                    format!("{expect} does not fit {kind}: expect {want}"),
                ));
            }
            let errno = match (&raw.errno, expect) {
                (None, _) => "EPERM".to_string(),
                (Some(e), Expect::Refused) if KNOWN_ERRNOS.contains(&e.as_str()) => e.clone(),
                (Some(e), Expect::Refused) => {
                    return Err(self.bad(
                        format!("{field}.errno"),
                        format!("{e:?} is not one of {}", KNOWN_ERRNOS.join(", ")),
                    ))
                }
                (Some(_), _) => {
                    return Err(self.bad(
                        format!("{field}.errno"),
                        "an errno goes with expect: refused",
                    ))
                }
            };
            StepKind::Action {
                action,
                expect,
                errno,
            }
        } else if let Some(r) = &raw.report {
            self.pod_ref(&format!("{field}.report"), &r.pod, None, ctx)?;
            self.policy_ref(&format!("{field}.report.policy"), &r.policy, ctx)?;
            if !BEHAVIORS.contains(&r.behavior.as_str()) {
                return Err(self.bad(
                    format!("{field}.report.behavior"),
                    format!("{:?} is not one of {}", r.behavior, BEHAVIORS.join(", ")),
                ));
            }
            if let Some(result) = &r.result {
                if !["fail", "warn", "pass"].contains(&result.as_str()) {
                    return Err(self.bad(
                        format!("{field}.report.result"),
                        format!("{result:?} is not fail, warn or pass"),
                    ));
                }
            }
            let counts = [r.count.is_some(), r.min_count.is_some(), r.absent]
                .iter()
                .filter(|b| **b)
                .count();
            if counts != 1 {
                return Err(self.bad(
                    format!("{field}.report"),
                    "exactly one of count, minCount, absent",
                ));
            }
            if r.absent && (r.enforced.is_some() || r.result.is_some() || !r.properties.is_empty())
            {
                return Err(self.bad(
                    format!("{field}.report"),
                    "an absent result has no other fields",
                ));
            }
            StepKind::Report(r.clone())
        } else if let Some(c) = &raw.condition {
            self.policy_ref(&format!("{field}.condition.policy"), &c.policy, ctx)?;
            if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
                return Err(self.bad(
                    format!("{field}.condition.status"),
                    format!("{:?} is not \"True\", \"False\" or \"Unknown\"", c.status),
                ));
            }
            StepKind::Condition(c.clone())
        } else if let Some(s) = &raw.shard {
            self.policy_ref(&format!("{field}.shard.policy"), &s.policy, ctx)?;
            if s.no_message && s.message_contains.is_some() {
                return Err(self.bad(
                    format!("{field}.shard"),
                    "noMessage and messageContains contradict",
                ));
            }
            for (b, v) in &s.backends {
                if !["open", "exec", "network", "protocol", "dns", "execArgv"].contains(&b.as_str())
                {
                    return Err(self.bad(
                        format!("{field}.shard.backends.{b}"),
                        "not a behavior of the plan",
                    ));
                }
                if v == OPEN_EXEC_OF_NODE && !["open", "exec"].contains(&b.as_str()) {
                    return Err(self.bad(
                        format!("{field}.shard.backends.{b}"),
                        format!("{OPEN_EXEC_OF_NODE} stands for the open/exec backend only"),
                    ));
                }
            }
            for (name, state) in &s.event_sources {
                if !["Available", "Starting", "Failed"].contains(&state.as_str()) {
                    return Err(self.bad(
                        format!("{field}.shard.eventSources.{name}"),
                        format!("{state:?} is not Available, Starting or Failed"),
                    ));
                }
            }
            StepKind::Shard(s.clone())
        } else if let Some(m) = &raw.metric {
            if !m.name.starts_with("nirmata_runtime_") {
                return Err(self.bad(
                    format!("{field}.metric.name"),
                    "the daemon's series start with nirmata_runtime_",
                ));
            }
            if m.at_least.is_some() == m.equals.is_some() {
                return Err(self.bad(format!("{field}.metric"), "exactly one of atLeast, equals"));
            }
            StepKind::Metric(m.clone())
        } else if let Some(r) = &raw.relabel {
            match (&r.pod, &r.namespace) {
                (Some(p), None) => self.pod_ref(&format!("{field}.relabel"), p, None, ctx)?,
                (None, Some(n)) if ctx.namespaces.contains(n) => {}
                (None, Some(n)) => {
                    return Err(self.bad(
                        format!("{field}.relabel.namespace"),
                        format!("no namespace {n:?} in this scenario"),
                    ))
                }
                _ => return Err(self.bad(format!("{field}.relabel"), "name a pod or a namespace")),
            }
            StepKind::Relabel(r.clone())
        } else if let Some(p) = &raw.apply_policy {
            self.policy(&format!("{field}.applyPolicy"), p)?;
            ctx.policies.insert(p.name.clone());
            StepKind::ApplyPolicy(p.clone())
        } else if let Some(n) = &raw.delete_policy {
            self.policy_ref(&format!("{field}.deletePolicy.name"), &n.name, ctx)?;
            StepKind::DeletePolicy(n.name.clone())
        } else if let Some(n) = &raw.delete_service {
            if !ctx.services.iter().any(|s| s.name == n.name) {
                return Err(self.bad(
                    format!("{field}.deleteService.name"),
                    format!("no Service {:?} in this scenario", n.name),
                ));
            }
            StepKind::DeleteService(n.name.clone())
        } else if let Some(r) = &raw.restart_daemon {
            let mut throughout = Vec::new();
            for (i, s) in r.throughout.iter().enumerate() {
                throughout.push(self.step(
                    &format!("{field}.restartDaemon.throughout[{i}]"),
                    number,
                    s,
                    ctx,
                    Nesting::Throughout,
                )?);
            }
            let mut while_down = Vec::new();
            for (i, s) in r.while_down.iter().enumerate() {
                while_down.push(self.step(
                    &format!("{field}.restartDaemon.whileDown[{i}]"),
                    number,
                    s,
                    ctx,
                    Nesting::WhileDown,
                )?);
            }
            for (i, a) in r.args.iter().enumerate() {
                if !a.starts_with("--")
                    || ["--node-name", "--pin-dir", "--metrics-addr"]
                        .iter()
                        .any(|f| a.starts_with(f))
                {
                    return Err(self.bad(format!("{field}.restartDaemon.args[{i}]"), format!("{a:?}: a --flag, other than the node name, pin dir and metrics address the runner sets")));
                }
            }
            StepKind::RestartDaemon(Restart {
                throughout,
                while_down,
                args: r.args.clone(),
            })
        } else {
            return Err(self.bad(field, "no step kind"));
        };
        Ok(Step {
            number,
            kind,
            when: raw.when,
            within,
            broken: false,
        })
    }

    fn pod_ref(
        &self,
        field: &str,
        pod: &str,
        container: Option<&str>,
        ctx: &Context<'_>,
    ) -> Result<()> {
        let Some(p) = ctx.pods.iter().find(|p| p.name == pod) else {
            let names: Vec<&str> = ctx.pods.iter().map(|p| p.name.as_str()).collect();
            return Err(self.bad(
                format!("{field}.pod"),
                format!("no pod {pod:?} (pods: {})", names.join(", ")),
            ));
        };
        if let Some(c) = container {
            if !p.containers.iter().any(|x| x == c) {
                return Err(self.bad(
                    format!("{field}.container"),
                    format!("pod {pod:?} has no container {c:?}"),
                ));
            }
        }
        Ok(())
    }

    fn policy_ref(&self, field: &str, name: &str, ctx: &Context<'_>) -> Result<()> {
        if ctx.policies.contains(name) {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!(
                    "no policy {name:?} in this scenario (policies, or an earlier applyPolicy)"
                ),
            ))
        }
    }

    fn absolute(&self, field: &str, path: &str) -> Result<()> {
        if path.starts_with('/') {
            Ok(())
        } else {
            Err(self.bad(field, format!("{path:?} is not an absolute path")))
        }
    }

    fn connect(&self, field: &str, a: &ConnectAction, ctx: &Context<'_>) -> Result<()> {
        match (&a.to, &a.name, a.port) {
            (Some(to), None, None) => {
                if to.port() == 0 {
                    return Err(self.bad(format!("{field}.to"), "port 0"));
                }
                if a.ipv6 {
                    return Err(self.bad(
                        format!("{field}.ipv6"),
                        "ipv6 chooses the question type of `name`; `to` says its family",
                    ));
                }
            }
            (None, Some(name), Some(port)) if port != 0 => {
                let Some(r) = ctx.resolver else {
                    return Err(self.bad(
                        format!("{field}.name"),
                        "connecting by name needs the scenario's resolver",
                    ));
                };
                let family_ok = r
                    .records
                    .get(name)
                    .is_none_or(|addrs| addrs.iter().any(|ip| ip.is_ipv6() == a.ipv6));
                if !family_ok {
                    return Err(self.bad(
                        format!("{field}.name"),
                        format!(
                            "the resolver has no {} record for {name:?}",
                            if a.ipv6 { "AAAA" } else { "A" }
                        ),
                    ));
                }
            }
            _ => return Err(self.bad(field, "give `to: ADDR:PORT`, or `name` and `port`")),
        }
        if a.alpn.is_some() && a.send != Payload::Tls {
            return Err(self.bad(format!("{field}.alpn"), "an ALPN goes with send: tls"));
        }
        if let Some(alpn) = &a.alpn {
            if alpn.is_empty() || alpn.len() > 255 {
                return Err(self.bad(format!("{field}.alpn"), "1 to 255 bytes"));
            }
        }
        if a.transport == Transport::Udp && matches!(a.send, Payload::Ssh | Payload::Tls) {
            return Err(self.bad(
                format!("{field}.send"),
                "ssh and tls are streams: use transport tcp",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    Top,
    Throughout,
    WhileDown,
}

struct Context<'a> {
    pods: &'a [PodDef],
    namespaces: &'a BTreeSet<String>,
    services: &'a [ServiceDef],
    resolver: Option<&'a ResolverDef>,
    policies: BTreeSet<String>,
}

/// The behaviors a Report result names.
pub const BEHAVIORS: [&str; 5] = ["exec", "open", "network", "protocol", "dns"];

/// The errnos a refusal may expect.
pub const KNOWN_ERRNOS: [&str; 3] = ["EPERM", "EACCES", "ENOENT"];

// ---------------------------------------------------------------- break

/// Flips one expectation of `scenario` for `--break`: step `step`
/// (1-based), or the first step without `when` whose expectation can be
/// flipped. Returns what was flipped, for the run's header.
pub fn break_one(scenario: &mut Scenario, step: Option<usize>) -> Result<String> {
    let name = scenario.name.clone();
    let candidates: Vec<usize> = scenario
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| match step {
            Some(n) => s.number == n,
            None => s.when.is_none() && flippable(&s.kind),
        })
        .map(|(i, _)| i)
        .collect();
    let Some(&at) = candidates.first() else {
        return Err(Error::Break(match step {
            Some(n) => format!("scenario {name} has no step {n}"),
            None => format!("scenario {name} has no step whose expectation can be flipped"),
        }));
    };
    let s = &mut scenario.steps[at];
    let before = describe_expectation(&s.kind);
    if !flip(&mut s.kind) {
        return Err(Error::Break(format!(
            "step {} of {name} has no expectation to flip ({before})",
            s.number
        )));
    }
    s.broken = true;
    Ok(format!(
        "{name} step {}: expected {before}, now {}",
        s.number,
        describe_expectation(&s.kind)
    ))
}

fn flippable(kind: &StepKind) -> bool {
    let mut probe = kind.clone();
    flip(&mut probe)
}

fn flip(kind: &mut StepKind) -> bool {
    match kind {
        StepKind::Action { expect, .. } => {
            *expect = expect.flipped();
            true
        }
        StepKind::Report(r) => {
            if r.absent {
                r.absent = false;
                r.min_count = Some(1);
            } else {
                *r = ReportCheck {
                    absent: true,
                    count: None,
                    min_count: None,
                    enforced: None,
                    result: None,
                    properties: BTreeMap::new(),
                    ..r.clone()
                };
            }
            true
        }
        StepKind::Condition(c) => {
            c.status = if c.status == "True" {
                "False".into()
            } else {
                "True".into()
            };
            true
        }
        StepKind::Shard(s) => {
            let first = [
                &mut s.enforcement_available,
                &mut s.observation_available,
                &mut s.pods_matched,
            ]
            .into_iter()
            .flatten()
            .next();
            match first {
                Some(v) => {
                    *v = !*v;
                    true
                }
                None => false,
            }
        }
        StepKind::RestartDaemon(r) => r.throughout.first_mut().is_some_and(|s| flip(&mut s.kind)),
        _ => false,
    }
}

/// A step's expectation in words (the matrix's failure lines use it too).
pub fn describe_expectation(kind: &StepKind) -> String {
    match kind {
        StepKind::Action {
            expect: Expect::Refused,
            errno,
            ..
        } => format!("refused ({errno})"),
        StepKind::Action { expect, .. } => expect.to_string(),
        StepKind::Report(r) if r.absent => "no such result".into(),
        StepKind::Report(r) => match (r.count, r.min_count) {
            (Some(c), _) => format!("a result with count {c}"),
            (_, Some(m)) => format!("a result with count >= {m}"),
            _ => "a result".into(),
        },
        StepKind::Condition(c) => format!("{}={}", c.type_, c.status),
        StepKind::Shard(s) => {
            let mut parts = Vec::new();
            if let Some(v) = s.enforcement_available {
                parts.push(format!("enforcementAvailable={v}"));
            }
            if let Some(v) = s.observation_available {
                parts.push(format!("observationAvailable={v}"));
            }
            if let Some(v) = s.pods_matched {
                parts.push(format!("podsMatched={v}"));
            }
            parts.join(", ")
        }
        StepKind::RestartDaemon(r) => r
            .throughout
            .first()
            .map(|s| describe_expectation(&s.kind))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name: sample
description: A sample.
namespaces:
  - name: sample
pods:
  - name: web
    labels: {app: web}
setup:
  programs: [/opt/krt-conformance/sample/tool]
policies:
  - name: sample-policy
    spec:
      mode: enforce
      podSelector: {matchLabels: {app: web}}
      behaviors:
        - exec: {deny: {values: [/opt/krt-conformance/sample/tool]}}
steps:
  - exec: {pod: web, path: /opt/krt-conformance/sample/tool}
    expect: refused
    when: capable
  - connect: {pod: web, to: "127.0.0.9:80"}
    expect: dropped
  - report: {pod: web, policy: sample-policy, behavior: exec, target: /opt/krt-conformance/sample/tool, count: 1}
"#;

    fn parsed(text: &str) -> Result<Scenario> {
        parse(Path::new("/repo/conformance/scenarios/sample.yaml"), text)
    }

    fn error_of(text: &str) -> String {
        match parsed(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_scenario_is_checked_into_closed_steps() {
        let s = parsed(MINIMAL).unwrap();
        assert_eq!(s.file, "conformance/scenarios/sample.yaml");
        assert_eq!(s.pods[0].namespace.as_deref(), Some("sample"));
        assert_eq!(s.pods[0].containers, ["app"]);
        assert_eq!(s.steps.len(), 3);
        assert!(matches!(
            &s.steps[0].kind,
            StepKind::Action { expect: Expect::Refused, errno, .. } if errno == "EPERM"
        ));
        assert_eq!(s.steps[0].when, Some(NodeClass::Capable));
        assert_eq!(s.steps[1].within, DEFAULT_WITHIN);
        // The plan a guest gets round-trips.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Scenario>(&json).unwrap(), s);
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let typo = MINIMAL.replace("expect: dropped", "expct: dropped");
        let e = error_of(&typo);
        assert!(e.starts_with("conformance/scenarios/sample.yaml: "), "{e}");
        assert!(e.contains("unknown field `expct`"), "{e}");
        assert!(e.contains("line"), "{e}");

        let e = error_of(&MINIMAL.replace("{pod: web, to:", "{pod: wbe, to:"));
        assert_eq!(
            e,
            "conformance/scenarios/sample.yaml: steps[1].connect.pod: no pod \"wbe\" (pods: web)"
        );
        let e = error_of(&MINIMAL.replace("expect: dropped", "expect: refused"));
        assert!(
            e.contains(
                "steps[1].expect: refused does not fit connect: expect delivered or dropped"
            ),
            "{e}"
        );
        let e = error_of(&MINIMAL.replace("name: sample\n", "name: other\n"));
        assert!(e.contains("name: \"other\" must be the file's name"), "{e}");
        let e = error_of(&MINIMAL.replace("policy: sample-policy,", "policy: nope,"));
        assert!(
            e.contains("steps[2].report.policy: no policy \"nope\""),
            "{e}"
        );
        let e = error_of(&MINIMAL.replace("count: 1}", "count: 1, absent: true}"));
        assert!(
            e.contains("steps[2].report: exactly one of count, minCount, absent"),
            "{e}"
        );
        let e = error_of(&MINIMAL.replace(
            "[/opt/krt-conformance/sample/tool]\npolicies",
            "[/usr/bin/tool]\npolicies",
        ));
        assert!(
            e.contains(
                "setup.programs[0]: \"/usr/bin/tool\" must be a file under /opt/krt-conformance/"
            ),
            "{e}"
        );
        let e = error_of(&MINIMAL.replace("mode: enforce", "mode: 3"));
        assert!(
            e.contains("policies[0].spec: not a RuntimePolicy spec"),
            "{e}"
        );
        let e = error_of(
            &MINIMAL.replace("    when: capable\n", "    when: capable\n    within: 9h\n"),
        );
        assert!(
            e.contains("steps[0].within: \"9h\" is not a duration"),
            "{e}"
        );
        let both = MINIMAL.replace(
            "  - connect: {pod: web, to: \"127.0.0.9:80\"}",
            "  - connect: {pod: web, to: \"127.0.0.9:80\"}\n    deletePolicy: {name: sample-policy}",
        );
        assert!(error_of(&both).contains("steps[1]: one kind per step, got connect, deletePolicy"));
    }

    #[test]
    fn names_are_unique_across_the_suite() {
        let a = parsed(MINIMAL).unwrap();
        let mut b = a.clone();
        b.file = "conformance/scenarios/b.yaml".into();
        b.namespaces[0].name = "b".into();
        let e = check_together(&[a, b]).unwrap_err().to_string();
        assert!(
            e.contains(
                "policy \"sample-policy\" is also used by conformance/scenarios/sample.yaml"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_committed_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let all = load_dir(&dir).unwrap();
        assert!(all.len() >= 20, "{}", all.len());
        for s in &all {
            assert!(s.steps.iter().all(|st| st.number >= 1), "{}", s.name);
        }
    }

    #[test]
    fn break_flips_one_expectation() {
        let mut s = parsed(MINIMAL).unwrap();
        // The first step without `when` whose expectation flips.
        let what = break_one(&mut s, None).unwrap();
        assert_eq!(what, "sample step 2: expected dropped, now delivered");
        assert!(s.steps[1].broken);
        assert!(matches!(
            s.steps[1].kind,
            StepKind::Action {
                expect: Expect::Delivered,
                ..
            }
        ));
        assert!(!s.steps[0].broken);

        let mut s = parsed(MINIMAL).unwrap();
        assert_eq!(
            break_one(&mut s, Some(3)).unwrap(),
            "sample step 3: expected a result with count 1, now no such result"
        );
        assert!(break_one(&mut s, Some(9))
            .unwrap_err()
            .to_string()
            .contains("has no step 9"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("2h"), None);
        assert_eq!(parse_duration("s"), None);
    }
}
