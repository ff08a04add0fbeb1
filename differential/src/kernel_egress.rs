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

use crate::model::{self, Cluster, Event, Kind, Mode, Policy};
use crate::{universe, userspace, Run, Shapes};
use kyverno_runtime_api::runtimepolicy::RuntimePolicySpec;
use kyverno_runtime_enforce::egress::{
    ContainerCgroup, EgressEnforcer, EgressManager, KernelEgress, NetworkPod, NetworkPolicy,
};
use kyverno_runtime_enforce::names::ServiceName;
use kyverno_runtime_enforce::openexec;
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::values::BehaviorKind;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The driver's name, as `Run.driver` reports it.
const DRIVER: &str = "egress-bpf";

/// `BPF_PROG_TEST_RUN`'s return value for a dropped packet.
const DROP: u32 = 0;

const POD_UID: &str = "pod-uid";

// ---- cases --------------------------------------------------------------------------

/// 1 to 8 policies of network behaviors only, from the universe's values.
pub fn network_policies() -> impl Strategy<Value = Vec<Policy>> {
    universe::policies_of(&[Kind::Network], universe::values_of)
}

// ---- the scratch cgroup -------------------------------------------------------------

/// The mount point of the first cgroup2 filesystem (field 5 of a
/// mountinfo line whose filesystem type, after " - ", is cgroup2).
fn cgroup2_mount() -> Result<PathBuf, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .ok_or_else(|| "no cgroup2 mount in /proc/self/mountinfo".to_owned())
}

/// This process's cgroup v2 directory: the `0::PATH` line of
/// /proc/self/cgroup under the mount.
fn own_cgroup_dir(mount: &Path) -> Result<PathBuf, String> {
    let cgroups = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| "no cgroup v2 line (0::PATH) in /proc/self/cgroup".to_owned())?;
    Ok(mount.join(path.trim_start_matches('/')))
}

/// A cgroup v2 id: the inode number of its directory (what
/// `bpf_skb_cgroup_id` returns).
fn cgroup_id(dir: &Path) -> Result<u64, String> {
    fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|e| format!("stat {}: {e}", dir.display()))
}

/// This process moved into a child cgroup it created; on drop moved back
/// and that directory (only it) removed.
struct Scratch {
    original: PathBuf,
    child: PathBuf,
    moved: bool,
}

impl Scratch {
    fn enter() -> Result<Self, String> {
        let mount = cgroup2_mount()?;
        let original = own_cgroup_dir(&mount)?;
        let child = mount.join(format!("krt-differential-{}", std::process::id()));
        // An existing directory is not ours (or a leftover with links in
        // it): refused, never removed.
        fs::create_dir(&child).map_err(|e| format!("mkdir {}: {e}", child.display()))?;
        let mut guard = Self {
            original,
            child,
            moved: false,
        };
        let procs = guard.child.join("cgroup.procs");
        fs::write(&procs, std::process::id().to_string())
            .map_err(|e| format!("joining {}: {e}", procs.display()))?;
        guard.moved = true;
        // Without this the frames would carry another cgroup's id and
        // every packet would pass unfiltered: refuse to run rather than
        // report the wrong disagreement.
        let now = own_cgroup_dir(&mount)?;
        if now != guard.child {
            return Err(format!(
                "moved into {}, but /proc/self/cgroup says {}",
                guard.child.display(),
                now.display()
            ));
        }
        Ok(guard)
    }

    fn id(&self) -> Result<u64, String> {
        cgroup_id(&self.child)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.moved {
            let procs = self.original.join("cgroup.procs");
            if let Err(e) = fs::write(&procs, std::process::id().to_string()) {
                eprintln!("egress-bpf: cannot move back to {}: {e}", procs.display());
            }
        }
        // A just-emptied cgroup can refuse rmdir for a moment (EBUSY).
        let mut last = None;
        for _ in 0..50 {
            match fs::remove_dir(&self.child) {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let Some(e) = last {
            eprintln!("egress-bpf: cannot remove {}: {e}", self.child.display());
        }
    }
}

// ---- the product --------------------------------------------------------------------

/// The manager over the kernel backend, one pod on the scratch cgroup, and
/// a frame to every address of the universe.
struct Kernel {
    manager: EgressManager<EgressEnforcer<KernelEgress>>,
    cluster: Cluster,
    frames: Vec<(IpAddr, Vec<u8>)>,
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
        let failures = manager.upsert_pod(NetworkPod {
            uid: POD_UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            namespace_labels: BTreeMap::new(),
            cgroups: vec![cgroup],
        });
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
            cluster,
            frames,
        })
    }

    /// Compiles `p` as the daemon does and upserts its network part.
    fn apply(&mut self, p: &Policy) -> Result<(), String> {
        let spec: RuntimePolicySpec = serde_json::from_value(userspace::spec(p))
            .map_err(|e| format!("{}: the spec does not parse: {e}", p.name))?;
        let compiled = CompiledPolicy::compile(&spec).map_err(|e| {
            format!(
                "{}: the compiler refused a valid policy: {}",
                p.name,
                joined(e)
            )
        })?;
        let result = compiled
            .evaluate()
            .map_err(|e| format!("{}: evaluation failed: {}", p.name, joined(e)))?;
        let outcome = self.manager.upsert_policy(NetworkPolicy {
            id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
            name: p.name.clone(),
            mode: match p.mode {
                Mode::Monitor => openexec::Mode::Monitor,
                Mode::Enforce => openexec::Mode::Enforce,
            },
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

    fn check(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
        for p in policies {
            self.apply(p)?;
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

/// Errors as one line.
fn joined<E: std::fmt::Display>(errors: Vec<E>) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn cannot_run(why: String) -> Run {
    Run {
        driver: DRIVER,
        cases: 0,
        disagreement: Some(format!("cannot run: {why}")),
        shapes: Shapes::default(),
        case: None,
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
    let scratch = match Scratch::enter() {
        Ok(s) => s,
        Err(why) => return cannot_run(why),
    };
    let cgroup = match scratch.id() {
        Ok(id) => ContainerCgroup {
            id,
            path: scratch.child.clone(),
        },
        Err(why) => return cannot_run(why),
    };
    let kernel = match Kernel::new(cgroup, universe::cluster()) {
        Ok(k) => RefCell::new(k),
        Err(why) => return cannot_run(why),
    };
    let per_set = universe::ADDRESSES.len().max(1) as u64;
    let sets = u32::try_from(cases.div_ceil(per_set)).unwrap_or(u32::MAX);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: sets,
            failure_persistence: None,
            // Enough steps to shrink 8 policies to the few that disagree.
            max_shrink_iters: 4096,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let checked = Cell::new(0u64);
    let shapes = Shapes::default();
    let result = runner.run(&network_policies(), |policies| {
        shapes.tally(&policies);
        kernel
            .borrow_mut()
            .case(&policies, &checked)
            .map_err(TestCaseError::fail)
    });
    // The links go (detach) before the cgroup does.
    drop(kernel);
    drop(scratch);
    // The replay scenario of a disagreement probes every address.
    let every: Vec<Event> = universe::ADDRESSES
        .iter()
        .filter_map(|a| a.parse().ok().map(Event::Connect))
        .collect();
    let (disagreement, case) = match result.err() {
        Some(TestError::Fail(why, value)) => (
            Some(format!("{why}\n  minimal case: {value:#?}")),
            Some((value, every)),
        ),
        Some(TestError::Abort(why)) => (Some(format!("aborted: {why}")), None),
        None => (None, None),
    };
    Run {
        driver: DRIVER,
        cases: checked.get(),
        disagreement,
        shapes,
        case,
    }
}
