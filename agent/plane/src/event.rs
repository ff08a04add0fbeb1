//! The one currency of the plane: [`Event`].
//!
//! A source turns what the kernel recorded into events (a poll source's
//! counter deltas, a ring buffer's per-occurrence records); attribution
//! fills in the pod; the monitor matches each event against the policies
//! selecting that pod. An event is either an occurrence (`count` 1, with
//! the process when the kernel named it) or an aggregate (`count` > 1 from
//! a counter, no process).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

/// What kind of thing was observed: the `event.kind` a monitorFilter sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// An outgoing connection (packets to a destination).
    Net,
    /// A DNS question.
    Dns,
    /// A program execution.
    Exec,
    /// A file open.
    Open,
    /// A flow's application protocol.
    Protocol,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [Kind::Net, Kind::Dns, Kind::Exec, Kind::Open, Kind::Protocol];

    /// The name a monitorFilter compares `event.kind` with.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Net => "net",
            Kind::Dns => "dns",
            Kind::Exec => "exec",
            Kind::Open => "open",
            Kind::Protocol => "protocol",
        }
    }
}

/// What was observed, by kind (one non-empty variant per event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Facts {
    /// A file open.
    Open {
        /// The path as the kernel resolved it; empty when it could not be
        /// resolved (only a default deny refuses such an open).
        path: String,
    },
    /// An exec.
    Exec {
        /// The executed file: the resolved path for a refusal or a counter,
        /// the filename the exec asked for when traced.
        filename: String,
        /// The arguments, when the exec was traced (empty otherwise).
        argv: Vec<String>,
    },
    /// Packets to a destination.
    Net {
        /// The destination address.
        dest: IpAddr,
        /// The destination port, when the source knows it.
        port: Option<u16>,
        /// The network values naming the destination for the pod when it
        /// was observed, as policies write them: Services
        /// (`<name>.<namespace>.svc`) whose ClusterIPs or endpoints hold
        /// it, and the domain the pod's own DNS answers taught it under
        /// (unexpired). Empty when none is known.
        names: Vec<String>,
    },
    /// A DNS question.
    Dns {
        /// The queried name, lowercase, without the trailing dot.
        qname: String,
    },
    /// A classified flow.
    Protocol {
        /// The token the classifier produced (`ssh`, `tls`, `http/1.1`,
        /// `http/2`, `quic`, `dns`, `unclassified`).
        protocol: &'static str,
        /// For `tls`, the first ALPN offered.
        alpn: Option<String>,
    },
}

impl Facts {
    /// The kind these facts are of.
    pub fn kind(&self) -> Kind {
        match self {
            Facts::Open { .. } => Kind::Open,
            Facts::Exec { .. } => Kind::Exec,
            Facts::Net { .. } => Kind::Net,
            Facts::Dns { .. } => Kind::Dns,
            Facts::Protocol { .. } => Kind::Protocol,
        }
    }

    /// The finding's target: the path, the address, the name or the
    /// protocol (`tls/h2` for TLS with an ALPN).
    pub fn target(&self) -> String {
        match self {
            Facts::Open { path } => path.clone(),
            Facts::Exec { filename, .. } => filename.clone(),
            Facts::Net { dest, .. } => dest.to_string(),
            Facts::Dns { qname } => qname.clone(),
            Facts::Protocol { protocol, alpn } => match alpn {
                Some(a) => format!("{protocol}/{a}"),
                None => (*protocol).to_string(),
            },
        }
    }
}

/// Which decision the kernel made, when an enforcing program reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelVerdict {
    /// Allowed (an observation of a monitored cgroup).
    Allowed,
    /// Refused: an explicit deny matched.
    Denied,
    /// Refused: nothing was allowed under a default deny.
    DefaultDenied,
}

impl KernelVerdict {
    /// Whether the kernel refused the operation.
    pub const fn refused(self) -> bool {
        !matches!(self, KernelVerdict::Allowed)
    }
}

/// The verdict of a merged decision, as a kernel counter or record carries
/// it: an unmatched operation was allowed.
impl From<kyverno_runtime_policy::rule::Decision> for KernelVerdict {
    fn from(d: kyverno_runtime_policy::rule::Decision) -> Self {
        use kyverno_runtime_policy::rule::Decision;
        match d {
            Decision::Denied => KernelVerdict::Denied,
            Decision::DefaultDenied => KernelVerdict::DefaultDenied,
            Decision::Allowed | Decision::Unmatched => KernelVerdict::Allowed,
        }
    }
}

