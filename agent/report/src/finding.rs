//! What the monitor hands the sinks: a [`Finding`].
//!
//! A finding is a closed struct of typed scalars. There is no label map,
//! no header map, no body and no free-form property passthrough, so an
//! unredacted payload is not representable at the boundary: every string a
//! sink can emit is one of the fields below, and [`Finding::redact`] passes
//! each of them through [`sanitize`].

use crate::owners::Controller;
use crate::sanitize::sanitize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::time::SystemTime;

/// The behavior a policy governs, and so the kind of thing a finding saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Behavior {
    /// Outgoing packets; the target is their destination address.
    Network,
    /// An exec; the target is the executed file's path.
    Exec,
    /// A file open; the target is the opened path.
    Open,
    /// Use of a network protocol; the target is the protocol's name.
    Protocol,
    /// A DNS question; the target is the queried name.
    Dns,
}

impl Behavior {
    /// Every behavior, in declaration order.
    pub const ALL: [Behavior; 5] = [
        Behavior::Network,
        Behavior::Exec,
        Behavior::Open,
        Behavior::Protocol,
        Behavior::Dns,
    ];

    /// The behavior's name as in RuntimePolicy (`spec.behaviors[].<name>`),
    /// which is also the rule name of its Report results.
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Network => "network",
            Behavior::Exec => "exec",
            Behavior::Open => "open",
            Behavior::Protocol => "protocol",
            Behavior::Dns => "dns",
        }
    }
}

impl Behavior {
    /// What a finding's `count` counts for this behavior (the result's
    /// `countUnit`): the egress counters count packets to a destination,
    /// the protocol classifier one decision per flow, the DNS observer one
    /// question per query, and the open/exec programs one call each.
    pub fn count_unit(self) -> &'static str {
        match self {
            Behavior::Network => "packets",
            Behavior::Exec => "execs",
            Behavior::Open => "opens",
            Behavior::Protocol => "flows",
            Behavior::Dns => "queries",
        }
    }
}

impl fmt::Display for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the policy's lists matched the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// An explicit deny entry matched.
    Denied,
    /// The policy denies by default (`deny: ["*"]`) and no allow entry
    /// matched.
    DefaultDenied,
}

impl Decision {
    /// The decision's name as emitted (`decision` property).
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Denied => "denied",
            Decision::DefaultDenied => "default-denied",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which pod (and container) a finding is about.
///
/// The pod's labels are deliberately absent: they are arbitrary
/// user-controlled key/values, and a finding never emits them.
///
/// `Debug` prints the [redacted](PodIdentity::redact) identity.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct PodIdentity {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (the Report's owner reference and scope carry it).
    pub uid: String,
    /// The container, when attribution resolved one.
    pub container: Option<String>,
    /// The kind of the pod's owner (`Deployment` for a ReplicaSet whose
    /// name carries the pod-template-hash), when it has one.
    ///
    /// **Unverified**: derived from the pod's first ownerReference, which
    /// anyone who can create or patch the pod may set to anything.
    /// Correlation metadata, never a security boundary. On the pod's own
    /// Report, the owner verified through the API replaces it
    /// ([`property::OWNER_VERIFIED`](crate::property::OWNER_VERIFIED)).
    pub owner_kind: Option<String>,
    /// The name of the pod's owner, when it has one. **Unverified**, as
    /// [`owner_kind`](Self::owner_kind).
    pub owner_name: Option<String>,
}

impl PodIdentity {
    /// Every string field passed through [`sanitize`].
    ///
    /// Rebuilt field by field from an exhaustive destructuring, so a field
    /// added to the struct does not compile until it is decided here.
    pub fn redact(self) -> PodIdentity {
        let PodIdentity {
            namespace,
            name,
            uid,
            container,
            owner_kind,
            owner_name,
        } = self;
        PodIdentity {
            namespace: sanitize(&namespace),
            name: sanitize(&name),
            uid: sanitize(&uid),
            container: container.as_deref().map(sanitize),
            owner_kind: owner_kind.as_deref().map(sanitize),
            owner_name: owner_name.as_deref().map(sanitize),
        }
    }

