//! Open/exec enforcement in a real kernel, through the manager API.
//!
//! Runs inside a `vmtest` guest (ci/test boots it on 5.10, 6.1, 6.12 and
//! 7.x, each with and without `bpf` in `lsm=`): it picks the backend the
//! probe's plan chooses, creates container cgroups, programs policies
//! through [`OpenExecManager`], performs opens and execs from inside and
//! outside those cgroups (as child processes that move themselves into a
//! cgroup first), and asserts each outcome. `openexec_vm bench` prints the
//! cost of open() and execve() with 0, 1, 16 and 64 policies.
//!
//! Needs root, a cgroup v2 mount, bpffs and a static busybox at
//! `/bin/busybox` (the exec target: a static binary has no ELF interpreter
//! to allow). A libtest harness would run the cases on threads; this is one
//! process that forks children, so it has its own `main`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kyverno_runtime_bpf::openexec::{self, Dimension as KDim, Hooks, OpenExec};
use kyverno_runtime_compat::{derive_plan, LiveHost, Overrides, Prober};
use kyverno_runtime_enforce::lsm::{self, LsmEnforcer};
use kyverno_runtime_enforce::openexec::{
    BehaviorLists, Mode, OpenExecManager, OpenExecPolicy, Pod,
};
use kyverno_runtime_enforce::{Decision, Enforcer, PolicyId};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::FieldPath;

#[path = "openexec_vm/transitions.rs"]
mod transitions;

type Manager = OpenExecManager<LsmEnforcer, LsmEnforcer>;

/// Exit codes of the child.
const CHILD_OK: u8 = 0;
const CHILD_REFUSED: u8 = 13;
const CHILD_ERROR: u8 = 2;

const WORK: &str = "/tmp/krt-openexec";
/// Denied opens of the rate-limit case.
const STORM: usize = 100_000;
const PINS: &str = "/sys/fs/bpf/krt-openexec-test";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("child") => child(&args[1..]),
        Some("exit0") => ExitCode::SUCCESS,
        Some("bench") => bench(),
        _ => cases(args.first().map(String::as_str)),
    }
}

// ---------------------------------------------------------------- child

/// `child <cgroup.procs|-> open|exec <path>`: moves into the cgroup, does
/// the operation, and exits 0 (done), 13 (EPERM) or 2 (anything else).
fn child(args: &[String]) -> ExitCode {
    let [procs, op, path] = args else {
        eprintln!("child: expected <procs> <op> <path>");
        return ExitCode::from(CHILD_ERROR);
    };
    if procs != "-" {
        if let Err(e) = fs::write(procs, std::process::id().to_string()) {
            eprintln!("child: joining {procs}: {e}");
            return ExitCode::from(CHILD_ERROR);
        }
    }
    let result = match op.as_str() {
        "open" => fs::File::open(path).map(drop),
        // `execve`: this process itself execs (no fork), so the attempt is
        // made by the pid the parent knows.
        "execve" => Err(Command::new(path).arg0("true").exec()),
        // `open-storm`: STORM opens, each of which must be refused.
        "open-storm" => (0..STORM)
            .map(|_| fs::File::open(path).map(drop))
            .find(|r| r.as_ref().err().and_then(std::io::Error::raw_os_error) != Some(libc_eperm()))
            .unwrap_or_else(|| Err(std::io::Error::from_raw_os_error(libc_eperm()))),
        // `open-each`: opens `path/0` .. `path/N-1`, `N` the last
        // component's `.N` suffix (`/dir.17000`): one distinct path each.
        "open-each" => open_each(path),
        "exec" => exec_status(path).and_then(|ok| {
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::other("the program failed"))
            }
        }),
        other => Err(std::io::Error::other(format!("unknown op {other}"))),
    };
    match result {
        Ok(()) => ExitCode::from(CHILD_OK),
        Err(e) if e.raw_os_error() == Some(libc_eperm()) => ExitCode::from(CHILD_REFUSED),
        Err(e) => {
            eprintln!("child: {op} {path}: {e}");
            ExitCode::from(CHILD_ERROR)
        }
    }
}

fn open_each(dir: &str) -> std::io::Result<()> {
    let n: u32 = dir
        .rsplit_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .ok_or_else(|| std::io::Error::other("open-each: no .N suffix"))?;
    for i in 0..n {
        fs::File::open(format!("{dir}/{i}"))?;
    }
    Ok(())
}

fn libc_eperm() -> i32 {
    1
}

/// Runs an exec target: a busybox copy as `true`, or a copy of this binary
/// with `exit0`.
fn exec_status(path: &str) -> std::io::Result<bool> {
    let mut cmd = Command::new(path);
    if path.contains("/dyn") {
        cmd.arg("exit0");
    } else {
        cmd.arg0("true");
    }
    cmd.status().map(|s| s.success())
}

// ---------------------------------------------------------------- fixtures

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    Refused,
}

struct Cgroup {
    dir: PathBuf,
    id: u64,
}

impl Cgroup {
    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }

    /// A cgroup inside this one (a container's inside its pod's).
    fn child(&self, name: &str) -> Cgroup {
        let dir = self.dir.join(name);
        fs::create_dir_all(&dir).unwrap();
        let id = fs::metadata(&dir).unwrap().ino();
        Cgroup { dir, id }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

struct Env {
    root: PathBuf,
    me: PathBuf,
    hooks: Hooks,
    fallback: Option<String>,
    counter: std::cell::Cell<u32>,
}

fn cgroup2_root() -> PathBuf {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mounts.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        if post.starts_with("cgroup2 ") {
            if let Some(mp) = pre.split(' ').nth(4) {
                return PathBuf::from(mp);
            }
        }
    }
    panic!("no cgroup2 mount");
}

impl Env {
    fn cgroup(&self, name: &str) -> Cgroup {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        let dir = self.root.join(format!("krt-{name}-{n}"));
        fs::create_dir_all(&dir).unwrap();
        let id = fs::metadata(&dir).unwrap().ino();
        Cgroup { dir, id }
    }

