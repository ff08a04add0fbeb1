//! The dns behavior: which pods the DNS question observer sees
//! ([`DnsGateManager`], over `kyverno-runtime-bpf`'s
//! [`DnsObserver`] through [`KernelDns`], or any other [`DnsKernel`]), and
//! how an observed question is judged against one policy's lists
//! ([`judge_name`], [`NameMatcher`]).
//!
//! # Gating
//!
//! dns is observation only (the compiler refuses `mode: enforce` for it):
//! nothing here can refuse a question. A pod is observed exactly while at
//! least one policy in a mode that reports dns ([`Mode::Monitor`]) with an
//! *active* dns behavior selects it. Active means a list says something
//! the matcher can use: a behavior with nothing on either side (or only
//! refused values) is inert, reports nothing, and never selects a pod.
//!
//! That is a privacy boundary as well as an efficiency one: an unselected
//! pod's questions never enter the ring buffer. Observing a pod means, for
//! each of its container cgroups, attaching the one node-wide observer
//! program to the cgroup's directory *then* admitting the cgroup id to the
//! program's gate (a cgroup whose attach failed never sits in the gate
//! reading as observed while producing nothing); unobserving it revokes
//! the id *then* detaches (an id left admitted after its link is gone is
//! harmless, a link left after revocation runs the program for nothing).
//! A revoke that fails still detaches, so the questions stop either way,
//! and the revoke is retried. Pods are kept while unobserved: a policy
//! that starts selecting an existing pod needs its cgroups.
//!
//! # The name matcher
//!
//! For network and path behaviors the allow list only matters under a
//! default deny; for dns the allow list is the *expected* set, so a name
//! matching none of its entries is reported on its own:
//!
//! | lists | name | verdict |
//! | --- | --- | --- |
//! | deny has `"*"` | any | [`NameVerdict::Discovered`] (allow is ignored, not exempted) |
//! | a deny pattern matches | | [`NameVerdict::Denied`] |
//! | allow empty, or has `"*"`, or an allow pattern matches | | [`NameVerdict::Expected`] |
//! | otherwise | | [`NameVerdict::Unexpected`] |
//!
//! A pattern is an exact name or a left wildcard `*.example.com`, which
//! matches subdomains only (neither the apex nor `evilexample.com`);
//! comparison ignores ASCII case and one trailing dot ([`DnsPattern`]).
//! A reported verdict is advisory (a `warn` finding, never "would have
//! been denied", and never enforced).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use kyverno_runtime_bpf::dns::{DnsError, DnsLink, DnsObserver, DnsReader, DnsStats};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{parse_dns, DnsPattern, Reason, ValueError};

use crate::egress::NetworkPod;
use crate::openexec::{BehaviorLists, Mode};
use crate::seam::{CgroupId, PolicyId};

// ---- values and the matcher -----------------------------------------------------------

/// A dns value that is not used: where it was, what it was and why. The
/// rest of the list is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsRejection {
    /// The field path, such as `spec.behaviors[0].dns.allow`.
    pub path: String,
    /// The value as written.
    pub value: String,
    /// Why it was refused.
    pub reason: Reason,
}

impl From<ValueError> for DnsRejection {
    fn from(e: ValueError) -> Self {
        Self {
            path: e.path,
            value: e.value,
            reason: e.reason,
        }
    }
}

impl fmt::Display for DnsRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = ValueError {
            path: self.path.clone(),
            value: self.value.clone(),
            reason: self.reason.clone(),
        };
        write!(f, "{shown} (not matched)")
    }
}

/// One policy's verdict on one observed question name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameVerdict {
    /// Not reported: an allow pattern matched, or the policy declares no
    /// expected set (empty allow, or `"*"` in allow), and no deny pattern
    /// matched.
    Expected,
    /// Reported: `deny: ["*"]`, the discovery form, reports every name.
    Discovered,
    /// Reported: a deny pattern matched (whatever allow says).
    Denied,
    /// Reported: the policy declares an expected set and the name matched
    /// none of it.
    Unexpected,
}

impl NameVerdict {
    /// Whether the name is reported (an advisory finding).
    pub const fn reported(self) -> bool {
        !matches!(self, Self::Expected)
    }

    /// The name used in logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Expected => "expected",
            Self::Discovered => "discovered",
            Self::Denied => "denied",
            Self::Unexpected => "unexpected",
        }
    }
}

/// One dns behavior's lists, parsed for matching (see the [module
/// docs](self)). Refused values are left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameMatcher {
    deny_star: bool,
    deny: Vec<DnsPattern>,
    allow_star: bool,
    allow: Vec<DnsPattern>,
}