    /// Whether a Report can be written for this pod: its namespace is a
    /// DNS-1123 label, its name a DNS-1123 subdomain and its uid a plain
    /// identifier, as the API server validates them. Anything else did not
    /// come from a real pod (or did not survive redaction intact) and has
    /// no Report to go to.
    pub fn is_addressable(&self) -> bool {
        is_dns1123_label(&self.namespace)
            && is_dns1123_subdomain(&self.name)
            && !self.uid.is_empty()
            && self.uid.len() <= 128
            && self
                .uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    }
}

impl fmt::Debug for PodIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PodIdentity {
            namespace,
            name,
            uid,
            container,
            owner_kind,
            owner_name,
        } = self.clone().redact();
        f.debug_struct("PodIdentity")
            .field("namespace", &namespace)
            .field("name", &name)
            .field("uid", &uid)
            .field("container", &container)
            .field("owner_kind", &owner_kind)
            .field("owner_name", &owner_name)
            .finish()
    }
}

/// The process an occurrence came from, when the kernel's record named one:
/// a per-occurrence refusal (pid, comm) or a traced exec (pid, comm, argv).
/// Counter-grained observations (network, protocol, a refusal over its
/// cgroup's record budget) and DNS questions carry none: a cgroup_skb
/// program cannot name the task.
///
/// `Debug` prints the [redacted](Process::redact) process.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Process {
    /// Thread-group id (what userspace calls the pid), as the pod's PID
    /// namespace's parent sees it (the node's).
    pub pid: u32,
    /// The task's `comm` (at most 15 bytes).
    pub comm: String,
    /// The exec's arguments, when traced (at most 8, each cut at 127
    /// bytes); empty otherwise.
    pub argv: Vec<String>,
}

impl Process {
    /// Every string passed through [`sanitize`]; argv, where secrets live
    /// (`--password x`, `-u user:pass`, bearer tokens), through
    /// [`sanitize_argv`](crate::sanitize_argv), which also masks what
    /// follows a secret-naming flag.
    pub fn redact(self) -> Process {
        let Process { pid, comm, argv } = self;
        Process {
            pid,
            comm: sanitize(&comm),
            argv: crate::sanitize::sanitize_argv(&argv),
        }
    }
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Process { pid, comm, argv } = self.clone().redact();
        f.debug_struct("Process")
            .field("pid", &pid)
            .field("comm", &comm)
            .field("argv", &argv)
            .finish()
    }
}

/// One observed violation of one policy by one pod, aggregated over
/// `count` occurrences between `first_observed` and `last_observed`.
///
/// `Debug` prints the [redacted](Finding::redact) finding, so logging one
/// cannot leak what the kernel saw.
#[derive(Clone, PartialEq, Eq)]
pub struct Finding {
    /// The RuntimePolicy's name.
    pub policy: String,
    /// The RuntimePolicy's uid.
    pub policy_uid: String,
    /// The behavior whose lists matched.
    pub behavior: Behavior,
    /// The pod the operation came from.
    pub pod: PodIdentity,
    /// What the kernel saw: the path, address, protocol or name.
    pub target: String,
    /// `true`: the kernel refused the operation (an enforce-mode policy).
    /// `false`: it was allowed, and a monitor-mode policy says it would
    /// have been denied.
    pub enforced: bool,
    /// Which list matched, when the monitor knows.
    pub decision: Option<Decision>,
    /// How many times it happened (a poll source's delta; 1 for a
    /// per-occurrence record).
    pub count: u64,
    /// The earliest occurrence.
    pub first_observed: SystemTime,
    /// The latest occurrence.
    pub last_observed: SystemTime,
    /// The process of the latest occurrence, when the kernel named it.
    pub process: Option<Process>,
    /// For a network finding, the Service and domain values of the
    /// policy that the destination is known under (a Service's ClusterIPs
    /// and endpoints, a domain's addresses from the pod's DNS answers):
    /// why an address the policy does not spell out matched.
    pub matched: Vec<String>,
}

