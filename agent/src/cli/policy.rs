//! `kyverno-runtime policy check FILE...`: the daemon's answer, offline.
//!
//! Each RuntimePolicy in the files (YAML, several documents per file) is
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
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_enforce::egress::{compile_network, NameContext};
use kyverno_runtime_enforce::names::ServiceAddresses;
use kyverno_runtime_enforce::openexec::{compile_paths, Mode};
use kyverno_runtime_policy::cel::eval::{shared_policy_context, RUNTIME_COST_BUDGET};
use kyverno_runtime_policy::compile::CompiledPolicy;
use kyverno_runtime_policy::sources::{DataFile, DataSet};
use kyverno_runtime_policy::values::{
    parse_dns, parse_protocol, printable, BehaviorKind, ValueError,
};
use serde::Deserialize as _;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

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
        PolicyCommand::Check { files, data } => check(&files, data.as_deref()),
        PolicyCommand::Test { paths } => super::policy_test::run(&paths),
    }
}

/// `policy check FILE... [--data FILE]`.
fn check(files: &[PathBuf], data: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
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
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = match serde_yaml::Value::deserialize(doc) {
                Ok(serde_yaml::Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    crate::outln!("{}: document {}: not YAML: {e}", file.display(), i + 1)?;
                    failed += 1;
                    continue;
                }
            };
            checked += 1;
            let (out, outcome) = check_document(value, &data);
            crate::out!("{}: {out}", file.display())?;
            match outcome {
                Outcome::Ok => {}
                Outcome::NeedsData => needing_data += 1,
                Outcome::Refused => failed += 1,
            }
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

/// One document checked with no data supplied: its report and whether
/// nothing was refused (what `propose` runs on its own output).
pub(crate) fn check_clean(value: serde_yaml::Value) -> (String, bool) {
    let (report, outcome) = check_document(value, &DataSet::new());
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

/// One document's report and how it checked.
pub(crate) fn check_document(value: serde_yaml::Value, data: &DataSet) -> (String, Outcome) {
    let rp: RuntimePolicy = match serde_yaml::from_value(value) {
        Ok(rp) => rp,
        Err(e) => return (format!("not a RuntimePolicy: {e}\n"), Outcome::Refused),
    };
    let name = rp
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "(unnamed)".into());
    // What the API server's defaulting does: an omitted mode is monitor.
    let mode = rp.spec.mode.unwrap_or_default();
    let mut out = format!("policy {name} (mode {})\n", mode.as_str());
    let compiled = match CompiledPolicy::compile(&rp.spec) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                let _ = writeln!(out, "  error: {e}");
            }
            return (out, Outcome::Refused);
        }
    };
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
        let Some(lists) = convert::lists(&result, kind) else {
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
    match outcome {
        Outcome::Ok => out.push_str("  ok\n"),
        Outcome::NeedsData => out.push_str("  ok so far: needs live data to evaluate fully\n"),
        Outcome::Refused => {}
    }
    (out, outcome)
}

fn parse_each(
    lists: &kyverno_runtime_enforce::openexec::BehaviorLists,
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