    fn run(&self, cg: Option<&Cgroup>, op: &str, path: &str) -> Result<Outcome, String> {
        let procs = cg.map_or_else(|| "-".to_owned(), Cgroup::procs);
        let out = Command::new(&self.me)
            .args(["child", &procs, op, path])
            .output()
            .map_err(|e| format!("spawning the child: {e}"))?;
        match out.status.code().and_then(|c| u8::try_from(c).ok()) {
            Some(CHILD_OK) => Ok(Outcome::Done),
            Some(CHILD_REFUSED) => Ok(Outcome::Refused),
            _ => Err(format!(
                "{op} {path}: child failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }

    fn manager(&self, pins: Option<&Path>) -> Manager {
        let (open, exec) = lsm::load(self.hooks, pins).unwrap();
        OpenExecManager::new(open, exec).unwrap()
    }
}

fn file(name: &str) -> String {
    format!("{WORK}/files/{name}")
}

fn bin(name: &str) -> String {
    format!("{WORK}/bin/{name}")
}

fn setup_files(me: &Path) {
    let _ = fs::remove_dir_all(WORK);
    fs::create_dir_all(format!("{WORK}/files")).unwrap();
    fs::create_dir_all(format!("{WORK}/bin")).unwrap();
    for f in ["secret", "public", "other", "a", "b", "c", "bench"] {
        fs::write(file(f), f).unwrap();
    }
    for b in ["denied", "allowed", "other", "a", "b", "c"] {
        fs::copy("/bin/busybox", bin(b)).unwrap();
    }
    // A dynamically linked target: its ELF interpreter is opened for
    // execution too, which must not count as an exec.
    fs::copy(me, bin("dyn")).unwrap();
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn target(app: &str) -> PodTarget {
    let sel = LabelSelector {
        match_labels: Some(labels(&[("app", app)])),
        ..LabelSelector::default()
    };
    PodTarget::compile(Some(&sel), None, &FieldPath::spec()).unwrap()
}

fn lists(kind: &str, allow: &[&str], deny: &[&str]) -> BehaviorLists {
    BehaviorLists {
        field: FieldPath::spec().field("behaviors").index(0).field(kind),
        allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        deny: deny.iter().map(|s| (*s).to_owned()).collect(),
    }
}

struct PolicyBuilder(OpenExecPolicy);

fn policy(id: &str, app: &str, mode: Mode) -> PolicyBuilder {
    PolicyBuilder(OpenExecPolicy {
        id: PolicyId::new(id).unwrap(),
        name: id.to_owned(),
        mode,
        target: target(app),
        open: None,
        exec: None,
    })
}

impl PolicyBuilder {
    fn open(mut self, allow: &[&str], deny: &[&str]) -> Self {
        self.0.open = Some(lists("open", allow, deny));
        self
    }
    fn exec(mut self, allow: &[&str], deny: &[&str]) -> Self {
        self.0.exec = Some(lists("exec", allow, deny));
        self
    }
    fn apply(self, m: &mut Manager) {
        let outcome = m.upsert_policy(self.0);
        assert!(
            outcome.is_clean(),
            "policy not applied cleanly: {outcome:?}"
        );
    }
}

fn pod(uid: &str, app: &str, cgroups: &[&Cgroup]) -> Pod {
    Pod {
        uid: uid.to_owned(),
        namespace: "default".to_owned(),
        name: uid.to_owned(),
        labels: labels(&[("app", app)]),
        namespace_labels: BTreeMap::new(),
        cgroups: cgroups.iter().map(|c| c.id).collect(),
    }
}

fn add_pod(m: &mut Manager, p: Pod) {
    let failures = m.upsert_pod(p);
    assert!(failures.is_empty(), "pod not bound: {failures:?}");
}

/// Asserts outcomes, collecting every mismatch into one message.
struct Expect<'a> {
    env: &'a Env,
    errors: Vec<String>,
}

impl<'a> Expect<'a> {
    fn new(env: &'a Env) -> Self {
        Self {
            env,
            errors: Vec::new(),
        }
    }

    fn case(&mut self, what: &str, cg: Option<&Cgroup>, op: &str, path: &str, want: Outcome) {
        let result = self.env.run(cg, op, path);
        if std::env::var_os("KRT_VERBOSE").is_some() {
            let who = cg.map_or_else(
                || "outside any pod".to_owned(),
                |c| format!("in {}", c.dir.display()),
            );
            let got = match &result {
                Ok(Done) => "done".to_owned(),
                Ok(Refused) => "refused: EPERM".to_owned(),
                Err(e) => format!("error: {e}"),
            };
            println!("      {what}: {op} {path} {who} -> {got}");
        }
        match result {
            Ok(got) if got == want => {}
            Ok(got) => self
                .errors
                .push(format!("{what}: {op} {path}: want {want:?}, got {got:?}")),
            Err(e) => self.errors.push(format!("{what}: {e}")),
        }
    }

    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.errors.push(what.into());
        }
    }

    fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors.join("\n      "))
        }
    }
}

use Outcome::{Done, Refused};

// ---------------------------------------------------------------- cases

type Case = fn(&Env) -> Result<(), String>;

const CASES: &[(&str, Case)] = &[
    ("exec_deny_selected_cgroup_only", exec_deny_selected_only),
    ("open_deny_selected_cgroup_only", open_deny_selected_only),
    ("default_deny_with_allow_list", default_deny_allow_list),
    ("two_policies_union", two_policies_union),
    (
        "a_deny_in_one_behavior_beats_another_behaviors_allow",
        deny_beside_default_deny,
    ),
    ("monitor_counts_without_blocking", monitor_counts),
    ("update_and_delete_take_effect", update_and_delete),
    ("unbinding_restores_access", unbinding_restores),
    ("mode_change_rebuilds", mode_change_rebuilds),
    (
        "open_deny_refuses_exec_and_ld_so_is_no_exec",
        exec_chain_semantics,
    ),
    (
        "unselected_cgroup_costs_one_lookup",
        unselected_costs_nothing,
    ),
    (
        "bind_mounted_file_is_named_by_its_mountpoint",
        bind_mount_named_by_mountpoint,
    ),
    (
        "restart_adopts_pins_and_leaves_no_stale_entries",
        restart_no_stale,
    ),
    (
        "a_refusal_is_recorded_once_per_attempt_with_pid_and_comm",
        denial_records,
    ),
    (
        "a_storm_of_refusals_is_rate_limited_and_every_one_counted",
        denial_storm,
    ),
    (
        "the_exec_tracer_reports_the_paths_the_exec_programs_resolved",
        tracer_resolved_paths,
    ),
    (
        "a_full_observation_map_counts_what_it_could_not_hold",
        observation_map_full,
    ),
    (
        "a_failed_update_then_a_shrink_leaves_exactly_the_spec",
        transitions::failed_update_then_shrink,
    ),
    (
        "an_observe_slots_leftover_bits_are_cleared_on_adoption",
        transitions::an_observe_slots_leftover_bits_are_cleared_on_adoption,
    ),
    (
        "a_container_not_bound_yet_is_decided_by_its_pods_directory",
        pod_directory_fallback,
    ),
    (
        "through_its_pods_directory_a_container_is_decided_and_counted_as_if_bound",
        pod_directory_fallback_as_bound,
    ),
];