impl NameMatcher {
    /// Parses a behavior's lists: the matcher (`None` when it is inert:
    /// nothing usable on either side) and the values refused, in list
    /// order (allow, then deny).
    pub fn compile(lists: &BehaviorLists) -> (Option<Self>, Vec<DnsRejection>) {
        let mut rejections = Vec::new();
        let mut side = |values: &[String], name: &str| {
            let at = lists.field.field(name);
            let mut star = false;
            let mut patterns = Vec::new();
            for value in values {
                match parse_dns(value, &at) {
                    Ok(DnsPattern::Any) => star = true,
                    Ok(p) => {
                        if !patterns.contains(&p) {
                            patterns.push(p);
                        }
                    }
                    Err(e) => rejections.push(DnsRejection::from(e)),
                }
            }
            (star, patterns)
        };
        let (allow_star, allow) = side(&lists.allow, "allow");
        let (deny_star, deny) = side(&lists.deny, "deny");
        let m = Self {
            deny_star,
            deny,
            allow_star,
            allow,
        };
        let inert = !m.deny_star && m.deny.is_empty() && !m.allow_star && m.allow.is_empty();
        ((!inert).then_some(m), rejections)
    }

    /// The verdict on `qname` (see the [module docs](self)).
    pub fn judge(&self, qname: &str) -> NameVerdict {
        if self.deny_star {
            return NameVerdict::Discovered;
        }
        if self.deny.iter().any(|p| p.matches(qname)) {
            return NameVerdict::Denied;
        }
        if self.allow_star || self.allow.is_empty() || self.allow.iter().any(|p| p.matches(qname)) {
            return NameVerdict::Expected;
        }
        NameVerdict::Unexpected
    }
}

/// One policy's verdict on an observed question name `qname`, from its dns
/// lists (see the [module docs](self)). An inert behavior, or a value the
/// parser refuses, reports nothing.
pub fn judge_name(lists: &BehaviorLists, qname: &str) -> NameVerdict {
    match NameMatcher::compile(lists).0 {
        Some(m) => m.judge(qname),
        None => NameVerdict::Expected,
    }
}

/// Whether a policy in `mode` reports dns observations: the detection
/// engine's own mode switch, so a mode without an engine branch does not
/// start observation.
const fn reports(mode: Mode) -> bool {
    match mode {
        Mode::Monitor => true,
        // Refused by the compiler for dns; never observed.
        Mode::Enforce => false,
    }
}

// ---- the kernel side ------------------------------------------------------------------

/// The kernel operations the manager needs, one step each, so the manager
/// owns their order. [`KernelDns`] is the real one; tests use one in
/// memory.
pub trait DnsKernel: Send {
    /// Attaches the observer to `path`, which must be `cgroup`'s
    /// directory. Attached already: no-op.
    fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), DnsError>;
    /// Admits `cgroup` to the gate: its questions are recorded.
    fn admit(&mut self, cgroup: CgroupId) -> Result<(), DnsError>;
    /// Revokes `cgroup` from the gate.
    fn revoke(&mut self, cgroup: CgroupId) -> Result<(), DnsError>;
    /// Detaches the observer from `cgroup`. Not attached: no-op.
    fn detach(&mut self, cgroup: CgroupId) -> Result<(), DnsError>;
    /// A reader of the question ring buffer.
    fn reader(&self) -> Result<DnsReader, DnsError>;
    /// The kernel's loss counters, cumulative since load.
    fn stats(&self) -> Result<DnsStats, DnsError>;
}

/// The real kernel: the one loaded [`DnsObserver`] and its links, one per
/// attached cgroup.
#[derive(Debug)]
pub struct KernelDns {
    observer: DnsObserver,
    links: BTreeMap<CgroupId, DnsLink>,
}

impl KernelDns {
    /// Loads the observer (root needed).
    pub fn load() -> Result<Self, DnsError> {
        Ok(Self {
            observer: DnsObserver::load()?,
            links: BTreeMap::new(),
        })
    }

    /// The loaded observer.
    pub fn observer(&self) -> &DnsObserver {
        &self.observer
    }

    /// The cgroups attached now.
    pub fn attached(&self) -> impl Iterator<Item = CgroupId> + '_ {
        self.links.keys().copied()
    }
}

