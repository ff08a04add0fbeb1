//! Driver (b), network: generated network policies programmed by the real
//! [`EgressManager`] into the real kernel backend
//! ([`EgressEnforcer<KernelEgress>`]), and the real cgroup_skb egress
//! program run on a UDP frame to every address of the universe with
//! `BPF_PROG_TEST_RUN`; its verdict (0 = drop) is compared with the
//! model's refusal.
//!
//! How the packet's cgroup is chosen: a test-run skb gets a socket the
//! kernel allocates in the calling process, so the program's
//! `bpf_skb_cgroup_id` is this process's cgroup v2 id (see
//! `bpf/tests/egress_test_run.rs`). The driver therefore moves this
//! process into a scratch child cgroup (`krt-differential-<pid>` under the
//! cgroup2 mount) and registers a pod whose one container cgroup is that
//! child. It must run single-threaded: every thread of the process moves
//! with it, and a thread sending real traffic would be filtered.
//!
//! One manager, one backend and one pod serve every case: each case
//! upserts its policies, probes every address, deletes its policies and
//! probes again (every address must pass: the binding is gone). The first
//! binding attaches the program to the child cgroup and the last
//! unbinding detaches it, so both are exercised per case; this process
//! sends no real traffic meanwhile. The next case gets the released set
//! id again, so an entry or flag the removal left behind shows there as a
//! disagreement (its shrunk case may then not be the cause).
//!
//! Domain values: once a case's policies are programmed, the pod's DNS
//! answers for each domain of the universe's cluster (A and AAAA records,
//! from port 53) go through the real DNS answer snooper
//! (`EgressFilter::test_run_snoop`), so the filter decides with what the
//! kernel learned, as on a node.

use crate::kernel_common::{mode, pod, run_driver, KernelCase};
use crate::model::{self, Cluster, Event, Kind, Policy};
use crate::{universe, userspace, Run};
use kyverno_runtime_enforce::egress::{
    ContainerCgroup, EgressEnforcer, EgressManager, KernelEgress, NetworkPolicy,
};
use kyverno_runtime_enforce::names::ServiceName;
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::values::BehaviorKind;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

// The snooper tests' DNS message builder; here it only builds answers for
// the universe's own names.
#[allow(clippy::unwrap_used)]
#[path = "../../bpf/tests/common/dnsmsg.rs"]
mod dnsmsg;

/// The driver's name, as `Run.driver` reports it.
const DRIVER: &str = "egress-bpf";

/// `BPF_PROG_TEST_RUN`'s return value for a dropped packet.
const DROP: u32 = 0;

// ---- cases --------------------------------------------------------------------------

/// 1 to 8 policies of network behaviors only, from the universe's values.
pub fn network_policies() -> impl Strategy<Value = Vec<Policy>> {
    universe::policies_of(&[Kind::Network], universe::values_of)
}

// ---- the product --------------------------------------------------------------------

/// The manager over the kernel backend, one pod on the scratch cgroup, a
/// frame to every address of the universe, and the pod's DNS answers.
struct Kernel {
    manager: EgressManager<EgressEnforcer<KernelEgress>>,
    cluster: Cluster,
    frames: Vec<(IpAddr, Vec<u8>)>,
    answers: Vec<Vec<u8>>,
}

/// The frames of a DNS answer for each domain of `cluster`: one datagram
/// from port 53 to the pod, its records the domain's addresses.
fn answers(cluster: &Cluster) -> Vec<Vec<u8>> {
    let pod = SocketAddr::from(([10, 0, 0, 5], 40000));
    cluster
        .domains
        .iter()
        .map(|(name, addrs)| {
            let mut r = dnsmsg::Response::new(name, dnsmsg::TYPE_A);
            for a in addrs {
                match a {
                    IpAddr::V4(a) => r.a(&dnsmsg::ptr(dnsmsg::QNAME_AT), 300, *a),
                    IpAddr::V6(a) => r.aaaa(&dnsmsg::ptr(dnsmsg::QNAME_AT), 300, *a),
                };
            }
            kyverno_runtime_bpf::frame::udp_datagram_to(53, pod, &r.bytes)
        })
        .collect()
}

