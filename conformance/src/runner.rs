//! The runner, on the host: loads and checks the scenarios, builds the
//! daemon, finds or starts the local control plane, boots each
//! configuration in `vmtest` as a node of it (one boot per configuration,
//! the scenarios in sequence inside), runs the host as a node too with
//! `--host`, and prints the matrix.

use crate::node::{NodeLine, Plan, MARK};
use anyhow::{bail, Context as _};
use clap::Args;
use conformance::config::{self, Config};
use conformance::results::{Cell, NodeRun, Run};
use conformance::scenario::{self, Scenario};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The DaemonSet's namespace (its own, so a developer's `daemon_vm` runs
/// against the same control plane do not interfere).
const SYSTEM_NAMESPACE: &str = "krt-conformance-system";
/// Where a guest finds its plan and kubeconfig.
const GUEST_DIR: &str = "/etc/krt-conformance";
/// The environment variable that can name `--break` (for CI wrappers).
const BREAK_ENV: &str = "KRT_CONFORMANCE_BREAK";

/// Flags of a run.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kernel series to boot (5.10, 6.1, 6.12, 7.x); `none` or empty for
    /// no VM.
    #[arg(long, default_value = "5.10,6.1,6.12,7.x")]
    kernels: String,
    /// LSM modes to boot each kernel in (bpf, nobpf).
    #[arg(long, default_value = "bpf,nobpf")]
    lsm: String,
    /// Exact configurations instead of --kernels x --lsm, e.g.
    /// `6.12-bpf,5.10-nobpf` (what ci/test runs).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["kernels", "lsm"])]
    config: Vec<String>,
    /// Also run the host as a node (a restricted node on the build
    /// machines: no open/exec backend, network works). Needs root.
    #[arg(long)]
    host: bool,
    /// Run only these scenarios (repeat, or comma-separate).
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// Write the results as JUnit XML.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Test mode: flip one expected outcome (`SCENARIO` for its first
    /// flippable step, `SCENARIO:STEP` for step STEP) so the run must fail
    /// with a readable difference.
    #[arg(long = "break", env = BREAK_ENV, value_name = "SCENARIO[:STEP]")]
    break_: Option<String>,
    /// The scenario directory.
    #[arg(long)]
    scenarios: Option<PathBuf>,
    /// Run these scenario files instead of the directory's (repeat): a
    /// replay, e.g. of what `ci/differential` wrote for a disagreement.
    #[arg(long, conflicts_with = "scenarios")]
    replay: Vec<PathBuf>,
    /// The daemon binary; by default `cargo build -p kyverno-runtime` is
    /// run and its binary used (a stale daemon would answer for new code).
    #[arg(long)]
    daemon_bin: Option<PathBuf>,
    /// Print the scenarios and exit (after checking them all).
    #[arg(long)]
    list: bool,
    /// Print every step of every scenario, and the daemon's log.
    #[arg(long, short)]
    verbose: bool,
    /// Real nodes to run on as well (repeat, or comma-separate):
    /// `NAME[=BACKEND]`, BACKEND being the open/exec backend the node's
    /// daemon must use (bpf_lsm, fmod_ret, none). The chart must be
    /// installed; `ci/conformance-real` prepares everything.
    #[arg(long = "real-node", value_delimiter = ',')]
    real_node: Vec<crate::real::RealNodeArg>,
    /// On real nodes: the suite's image (`ci/node-image suite`).
    #[arg(long, requires = "real_node")]
    suite_image: Option<String>,
    /// On real nodes: the image of the scenarios' containers (busybox).
    #[arg(long, default_value = "localhost/kyverno-runtime-busybox:1")]
    workload_image: String,
    /// On real nodes: the chart's namespace.
    #[arg(long, default_value = "kyverno-runtime")]
    daemon_namespace: String,
    /// On real nodes: a node label the chart's nodeSelector names; the
    /// runner sets it on the node under test alone, so the daemon runs
    /// on one node at a time and each policy's cluster-wide conditions
    /// speak of that node, as in the harness. Without it the daemons stay
    /// where they are (and a restricted node makes enforce policies
    /// unavailable cluster-wide).
    #[arg(long)]
    select_label: Option<String>,
}

