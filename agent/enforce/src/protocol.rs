//! The application protocol behavior: its manager ([`ProtocolManager`]:
//! RuntimePolicies and pods in, the classifier's rule sets and cgroup
//! attachments out) over the kernel's protocol classifier
//! ([`KernelProtocol`], `kyverno-runtime-bpf`'s `cgroup_skb/egress`
//! classifier) or, in tests, any other [`ProtocolKernel`].
//!
//! # One set per pod, the union of its policies
//!
//! The classifier holds *rule sets* (allow and deny lists of
//! [`ProtoKey`]s) and maps each gated cgroup to one set with two flags
//! (default deny, observe). The manager gives every pod that at least one
//! protocol policy selects its own set, shared by all of the pod's
//! container cgroups, and programs into it the union of the selecting
//! policies:
//!
//! - every allow key and every deny key of every selecting enforce policy;
//! - default deny while at least one selecting enforce policy denies
//!   `["*"]`;
//! - observe while at least one selecting monitor policy has a protocol
//!   behavior (a monitor policy programs no key: nothing it says can drop
//!   a flow).
//!
//! The kernel decides explicit deny > explicit allow > default deny >
//! pass, so separate policies union exactly as the seam promises: one
//! policy's allow lifts another's default deny, an explicit deny anywhere
//! beats every allow. Both flags are counts over the selecting policies
//! ([`ProtocolManager::flag_counts`]), recomputed on every event, so
//! removing one of two default-deny policies leaves the default deny up.
//!
//! # Ordering
//!
//! A pod's first selection programs its set's keys, then gates each
//! container cgroup to the set (with its flags), *then* attaches the
//! program to the cgroup's directory, so the first packet the program sees
//! already finds its rules. Its last unselection revokes each cgroup from
//! the gate, *then* detaches it, then clears the set. Within a change the
//! manager tightens first and loosens last: deny keys added, allow keys
//! removed, default deny raised, allow keys added, flags lowered (and new
//! containers attached), deny keys removed. A failed step stops the pod's
//! convergence where it is; the manager mirrors every step that succeeded
//! and retries the rest on the next event ([`ProtocolFailure`]).
//!
//! # Values
//!
//! A protocol value is a token of [`parse_protocol`]: `ssh`, `tls`,
//! `tls/<alpn>`, `dns`, `http/1.1`, `http/2`, `quic`, or `"*"` in
//! deny (the default deny). Everything the parser refuses
//! (`unclassified`, which is observation vocabulary, unknown tokens, bad
//! ALPN names) and every misplaced `"*"` is a [`ProtocolRejection`] with
//! its field path, counted and kept for the policy's status; the rest of
//! the list is programmed.
//!
//! # Observations
//!
//! The kernel counts flows per (cgroup, classification, decision): every
//! refused flow, and every flow of a cgroup whose set observes (so an
//! enforce-only pod's refusals still become findings, as the egress
//! filter's do). [`ProtocolManager::drain`] reads and resets those counts
//! into [`ProtocolObservation`]s in the policy vocabulary (`http/1.1`, not
//! the kernel's `http1`; `unclassified` for no evidence), and reports the
//! decisions the kernel could not count (its event map full) since the
//! previous drain.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use kyverno_runtime_bpf::cgroup_attach::CgroupLink;
use kyverno_runtime_bpf::protocol::{
    self as bpf, Alpn, ProtoFlags, ProtoKey, ProtoStats, Protocol, ProtocolClassifier,
    ProtocolError, Verdict,
};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{
    parse_protocol, ProtocolTarget, ProtocolToken, Reason, ValueError, STAR,
};

use crate::egress::NetworkPod;
use crate::openexec::{BehaviorLists, Mode};
use crate::seam::{CgroupId, Decision, PolicyId, Program, Rules};

// ---- values -------------------------------------------------------------------------

/// A protocol value that is not programmed: where it was, what it was and
/// why. The rest of the list is programmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolRejection {
    /// The field path, such as `spec.behaviors[0].protocol.deny`.
    pub path: String,
    /// The value as written.
    pub value: String,
    /// Why it was refused.
    pub reason: Reason,
}

impl From<ValueError> for ProtocolRejection {
    fn from(e: ValueError) -> Self {
        Self {
            path: e.path,
            value: e.value,
            reason: e.reason,
        }
    }
}

impl fmt::Display for ProtocolRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The same bounded, escaped rendering as the parser's errors.
        let shown = ValueError {
            path: self.path.clone(),
            value: self.value.clone(),
            reason: self.reason.clone(),
        };
        write!(f, "{shown} (not programmed)")
    }
}

/// The kernel key of a policy token.
fn key_of(token: &ProtocolToken) -> Result<ProtoKey, Reason> {
    Ok(match token {
        ProtocolToken::Ssh => ProtoKey::any(Protocol::Ssh),
        ProtocolToken::Tls { alpn: None } => ProtoKey::any(Protocol::Tls),
        ProtocolToken::Tls { alpn: Some(alpn) } => Alpn::new(alpn)
            .and_then(|a| ProtoKey::with_alpn(Protocol::Tls, a))
            // The parser admits exactly what the kernel can key on (1 to
            // 16 printable bytes); kept total all the same.
            .map_err(|_| Reason::AlpnTooLong { len: alpn.len() })?,
        ProtocolToken::Dns => ProtoKey::any(Protocol::Dns),
        ProtocolToken::Http1 => ProtoKey::any(Protocol::Http1),
        ProtocolToken::Http2 => ProtoKey::any(Protocol::Http2),
        ProtocolToken::Quic => ProtoKey::any(Protocol::Quic),
    })
}

/// Compiles a `protocol` behavior's lists for `mode`: the program (none
/// when there is nothing to hold) and the values refused, in list order
/// (allow, then deny).
///
/// Monitor mode parses the values too (their rejections belong on the
/// status either way) but programs [`Program::Observe`].
pub fn compile_protocol(
    mode: Mode,
    lists: Option<&BehaviorLists>,
) -> (Option<Program<ProtoKey>>, Vec<ProtocolRejection>) {
    let Some(lists) = lists else {
        return (None, Vec::new());
    };
    let mut rejections = Vec::new();
    let mut rules = Rules::default();
    let allow_at = lists.field.field("allow");
    for value in &lists.allow {
        if value == STAR {
            rejections.push(ValueError::new(&allow_at, value, Reason::StarInAllow).into());
            continue;
        }
        match parse_protocol(value, &allow_at) {
            Ok(ProtocolTarget::Token(t)) => match key_of(&t) {
                Ok(k) => {
                    rules.allow.insert(k);
                }
                Err(reason) => rejections.push(ValueError::new(&allow_at, value, reason).into()),
            },
            Ok(ProtocolTarget::Any) => {
                rejections.push(ValueError::new(&allow_at, value, Reason::StarInAllow).into());
            }
            Err(e) => rejections.push(e.into()),
        }
    }
    let deny_at = lists.field.field("deny");
    for value in &lists.deny {
        if value == STAR {
            // The default deny; the explicit denies beside it are still
            // programmed, and win over every allow (kyverno_runtime_policy::rule).
            rules.default_deny = true;
            continue;
        }
        match parse_protocol(value, &deny_at) {
            Ok(ProtocolTarget::Token(t)) => match key_of(&t) {
                Ok(k) => {
                    rules.deny.insert(k);
                }
                Err(reason) => rejections.push(ValueError::new(&deny_at, value, reason).into()),
            },
            // Only "*" parses as Any, and it was handled above.
            Ok(ProtocolTarget::Any) => rules.default_deny = true,
            Err(e) => rejections.push(e.into()),
        }
    }
    let program = match mode {
        Mode::Monitor => Some(Program::observe()),
        Mode::Enforce if rules.allow.is_empty() && rules.deny.is_empty() && !rules.default_deny => {
            None
        }
        Mode::Enforce => Some(Program::Enforce(rules)),
    };
    (program, rejections)
}

