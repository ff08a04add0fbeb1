//! Fault tier (issue 34, item 1): the API server goes away while the
//! daemon enforces, and nothing the kernel enforces changes.
//!
//! It starts its own control plane (`ci/kube-up --dir <tempdir>`; the
//! shared one, and anyone else's processes, are never touched: only the
//! PIDs in that directory's pid files are signalled), the daemon against
//! it, and an enforce policy that denies one loopback address and allows
//! another, for a pod whose container cgroup is real. A connect loop runs
//! in that cgroup the whole time and counts connects that went through to
//! the denied address and connects refused to the allowed one. Faults:
//!
//! 1. steady state: kube-apiserver SIGSTOPped for the outage, then SIGCONT;
//! 2. mid-change: a policy edit applied, the server SIGSTOPped right after;
//! 3. mid-change: an edit, then the server SIGKILLed and, after the outage,
//!    restarted from its own command line (same port, certificates, etcd:
//!    `ci/kube-up --dir` would discard a directory whose server is dead and
//!    start a new cluster, so it cannot restart one);
//! 4. mid-change under the server (item 2): an edit, then etcd SIGKILLed
//!    and, after the outage, restarted from its own command line (same data
//!    directory). The API server keeps answering; it says it is not ready.
//! 5. writes refused (item 6): an edit, then every status, Report and Event
//!    write of the daemon answered 500 (a validating webhook that cannot
//!    be called, `failurePolicy: Fail`);
//! 6. writes throttled (item 6): the same writes answered 429 Too Many
//!    Requests, by a webhook of the test's own (`common/throttle.rs`)
//!    whose code the API server passes through. For both: the refused
//!    writes are counted by kind and bounded (retried with backoff, not
//!    in a loop), and nothing is lost once the server takes them again.
//!
//! Each prints one row: what was injected, the longest enforcement gap
//! (goal 0), time to detect (the log line, the metric (`api_reachable 0`,
//! or `api_ready 0` for etcd) and the `/healthz` detail all present), time
//! to recover (the API answering, the
//! edit in the kernel and the status at the new generation), and writes
//! lost (Event writes failed after their retries or dropped while held,
//! and Report findings dropped as write_failed; both asserted 0: an Event
//! whose write the server did not answer is held until it does).
//!
//! Needs root (cgroup v2, bpffs, cgroup_skb). Outages last 30 s; `--long`
//! (or `KRT_FAULTS_LONG=1`) makes them 5 minutes. Run by `ci/faults`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::faults::{healthz, wait_for_ok, ConnectLoop, OwnCluster, Part};
use common::host::HostPod;
use common::throttle::ThrottlingWebhook;
use common::*;
use kyverno_runtime_testkube::LocalCluster;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const NODE: &str = "faults-node";
const NS: &str = "faults";
const POLICY: &str = "faults-net";
const DENIED: &str = "127.0.0.12";
const CHANGED: &str = "127.0.0.13";
/// How long the daemon may take to say the API is unreachable.
const DETECT_WITHIN: Duration = Duration::from_secs(30);

/// The policy with `extra` denied beside [`DENIED`].
fn policy(extra: &[&str]) -> String {
    let mut values = vec![format!("\"{DENIED}/32\"")];
    values.extend(extra.iter().map(|a| format!("\"{a}/32\"")));
    format!(
        "apiVersion: runtime.nirmata.io/v1alpha1\nkind: RuntimePolicy\nmetadata:\n  name: {POLICY}\nspec:\n  mode: enforce\n  podSelector: {{matchLabels: {{app: faults}}}}\n  behaviors:\n  - network: {{deny: {{values: [{}]}}}}\n",
        values.join(", ")
    )
}