fn cases(only: Option<&str>) -> ExitCode {
    let env = match prepare() {
        Ok(env) => env,
        Err(e) => {
            println!("openexec_vm: cannot run: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "openexec_vm: kernel {} backend={}{}",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        env.hooks.name(),
        env.fallback
            .as_ref()
            .map(|r| format!(" (fallback: {r})"))
            .unwrap_or_default()
    );
    let mut failed = 0;
    let mut ran = 0;
    for (name, case) in CASES {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        ran += 1;
        let started = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&env)))
            .unwrap_or_else(|p| Err(format!("panicked: {p:?}")));
        match result {
            Ok(()) => println!("ok   {name} ({:.1}s)", started.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("FAIL {name}:\n      {e}");
            }
        }
    }
    let _ = OpenExec::remove_pins(Path::new(PINS));
    println!(
        "openexec_vm: backend={} {}/{ran} cases passed",
        env.hooks.name(),
        ran - failed
    );
    if failed == 0 && ran > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Picks the backend as the daemon does (the probe's plan, then the
/// BPF-LSM object itself) and stages the files.
fn prepare() -> Result<Env, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    if !Path::new("/bin/busybox").exists() {
        return Err("no /bin/busybox (the exec target)".to_owned());
    }
    let measurements = Prober::new(LiveHost).measurements().clone();
    let plan = derive_plan(&measurements, &Overrides::default());
    println!(
        "openexec_vm: plan open={} ({})",
        plan.open.backend, plan.open.reason
    );
    let loaded = lsm::load_planned(plan.open.backend, None).map_err(|e| e.to_string())?;
    if loaded.fallback.is_some() {
        // Say why the BPF-LSM object was refused: the verifier's words.
        if let Err(openexec::OpenExecError::Load {
            verifier_log: Some(log),
            ..
        }) = OpenExec::load(Hooks::BpfLsm, None)
        {
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            for line in tail.iter().rev() {
                println!("openexec_vm: bpf_lsm verifier: {line}");
            }
        }
    }
    let env = Env {
        root: cgroup2_root(),
        me: me.clone(),
        hooks: loaded.hooks,
        fallback: loaded.fallback,
        counter: std::cell::Cell::new(0),
    };
    drop((loaded.open, loaded.exec));
    let _ = OpenExec::remove_pins(Path::new(PINS));
    setup_files(&me);
    Ok(env)
}

