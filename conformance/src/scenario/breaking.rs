//! `--break`: flipping one expectation so a run must fail, and the words
//! an expectation is described with in a failure.

use super::*;

/// Flips one expectation of `scenario` for `--break`: step `step`
/// (1-based), or the first step without `when` whose expectation can be
/// flipped. Returns what was flipped, for the run's header.
pub fn break_one(scenario: &mut Scenario, step: Option<usize>) -> Result<String> {
    let name = scenario.name.clone();
    let candidates: Vec<usize> = scenario
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| match step {
            Some(n) => s.number == n,
            None => s.when.is_none() && flippable(&s.kind),
        })
        .map(|(i, _)| i)
        .collect();
    let Some(&at) = candidates.first() else {
        return Err(Error::Break(match step {
            Some(n) => format!("scenario {name} has no step {n}"),
            None => format!("scenario {name} has no step whose expectation can be flipped"),
        }));
    };
    let s = &mut scenario.steps[at];
    let before = describe_expectation(&s.kind);
    if !flip(&mut s.kind) {
        return Err(Error::Break(format!(
            "step {} of {name} has no expectation to flip ({before})",
            s.number
        )));
    }
    s.broken = true;
    Ok(format!(
        "{name} step {}: expected {before}, now {}",
        s.number,
        describe_expectation(&s.kind)
    ))
}

fn flippable(kind: &StepKind) -> bool {
    let mut probe = kind.clone();
    flip(&mut probe)
}

fn flip(kind: &mut StepKind) -> bool {
    match kind {
        StepKind::Action { expect, .. } => {
            *expect = expect.flipped();
            true
        }
        StepKind::Report(r) => {
            if r.absent {
                r.absent = false;
                r.min_count = Some(1);
            } else {
                *r = ReportCheck {
                    absent: true,
                    count: None,
                    min_count: None,
                    enforced: None,
                    result: None,
                    properties: BTreeMap::new(),
                    ..r.clone()
                };
            }
            true
        }
        StepKind::Condition(c) => {
            c.status = if c.status == "True" {
                "False".into()
            } else {
                "True".into()
            };
            true
        }
        StepKind::Shard(s) => {
            let first = [
                &mut s.enforcement_available,
                &mut s.observation_available,
                &mut s.pods_matched,
            ]
            .into_iter()
            .flatten()
            .next();
            match first {
                Some(v) => {
                    *v = !*v;
                    true
                }
                None => false,
            }
        }
        StepKind::RestartDaemon(r) => r.throughout.first_mut().is_some_and(|s| flip(&mut s.kind)),
        _ => false,
    }
}

/// A step's expectation in words (the matrix's failure lines use it too).
pub fn describe_expectation(kind: &StepKind) -> String {
    match kind {
        StepKind::Action {
            expect: Expect::Refused,
            errno,
            ..
        } => format!("refused ({errno})"),
        StepKind::Action { expect, .. } => expect.to_string(),
        StepKind::Report(r) if r.absent => "no such result".into(),
        StepKind::Report(r) => match (r.count, r.min_count) {
            (Some(c), _) => format!("a result with count {c}"),
            (_, Some(m)) => format!("a result with count >= {m}"),
            _ => "a result".into(),
        },
        StepKind::Condition(c) => format!("{}={}", c.type_, c.status),
        StepKind::Shard(s) => {
            let mut parts = Vec::new();
            if let Some(v) = s.enforcement_available {
                parts.push(format!("enforcementAvailable={v}"));
            }
            if let Some(v) = s.observation_available {
                parts.push(format!("observationAvailable={v}"));
            }
            if let Some(v) = s.pods_matched {
                parts.push(format!("podsMatched={v}"));
            }
            parts.join(", ")
        }
        StepKind::RestartDaemon(r) => r
            .throughout
            .first()
            .map(|s| describe_expectation(&s.kind))
            .unwrap_or_default(),
        _ => String::new(),
    }
}