impl DnsKernel for KernelDns {
    fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), DnsError> {
        if self.links.contains_key(&cgroup) {
            return Ok(());
        }
        let link = self.observer.attach(path)?;
        if link.cgroup_id() != cgroup {
            // The path names another cgroup (recreated, or stale): the
            // link goes again (dropped on return, which detaches it), or
            // the wrong cgroup would be observed.
            let found = link.cgroup_id();
            return Err(DnsError::Cgroup {
                path: path.to_owned(),
                errno: None,
                message: format!("the directory is cgroup {found}, not {cgroup}"),
            });
        }
        self.links.insert(cgroup, link);
        Ok(())
    }

    fn admit(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
        self.observer.admit(cgroup)
    }

    fn revoke(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
        self.observer.revoke(cgroup).map(|_| ())
    }

    fn detach(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
        // Dropping the link detaches it.
        self.links.remove(&cgroup);
        Ok(())
    }

    fn reader(&self) -> Result<DnsReader, DnsError> {
        self.observer.reader()
    }

    fn stats(&self) -> Result<DnsStats, DnsError> {
        self.observer.read_stats()
    }
}

// ---- the manager ----------------------------------------------------------------------

/// A RuntimePolicy as this manager needs it: evaluated, with its target
/// compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsPolicy {
    /// The policy's UID.
    pub id: PolicyId,
    /// Its name, for logs.
    pub name: String,
    /// Its mode: only [`Mode::Monitor`] observes (the compiler refuses a
    /// dns behavior in enforce mode; one that arrives anyway is inert).
    pub mode: Mode,
    /// The pods it applies to.
    pub target: PodTarget,
    /// Its `dns` behavior, if it has one.
    pub dns: Option<BehaviorLists>,
}

/// A kernel call that failed for one cgroup of a pod; retried on the next
/// event (or [`DnsGateManager::retry`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsFailure {
    /// The pod's UID.
    pub pod: String,
    /// The container cgroup.
    pub cgroup: CgroupId,
    /// What was being done.
    pub op: &'static str,
    /// The observer's error.
    pub error: DnsError,
}

impl fmt::Display for DnsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dns: pod {}: {} cgroup {}: {}",
            self.pod, self.op, self.cgroup, self.error
        )
    }
}

/// What [`DnsGateManager::upsert_policy`] did.
#[derive(Clone, Debug, Default)]
pub struct DnsOutcome {
    /// Values not used, in list order.
    pub rejections: Vec<DnsRejection>,
    /// Kernel calls that failed (for any pod the change touched).
    pub failures: Vec<DnsFailure>,
}

/// One selecting policy's verdict on a question (see
/// [`DnsGateManager::verdicts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyVerdict {
    /// The policy.
    pub policy: PolicyId,
    /// Its name.
    pub name: String,
    /// Its verdict.
    pub verdict: NameVerdict,
}

#[derive(Clone, Debug)]
struct DesiredPolicy {
    policy: DnsPolicy,
    matcher: Option<NameMatcher>,
    rejections: Vec<DnsRejection>,
}

impl DesiredPolicy {
    fn observes(&self) -> bool {
        reports(self.policy.mode) && self.matcher.is_some()
    }
}

#[derive(Clone, Debug)]
struct Hook {
    pod: String,
    path: PathBuf,
    attached: bool,
    admitted: bool,
}

/// Which pods the DNS question observer sees, over a kernel `K` (see the
/// [module docs](self)).
pub struct DnsGateManager<K = KernelDns> {
    kernel: K,
    policies: BTreeMap<PolicyId, DesiredPolicy>,
    pods: BTreeMap<String, NetworkPod>,
    hooks: BTreeMap<CgroupId, Hook>,
    failures: BTreeMap<String, Vec<DnsFailure>>,
    rejected_total: u64,
    last_stats: DnsStats,
}

impl<K> fmt::Debug for DnsGateManager<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsGateManager")
            .field("policies", &self.policies.len())
            .field("pods", &self.pods.len())
            .field("hooks", &self.hooks.len())
            .finish_non_exhaustive()
    }
}

impl DnsGateManager<KernelDns> {
    /// Loads the observer and manages it (root needed). A kernel that
    /// refuses the program fails here, and leaves every other behavior
    /// working.
    pub fn load() -> Result<Self, DnsError> {
        KernelDns::load().map(Self::new)
    }
}

impl<K: DnsKernel> DnsGateManager<K> {
    /// A manager over `kernel`, which observes nothing yet.
    pub fn new(kernel: K) -> Self {
        Self {
            kernel,
            policies: BTreeMap::new(),
            pods: BTreeMap::new(),
            hooks: BTreeMap::new(),
            failures: BTreeMap::new(),
            rejected_total: 0,
            last_stats: DnsStats::default(),
        }
    }

