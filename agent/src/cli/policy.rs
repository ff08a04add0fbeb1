//! `kyverno-runtime policy check FILE...`: the API server's answer and the
//! daemon's, offline.
//!
//! Each RuntimePolicy in the files (YAML, several documents per file) is
//! first reviewed as the API server reviews `kubectl apply` of it
//! (`kyverno_runtime_policy::admission`: the generated CRD's schema, every
//! validation rule, strict field validation, and the chart's
//! ValidatingAdmissionPolicy); a refusal is printed with the server's
//! field paths and messages. A policy the server would take is then
//! compiled and evaluated by the same code the daemon runs, and each
//! behavior's lists are parsed by the same functions the kernel backends
//! program from. It prints, per behavior, what would be allowed and denied
//! and every value or expression refused with its field path, and exits
//! non-zero if anything was refused: what `kubectl apply` followed by a
//! look at the status would say, before the apply.
//!
//! A policy reading data sources (`resource.get`, `resource.list`,
//! `http.get`) is evaluated over the results `--data FILE` supplies (the
//! format is `kyverno_runtime_policy::sources::DataFile`); what no file
//! supplies is reported as needing live data, which is not an error: the
//! behaviors that do not read it are still shown.

use crate::daemon::convert;
use anyhow::Context as _;
use clap::{Args, Subcommand};
use kyverno_runtime_api::runtimepolicy::{RuntimePolicyMode, RuntimePolicySpec};
use kyverno_runtime_enforce::egress::{compile_network, NameContext};
use kyverno_runtime_enforce::names::ServiceAddresses;
use kyverno_runtime_enforce::openexec::{compile_paths, Mode};
use kyverno_runtime_policy::admission::Admission;
use kyverno_runtime_policy::cel::eval::{shared_policy_context, RUNTIME_COST_BUDGET};
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_policy::rule::BehaviorLists;
use kyverno_runtime_policy::selector::NAMESPACE_NAME_LABEL;
use kyverno_runtime_policy::sources::{DataFile, DataSet};
use kyverno_runtime_policy::values::{
    parse_dns, parse_protocol, printable, BehaviorKind, ValueError,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;

/// `kyverno-runtime policy ...`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Compile and evaluate policies offline and print each behavior's
    /// resulting lists, or every error with its field path.
    Check {
        /// RuntimePolicy YAML files (`-` for stdin); several documents per file.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// What the policies' data sources return (`resource.get`,
        /// `resource.list`, `http.get`), YAML or JSON: `resources:` entries
        /// (apiVersion, resource, namespace, name and object; or items
        /// without a name, for a list) and `http:` entries (url,
        /// statusCode, body; or error). Without it, a policy reading data
        /// is reported as needing live data.
        #[arg(long, value_name = "FILE")]
        data: Option<PathBuf>,
        /// Leave out the chart's ValidatingAdmissionPolicy (the
        /// autogen-controllers annotation check), as for a cluster
        /// installed with `admissionPolicy.enabled=false`.
        #[arg(long)]
        no_chart_policy: bool,
    },
    /// Run policy tests: recorded events through the daemon's attribution
    /// and monitor, the findings compared with the expected ones.
    ///
    /// Each PATH is a `kyverno-runtime-test.yaml` or a directory searched
    /// for them. A test names RuntimePolicy files, declares namespaces and
    /// pods, and lists cases: a JSON-lines file of recorded events
    /// (docs/recorded-events.md) and the findings they must produce. Prints
    /// pass or FAIL per case with the difference; exits 1 on any failure.
    Test {
        /// Test files or directories holding them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

/// Runs the subcommand.
pub fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PolicyCommand::Check {
            files,
            data,
            no_chart_policy,
        } => check(&files, data.as_deref(), !no_chart_policy),
        PolicyCommand::Test { paths } => super::policy_test::run(&paths),
    }
}

