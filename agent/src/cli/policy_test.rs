//! `kyverno-runtime policy test PATH...`: policies checked against recorded
//! events, offline, with the daemon's own semantics.
//!
//! A test is a `kyverno-runtime-test.yaml` file (found under each PATH, or
//! named directly). It names RuntimePolicy files, declares namespaces and
//! pods (labels, owner, containers by cgroup id), and lists cases: a file
//! of recorded events (JSON lines, [`kyverno_runtime_plane::record`]) and
//! the findings they must produce. Each case runs on a fresh plane: the
//! policies compiled and evaluated by the daemon's compiler, the pods in
//! the attribution [`Index`], every event through that index (the stage)
//! and the [`Monitor`] (the sink), whose matchers and monitorFilter are
//! the daemon's. The findings, redacted as a Report shows them and added
//! up per policy, behavior, target, enforced and pod, must be exactly the
//! expected ones: a missing one, an unexpected one or a different count
//! fails the case, and the difference is printed. An event that no
//! declared pod claims fails its case too (the daemon would drop it,
//! counted): a recording that goes nowhere tests nothing.
//!
//! A test directory may come from anyone (a pull request run in CI), so a
//! test reads only files under its own directory ([`Confined`]: no
//! absolute path, no `..`, no link leading out), a directory walk follows
//! no symbolic link (a link loop cannot make it endless, and a linked test
//! file cannot stand in for a file elsewhere), and an error about a file's
//! content says what was expected and where, never what the file holds
//! ([`content_free`]).

use super::confined::Confined;
use super::input::content_free;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_plane::collector::{Sink, Stage};
use kyverno_runtime_plane::event::{Event, PodRef};
use kyverno_runtime_plane::record::{parse_lines, RecordError};
use kyverno_runtime_plane::{FindingSink, Index, Monitor, MonitorPolicy};
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_report::{Behavior, Finding};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

/// The name a test file has.
pub const TEST_FILE: &str = "kyverno-runtime-test.yaml";

/// The label the API server gives every namespace.
use kyverno_runtime_policy::selector::NAMESPACE_NAME_LABEL;

/// A test file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TestFile {
    /// Shown in the output (default: the directory's name).
    #[serde(default)]
    name: Option<String>,
    /// RuntimePolicy files (several documents each), relative to the test
    /// file.
    policies: Vec<PathBuf>,
    /// Namespace labels by namespace name. Every namespace of a pod exists
    /// with at least `kubernetes.io/metadata.name`, as the API server
    /// labels it.
    #[serde(default)]
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The pods events are attributed to.
    #[serde(default)]
    pods: Vec<TestPod>,
    /// The cases.
    cases: Vec<TestCase>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TestPod {
    namespace: String,
    name: String,
    /// Default: `<namespace>/<name>`.
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    owner: Option<TestOwner>,
    /// Container name to cgroup id: an event carrying that cgroup id is
    /// this pod's.
    #[serde(default)]
    containers: BTreeMap<String, u64>,
    /// Container name to the runtime id its status writes
    /// (`containerd://<id>`): `event.pod.containerID`.
    #[serde(default, rename = "containerIDs")]
    container_ids: BTreeMap<String, String>,
    /// `spec.nodeName`: `event.pod.nodeName`.
    #[serde(default)]
    node_name: String,
    /// `spec.serviceAccountName`: `event.pod.serviceAccount`.
    #[serde(default)]
    service_account: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestOwner {
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TestCase {
    name: String,
    /// Recorded events (JSON lines), relative to the test file.
    events: PathBuf,
    /// The findings the events must produce, and nothing else.
    #[serde(default)]
    expect: Vec<ExpectedFinding>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExpectedFinding {
    policy: String,
    behavior: String,
    target: String,
    /// Whether the kernel refused it (an enforce policy's finding).
    #[serde(default)]
    enforced: bool,
    /// Occurrences added up; absent: any number.
    #[serde(default)]
    count: Option<u64>,
    /// `<namespace>/<name>`.
    pod: String,
}

/// What a finding is compared by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    policy: String,
    behavior: Behavior,
    target: String,
    enforced: bool,
    pod: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} enforced={} pod={}",
            self.policy, self.behavior, self.target, self.enforced, self.pod
        )
    }
}

/// The findings a case produced, redacted as a Report shows them.
#[derive(Default)]
struct Collected(Mutex<Vec<Finding>>);

impl FindingSink for Collected {
    fn submit(&self, finding: Finding) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(finding.redact());
    }
}