// ---- observations ---------------------------------------------------------------------

/// Flows of one cgroup with one classification and one decision since the
/// previous drain, in the policy vocabulary.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProtocolObservation {
    /// The sending cgroup (v2 id).
    pub cgroup: CgroupId,
    /// What the flows were classified as: a policy token (`ssh`, `tls`,
    /// `dns`, `http/1.1`, `http/2`, `quic`) or `unclassified`.
    pub protocol: &'static str,
    /// For `tls`, the first ALPN name the ClientHello offered, if it
    /// offered one (bytes outside printable ASCII escaped as `\xNN`).
    pub alpn: Option<String>,
    /// The kernel's decision, merged over every policy selecting the pod.
    pub decision: Decision,
    /// How many flows.
    pub count: u64,
}

/// The policy token naming what the classifier recognised.
pub const fn protocol_token(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Unclassified => "unclassified",
        Protocol::Ssh => "ssh",
        Protocol::Tls => "tls",
        Protocol::Http2 => "http/2",
        Protocol::Http1 => "http/1.1",
        Protocol::Quic => "quic",
        Protocol::Dns => "dns",
    }
}

/// The seam's decision of a classifier decision.
pub const fn decision_of(d: bpf::Decision) -> Decision {
    match d {
        bpf::Decision::Pass => Decision::Unmatched,
        bpf::Decision::Allow => Decision::Allowed,
        bpf::Decision::Deny => Decision::Denied,
        bpf::Decision::DefaultDeny => Decision::DefaultDenied,
    }
}

impl ProtocolObservation {
    /// The observation of one kernel event.
    pub fn from_event(e: &bpf::ProtoEvent) -> Self {
        Self {
            cgroup: e.cgroup_id,
            protocol: protocol_token(e.key.protocol()),
            alpn: e.key.alpn().map(|a| a.to_string()),
            decision: decision_of(e.decision),
            count: e.count,
        }
    }

    /// Whether a policy value names these flows, as the kernel's keys do:
    /// `tls` any TLS flow, `tls/<alpn>` one whose first offered ALPN is
    /// exactly that name, `"*"` every flow; a value [`parse_protocol`]
    /// refuses (`unclassified` included) names nothing.
    pub fn matches_value(&self, value: &str) -> bool {
        let Ok(target) = parse_protocol(value, &kyverno_runtime_policy::values::FieldPath::spec())
        else {
            return false;
        };
        self.matches(&target)
    }

    /// Whether a parsed policy value names these flows (see
    /// [`Self::matches_value`]).
    pub fn matches(&self, target: &ProtocolTarget) -> bool {
        let token = match target {
            ProtocolTarget::Any => return true,
            ProtocolTarget::Token(t) => t,
        };
        match token {
            ProtocolToken::Tls { alpn: Some(want) } => {
                self.protocol == "tls" && self.alpn.as_deref() == Some(want.as_str())
            }
            other => self.protocol == other.to_string(),
        }
    }
}

/// What [`ProtocolManager::drain`] took from the kernel.
#[derive(Debug, Default)]
pub struct ProtocolDrain {
    /// The flows counted since the previous drain.
    pub observations: Vec<ProtocolObservation>,
    /// Decisions the kernel could not count since the previous drain (its
    /// event map was full): observations lost, to be counted as dropped.
    pub events_lost: u64,
    /// What failed: the drain (nothing observed) or the stats read after
    /// it (the observations are real; `events_lost` is then 0 and the
    /// loss is reported by the next drain that reads the stats).
    pub errors: Vec<ProtocolError>,
}

// ---- the kernel side ------------------------------------------------------------------

/// The kernel operations the manager needs, one map or link change each,
/// so the manager owns their order. [`KernelProtocol`] is the real one;
/// tests use one in memory.
pub trait ProtocolKernel: Send {
    /// Adds `key` to a list of set `set_id`.
    fn insert(&mut self, set_id: u32, verdict: Verdict, key: ProtoKey)
        -> Result<(), ProtocolError>;
    /// Removes it.
    fn remove(&mut self, set_id: u32, verdict: Verdict, key: ProtoKey)
        -> Result<(), ProtocolError>;
    /// Gates `cgroup` to set `set_id` with `flags` (replacing its previous
    /// gate): the program classifies its packets under that set.
    fn gate(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        flags: ProtoFlags,
    ) -> Result<(), ProtocolError>;
    /// Removes `cgroup` from the gate: its packets pass untouched.
    fn revoke(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError>;
    /// Attaches the program to `path`, which must be `cgroup`'s directory.
    /// Attaching an attached cgroup is a no-op.
    fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), ProtocolError>;
    /// Detaches the program from `cgroup`. Not attached: no-op.
    fn detach(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError>;
    /// Reads and resets the per-(cgroup, classification, decision) counts.
    fn drain_events(&mut self) -> Result<Vec<bpf::ProtoEvent>, ProtocolError>;
    /// The classifier's cumulative counters.
    fn read_stats(&self) -> Result<ProtoStats, ProtocolError>;
}

/// The real kernel: one loaded [`ProtocolClassifier`] and its links, one
/// per attached cgroup.
#[derive(Debug)]
pub struct KernelProtocol {
    classifier: ProtocolClassifier,
    links: BTreeMap<CgroupId, CgroupLink>,
}

impl KernelProtocol {
    /// Loads the classifier (root needed).
    pub fn load() -> Result<Self, ProtocolError> {
        Ok(Self {
            classifier: ProtocolClassifier::load()?,
            links: BTreeMap::new(),
        })
    }

    /// The loaded classifier.
    pub fn classifier(&self) -> &ProtocolClassifier {
        &self.classifier
    }

    /// The cgroups attached now.
    pub fn attached(&self) -> impl Iterator<Item = CgroupId> + '_ {
        self.links.keys().copied()
    }
}

impl ProtocolKernel for KernelProtocol {
    fn insert(
        &mut self,
        set_id: u32,
        verdict: Verdict,
        key: ProtoKey,
    ) -> Result<(), ProtocolError> {
        self.classifier.insert(set_id, verdict, key)
    }