/// `policy check FILE... [--data FILE] [--no-chart-policy]`.
fn check(
    files: &[PathBuf],
    data: Option<&std::path::Path>,
    chart_policy: bool,
) -> anyhow::Result<ExitCode> {
    let admission = admission(chart_policy).map_err(anyhow::Error::msg)?;
    let data = match data {
        None => DataSet::new(),
        Some(path) => {
            let text = super::input::read_text(path)?;
            let file: DataFile = serde_yaml::from_str(&text)
                .with_context(|| format!("{}: not a data file", path.display()))?;
            DataSet::from(&file)
        }
    };
    let mut failed = 0usize;
    let mut checked = 0usize;
    let mut needing_data = 0usize;
    for file in files {
        let text = super::input::read_text(file)?;
        let name = super::input::input_name(file);
        let mut documents = 0usize;
        // The patched serde_yaml ends the stream at a syntax error, so a
        // malformed file yields its one error and stops.
        for (i, doc) in super::yaml_docs::documents(&text).into_iter().enumerate() {
            documents += 1;
            let value = match doc {
                Ok(serde_yaml::Value::Null) => {
                    documents -= 1;
                    continue;
                }
                Ok(v) => v,
                Err(e) => {
                    crate::outln!("{name}: document {}: not YAML: {e}", i + 1)?;
                    failed += 1;
                    continue;
                }
            };
            checked += 1;
            let (out, outcome) = check_document_in(admission, value, &data);
            crate::out!("{name}: {out}")?;
            match outcome {
                Outcome::Ok => {}
                Outcome::NeedsData => needing_data += 1,
                Outcome::Refused => failed += 1,
            }
        }
        if documents == 0 {
            crate::outln!(
                "{name}: error: no policy in it (the input is empty, or holds only comments and document markers)"
            )?;
            failed += 1;
        }
    }
    crate::outln!(
        "{checked} polic{} checked, {failed} with errors{}",
        if checked == 1 { "y" } else { "ies" },
        if needing_data > 0 {
            format!(", {needing_data} needing live data (supply it with --data FILE)")
        } else {
            String::new()
        }
    )?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The API server's review, built once per process: the generated CRD,
/// and the chart's admission policy unless left out.
fn admission(chart_policy: bool) -> Result<&'static Admission, String> {
    fn build(chart_policy: bool) -> Result<Admission, String> {
        let crd = Admission::runtime_policy().map_err(|e| e.to_string())?;
        if !chart_policy {
            return Ok(crd);
        }
        let policies = super::chart_policy::policies(&crd).map_err(|e| e.to_string())?;
        Ok(policies.into_iter().fold(crd, Admission::with_policy))
    }
    static WITH_CHART_POLICY: LazyLock<Result<Admission, String>> = LazyLock::new(|| build(true));
    static CRD_ONLY: LazyLock<Result<Admission, String>> = LazyLock::new(|| build(false));
    let built = if chart_policy {
        &*WITH_CHART_POLICY
    } else {
        &*CRD_ONLY
    };
    built
        .as_ref()
        .map_err(|e| format!("policy check cannot reproduce the API server's review: {e}"))
}

/// One document checked with no data supplied: its report and whether
/// nothing was refused (what `propose` runs on its own output).
pub(crate) fn check_clean(value: serde_yaml::Value) -> (String, bool) {
    let (report, outcome) = match admission(true) {
        Ok(admission) => check_document_in(admission, value, &DataSet::new()),
        Err(e) => (format!("error: {e}\n"), Outcome::Refused),
    };
    (report, outcome != Outcome::Refused)
}

/// How a document checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Everything evaluated and every value is usable.
    Ok,
    /// Nothing refused, but some data was not supplied.
    NeedsData,
    /// Something was refused.
    Refused,
}

/// One document's report and how it checked: the API server's review,
/// then (when nothing in it stops the compiler) the daemon's.
fn check_document_in(
    admission: &Admission,
    value: serde_yaml::Value,
    data: &DataSet,
) -> (String, Outcome) {
    let json = match super::yaml_docs::to_json(&value, "") {
        Ok(j) => j,
        Err(e) => return (format!("not a RuntimePolicy: {e}\n"), Outcome::Refused),
    };
    let review = admission.review(&json);
    let stored = review.object.as_ref().unwrap_or(&json);
    let name = json
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("(unnamed)");
    // What the API server's defaulting makes of an omitted mode.
    let mode = match stored.pointer("/spec/mode") {
        None | Some(serde_json::Value::Null) => "monitor".to_owned(),
        Some(serde_json::Value::String(m)) => m.clone(),
        Some(other) => other.to_string(),
    };
    let mut out = format!("policy {name} (mode {mode})\n");
    if !review.accepted() {
        out.push_str("  refused by the API server (kubectl apply would fail):\n");
        for e in &review.errors {
            let _ = writeln!(out, "    {e}");
        }
    }
    let spec = match (&review.object, review.blocked()) {
        (Some(object), false) => serde_json::from_value::<RuntimePolicySpec>(
            object.get("spec").cloned().unwrap_or_default(),
        )
        .map_err(|e| e.to_string()),
        _ => Err(String::new()),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) if e.is_empty() => {
            out.push_str("  not compiled: the errors above come first\n");
            return (out, Outcome::Refused);
        }
        Err(e) => {
            let _ = writeln!(out, "  error: spec: the daemon cannot read it: {e}");
            return (out, Outcome::Refused);
        }
    };
    let (rest, outcome) = compile_and_evaluate(&spec, data);
    out.push_str(&rest);
    let outcome = if review.accepted() {
        outcome
    } else {
        Outcome::Refused
    };
    match outcome {
        Outcome::Ok => out.push_str("  ok\n"),
        Outcome::NeedsData => out.push_str("  ok so far: needs live data to evaluate fully\n"),
        Outcome::Refused => {}
    }
    (out, outcome)
}

