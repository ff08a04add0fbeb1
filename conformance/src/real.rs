//! The runner's real-node mode (`--real-node NAME[=BACKEND]`): the same
//! scenarios on nodes whose kubelet and container runtime are real and
//! whose daemon is the chart's, installed by helm (`ci/conformance-real`
//! does both). On each node, one after the other, the suite runs as a
//! privileged pod in the node's PID namespace (`conformance node` with a
//! plan that says real): the scenarios' pods are created through the API
//! and started by the node's runtime, each action is a process in the real
//! container (its cgroup, its network, its files), and the checks read
//! the chart's daemon through its Reports, status and `/metrics`.

use crate::node::{Plan, RealNode};
use anyhow::{bail, Context as _};
use conformance::results::NodeRun;
use conformance::scenario::Scenario;
use kyverno_runtime_testkube::LocalCluster;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The namespace of the suite's own pods (never selected by a scenario).
const SUITE_NAMESPACE: &str = "krt-conformance-suite";
/// Where the suite's pod finds its plan.
const PLAN_DIR: &str = "/etc/krt-conformance";
/// How long the suite's pod may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A real node to run on, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealNodeArg {
    /// The Node's name.
    pub name: String,
    /// The open/exec backend its daemon must use (`bpf_lsm`, `fmod_ret`,
    /// `none`), when stated.
    pub backend: Option<String>,
}

impl std::str::FromStr for RealNodeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, backend) = match s.split_once('=') {
            Some((n, b)) => (n, Some(b.to_string())),
            None => (s, None),
        };
        if name.is_empty() {
            return Err(format!("{s:?}: a node name is needed (NAME[=BACKEND])"));
        }
        if let Some(b) = &backend {
            if !["bpf_lsm", "fmod_ret", "none"].contains(&b.as_str()) {
                return Err(format!(
                    "{s:?}: the backend must be bpf_lsm, fmod_ret or none, not {b:?}"
                ));
            }
        }
        Ok(RealNodeArg {
            name: name.to_string(),
            backend,
        })
    }
}

/// What every real node's run shares.
pub struct RealRun<'a> {
    /// The control plane.
    pub cluster: &'a LocalCluster,
    /// The suite's image (this program and the daemon's, busybox).
    pub suite_image: &'a str,
    /// The scenarios' containers' image.
    pub workload_image: &'a str,
    /// The chart's namespace.
    pub daemon_namespace: &'a str,
    /// Print every step.
    pub verbose: bool,
    /// The node label the chart's `nodeSelector` names: set on the node
    /// under test only, so the chart's daemon runs there alone and every
    /// policy's cluster-wide conditions speak of that node (as in the
    /// harness, where one node runs at a time). `None`: the daemons stay
    /// where they are.
    pub select_label: Option<&'a str>,
    /// Every real node of the run (the label leaves the others).
    pub all_nodes: &'a [RealNodeArg],
}