    fn remove(
        &mut self,
        set_id: u32,
        verdict: Verdict,
        key: ProtoKey,
    ) -> Result<(), ProtocolError> {
        self.classifier.remove(set_id, verdict, key).map(|_| ())
    }

    fn gate(
        &mut self,
        cgroup: CgroupId,
        set_id: u32,
        flags: ProtoFlags,
    ) -> Result<(), ProtocolError> {
        self.classifier.set_filter(cgroup, set_id, flags)
    }

    fn revoke(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError> {
        self.classifier.remove_cgroup(cgroup).map(|_| ())
    }

    fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), ProtocolError> {
        if self.links.contains_key(&cgroup) {
            return Ok(());
        }
        let link = self.classifier.attach(path)?;
        if link.cgroup_id() != cgroup {
            // The path names another cgroup (recreated, or a stale path):
            // the link goes again, or the wrong cgroup would run the
            // program.
            let found = link.cgroup_id();
            drop(link);
            return Err(ProtocolError::Layout {
                map: "proto_cgroups",
                what: format!("path {} is cgroup {found}, not {cgroup}", path.display()),
            });
        }
        self.links.insert(cgroup, link);
        Ok(())
    }

    fn detach(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError> {
        // Dropping the link detaches it.
        self.links.remove(&cgroup);
        Ok(())
    }

    fn drain_events(&mut self) -> Result<Vec<bpf::ProtoEvent>, ProtocolError> {
        self.classifier.drain_events()
    }

    fn read_stats(&self) -> Result<ProtoStats, ProtocolError> {
        self.classifier.read_stats()
    }
}

// ---- the manager ----------------------------------------------------------------------

/// A RuntimePolicy as this manager needs it: evaluated, with its target
/// compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolPolicy {
    /// The policy's UID.
    pub id: PolicyId,
    /// Its name, for logs.
    pub name: String,
    /// Enforce or monitor.
    pub mode: Mode,
    /// The pods it applies to.
    pub target: PodTarget,
    /// Its `protocol` behavior, if it has one.
    pub protocol: Option<BehaviorLists>,
}

/// A kernel call that failed for a pod; retried on the next event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolFailure {
    /// The pod's UID.
    pub pod: String,
    /// What was being done.
    pub op: String,
    /// The classifier's error.
    pub error: ProtocolError,
}

impl fmt::Display for ProtocolFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "protocol: pod {}: {}: {}", self.pod, self.op, self.error)
    }
}

/// What [`ProtocolManager::upsert_policy`] did.
#[derive(Clone, Debug, Default)]
pub struct ProtocolOutcome {
    /// Values not programmed, in list order.
    pub rejections: Vec<ProtocolRejection>,
    /// Kernel calls that failed (for any pod the change touched).
    pub failures: Vec<ProtocolFailure>,
}

/// How many selecting policies hold each flag of a pod's set up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlagCounts {
    /// Selecting enforce policies denying `["*"]`.
    pub default_deny: usize,
    /// Selecting monitor policies.
    pub observe: usize,
}

/// What the kernel holds for one pod, as far as the manager knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgrammedSet {
    /// The pod's set id.
    pub set_id: u32,
    /// Its allow keys.
    pub allow: BTreeSet<ProtoKey>,
    /// Its deny keys.
    pub deny: BTreeSet<ProtoKey>,
    /// Its container cgroups: the flags each is gated with (`None`: not
    /// gated) and whether the program is attached to it.
    pub cgroups: BTreeMap<CgroupId, (Option<ProtoFlags>, bool)>,
}

#[derive(Clone, Debug)]
struct DesiredPolicy {
    policy: ProtocolPolicy,
    program: Option<Program<ProtoKey>>,
    rejections: Vec<ProtocolRejection>,
}

/// One pod's wanted set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Wanted {
    allow: BTreeSet<ProtoKey>,
    deny: BTreeSet<ProtoKey>,
    flags: ProtoFlags,
}

#[derive(Clone, Debug, Default)]
struct CgroupMirror {
    path: PathBuf,
    gated: Option<ProtoFlags>,
    attached: bool,
}

#[derive(Clone, Debug)]
struct PodMirror {
    set_id: u32,
    allow: BTreeSet<ProtoKey>,
    deny: BTreeSet<ProtoKey>,
    cgroups: BTreeMap<CgroupId, CgroupMirror>,
}

/// The protocol manager over a kernel `K` (see the [module docs](self)).
pub struct ProtocolManager<K = KernelProtocol> {
    kernel: K,
    policies: BTreeMap<PolicyId, DesiredPolicy>,
    pods: BTreeMap<String, NetworkPod>,
    sets: BTreeMap<String, PodMirror>,
    failures: BTreeMap<String, Vec<ProtocolFailure>>,
    free_set_ids: Vec<u32>,
    next_set_id: u32,
    rejected_total: u64,
    events_lost_seen: Option<u64>,
    events_lost_total: u64,
}

impl<K> fmt::Debug for ProtocolManager<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtocolManager")
            .field("policies", &self.policies.len())
            .field("pods", &self.pods.len())
            .field("sets", &self.sets.len())
            .finish_non_exhaustive()
    }
}

impl ProtocolManager<KernelProtocol> {
    /// Loads the classifier and manages it (root needed).
    pub fn load() -> Result<Self, ProtocolError> {
        KernelProtocol::load().map(Self::new)
    }
}

impl<K: ProtocolKernel> ProtocolManager<K> {
    /// A manager over `kernel`, which holds nothing yet.
    pub fn new(kernel: K) -> Self {
        Self {
            kernel,
            policies: BTreeMap::new(),
            pods: BTreeMap::new(),
            sets: BTreeMap::new(),
            failures: BTreeMap::new(),
            free_set_ids: Vec::new(),
            next_set_id: 1,
            rejected_total: 0,
            events_lost_seen: None,
            events_lost_total: 0,
        }
    }

    /// Adds or replaces a policy: parses its values (each unusable one a
    /// [`ProtocolRejection`], counted) and converges every pod.
    pub fn upsert_policy(&mut self, policy: ProtocolPolicy) -> ProtocolOutcome {
        let (program, rejections) = compile_protocol(policy.mode, policy.protocol.as_ref());
        for r in &rejections {
            tracing::warn!(policy = %policy.id, name = %policy.name, rejection = %r, "protocol value not programmed");
        }
        self.rejected_total = self
            .rejected_total
            .saturating_add(u64::try_from(rejections.len()).unwrap_or(u64::MAX));
        self.policies.insert(
            policy.id.clone(),
            DesiredPolicy {
                policy,
                program,
                rejections: rejections.clone(),
            },
        );
        ProtocolOutcome {
            rejections,
            failures: self.sync_all(),
        }
    }

    /// Removes a policy and converges every pod it selected.
    pub fn delete_policy(&mut self, id: &PolicyId) -> Vec<ProtocolFailure> {
        if self.policies.remove(id).is_none() {
            return Vec::new();
        }
        self.sync_all()
    }

