//! Driver (c): open and exec through the real kernel programs, inside a
//! `vmtest` guest (ci/differential --kernels boots one per kernel and
//! `lsm=` setting). The backend is the one the probe's plan picks (BPF-LSM
//! or fmod_ret), programmed by the real open/exec manager; every event is
//! a real `openat` or `execve` from a process in the pod's cgroup, and its
//! outcome (refused with EPERM or not) is compared with the model.
//!
//! Paths are staged files: the model decides by exact path, so any paths
//! serve, and these exist in every guest. An exec target is a copy of
//! busybox run as `true`.

use crate::model::{self, Event, Finding, Kind, Mode, Policy};
use crate::reporting::{self, Reporter};
use crate::userspace::compile;
use crate::{runner, shrunk, universe, Run, Shapes};
use kyverno_runtime_compat::{derive_plan, LiveHost, Overrides, Prober};
use kyverno_runtime_enforce::lsm::{self, LsmEnforcer};
use kyverno_runtime_enforce::openexec::{self, OpenExecManager, OpenExecPolicy, Pod};
use kyverno_runtime_enforce::PolicyId;
use kyverno_runtime_plane::{Event as PlaneEvent, Facts};
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::values::BehaviorKind;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};

/// This run's directory of staged files: made by [`stage`] (which fails
/// if it exists) and removed at the end, so nothing else is ever removed.
fn work() -> String {
    format!("/tmp/krt-differential-{}", std::process::id())
}
/// Events per generated policy set: one child process performs them all.
const EVENTS: usize = 16;

/// Files to open (a directory among them: the parent of the others).
fn files() -> Vec<String> {
    ["f/a", "f/b", "f/c", "f", "x/a"]
        .iter()
        .map(|p| format!("{}/{p}", work()))
        .collect()
}

/// Programs to execute.
fn programs() -> Vec<String> {
    ["x/a", "x/b", "x/c"]
        .iter()
        .map(|p| format!("{}/{p}", work()))
        .collect()
}

/// The staged directory, removed on drop: [`stage`] made it (it refuses
/// one that exists), so removing it removes nothing else.
struct Staged(String);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn stage() -> Result<Staged, String> {
    if !Path::new("/bin/busybox").exists() {
        return Err("no /bin/busybox (the exec target)".into());
    }
    let work = work();
    fs::create_dir(&work).map_err(|e| format!("{work}: {e}"))?;
    let staged = Staged(work.clone());
    for d in ["f", "x"] {
        fs::create_dir(format!("{work}/{d}")).map_err(|e| e.to_string())?;
    }
    for f in ["f/a", "f/b", "f/c"] {
        fs::write(format!("{work}/{f}"), f).map_err(|e| e.to_string())?;
    }
    for p in programs() {
        fs::copy("/bin/busybox", &p).map_err(|e| format!("{p}: {e}"))?;
    }
    Ok(staged)
}

/// The staged paths: programs for exec, files (and programs) for open.
fn staged(kind: Kind) -> Vec<String> {
    match kind {
        Kind::Exec => programs(),
        _ => files(),
    }
}

fn policies() -> impl Strategy<Value = Vec<Policy>> {
    universe::policies_of(&[Kind::Open, Kind::Exec], staged)
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        prop::sample::select(files()).prop_map(Event::Open),
        prop::sample::select(programs()).prop_map(Event::Exec),
    ]
}

/// The guest's side of the pod: a cgroup of its own under the cgroup v2
/// mount, removed on drop (only this directory, which it made).
struct Cgroup {
    dir: PathBuf,
    id: u64,
}