/// The process of an occurrence, when the kernel's record named one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProcessInfo {
    /// Thread-group id, as the node sees it.
    pub pid: u32,
    /// `comm`.
    pub comm: String,
}

/// The pod an event was attributed to: what a finding names and what a
/// selector or a monitorFilter reads. Replaced, never mutated (the index
/// hands out `Arc`s), so a sink may keep it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: String,
    /// Labels (a selector and `event.pod.labels` read them; a finding never
    /// carries them).
    pub labels: BTreeMap<String, String>,
    /// The first ownerReference's kind (a ReplicaSet named with the
    /// pod-template-hash reads as its Deployment). **Unverified**.
    pub owner_kind: Option<String>,
    /// The first ownerReference's name (the Deployment's, for such a
    /// ReplicaSet). **Unverified**.
    pub owner_name: Option<String>,
    /// The pod's containers by cgroup id.
    pub containers: BTreeMap<u64, String>,
    /// The containers' runtime ids by container name, as the pod's
    /// container statuses write them (`containerd://<id>`): the Go
    /// original's `event.pod.containerID`.
    pub container_ids: BTreeMap<String, String>,
    /// The node the pod runs on (`spec.nodeName`); empty when unknown.
    pub node_name: String,
    /// The pod's service account (`spec.serviceAccountName`); empty when
    /// unknown.
    pub service_account: String,
    /// Bumped by the index on every change of this pod (a relabel), so a
    /// cache keyed by uid can tell an old view from a new one.
    pub version: u64,
}

/// One observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The source that produced it (`openexec-observe`, `exec-trace`,
    /// `egress-observe`, `dnsquery`).
    pub source: &'static str,
    /// When it happened: the record's arrival for a ring buffer, the drain
    /// for a counter.
    pub time: SystemTime,
    /// The cgroup (v2 id) the operation came from, when known.
    pub cgroup: Option<u64>,
    /// The pod uid, when the source knows it (it then need not be looked up
    /// by cgroup).
    pub pod_uid: Option<Arc<str>>,
    /// The process, for a per-occurrence record that named it.
    pub process: Option<ProcessInfo>,
    /// Occurrences this event stands for: 1 for a record, the delta for a
    /// counter.
    pub count: u64,
    /// The kernel's decision, when an enforcing program reported it.
    pub kernel: Option<KernelVerdict>,
    /// What was observed.
    pub facts: Facts,
    /// The pod, once attribution found it.
    pub pod: Option<Arc<PodRef>>,
}

impl Event {
    /// An event of `facts` from `source`, now, once, with nothing else known.
    pub fn new(source: &'static str, facts: Facts) -> Self {
        Event {
            source,
            time: SystemTime::now(),
            cgroup: None,
            pod_uid: None,
            process: None,
            count: 1,
            kernel: None,
            facts,
            pod: None,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.facts.kind()
    }

    /// Whether the kernel refused the operation.
    pub fn kernel_denied(&self) -> bool {
        self.kernel.is_some_and(KernelVerdict::refused)
    }

    /// The container the event's cgroup belongs to, once attributed.
    pub fn container(&self) -> Option<&str> {
        let cgroup = self.cgroup?;
        self.pod
            .as_ref()?
            .containers
            .get(&cgroup)
            .map(String::as_str)
    }

    /// The runtime id of the container the event's cgroup belongs to, as
    /// its container status writes it, once attributed.
    pub fn container_id(&self) -> Option<&str> {
        let name = self.container()?;
        self.pod
            .as_ref()?
            .container_ids
            .get(name)
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kyverno_runtime_policy::rule::Decision;

    #[test]
    fn a_decision_is_refused_exactly_when_its_verdict_is() {
        for (d, v) in [
            (Decision::Denied, KernelVerdict::Denied),
            (Decision::DefaultDenied, KernelVerdict::DefaultDenied),
            (Decision::Allowed, KernelVerdict::Allowed),
            (Decision::Unmatched, KernelVerdict::Allowed),
        ] {
            assert_eq!(KernelVerdict::from(d), v, "{d:?}");
            assert_eq!(d.refused(), v.refused(), "{d:?}");
        }
    }
}