    /// Adds or replaces a pod and converges it.
    pub fn upsert_pod(&mut self, pod: NetworkPod) -> Vec<ProtocolFailure> {
        let uid = pod.uid.clone();
        self.pods.insert(uid.clone(), pod);
        self.sync_pod(&uid)
    }

    /// Forgets a pod: its cgroups are revoked and detached, its set
    /// cleared.
    pub fn delete_pod(&mut self, uid: &str) -> Vec<ProtocolFailure> {
        self.pods.remove(uid);
        self.sync_pod(uid)
    }

    /// Retries every pod whose convergence failed before (a periodic
    /// resync; events retry on their own).
    pub fn retry(&mut self) -> Vec<ProtocolFailure> {
        self.sync_all()
    }

    /// Takes the flows counted since the previous drain, and the number of
    /// decisions the kernel could not count since then.
    pub fn drain(&mut self) -> ProtocolDrain {
        let mut out = ProtocolDrain::default();
        match self.kernel.drain_events() {
            Ok(events) => {
                out.observations = events.iter().map(ProtocolObservation::from_event).collect();
                out.observations.sort();
            }
            Err(e) => out.errors.push(e),
        }
        match self.kernel.read_stats() {
            Ok(stats) => {
                // Cumulative since load: the first read is the baseline
                // unless this manager has counted nothing yet (then every
                // loss since load is this manager's).
                let seen = self.events_lost_seen.unwrap_or(0);
                out.events_lost = stats.events_lost.saturating_sub(seen);
                self.events_lost_seen = Some(stats.events_lost);
                self.events_lost_total = self.events_lost_total.saturating_add(out.events_lost);
                if out.events_lost > 0 {
                    tracing::warn!(
                        lost = out.events_lost,
                        "protocol: the kernel could not count some flow decisions (event map full)"
                    );
                }
            }
            Err(e) => out.errors.push(e),
        }
        out
    }

    /// The classifier's counters, summed over CPUs, since load (metrics).
    pub fn stats(&self) -> Result<ProtoStats, ProtocolError> {
        self.kernel.read_stats()
    }

    /// Every flow decision the kernel reported it could not count, since
    /// start.
    pub fn events_lost_total(&self) -> u64 {
        self.events_lost_total
    }

    /// The values of a policy that were not programmed, for its status.
    pub fn rejections(&self, id: &PolicyId) -> &[ProtocolRejection] {
        self.policies
            .get(id)
            .map(|d| d.rejections.as_slice())
            .unwrap_or_default()
    }

    /// Every value refused since start (for a metric).
    pub fn rejected_total(&self) -> u64 {
        self.rejected_total
    }

    /// The standing failures of the pods a policy selects, for its status.
    pub fn failures(&self, id: &PolicyId) -> Vec<ProtocolFailure> {
        let Some(d) = self.policies.get(id) else {
            return Vec::new();
        };
        self.pods
            .values()
            .filter(|p| d.policy.target.matches(&p.namespace_labels, &p.labels))
            .filter_map(|p| self.failures.get(&p.uid))
            .flatten()
            .cloned()
            .collect()
    }