impl Cgroup {
    fn new() -> Result<Self, String> {
        let root = crate::kernel_common::cgroup2_mount()?;
        let dir = root.join(format!("krt-differential-{}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let id = fs::metadata(&dir).map_err(|e| e.to_string())?.ino();
        Ok(Cgroup { dir, id })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

type Manager = OpenExecManager<LsmEnforcer, LsmEnforcer>;

/// Programs `p` as the daemon does; the monitor, if any, is given it too.
fn apply(m: &mut Manager, p: &Policy, reporter: Option<&Reporter>) -> Result<(), String> {
    let (compiled, result) = compile(p).map_err(|e| e.0)?;
    if let Some(r) = reporter {
        r.set_policy(p, &compiled, &result);
    }
    let outcome = m.upsert_policy(OpenExecPolicy {
        id: PolicyId::new(p.name.clone()).map_err(|e| e.to_string())?,
        name: p.name.clone(),
        mode: match p.mode {
            Mode::Monitor => openexec::Mode::Monitor,
            Mode::Enforce => openexec::Mode::Enforce,
        },
        target: compiled.target.clone(),
        open: BehaviorLists::merge(&result, BehaviorKind::Open),
        exec: BehaviorLists::merge(&result, BehaviorKind::Exec),
    });
    if outcome.is_clean() {
        Ok(())
    } else {
        Err(format!("{}: not programmed: {outcome:?}", p.name))
    }
}

/// Runs `events` from a child process in `cgroup`: per event, whether it
/// was refused.
fn perform(cgroup: &Cgroup, events: &[Event]) -> Result<Vec<bool>, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let ops: Vec<String> = events
        .iter()
        .map(|e| match e {
            Event::Open(p) => format!("open:{p}"),
            Event::Exec(p) => format!("exec:{p}"),
            other => format!("unsupported:{other:?}"),
        })
        .collect();
    let out = Command::new(me)
        .arg("child")
        .arg(cgroup.dir.join("cgroup.procs"))
        .args(&ops)
        .output()
        .map_err(|e| format!("spawning the child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<bool> = text
        .lines()
        .map(|l| match l {
            "refused" => Ok(true),
            "done" => Ok(false),
            other => Err(format!("child: {other}")),
        })
        .collect::<Result<_, _>>()?;
    if got.len() != events.len() {
        return Err(format!(
            "child answered {} of {} events ({}): {}",
            got.len(),
            events.len(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(got)
}

/// The child: joins the cgroup (`procs`), performs each `op:path` and
/// prints `done`, `refused` (EPERM) or `error: ...` per op.
pub fn child(args: &[String]) -> ExitCode {
    let Some((procs, ops)) = args.split_first() else {
        println!("error: expected <cgroup.procs> <op:path>...");
        return ExitCode::FAILURE;
    };
    if let Err(e) = fs::write(procs, std::process::id().to_string()) {
        println!("error: joining {procs}: {e}");
        return ExitCode::FAILURE;
    }
    for op in ops {
        let result = match op.split_once(':') {
            Some(("open", p)) => fs::File::open(p).map(drop),
            Some(("exec", p)) => Command::new(p).arg0("true").status().and_then(|s| {
                if s.success() {
                    Ok(())
                } else {
                    Err(std::io::Error::other(format!("{p} exited {s}")))
                }
            }),
            _ => Err(std::io::Error::other(format!("unknown op {op}"))),
        };
        match result {
            Ok(()) => println!("done"),
            Err(e) if e.raw_os_error() == Some(1) => println!("refused"),
            Err(e) => println!("error: {op}: {e}"),
        }
    }
    ExitCode::SUCCESS
}

/// Every event of the staged universe: each file opened, each program
/// executed.
fn every_event() -> Vec<Event> {
    files()
        .into_iter()
        .map(Event::Open)
        .chain(programs().into_iter().map(Event::Exec))
        .collect()
}

/// The findings the real monitor makes of what the open/exec counters
/// drained, as the daemon makes them without the exec tracer
/// (engine/observe.rs; with no denial budget every refusal is counted), by
/// target path.
fn drained_findings(
    m: &mut Manager,
    reporter: &Reporter,
) -> Result<BTreeMap<String, BTreeSet<Finding>>, String> {
    let drained = m.drain();
    if let Some((behavior, e)) = drained.errors.first() {
        return Err(format!("draining {}: {e}", behavior.name()));
    }
    let events = drained
        .observations
        .into_iter()
        .map(|(behavior, o)| {
            let facts = if behavior == kyverno_runtime_compat::Behavior::Exec {
                Facts::Exec {
                    filename: o.observed,
                    argv: Vec::new(),
                }
            } else {
                Facts::Open { path: o.observed }
            };
            let mut e = PlaneEvent::new("openexec-observe", facts);
            e.cgroup = Some(o.cgroup);
            e.count = o.count;
            e.kernel = Some(o.decision.into());
            e
        })
        .collect();
    Ok(reporter.findings_by_target(events))
}

/// The model's findings of `events` by target path (an exec's include its
/// binary's open, which names the same path).
fn model_findings(policies: &[Policy], events: &[Event]) -> BTreeMap<String, BTreeSet<Finding>> {
    let mut out: BTreeMap<String, BTreeSet<Finding>> = BTreeMap::new();
    for e in events {
        let (Event::Open(p) | Event::Exec(p)) = e else {
            continue;
        };
        let found = reporting::reported(&model::decide(policies, e));
        if !found.is_empty() {
            out.entry(p.clone()).or_default().extend(found);
        }
    }
    out
}

/// Driver (d) in the guest: sequences of open/exec policy steps (add, edit,
/// mode switch, selector change, delete) on the case driver's manager;
/// after each step every staged event is performed by a process in the
/// pod's cgroup, its refusal compared with the model over the policies
/// then current, and the findings the real monitor makes of the drained
/// counters compared with the model's, by path. About `cases` (step,
/// event) pairs.
fn sequences(manager: &std::cell::RefCell<Manager>, cgroup: &Cgroup, cases: u64, seed: u64) -> Run {
    let probes = every_event();
    let shapes = Shapes::default();
    let checked = AtomicU64::new(0);
    let count = u32::try_from(cases.div_ceil(6 * probes.len() as u64)).unwrap_or(u32::MAX);
    let steps = prop::collection::vec(crate::step_of(&[Kind::Open, Kind::Exec], staged), 1..=12);
    let reporter = Reporter::new(BTreeMap::from([("app".into(), "web".into())]));
    let result = runner(seed ^ 0x5e9, count).run(&steps, |steps| {
        let mut m = manager.borrow_mut();
        let mut current: BTreeMap<String, Policy> = BTreeMap::new();
        let outcome = (|| -> Result<(), String> {
            // What the case driver left counted is not this sequence's.
            drained_findings(&mut m, &reporter)?;
            for (i, s) in steps.iter().enumerate() {
                match s {
                    crate::Step::Apply(p) => {
                        current.insert(p.name.clone(), p.clone());
                        apply(&mut m, p, Some(&reporter))?;
                    }
                    crate::Step::Delete(n) => {
                        reporter.remove_policy(n);
                        if current.remove(n).is_some() {
                            let id = PolicyId::new(n.clone()).map_err(|e| e.to_string())?;
                            let failures = m.delete_policy(&id);
                            if !failures.is_empty() {
                                return Err(format!("deleting {n}: {failures:?}"));
                            }
                        }
                    }
                }
                let policies: Vec<Policy> = current.values().cloned().collect();
                shapes.tally(&policies);
                let got = perform(cgroup, &probes)?;
                for (e, refused) in probes.iter().zip(got) {
                    checked.fetch_add(1, Ordering::Relaxed);
                    let want = model::decide(&policies, e).refused;
                    if refused != want {
                        return Err(format!(
                            "after step {i} ({}): {e:?}: the kernel refused={refused}, the \
                             model refused={want}",
                            s.describe()
                        ));
                    }
                }
                let found = drained_findings(&mut m, &reporter)?;
                let want = model_findings(&policies, &probes);
                if found != want {
                    return Err(format!(
                        "after step {i} ({}): the findings of the drained counters are \
                         {found:?}, the model's {want:?}",
                        s.describe()
                    ));
                }
            }
            Ok(())
        })();
        // The next sequence starts from no policy.
        for n in current.keys() {
            reporter.remove_policy(n);
            if let Ok(id) = PolicyId::new(n.clone()) {
                let _ = m.delete_policy(&id);
            }
        }
        outcome.map_err(TestCaseError::fail)
    });
    Run {
        driver: "openexec-vm-seq",
        cases: checked.load(Ordering::Relaxed),
        disagreement: result.err().map(shrunk),
        shapes,
        case: None,
    }
}

/// Drivers (c) and (d), in the guest: `cases` (policy set, event) pairs
/// through the kernel backend the plan picks, then about `cases` (step,
/// event) pairs of sequences on it. Returns the backend's name with the
/// runs.
pub fn guest(cases: u64, seed: u64) -> (String, Vec<Run>) {
    let shapes = Shapes::default();
    let checked = AtomicU64::new(0);
    // Both drivers' lines, so the host counts each configuration's two.
    let cannot = |why: String, shapes| {
        let run = |driver, shapes| Run {
            driver,
            cases: 0,
            disagreement: Some(format!("cannot run: {why}")),
            shapes,
            case: None,
        };
        (
            "-".to_owned(),
            vec![
                run("openexec-vm", shapes),
                run("openexec-vm-seq", Shapes::default()),
            ],
        )
    };
    let staged = match stage() {
        Ok(s) => s,
        Err(e) => return cannot(e, shapes),
    };
    let plan = derive_plan(Prober::new(LiveHost).measurements(), &Overrides::default());
    let loaded = match lsm::load_planned(plan.open.backend, None) {
        Ok(l) => l,
        Err(e) => return cannot(e.to_string(), shapes),
    };
    let backend = loaded.hooks.name().to_owned();
    let mut manager = match OpenExecManager::new(loaded.open, loaded.exec) {
        Ok(m) => m,
        Err(e) => return cannot(e.to_string(), shapes),
    };
    manager.reconcile_adopted(&Default::default());
    let cgroup = match Cgroup::new() {
        Ok(c) => c,
        Err(e) => return cannot(e, shapes),
    };
    let failures = manager.upsert_pod(Pod {
        uid: "pod-uid".into(),
        namespace: "default".into(),
        name: "web".into(),
        labels: BTreeMap::from([("app".into(), "web".into())]),
        namespace_labels: BTreeMap::new(),
        cgroups: vec![cgroup.id],
    });
    if !failures.is_empty() {
        return cannot(format!("the pod: {failures:?}"), shapes);
    }
    let sets = u32::try_from(cases.div_ceil(EVENTS as u64)).unwrap_or(u32::MAX);
    let mut r = runner(seed, sets);
    let strategy = (policies(), prop::collection::vec(event(), EVENTS));
    // The runner takes a `Fn`: the manager is borrowed per case.
    let cell = std::cell::RefCell::new(manager);
    let result = r.run(&strategy, |(policies, events)| {
        shapes.tally(&policies);
        let mut m = cell.borrow_mut();
        let outcome = (|| -> Result<Option<String>, String> {
            for p in &policies {
                apply(&mut m, p, None)?;
            }
            let got = perform(&cgroup, &events)?;
            let mut wrong = None;
            for (e, refused) in events.iter().zip(got) {
                checked.fetch_add(1, Ordering::Relaxed);
                let want = model::decide(&policies, e).refused;
                if refused != want && wrong.is_none() {
                    wrong = Some(format!(
                        "{e:?}: the kernel refused={refused}, the model refused={want}"
                    ));
                }
            }
            Ok(wrong)
        })();
        // The next case starts from no policy (removal is checked too:
        // a stale entry would show in the next case).
        for p in &policies {
            if let Ok(id) = PolicyId::new(p.name.clone()) {
                let _ = m.delete_policy(&id);
            }
        }
        match outcome {
            Ok(None) => Ok(()),
            Ok(Some(d)) => Err(TestCaseError::fail(d)),
            Err(e) => Err(TestCaseError::fail(format!("setup: {e}"))),
        }
    });
    let cases_run = Run {
        driver: "openexec-vm",
        cases: checked.load(Ordering::Relaxed),
        disagreement: result.err().map(shrunk),
        shapes,
        case: None,
    };
    let sequences_run = sequences(&cell, &cgroup, cases, seed);
    drop(cell);
    drop(cgroup);
    drop(staged);
    (backend, vec![cases_run, sequences_run])
}