/// A test loaded and ready to run its cases.
struct LoadedTest {
    policies: Vec<MonitorPolicy>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pods: Vec<PodRef>,
}

/// What one case came to.
#[derive(Debug, Default)]
struct CaseOutcome {
    events: usize,
    findings: usize,
    /// Every reason it failed, as printed.
    differences: Vec<String>,
}

/// Runs every test under `paths`; exits non-zero on any failure.
pub fn run(paths: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for p in paths {
        find_tests(p, &mut files)
            .map_err(|e| anyhow::anyhow!("looking for tests in {}: {e}", p.display()))?;
    }
    if files.is_empty() {
        anyhow::bail!(
            "no {TEST_FILE} under {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let (mut cases, mut failed) = (0usize, 0usize);
    for found in &files {
        let (out, ran, bad) = match found {
            Found::Test(file) => run_test_file(file),
            Found::Link(link) => (
                format!(
                    "{}: ERROR a symbolic link: a directory walk follows none (name the test itself to run it)\n",
                    link.display()
                ),
                1,
                1,
            ),
        };
        crate::out!("{out}")?;
        cases += ran;
        failed += bad;
    }
    crate::outln!(
        "{} test{}, {cases} case{}: {} passed, {failed} failed",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        if cases == 1 { "" } else { "s" },
        cases.saturating_sub(failed),
    )?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What a search for tests found.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// A test file to run.
    Test(PathBuf),
    /// A symbolic link named [`TEST_FILE`] in a walk: not followed, and
    /// reported, so a test is not skipped silently.
    Link(PathBuf),
}

/// `path` itself when it is a file, else every [`TEST_FILE`] under it,
/// in path order. `path` is followed if it is a link (a person named it);
/// nothing under it is: a linked directory is not entered (so a link loop
/// cannot make the walk endless) and a linked test file is [`Found::Link`].
fn find_tests(path: &Path, out: &mut Vec<Found>) -> std::io::Result<()> {
    // A missing path is an error here, not an empty directory.
    if !std::fs::metadata(path)?.is_dir() {
        out.push(Found::Test(path.to_path_buf()));
        return Ok(());
    }
    walk(path, out)
}

fn walk(dir: &Path, out: &mut Vec<Found>) -> std::io::Result<()> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // The entry's own type (lstat): a link is a link, not its target.
        entries.push((entry.path(), entry.file_type()?));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (entry, kind) in entries {
        let is_test = entry.file_name().is_some_and(|n| n == TEST_FILE);
        if kind.is_dir() {
            walk(&entry, out)?;
        } else if is_test && kind.is_symlink() {
            out.push(Found::Link(entry));
        } else if is_test && kind.is_file() {
            out.push(Found::Test(entry));
        }
    }
    Ok(())
}

/// Runs one test file: its report, how many cases ran, how many failed
/// (a test that cannot load counts as one failed case).
fn run_test_file(file: &Path) -> (String, usize, usize) {
    let mut out = String::new();
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let test: TestFile = match super::input::read_text(file)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            serde_yaml::from_str(&t)
                .map_err(|e| format!("not a test: {}", content_free(&e.to_string())))
        }) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(out, "{}: ERROR {e}", file.display());
            return (out, 1, 1);
        }
    };
    let dir = match Confined::open(dir) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(out, "{}: ERROR {e}", file.display());
            return (out, 1, 1);
        }
    };
    let name = test.name.clone().unwrap_or_else(|| {
        file.parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| file.display().to_string())
    });
    let loaded = match load(&test, &dir) {
        Ok(l) => l,
        Err(errors) => {
            let _ = writeln!(out, "{}: {name}: ERROR", file.display());
            for e in errors {
                let _ = writeln!(out, "        {e}");
            }
            return (out, 1, 1);
        }
    };
    let _ = writeln!(
        out,
        "{}: {name} ({} polic{}, {} pod{})",
        file.display(),
        loaded.policies.len(),
        if loaded.policies.len() == 1 {
            "y"
        } else {
            "ies"
        },
        loaded.pods.len(),
        if loaded.pods.len() == 1 { "" } else { "s" },
    );
    let mut failed = 0;
    for case in &test.cases {
        let outcome = run_case(&loaded, case, &dir);
        let pass = outcome.differences.is_empty();
        let _ = writeln!(
            out,
            "  {}  {}  ({} event{}, {} finding{})",
            if pass { "pass" } else { "FAIL" },
            case.name,
            outcome.events,
            if outcome.events == 1 { "" } else { "s" },
            outcome.findings,
            if outcome.findings == 1 { "" } else { "s" },
        );
        for d in &outcome.differences {
            let _ = writeln!(out, "        {d}");
        }
        if !pass {
            failed += 1;
        }
    }
    (out, test.cases.len(), failed)
}