    /// The standing failures of one pod.
    pub fn pod_failures(&self, uid: &str) -> &[ProtocolFailure] {
        self.failures
            .get(uid)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// What the kernel holds for a pod, as far as the manager knows.
    pub fn programmed(&self, uid: &str) -> Option<ProgrammedSet> {
        let m = self.sets.get(uid)?;
        Some(ProgrammedSet {
            set_id: m.set_id,
            allow: m.allow.clone(),
            deny: m.deny.clone(),
            cgroups: m
                .cgroups
                .iter()
                .map(|(c, s)| (*c, (s.gated, s.attached)))
                .collect(),
        })
    }

    /// How many selecting policies hold each flag of a pod's set up.
    pub fn flag_counts(&self, uid: &str) -> FlagCounts {
        let mut counts = FlagCounts::default();
        for program in self.selecting(uid) {
            match program {
                Program::Observe(_) => counts.observe += 1,
                Program::Enforce(r) if r.default_deny => counts.default_deny += 1,
                Program::Enforce(_) => {}
            }
        }
        counts
    }

    /// The pod owning a cgroup, for attributing an observation.
    pub fn pod_of_cgroup(&self, cgroup: CgroupId) -> Option<&NetworkPod> {
        self.pods
            .values()
            .find(|p| p.cgroups.iter().any(|c| c.id == cgroup))
    }

    /// The kernel side.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The kernel side, mutably (tests; changing it behind the manager's
    /// back makes the mirror wrong).
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    // ---- convergence ------------------------------------------------------------------

    /// The programs of the policies selecting pod `uid`.
    fn selecting(&self, uid: &str) -> Vec<&Program<ProtoKey>> {
        let Some(pod) = self.pods.get(uid) else {
            return Vec::new();
        };
        self.policies
            .values()
            .filter(|d| d.policy.target.matches(&pod.namespace_labels, &pod.labels))
            .filter_map(|d| d.program.as_ref())
            .collect()
    }

    /// The union the selecting policies ask of pod `uid`; `None` when none
    /// selects it.
    fn wanted(&self, uid: &str) -> Option<Wanted> {
        let programs = self.selecting(uid);
        if programs.is_empty() {
            return None;
        }
        let mut w = Wanted::default();
        for p in programs {
            match p {
                Program::Observe(_) => w.flags.observe = true,
                Program::Enforce(r) => {
                    w.allow.extend(r.allow.iter().copied());
                    w.deny.extend(r.deny.iter().copied());
                    w.flags.default_deny |= r.default_deny;
                }
            }
        }
        Some(w)
    }

    fn sync_all(&mut self) -> Vec<ProtocolFailure> {
        let mut uids: BTreeSet<String> = self.pods.keys().cloned().collect();
        uids.extend(self.sets.keys().cloned());
        let mut out = Vec::new();
        for uid in uids {
            out.extend(self.sync_pod(&uid));
        }
        out
    }

    /// Converges one pod, recording (and returning) its failure.
    fn sync_pod(&mut self, uid: &str) -> Vec<ProtocolFailure> {
        let result = match self.wanted(uid) {
            None => self.release(uid),
            Some(w) => {
                let cgroups: BTreeMap<CgroupId, PathBuf> = self
                    .pods
                    .get(uid)
                    .map(|p| p.cgroups.iter().map(|c| (c.id, c.path.clone())).collect())
                    .unwrap_or_default();
                self.apply(uid, &w, &cgroups)
            }
        };
        match result {
            Ok(()) => {
                self.failures.remove(uid);
                Vec::new()
            }
            Err((op, error)) => {
                tracing::warn!(pod = uid, %op, %error, "protocol: kernel call failed; retried on the next event");
                let f = ProtocolFailure {
                    pod: uid.to_owned(),
                    op,
                    error,
                };
                self.failures.insert(uid.to_owned(), vec![f.clone()]);
                vec![f]
            }
        }
    }

    fn apply(
        &mut self,
        uid: &str,
        w: &Wanted,
        cgroups: &BTreeMap<CgroupId, PathBuf>,
    ) -> Result<(), (String, ProtocolError)> {
        let mut m = match self.sets.remove(uid) {
            Some(m) => m,
            None => {
                let set_id = self.free_set_ids.pop().unwrap_or_else(|| {
                    let id = self.next_set_id;
                    self.next_set_id = self.next_set_id.wrapping_add(1).max(1);
                    id
                });
                PodMirror {
                    set_id,
                    allow: BTreeSet::new(),
                    deny: BTreeSet::new(),
                    cgroups: BTreeMap::new(),
                }
            }
        };
        let result = apply_set(&mut self.kernel, &mut m, w, cgroups);
        self.sets.insert(uid.to_owned(), m);
        result
    }

    /// No policy selects pod `uid` (or it is gone): revoke and detach each
    /// cgroup, then clear the set and free its id.
    fn release(&mut self, uid: &str) -> Result<(), (String, ProtocolError)> {
        let Some(mut m) = self.sets.remove(uid) else {
            return Ok(());
        };
        let result = release_set(&mut self.kernel, &mut m);
        if result.is_ok() {
            self.free_set_ids.push(m.set_id);
        } else {
            // Keep the mirror of what is left, for the retry.
            self.sets.insert(uid.to_owned(), m);
        }
        result
    }
}

type Step = Result<(), (String, ProtocolError)>;

fn at(op: impl Into<String>) -> impl FnOnce(ProtocolError) -> (String, ProtocolError) {
    let op = op.into();
    move |e| (op, e)
}

/// Revokes then detaches one cgroup.
fn unhook<K: ProtocolKernel>(k: &mut K, cgroup: CgroupId, c: &mut CgroupMirror) -> Step {
    if c.gated.is_some() {
        k.revoke(cgroup)
            .map_err(at(format!("revoking cgroup {cgroup}")))?;
        c.gated = None;
    }
    if c.attached {
        k.detach(cgroup)
            .map_err(at(format!("detaching from {}", c.path.display())))?;
        c.attached = false;
    }
    Ok(())
}

/// Brings a pod's set to `w` and its cgroups to `cgroups`, tightening first
/// (see the module docs). The mirror follows every call that succeeded.
fn apply_set<K: ProtocolKernel>(
    k: &mut K,
    m: &mut PodMirror,
    w: &Wanted,
    cgroups: &BTreeMap<CgroupId, PathBuf>,
) -> Step {
    let set = m.set_id;
    // 0. Containers gone from the pod.
    let gone: Vec<CgroupId> = m
        .cgroups
        .keys()
        .filter(|c| !cgroups.contains_key(c))
        .copied()
        .collect();
    for c in gone {
        if let Some(mut state) = m.cgroups.remove(&c) {
            let r = unhook(k, c, &mut state);
            if r.is_err() {
                m.cgroups.insert(c, state);
                return r;
            }
        }
    }
    // 1. Deny keys in.
    for key in w.deny.difference(&m.deny.clone()) {
        k.insert(set, Verdict::Deny, *key)
            .map_err(at(format!("denying {key} in set {set}")))?;
        m.deny.insert(*key);
    }
    // 2. Allow keys out.
    for key in m.allow.clone().difference(&w.allow) {
        k.remove(set, Verdict::Allow, *key)
            .map_err(at(format!("removing allow {key} from set {set}")))?;
        m.allow.remove(key);
    }
    // 3. Default deny raised on the gated cgroups (observe as it will be).
    if w.flags.default_deny {
        for (cgroup, c) in &mut m.cgroups {
            let Some(flags) = c.gated else { continue };
            if flags.default_deny {
                continue;
            }
            let raised = ProtoFlags {
                default_deny: true,
                observe: flags.observe || w.flags.observe,
            };
            k.gate(*cgroup, set, raised)
                .map_err(at(format!("raising the default deny of cgroup {cgroup}")))?;
            c.gated = Some(raised);
        }
    }
    // 4. Allow keys in.
    for key in w.allow.difference(&m.allow.clone()) {
        k.insert(set, Verdict::Allow, *key)
            .map_err(at(format!("allowing {key} in set {set}")))?;
        m.allow.insert(*key);
    }
    // 5. Flags as wanted (lowering), and new containers: gate, then attach.
    for (cgroup, path) in cgroups {
        let c = m.cgroups.entry(*cgroup).or_insert_with(|| CgroupMirror {
            path: path.clone(),
            gated: None,
            attached: false,
        });
        if c.gated != Some(w.flags) {
            k.gate(*cgroup, set, w.flags)
                .map_err(at(format!("gating cgroup {cgroup} to set {set}")))?;
            c.gated = Some(w.flags);
        }
        if !c.attached {
            if let Err(e) = k.attach(*cgroup, path) {
                // Not attached after all: a gate entry no link reads is
                // harmless, but it would read as programmed; take it back
                // (best effort, the attach error is the one reported).
                if k.revoke(*cgroup).is_ok() {
                    c.gated = None;
                }
                return Err((format!("attaching to {}", path.display()), e));
            }
            c.attached = true;
        }
    }
    // 6. Deny keys out.
    for key in m.deny.clone().difference(&w.deny) {
        k.remove(set, Verdict::Deny, *key)
            .map_err(at(format!("removing deny {key} from set {set}")))?;
        m.deny.remove(key);
    }
    Ok(())
}

/// Unhooks every cgroup of a set, then clears its keys (no program reads
/// the set any more, so their order is free).
fn release_set<K: ProtocolKernel>(k: &mut K, m: &mut PodMirror) -> Step {
    let cgroups: Vec<CgroupId> = m.cgroups.keys().copied().collect();
    for c in cgroups {
        if let Some(mut state) = m.cgroups.remove(&c) {
            let r = unhook(k, c, &mut state);
            if r.is_err() {
                m.cgroups.insert(c, state);
                return r;
            }
        }
    }
    let set = m.set_id;
    for key in m.allow.clone() {
        k.remove(set, Verdict::Allow, key)
            .map_err(at(format!("clearing allow {key} of set {set}")))?;
        m.allow.remove(&key);
    }
    for key in m.deny.clone() {
        k.remove(set, Verdict::Deny, key)
            .map_err(at(format!("clearing deny {key} of set {set}")))?;
        m.deny.remove(&key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::ContainerCgroup;
    use kyverno_runtime_policy::values::FieldPath;
    use rstest::rstest;

    // ---- an in-memory kernel with the classifier's verdict ----------------------

    #[derive(Debug, Default)]
    struct MemKernel {
        allow: BTreeSet<(u32, ProtoKey)>,
        deny: BTreeSet<(u32, ProtoKey)>,
        gates: BTreeMap<CgroupId, (u32, ProtoFlags)>,
        attached: BTreeMap<CgroupId, PathBuf>,
        log: Vec<String>,
        fail_attach: bool,
        counts: BTreeMap<(CgroupId, ProtoKey, bpf::Decision), u64>,
        events_lost: u64,
    }

    impl MemKernel {
        /// The program's decision for a flow of `cgroup` classified `key`
        /// (`None`: the program does not run or the cgroup is ungated).
        fn flow(&mut self, cgroup: CgroupId, key: ProtoKey) -> Option<bpf::Decision> {
            self.attached.get(&cgroup)?;
            let (set, flags) = *self.gates.get(&cgroup)?;
            // A rule names the protocol with any ALPN, or one ALPN.
            let hit = |l: &BTreeSet<(u32, ProtoKey)>| {
                l.contains(&(set, key)) || l.contains(&(set, ProtoKey::any(key.protocol())))
            };
            let d = if hit(&self.deny) {
                bpf::Decision::Deny
            } else if hit(&self.allow) {
                bpf::Decision::Allow
            } else if flags.default_deny {
                bpf::Decision::DefaultDeny
            } else {
                bpf::Decision::Pass
            };
            if flags.observe {
                *self.counts.entry((cgroup, key, d)).or_default() += 1;
            }
            Some(d)
        }
    }

    fn flags_text(f: ProtoFlags) -> String {
        format!("dd={} obs={}", f.default_deny, f.observe)
    }

    impl ProtocolKernel for MemKernel {
        fn insert(
            &mut self,
            set_id: u32,
            verdict: Verdict,
            key: ProtoKey,
        ) -> Result<(), ProtocolError> {
            self.log.push(format!("insert {verdict:?} {key}"));
            match verdict {
                Verdict::Allow => self.allow.insert((set_id, key)),
                Verdict::Deny => self.deny.insert((set_id, key)),
            };
            Ok(())
        }

        fn remove(
            &mut self,
            set_id: u32,
            verdict: Verdict,
            key: ProtoKey,
        ) -> Result<(), ProtocolError> {
            self.log.push(format!("remove {verdict:?} {key}"));
            match verdict {
                Verdict::Allow => self.allow.remove(&(set_id, key)),
                Verdict::Deny => self.deny.remove(&(set_id, key)),
            };
            Ok(())
        }

        fn gate(
            &mut self,
            cgroup: CgroupId,
            set_id: u32,
            flags: ProtoFlags,
        ) -> Result<(), ProtocolError> {
            self.log
                .push(format!("gate {cgroup} {}", flags_text(flags)));
            self.gates.insert(cgroup, (set_id, flags));
            Ok(())
        }

        fn revoke(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError> {
            self.log.push(format!("revoke {cgroup}"));
            self.gates.remove(&cgroup);
            Ok(())
        }

        fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), ProtocolError> {
            if self.fail_attach {
                return Err(ProtocolError::InvalidCgroupId);
            }
            self.log.push(format!("attach {cgroup}"));
            self.attached.insert(cgroup, path.to_owned());
            Ok(())
        }

        fn detach(&mut self, cgroup: CgroupId) -> Result<(), ProtocolError> {
            self.log.push(format!("detach {cgroup}"));
            self.attached.remove(&cgroup);
            Ok(())
        }

        fn drain_events(&mut self) -> Result<Vec<bpf::ProtoEvent>, ProtocolError> {
            Ok(std::mem::take(&mut self.counts)
                .into_iter()
                .map(|((cgroup_id, key, decision), count)| bpf::ProtoEvent {
                    cgroup_id,
                    key,
                    decision,
                    count,
                })
                .collect())
        }

        fn read_stats(&self) -> Result<ProtoStats, ProtocolError> {
            Ok(ProtoStats {
                events_lost: self.events_lost,
                ..ProtoStats::default()
            })
        }
    }

    // ---- fixtures -----------------------------------------------------------------

    fn pid(s: &str) -> PolicyId {
        PolicyId::new(s).unwrap()
    }

    fn k(s: &str) -> ProtoKey {
        s.parse().unwrap()
    }

    fn lists(allow: &[&str], deny: &[&str]) -> BehaviorLists {
        BehaviorLists {
            field: FieldPath::spec()
                .field("behaviors")
                .index(0)
                .field("protocol"),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn app(value: &str) -> PodTarget {
        PodTarget::compile(
            Some(
                &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("app".to_string(), value.to_string())].into()),
                    match_expressions: None,
                },
            ),
            None,
            &FieldPath::spec(),
        )
        .unwrap()
    }

    fn policy(id: &str, mode: Mode, allow: &[&str], deny: &[&str]) -> ProtocolPolicy {
        ProtocolPolicy {
            id: pid(id),
            name: id.into(),
            mode,
            target: PodTarget::everything(),
            protocol: Some(lists(allow, deny)),
        }
    }

    fn pod(uid: &str, app: &str, cgroups: &[CgroupId]) -> NetworkPod {
        NetworkPod {
            uid: uid.into(),
            namespace: "default".into(),
            name: uid.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            namespace_labels: BTreeMap::new(),
            cgroups: cgroups
                .iter()
                .map(|c| ContainerCgroup {
                    id: *c,
                    path: PathBuf::from(format!("/sys/fs/cgroup/c{c}")),
                })
                .collect(),
        }
    }

    fn manager() -> ProtocolManager<MemKernel> {
        ProtocolManager::new(MemKernel::default())
    }

    use bpf::Decision as D;

    // ---- union --------------------------------------------------------------------

    #[test]
    fn the_policies_selecting_a_pod_union_into_its_set() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1, 2]));
        m.upsert_pod(pod("p2", "db", &[3]));
        let mut a = policy("a", Mode::Enforce, &["tls"], &["*"]);
        a.target = app("web");
        assert!(m.upsert_policy(a).failures.is_empty());
        let b = policy("b", Mode::Enforce, &["http/1.1"], &["ssh"]);
        assert!(m.upsert_policy(b).failures.is_empty());
        let kern = m.kernel_mut();
        for c in [1, 2] {
            assert_eq!(kern.flow(c, k("ssh")), Some(D::Deny));
            assert_eq!(kern.flow(c, k("tls/h2")), Some(D::Allow));
            assert_eq!(kern.flow(c, k("http1")), Some(D::Allow));
            assert_eq!(kern.flow(c, k("quic")), Some(D::DefaultDeny));
            assert_eq!(kern.flow(c, k("unclassified")), Some(D::DefaultDeny));
        }
        // p2 is selected by b only: its own set, no default deny.
        assert_eq!(kern.flow(3, k("ssh")), Some(D::Deny));
        assert_eq!(kern.flow(3, k("quic")), Some(D::Pass));
        let (s1, s2) = (m.programmed("p1").unwrap(), m.programmed("p2").unwrap());
        assert_ne!(s1.set_id, s2.set_id);
        assert_eq!(s1.allow, [k("tls"), k("http1")].into());
        assert_eq!(s2.allow, [k("http1")].into());
        assert_eq!(s1.cgroups.len(), 2);
    }

    #[test]
    fn an_explicit_deny_anywhere_beats_every_allow() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("a", Mode::Enforce, &["ssh", "tls/h2"], &["*"]));
        m.upsert_policy(policy("b", Mode::Enforce, &[], &["ssh", "tls/h2"]));
        let kern = m.kernel_mut();
        assert_eq!(kern.flow(1, k("ssh")), Some(D::Deny));
        assert_eq!(kern.flow(1, k("tls/h2")), Some(D::Deny));
        assert_eq!(kern.flow(1, k("tls/http/1.1")), Some(D::DefaultDeny));
        // The deny of b gone, a's allow stands.
        m.delete_policy(&pid("b"));
        assert_eq!(m.kernel_mut().flow(1, k("ssh")), Some(D::Allow));
    }

    #[test]
    fn flags_are_counted_across_policies() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("dd1", Mode::Enforce, &[], &["*"]));
        m.upsert_policy(policy("dd2", Mode::Enforce, &["tls"], &["*"]));
        m.upsert_policy(policy("obs1", Mode::Monitor, &[], &["ssh"]));
        m.upsert_policy(policy("obs2", Mode::Monitor, &["tls"], &[]));
        assert_eq!(
            m.flag_counts("p1"),
            FlagCounts {
                default_deny: 2,
                observe: 2
            }
        );
        let gate = |m: &ProtocolManager<MemKernel>| m.kernel().gates.get(&1).map(|g| g.1);
        m.delete_policy(&pid("dd1"));
        assert_eq!(
            gate(&m),
            Some(ProtoFlags {
                default_deny: true,
                observe: true
            })
        );
        m.delete_policy(&pid("obs1"));
        m.delete_policy(&pid("dd2"));
        assert_eq!(
            gate(&m),
            Some(ProtoFlags {
                default_deny: false,
                observe: true
            })
        );
        // A monitor policy programs no key: its deny does not drop.
        assert!(m.programmed("p1").unwrap().deny.is_empty());
        assert_eq!(m.kernel_mut().flow(1, k("ssh")), Some(D::Pass));
        m.delete_policy(&pid("obs2"));
        assert_eq!(gate(&m), None);
        assert!(m.kernel().attached.is_empty());
        assert!(m.programmed("p1").is_none());
    }

    // ---- ordering -----------------------------------------------------------------

    #[test]
    fn keys_then_gate_then_attach_and_revoke_then_detach_then_clear() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("a", Mode::Enforce, &["tls"], &["ssh"]));
        m.delete_pod("p1");
        assert_eq!(
            m.kernel().log,
            [
                "insert Deny ssh",
                "insert Allow tls",
                "gate 1 dd=false obs=false",
                "attach 1",
                "revoke 1",
                "detach 1",
                "remove Allow tls",
                "remove Deny ssh",
            ]
        );
        assert!(m.kernel().allow.is_empty() && m.kernel().deny.is_empty());
        assert!(m.kernel().gates.is_empty());
    }

    #[test]
    fn an_update_tightens_before_it_loosens() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("a", Mode::Enforce, &["tls"], &["ssh"]));
        m.upsert_policy(policy("obs", Mode::Monitor, &[], &[]));
        m.kernel_mut().log.clear();
        m.upsert_policy(policy("a", Mode::Enforce, &["quic"], &["*"]));
        assert_eq!(
            m.kernel().log,
            [
                "remove Allow tls",
                "gate 1 dd=true obs=true",
                "insert Allow quic",
                "remove Deny ssh",
            ]
        );
        m.kernel_mut().log.clear();
        // Lowering the default deny and the observe flag happens after the
        // new allow and deny keys are in.
        m.delete_policy(&pid("obs"));
        m.upsert_policy(policy("a", Mode::Enforce, &["quic", "dns"], &["ssh"]));
        assert_eq!(
            m.kernel().log,
            [
                "gate 1 dd=true obs=false",
                "insert Deny ssh",
                "insert Allow dns",
                "gate 1 dd=false obs=false",
            ]
        );
    }

    #[test]
    fn crossing_into_monitor_takes_every_key_out() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("a", Mode::Enforce, &["tls"], &["ssh"]));
        m.upsert_policy(policy("a", Mode::Monitor, &["tls"], &["ssh"]));
        let s = m.programmed("p1").unwrap();
        assert!(s.allow.is_empty() && s.deny.is_empty());
        assert_eq!(
            s.cgroups[&1],
            (
                Some(ProtoFlags {
                    default_deny: false,
                    observe: true
                }),
                true
            )
        );
        assert_eq!(m.kernel_mut().flow(1, k("ssh")), Some(D::Pass));
    }

    // ---- pods ---------------------------------------------------------------------

    #[test]
    fn a_pod_is_attached_while_some_policy_selects_it() {
        let mut m = manager();
        let mut a = policy("a", Mode::Enforce, &[], &["ssh"]);
        a.target = app("web");
        m.upsert_policy(a);
        m.upsert_pod(pod("p1", "db", &[1]));
        assert!(m.kernel().attached.is_empty(), "not selected");
        m.upsert_pod(pod("p1", "web", &[1]));
        assert!(m.kernel().attached.contains_key(&1));
        // A container restarted: the old cgroup goes, the new one comes.
        m.upsert_pod(pod("p1", "web", &[2]));
        assert_eq!(m.kernel().attached.keys().copied().collect::<Vec<_>>(), [2]);
        assert!(!m.kernel().gates.contains_key(&1));
        assert_eq!(m.kernel_mut().flow(2, k("ssh")), Some(D::Deny));
        // Relabeled out of the selector: released.
        m.upsert_pod(pod("p1", "db", &[2]));
        assert!(m.kernel().attached.is_empty() && m.kernel().deny.is_empty());
        assert_eq!(m.pod_of_cgroup(2).map(|p| p.uid.as_str()), Some("p1"));
    }

    #[test]
    fn an_enforce_policy_with_nothing_to_enforce_selects_nothing() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        let out = m.upsert_policy(policy("a", Mode::Enforce, &["ftp"], &[]));
        assert_eq!(out.rejections.len(), 1);
        assert!(m.kernel().attached.is_empty());
        // Without a protocol behavior at all, neither.
        let mut none = policy("b", Mode::Monitor, &[], &[]);
        none.protocol = None;
        m.upsert_policy(none);
        assert!(m.kernel().attached.is_empty());
    }

    #[test]
    fn set_ids_are_recycled() {
        let mut m = manager();
        m.upsert_policy(policy("a", Mode::Enforce, &[], &["ssh"]));
        m.upsert_pod(pod("p1", "web", &[1]));
        let first = m.programmed("p1").unwrap().set_id;
        m.delete_pod("p1");
        m.upsert_pod(pod("p2", "web", &[2]));
        assert_eq!(m.programmed("p2").unwrap().set_id, first);
    }

    #[test]
    fn a_failed_attach_is_undone_reported_and_retried() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.kernel_mut().fail_attach = true;
        let out = m.upsert_policy(policy("a", Mode::Enforce, &[], &["ssh"]));
        assert_eq!(out.failures.len(), 1, "{:?}", out.failures);
        assert_eq!(out.failures[0].pod, "p1");
        assert!(out.failures[0].to_string().contains("attaching to"));
        assert_eq!(m.failures(&pid("a")).len(), 1);
        assert!(
            !m.kernel().gates.contains_key(&1),
            "the gate was taken back"
        );
        m.kernel_mut().fail_attach = false;
        assert!(m.retry().is_empty());
        assert!(m.failures(&pid("a")).is_empty());
        assert_eq!(m.kernel_mut().flow(1, k("ssh")), Some(D::Deny));
    }

    // ---- values -------------------------------------------------------------------

    #[rstest]
    #[case::unclassified(&["unclassified"][..], &[][..], "allow", Reason::Unclassified)]
    #[case::unknown(&[][..], &["ftp"][..], "deny", Reason::UnknownProtocol)]
    #[case::uppercase(&[][..], &["SSH"][..], "deny", Reason::UnknownProtocol)]
    #[case::empty_alpn(&["tls/"][..], &[][..], "allow", Reason::EmptyAlpn)]
    #[case::long_alpn(&["tls/aaaaaaaaaaaaaaaaa"][..], &[][..], "allow", Reason::AlpnTooLong { len: 17 })]
    #[case::star_in_allow(&["*"][..], &[][..], "allow", Reason::StarInAllow)]
    fn refused_values_are_typed_rejections(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] side: &str,
        #[case] reason: Reason,
    ) {
        let (_, rejections) = compile_protocol(Mode::Enforce, Some(&lists(allow, deny)));
        assert_eq!(rejections.len(), 1, "{rejections:?}");
        assert_eq!(
            rejections[0].path,
            format!("spec.behaviors[0].protocol.{side}")
        );
        assert_eq!(rejections[0].reason, reason);
    }

    #[test]
    fn tokens_compile_to_kernel_keys() {
        let (program, rejections) = compile_protocol(
            Mode::Enforce,
            Some(&lists(
                &["tls/h2", "http/2", "quic", "dns"],
                &["ssh", "http/1.1", "tls"],
            )),
        );
        assert!(rejections.is_empty());
        assert_eq!(
            program,
            Some(Program::Enforce(Rules {
                allow: [k("tls/h2"), k("http2"), k("quic"), k("dns")].into(),
                deny: [k("ssh"), k("http1"), k("tls")].into(),
                default_deny: false,
            }))
        );
        let (program, _) = compile_protocol(Mode::Monitor, Some(&lists(&[], &["ssh"])));
        assert_eq!(program, Some(Program::observe()));
        let (program, _) = compile_protocol(Mode::Enforce, Some(&lists(&[], &["*"])));
        assert_eq!(
            program,
            Some(Program::Enforce(Rules {
                default_deny: true,
                ..Rules::default()
            }))
        );
    }

    #[test]
    fn an_explicit_deny_beside_the_star_is_programmed() {
        let (program, rejections) =
            compile_protocol(Mode::Enforce, Some(&lists(&["tls"], &["*", "ssh", "*"])));
        assert!(rejections.is_empty(), "{rejections:?}");
        assert_eq!(
            program,
            Some(Program::Enforce(Rules {
                allow: [k("tls")].into(),
                deny: [k("ssh")].into(),
                default_deny: true,
            }))
        );
    }

    #[test]
    fn rejections_are_kept_and_counted() {
        let mut m = manager();
        let out = m.upsert_policy(policy("a", Mode::Enforce, &["unclassified"], &["ftp"]));
        assert_eq!(out.rejections.len(), 2);
        assert_eq!(m.rejections(&pid("a")), out.rejections.as_slice());
        assert_eq!(m.rejected_total(), 2);
        assert_eq!(
            out.rejections[1].to_string(),
            format!(
                "spec.behaviors[0].protocol.deny: \"ftp\" {} (not programmed)",
                Reason::UnknownProtocol
            )
        );
    }

    // ---- observations -------------------------------------------------------------

    #[test]
    fn the_drain_reports_flows_in_policy_vocabulary_and_losses() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("enf", Mode::Enforce, &[], &["ssh"]));
        // Enforce only: nothing is counted per flow.
        m.kernel_mut().flow(1, k("ssh"));
        assert!(m.drain().observations.is_empty());
        m.upsert_policy(policy("obs", Mode::Monitor, &[], &[]));
        let kern = m.kernel_mut();
        kern.flow(1, k("ssh"));
        kern.flow(1, k("tls/h2"));
        kern.flow(1, k("tls/h2"));
        kern.flow(1, k("http1"));
        kern.flow(1, k("unclassified"));
        kern.events_lost = 3;
        let d = m.drain();
        assert!(d.errors.is_empty());
        let obs = |protocol, alpn: Option<&str>, decision, count| ProtocolObservation {
            cgroup: 1,
            protocol,
            alpn: alpn.map(str::to_owned),
            decision,
            count,
        };
        let mut want = vec![
            obs("ssh", None, Decision::Denied, 1),
            obs("tls", Some("h2"), Decision::Unmatched, 2),
            obs("http/1.1", None, Decision::Unmatched, 1),
            obs("unclassified", None, Decision::Unmatched, 1),
        ];
        want.sort();
        assert_eq!(d.observations, want);
        assert_eq!(d.events_lost, 3);
        // Reset: the next drain is a delta.
        m.kernel_mut().events_lost = 5;
        let d = m.drain();
        assert!(d.observations.is_empty());
        assert_eq!(d.events_lost, 2);
        assert_eq!(m.events_lost_total(), 5);
    }

    #[rstest]
    #[case::tls_any("tls", "tls", Some("h2"), true)]
    #[case::tls_no_alpn("tls", "tls", None, true)]
    #[case::tls_alpn("tls/h2", "tls", Some("h2"), true)]
    #[case::tls_other_alpn("tls/h2", "tls", Some("http/1.1"), false)]
    #[case::tls_alpn_none("tls/h2", "tls", None, false)]
    #[case::ssh("ssh", "ssh", None, true)]
    #[case::ssh_not_tls("ssh", "tls", None, false)]
    #[case::http1("http/1.1", "http/1.1", None, true)]
    #[case::http2("http/2", "http/2", None, true)]
    #[case::star("*", "unclassified", None, true)]
    #[case::unclassified_is_no_value("unclassified", "unclassified", None, false)]
    fn observations_match_policy_values(
        #[case] value: &str,
        #[case] protocol: &'static str,
        #[case] alpn: Option<&str>,
        #[case] want: bool,
    ) {
        let o = ProtocolObservation {
            cgroup: 1,
            protocol,
            alpn: alpn.map(str::to_owned),
            decision: Decision::Unmatched,
            count: 1,
        };
        assert_eq!(o.matches_value(value), want, "{value} ~ {o:?}");
    }

    #[test]
    fn every_kernel_protocol_has_a_token() {
        for p in Protocol::ALL {
            let t = protocol_token(p);
            if p == Protocol::Unclassified {
                assert!(parse_protocol(t, &FieldPath::spec()).is_err());
            } else {
                let parsed = parse_protocol(t, &FieldPath::spec()).unwrap();
                let ProtocolTarget::Token(tok) = parsed else {
                    panic!("{t}")
                };
                assert_eq!(key_of(&tok).unwrap(), ProtoKey::any(p));
            }
        }
    }
}