/// The daemon's half: compile, evaluate, parse each list's values.
fn compile_and_evaluate(spec: &RuntimePolicySpec, data: &DataSet) -> (String, Outcome) {
    let mut out = String::new();
    let mode = spec.mode.unwrap_or_default();
    let compiled = match CompiledPolicy::compile(spec) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                let _ = writeln!(out, "  error: {e}");
            }
            return (out, Outcome::Refused);
        }
    };
    // The chart's default protected namespace (docs/threat-model.md): an
    // enforce policy whose namespaces include it does not enforce there.
    if mode == RuntimePolicyMode::Enforce {
        let kube_system =
            BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), "kube-system".to_owned())]);
        if compiled.target.namespace_selects(&kube_system) {
            let _ = writeln!(
                out,
                "  warning: spec.namespaceSelector: selects kube-system, whose pods enforce \
                 policies do not enforce on (the chart's daemon.protection)"
            );
        }
    }
    let mut missing = false;
    for source in compiled.sources() {
        let state = match data.get(source) {
            Some(Ok(_)) => "supplied",
            Some(Err(_)) => "supplied as a failure",
            None => {
                missing = true;
                "needs live data"
            }
        };
        let _ = writeln!(out, "  data: {source}: {state}");
    }
    let partial = compiled.evaluate_partial(shared_policy_context(), data, RUNTIME_COST_BUDGET);
    let (result, errors) = (partial.result, partial.errors);
    let mut refused = false;
    for e in &errors {
        if e.needs_data() {
            let _ = writeln!(out, "  {e}");
        } else {
            let _ = writeln!(out, "  error: {e}");
            refused = true;
        }
    }
    let kernel_mode = convert::kernel_mode(Some(mode)).unwrap_or(Mode::Monitor);
    let mut ok = !refused;
    for kind in BehaviorKind::ALL {
        let Some(lists) = BehaviorLists::merge(&result, kind) else {
            continue;
        };
        let mut services = Vec::new();
        let rejected: Vec<String> = match kind {
            BehaviorKind::Network => {
                // Offline no Service has an address and every node is
                // assumed to learn domains: what is checked is the values.
                let none = ServiceAddresses::new();
                let compiled = compile_network(
                    kernel_mode,
                    Some(&lists),
                    &NameContext {
                        services: &none,
                        domains: Ok(()),
                    },
                );
                services = compiled.services.iter().map(ToString::to_string).collect();
                compiled
                    .rejections
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            }
            BehaviorKind::Open | BehaviorKind::Exec => compile_paths(kernel_mode, Some(&lists))
                .1
                .iter()
                .map(ToString::to_string)
                .collect(),
            BehaviorKind::Protocol => parse_each(&lists, |v, at| parse_protocol(v, at).map(drop)),
            BehaviorKind::Dns => parse_each(&lists, |v, at| parse_dns(v, at).map(drop)),
        };
        let show = |v: &[String]| {
            if v.is_empty() {
                "(none)".to_string()
            } else {
                // A value from an expression can hold anything: a newline
                // or a bidi control is shown escaped, not acted on.
                v.iter()
                    .map(|v| printable(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let _ = writeln!(out, "  {}", lists.field.as_str());
        let _ = writeln!(out, "    allow: {}", show(&lists.allow));
        let _ = writeln!(out, "    deny:  {}", show(&lists.deny));
        if !services.is_empty() {
            let _ = writeln!(
                out,
                "    Services (each node programs their addresses from the API): {}",
                services.join(", ")
            );
        }
        for r in &rejected {
            let _ = writeln!(out, "    error: {r}");
        }
        // Accepted, so not a failure; but it cannot mean what it seems to.
        for w in convert::warnings(kind, &lists) {
            let _ = writeln!(out, "    warning: {w}");
        }
        ok &= rejected.is_empty();
    }
    let outcome = match (ok, missing || errors.iter().any(|e| e.needs_data())) {
        (false, _) => Outcome::Refused,
        (true, true) => Outcome::NeedsData,
        (true, false) => Outcome::Ok,
    };
    (out, outcome)
}

fn parse_each(
    lists: &BehaviorLists,
    parse: impl Fn(&str, &kyverno_runtime_policy::values::FieldPath) -> Result<(), ValueError>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (side, values) in [("allow", &lists.allow), ("deny", &lists.deny)] {
        let at = lists.field.field(side);
        for v in values {
            if let Err(e) = parse(v, &at) {
                out.push(e.to_string());
            }
        }
    }
    out
}
