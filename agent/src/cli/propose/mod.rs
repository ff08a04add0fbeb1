//! `kyverno-runtime propose`: from what a workload was observed doing to a
//! RuntimePolicy that allows exactly that.
//!
//! Input is a workload's monitor findings: the Reports in the cluster (the
//! default: its controller's roll-up Report and its pods' Reports), a
//! Report file (`--report-file`), or the reference collector's JSON lines
//! (`--collector-file`). [`build`] turns them into the proposal; the
//! documents it writes are checked with `policy check`'s own code before
//! they are printed, so a proposal that would not compile is an error here,
//! not at `kubectl apply`.

mod build;
mod cluster;
mod input;

use anyhow::{bail, Context as _};
use build::{Options, Provenance, Workload, WIDEST_IPV4_PREFIX, WIDEST_IPV6_PREFIX};
use clap::Args;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

/// Longest object name Kubernetes accepts (a DNS-1123 subdomain).
const MAX_NAME_LEN: usize = 253;

/// Flags of `kyverno-runtime propose`.
#[derive(Debug, Args)]
#[command(after_long_help = DISCOVERY_HELP)]
pub struct ProposeArgs {
    /// The workload: KIND/NAME, as kubectl names it (deployment/web,
    /// statefulset/db, daemonset/agent, job/x, cronjob/y, replicaset/z,
    /// pod/web-0). A pod with a controller is taken up to it. Required
    /// with the cluster as input; with a file, needed only when the file
    /// holds several workloads.
    pub workload: Option<String>,
    /// The workload's namespace (default: the kubeconfig context's with
    /// the cluster as input; with a file, the one the findings name).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Read the findings from an OpenReports Report file (YAML or JSON; a
    /// Report, several, or a List as `kubectl get reports -o yaml` writes
    /// it; `-` for stdin) instead of the cluster. Needs --match-label.
    #[arg(long, value_name = "FILE", conflicts_with = "collector_file")]
    pub report_file: Option<PathBuf>,
    /// Read the findings from the JSON lines of `kyverno-runtime collector`
    /// (`-` for stdin) instead of the cluster. Needs --match-label.
    #[arg(long, value_name = "FILE")]
    pub collector_file: Option<PathBuf>,
    /// A label of the workload's pods for the policy's podSelector
    /// (repeat for several). Default with the cluster as input: the
    /// controller's pod template labels, or the pod's labels, without the
    /// ones Kubernetes generates per pod or revision.
    #[arg(long = "match-label", value_name = "KEY=VALUE")]
    pub match_labels: Vec<String>,
    /// The proposed policy's name (default: <workload name>-observed). A
    /// dns policy, when names were resolved, gets <name>-dns.
    #[arg(long)]
    pub name: Option<String>,
    /// Use only the findings of this policy (repeat for several; default:
    /// every policy's).
    #[arg(long = "policy", value_name = "POLICY")]
    pub policies: Vec<String>,
    /// Leave out what was seen fewer times than this (added up over the
    /// workload's pods and every node).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub min_count: u64,
    /// The same for open paths alone (default: --min-count). Open values
    /// are exact paths (no wildcard, no directory), so a workload's long
    /// tail of files cannot be grouped: this leaves rare ones out instead,
    /// each named in the output with its count.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub open_min_count: Option<u64>,
    /// Aggregate IPv4 destinations sharing a prefix of this length into
    /// the narrowest CIDR covering them (16 to 32; never wider than asked).
    /// Off by default: every destination is allowed as the address seen.
    #[arg(long, value_name = "PREFIX", value_parser = clap::value_parser!(u8).range(WIDEST_IPV4_PREFIX as i64..=32))]
    pub aggregate_ipv4: Option<u8>,
    /// The same for IPv6 (48 to 128).
    #[arg(long, value_name = "PREFIX", value_parser = clap::value_parser!(u8).range(WIDEST_IPV6_PREFIX as i64..=128))]
    pub aggregate_ipv6: Option<u8>,
    /// Write the policy here instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// What `propose --help` ends with: how to get findings worth proposing.
const DISCOVERY_HELP: &str = "\
Discovery first. A monitor finding exists only for what a policy would deny, so the workload
must run under a monitor policy that denies everything for each behavior you want proposed
(the discovery form), for long enough to do everything it normally does:

