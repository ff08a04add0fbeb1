//! What the kernel drivers share: the scratch cgroup the driver process
//! moves into (a test-run packet's cgroup is the caller's), the pod on it,
//! the run's bookkeeping, and the two ways a product is driven: cases (a
//! policy set programmed, probed, deleted) and sequences (add, edit, mode
//! switch, selector change and delete steps, probed after each).

use crate::model::{Event, Mode, Policy};
use crate::reporting::POD_UID;
use crate::{runner, shrunk, Run, Shapes, Step};
use kyverno_runtime_enforce::egress::{ContainerCgroup, NetworkPod};
use kyverno_runtime_enforce::openexec;
use proptest::strategy::Strategy;
use proptest::test_runner::{TestCaseError, TestError};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// A kernel driver's product: the real manager over the real kernel
/// program, one pod on the scratch cgroup.
pub(crate) trait KernelCase {
    /// Programs `p` as the daemon does: adds it, or replaces the policy of
    /// its name (an edit of its lists, mode or selector).
    fn apply(&mut self, p: &Policy) -> Result<(), String>;

    /// Deletes the policy named `name` (nothing if there is none).
    fn delete(&mut self, name: &str) -> Result<(), String>;

    /// Checks every event of the driver's kind against the model over
    /// `policies` (what is programmed now): the kernel's decision, and the
    /// findings; counts each event checked.
    fn probe(&mut self, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String>;

    /// With every policy deleted: nothing is held, attached or decided any
    /// more (a stale entry shows here).
    fn check_empty(&mut self) -> Result<(), String>;
}

/// Deletes each of `names`, every one even after a failure (the first is
/// returned).
fn delete_all<'a, K: KernelCase>(
    k: &mut K,
    names: impl IntoIterator<Item = &'a String>,
) -> Result<(), String> {
    let mut first = Ok(());
    for n in names {
        if let Err(e) = k.delete(n) {
            if first.is_ok() {
                first = Err(format!("deleting {n}: {e}"));
            }
        }
    }
    first
}

/// One case: programs `policies`, probes, deletes them (also after a
/// failed probe, so the next case starts from nothing) and checks that
/// nothing is left.
fn case<K: KernelCase>(k: &mut K, policies: &[Policy], checked: &Cell<u64>) -> Result<(), String> {
    let probed = policies
        .iter()
        .try_for_each(|p| k.apply(p))
        .and_then(|()| k.probe(policies, checked));
    let deleted = delete_all(k, policies.iter().map(|p| &p.name));
    probed?;
    deleted?;
    k.check_empty()
}

/// One sequence: each step applied, then every event probed against the
/// model over the policies then current (no stale entry, no gap); at the
/// end the policies left are deleted and nothing may be left.
fn sequence<K: KernelCase>(
    k: &mut K,
    steps: &[Step],
    checked: &Cell<u64>,
    shapes: &Shapes,
) -> Result<(), String> {
    let mut current: BTreeMap<String, Policy> = BTreeMap::new();
    let mut run = || -> Result<(), String> {
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Apply(p) => {
                    k.apply(p)?;
                    current.insert(p.name.clone(), p.clone());
                }
                Step::Delete(n) => {
                    if current.remove(n).is_some() {
                        k.delete(n)?;
                    }
                }
            }
            let policies: Vec<Policy> = current.values().cloned().collect();
            shapes.tally(&policies);
            k.probe(&policies, checked)
                .map_err(|e| format!("after step {i} ({}): {e}", s.describe()))?;
        }
        Ok(())
    };
    let result = run();
    let deleted = delete_all(k, current.keys());
    result?;
    deleted?;
    k.check_empty()
}

/// Runs a kernel driver: moves into the scratch cgroup, builds the
/// product on it (`build`), runs about `cases` (policy set, event) pairs
/// of `policies` (`per_set` events each), then takes the product down
/// (its links detach) before leaving the cgroup. `every` is the event
/// list a disagreement's replay scenario probes.
pub(crate) fn run_driver<K: KernelCase>(
    driver: &'static str,
    cases: u64,
    seed: u64,
    per_set: usize,
    policies: impl Strategy<Value = Vec<Policy>>,
    every: Vec<Event>,
    build: impl FnOnce(ContainerCgroup) -> Result<K, String>,
) -> Run {
    let (scratch, kernel) = match enter(driver, build) {
        Ok(entered) => entered,
        Err(run) => return *run,
    };
    let sets = u32::try_from(cases.div_ceil(per_set.max(1) as u64)).unwrap_or(u32::MAX);
    let checked = Cell::new(0u64);
    let shapes = Shapes::default();
    let result = runner(seed, sets).run(&policies, |policies| {
        shapes.tally(&policies);
        case(&mut *kernel.borrow_mut(), &policies, &checked).map_err(TestCaseError::fail)
    });
    // The links go (detach) before the cgroup does.
    drop(kernel);
    drop(scratch);
    finish(driver, checked.get(), shapes, result, every)
}