/// The runner's entry point.
pub fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let repo = kyverno_runtime_testkube::repo_root();
    let dir = args
        .scenarios
        .clone()
        .unwrap_or_else(|| repo.join("conformance/scenarios"));
    let mut all = if args.replay.is_empty() {
        scenario::load_dir(&dir)?
    } else {
        scenario::load_files(&args.replay)?
    };
    if args.list {
        for s in &all {
            let not_on: Vec<String> = s
                .not_on
                .iter()
                .map(|n| format!("not on {}: {}", n.nodes, n.reason))
                .collect();
            println!(
                "{:<28} {} steps  {}",
                s.name,
                s.steps.len(),
                s.description.lines().next().unwrap_or_default()
            );
            for n in not_on {
                println!("{:<28} ({n})", "");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Every policy the loaded files name, before --scenario narrows them.
    let leftovers_of = policy_names(&all);
    if !args.scenario.is_empty() {
        let known: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
        for want in &args.scenario {
            if !known.contains(want) {
                return Err(conformance::Error::UnknownScenario {
                    name: want.clone(),
                    known: known.join(", "),
                }
                .into());
            }
        }
        all.retain(|s| args.scenario.contains(&s.name));
    }
    let broken = match &args.break_ {
        Some(spec) if !spec.is_empty() => Some(apply_break(&mut all, spec)?),
        _ => None,
    };
    let configs = if args.config.is_empty() {
        let kernels = match args.kernels.trim() {
            "" | "none" => Vec::new(),
            list => vmtest::parse_series_list(list)?,
        };
        config::matrix(&kernels, &vmtest::parse_lsm_list(&args.lsm)?)
    } else {
        args.config
            .iter()
            .map(|c| config::parse(c))
            .collect::<conformance::Result<Vec<_>>>()?
    };
    if configs.is_empty() && !args.host && args.real_node.is_empty() {
        bail!("nothing to run: no kernel, no --host and no --real-node");
    }
    let suite_image = match (&args.suite_image, args.real_node.is_empty()) {
        (Some(i), _) => i.clone(),
        (None, true) => String::new(),
        (None, false) => bail!("--real-node needs --suite-image (ci/node-image suite builds it)"),
    };
    if let Some(b) = &broken {
        println!("--break: {b} (this run must fail)");
    }
    let cluster = kyverno_runtime_testkube::LocalCluster::get()
        .context("the local control plane (ci/kube-up)")?;
    install_crds(cluster, &repo)?;
    remove_leftover_policies(cluster, &leftovers_of)?;
    println!(
        "{} scenarios on {} node(s); API server from {}",
        all.len(),
        configs.len() + usize::from(args.host) + args.real_node.len(),
        cluster.kubeconfig.display()
    );
    let mut nodes = Vec::new();
    // The daemon is built only for the nodes that run it themselves.
    let mut bins = if configs.is_empty() && !args.host {
        None
    } else {
        Some(binaries(&args)?)
    };
    if let Some(bins) = bins.as_mut() {
        for &config in &configs {
            let node = run_vm(config, &all, bins, cluster, args.verbose);
            summarize(&node);
            nodes.push(node);
        }
        if args.host {
            let node = run_host(&all, bins, cluster, args.verbose);
            summarize(&node);
            nodes.push(node);
        }
    }
    let real = crate::real::RealRun {
        cluster,
        suite_image: &suite_image,
        workload_image: &args.workload_image,
        daemon_namespace: &args.daemon_namespace,
        verbose: args.verbose,
        select_label: args.select_label.as_deref(),
        all_nodes: &args.real_node,
    };
    for node in &args.real_node {
        let node = real.run(node, &all);
        summarize(&node);
        nodes.push(node);
    }
    real.unselect();
    let run = Run {
        scenarios: all.iter().map(|s| s.name.clone()).collect(),
        nodes,
        broken,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    println!("\n{}", run.table());
    if let Some(path) = &args.junit {
        std::fs::write(path, run.junit()).with_context(|| format!("writing {}", path.display()))?;
        println!("JUnit XML: {}", path.display());
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&run.json())?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    Ok(if run.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The names of every policy the scenarios apply (up front or in a step).
fn policy_names(all: &[Scenario]) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for s in all {
        names.extend(s.policies.iter().map(|p| p.name.clone()));
        for step in &s.steps {
            if let scenario::StepKind::ApplyPolicy(p) = &step.kind {
                names.insert(p.name.clone());
            }
        }
    }
    names.into_iter().collect()
}

/// Deletes what an interrupted earlier run may have left of the suite's
/// own policies (each scenario removes only its own, before and after
/// it runs): a policy left by another scenario selects this one's pods by
/// their labels and refuses what this one expects delivered.
fn remove_leftover_policies(
    cluster: &kyverno_runtime_testkube::LocalCluster,
    names: &[String],
) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let mut args = vec!["delete", "rpol", "--ignore-not-found"];
    args.extend(names.iter().map(String::as_str));
    let out = cluster
        .kubectl_ok(&args)
        .context("removing the suite's policies left by an earlier run")?;
    let removed: Vec<&str> = out.lines().filter(|l| l.contains("deleted")).collect();
    if !removed.is_empty() {
        println!(
            "removed {} policies an earlier run left: {}",
            removed.len(),
            removed.join("; ")
        );
    }
    Ok(())
}

fn apply_break(all: &mut [Scenario], spec: &str) -> anyhow::Result<String> {
    let (name, step) =
        match spec.split_once(':') {
            Some((n, s)) => (
                n,
                Some(s.parse::<usize>().map_err(|_| {
                    conformance::Error::Break(format!("{s:?} is not a step number"))
                })?),
            ),
            None => (spec, None),
        };
    let known: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
    let Some(s) = all.iter_mut().find(|s| s.name == name) else {
        return Err(conformance::Error::UnknownScenario {
            name: name.to_string(),
            known: known.join(", "),
        }
        .into());
    };
    Ok(scenario::break_one(s, step)?)
}

fn summarize(node: &NodeRun) {
    let failed = node
        .cells
        .iter()
        .filter(|c| c.verdict == conformance::results::Verdict::Fail)
        .count();
    println!(
        "== node {} ({}{}): {} results, {failed} failed, {:.0}s{}",
        node.node,
        node.config,
        node.kernel
            .as_deref()
            .map(|k| format!(", kernel {k}"))
            .unwrap_or_default(),
        node.cells.len(),
        node.seconds,
        node.error
            .as_deref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default()
    );
}

/// The binaries a node needs.
struct Binaries {
    daemon: PathBuf,
    relay: Option<PathBuf>,
    me: PathBuf,
    busybox: PathBuf,
    /// Stripped copies of this program and the daemon for the guests,
    /// made once (a rebuild during a long run must not change them).
    guest: Option<tempfile::TempDir>,
}

impl Binaries {
    /// The stripped copies for the guests, made on first use.
    fn for_guests(&mut self) -> anyhow::Result<(PathBuf, PathBuf)> {
        if self.guest.is_none() {
            let dir = tempfile::tempdir()?;
            strip(&self.me, &dir.path().join("conformance"))?;
            strip(&self.daemon, &dir.path().join("kyverno-runtime"))?;
            self.guest = Some(dir);
        }
        let dir = self
            .guest
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .context("no guest binaries")?;
        Ok((dir.join("conformance"), dir.join("kyverno-runtime")))
    }
}

fn binaries(args: &RunArgs) -> anyhow::Result<Binaries> {
    let me = std::env::current_exe().context("finding this program")?;
    let busybox = match std::env::var_os("VMTEST_BUSYBOX") {
        Some(p) => PathBuf::from(p),
        None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("busybox"))
            .find(|p| p.is_file())
            .context("no busybox on PATH (install busybox-static or set VMTEST_BUSYBOX)")?,
    };
    if let Some(daemon) = &args.daemon_bin {
        return Ok(Binaries {
            daemon: daemon.clone(),
            relay: None,
            me,
            busybox,
            guest: None,
        });
    }
    // The daemon and the guest network's relay, built now so a run never
    // tests a stale daemon; cargo is quick when nothing changed.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("building the daemon (cargo build -p kyverno-runtime -p vmtest --bins)");
    let mut build = Command::new(cargo);
    // What `cargo run` set for this package: a build script that tracks
    // CARGO_MANIFEST_DIR (ring's) would otherwise rebuild on every run.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&key.as_ref())
        {
            build.env_remove(key.as_ref());
        }
    }
    let out = build
        .current_dir(kyverno_runtime_testkube::repo_root())
        .args([
            "build",
            "--locked",
            "--message-format=json-render-diagnostics",
            "-p",
            "kyverno-runtime",
            "--bin",
            "kyverno-runtime",
            "-p",
            "vmtest",
            "--bin",
            "vmtest-relay",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build")?;
    if !out.status.success() {
        bail!("cargo build failed");
    }
    let mut daemon = None;
    let mut relay = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        match msg["target"]["name"].as_str() {
            Some("kyverno-runtime") => daemon = Some(PathBuf::from(exe)),
            Some("vmtest-relay") => relay = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    Ok(Binaries {
        daemon: daemon.context("cargo built no kyverno-runtime binary")?,
        relay,
        me,
        busybox,
        guest: None,
    })
}

fn install_crds(
    cluster: &kyverno_runtime_testkube::LocalCluster,
    repo: &Path,
) -> anyhow::Result<()> {
    for dir in [
        "charts/kyverno-runtime/crds",
        "charts/kyverno-runtime/files/openreports",
    ] {
        let path = repo.join(dir);
        cluster
            .kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &path.to_string_lossy(),
            ])
            .with_context(|| format!("applying {dir}"))?;
    }
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/runtimepolicies.runtime.nirmata.io",
        "crd/reports.openreports.io",
    ])?;
    Ok(())
}

