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
//! Domain values: once a case's policies are programmed, the pod asks the
//! declared resolver about each domain of the universe's cluster (through
//! the filter, which notes the question) and the answer (A and AAAA
//! records, from port 53) goes through the real DNS answer snooper
//! (`EgressFilter::test_run_snoop`), so the filter decides with what the
//! kernel learned, as on a node.

use crate::kernel_common::{mode, pod, pod_labels, run_driver, run_sequences, KernelCase};
use crate::model::{self, Cluster, Event, Kind, Policy};
use crate::reporting::{self, Reporter};
use crate::{step_of, universe, userspace, Run};
use kyverno_runtime_enforce::egress::{
    ContainerCgroup, EgressEnforcer, EgressManager, KernelEgress, NetworkPolicy,
};
use kyverno_runtime_enforce::names::ServiceName;
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_plane::{Event as PlaneEvent, Facts};
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

/// The sequences driver's name.
const SEQUENCE_DRIVER: &str = "egress-bpf-seq";

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
    answers: Vec<(Vec<u8>, Vec<u8>)>,
    reporter: Reporter,
}

/// The resolver the pod asks: the source address of the frame builders
/// (`kyverno_runtime_bpf::frame`), declared to the filter.
const RESOLVER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 99, 0, 1));

/// For each domain of `cluster`, the pod's DNS question (from its port
/// 40000 to the resolver's 53) and the resolver's answer, its records the
/// domain's addresses: a question first, since only answers to questions
/// the pod asked a declared resolver teach.
fn answers(cluster: &Cluster) -> Vec<(Vec<u8>, Vec<u8>)> {
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
            let id = u16::from_be_bytes([r.bytes[0], r.bytes[1]]);
            let question = kyverno_runtime_bpf::frame::udp_datagram_to(
                40000,
                SocketAddr::new(RESOLVER, 53),
                &dnsmsg::query(id, name, dnsmsg::TYPE_A),
            );
            let answer = kyverno_runtime_bpf::frame::udp_datagram_to(53, pod, &r.bytes);
            (question, answer)
        })
        .collect()
}

impl Kernel {
    fn new(cgroup: ContainerCgroup, cluster: Cluster) -> Result<Self, String> {
        let backend = EgressEnforcer::load().map_err(|e| e.to_string())?;
        backend
            .kernel()
            .filter()
            .set_dns_resolvers(&[RESOLVER])
            .map_err(|e| e.to_string())?;
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
            reporter: Reporter::new(pod_labels()),
        })
    }

    /// The pod's frame to each address passes or drops as the model says
    /// of a connect to it, and the findings the real monitor makes of what
    /// the kernel's counters drained after it are the model's.
    fn probe_address(
        &mut self,
        policies: &[Policy],
        addr: IpAddr,
        frame: &[u8],
    ) -> Result<(), String> {
        let want = model::decide_in(&self.cluster, policies, &Event::Connect(addr));
        // What earlier frames left counted is not this one's.
        self.manager.drain().map_err(|e| format!("draining: {e}"))?;
        let dropped = self.dropped(frame)?;
        let verb = |refused| if refused { "drops" } else { "passes" };
        if dropped != want.refused {
            return Err(format!(
                "{addr}: the kernel {} it, the model {} it (its findings: {:?})",
                verb(dropped),
                verb(want.refused),
                want.findings
            ));
        }
        let drained = self.manager.drain().map_err(|e| format!("draining: {e}"))?;
        let names = self.manager.destination_names();
        // The events the daemon makes of the drained counters
        // (engine/observe.rs).
        let events = drained
            .into_iter()
            .map(|o| {
                let mut e = PlaneEvent::new(
                    "egress-observe",
                    Facts::Net {
                        dest: o.observed,
                        port: None,
                        names: names.of(o.cgroup, o.observed),
                    },
                );
                e.cgroup = Some(o.cgroup);
                e.count = o.count;
                e.kernel = Some(o.decision.into());
                e
            })
            .collect();
        let found = self.reporter.findings(events);
        let reported = reporting::reported(&want);
        if found != reported {
            return Err(format!(
                "{addr} ({} by the kernel): the findings of the drained counters are {found:?}, \
                 the model's {reported:?}",
                verb(dropped)
            ));
        }
        Ok(())
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
}

impl KernelCase for Kernel {
    /// Compiles `p` as the daemon does and upserts its network part; the
    /// monitor is given it too.
    fn apply(&mut self, p: &Policy) -> Result<(), String> {
        let (compiled, result) = userspace::compile(p).map_err(|e| e.0)?;
        let outcome = self.manager.upsert_policy(NetworkPolicy {
            id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
            name: p.name.clone(),
            mode: mode(p.mode),
            target: compiled.target.clone(),
            network: BehaviorLists::merge(&result, BehaviorKind::Network),
        });
        self.reporter.set_policy(p, &compiled, &result);
        if !outcome.rejections.is_empty() || !outcome.failures.is_empty() {
            return Err(format!("{}: network not programmed: {outcome:?}", p.name));
        }
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        let id = PolicyId::new(name.to_owned()).map_err(|e| e.to_string())?;
        self.reporter.remove_policy(name);
        match self.manager.delete_policy(&id).first() {
            Some(f) => Err(f.to_string()),
            None => Ok(()),
        }
    }

    /// The pod resolves every domain (what its set names is learned), then
    /// sends a frame to every address.
    fn probe(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        // Asked and answered one by one (each answer consumes its
        // question); the questions' own counters are drained before the
        // first frame (probe_address).
        let filter = self.manager.backend().kernel().filter();
        for (question, answer) in &self.answers {
            filter
                .test_run(question)
                .map_err(|e| format!("filter test run of a DNS question: {e}"))?;
            filter
                .test_run_snoop(answer)
                .map_err(|e| format!("snooper test run: {e}"))?;
        }
        for (addr, frame) in self.frames.clone() {
            checked.set(checked.get() + 1);
            self.probe_address(policies, addr, &frame)?;
        }
        Ok(())
    }

    /// Nothing held, and every address passes (the binding is gone). What
    /// released sets counted is taken, so it does not pile up.
    fn check_empty(&mut self) -> Result<(), String> {
        self.manager.drain().map_err(|e| e.to_string())?;
        if !self.manager.programmed().is_empty() {
            return Err(format!(
                "deleted every policy, the backend still holds {:?}",
                self.manager.programmed().keys().collect::<Vec<_>>()
            ));
        }
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
/// against [`model::decide_in`]; the kernel's counters drained after each
/// frame are made findings by the real monitor, as the daemon makes them,
/// and compared with the model's. After each set its policies are deleted
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

/// Driver (d), network: about `cases` (step, address) pairs over sequences
/// of network policy steps (add, edit, mode switch, selector change,
/// delete), each step programmed by the real manager into the real kernel
/// backend and every address then probed as [`kernel_egress`] does (the
/// kernel's verdict and the findings of its drained counters), against
/// the model over the policies then current. Same needs as
/// [`kernel_egress`].
pub fn kernel_egress_sequences(cases: u64, seed: u64) -> Run {
    run_sequences(
        SEQUENCE_DRIVER,
        cases,
        seed,
        universe::ADDRESSES.len(),
        step_of(&[Kind::Network], universe::values_of),
        |cgroup| Kernel::new(cgroup, universe::cluster()),
    )
}