/// Compiles the policies and builds the pods; every error, each with
/// where it is.
fn load(test: &TestFile, dir: &Confined) -> Result<LoadedTest, Vec<String>> {
    let mut errors = Vec::new();
    let mut policies = Vec::new();
    for file in &test.policies {
        let docs = match dir.read_text(file) {
            Ok(text) => match parse_policies(&text) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(format!("{}: {e}", dir.display(file)));
                    continue;
                }
            },
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        for rp in docs {
            match monitor_policy(&rp) {
                Ok(p) => policies.push(p),
                Err(es) => errors.extend(
                    es.into_iter()
                        .map(|e| format!("{}: {e}", dir.display(file))),
                ),
            }
        }
    }
    let mut names = BTreeSet::new();
    for p in &policies {
        if !names.insert(p.name.clone()) {
            errors.push(format!("policy {} is defined twice", p.name));
        }
    }
    let mut namespaces = test.namespaces.clone();
    let mut pods = Vec::new();
    let (mut names_seen, mut uids_seen) = (BTreeSet::new(), BTreeSet::new());
    for p in &test.pods {
        let uid = p
            .uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", p.namespace, p.name));
        let new_name = names_seen.insert((p.namespace.clone(), p.name.clone()));
        if !new_name || !uids_seen.insert(uid.clone()) {
            errors.push(format!(
                "pod {}/{} (uid {uid}) is declared twice",
                p.namespace, p.name
            ));
        }
        namespaces.entry(p.namespace.clone()).or_default();
        pods.push(PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid,
            labels: p.labels.clone(),
            owner_kind: p.owner.as_ref().map(|o| o.kind.clone()),
            owner_name: p.owner.as_ref().map(|o| o.name.clone()),
            containers: p
                .containers
                .iter()
                .map(|(name, id)| (*id, name.clone()))
                .collect(),
            container_ids: p.container_ids.clone(),
            node_name: p.node_name.clone(),
            service_account: p.service_account.clone(),
            version: 0,
        });
    }
    for (name, labels) in &mut namespaces {
        labels
            .entry(NAMESPACE_NAME_LABEL.to_string())
            .or_insert_with(|| name.clone());
    }
    if test.cases.is_empty() {
        errors.push("the test has no cases".to_string());
    }
    if errors.is_empty() {
        Ok(LoadedTest {
            policies,
            namespaces,
            pods,
        })
    } else {
        Err(errors)
    }
}

/// Every RuntimePolicy in a YAML file's text (several documents); an
/// error says which document and what was expected, without the content.
fn parse_policies(text: &str) -> Result<Vec<RuntimePolicy>, String> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| {
            format!(
                "document {}: not YAML: {}",
                i + 1,
                content_free(&e.to_string())
            )
        })?;
        if value.is_null() {
            continue;
        }
        let rp: RuntimePolicy = serde_yaml::from_value(value).map_err(|e| {
            format!(
                "document {}: not a RuntimePolicy: {}",
                i + 1,
                content_free(&e.to_string())
            )
        })?;
        out.push(rp);
    }
    Ok(out)
}

/// A policy as the daemon's engine hands it to the monitor: compiled,
/// evaluated, an omitted mode read as monitor (the API server's default).
fn monitor_policy(rp: &RuntimePolicy) -> Result<MonitorPolicy, Vec<String>> {
    let name = rp.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(vec!["a policy has no metadata.name".to_string()]);
    }
    let at = |e: &dyn fmt::Display| format!("policy {name}: {e}");
    let compiled = CompiledPolicy::compile(&rp.spec)
        .map_err(|es| es.iter().map(|e| at(e)).collect::<Vec<_>>())?;
    let evaluated = compiled
        .evaluate()
        .map_err(|es| es.iter().map(|e| at(e)).collect::<Vec<_>>())?;
    let uid = rp
        .metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("uid-{name}"));
    Ok(MonitorPolicy::new(
        name.clone(),
        uid,
        rp.spec.mode.unwrap_or_default(),
        compiled.target.clone(),
        &evaluated,
        compiled.monitor_filter.clone(),
    ))
}

fn behavior_named(name: &str) -> Option<Behavior> {
    Behavior::ALL.into_iter().find(|b| b.as_str() == name)
}