impl Finding {
    /// The finding's identity: SHA-256 over the policy's name and uid, the
    /// behavior, whether the kernel refused it or monitor mode would have,
    /// the pod's namespace, name and uid, and the target.
    ///
    /// The policy uid and the enforcement are part of it (issue 38, point
    /// 9), unlike the specification's fingerprint (policy, behavior, pod,
    /// target): a policy switched from monitor to enforce, or deleted and
    /// recreated under its name, starts results of its own, so a result
    /// that says "denied by the kernel" counts refusals only, from the
    /// first refusal, and a recreated policy inherits no counts
    /// (`docs/reports.md`).
    ///
    /// The strings are hashed as [`sanitize`] leaves them, so the
    /// fingerprint of a finding and of its redaction are the same (whoever
    /// computes it, before or after redacting), and the published digest
    /// says nothing about a secret that the Report itself masks: an
    /// unsalted hash over a raw argv would let anyone holding the rest of
    /// the finding test guesses of a short password against it. Two
    /// targets that differ only in masked material are one finding, which
    /// is also how a reader of the Report would see them.
    pub fn fingerprint(&self) -> Fingerprint {
        let pod = &self.pod;
        Fingerprint::over([
            &sanitize(&self.policy),
            &sanitize(&self.policy_uid),
            self.behavior.as_str(),
            enforcement(self.enforced),
            &sanitize(&pod.namespace),
            &sanitize(&pod.name),
            &sanitize(&pod.uid),
            &sanitize(&self.target),
        ])
    }

    /// [`fingerprint`](Self::fingerprint) of a finding known to be
    /// redacted already (sanitizing is idempotent, so the result is the
    /// same, without sanitizing every field again).
    pub(crate) fn fingerprint_of_redacted(&self) -> Fingerprint {
        let pod = &self.pod;
        Fingerprint::over([
            &self.policy,
            &self.policy_uid,
            self.behavior.as_str(),
            enforcement(self.enforced),
            &pod.namespace,
            &pod.name,
            &pod.uid,
            &self.target,
        ])
    }

    /// The identity of this finding's result on a controller's Report: the
    /// policy's name and uid, the behavior, the enforcement, the
    /// controller (namespace, kind, name, uid) and the target, so the
    /// findings of every pod of the controller meet in one result. For a
    /// finding known to be redacted, as
    /// [`fingerprint_of_redacted`](Self::fingerprint_of_redacted).
    pub(crate) fn rollup_fingerprint(&self, controller: &Controller) -> Fingerprint {
        Fingerprint::tagged(
            b"kyverno-runtime controller result v2\0",
            [
                self.policy.as_str(),
                &self.policy_uid,
                self.behavior.as_str(),
                enforcement(self.enforced),
                &controller.namespace,
                controller.kind.as_str(),
                &controller.name,
                &controller.uid,
                &self.target,
            ],
        )
    }

    /// Every string field passed through [`sanitize`]: what a sink other
    /// than the Report (the push stream, an Event) must send instead of
    /// the finding itself.
    ///
    /// Rebuilt field by field from an exhaustive destructuring (here and in
    /// [`PodIdentity::redact`]), so a field added to the struct does not
    /// compile until it is decided here: it can be dropped, never forwarded
    /// unscrubbed by accident.
    pub fn redact(self) -> Finding {
        let Finding {
            policy,
            policy_uid,
            behavior,
            pod,
            target,
            enforced,
            decision,
            count,
            first_observed,
            last_observed,
            process,
            matched,
        } = self;
        Finding {
            policy: sanitize(&policy),
            policy_uid: sanitize(&policy_uid),
            behavior,
            pod: pod.redact(),
            target: sanitize(&target),
            enforced,
            decision,
            count,
            first_observed,
            last_observed,
            process: process.map(Process::redact),
            matched: matched.iter().map(|m| sanitize(m)).collect(),
        }
    }

    /// Folds another observation of the same fingerprint into this one:
    /// counts add, the window widens, and the newer observation's details
    /// (decision, container; the process, when it names one) win. The
    /// enforcement is part of the fingerprint, so both are refusals or
    /// both would-denies.
    pub(crate) fn absorb(&mut self, other: Finding) {
        let count = self.count.saturating_add(other.count);
        let first = self.first_observed.min(other.first_observed);
        let last = self.last_observed.max(other.last_observed);
        if other.last_observed >= self.last_observed {
            let process = other.process.clone().or_else(|| self.process.take());
            *self = other;
            self.process = process;
        }
        self.count = count;
        self.first_observed = first;
        self.last_observed = last;
    }