    /// Adds or replaces a policy: parses its values (each refused one a
    /// [`DnsRejection`], counted) and converges the gate.
    pub fn upsert_policy(&mut self, policy: DnsPolicy) -> DnsOutcome {
        let (matcher, rejections) = match &policy.dns {
            Some(lists) => NameMatcher::compile(lists),
            None => (None, Vec::new()),
        };
        for r in &rejections {
            tracing::warn!(policy = %policy.id, name = %policy.name, rejection = %r, "dns value not used");
        }
        self.rejected_total = self
            .rejected_total
            .saturating_add(u64::try_from(rejections.len()).unwrap_or(u64::MAX));
        self.policies.insert(
            policy.id.clone(),
            DesiredPolicy {
                policy,
                matcher,
                rejections: rejections.clone(),
            },
        );
        DnsOutcome {
            rejections,
            failures: self.sync(),
        }
    }

    /// Removes a policy; the pods only it selected are revoked and
    /// detached.
    pub fn delete_policy(&mut self, id: &PolicyId) -> Vec<DnsFailure> {
        if self.policies.remove(id).is_none() {
            return Vec::new();
        }
        self.sync()
    }

    /// Adds or replaces a pod (kept while unobserved) and converges it.
    pub fn upsert_pod(&mut self, pod: NetworkPod) -> Vec<DnsFailure> {
        self.pods.insert(pod.uid.clone(), pod);
        self.sync()
    }

    /// [`upsert_pod`](Self::upsert_pod) of each of `upserts` and
    /// [`delete_pod`](Self::delete_pod) of each of `deletes` with one sync
    /// for all of them.
    pub fn apply_pods(&mut self, upserts: Vec<NetworkPod>, deletes: &[String]) -> Vec<DnsFailure> {
        for pod in upserts {
            self.pods.insert(pod.uid.clone(), pod);
        }
        for uid in deletes {
            self.pods.remove(uid);
        }
        self.sync()
    }

    /// Forgets a pod: its cgroups are revoked and detached.
    pub fn delete_pod(&mut self, uid: &str) -> Vec<DnsFailure> {
        self.pods.remove(uid);
        self.sync()
    }

    /// Retries whatever failed before (a periodic resync; events retry on
    /// their own).
    pub fn retry(&mut self) -> Vec<DnsFailure> {
        self.sync()
    }

    /// A reader of the question ring buffer, for the daemon's one blocking
    /// reader thread ([`DnsReader::poll_questions`]). Each reader consumes
    /// what it reads.
    pub fn reader(&self) -> Result<DnsReader, DnsError> {
        self.kernel.reader()
    }

    /// The kernel's loss counters, cumulative since load.
    pub fn stats(&self) -> Result<DnsStats, DnsError> {
        self.kernel.stats()
    }

    /// The kernel's losses since the previous call (the first call: since
    /// load), for a dropped-events counter.
    pub fn stats_delta(&mut self) -> Result<DnsStats, DnsError> {
        let now = self.kernel.stats()?;
        let delta = DnsStats {
            ringbuf_full: now
                .ringbuf_full
                .saturating_sub(self.last_stats.ringbuf_full),
            name_unreadable: now
                .name_unreadable
                .saturating_sub(self.last_stats.name_unreadable),
        };
        self.last_stats = now;
        Ok(delta)
    }

    /// The verdict of every policy that observes the pod owning `cgroup`
    /// on a question for `qname` (reported or not: see
    /// [`NameVerdict::reported`]), in policy id order. Empty for a cgroup
    /// of no known pod.
    pub fn verdicts(&self, cgroup: CgroupId, qname: &str) -> Vec<PolicyVerdict> {
        let Some(pod) = self.pod_of_cgroup(cgroup) else {
            return Vec::new();
        };
        self.policies
            .values()
            .filter(|d| d.observes())
            .filter(|d| d.policy.target.matches(&pod.namespace_labels, &pod.labels))
            .filter_map(|d| {
                d.matcher.as_ref().map(|m| PolicyVerdict {
                    policy: d.policy.id.clone(),
                    name: d.policy.name.clone(),
                    verdict: m.judge(qname),
                })
            })
            .collect()
    }

