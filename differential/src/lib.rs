//! The generated differential (#32): the specification's decision rule as
//! a reference model ([`model`]), cases generated from a small universe
//! ([`universe`]), and drivers that run each case through a layer of the
//! product and compare what it decides and reports with the model.
//!
//! A disagreement is shrunk by proptest to a minimal policy set and event
//! before it is printed.

mod kernel_common;
pub mod kernel_dns;
pub mod kernel_egress;
pub mod kernel_openexec;
pub mod kernel_protocol;
pub mod model;
pub mod regressions;
mod reporting;
pub mod scenario;
pub mod universe;
pub mod userspace;

use model::{Event, Policy};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use userspace::{check, System};

/// Events checked against each generated policy set.
pub const EVENTS_PER_SET: usize = 16;

/// How often each shape users combine was generated, over policy sets (a
/// set counts once per shape it has).
#[derive(Debug, Default)]
pub struct Shapes {
    /// Policy sets generated.
    pub sets: AtomicU64,
    /// Two or more policies selecting the pod with a behavior of one kind.
    pub several_policies: AtomicU64,
    /// A monitor and an enforce policy selecting the pod, one kind.
    pub monitor_beside_enforce: AtomicU64,
    /// A policy with two or more behaviors of one kind.
    pub several_behaviors_of_a_kind: AtomicU64,
    /// `"*"` beside other values in one deny list.
    pub star_beside_denies: AtomicU64,
    /// One value both allowed and denied (in one policy or across two).
    pub allow_and_deny_of_a_value: AtomicU64,
    /// A default deny beside another enforce policy's allow, one kind.
    pub default_deny_beside_an_allow: AtomicU64,
    /// A Service named by a network value.
    pub service_values: AtomicU64,
    /// A domain named by a network value.
    pub domain_values: AtomicU64,
    /// A domain named by monitor policies only (of those selecting the
    /// pod): learned for the monitor alone.
    pub monitor_only_domains: AtomicU64,
}

impl Shapes {
    /// Counts the shapes of one policy set.
    pub fn tally(&self, policies: &[Policy]) {
        use model::{Kind, Mode};
        let bump = |c: &AtomicU64, yes: bool| {
            if yes {
                c.fetch_add(1, Ordering::Relaxed);
            }
        };
        bump(&self.sets, true);
        let selecting: Vec<&Policy> = policies.iter().filter(|p| p.selects).collect();
        let with = |k: Kind, p: &&Policy| p.behaviors.iter().any(|b| b.kind == k);
        let mut several = false;
        let mut beside = false;
        let mut lifted = false;
        let mut both = false;
        for k in Kind::ALL {
            let of: Vec<&&Policy> = selecting.iter().filter(|p| with(k, p)).collect();
            several |= of.len() > 1;
            beside |= of.iter().any(|p| p.mode == Mode::Monitor)
                && of.iter().any(|p| p.mode == Mode::Enforce);
            let enforcing = of.iter().filter(|p| p.mode == Mode::Enforce);
            let star = enforcing.clone().any(|p| {
                p.behaviors
                    .iter()
                    .any(|b| b.kind == k && b.deny.iter().any(|v| v == "*"))
            });
            let allows = enforcing
                .clone()
                .filter(|p| {
                    p.behaviors
                        .iter()
                        .any(|b| b.kind == k && !b.allow.is_empty())
                })
                .count();
            lifted |= star && allows > 0;
            let allowed: Vec<&String> = of
                .iter()
                .flat_map(|p| {
                    p.behaviors
                        .iter()
                        .filter(|b| b.kind == k)
                        .flat_map(|b| &b.allow)
                })
                .collect();
            both |= of
                .iter()
                .flat_map(|p| {
                    p.behaviors
                        .iter()
                        .filter(|b| b.kind == k)
                        .flat_map(|b| &b.deny)
                })
                .any(|v| allowed.contains(&v));
        }
        bump(&self.several_policies, several);
        bump(&self.monitor_beside_enforce, beside);
        bump(&self.default_deny_beside_an_allow, lifted);
        bump(&self.allow_and_deny_of_a_value, both);
        bump(
            &self.several_behaviors_of_a_kind,
            policies.iter().any(|p| {
                Kind::ALL
                    .iter()
                    .any(|k| p.behaviors.iter().filter(|b| b.kind == *k).count() > 1)
            }),
        );
        bump(
            &self.star_beside_denies,
            policies
                .iter()
                .flat_map(|p| &p.behaviors)
                .any(|b| b.deny.len() > 1 && b.deny.iter().any(|v| v == "*")),
        );
        let network_values = |p: &&Policy| -> Vec<String> {
            p.behaviors
                .iter()
                .filter(|b| b.kind == Kind::Network)
                .flat_map(|b| b.allow.iter().chain(&b.deny))
                .map(|v| v.trim_end_matches('.').to_ascii_lowercase())
                .collect()
        };
        let is_domain = |v: &String| v.ends_with(".example");
        bump(
            &self.service_values,
            policies
                .iter()
                .flat_map(|p| network_values(&p))
                .any(|v| v.contains(".svc")),
        );
        bump(
            &self.domain_values,
            policies
                .iter()
                .flat_map(|p| network_values(&p))
                .any(|v| is_domain(&v)),
        );
        let named_by = |mode: Mode| -> Vec<String> {
            selecting
                .iter()
                .filter(|p| p.mode == mode)
                .flat_map(network_values)
                .filter(is_domain)
                .collect()
        };
        let enforced = named_by(Mode::Enforce);
        bump(
            &self.monitor_only_domains,
            named_by(Mode::Monitor)
                .iter()
                .any(|d| !enforced.contains(d)),
        );
    }