fn exec_deny_selected_only(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    policy("p-exec", "web", Mode::Enforce)
        .exec(&[], &[&bin("denied")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    add_pod(&mut m, pod("pod-b", "db", &[&b]));
    let mut x = Expect::new(env);
    x.case("selected", Some(&a), "exec", &bin("denied"), Refused);
    x.case("selected", Some(&a), "exec", &bin("allowed"), Done);
    x.case("other pod", Some(&b), "exec", &bin("denied"), Done);
    x.case("no pod", None, "exec", &bin("denied"), Done);
    // The refusal is a finding even in enforce mode.
    let drained = m.drain();
    let denied: u64 = drained
        .observations
        .iter()
        .filter(|(_, o)| {
            o.cgroup == a.id && o.observed == bin("denied") && o.decision == Decision::Denied
        })
        .map(|(_, o)| o.count)
        .sum();
    x.check(
        denied == 1,
        format!("want 1 denied exec counted, got {denied}"),
    );
    // Enforce-only: nothing else is counted.
    x.check(
        drained
            .observations
            .iter()
            .all(|(_, o)| o.decision.refused()),
        format!(
            "enforce-only cgroup counted non-refusals: {:?}",
            drained.observations
        ),
    );
    x.finish()
}

/// Issue 35, point 3: only the pod's directory is bound (the container
/// inside it is not known yet); with the fallback on, the container is
/// decided by its pod's policies, counted under the pod's directory, and
/// nothing else changes: the pod's sandbox (exempt), another pod's
/// container, a task outside any pod, and (off) the same container as
/// before.
fn pod_directory_fallback(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let pod_dir = env.cgroup("pod");
    let sandbox = pod_dir.child("sandbox");
    let container = pod_dir.child("ctr");
    let other_dir = env.cgroup("other-pod");
    let other = other_dir.child("ctr");
    policy("p-fallback", "web", Mode::Enforce)
        .exec(&[], &[&bin("denied")])
        .open(&[], &[&file("secret")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&pod_dir]));
    add_pod(&mut m, pod("pod-b", "db", &[&other_dir]));
    let mut x = Expect::new(env);
    let fallback = |m: &Manager| m.open_backend().pod_fallback().unwrap();
    x.check(
        fallback(&m) == (false, 0),
        format!("off after load, got {:?}", fallback(&m)),
    );
    x.case("off", Some(&container), "exec", &bin("denied"), Done);
    x.case("off", Some(&container), "open", &file("secret"), Done);

    m.open_backend().set_pod_exempt(sandbox.id, true).unwrap();
    m.open_backend().set_pod_fallback(true).unwrap();
    x.case(
        "on, the pod's sandbox (exempt)",
        Some(&sandbox),
        "exec",
        &bin("denied"),
        Done,
    );
    x.case(
        "on, the pod's sandbox (exempt)",
        Some(&sandbox),
        "open",
        &file("secret"),
        Done,
    );
    x.case("on", Some(&container), "exec", &bin("denied"), Refused);
    x.case("on", Some(&container), "open", &file("secret"), Refused);
    x.case("on", Some(&container), "exec", &bin("allowed"), Done);
    x.case("on", Some(&container), "open", &file("public"), Done);
    x.case(
        "on, the pod's directory itself",
        Some(&pod_dir),
        "exec",
        &bin("denied"),
        Refused,
    );
    x.case(
        "on, another pod's container",
        Some(&other),
        "exec",
        &bin("denied"),
        Done,
    );
    x.case("on, no pod", None, "exec", &bin("denied"), Done);
    let (on, hits) = fallback(&m);
    x.check(
        on && hits >= 4,
        format!("want on and >= 4 decisions through the pod's directory, got {on} and {hits}"),
    );
    let drained = m.drain();
    let refused_under_pod: u64 = drained
        .observations
        .iter()
        .filter(|(_, o)| o.cgroup == pod_dir.id && o.decision.refused())
        .map(|(_, o)| o.count)
        .sum();
    x.check(
        refused_under_pod == 3,
        format!(
            "want the 3 refusals counted under the pod's directory, got {refused_under_pod}: {:?}",
            drained.observations
        ),
    );

    // The container's own binding takes over: bound to another policy
    // (denying another program), its pod's deny no longer applies.
    policy("p-own", "own", Mode::Enforce)
        .exec(&[], &[&bin("other")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-c", "own", &[&container]));
    x.case(
        "own binding",
        Some(&container),
        "exec",
        &bin("denied"),
        Done,
    );
    x.case(
        "own binding",
        Some(&container),
        "exec",
        &bin("other"),
        Refused,
    );
    m.delete_pod("pod-c");
    x.case(
        "own binding gone",
        Some(&container),
        "exec",
        &bin("denied"),
        Refused,
    );

    m.open_backend().set_pod_fallback(false).unwrap();
    x.case("off again", Some(&container), "exec", &bin("denied"), Done);
    x.check(
        fallback(&m).1 >= hits,
        "the count of decisions is kept across the switch",
    );
    x.finish()
}

/// The fallback on the combinations users write (several policies on one
/// pod, several behaviors in one policy, monitor beside enforce, `*`
/// beside other deny values, allow and deny of one value): a container
/// decided through its pod's directory gets, for every operation, the
/// outcome a cgroup bound to the same pod gets, and the same counts.
fn pod_directory_fallback_as_bound(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let pod_dir = env.cgroup("pod");
    let sandbox = pod_dir.child("sandbox");
    let container = pod_dir.child("ctr");
    let bound = env.cgroup("bound");
    policy("p-dd", "web", Mode::Enforce)
        .exec(&[&bin("allowed"), &bin("a")], &["*", &bin("denied")])
        .open(&[], &[&file("secret")])
        .apply(&mut m);
    policy("p-lift", "web", Mode::Enforce)
        .exec(&[&bin("other")], &[])
        .open(&[&file("public")], &[&file("public"), &file("b")])
        .apply(&mut m);
    policy("p-watch", "web", Mode::Monitor)
        .exec(&[], &[&bin("a"), &bin("c")])
        .open(&[], &[&file("b"), &file("c")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&pod_dir, &bound]));
    m.open_backend().set_pod_exempt(sandbox.id, true).unwrap();
    m.open_backend().set_pod_fallback(true).unwrap();
    let _ = m.drain();

    let mut x = Expect::new(env);
    let ops: Vec<(&str, String)> = ["denied", "allowed", "a", "b", "c", "other"]
        .iter()
        .map(|b| ("exec", bin(b)))
        .chain(
            ["secret", "public", "a", "b", "c", "other"]
                .iter()
                .map(|f| ("open", file(f))),
        )
        .collect();
    let mut outcomes = BTreeSet::new();
    for (op, path) in &ops {
        let want = env.run(Some(&bound), op, path);
        let got = env.run(Some(&container), op, path);
        match (want, got) {
            (Ok(want), Ok(got)) => {
                outcomes.insert(format!("{want:?}"));
                x.check(
                    want == got,
                    format!("{op} {path}: bound {want:?}, through the pod's directory {got:?}"),
                );
            }
            (want, got) => x.check(false, format!("{op} {path}: {want:?} / {got:?}")),
        }
    }
    x.check(
        outcomes.len() == 2,
        format!("the cases must both refuse and let through: {outcomes:?}"),
    );
    // The same counts (refusals, and everything the monitor policy
    // counts), under the pod's directory and the bound cgroup.
    let drained = m.drain();
    let counted = |id: u64| {
        let mut c: BTreeMap<String, u64> = BTreeMap::new();
        for (behavior, o) in &drained.observations {
            if o.cgroup == id && o.observed.starts_with(WORK) {
                *c.entry(format!("{behavior:?} {} {:?}", o.observed, o.decision))
                    .or_default() += o.count;
            }
        }
        c
    };
    let (through_dir, as_bound) = (counted(pod_dir.id), counted(bound.id));
    x.check(
        !as_bound.is_empty() && through_dir == as_bound,
        format!("counted through the pod's directory {through_dir:?}, as bound {as_bound:?}"),
    );
    x.finish()
}

fn open_deny_selected_only(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    policy("p-open", "web", Mode::Enforce)
        .open(&[], &[&file("secret")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    add_pod(&mut m, pod("pod-b", "db", &[&b]));
    let mut x = Expect::new(env);
    x.case("selected", Some(&a), "open", &file("secret"), Refused);
    x.case("selected", Some(&a), "open", &file("public"), Done);
    x.case("other pod", Some(&b), "open", &file("secret"), Done);
    x.case("no pod", None, "open", &file("secret"), Done);
    x.finish()
}

fn default_deny_allow_list(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    // Separate pods: an exec opens its binary, so an open default deny
    // would refuse every exec it does not also allow as an open.
    policy("p-dd-exec", "web", Mode::Enforce)
        .exec(&[&bin("allowed")], &["*"])
        .apply(&mut m);
    policy("p-dd-open", "db", Mode::Enforce)
        .open(&[&file("public")], &["*"])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    add_pod(&mut m, pod("pod-b", "db", &[&b]));
    let mut x = Expect::new(env);
    x.case("exec allowed", Some(&a), "exec", &bin("allowed"), Done);
    x.case("exec not listed", Some(&a), "exec", &bin("other"), Refused);
    x.case("open allowed", Some(&b), "open", &file("public"), Done);
    x.case("open not listed", Some(&b), "open", &file("other"), Refused);
    x.case(
        "open not listed, no pod",
        None,
        "open",
        &file("other"),
        Done,
    );
    x.case(
        "open default deny refuses an exec's open",
        Some(&b),
        "exec",
        &bin("allowed"),
        Refused,
    );
    x.finish()
}

/// Issue 33: two behaviors of one kind in one policy, the first allowing
/// `a` and `b` under a default deny, the second denying `b`, merged by the
/// one rule (`BehaviorLists::merge`): `b` is refused, not dropped from the
/// deny list by the default deny; `a` runs; `c` is default denied. The same
/// with the deny beside the `"*"` in one list, for open.
fn deny_beside_default_deny(env: &Env) -> Result<(), String> {
    use kyverno_runtime_policy::compile::{EvaluatedBehavior, EvaluationResult};
    use kyverno_runtime_policy::values::BehaviorKind;
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    let behavior = |index, allow: &[String], deny: &[String], default_deny| EvaluatedBehavior {
        index,
        kind: BehaviorKind::Exec,
        allow: allow.to_vec(),
        deny: deny.to_vec(),
        default_deny,
    };
    let merged = BehaviorLists::merge(
        &EvaluationResult {
            behaviors: vec![
                behavior(0, &[bin("a"), bin("b")], &[], true),
                behavior(1, &[], &[bin("b")], false),
            ],
        },
        BehaviorKind::Exec,
    );
    let mut p = policy("p-two-behaviors", "web", Mode::Enforce);
    p.0.exec = merged;
    p.apply(&mut m);
    policy("p-one-list", "db", Mode::Enforce)
        .open(&[&file("a"), &file("b")], &["*", &file("b")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    add_pod(&mut m, pod("pod-b", "db", &[&b]));
    let mut x = Expect::new(env);
    x.case("exec allowed", Some(&a), "exec", &bin("a"), Done);
    x.case(
        "exec allowed and denied",
        Some(&a),
        "exec",
        &bin("b"),
        Refused,
    );
    x.case("exec not listed", Some(&a), "exec", &bin("c"), Refused);
    x.case("open allowed", Some(&b), "open", &file("a"), Done);
    x.case(
        "open allowed and denied",
        Some(&b),
        "open",
        &file("b"),
        Refused,
    );
    x.case("open not listed", Some(&b), "open", &file("c"), Refused);
    x.finish()
}

fn two_policies_union(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    // p1: default deny, allows a. p2: allows b (lifting p1's default deny
    // for b). p3: denies a (beating p1's allow).
    policy("p1", "web", Mode::Enforce)
        .exec(&[&bin("a")], &["*"])
        .apply(&mut m);
    policy("p2", "web", Mode::Enforce)
        .exec(&[&bin("b")], &[])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let mut x = Expect::new(env);
    x.case("p1 allows", Some(&a), "exec", &bin("a"), Done);
    x.case(
        "p2's allow lifts p1's default deny",
        Some(&a),
        "exec",
        &bin("b"),
        Done,
    );
    x.case("neither allows", Some(&a), "exec", &bin("c"), Refused);
    policy("p3", "web", Mode::Enforce)
        .exec(&[], &[&bin("a")])
        .apply(&mut m);
    x.case(
        "p3's deny beats p1's allow",
        Some(&a),
        "exec",
        &bin("a"),
        Refused,
    );
    x.case("p2 still allows", Some(&a), "exec", &bin("b"), Done);
    m.delete_policy(&PolicyId::new("p1").unwrap());
    x.case(
        "without p1, no default deny",
        Some(&a),
        "exec",
        &bin("c"),
        Done,
    );
    x.case("p3 still denies", Some(&a), "exec", &bin("a"), Refused);
    x.finish()
}

fn monitor_counts(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    // A monitor policy's lists program nothing: "*" included.
    policy("p-mon", "web", Mode::Monitor)
        .exec(&[], &["*"])
        .open(&[], &["*"])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let mut x = Expect::new(env);
    x.case("monitor", Some(&a), "open", &file("secret"), Done);
    x.case("monitor", Some(&a), "open", &file("secret"), Done);
    x.case("monitor", Some(&a), "exec", &bin("denied"), Done);
    let drained = m.drain();
    x.check(
        drained.errors.is_empty(),
        format!("drain errors: {:?}", drained.errors),
    );
    let count = |behavior: &str, path: &str| -> u64 {
        drained
            .observations
            .iter()
            .filter(|(b, o)| {
                b.name() == behavior
                    && o.cgroup == a.id
                    && o.observed == path
                    && o.decision == Decision::Unmatched
            })
            .map(|(_, o)| o.count)
            .sum()
    };
    x.check(
        count("open", &file("secret")) == 2,
        format!("open secret counted {}", count("open", &file("secret"))),
    );
    x.check(
        count("exec", &bin("denied")) == 1,
        format!("exec denied counted {}", count("exec", &bin("denied"))),
    );
    // Read and reset: a second drain starts from zero.
    let again = m.drain();
    x.check(
        !again
            .observations
            .iter()
            .any(|(_, o)| o.observed == file("secret")),
        "a second drain returned the same counts",
    );
    x.finish()
}

/// The comm of a task running this binary.
fn my_comm(env: &Env) -> String {
    let name = env
        .me
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.chars().take(15).collect()
}

/// Every record the reader has, waiting until `want` arrived or `wait`.
fn denials(
    reader: &mut kyverno_runtime_bpf::ring::RecordReader<openexec::Denial>,
    want: usize,
    wait: std::time::Duration,
) -> Vec<openexec::Denial> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    loop {
        got.extend(
            reader
                .poll(std::time::Duration::from_millis(100))
                .unwrap_or_default(),
        );
        if got.len() >= want || Instant::now() > deadline {
            return got;
        }
    }
}

fn denial_records(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    m.open_backend()
        .set_denial_rate(1000)
        .map_err(|e| format!("set_denial_rate: {e}"))?;
    let mut reader = m
        .open_backend()
        .denial_reader()
        .map_err(|e| format!("denial_reader: {e}"))?;
    let a = env.cgroup("a");
    policy("p-rec", "web", Mode::Enforce)
        .exec(&[], &[&bin("denied")])
        .open(&[], &[&file("secret")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let mut x = Expect::new(env);
    // Three exec attempts and one open, each from a child of its own.
    let mut pids = BTreeMap::new();
    for (op, path) in [
        ("execve", bin("denied")),
        ("execve", bin("denied")),
        ("execve", bin("denied")),
        ("open", file("secret")),
    ] {
        let child = Command::new(&env.me)
            .args(["child", &a.procs(), op, &path])
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let pid = child.id();
        let out = child.wait_with_output().map_err(|e| format!("wait: {e}"))?;
        x.check(
            out.status.code() == Some(i32::from(CHILD_REFUSED)),
            format!("{op} {path}: not refused ({})", out.status),
        );
        pids.insert(pid, (op, path));
    }
    let got = denials(&mut reader, 4, std::time::Duration::from_secs(5));
    x.check(
        got.len() == 4,
        format!("{} records, want 4: {got:?}", got.len()),
    );
    let comm = my_comm(env);
    for d in &got {
        let Some((op, path)) = pids.get(&d.pid) else {
            x.check(
                false,
                format!("a record of pid {}, which made no attempt: {d:?}", d.pid),
            );
            continue;
        };
        let dim = if *op == "execve" {
            KDim::Exec
        } else {
            KDim::Open
        };
        x.check(
            d.cgroup == a.id
                && d.dimension == dim
                && d.decision == openexec::Decision::Denied
                && d.path == path.as_bytes()
                && d.comm == comm,
            format!("record {d:?}: want cgroup {} {op} {path} comm {comm}", a.id),
        );
    }
    let mut seen: Vec<u32> = got.iter().map(|d| d.pid).collect();
    seen.sort_unstable();
    seen.dedup();
    x.check(
        seen.len() == 4,
        format!("one record per attempt: pids {seen:?}"),
    );
    // Each refusal is reported once: as a record, so not also counted.
    let drained = m.drain();
    let counted: u64 = drained
        .observations
        .iter()
        .filter(|(_, o)| o.cgroup == a.id && o.decision.refused())
        .map(|(_, o)| o.count)
        .sum();
    x.check(
        counted == 0,
        format!("{counted} recorded refusals counted again"),
    );
    if std::env::var_os("KRT_VERBOSE").is_some() {
        for d in &got {
            println!(
                "      record: pid {} comm {} {:?} {}",
                d.pid,
                d.comm,
                d.dimension,
                String::from_utf8_lossy(&d.path)
            );
        }
    }
    x.finish()
}

fn denial_storm(env: &Env) -> Result<(), String> {
    const PER_SECOND: u32 = 100;
    let mut m = env.manager(None);
    m.open_backend()
        .set_denial_rate(PER_SECOND)
        .map_err(|e| format!("set_denial_rate: {e}"))?;
    let mut reader = m
        .open_backend()
        .denial_reader()
        .map_err(|e| format!("denial_reader: {e}"))?;
    let before = m.open_backend().stats().map_err(|e| e.to_string())?;
    let a = env.cgroup("a");
    policy("p-storm", "web", Mode::Enforce)
        .open(&[], &[&file("secret")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let mut x = Expect::new(env);
    // The reader drains while the storm runs, as the daemon's does.
    let started = Instant::now();
    let mut child = Command::new(&env.me)
        .args(["child", &a.procs(), "open-storm", &file("secret")])
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let mut records = 0usize;
    let status = loop {
        records += reader
            .poll(std::time::Duration::from_millis(50))
            .map_err(|e| e.to_string())?
            .len();
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
    };
    let elapsed = started.elapsed();
    records += denials(
        &mut reader,
        usize::MAX,
        std::time::Duration::from_millis(300),
    )
    .len();
    x.check(
        status.code() == Some(i32::from(CHILD_REFUSED)),
        format!("the storm's opens were not all refused ({status})"),
    );
    let after = m.open_backend().stats().map_err(|e| e.to_string())?;
    let rate_limited = after.denials_rate_limited - before.denials_rate_limited;
    let ring_full = after.denials_ringbuf_full - before.denials_ringbuf_full;
    let sent = after.denials_sent - before.denials_sent;
    let counted: u64 = m
        .drain()
        .observations
        .iter()
        .filter(|(_, o)| o.cgroup == a.id && o.decision.refused())
        .map(|(_, o)| o.count)
        .sum();
    let storm = STORM as u64;
    println!(
        "      storm: {STORM} denied opens in {:.1}s, budget {PER_SECOND}/s per cgroup: {records} records, {rate_limited} rate-limited, {ring_full} ring-full (counted instead: {counted})",
        elapsed.as_secs_f64()
    );
    x.check(
        records as u64 == sent,
        format!("{records} records read, {sent} sent"),
    );
    x.check(
        records as u64 + counted == storm,
        format!("{records} records + {counted} counted != {STORM}: a refusal was lost or reported twice"),
    );
    x.check(
        rate_limited + ring_full == counted,
        format!("{rate_limited} rate-limited + {ring_full} ring-full != {counted} counted"),
    );
    // The budget: at most PER_SECOND records per one-second window the
    // storm touched.
    let windows = elapsed.as_secs() + 2;
    x.check(
        records as u64 <= u64::from(PER_SECOND) * windows,
        format!("{records} records in {windows} windows of {PER_SECOND}"),
    );
    x.check(rate_limited > 0, "the storm was never rate-limited");
    x.finish()
}

/// `oe_observations` holds 16,384 keys (KRT_OE_MAX_OBSERVATIONS): a
/// monitored cgroup opening 17,000 distinct paths between two drains
/// fills it, and every open it could not hold is `observe_failed` (the
/// daemon's `events_dropped_total{source="openexec-observe",
/// reason="map_full"}`): what the drain read plus what was counted as
/// failed is every open.
fn observation_map_full(env: &Env) -> Result<(), String> {
    const OPENS: u32 = 17_000;
    let dir = format!("{WORK}/many.{OPENS}");
    fs::create_dir_all(&dir).map_err(|e| format!("{dir}: {e}"))?;
    // Hard links: distinct paths (bpf_d_path resolves the name opened)
    // without 17,000 files' worth of data.
    for i in 0..OPENS {
        let link = format!("{dir}/{i}");
        if !Path::new(&link).exists() {
            fs::hard_link(file("public"), &link).map_err(|e| format!("{link}: {e}"))?;
        }
    }
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    policy("p-full", "web", Mode::Monitor)
        .open(&[], &["*"])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let before = m.open_backend().stats().map_err(|e| e.to_string())?;
    let mut x = Expect::new(env);
    x.case("monitor", Some(&a), "open-each", &dir, Done);
    let after = m.open_backend().stats().map_err(|e| e.to_string())?;
    let failed = after.observe_failed - before.observe_failed;
    let drained = m.drain();
    x.check(
        drained.errors.is_empty(),
        format!("drain errors: {:?}", drained.errors),
    );
    let prefix = format!("{dir}/");
    let counted: u64 = drained
        .observations
        .iter()
        .filter(|(_, o)| o.cgroup == a.id && o.observed.starts_with(&prefix))
        .map(|(_, o)| o.count)
        .sum();
    println!(
        "      {OPENS} distinct opens: {counted} counted in the 16384-key map, {failed} observe_failed"
    );
    x.check(failed > 0, "the map never refused a key");
    // Every open counted exactly once: in the map, or as refused by it.
    x.check(
        counted + failed == u64::from(OPENS),
        format!("{counted} counted + {failed} failed for {OPENS} opens"),
    );
    let _ = fs::remove_dir_all(&dir);
    x.finish()
}

fn tracer_resolved_paths(env: &Env) -> Result<(), String> {
    use kyverno_runtime_bpf::exectrace::ExecTracer;
    let mut m = env.manager(None);
    let map = m
        .open_backend()
        .exec_resolved_map()
        .map_err(|e| format!("exec_resolved_map: {e}"))?;
    let tracer = ExecTracer::load(Some(&map)).map_err(|e| format!("loading the tracer: {e}"))?;
    let mut reader = tracer.reader().map_err(|e| e.to_string())?;
    let a = env.cgroup("a");
    // A monitor policy observes the cgroup's execs.
    policy("p-trace", "web", Mode::Monitor)
        .exec(&[], &["*"])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    tracer.admit(a.id).map_err(|e| e.to_string())?;
    let link = format!("{WORK}/bin/link");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(bin("allowed"), &link).map_err(|e| e.to_string())?;
    let mut x = Expect::new(env);
    x.case("traced", Some(&a), "exec", &link, Done);
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        got.extend(
            reader
                .poll(std::time::Duration::from_millis(100))
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|r| r.cgroup_id == a.id),
        );
    }
    match got.as_slice() {
        [r] => {
            if std::env::var_os("KRT_VERBOSE").is_some() {
                println!("      traced: {r:?}");
            }
            x.check(
                r.filename == link,
                format!("filename {:?}, want {link}", r.filename),
            );
            x.check(
                r.resolved == [bin("allowed")],
                format!(
                    "resolved {:?}, want [{}]: the path the exec program judged",
                    r.resolved,
                    bin("allowed")
                ),
            );
            x.check(r.argv == ["true"], format!("argv {:?}", r.argv));
            x.check(r.comm == "link", format!("comm {:?}", r.comm));
        }
        other => x.check(
            false,
            format!("{} records for the cgroup: {other:?}", other.len()),
        ),
    }
    x.finish()
}

fn update_and_delete(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    policy("p-upd", "web", Mode::Enforce)
        .exec(&[], &[&bin("a")])
        .open(&[], &[&file("a")])
        .apply(&mut m);
    let mut x = Expect::new(env);
    x.case("v1", Some(&a), "exec", &bin("a"), Refused);
    x.case("v1", Some(&a), "open", &file("a"), Refused);
    policy("p-upd", "web", Mode::Enforce)
        .exec(&[], &[&bin("b")])
        .open(&[&file("b"), &bin("a"), &bin("b")], &["*"])
        .apply(&mut m);
    x.case("v2 dropped the deny", Some(&a), "exec", &bin("a"), Done);
    x.case("v2 added a deny", Some(&a), "exec", &bin("b"), Refused);
    x.case("v2 default deny", Some(&a), "open", &file("a"), Refused);
    x.case("v2 allow", Some(&a), "open", &file("b"), Done);
    m.delete_policy(&PolicyId::new("p-upd").unwrap());
    x.case("deleted", Some(&a), "exec", &bin("b"), Done);
    x.case("deleted", Some(&a), "open", &file("a"), Done);
    x.finish()
}

fn unbinding_restores(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let a2 = env.cgroup("a2");
    policy("p-unb", "web", Mode::Enforce)
        .exec(&[], &[&bin("denied")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a, &a2]));
    let mut x = Expect::new(env);
    x.case("bound", Some(&a), "exec", &bin("denied"), Refused);
    x.case(
        "second container",
        Some(&a2),
        "exec",
        &bin("denied"),
        Refused,
    );
    // Relabelled out of the selector.
    add_pod(&mut m, pod("pod-a", "batch", &[&a, &a2]));
    x.case("relabelled", Some(&a), "exec", &bin("denied"), Done);
    add_pod(&mut m, pod("pod-a", "web", &[&a, &a2]));
    x.case("relabelled back", Some(&a), "exec", &bin("denied"), Refused);
    // A container gone.
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    x.case("container removed", Some(&a2), "exec", &bin("denied"), Done);
    x.case("container kept", Some(&a), "exec", &bin("denied"), Refused);
    let failures = m.delete_pod("pod-a");
    x.check(failures.is_empty(), format!("{failures:?}"));
    x.case("pod deleted", Some(&a), "exec", &bin("denied"), Done);
    x.finish()
}

fn mode_change_rebuilds(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    policy("p-mode", "web", Mode::Monitor)
        .exec(&[], &[&bin("denied")])
        .apply(&mut m);
    let mut x = Expect::new(env);
    x.case("monitor", Some(&a), "exec", &bin("denied"), Done);
    policy("p-mode", "web", Mode::Enforce)
        .exec(&[], &[&bin("denied")])
        .apply(&mut m);
    x.case("now enforce", Some(&a), "exec", &bin("denied"), Refused);
    policy("p-mode", "web", Mode::Monitor)
        .exec(&[], &[&bin("denied")])
        .apply(&mut m);
    x.case("monitor again", Some(&a), "exec", &bin("denied"), Done);
    x.finish()
}

fn exec_chain_semantics(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    add_pod(&mut m, pod("pod-b", "db", &[&b]));
    // An open deny on a binary refuses executing it (the exec opens it).
    policy("p-open-bin", "web", Mode::Enforce)
        .open(&[], &[&bin("denied")])
        .apply(&mut m);
    // Exec default deny allowing one dynamic binary: its ELF interpreter
    // is opened for execution but is not an exec.
    policy("p-dyn", "db", Mode::Enforce)
        .exec(&[&bin("dyn")], &["*"])
        .apply(&mut m);
    let mut x = Expect::new(env);
    x.case(
        "open deny on the binary",
        Some(&a),
        "exec",
        &bin("denied"),
        Refused,
    );
    x.case(
        "dynamic binary allowed",
        Some(&b),
        "exec",
        &bin("dyn"),
        Done,
    );
    x.case(
        "static binary not allowed",
        Some(&b),
        "exec",
        &bin("other"),
        Refused,
    );
    x.finish()
}

fn unselected_costs_nothing(env: &Env) -> Result<(), String> {
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    let b = env.cgroup("b");
    policy("p-sel", "web", Mode::Monitor)
        .open(&[], &[])
        .exec(&[], &[])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let before = m.open_backend().stats().map_err(|e| e.to_string())?;
    let mut x = Expect::new(env);
    for _ in 0..3 {
        x.case("unselected", Some(&b), "open", &file("public"), Done);
        x.case("unselected", Some(&b), "exec", &bin("allowed"), Done);
    }
    let after = m.open_backend().stats().map_err(|e| e.to_string())?;
    x.check(
        before == after,
        format!("an unselected cgroup was decided or counted: {before:?} -> {after:?}"),
    );
    x.case("selected", Some(&a), "open", &file("public"), Done);
    let selected = m.open_backend().stats().map_err(|e| e.to_string())?;
    x.check(
        selected.decisions[KDim::Open.index()][3] > after.decisions[KDim::Open.index()][3],
        "the selected cgroup's open was not decided",
    );
    x.finish()
}

/// The kubelet bind-mounts files (/etc/hosts, subPath volumes): the path
/// of such a file ends in the mountpoint's name, not its own, so the name
/// prefilter must not decide it.
fn bind_mount_named_by_mountpoint(env: &Env) -> Result<(), String> {
    let target = file("mounted-here");
    fs::write(&target, "placeholder").map_err(|e| e.to_string())?;
    let status = Command::new("/bin/busybox")
        .args(["mount", "--bind", &file("public"), &target])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("mount --bind failed: {status}"));
    }
    let mut m = env.manager(None);
    let a = env.cgroup("a");
    policy("p-bind", "web", Mode::Enforce)
        .open(&[], &[&target])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let mut x = Expect::new(env);
    x.case("bind-mounted file", Some(&a), "open", &target, Refused);
    x.case("its source", Some(&a), "open", &file("public"), Done);
    let _ = Command::new("/bin/busybox")
        .args(["umount", &target])
        .status();
    x.finish()
}

fn restart_no_stale(env: &Env) -> Result<(), String> {
    let pins = Path::new(PINS);
    let _ = OpenExec::remove_pins(pins);
    let a = env.cgroup("a");
    let mut x = Expect::new(env);
    {
        let mut m = env.manager(Some(pins));
        policy("keep", "web", Mode::Enforce)
            .exec(&[], &[&bin("a")])
            .open(&[], &[&file("a")])
            .apply(&mut m);
        policy("gone", "web", Mode::Enforce)
            .exec(&[], &[&bin("b")])
            .open(&[&file("c")], &["*"])
            .apply(&mut m);
        add_pod(&mut m, pod("pod-a", "web", &[&a]));
        x.case("before restart", Some(&a), "exec", &bin("b"), Refused);
        // The process "exits": its handles close, the pins remain.
    }
    x.case(
        "no daemon: pinned links still enforce",
        Some(&a),
        "exec",
        &bin("a"),
        Refused,
    );
    x.case(
        "no daemon: pinned links still enforce",
        Some(&a),
        "open",
        &file("b"),
        Refused,
    );
    let mut m = env.manager(Some(pins));
    x.check(
        m.open_backend().held().map(|h| h.len()).unwrap_or(0) == 2,
        "the restarted backend did not adopt both policies",
    );
    // Adopted but not yet reconciled: everything is still enforced.
    x.case("adopted", Some(&a), "exec", &bin("b"), Refused);
    // The informers deliver only "keep" and the pod; then reconcile.
    policy("keep", "web", Mode::Enforce)
        .exec(&[], &[&bin("a")])
        .open(&[], &[&file("a")])
        .apply(&mut m);
    add_pod(&mut m, pod("pod-a", "web", &[&a]));
    let failures = m.reconcile_adopted(&BTreeSet::new());
    x.check(failures.is_empty(), format!("reconcile: {failures:?}"));
    x.case("kept policy", Some(&a), "exec", &bin("a"), Refused);
    x.case("kept policy", Some(&a), "open", &file("a"), Refused);
    x.case("stale policy gone", Some(&a), "exec", &bin("b"), Done);
    x.case(
        "stale default deny gone",
        Some(&a),
        "open",
        &file("b"),
        Done,
    );
    drop(m);
    // The kernel maps hold exactly "keep": read them raw.
    let raw = OpenExec::load(env.hooks, Some(pins)).map_err(|e| e.to_string())?;
    let mut report = String::new();
    for dim in KDim::ALL {
        let rules = raw.rules(dim).map_err(|e| e.to_string())?;
        let _ = write!(report, "{} rules {}; ", dim.name(), rules.len());
        x.check(
            rules.len() == 1,
            format!("{} holds {} path rules, want 1", dim.name(), rules.len()),
        );
        let owners = (0..openexec::SLOTS)
            .filter(|s| raw.owner(dim, *s).ok().flatten().is_some())
            .count();
        x.check(
            owners == 1,
            format!("{} has {owners} slots taken, want 1", dim.name()),
        );
    }
    let names: Vec<String> = raw
        .names()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|k| {
            String::from_utf8_lossy(&k[..k.iter().position(|b| *b == 0).unwrap_or(k.len())])
                .into_owned()
        })
        .collect();
    x.check(
        names == ["a"],
        format!("oe_names holds {names:?}, want [\"a\"]"),
    );
    let masks = raw.masks().map_err(|e| e.to_string())?;
    x.check(
        masks.default_deny == [0, 0],
        format!("a default deny survived: {masks:?} ({report})"),
    );
    // Closes the maps before the pins go (a stub build's handle holds none).
    #[allow(clippy::drop_non_drop)]
    drop(raw);
    OpenExec::remove_pins(pins).map_err(|e| e.to_string())?;
    // A bpffs inode (and the link it holds) is freed after an RCU grace
    // period, so the programs detach shortly after the unlink, not at it.
    let mut detached = false;
    for _ in 0..40 {
        if env.run(Some(&a), "exec", &bin("a")) == Ok(Done) {
            detached = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    x.check(
        detached,
        "pins removed, but the programs still refuse after 10 s",
    );
    x.finish()
}

// ---------------------------------------------------------------- bench

/// Per configuration: open()+close() and fork+execve loops inside a
/// selected cgroup, with 0, 1, 16 and 64 policies of 1000 paths each, as
/// ratios to the same loop with no program attached, measured in rounds
/// that alternate with the baseline (these machines are noisy), plus the
/// per-invocation run time the kernel's BPF stats report.
fn bench() -> ExitCode {
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            println!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let measurements = Prober::new(LiveHost).measurements().clone();
    let plan = derive_plan(&measurements, &Overrides::default());
    let hooks = match lsm::load_planned(plan.open.backend, None) {
        Ok(l) => l.hooks,
        Err(e) => {
            println!("bench: no open/exec backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    setup_files(&me);
    let env = Env {
        root: cgroup2_root(),
        me,
        hooks,
        fallback: None,
        counter: std::cell::Cell::new(0),
    };
    let cg = env.cgroup("bench");
    // The loops run in this process (and its children): move it in.
    fs::write(cg.procs(), std::process::id().to_string()).unwrap();
    let stats_before = openexec::enable_bpf_stats(false).unwrap_or(false);

    let open_iters = iters("KRT_BENCH_OPEN_ITERS", 20_000);
    let exec_iters = iters("KRT_BENCH_EXEC_ITERS", 150);
    let rounds = iters("KRT_BENCH_ROUNDS", 3);
    println!(
        "bench: kernel {} backend={} open x{open_iters} exec x{exec_iters}, {rounds} rounds, median",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        hooks.name()
    );
    println!("policies  paths  open_ns  open_ratio  exec_us  exec_ratio  bpf_open_ns  bpf_exec_ns");
    let mut ok = true;
    for policies in [0usize, 1, 16, 64] {
        let mut open_ratios = Vec::new();
        let mut exec_ratios = Vec::new();
        let mut open_ns = Vec::new();
        let mut exec_us = Vec::new();
        let mut bpf_open = 0.0;
        let mut bpf_exec = 0.0;
        for _ in 0..rounds {
            let base_open = time_open(open_iters);
            let base_exec = time_exec(exec_iters);
            let (mut m, _) = bench_manager(&env, hooks, policies, &cg);
            // Timed with the kernel's BPF stats off (they add two clock
            // reads per program run), then a shorter pass with them on
            // for the per-invocation run time.
            let _ = openexec::enable_bpf_stats(false);
            let with_open = time_open(open_iters);
            let with_exec = time_exec(exec_iters);
            let _ = openexec::enable_bpf_stats(true);
            let before = run_stats(&m);
            time_open(open_iters / 4);
            let mid = run_stats(&m);
            time_exec(exec_iters / 4);
            let after = run_stats(&m);
            let _ = openexec::enable_bpf_stats(false);
            bpf_open = per_run(&before, &mid, "file_open");
            bpf_exec = per_run(&mid, &after, "bprm_check");
            m.delete_pod("bench");
            drop(m);
            open_ratios.push(with_open / base_open);
            exec_ratios.push(with_exec / base_exec);
            open_ns.push(with_open * 1e9 / open_iters as f64);
            exec_us.push(with_exec * 1e6 / exec_iters as f64);
        }
        let paths = if policies == 0 { 0 } else { 1000 };
        println!(
            "{policies:>8}  {paths:>5}  {:>7.0}  {:>10.3}  {:>7.0}  {:>10.3}  {:>11.0}  {:>11.0}",
            median(&mut open_ns),
            median(&mut open_ratios),
            median(&mut exec_us),
            median(&mut exec_ratios),
            bpf_open,
            bpf_exec
        );
        if open_ratios.iter().any(|r| !r.is_finite()) {
            ok = false;
        }
    }
    let _ = openexec::enable_bpf_stats(stats_before);
    let _ = fs::write(
        env.root.join("cgroup.procs"),
        std::process::id().to_string(),
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn iters(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A manager with `policies` enforce policies of 1000 open and 1000 exec
/// deny paths each (none of them the benchmarked ones), all bound to `cg`.
fn bench_manager(env: &Env, hooks: Hooks, policies: usize, cg: &Cgroup) -> (Manager, ()) {
    let (open, exec) = lsm::load(hooks, None).unwrap();
    let mut m = OpenExecManager::new(open, exec).unwrap();
    let _ = env;
    for p in 0..policies {
        let deny: Vec<String> = (0..1000).map(|i| format!("/krt/bench/{p}/{i}")).collect();
        let deny: Vec<&str> = deny.iter().map(String::as_str).collect();
        policy(&format!("bench-{p}"), "bench", Mode::Enforce)
            .open(&[], &deny)
            .exec(&[], &deny)
            .apply(&mut m);
    }
    if policies > 0 {
        add_pod(&mut m, pod("bench", "bench", &[cg]));
    }
    (m, ())
}

fn run_stats(m: &Manager) -> Vec<openexec::ProgramRunStats> {
    m.open_backend().run_stats().unwrap_or_default()
}

/// Nanoseconds per run of the program whose name contains `what`, between
/// two snapshots.
fn per_run(a: &[openexec::ProgramRunStats], b: &[openexec::ProgramRunStats], what: &str) -> f64 {
    let find = |s: &[openexec::ProgramRunStats]| {
        s.iter()
            .find(|p| p.name.contains(what))
            .map(|p| (p.run_time_ns, p.run_count))
            .unwrap_or((0, 0))
    };
    let (t0, c0) = find(a);
    let (t1, c1) = find(b);
    if c1 > c0 {
        (t1 - t0) as f64 / (c1 - c0) as f64
    } else {
        0.0
    }
}

fn time_open(n: usize) -> f64 {
    let path = file("bench");
    let start = Instant::now();
    for _ in 0..n {
        match fs::File::open(&path) {
            Ok(f) => drop(f),
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {}
            Err(e) => panic!("open: {e}"),
        }
    }
    start.elapsed().as_secs_f64()
}

fn time_exec(n: usize) -> f64 {
    let path = bin("allowed");
    let start = Instant::now();
    for _ in 0..n {
        let _ = exec_status(&path);
    }
    start.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
