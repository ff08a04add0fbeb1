//! Every disagreement the differential found, kept: each as the shrunk
//! case, checked by the model's unit tests here, and as the conformance
//! scenario written from it (`conformance/scenarios/<name>.yaml`), which
//! the conformance suite replays on real nodes. A test below fails when
//! the committed scenario is not what the writer makes of the case
//! (`KRT_UPDATE_REGRESSIONS=1 cargo test -p differential regressions`
//! rewrites it).

use crate::model::{Behavior, Event, Kind, Mode, Policy};

/// One disagreement found, with what it taught.
pub struct Regression {
    /// The scenario's name.
    pub name: &'static str,
    /// What was found, and what was wrong (the product or the model).
    pub why: &'static str,
    /// The shrunk policies.
    pub policies: Vec<Policy>,
    /// The events, the disagreeing one first.
    pub events: Vec<Event>,
}

/// The disagreements found so far.
pub fn all() -> Vec<Regression> {
    vec![Regression {
        name: "differential-exec-opens-its-binary",
        why: "the open/exec VM driver's first run (5.10 to 7.x, BPF-LSM and \
              fmod_ret) found the model wrong: an exec opens its binary, and \
              both backends judge that open by the open lists, so an open deny \
              of a program refuses executing it. The model now judges an exec \
              on the open lists first.",
        policies: vec![Policy {
            name: "p0".into(),
            mode: Mode::Enforce,
            selects: true,
            behaviors: vec![Behavior {
                kind: Kind::Open,
                allow: Vec::new(),
                deny: vec!["/tmp/krt-differential/x/a".into()],
            }],
        }],
        events: vec![
            Event::Exec("/tmp/krt-differential/x/a".into()),
            Event::Open("/tmp/krt-differential/x/a".into()),
            Event::Exec("/tmp/krt-differential/x/b".into()),
        ],
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::decide;
    use std::path::PathBuf;

    #[test]
    fn an_open_deny_of_a_program_refuses_its_exec() {
        let r = &all()[0];
        let refused: Vec<bool> = r
            .events
            .iter()
            .map(|e| decide(&r.policies, e).refused)
            .collect();
        assert_eq!(refused, [true, true, false]);
    }

    #[test]
    fn each_regression_is_committed_as_a_conformance_scenario() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conformance/scenarios");
        for r in all() {
            let scenario = crate::scenario::scenario(
                r.name,
                r.why,
                &crate::model::Cluster::default(),
                &r.policies,
                &r.events,
            )
            .unwrap_or_else(|| panic!("{}: nothing expressible", r.name));
            let want = serde_yaml::to_string(&scenario).unwrap_or_else(|e| panic!("{e}"));
            let path = dir.join(format!("{}.yaml", r.name));
            if std::env::var_os("KRT_UPDATE_REGRESSIONS").is_some() {
                std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                have,
                want,
                "{} is not what the writer makes of the case (KRT_UPDATE_REGRESSIONS=1 rewrites it)",
                path.display()
            );
        }
    }
}