    /// One line per shape: its name, how many sets had it, the share.
    pub fn lines(&self) -> Vec<String> {
        let sets = self.sets.load(Ordering::Relaxed).max(1);
        [
            ("several policies, one kind", &self.several_policies),
            ("monitor beside enforce", &self.monitor_beside_enforce),
            (
                "several behaviors of a kind",
                &self.several_behaviors_of_a_kind,
            ),
            ("* beside other deny values", &self.star_beside_denies),
            (
                "allow and deny of one value",
                &self.allow_and_deny_of_a_value,
            ),
            (
                "default deny beside an allow",
                &self.default_deny_beside_an_allow,
            ),
            ("Service values", &self.service_values),
            ("domain values", &self.domain_values),
            ("domain named by monitor only", &self.monitor_only_domains),
        ]
        .iter()
        .map(|(name, c)| {
            let n = c.load(Ordering::Relaxed);
            format!(
                "{name:<30} {n:>9} sets ({:.0}%)",
                100.0 * n as f64 / sets as f64
            )
        })
        .collect()
    }
}

/// What one driver run found.
#[derive(Debug)]
pub struct Run {
    /// The driver's name.
    pub driver: &'static str,
    /// Cases checked: (policy set, event) pairs, or (sequence step, event)
    /// pairs.
    pub cases: u64,
    /// The first disagreement, shrunk, if any.
    pub disagreement: Option<String>,
    /// The shapes of the policy sets it generated.
    pub shapes: Shapes,
    /// The shrunk case of the disagreement: its policies and the events
    /// the product and the model disagree on (what a replay scenario is
    /// written from).
    pub case: Option<(Vec<Policy>, Vec<Event>)>,
}

pub(crate) fn runner(seed: u64, sets: u32) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: sets,
        failure_persistence: None,
        // Shrinking stops within this many steps; enough for 8 policies.
        max_shrink_iters: 4096,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

pub(crate) fn shrunk<T: std::fmt::Debug>(e: TestError<T>) -> String {
    match e {
        TestError::Fail(why, value) => format!("{why}\n  minimal case: {value:#?}"),
        TestError::Abort(why) => format!("aborted: {why}"),
    }
}

/// Driver (a): each case is a generated policy set and [`EVENTS_PER_SET`]
/// events, through the compiler, the managers and the monitor. Runs
/// `cases` cases on `threads` threads (seeds `seed`, `seed + 1`, ...).
pub fn userspace(cases: u64, seed: u64, threads: u64) -> Run {
    let per_thread = cases
        .div_ceil(EVENTS_PER_SET as u64)
        .div_ceil(threads.max(1));
    let checked = AtomicU64::new(0);
    let shapes = Shapes::default();
    type Failure = (String, Option<(Vec<Policy>, Vec<Event>)>);
    let failures: Vec<Failure> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let checked = &checked;
                let shapes = &shapes;
                s.spawn(move || {
                    let mut r = runner(
                        seed.wrapping_add(t),
                        u32::try_from(per_thread).unwrap_or(u32::MAX),
                    );
                    let strategy = (
                        universe::policies(),
                        prop::collection::vec(universe::event(), EVENTS_PER_SET),
                    );
                    r.run(&strategy, |(policies, events)| {
                        shapes.tally(&policies);
                        let system =
                            system_with(&policies).map_err(|e| TestCaseError::fail(e.0))?;
                        for e in &events {
                            checked.fetch_add(1, Ordering::Relaxed);
                            if let Some(d) = check(&system, &policies, e) {
                                return Err(TestCaseError::fail(format!("{d:#?}")));
                            }
                        }
                        Ok(())
                    })
                    .err()
                    .map(|e| {
                        let case = match &e {
                            TestError::Fail(_, (policies, events)) => {
                                Some((policies.clone(), disagreeing(policies, events)))
                            }
                            TestError::Abort(_) => None,
                        };
                        (shrunk(e), case)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|_| Some(("a driver thread panicked".into(), None)))
            })
            .collect()
    });
    let first = failures.into_iter().next();
    Run {
        driver: "userspace",
        cases: checked.load(Ordering::Relaxed),
        case: first.as_ref().and_then(|(_, c)| c.clone()),
        disagreement: first.map(|(d, _)| d),
        shapes,
    }
}