impl Kernel {
    fn new(cgroup: ContainerCgroup, cluster: Cluster) -> Result<Self, String> {
        let backend = EgressEnforcer::load().map_err(|e| e.to_string())?;
        let mut manager = EgressManager::new(backend).map_err(|e| e.to_string())?;
        let failures = manager.reconcile_adopted(&BTreeSet::new());
        if let Some(f) = failures.first() {
            return Err(f.to_string());
        }
        // The Services listed, as the daemon's watch does.
        for (namespace, name, addrs) in &cluster.services {
            manager.set_service_addresses(
                ServiceName::new(namespace.clone(), name.clone()),
                Some(addrs.iter().copied().collect()),
            );
        }
        manager.services_synced();
        let failures = manager.upsert_pod(pod(cgroup));
        if let Some(f) = failures.first() {
            return Err(f.to_string());
        }
        let frames = universe::ADDRESSES
            .iter()
            .map(|a| {
                a.parse::<IpAddr>()
                    .map(|ip| (ip, kyverno_runtime_bpf::frame::udp_to(ip)))
                    .map_err(|e| format!("address {a:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            manager,
            answers: answers(&cluster),
            cluster,
            frames,
        })
    }

    /// Compiles `p` as the daemon does and upserts its network part.
    fn apply(&mut self, p: &Policy) -> Result<(), String> {
        let (compiled, result) = userspace::compile(p).map_err(|e| e.0)?;
        let outcome = self.manager.upsert_policy(NetworkPolicy {
            id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
            name: p.name.clone(),
            mode: mode(p.mode),
            target: compiled.target,
            network: BehaviorLists::merge(&result, BehaviorKind::Network),
        });
        if !outcome.rejections.is_empty() || !outcome.failures.is_empty() {
            return Err(format!("{}: network not programmed: {outcome:?}", p.name));
        }
        Ok(())
    }

    /// Deletes every policy of the case, and anything else still held.
    fn clear(&mut self, policies: &[Policy]) -> Result<(), String> {
        let mut ids: BTreeSet<PolicyId> = self.manager.programmed().keys().cloned().collect();
        for p in policies {
            ids.insert(PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?);
        }
        let mut failures = Vec::new();
        for id in &ids {
            failures.extend(self.manager.delete_policy(id));
        }
        // What released sets counted waits for a drain: taken so it does
        // not pile up over the run.
        self.manager.drain().map_err(|e| e.to_string())?;
        match failures.first() {
            Some(f) => Err(format!("deleting the policies: {f}")),
            None if !self.manager.programmed().is_empty() => Err(format!(
                "deleted every policy, the backend still holds {:?}",
                self.manager.programmed().keys().collect::<Vec<_>>()
            )),
            None => Ok(()),
        }
    }

    /// Whether the kernel program drops `frame`.
    fn dropped(&self, frame: &[u8]) -> Result<bool, String> {
        self.manager
            .backend()
            .kernel()
            .filter()
            .test_run(frame)
            .map(|verdict| verdict == DROP)
            .map_err(|e| format!("test run: {e}"))
    }

    fn check(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        for p in policies {
            self.apply(p)?;
        }
        // The pod resolves every domain: what its set names is learned.
        for answer in &self.answers {
            self.manager
                .backend()
                .kernel()
                .filter()
                .test_run_snoop(answer)
                .map_err(|e| format!("snooper test run: {e}"))?;
        }
        for (addr, frame) in &self.frames {
            checked.set(checked.get() + 1);
            let want = model::decide_in(&self.cluster, policies, &Event::Connect(*addr));
            let dropped = self.dropped(frame)?;
            if dropped != want.refused {
                let verb = |refused| if refused { "drops" } else { "passes" };
                return Err(format!(
                    "{addr}: the kernel {} it, the model {} it (its findings: {:?})",
                    verb(dropped),
                    verb(want.refused),
                    want.findings
                ));
            }
        }
        Ok(())
    }
}

impl KernelCase for Kernel {
    /// Programs `policies`, checks every address against the model,
    /// deletes them and checks that every address passes. Cleans up even
    /// when a check fails, so the next case starts from nothing.
    fn case(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        let result = self.check(policies, checked);
        let cleared = self.clear(policies);
        result?;
        cleared?;
        for (addr, frame) in &self.frames {
            if self.dropped(frame)? {
                return Err(format!(
                    "after every policy was deleted, {addr} is still dropped (a stale entry)"
                ));
            }
        }
        Ok(())
    }
}

/// Driver (b), network: about `cases` (policy set, address) pairs, each
/// policy set drawn from the network universe (seeded with `seed`),
/// programmed by the real [`EgressManager`] over the real kernel backend
/// and judged by the real cgroup_skb egress program on a UDP frame to
/// every address of [`universe::ADDRESSES`] (`BPF_PROG_TEST_RUN`),
/// against [`model::decide_in`]. After each set its policies are deleted
/// and every address must pass again.
///
/// Needs root and a cgroup v2 mount (otherwise the run has no cases and
/// says why); moves this process into a scratch child cgroup for the run
/// (moved back and removed on the way out), so it must be called with no
/// other thread running.
pub fn kernel_egress(cases: u64, seed: u64) -> Run {
    // The replay scenario of a disagreement probes every address.
    let every: Vec<Event> = universe::ADDRESSES
        .iter()
        .filter_map(|a| a.parse().ok().map(Event::Connect))
        .collect();
    run_driver(
        DRIVER,
        cases,
        seed,
        universe::ADDRESSES.len(),
        network_policies(),
        every,
        |cgroup| Kernel::new(cgroup, universe::cluster()),
    )
}