fn strip(from: &Path, to: &Path) -> anyhow::Result<()> {
    let ok = Command::new("strip")
        .arg("--strip-debug")
        .arg(from)
        .arg("-o")
        .arg(to)
        .status()
        .context("running strip")?;
    if !ok.success() {
        bail!("strip {} failed", from.display());
    }
    Ok(())
}

/// The admin kubeconfig pointed at the guest's forward; the API server's
/// port on the host.
fn guest_kubeconfig(
    cluster: &kyverno_runtime_testkube::LocalCluster,
) -> anyhow::Result<(String, u16)> {
    let mut config: serde_json::Value =
        serde_json::from_str(&cluster.kubectl_ok(&["config", "view", "--raw", "-o", "json"])?)
            .context("reading the kubeconfig")?;
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("no server in the kubeconfig")?
        .to_string();
    let port: u16 = server
        .rsplit(':')
        .next()
        .map(|p| p.trim_end_matches('/'))
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("no port in {server}"))?;
    config["clusters"][0]["cluster"]["server"] =
        format!("https://{}:{port}", vmtest::FORWARD_ADDR).into();
    Ok((config.to_string(), port))
}

/// The per-boot time limit: generous for TCG on a loaded machine (a
/// scenario takes 2 to 16 s there, a node 130 to 205 s for all 20), yet a
/// guest that hangs costs 20 minutes of a CI run at most, not an hour.
fn boot_timeout(scenarios: &[Scenario]) -> Duration {
    Duration::from_secs(300 + 45 * u64::try_from(scenarios.len()).unwrap_or(100))
}