/// The userspace system with `policies` applied.
fn system_with(policies: &[Policy]) -> Result<System, userspace::SetupError> {
    let mut system = System::new(&universe::cluster())?;
    for p in policies {
        system.apply(p)?;
    }
    Ok(system)
}

/// The events of a (shrunk) case the product and the model disagree on,
/// each once (all of them if the case cannot even be set up).
fn disagreeing(policies: &[Policy], events: &[Event]) -> Vec<Event> {
    let Ok(system) = system_with(policies) else {
        return events.to_vec();
    };
    let mut out: Vec<Event> = Vec::new();
    for e in events {
        if !out.contains(e) && check(&system, policies, e).is_some() {
            out.push(e.clone());
        }
    }
    out
}

/// One step of a sequence.
#[derive(Clone, Debug)]
pub enum Step {
    /// Adds a policy or replaces the one of its name (an edit: its lists,
    /// its mode, its selector).
    Apply(Policy),
    /// Deletes the policy of that name (nothing if there is none).
    Delete(String),
}

impl Step {
    /// The step in a few words, for a disagreement's message.
    pub fn describe(&self) -> String {
        match self {
            Step::Apply(p) => format!(
                "apply {} ({:?}, {})",
                p.name,
                p.mode,
                if p.selects {
                    "selecting"
                } else {
                    "not selecting"
                }
            ),
            Step::Delete(n) => format!("delete {n}"),
        }
    }
}

/// A step whose policies have behaviors of `kinds`, from `values`.
pub(crate) fn step_of(
    kinds: &'static [model::Kind],
    values: universe::Values,
) -> impl Strategy<Value = Step> {
    // Four names, so most applies are edits of a policy in place.
    let name = prop::sample::select(&["p0", "p1", "p2", "p3"][..]);
    prop_oneof![
        4 => name
            .clone()
            .prop_flat_map(move |n| universe::policy_of(n.to_owned(), kinds, values))
            .prop_map(Step::Apply),
        1 => name.prop_map(|n| Step::Delete(n.to_owned())),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    step_of(&model::Kind::ALL, universe::values_of)
}

/// Driver (d): sequences of 1 to 12 steps (add, edit, mode switch,
/// selector change, delete) on one set of managers and one monitor; after
/// every step every event of the universe is checked against the model
/// over the policies then current (no stale entry, no gap).
pub fn sequences(cases: u64, seed: u64) -> Run {
    let probes = universe::every_event();
    // A sequence checks about 6 steps x every probe.
    let per_sequence = 6 * probes.len() as u64;
    let sets = u32::try_from(cases.div_ceil(per_sequence)).unwrap_or(u32::MAX);
    let mut r = runner(seed ^ 0x5e9, sets);
    let checked = AtomicU64::new(0);
    let shapes = Shapes::default();
    let result = r.run(&prop::collection::vec(step(), 1..=12), |steps| {
        let mut system = System::new(&universe::cluster()).map_err(|e| TestCaseError::fail(e.0))?;
        let mut current: BTreeMap<String, Policy> = BTreeMap::new();
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Apply(p) => {
                    system.apply(p).map_err(|e| TestCaseError::fail(e.0))?;
                    current.insert(p.name.clone(), p.clone());
                }
                Step::Delete(n) => {
                    if current.remove(n).is_some() {
                        system.delete(n).map_err(|e| TestCaseError::fail(e.0))?;
                    }
                }
            }
            let policies: Vec<Policy> = current.values().cloned().collect();
            shapes.tally(&policies);
            for e in &probes {
                checked.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = check(&system, &policies, e) {
                    return Err(TestCaseError::fail(format!("after step {i}: {d:#?}")));
                }
            }
        }
        Ok(())
    });
    Run {
        driver: "sequences",
        cases: checked.load(Ordering::Relaxed),
        disagreement: result.err().map(shrunk),
        shapes,
        case: None,
    }
}

/// The events of the universe, for callers that probe every one.
pub fn probes() -> Vec<Event> {
    universe::every_event()
}