/// Runs one case on a fresh plane.
fn run_case(test: &LoadedTest, case: &TestCase, dir: &Confined) -> CaseOutcome {
    let mut outcome = CaseOutcome::default();
    let mut expected: BTreeMap<Key, Option<u64>> = BTreeMap::new();
    for e in &case.expect {
        let Some(behavior) = behavior_named(&e.behavior) else {
            outcome.differences.push(format!(
                "expected finding of unknown behavior {:?} (network, exec, open, protocol or dns)",
                e.behavior
            ));
            continue;
        };
        if e.pod.split_once('/').is_none() {
            outcome.differences.push(format!(
                "expected finding's pod {:?} is not <namespace>/<name>",
                e.pod
            ));
            continue;
        }
        let key = Key {
            policy: e.policy.clone(),
            behavior,
            target: e.target.clone(),
            enforced: e.enforced,
            pod: e.pod.clone(),
        };
        if expected.insert(key.clone(), e.count).is_some() {
            outcome.differences.push(format!("expected twice: {key}"));
        }
    }
    let shown = dir.display(&case.events);
    let text = match dir.read_text(&case.events) {
        Ok(t) => t,
        Err(e) => {
            outcome.differences.push(e.to_string());
            return outcome;
        }
    };

    let index = Index::new(None, "/proc", None);
    for pod in &test.pods {
        index.upsert(pod.clone());
    }
    let collected = Arc::new(Collected::default());
    let monitor = Monitor::new(vec![collected.clone() as Arc<dyn FindingSink>], None);
    for (name, labels) in &test.namespaces {
        monitor.set_namespace(name, labels.clone());
    }
    for p in &test.policies {
        monitor.set_policy(p.clone());
    }
    let declared: BTreeMap<(&str, &str), &str> = test
        .pods
        .iter()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p.uid.as_str()))
        .collect();
    let mut unattributed = Vec::new();
    for (line, parsed) in parse_lines(&text) {
        let mut event: Event = match parsed {
            Ok(e) => e,
            Err(e) => {
                // A line that is not JSON of the schema could be any
                // file's; the other refusals quote a field of a well-formed
                // event (a source, a protocol), which names the problem.
                let e = match e {
                    RecordError::Json(_) => content_free(&e.to_string()),
                    e => e.to_string(),
                };
                outcome.differences.push(format!("{shown}:{line}: {e}"));
                continue;
            }
        };
        outcome.events = outcome.events.saturating_add(1);
        // A recorded pod the test declares is the declared one: the test's
        // labels are what it is about.
        if let Some(uid) = event
            .pod
            .as_deref()
            .and_then(|p| declared.get(&(p.namespace.as_str(), p.name.as_str())))
        {
            event.pod = index.by_uid(uid);
        }
        if index.process(&mut event) {
            // The monitor logs each kernel refusal for an operator; here the
            // findings are the output, and the log would repeat them.
            tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
                monitor.handle(&event)
            });
        } else {
            unattributed.push(line.to_string());
        }
    }
    if !unattributed.is_empty() {
        outcome.differences.push(format!(
            "{shown}: line{} {} attributed to no declared pod (by pod, cgroup or podUid)",
            if unattributed.len() == 1 { "" } else { "s" },
            unattributed.join(", ")
        ));
    }

    let findings = std::mem::take(&mut *collected.0.lock().unwrap_or_else(PoisonError::into_inner));
    let mut got: BTreeMap<Key, u64> = BTreeMap::new();
    for f in findings {
        let key = Key {
            policy: f.policy,
            behavior: f.behavior,
            target: f.target,
            enforced: f.enforced,
            pod: format!("{}/{}", f.pod.namespace, f.pod.name),
        };
        // A count comes from the recording: two of u64::MAX saturate
        // rather than overflow (the daemon's Reports add the same way).
        let total = got.entry(key).or_default();
        *total = total.saturating_add(f.count);
    }
    outcome.findings = got.len();
    outcome.differences.extend(compare(&expected, &got));
    outcome
}

/// Every difference between what was expected and what was found.
fn compare(expected: &BTreeMap<Key, Option<u64>>, got: &BTreeMap<Key, u64>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, count) in expected {
        match (got.get(key), count) {
            (None, _) => out.push(format!(
                "missing:    {key}{}",
                count.map(|c| format!(" count={c}")).unwrap_or_default()
            )),
            (Some(found), Some(want)) if want != found => {
                out.push(format!("count:      {key}: expected {want}, found {found}"))
            }
            (Some(_), _) => {}
        }
    }
    for (key, found) in got {
        if !expected.contains_key(key) {
            out.push(format!("unexpected: {key} count={found}"));
        }
    }
    out
}