  apiVersion: runtime.nirmata.io/v1alpha1
  kind: RuntimePolicy
  metadata: {name: discover-web}
  spec:
    mode: monitor
    podSelector: {matchLabels: {app: web}}
    behaviors:
    - exec: {deny: {values: [\"*\"]}}
    - open: {deny: {values: [\"*\"]}}
    - network: {deny: {values: [\"*\"]}}
    - protocol: {deny: {values: [\"*\"]}}
    - dns: {deny: {values: [\"*\"]}}

Then `kyverno-runtime propose -n NAMESPACE deployment/web > web.yaml` writes a policy (mode
monitor) whose behaviors allow what was seen and deny everything else; what it left out, and
why, is listed in its comment block and on stderr. Apply it, check its Report stays empty,
then set spec.mode to enforce. DNS names go to a second, monitor-only policy: a dns behavior
cannot be enforced.";

/// Runs propose.
pub fn run(args: ProposeArgs) -> anyhow::Result<ExitCode> {
    let mut labels = BTreeMap::new();
    for l in &args.match_labels {
        let Some((k, v)) = l.split_once('=') else {
            bail!("--match-label {l:?} is not KEY=VALUE");
        };
        labels.insert(k.to_string(), v.to_string());
    }
    let wanted = args
        .workload
        .as_deref()
        .map(input::parse_workload)
        .transpose()?;

    let offline = args.report_file.clone().or(args.collector_file.clone());
    let (workload, sightings, sources) = match offline {
        Some(path) => {
            let found = if args.report_file.is_some() {
                let reports = input::read_report_file(&path)?;
                let mut found = Vec::new();
                let mut skipped = 0;
                for r in &reports {
                    let (f, s) = input::report_findings(r);
                    found.extend(f);
                    skipped += s;
                }
                if skipped > 0 {
                    eprintln!("{skipped} result(s) not written by kyverno-runtime skipped");
                }
                found
            } else {
                input::read_collector_file(&path)?
            };
            let (w, sightings) = input::select(
                found,
                args.namespace.as_deref(),
                wanted.as_ref().map(|(k, n)| (*k, n.as_str())),
            )?;
            if labels.is_empty() {
                bail!(
                    "a file does not say which labels {w}'s pods carry: pass --match-label KEY=VALUE \
                     (the podSelector of the proposed policy)"
                );
            }
            let workload = Workload {
                namespace: w.namespace,
                kind: w.kind,
                name: w.name,
                labels: labels.clone(),
            };
            let what = if args.report_file.is_some() {
                "the Report file"
            } else {
                "the collector lines"
            };
            (
                workload,
                sightings,
                vec![format!("{what} {}", path.display())],
            )
        }
        None => {
            let Some((kind, name)) = wanted else {
                bail!("name the workload as KIND/NAME (deployment/web, pod/web-0, ...)");
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            crate::cli::input::check_kubeconfig()?;
            let (mut workload, sightings, sources) = runtime.block_on(async {
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to the cluster (KUBECONFIG or in-cluster)")?;
                let namespace = args
                    .namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string());
                cluster::gather(&client, &namespace, kind, &name).await
            })?;
            if sources.is_empty() {
                bail!(
                    "no Report about {workload} or its pods: run it under a monitor policy that denies \
                     everything first (see `kyverno-runtime propose --help`)"
                );
            }
            if !labels.is_empty() {
                workload.labels = labels.clone();
            }
            let sources = vec![format!(
                "the Report{} {}",
                if sources.len() == 1 { "" } else { "s" },
                sources.join(", ")
            )];
            (workload, sightings, sources)
        }
    };
    if workload.labels.is_empty() {
        bail!(
            "{workload}'s pods carry no labels: the policy would select every pod of namespace {}; \
             label them, or pass --match-label",
            workload.namespace
        );
    }
    let wanted_policy =
        |s: &&build::Sighting| args.policies.is_empty() || args.policies.contains(&s.policy);
    let monitor_findings = sightings
        .iter()
        .filter(wanted_policy)
        .filter(|s| !s.enforced)
        .count();
    if monitor_findings == 0 {
        bail!(
            "no monitor finding about {workload}{} ({} findings read): run it under a monitor policy \
             that denies everything first (see `kyverno-runtime propose --help`)",
            if args.policies.is_empty() {
                String::new()
            } else {
                format!(" of policy {}", args.policies.join(", "))
            },
            sightings.len()
        );
    }

    let options = Options {
        name: args
            .name
            .clone()
            .unwrap_or_else(|| default_name(&workload.name)),
        policies: args.policies.clone(),
        min_count: args.min_count,
        open_min_count: args.open_min_count.unwrap_or(args.min_count),
        aggregate_ipv4: args.aggregate_ipv4,
        aggregate_ipv6: args.aggregate_ipv6,
    };
    let proposal = build::propose(&workload, &sightings, &options);
    let provenance = Provenance {
        sources,
        policies: sightings
            .iter()
            .filter(|s| options.policies.is_empty() || options.policies.contains(&s.policy))
            .map(|s| s.policy.clone())
            .collect::<BTreeSet<_>>(),
    };
    let yaml = proposal.to_yaml(&workload, &provenance);
    self_check(&yaml)?;

    match &args.output {
        Some(path) => {
            std::fs::write(path, &yaml).with_context(|| format!("writing {}", path.display()))?
        }
        None => crate::cli::out::write_all(yaml.as_bytes())?,
    }
    let behaviors = proposal.policy.spec.behaviors.as_ref().map_or(0, Vec::len);
    eprintln!(
        "proposed {}{} for {workload}: {} value{} allowed over {behaviors} behavior entr{}, {} left out",
        options.name,
        if proposal.dns_policy.is_some() {
            format!(" and {}", build::dns_policy_name(&options.name))
        } else {
            String::new()
        },
        proposal.allowed,
        if proposal.allowed == 1 { "" } else { "s" },
        if behaviors == 1 { "y" } else { "ies" },
        proposal.left_out.len()
    );
    for l in &proposal.left_out {
        eprintln!("  left out: {l}");
    }
    for n in &proposal.notes {
        eprintln!("  note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `<name>-observed`, cut so it stays a valid name with `-dns` after it.
fn default_name(workload: &str) -> String {
    let suffix = "-observed";
    let room = MAX_NAME_LEN - suffix.len() - "-dns".len();
    let mut base: String = workload.chars().take(room).collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    format!("{base}{suffix}")
}

/// Every document through `policy check`'s code: a proposal that would
/// not compile (a label `--match-label` got wrong) fails here.
fn self_check(yaml: &str) -> anyhow::Result<()> {
    use serde::Deserialize as _;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc).context("the proposal is not YAML")?;
        let (report, ok) = super::policy::check_clean(value);
        if !ok {
            bail!("the proposed policy does not check:\n{report}");
        }
    }
    Ok(())
}
