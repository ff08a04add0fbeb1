//! The daemon restart step: SIGTERM, the mutations made while no daemon
//! runs, a new daemon, and the actions that must hold throughout (no
//! enforcement gap across a restart). Harness nodes only: on a real node
//! the chart's DaemonSet owns the daemon (`Scenario::real_node_gap`).

use super::steps::{label, ScenarioRun};
use super::NodeHalf;
use anyhow::bail;
use conformance::scenario::{describe_expectation, Restart, Scenario, StepKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

impl NodeHalf {
    /// SIGTERM, the mutations made while no daemon runs, a new daemon;
    /// the `throughout` actions are tried over and over from before the
    /// signal until the new daemon has listed its pods, and each must have
    /// its outcome every time: no enforcement gap.
    pub(super) fn restart(
        &mut self,
        s: &Scenario,
        run: &mut ScenarioRun,
        r: &Restart,
    ) -> anyhow::Result<String> {
        let old = self.daemon.take();
        let stop = AtomicBool::new(false);
        let down = AtomicBool::new(false);
        // (checks, checks while no daemon ran, differences)
        let tally: Mutex<(u32, u32, Vec<String>)> = Mutex::new((0, 0, Vec::new()));
        let mut phases: Vec<String> = Vec::new();
        let mut updates = Vec::new();
        let this: &NodeHalf = self;
        let run_ref: &ScenarioRun = run;
        let (restarted, polled) = std::thread::scope(|scope| {
            let poller = scope.spawn(|| -> anyhow::Result<()> {
                while !stop.load(Ordering::SeqCst) {
                    for step in &r.throughout {
                        let StepKind::Action {
                            action,
                            expect,
                            errno,
                        } = &step.kind
                        else {
                            continue;
                        };
                        let was_down = down.load(Ordering::SeqCst);
                        let seen = this.attempt(s, run_ref, action)?;
                        let mut t = tally.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                        t.0 += 1;
                        if was_down {
                            t.1 += 1;
                        }
                        if !seen.matches(*expect, errno) && t.2.len() < 5 {
                            let when = if was_down {
                                "while no daemon ran"
                            } else {
                                "around the restart"
                            };
                            let broken = if step.broken {
                                ", flipped by --break"
                            } else {
                                ""
                            };
                            t.2.push(format!(
                                "{action}: expected {}{broken}, observed {seen} {when}",
                                describe_expectation(&step.kind)
                            ));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            });
            let restarted = (|| -> anyhow::Result<super::Daemon> {
                // Checks with the old daemon first.
                std::thread::sleep(Duration::from_millis(800));
                let start = Instant::now();
                if let Some(d) = old {
                    let (status, took) = d.terminate(Duration::from_secs(20))?;
                    if !status.success() {
                        bail!("the daemon exited {status} on SIGTERM");
                    }
                    phases.push(format!("SIGTERM: stopped in {:.1}s", took.as_secs_f64()));
                }
                down.store(true, Ordering::SeqCst);
                for m in &r.while_down {
                    if let StepKind::Action {
                        action,
                        expect,
                        errno,
                    } = &m.kind
                    {
                        // One try: with no daemon, nothing changes by waiting.
                        let seen = this.attempt(s, run_ref, action)?;
                        if !seen.matches(*expect, errno) {
                            let wanted = describe_expectation(&m.kind);
                            let flipped = if m.broken {
                                " (flipped by --break)"
                            } else {
                                ""
                            };
                            bail!("{action} while no daemon ran: expected {wanted}{flipped}, observed {seen}");
                        }
                        phases.push(format!("{action} while no daemon ran: {seen}"));
                        continue;
                    }
                    let (what, update) = this.mutation(s, run_ref, &m.kind)?;
                    phases.push(format!("{} while no daemon ran: {what}", label(m, run_ref)));
                    updates.extend(update);
                }
                // Long enough for several checks with no daemon at all.
                std::thread::sleep(Duration::from_secs(2));
                let mut d = super::Daemon::start(&this.daemon_cfg, &r.args)?;
                down.store(false, Ordering::SeqCst);
                d.wait_log("pods on this node listed", Duration::from_secs(180))?;
                phases.push(format!(
                    "the new daemon{} listed its pods {:.1}s after the SIGTERM",
                    if r.args.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", r.args.join(" "))
                    },
                    start.elapsed().as_secs_f64()
                ));
                // A few checks with the new daemon in charge.
                std::thread::sleep(Duration::from_secs(1));
                Ok(d)
            })();
            stop.store(true, Ordering::SeqCst);
            let polled = poller
                .join()
                .map_err(|_| anyhow::anyhow!("the poller panicked"));
            (restarted, polled)
        });
        for (pod, labels) in updates {
            if let Some(p) = run.pods.iter_mut().find(|p| p.def.name == pod) {
                p.def.labels = labels;
            }
        }
        self.daemon = Some(restarted?);
        polled??;
        let (checks, while_down, differences) = tally
            .into_inner()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        if !differences.is_empty() {
            bail!(
                "{} ({}; {checks} checks in all)",
                differences.join("; "),
                phases.join("; ")
            );
        }
        if !r.throughout.is_empty() && while_down == 0 {
            bail!("no check ran while no daemon ran ({})", phases.join("; "));
        }
        Ok(format!(
            "{}; {checks} checks ({while_down} while no daemon ran), every one as expected",
            phases.join("; ")
        ))
    }
}