/// The policy's generation, if its status is at that generation: this
/// node's shard (enforcement available) and every condition decided for
/// it, TargetsValid and PodsMatched true.
fn status_current(cluster: &LocalCluster) -> Option<i64> {
    let rp = get_json(cluster, &["rpol", POLICY])?;
    let generation = rp["metadata"]["generation"].as_i64()?;
    let own = rp["status"]["nodes"]
        .as_array()?
        .iter()
        .find(|s| s["nodeName"] == NODE)?
        .clone();
    let conditions = rp["status"]["conditions"].as_array()?;
    let current = own["observedGeneration"].as_i64() == Some(generation)
        && !conditions.is_empty()
        && conditions
            .iter()
            .all(|c| c["observedGeneration"].as_i64() == Some(generation))
        && own["enforcementAvailable"] == true
        // Applied and EnforcementAvailable stay Unknown here: no DaemonSet
        // places the daemon, so which nodes must report is not known.
        && conditions
            .iter()
            .filter(|c| c["type"] == "TargetsValid" || c["type"] == "PodsMatched")
            .all(|c| c["status"] == "True");
    current.then_some(generation)
}

/// What the daemon's writes lost so far: Event writes failed after their
/// retries or dropped because too many were held while the server was
/// away, Report findings dropped as write_failed. (Status writes are not
/// counted: the next flush rewrites the whole shard, and recovery waits
/// for it.)
fn writes_lost(metrics: SocketAddr) -> (u64, u64) {
    let text = scrape(metrics).unwrap_or_default();
    (
        series_sum(&text, &["event_writes_failed_total"])
            + series_sum(
                &text,
                &[
                    "events_dropped_total",
                    "source=\"events\"",
                    "reason=\"queue_full\"",
                ],
            ),
        series_sum(
            &text,
            &[
                "events_dropped_total",
                "source=\"reporter\"",
                "reason=\"write_failed\"",
            ],
        ),
    )
}

/// What the daemon must say about a fault: the server cannot be reached,
/// it answers but is not ready, or it refuses the daemon's writes.
#[derive(Clone, Copy)]
enum Verdict {
    Unreachable,
    NotReady,
    WritesRefused,
}

impl Verdict {
    /// The warning, the `/healthz` words, and the info line once it is
    /// over.
    fn words(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Verdict::Unreachable => (
                "the API server is unreachable",
                "unreachable since",
                "the API server answers again",
            ),
            Verdict::NotReady => (
                "the API server answers but is not ready",
                "not ready since",
                "the API server is ready again",
            ),
            Verdict::WritesRefused => (
                "writes to the API server keep failing",
                "write status failing since",
                "writes to the API server succeed again",
            ),
        }
    }

    /// The metric that says it: `api_reachable 0`, `api_ready 0`, or
    /// status writes failing for longer than the threshold.
    fn metric(self) -> &'static str {
        match self {
            Verdict::Unreachable => "api_reachable=0",
            Verdict::NotReady => "api_ready=0",
            Verdict::WritesRefused => "api_failing_seconds{resource=status}>15",
        }
    }

    /// Whether `text` (a scrape) says it (`during`) or says it is over.
    fn metric_says(self, text: &str, during: bool) -> bool {
        match self {
            Verdict::Unreachable => {
                series(text, &["nirmata_runtime_api_reachable "]) == Some(u64::from(!during))
            }
            Verdict::NotReady => {
                series(text, &["nirmata_runtime_api_ready "]) == Some(u64::from(!during))
            }
            Verdict::WritesRefused => {
                let failing = |resource: &str| {
                    series(
                        text,
                        &[
                            "nirmata_runtime_api_failing_seconds{",
                            &format!("resource=\"{resource}\""),
                        ],
                    )
                    .unwrap_or(0)
                };
                if during {
                    failing("status") > 15
                } else {
                    ["status", "reports", "events"]
                        .iter()
                        .all(|r| failing(r) == 0)
                }
            }
        }
    }
}

/// Writes of status, Reports and Events the daemon saw fail so far.
fn writes_failed(metrics: SocketAddr) -> [u64; 3] {
    let text = scrape(metrics).unwrap_or_default();
    ["status", "reports", "events"].map(|resource| {
        series_sum(
            &text,
            &[
                "nirmata_runtime_api_failures_total{",
                &format!("resource=\"{resource}\""),
            ],
        )
    })
}