fn run_vm(
    config: Config,
    scenarios: &[Scenario],
    bins: &mut Binaries,
    cluster: &kyverno_runtime_testkube::LocalCluster,
    verbose: bool,
) -> NodeRun {
    let started = Instant::now();
    let mut node = NodeRun {
        node: config.node_name(),
        config: config.to_string(),
        kernel: None,
        seconds: 0.0,
        error: None,
        retried_after: Vec::new(),
        cells: Vec::new(),
    };
    let Config::Vm { series, lsm } = config else {
        node.error = Some("not a VM".into());
        return node;
    };
    println!("\n== booting {} as node {}", config, node.node);
    let prepared = (|| -> anyhow::Result<(vmtest::VmSpec, tempfile::TempDir)> {
        let cache = vmtest::Cache::from_env()?;
        let kernel = vmtest::resolve_kernel(series, &cache)?;
        let work = tempfile::tempdir()?;
        let (me, daemon) = bins.for_guests()?;
        let (kubeconfig, port) = guest_kubeconfig(cluster)?;
        std::fs::write(work.path().join("kubeconfig"), kubeconfig)?;
        let plan = Plan {
            node: node.node.clone(),
            config: node.config.clone(),
            expected_open_exec: config.expected_open_exec(false).map(str::to_string),
            daemon: "/bin/kyverno-runtime".into(),
            me: "/bin/conformance".into(),
            busybox: "/bin/busybox".into(),
            bpffs: "/run/krt-conformance/bpffs".into(),
            metrics_addr: "127.0.0.1:9090".into(),
            system_namespace: SYSTEM_NAMESPACE.into(),
            verbose,
            scenarios: scenarios.to_vec(),
            real: None,
        };
        std::fs::write(work.path().join("plan.json"), serde_json::to_string(&plan)?)?;
        let mut spec = vmtest::VmSpec::new(
            kernel,
            lsm,
            vec![
                "conformance".into(),
                "node".into(),
                "--plan".into(),
                format!("{GUEST_DIR}/plan.json"),
            ],
        );
        spec.binaries = vec![me, daemon];
        spec.files = vec![
            (
                work.path().join("kubeconfig"),
                PathBuf::from(format!("{GUEST_DIR}/kubeconfig")),
            ),
            (
                work.path().join("plan.json"),
                PathBuf::from(format!("{GUEST_DIR}/plan.json")),
            ),
        ];
        spec.env = vec![("KUBECONFIG".into(), format!("{GUEST_DIR}/kubeconfig"))];
        spec.host_forwards = vec![vmtest::HostForward::new(port, port)];
        spec.relay = bins.relay.clone();
        spec.memory_mib = 1024;
        spec.timeout = boot_timeout(scenarios);
        Ok((spec, work))
    })();
    let (spec, _work) = match prepared {
        Ok(p) => p,
        Err(e) => {
            node.error = Some(format!("preparing the boot: {e:#}"));
            node.seconds = started.elapsed().as_secs_f64();
            return node;
        }
    };
    node.kernel = Some(spec.kernel.version.clone());
    // One retry when the guest itself failed (TCG guests crash now and
    // then in timer code): the earlier failure stays in the results, its
    // whole console tail printed (whether the crash is in code of ours, a
    // BPF program, or the emulator's shows in its trace).
    let (result, earlier) = vmtest::run_with_retries(&spec, 1);
    for e in &earlier {
        println!(
            "   the guest failed ({}); booting it again\n{}",
            e.label(),
            indent(&format!("{e}\n"))
        );
        node.retried_after.push(
            format!("{e}")
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        );
    }
    match result {
        Ok(outcome) => {
            let (cells, line) = parse_output(&outcome.output);
            print!("{}", indent(&outcome.output));
            if let Some(l) = line {
                node.kernel = Some(l.kernel);
            }
            node.cells = cells;
            if outcome.exit_code != 0 {
                node.error = Some(format!(
                    "the node exited {} after {:.0}s; console tail:\n{}",
                    outcome.exit_code,
                    outcome.duration.as_secs_f64(),
                    tail(&outcome.console, 15)
                ));
            }
        }
        Err(e) => {
            node.error = Some(format!("{}: {}", e.label(), tail(&e.to_string(), 20)));
        }
    }
    node.seconds = started.elapsed().as_secs_f64();
    node
}