/// Runs a kernel driver on sequences of `steps` (1 to 12 each): as
/// [`run_driver`], about `cases` (step, event) pairs, `per_step` events
/// probed after each step. A disagreement is printed shrunk to a minimal
/// sequence (no replay scenario: a scenario is one policy set).
pub(crate) fn run_sequences<K: KernelCase>(
    driver: &'static str,
    cases: u64,
    seed: u64,
    per_step: usize,
    steps: impl Strategy<Value = Step>,
    build: impl FnOnce(ContainerCgroup) -> Result<K, String>,
) -> Run {
    let (scratch, kernel) = match enter(driver, build) {
        Ok(entered) => entered,
        Err(run) => return *run,
    };
    // A sequence probes about 6 steps.
    let sequences = u32::try_from(cases.div_ceil(6 * per_step.max(1) as u64)).unwrap_or(u32::MAX);
    let checked = Cell::new(0u64);
    let shapes = Shapes::default();
    let result =
        runner(seed ^ 0x5e9, sequences).run(&proptest::collection::vec(steps, 1..=12), |steps| {
            sequence(&mut *kernel.borrow_mut(), &steps, &checked, &shapes)
                .map_err(TestCaseError::fail)
        });
    drop(kernel);
    drop(scratch);
    Run {
        driver,
        cases: checked.get(),
        disagreement: result.err().map(shrunk),
        shapes,
        case: None,
    }
}

/// Moves into the scratch cgroup and builds the product on it; a run that
/// says why when either cannot be done. The caller drops the product
/// before the scratch cgroup (its links detach first).
fn enter<K>(
    driver: &'static str,
    build: impl FnOnce(ContainerCgroup) -> Result<K, String>,
) -> Result<(Scratch, RefCell<K>), Box<Run>> {
    let scratch = Scratch::enter(driver).map_err(|why| Box::new(cannot_run(driver, why)))?;
    match scratch.container().and_then(build) {
        Ok(k) => Ok((scratch, RefCell::new(k))),
        Err(why) => Err(Box::new(cannot_run(driver, why))),
    }
}

/// A driver that cannot run here (not root, no cgroup v2, no program).
fn cannot_run(driver: &'static str, why: String) -> Run {
    Run {
        driver,
        cases: 0,
        disagreement: Some(format!("cannot run: {why}")),
        shapes: Shapes::default(),
        case: None,
    }
}

/// A kernel driver's run from the runner's result: the shrunk policies of
/// a disagreement, with `every` event of the universe for its replay.
fn finish(
    driver: &'static str,
    cases: u64,
    shapes: Shapes,
    result: Result<(), TestError<Vec<Policy>>>,
    every: Vec<Event>,
) -> Run {
    let case = match &result {
        Err(TestError::Fail(_, policies)) => Some((policies.clone(), every)),
        _ => None,
    };
    Run {
        driver,
        cases,
        disagreement: result.err().map(shrunk),
        shapes,
        case,
    }
}

/// The mount point of the cgroup2 filesystem, by the probe's mountinfo
/// parser.
pub(crate) fn cgroup2_mount() -> Result<PathBuf, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    kyverno_runtime_compat::parse_mountinfo(&mountinfo)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
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

/// This process moved into a child cgroup it created; on drop moved back
/// and that directory (only it) removed.
pub(crate) struct Scratch {
    driver: &'static str,
    original: PathBuf,
    /// The child cgroup's directory.
    pub(crate) child: PathBuf,
    moved: bool,
}

impl Scratch {
    /// Creates `krt-differential-<driver>-<pid>` under the cgroup2 mount
    /// and moves this process into it.
    pub(crate) fn enter(driver: &'static str) -> Result<Self, String> {
        let mount = cgroup2_mount()?;
        let original = own_cgroup_dir(&mount)?;
        let child = mount.join(format!("krt-differential-{driver}-{}", std::process::id()));
        // An existing directory is not ours (or a leftover with links in
        // it): refused, never removed.
        fs::create_dir(&child).map_err(|e| format!("mkdir {}: {e}", child.display()))?;
        let mut guard = Self {
            driver,
            original,
            child,
            moved: false,
        };
        let procs = guard.child.join("cgroup.procs");
        fs::write(&procs, std::process::id().to_string())
            .map_err(|e| format!("joining {}: {e}", procs.display()))?;
        guard.moved = true;
        // Elsewhere the frames would carry another cgroup's id and pass
        // ungated: refuse to run rather than report a wrong disagreement.
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

    /// The child as a pod's container cgroup: its id is its directory's
    /// inode (what `bpf_skb_cgroup_id` returns).
    pub(crate) fn container(&self) -> Result<ContainerCgroup, String> {
        let id = fs::metadata(&self.child)
            .map(|m| m.ino())
            .map_err(|e| format!("stat {}: {e}", self.child.display()))?;
        Ok(ContainerCgroup {
            id,
            path: self.child.clone(),
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.moved {
            let procs = self.original.join("cgroup.procs");
            if let Err(e) = fs::write(&procs, std::process::id().to_string()) {
                eprintln!(
                    "{}: cannot move back to {}: {e}",
                    self.driver,
                    procs.display()
                );
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
            eprintln!(
                "{}: cannot remove {}: {e}",
                self.driver,
                self.child.display()
            );
        }
    }
}

/// The labels of the pod: exactly the policies with `selects` select it
/// (see `userspace::spec`).
pub(crate) fn pod_labels() -> BTreeMap<String, String> {
    [("app".to_owned(), "web".to_owned())].into()
}

/// The pod on the scratch cgroup, labelled with [`pod_labels`].
pub(crate) fn pod(cgroup: ContainerCgroup) -> NetworkPod {
    NetworkPod {
        uid: POD_UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        labels: pod_labels(),
        namespace_labels: BTreeMap::new(),
        cgroups: vec![cgroup],
    }
}

/// The product's mode of a model policy.
pub(crate) fn mode(m: Mode) -> openexec::Mode {
    match m {
        Mode::Monitor => openexec::Mode::Monitor,
        Mode::Enforce => openexec::Mode::Enforce,
    }
}