impl RealRun<'_> {
    /// Runs the scenarios on one real node.
    pub fn run(&self, node: &RealNodeArg, scenarios: &[Scenario]) -> NodeRun {
        let started = Instant::now();
        let mut run = NodeRun {
            node: node.name.clone(),
            config: "real node".into(),
            kernel: None,
            seconds: 0.0,
            error: None,
            retried_after: Vec::new(),
            cells: Vec::new(),
        };
        println!(
            "\n== the real node {} (the chart's daemon, pods by its kubelet)",
            node.name
        );
        let pod = format!("suite-{}", node.name);
        let result = self
            .select(&node.name)
            .and_then(|()| self.run_pod(node, &pod, scenarios, &mut run));
        if let Err(e) = result {
            run.error = Some(format!("{e:#}"));
        }
        // What the suite made for this node; the namespace stays for the
        // next node.
        let _ = self.cluster.kubectl_output(&[
            "-n",
            SUITE_NAMESPACE,
            "delete",
            "pod,configmap",
            &pod,
            "--ignore-not-found",
            "--grace-period=1",
        ]);
        run.seconds = started.elapsed().as_secs_f64();
        run
    }

    /// Moves the chart's daemon to `node` alone (see `select_label`) and
    /// waits until no daemon runs anywhere else.
    fn select(&self, node: &str) -> anyhow::Result<()> {
        let Some(key) = self.select_label else {
            return Ok(());
        };
        for other in self.all_nodes.iter().filter(|n| n.name != node) {
            self.cluster
                .kubectl_ok(&["label", "node", &other.name, &format!("{key}-")])?;
        }
        self.cluster
            .kubectl_ok(&["label", "node", node, &format!("{key}=true"), "--overwrite"])?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let elsewhere: Vec<String> = self
                .cluster
                .kubectl_ok(&[
                    "-n",
                    self.daemon_namespace,
                    "get",
                    "pods",
                    "-o",
                    "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}",
                ])?
                .lines()
                .filter(|n| !n.is_empty() && *n != node)
                .map(str::to_string)
                .collect();
            if elsewhere.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the chart's daemon still runs on {} ({} s after {node} alone was labelled {key})",
                    elsewhere.join(", "),
                    START_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Takes the label off every node again.
    pub fn unselect(&self) {
        if let Some(key) = self.select_label {
            for n in self.all_nodes {
                let _ =
                    self.cluster
                        .kubectl_output(&["label", "node", &n.name, &format!("{key}-")]);
            }
        }
    }

    fn run_pod(
        &self,
        node: &RealNodeArg,
        pod: &str,
        scenarios: &[Scenario],
        run: &mut NodeRun,
    ) -> anyhow::Result<()> {
        let plan = Plan {
            node: node.name.clone(),
            config: run.config.clone(),
            expected_open_exec: node.backend.clone(),
            daemon: "/usr/local/bin/kyverno-runtime".into(),
            me: "/usr/local/bin/conformance".into(),
            busybox: "/bin/busybox".into(),
            bpffs: "/sys/fs/bpf".into(),
            metrics_addr: String::new(),
            system_namespace: self.daemon_namespace.into(),
            verbose: self.verbose,
            scenarios: scenarios.to_vec(),
            real: Some(RealNode {
                daemon_namespace: self.daemon_namespace.into(),
                workload_image: self.workload_image.into(),
            }),
        };
        // An earlier run's pod of the same name goes first.
        self.cluster.kubectl_ok(&[
            "-n",
            SUITE_NAMESPACE,
            "delete",
            "pod",
            pod,
            "--ignore-not-found",
            "--wait",
        ])?;
        self.apply(&self.manifests(pod, &node.name, &serde_json::to_string(&plan)?))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let phase = self.pod_field(pod, "{.status.phase}")?;
            if phase != "Pending" && !phase.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the suite's pod {pod} did not start in {}s: {}",
                    START_TIMEOUT.as_secs(),
                    self.cluster
                        .kubectl_output(&["-n", SUITE_NAMESPACE, "get", "pod", pod, "-o", "json"])
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut logs = self
            .cluster
            .kubectl()
            .args(["-n", SUITE_NAMESPACE, "logs", "-f", pod])
            .stdout(Stdio::piped())
            .spawn()
            .context("following the suite pod's log")?;
        let output = crate::runner::echo_node_output(logs.stdout.take().context("no stdout")?);
        let _ = logs.wait();
        let (cells, line) = crate::runner::parse_output(&output);
        run.cells = cells;
        run.kernel = line.map(|l| l.kernel);
        // The log ends when the container does; its status follows.
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            let code = self.pod_field(
                pod,
                "{.status.containerStatuses[0].state.terminated.exitCode}",
            )?;
            if !code.is_empty() {
                break code;
            }
            if Instant::now() > deadline {
                bail!("the suite's pod {pod} had not ended 60 s after its log did");
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        if code != "0" {
            bail!("the suite's pod on {} exited {code}", node.name);
        }
        Ok(())
    }

    /// A field of the suite's pod, by JSONPath (empty when unset).
    fn pod_field(&self, pod: &str, path: &str) -> anyhow::Result<String> {
        Ok(self
            .cluster
            .kubectl_ok(&[
                "-n",
                SUITE_NAMESPACE,
                "get",
                "pod",
                pod,
                "-o",
                &format!("jsonpath={path}"),
            ])?
            .trim()
            .to_string())
    }

    /// The namespace, the suite's account (it writes what a scenario
    /// needs: namespaces, pods, policies, Services), its plan and its pod.
    fn manifests(&self, pod: &str, node: &str, plan: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SUITE_NAMESPACE}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "suite", "namespace": SUITE_NAMESPACE}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": SUITE_NAMESPACE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "ServiceAccount", "name": "suite", "namespace": SUITE_NAMESPACE}]},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": pod, "namespace": SUITE_NAMESPACE},
             "data": {"plan.json": plan}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": pod, "namespace": SUITE_NAMESPACE},
             "spec": {
                "nodeName": node,
                "serviceAccountName": "suite",
                // The node's processes: the containers' cgroups, mounts
                // and networks are reached through their PIDs.
                "hostPID": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "suite",
                    "image": self.suite_image,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/local/bin/conformance", "node", "--plan",
                                format!("{PLAN_DIR}/plan.json")],
                    "securityContext": {"privileged": true},
                    "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR}]
                }],
                "volumes": [{"name": "plan", "configMap": {"name": pod}}]
             }}
        ]})
    }

    fn apply(&self, manifest: &serde_json::Value) -> anyhow::Result<()> {
        self.cluster
            .kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())
            .context("kubectl apply of the suite's pod")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_node_is_named_with_an_optional_backend() {
        assert_eq!(
            "krt-vm-node=bpf_lsm".parse::<RealNodeArg>(),
            Ok(RealNodeArg {
                name: "krt-vm-node".into(),
                backend: Some("bpf_lsm".into())
            })
        );
        assert_eq!(
            "krt-node".parse::<RealNodeArg>(),
            Ok(RealNodeArg {
                name: "krt-node".into(),
                backend: None
            })
        );
        assert!("=bpf_lsm".parse::<RealNodeArg>().is_err());
        assert!("krt-node=lsm"
            .parse::<RealNodeArg>()
            .is_err_and(|e| e.contains("bpf_lsm, fmod_ret or none")));
    }
}