fn run_host(
    scenarios: &[Scenario],
    bins: &Binaries,
    cluster: &kyverno_runtime_testkube::LocalCluster,
    verbose: bool,
) -> NodeRun {
    let started = Instant::now();
    let config = Config::Host;
    let mut node = NodeRun {
        node: config.node_name(),
        config: config.to_string(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string()),
        seconds: 0.0,
        error: None,
        retried_after: Vec::new(),
        cells: Vec::new(),
    };
    println!("\n== the host as node {}", node.node);
    let result = (|| -> anyhow::Result<()> {
        if !nix::unistd::Uid::effective().is_root() {
            bail!("the host node needs root (cgroups, bpffs, BPF programs)");
        }
        let work = tempfile::tempdir()?;
        // A free port for /metrics: the host is shared.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let expect_restricted = std::env::var("KRT_EXPECT_HOST").is_ok_and(|v| v == "restricted");
        let plan = Plan {
            node: node.node.clone(),
            config: node.config.clone(),
            expected_open_exec: config
                .expected_open_exec(expect_restricted)
                .map(str::to_string),
            daemon: bins.daemon.clone(),
            me: bins.me.clone(),
            busybox: bins.busybox.clone(),
            bpffs: work.path().join("bpffs"),
            metrics_addr: format!("127.0.0.1:{port}"),
            system_namespace: SYSTEM_NAMESPACE.into(),
            verbose,
            scenarios: scenarios.to_vec(),
            real: None,
        };
        let plan_path = work.path().join("plan.json");
        std::fs::write(&plan_path, serde_json::to_string(&plan)?)?;
        let mut child = Command::new(&bins.me)
            .args(["node", "--plan"])
            .arg(&plan_path)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the host node")?;
        let output = echo_node_output(child.stdout.take().context("no stdout")?);
        let status = child.wait()?;
        let (cells, _) = parse_output(&output);
        node.cells = cells;
        if !status.success() {
            bail!("the host node exited {status}");
        }
        Ok(())
    })();
    if let Err(e) = result {
        node.error = Some(format!("{e:#}"));
    }
    node.seconds = started.elapsed().as_secs_f64();
    node
}

/// Reads a node's output to its end, printing its human lines (indented)
/// as they come; returns all of it, result lines included.
pub(crate) fn echo_node_output(out: impl std::io::Read) -> String {
    let mut output = String::new();
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        if !line.starts_with(MARK) {
            println!("   {line}");
        }
        output.push_str(&line);
        output.push('\n');
    }
    output
}

/// The result lines of a node's output.
pub(crate) fn parse_output(output: &str) -> (Vec<Cell>, Option<NodeLine>) {
    let mut cells = Vec::new();
    let mut node = None;
    for line in output.lines() {
        let Some(rest) = line.strip_prefix(MARK) else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(json) = rest.strip_prefix("cell ") {
            if let Ok(c) = serde_json::from_str::<Cell>(json) {
                cells.push(c);
            }
        } else if let Some(json) = rest.strip_prefix("node ") {
            node = serde_json::from_str::<NodeLine>(json).ok();
        }
    }
    (cells, node)
}

/// A node's human lines, indented (the result lines are for the runner).
fn indent(output: &str) -> String {
    output
        .lines()
        .filter(|l| !l.starts_with(MARK))
        .map(|l| format!("   {l}\n"))
        .collect()
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