/// A validating webhook that cannot be called (a closed loopback port,
/// `failurePolicy: Fail`) on every write the daemon makes, so the API
/// server answers each with a 500; nothing else writes these.
fn refusing_webhook(port: u16) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: faults-refuse-writes}}
webhooks:
- name: refuse.faults.kyverno-runtime.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 2
  clientConfig: {{url: \"https://127.0.0.1:{port}/refuse\"}}
  rules:
  - {{operations: [CREATE, UPDATE], apiGroups: [runtime.nirmata.io], apiVersions: [\"*\"], resources: [runtimepolicies/status]}}
  - {{operations: [CREATE, UPDATE], apiGroups: [openreports.io], apiVersions: [\"*\"], resources: [reports]}}
  - {{operations: [CREATE, UPDATE], apiGroups: [events.k8s.io, \"\"], apiVersions: [\"*\"], resources: [events]}}
"
    )
}

struct Row {
    fault: String,
    gap: f64,
    leaked: usize,
    refused: usize,
    samples: usize,
    detect: Duration,
    recover: Duration,
    lost: (u64, u64),
}

/// How a fault takes the control plane away, and how it comes back.
enum Inject {
    /// kube-apiserver SIGSTOPped, then SIGCONTed.
    Pause,
    /// The part SIGKILLed, then restarted from its own command line.
    Kill(Part),
}

struct Rig<'a> {
    own: &'a mut OwnCluster,
    daemon: &'a mut Daemon,
    metrics: SocketAddr,
    cgroup: PathBuf,
    changed: SocketAddr,
    connects: &'a ConnectLoop,
}

impl Rig<'_> {
    /// Waits until the log line, the metric and the /healthz detail all
    /// say the API is unreachable; returns how long after `since`.
    /// `seen`: the daemon's log lines before the fault (only what the
    /// fault made it say counts).
    fn detect(&mut self, verdict: Verdict, since: Instant, seen: usize) -> Duration {
        let (said, healthz_says, _) = verdict.words();
        let (mut log, mut metric, mut health) = (None, None, None);
        loop {
            if log.is_none() && self.daemon.log()[seen..].iter().any(|l| l.contains(said)) {
                log = Some(since.elapsed());
            }
            let text = scrape(self.metrics).expect("/metrics answers during the outage");
            if metric.is_none() && verdict.metric_says(&text, true) {
                metric = Some(since.elapsed());
            }
            let (code, body) = healthz(self.metrics).expect("/healthz answers during the outage");
            if health.is_none() && body.contains(healthz_says) {
                assert_eq!(code, 200, "{body}");
                println!("  /healthz {code}: {}", body.trim().replace('\n', " | "));
                health = Some(since.elapsed());
            }
            if let (Some(l), Some(m), Some(h)) = (log, metric, health) {
                println!(
                    "  detected: log line {l:.1?}, {} {m:.1?}, /healthz {h:.1?}",
                    verdict.metric()
                );
                return l.max(m).max(h);
            }
            assert!(
                since.elapsed() < DETECT_WITHIN,
                "not said within {DETECT_WITHIN:?}: log {log:?}, metric {metric:?}, healthz {health:?}\n{}",
                self.daemon.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the API answers (metric and log line), the status is at
    /// the current generation and `changed` is (not) reachable from the
    /// pod as the last edit says; returns how long after `since`.
    fn recover(
        &mut self,
        verdict: Verdict,
        since: Instant,
        seen: usize,
        changed_denied: bool,
    ) -> Duration {
        let (_, _, over) = verdict.words();
        let mut answered = None;
        let recovered = wait_for("recovery", Duration::from_secs(180), || {
            let text = scrape(self.metrics)?;
            if answered.is_none()
                && verdict.metric_says(&text, false)
                && self.daemon.log()[seen..].iter().any(|l| l.contains(over))
            {
                answered = Some(since.elapsed());
            }
            let generation = status_current(&self.own.cluster)?;
            let reach = host::connects_within(&self.cgroup, &self.changed.to_string(), "1");
            (answered.is_some() && reach != changed_denied).then(|| (since.elapsed(), generation))
        });
        println!(
            "  recovered: API answering {:.1?}, edit applied and status at generation {} {:.1?}",
            answered.unwrap(),
            recovered.1,
            recovered.0
        );
        recovered.0
    }

    /// One fault: `edit` applied (if any), the control plane taken away
    /// by `inject` for `outage`, then given back; its row, with detection
    /// judged by `verdict` and recovery by `changed_denied`.
    #[allow(clippy::too_many_arguments)]
    fn fault(
        &mut self,
        label: String,
        announce: String,
        edit: Option<String>,
        inject: Inject,
        verdict: Verdict,
        changed_denied: bool,
        outage: Duration,
    ) -> Row {
        let (from, lost0) = (self.connects.len(), writes_lost(self.metrics));
        println!("{announce}");
        if let Some(edit) = edit {
            apply(&self.own.cluster, &edit);
        }
        let seen = self.daemon.log().len();
        let killed = match inject {
            Inject::Pause => {
                self.own.signal(Part::Apiserver, "STOP");
                None
            }
            Inject::Kill(part) => Some((part, self.own.kill(part))),
        };
        let injected = Instant::now();
        let detect = self.detect(verdict, injected, seen);
        std::thread::sleep(outage.saturating_sub(injected.elapsed()));
        match &killed {
            None => self.own.signal(Part::Apiserver, "CONT"),
            Some((part, args)) => self.own.restart(*part, args),
        }
        let given_back = Instant::now();
        wait_for("the server ready again", Duration::from_secs(60), || {
            self.own.ready().then_some(())
        });
        println!("  server ready in {:.1?}", given_back.elapsed());
        let recover = self.recover(verdict, given_back, seen, changed_denied);
        self.row(label, from, detect, recover, lost0)
    }

    /// Every write of the daemon refused for `outage` by the webhook
    /// `config` (named `name`), right after `edit`: the row, with the
    /// refused writes counted by kind and bounded (retries with backoff,
    /// not a loop). `changed_denied`: whether the edit denies CHANGED.
    #[allow(clippy::too_many_arguments)]
    fn writes_refused(
        &mut self,
        label: String,
        announce: String,
        config: &str,
        name: &str,
        edit: &str,
        changed_denied: bool,
        outage: Duration,
    ) -> Row {
        let (from, lost0) = (self.connects.len(), writes_lost(self.metrics));
        let failed0 = writes_failed(self.metrics);
        println!("{announce}");
        apply(&self.own.cluster, config);
        apply(&self.own.cluster, edit);
        let seen = self.daemon.log().len();
        let refused = Instant::now();
        let detect = self.detect(Verdict::WritesRefused, refused, seen);
        std::thread::sleep(outage.saturating_sub(refused.elapsed()));
        self.own
            .cluster
            .kubectl_ok(&["delete", "validatingwebhookconfiguration", name])
            .unwrap();
        let window = refused.elapsed();
        let failed = writes_failed(self.metrics);
        let tries: Vec<u64> = failed
            .iter()
            .zip(failed0)
            .map(|(now, then)| now - then)
            .collect();
        println!(
            "  refused writes in {:.0?}: status {}, Reports {}, Events {}",
            window, tries[0], tries[1], tries[2]
        );
        let recover = self.recover(Verdict::WritesRefused, Instant::now(), seen, changed_denied);
        let row = self.row(label, from, detect, recover, lost0);
        // Bounded retries: a write kind tried at most about once a second
        // (the test's flush intervals are 1 s) plus its retries' backoff,
        // not in a loop.
        let bound = 3 * window.as_secs().max(1);
        for (what, n) in ["status", "Reports", "Events"].iter().zip(&tries) {
            assert!(
                *n <= bound,
                "{what} writes tried {n} times in {window:?}: a retry loop"
            );
        }
        assert!(
            tries[0] > 0,
            "no status write was refused: the fault did not bite"
        );
        row
    }

    fn row(
        &self,
        fault: String,
        from: usize,
        detect: Duration,
        recover: Duration,
        lost0: (u64, u64),
    ) -> Row {
        let (leaked, refused, samples, gap) = self.connects.since(from);
        let text = scrape(self.metrics).expect("/metrics answers");
        assert!(
            text.contains("nirmata_runtime_api_failures_total"),
            "{text}"
        );
        Row {
            fault,
            gap,
            leaked,
            refused,
            samples,
            detect,
            recover,
            lost: {
                let now = writes_lost(self.metrics);
                (now.0 - lost0.0, now.1 - lost0.1)
            },
        }
    }
}

fn main() {
    let long = std::env::args().any(|a| a == "--long")
        || std::env::var_os("KRT_FAULTS_LONG").is_some_and(|v| v == "1");
    let outage = if long {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(30)
    };
    let dir = tempdir();
    let mut own = OwnCluster::up(dir.path().join("kube"));
    let cluster = own.cluster.clone();
    let crds = Command::new(env!("CARGO_BIN_EXE_kyverno-runtime"))
        .args(["crd", "--all"])
        .output()
        .unwrap();
    apply(&cluster, &String::from_utf8(crds.stdout).unwrap());
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/runtimepolicies.runtime.nirmata.io",
            "crd/reports.openreports.io",
        ])
        .unwrap();
    namespace(&cluster, NS, "team: faults");
    apply(&cluster, &policy(&[]));
    let id = "fa".repeat(32);
    let uid = running_pod(
        &cluster,
        NS,
        "faults-web",
        NODE,
        "app: faults",
        &format!("containerd://{id}"),
    );
    let pod = HostPod::new(dir.path(), &uid, &id);

    let denied_l = std::net::TcpListener::bind(format!("{DENIED}:0")).unwrap();
    let allowed_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let changed_l = std::net::TcpListener::bind(format!("{CHANGED}:0")).unwrap();
    let (denied, allowed, changed) = (
        denied_l.local_addr().unwrap(),
        allowed_l.local_addr().unwrap(),
        changed_l.local_addr().unwrap(),
    );
    // Accepted connections are dropped at once; the backlog never fills.
    for l in [&denied_l, &allowed_l, &changed_l] {
        let l = l.try_clone().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                drop(c)
            }
        });
    }

    let metrics = free_loopback();
    let pins = pod.pins();
    let mut daemon = Daemon::start(
        &[
            "--metrics-addr",
            &metrics.to_string(),
            "--status-interval",
            "1s",
            "--drain-interval",
            "1s",
            "--report-interval",
            "1s",
            "--events-enabled=true",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", cluster.kubeconfig.to_str().unwrap()),
        ],
    );
    daemon.wait_log("pods on this node listed", Duration::from_secs(60));
    wait_for("the deny in the kernel", Duration::from_secs(30), || {
        (!host::connects_within(&pod.container, &denied.to_string(), "1")).then_some(())
    });
    if wait_for_ok(Duration::from_secs(30), || status_current(&cluster)).is_none() {
        panic!(
            "no current status: {}",
            get_json(&cluster, &["rpol", POLICY]).unwrap()["status"]
        );
    }
    let connects = ConnectLoop::start(&pod.container, denied, allowed);
    wait_for("the connect loop", Duration::from_secs(10), || {
        (connects.len() >= 2).then_some(())
    });
    println!("enforcing: {denied} denied, {allowed} allowed; outages of {outage:?}");

    let mut rig = Rig {
        own: &mut own,
        daemon: &mut daemon,
        metrics,
        cgroup: pod.container.clone(),
        changed,
        connects: &connects,
    };
    let mut rows = Vec::new();
    let secs = outage.as_secs();

    // 1. Steady state: paused, then continued.
    rows.push(rig.fault(
        format!("SIGSTOP {secs} s, steady state"),
        format!("fault 1: SIGSTOP kube-apiserver {secs} s, steady state"),
        None,
        Inject::Pause,
        Verdict::Unreachable,
        false,
        outage,
    ));
    // 2. Mid-change: an edit the daemon may not have seen, then paused.
    rows.push(rig.fault(
        format!("edit + SIGSTOP {secs} s"),
        format!("fault 2: edit (deny {CHANGED} too), then SIGSTOP kube-apiserver {secs} s"),
        Some(policy(&[CHANGED])),
        Inject::Pause,
        Verdict::Unreachable,
        true,
        outage,
    ));
    // 3. Mid-change: an edit, then killed; restarted after the outage.
    rows.push(rig.fault(
        format!("edit + SIGKILL, restart after {secs} s"),
        format!("fault 3: edit (allow {CHANGED} again), then SIGKILL kube-apiserver, restart after {secs} s"),
        Some(policy(&[])),
        Inject::Kill(Part::Apiserver),
        Verdict::Unreachable,
        false,
        outage,
    ));
    // 4. Mid-change under the server: an edit, then etcd killed; the API
    // server keeps answering, not ready; etcd restarted after the outage.
    rows.push(rig.fault(
        format!("edit + SIGKILL etcd, restart after {secs} s"),
        format!("fault 4: edit (deny {CHANGED} again), then SIGKILL etcd, restart after {secs} s"),
        Some(policy(&[CHANGED])),
        Inject::Kill(Part::Etcd),
        Verdict::NotReady,
        true,
        outage,
    ));

    // 5. Writes refused: every status, Report and Event write answered
    // with a 500 (item 6), right after an edit whose status must be
    // written; enforcement goes on, the writes are retried with backoff
    // and what they carry is kept.
    rows.push(rig.writes_refused(
        format!("edit + every write refused (500) {secs} s"),
        format!("fault 5: edit (allow {CHANGED} again), then every write of the daemon refused (500) for {secs} s"),
        &refusing_webhook(free_loopback().port()),
        "faults-refuse-writes",
        &policy(&[]),
        false,
        outage,
    ));

    // 6. Writes throttled: the same writes answered 429 Too Many Requests
    // (a webhook of the test's own answers each review with code 429,
    // which the API server passes through), as by a server shedding load.
    let throttle = ThrottlingWebhook::start();
    rows.push(rig.writes_refused(
        format!("edit + every write throttled (429) {secs} s"),
        format!("fault 6: edit (deny {CHANGED} again), then every write of the daemon answered 429 for {secs} s"),
        &throttle.configuration("faults-throttle-writes"),
        "faults-throttle-writes",
        &policy(&[CHANGED]),
        true,
        outage,
    ));
    println!(
        "  the webhook answered {} reviews with 429",
        throttle.reviews()
    );
    assert!(throttle.reviews() > 0, "no write reached the 429 webhook");

    println!();
    println!(
        "| fault | longest enforcement gap | denied connected / allowed refused (of connects) | time to detect | time to recover | writes lost (Events / Report findings) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.1} s | {} / {} (of {}) | {:.1} s | {:.1} s | {} / {} |",
            r.fault,
            r.gap,
            r.leaked,
            r.refused,
            r.samples,
            r.detect.as_secs_f64(),
            r.recover.as_secs_f64(),
            r.lost.0,
            r.lost.1
        );
    }
    let (status, _, log) = daemon.terminate(Duration::from_secs(15));
    assert!(status.success(), "{}", log.join("\n"));
    // Detection and recovery were asserted as they were measured; the
    // rest is asserted here, after the table is printed.
    for r in &rows {
        assert_eq!(
            (r.leaked, r.refused),
            (0, 0),
            "{}: enforcement changed",
            r.fault
        );
        assert!(
            r.gap == 0.0,
            "{}: an enforcement gap of {} s",
            r.fault,
            r.gap
        );
        assert_eq!(r.lost.0, 0, "{}: Events lost", r.fault);
        assert_eq!(r.lost.1, 0, "{}: Report findings lost", r.fault);
    }
    let cgroup = pod.container.clone();
    drop(connects);
    // The cgroup is removable once the loop's last connect has exited.
    let _ = wait_for_ok(Duration::from_secs(5), || {
        std::fs::read_to_string(cgroup.join("cgroup.procs"))
            .ok()
            .filter(|p| p.trim().is_empty())
    });
    drop(pod);
}