    /// `first_observed <= last_observed`, whatever the producer sent.
    pub(crate) fn normalize_window(&mut self) {
        if self.first_observed > self.last_observed {
            std::mem::swap(&mut self.first_observed, &mut self.last_observed);
        }
    }
}

impl fmt::Debug for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Finding {
            policy,
            policy_uid,
            behavior,
            pod,
            target,
            enforced,
            decision,
            count,
            first_observed,
            last_observed,
            process,
            matched,
        } = self.clone().redact();
        f.debug_struct("Finding")
            .field("policy", &policy)
            .field("policy_uid", &policy_uid)
            .field("behavior", &behavior)
            .field("pod", &pod)
            .field("target", &target)
            .field("enforced", &enforced)
            .field("decision", &decision)
            .field("count", &count)
            .field("first_observed", &first_observed)
            .field("last_observed", &last_observed)
            .field("process", &process)
            .field("matched", &matched)
            .finish()
    }
}

/// How the fingerprints spell a finding's enforcement.
fn enforcement(enforced: bool) -> &'static str {
    if enforced {
        "enforced"
    } else {
        "would-deny"
    }
}

/// A finding's identity: a SHA-256 digest, shown as 64 lowercase hex
/// digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Hashes the parts, each prefixed by its length so that no two
    /// different part lists hash the same bytes (`"ab","c"` vs `"a","bc"`),
    /// behind a version tag so a future change of parts cannot collide
    /// with today's digests.
    fn over<'a>(parts: impl IntoIterator<Item = &'a str>) -> Fingerprint {
        Fingerprint::tagged(b"kyverno-runtime finding v2\0", parts)
    }

    /// [`over`](Self::over) behind another tag, for another kind of
    /// identity (a controller's result), so no such digest can equal a
    /// finding's.
    fn tagged<'a>(tag: &[u8], parts: impl IntoIterator<Item = &'a str>) -> Fingerprint {
        let mut hash = Sha256::new();
        hash.update(tag);
        for part in parts {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        Fingerprint(hash.finalize().into())
    }

    /// Parses the 64-hex-digit form (either case); `None` for anything else.
    pub fn from_hex(s: &str) -> Option<Fingerprint> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let hi = char::from(pair[0]).to_digit(16)?;
            let lo = char::from(pair[1]).to_digit(16)?;
            *slot = u8::try_from(hi * 16 + lo).ok()?;
        }
        Some(Fingerprint(out))
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// A DNS-1123 label: 1 to 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A DNS-1123 subdomain as Kubernetes validates object names: at most 253
/// characters of dot-separated parts, each `[a-z0-9-]` and alphanumeric at
/// both ends. Unlike DNS, Kubernetes does not limit a part to 63
/// characters, so a 70-character pod name is valid.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    use crate::fixtures::finding;

    #[test]
    fn fingerprint_is_stable_and_covers_identity_only() {
        let f = finding();
        // A fixed value (computed independently with Python's hashlib): a
        // change here changes every stored Report's identities, so it must
        // be deliberate. (v2, issue 38: the policy uid and the enforcement
        // joined the identity.)
        assert_eq!(
            f.fingerprint().to_string(),
            "07a5d280ae74e03088092b6d51d907dd9078e88a47dd6ddf8e26633ae216a01e"
        );
        let mut g = f.clone();
        g.count = 7;
        g.decision = None;
        g.last_observed = at(200);
        g.pod.container = None;
        assert_eq!(f.fingerprint(), g.fingerprint(), "not part of identity");
        for change in [
            |f: &mut Finding| f.policy = "other".into(),
            |f: &mut Finding| f.policy_uid = "other".into(),
            |f: &mut Finding| f.enforced = false,
            |f: &mut Finding| f.behavior = Behavior::Open,
            |f: &mut Finding| f.pod.namespace = "other".into(),
            |f: &mut Finding| f.pod.name = "web-1".into(),
            |f: &mut Finding| f.pod.uid = "other".into(),
            |f: &mut Finding| f.target = "/usr/bin/wget".into(),
        ] {
            let mut g = f.clone();
            change(&mut g);
            assert_ne!(f.fingerprint(), g.fingerprint());
        }
    }

    /// Issue 38, point 9: a refusal and a would-deny are different
    /// results, and so are two policies of one name (deleted and
    /// recreated: another uid).
    #[test]
    fn fingerprint_separates_enforced_and_policy_uid() {
        let f = finding();
        let mut monitor = f.clone();
        monitor.enforced = false;
        assert_ne!(f.fingerprint(), monitor.fingerprint(), "enforced");
        let mut recreated = f.clone();
        recreated.policy_uid = "99999999-8888-7777-6666-555555555555".into();
        assert_ne!(f.fingerprint(), recreated.fingerprint(), "policy uid");
    }

    #[test]
    fn fingerprint_parts_are_length_prefixed() {
        let mut a = finding();
        let mut b = finding();
        a.pod.namespace = "ab".into();
        a.pod.name = "c".into();
        b.pod.namespace = "a".into();
        b.pod.name = "bc".into();
        assert_ne!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn fingerprint_survives_redaction() {
        let mut f = finding();
        f.target = "/usr/bin/mysql --password=hunter2".into();
        let raw = f.fingerprint();
        let redacted = f.redact();
        assert_eq!(redacted.fingerprint(), raw);
        assert_eq!(redacted.fingerprint_of_redacted(), raw);
    }

    #[test]
    fn fingerprint_hex_round_trips() {
        let fp = finding().fingerprint();
        assert_eq!(Fingerprint::from_hex(&fp.to_string()), Some(fp));
        assert_eq!(
            Fingerprint::from_hex(&fp.to_string().to_uppercase()),
            Some(fp)
        );
        assert_eq!(Fingerprint::from_hex("abc"), None);
        assert_eq!(Fingerprint::from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn absorb_sums_counts_and_widens_the_window() {
        let mut a = finding();
        a.count = 2;
        a.first_observed = at(100);
        a.last_observed = at(150);
        let mut b = finding();
        b.count = 3;
        b.decision = Some(Decision::DefaultDenied);
        b.first_observed = at(90);
        b.last_observed = at(200);
        a.absorb(b);
        assert_eq!(a.count, 5);
        assert_eq!(a.first_observed, at(90));
        assert_eq!(a.last_observed, at(200));
        assert_eq!(
            a.decision,
            Some(Decision::DefaultDenied),
            "the newer observation's details win"
        );

        let mut old = finding();
        old.decision = Some(Decision::Denied);
        old.last_observed = at(10);
        old.first_observed = at(10);
        a.absorb(old);
        assert_eq!(a.decision, Some(Decision::DefaultDenied));
        assert_eq!(a.count, 6);
        assert_eq!(a.first_observed, at(10));
        assert_eq!(a.last_observed, at(200));

        let mut c = finding();
        c.count = u64::MAX;
        a.absorb(c);
        assert_eq!(a.count, u64::MAX, "saturates");
    }

    #[test]
    fn addressable_pods_are_real_identifiers() {
        let mut f = finding();
        assert!(f.pod.is_addressable());
        f.pod.name = "web.v1-0".into();
        assert!(f.pod.is_addressable());
        f.pod.name = "a".repeat(100);
        assert!(f.pod.is_addressable(), "no 63-character limit on a name");
        f.pod.name = "a".repeat(254);
        assert!(!f.pod.is_addressable());
        for bad in [
            |p: &mut PodIdentity| p.namespace.clear(),
            |p: &mut PodIdentity| p.namespace = "Shop".into(),
            |p: &mut PodIdentity| p.name = "***".into(),
            |p: &mut PodIdentity| p.name = "web-".into(),
            |p: &mut PodIdentity| p.name = "web..0".into(),
            |p: &mut PodIdentity| p.uid.clear(),
            |p: &mut PodIdentity| p.uid = "a b".into(),
        ] {
            let mut p = finding().pod;
            bad(&mut p);
            assert!(!p.is_addressable(), "{p:?}");
        }
    }

    #[test]
    fn names_of_behaviors_and_decisions() {
        let names: Vec<&str> = Behavior::ALL.iter().map(|b| b.as_str()).collect();
        assert_eq!(names, ["network", "exec", "open", "protocol", "dns"]);
        assert_eq!(Decision::DefaultDenied.to_string(), "default-denied");
    }
}