    /// The values of a policy that were refused, for its status.
    pub fn rejections(&self, id: &PolicyId) -> &[DnsRejection] {
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
    pub fn failures(&self, id: &PolicyId) -> Vec<DnsFailure> {
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

    /// The standing failures of one pod (or of a pod since deleted whose
    /// cgroups are still being released).
    pub fn pod_failures(&self, uid: &str) -> &[DnsFailure] {
        self.failures
            .get(uid)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Whether `cgroup` is observed now: attached and admitted.
    pub fn is_observed(&self, cgroup: CgroupId) -> bool {
        self.hooks
            .get(&cgroup)
            .is_some_and(|h| h.attached && h.admitted)
    }

    /// The cgroups observed now.
    pub fn observed(&self) -> BTreeSet<CgroupId> {
        self.hooks
            .iter()
            .filter(|(_, h)| h.attached && h.admitted)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The pod owning a cgroup, for attributing a question.
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

    /// The cgroups to observe, with their pod and directory.
    fn wanted(&self) -> BTreeMap<CgroupId, (String, PathBuf)> {
        let observing: Vec<&DesiredPolicy> =
            self.policies.values().filter(|d| d.observes()).collect();
        let mut out = BTreeMap::new();
        for pod in self.pods.values() {
            if observing
                .iter()
                .any(|d| d.policy.target.matches(&pod.namespace_labels, &pod.labels))
            {
                for c in &pod.cgroups {
                    out.insert(c.id, (pod.uid.clone(), c.path.clone()));
                }
            }
        }
        out
    }

    /// Converges every cgroup: unhooks what is no longer wanted, then
    /// hooks what is. Records the failures per pod.
    fn sync(&mut self) -> Vec<DnsFailure> {
        let wanted = self.wanted();
        let mut out = Vec::new();
        // A cgroup wanted under another directory (recreated) is unhooked
        // first, then hooked afresh.
        let stale: Vec<CgroupId> = self
            .hooks
            .iter()
            .filter(|(c, h)| wanted.get(c).is_none_or(|(_, path)| *path != h.path))
            .map(|(c, _)| *c)
            .collect();
        for c in stale {
            if let Err(f) = self.unhook(c) {
                out.push(f);
            }
        }
        for (c, (pod, path)) in &wanted {
            if let Err(f) = self.hook(*c, pod, path) {
                out.push(f);
            }
        }
        // Standing failures: exactly this pass's.
        self.failures.clear();
        for f in &out {
            tracing::warn!(failure = %f, "dns: kernel call failed; retried on the next event");
            self.failures
                .entry(f.pod.clone())
                .or_default()
                .push(f.clone());
        }
        out
    }

    /// Attaches, then admits.
    fn hook(&mut self, cgroup: CgroupId, pod: &str, path: &Path) -> Result<(), DnsFailure> {
        let h = self.hooks.entry(cgroup).or_insert_with(|| Hook {
            pod: pod.to_owned(),
            path: path.to_owned(),
            attached: false,
            admitted: false,
        });
        h.pod = pod.to_owned();
        let fail = |op, error| DnsFailure {
            pod: pod.to_owned(),
            cgroup,
            op,
            error,
        };
        if !h.attached {
            self.kernel
                .attach(cgroup, path)
                .map_err(|e| fail("attaching to", e))?;
            h.attached = true;
        }
        if !h.admitted {
            if let Err(e) = self.kernel.admit(cgroup) {
                // As `attach_admitted` does: no link stays without
                // admission (it would run the program for nothing).
                if self.kernel.detach(cgroup).is_ok() {
                    h.attached = false;
                }
                return Err(fail("admitting", e));
            }
            h.admitted = true;
        }
        Ok(())
    }

    /// Revokes, then detaches (even when the revoke failed, so the
    /// questions stop; the revoke is retried).
    fn unhook(&mut self, cgroup: CgroupId) -> Result<(), DnsFailure> {
        let Some(mut h) = self.hooks.remove(&cgroup) else {
            return Ok(());
        };
        let mut first = None;
        if h.admitted {
            match self.kernel.revoke(cgroup) {
                Ok(()) => h.admitted = false,
                Err(e) => first = Some(("revoking", e)),
            }
        }
        if h.attached {
            match self.kernel.detach(cgroup) {
                Ok(()) => h.attached = false,
                Err(e) => {
                    first.get_or_insert(("detaching from", e));
                }
            }
        }
        match first {
            None => Ok(()),
            Some((op, error)) => {
                let f = DnsFailure {
                    pod: h.pod.clone(),
                    cgroup,
                    op,
                    error,
                };
                self.hooks.insert(cgroup, h);
                Err(f)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::ContainerCgroup;
    use kyverno_runtime_policy::values::FieldPath;
    use rstest::rstest;

    fn lists(allow: &[&str], deny: &[&str]) -> BehaviorLists {
        BehaviorLists {
            field: FieldPath::spec().field("behaviors").index(0).field("dns"),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    use NameVerdict::{Denied, Discovered, Expected, Unexpected};

    // ---- the matcher --------------------------------------------------------------

    #[rstest]
    // deny ["*"]: every name, and allow is ignored rather than exempted.
    #[case::discovery(&[], &["*"], "www.example.com", Discovered)]
    #[case::discovery_ignores_allow(&["www.example.com"], &["*"], "www.example.com", Discovered)]
    #[case::discovery_root(&[], &["*"], ".", Discovered)]
    // A deny pattern reports, and beats an allow match.
    #[case::deny_exact(&[], &["evil.example"], "evil.example", Denied)]
    #[case::deny_exact_case(&[], &["evil.example"], "EVIL.Example", Denied)]
    #[case::deny_exact_trailing_dot(&[], &["evil.example"], "evil.example.", Denied)]
    #[case::deny_wildcard(&[], &["*.example.com"], "a.b.example.com", Denied)]
    #[case::deny_wildcard_not_apex(&[], &["*.example.com"], "example.com", Expected)]
    #[case::deny_wildcard_not_lookalike(&[], &["*.example.com"], "evilexample.com", Expected)]
    #[case::deny_beats_allow(&["www.example.com"], &["*.example.com"], "www.example.com", Denied)]
    #[case::deny_other_name(&[], &["evil.example"], "good.example", Expected)]
    // The allow list is the expected set.
    #[case::allow_exact(&["api.example.com"], &[], "api.example.com", Expected)]
    #[case::allow_miss(&["api.example.com"], &[], "other.example.com", Unexpected)]
    #[case::allow_wildcard(&["*.openai.azure.com"], &[], "foo.openai.azure.com", Expected)]
    #[case::allow_wildcard_not_apex(&["*.openai.azure.com"], &[], "openai.azure.com", Unexpected)]
    #[case::allow_wildcard_not_lookalike(&["*.openai.azure.com"], &[], "evilopenai.azure.com", Unexpected)]
    #[case::allow_case_and_dot(&["API.example.com."], &[], "api.EXAMPLE.com.", Expected)]
    #[case::allow_with_deny_miss(&["api.example.com"], &["evil.example"], "x.example", Unexpected)]
    #[case::allow_star(&["*"], &["evil.example"], "x.example", Expected)]
    #[case::allow_star_deny_hit(&["*"], &["evil.example"], "evil.example", Denied)]
    // Nothing on either side is inert, not all-reporting.
    #[case::inert(&[], &[], "anything.example", Expected)]
    // A refused value is not used: it neither matches nor makes a set.
    #[case::refused_allow_only(&["10.0.0.1"], &[], "x.example", Expected)]
    #[case::refused_beside_valid(&["10.0.0.1", "ok.example"], &[], "x.example", Unexpected)]
    fn names_are_judged_as_the_spec_says(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] qname: &str,
        #[case] want: NameVerdict,
    ) {
        assert_eq!(
            judge_name(&lists(allow, deny), qname),
            want,
            "allow {allow:?} deny {deny:?} ~ {qname}"
        );
        assert_eq!(want.reported(), want != Expected);
    }

    #[rstest]
    #[case::address(&["10.0.0.1"][..], &[][..], "allow", Reason::DnsAddress)]
    #[case::v6(&[][..], &["::1"][..], "deny", Reason::DnsAddress)]
    #[case::wildcard_middle(&["foo.*.example.com"][..], &[][..], "allow", Reason::WildcardPlacement)]
    #[case::empty(&[][..], &[""][..], "deny", Reason::Empty)]
    #[case::empty_label(&["a..example"][..], &[][..], "allow", Reason::EmptyLabel)]
    fn refused_values_are_typed_rejections(
        #[case] allow: &[&str],
        #[case] deny: &[&str],
        #[case] side: &str,
        #[case] reason: Reason,
    ) {
        let (matcher, rejections) = NameMatcher::compile(&lists(allow, deny));
        assert!(matcher.is_none(), "only refused values: inert");
        assert_eq!(rejections.len(), 1, "{rejections:?}");
        assert_eq!(rejections[0].path, format!("spec.behaviors[0].dns.{side}"));
        assert_eq!(rejections[0].reason, reason);
        assert!(rejections[0].to_string().ends_with("(not matched)"));
    }

    // ---- an in-memory kernel --------------------------------------------------------

    #[derive(Debug, Default)]
    struct MemKernel {
        attached: BTreeMap<CgroupId, PathBuf>,
        admitted: BTreeSet<CgroupId>,
        log: Vec<String>,
        fail_attach: bool,
        fail_admit: bool,
        fail_revoke: bool,
        stats: DnsStats,
    }

    impl MemKernel {
        /// Whether a question of `cgroup` would be recorded.
        fn records(&self, cgroup: CgroupId) -> bool {
            self.attached.contains_key(&cgroup) && self.admitted.contains(&cgroup)
        }
    }

    fn fault() -> DnsError {
        DnsError::Map {
            map: "krt_dns_cgids",
            op: "update",
            errno: Some(7),
            message: "E2BIG".into(),
        }
    }

    impl DnsKernel for MemKernel {
        fn attach(&mut self, cgroup: CgroupId, path: &Path) -> Result<(), DnsError> {
            if self.fail_attach {
                return Err(DnsError::Attach {
                    path: path.to_owned(),
                    errno: Some(1),
                    message: "EPERM".into(),
                });
            }
            self.log.push(format!("attach {cgroup}"));
            self.attached.insert(cgroup, path.to_owned());
            Ok(())
        }

        fn admit(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
            if self.fail_admit {
                return Err(fault());
            }
            assert!(
                self.attached.contains_key(&cgroup),
                "admitted before attached"
            );
            self.log.push(format!("admit {cgroup}"));
            self.admitted.insert(cgroup);
            Ok(())
        }

        fn revoke(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
            if self.fail_revoke {
                return Err(fault());
            }
            self.log.push(format!("revoke {cgroup}"));
            self.admitted.remove(&cgroup);
            Ok(())
        }

        fn detach(&mut self, cgroup: CgroupId) -> Result<(), DnsError> {
            self.log.push(format!("detach {cgroup}"));
            self.attached.remove(&cgroup);
            Ok(())
        }

        fn reader(&self) -> Result<DnsReader, DnsError> {
            Err(DnsError::NotBuilt)
        }

        fn stats(&self) -> Result<DnsStats, DnsError> {
            Ok(self.stats)
        }
    }

    fn pid(s: &str) -> PolicyId {
        PolicyId::new(s).unwrap()
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

    fn policy(id: &str, allow: &[&str], deny: &[&str]) -> DnsPolicy {
        DnsPolicy {
            id: pid(id),
            name: id.into(),
            mode: Mode::Monitor,
            target: PodTarget::everything(),
            dns: Some(lists(allow, deny)),
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

    fn manager() -> DnsGateManager<MemKernel> {
        DnsGateManager::new(MemKernel::default())
    }

    // ---- gating ---------------------------------------------------------------------

    #[test]
    fn attach_then_admit_and_revoke_then_detach() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1, 2]));
        assert!(m.kernel().log.is_empty(), "no policy: nothing observed");
        assert!(m
            .upsert_policy(policy("a", &["*.example.com"], &[]))
            .failures
            .is_empty());
        assert_eq!(m.observed(), [1, 2].into());
        m.delete_policy(&pid("a"));
        assert_eq!(
            m.kernel().log,
            [
                "attach 1", "admit 1", "attach 2", "admit 2", "revoke 1", "detach 1", "revoke 2",
                "detach 2",
            ]
        );
        assert!(m.observed().is_empty());
        assert!(!m.kernel().records(1) && m.kernel().attached.is_empty());
    }

    #[test]
    fn observed_while_at_least_one_policy_selects() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_pod(pod("p2", "db", &[2]));
        let mut a = policy("a", &[], &["evil.example"]);
        a.target = app("web");
        m.upsert_policy(a);
        m.upsert_policy(policy("b", &["ok.example"], &[]));
        assert_eq!(m.observed(), [1, 2].into());
        // b gone: p1 still selected by a, p2 by nothing.
        m.delete_policy(&pid("b"));
        assert_eq!(m.observed(), [1].into());
        assert!(m.kernel().records(1) && !m.kernel().records(2));
        // Relabeling moves the selection; the pod is kept while unobserved.
        m.upsert_pod(pod("p2", "web", &[2]));
        assert_eq!(m.observed(), [1, 2].into());
        m.upsert_pod(pod("p1", "db", &[1]));
        assert_eq!(m.observed(), [2].into());
        assert_eq!(m.pod_of_cgroup(1).map(|p| p.uid.as_str()), Some("p1"));
        m.delete_pod("p2");
        assert!(m.observed().is_empty());
        assert!(m.kernel().attached.is_empty());
    }

    #[test]
    fn inert_and_enforce_behaviors_observe_nothing() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("empty", &[], &[]));
        let out = m.upsert_policy(policy("refused", &["10.0.0.1"], &[]));
        assert_eq!(out.rejections.len(), 1);
        assert_eq!(m.rejected_total(), 1);
        assert_eq!(m.rejections(&pid("refused")), out.rejections.as_slice());
        let mut none = policy("none", &[], &[]);
        none.dns = None;
        m.upsert_policy(none);
        let mut enforce = policy("enforce", &[], &["*"]);
        enforce.mode = Mode::Enforce;
        m.upsert_policy(enforce);
        assert!(m.observed().is_empty());
        assert!(m.kernel().log.is_empty());
        // A policy gaining an active behavior starts observation of the
        // pod that was already known.
        m.upsert_policy(policy("empty", &[], &["*"]));
        assert_eq!(m.observed(), [1].into());
    }

    #[test]
    fn a_container_restart_moves_the_hook() {
        let mut m = manager();
        m.upsert_policy(policy("a", &[], &["*"]));
        m.upsert_pod(pod("p1", "web", &[1]));
        m.kernel_mut().log.clear();
        m.upsert_pod(pod("p1", "web", &[3]));
        assert_eq!(
            m.kernel().log,
            ["revoke 1", "detach 1", "attach 3", "admit 3"]
        );
        assert_eq!(m.observed(), [3].into());
    }

    #[test]
    fn a_failed_attach_never_admits_and_is_retried() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.kernel_mut().fail_attach = true;
        let out = m.upsert_policy(policy("a", &[], &["*"]));
        assert_eq!(out.failures.len(), 1);
        assert_eq!(out.failures[0].op, "attaching to");
        assert_eq!(m.failures(&pid("a")).len(), 1);
        assert!(m.kernel().admitted.is_empty());
        assert!(!m.is_observed(1));
        m.kernel_mut().fail_attach = false;
        assert!(m.retry().is_empty());
        assert!(m.is_observed(1) && m.failures(&pid("a")).is_empty());
    }

    #[test]
    fn a_failed_admit_takes_the_link_back() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.kernel_mut().fail_admit = true;
        let out = m.upsert_policy(policy("a", &[], &["*"]));
        assert_eq!(out.failures.len(), 1);
        assert!(out.failures[0].to_string().contains("admitting cgroup 1"));
        assert_eq!(m.kernel().log, ["attach 1", "detach 1"]);
        m.kernel_mut().fail_admit = false;
        assert!(m.retry().is_empty());
        assert!(m.kernel().records(1));
    }

    #[test]
    fn a_failed_revoke_still_detaches_and_is_retried() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_policy(policy("a", &[], &["*"]));
        m.kernel_mut().fail_revoke = true;
        let failures = m.delete_policy(&pid("a"));
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].op, "revoking");
        assert!(
            !m.kernel().attached.contains_key(&1),
            "the questions stop anyway"
        );
        assert_eq!(m.pod_failures("p1").len(), 1);
        m.kernel_mut().fail_revoke = false;
        assert!(m.retry().is_empty());
        assert!(m.kernel().admitted.is_empty());
        assert!(m.pod_failures("p1").is_empty());
    }

    #[test]
    fn verdicts_come_from_every_observing_policy_of_the_pod() {
        let mut m = manager();
        m.upsert_pod(pod("p1", "web", &[1]));
        m.upsert_pod(pod("p2", "db", &[2]));
        m.upsert_policy(policy("expect", &["api.example.com"], &[]));
        let mut discover = policy("discover", &[], &["*"]);
        discover.target = app("db");
        m.upsert_policy(discover);
        let got = |m: &DnsGateManager<MemKernel>, c, q| -> Vec<(String, NameVerdict)> {
            m.verdicts(c, q)
                .into_iter()
                .map(|v| (v.policy.to_string(), v.verdict))
                .collect()
        };
        assert_eq!(
            got(&m, 1, "api.example.com"),
            [("expect".to_string(), Expected)]
        );
        assert_eq!(
            got(&m, 2, "api.example.com"),
            [
                ("discover".to_string(), Discovered),
                ("expect".to_string(), Expected)
            ]
        );
        assert_eq!(
            got(&m, 1, "x.example.com"),
            [("expect".to_string(), Unexpected)]
        );
        assert!(m.verdicts(9, "x").is_empty());
    }

    #[test]
    fn stats_are_passed_through_and_diffed() {
        let mut m = manager();
        m.kernel_mut().stats = DnsStats {
            ringbuf_full: 2,
            name_unreadable: 1,
        };
        assert_eq!(m.stats().unwrap().ringbuf_full, 2);
        assert_eq!(m.stats_delta().unwrap().ringbuf_full, 2);
        m.kernel_mut().stats.name_unreadable = 4;
        assert_eq!(
            m.stats_delta().unwrap(),
            DnsStats {
                ringbuf_full: 0,
                name_unreadable: 3
            }
        );
        assert_eq!(m.reader().unwrap_err(), DnsError::NotBuilt);
    }
}
