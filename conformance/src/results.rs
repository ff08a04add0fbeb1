//! What a run found: one [`Cell`] per scenario and configuration, and the
//! three ways it is shown: the matrix table printed at the end of a run
//! (scenario by configuration, then one line per failure with the first
//! difference, naming the scenario, the node and its kernel), JUnit XML
//! (one test suite per configuration) and JSON.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The row of the node's own check: the open/exec backend its probe chose
/// against the one the configuration must use.
pub const BACKEND_ROW: &str = "(node) open/exec backend";

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every step saw what it expected.
    Pass,
    /// A step saw something else (or the scenario could not run).
    Fail,
    /// The scenario says it cannot run on this node class, and why.
    #[serde(rename = "n/a")]
    NotApplicable,
}

/// One scenario on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    /// The scenario (or [`BACKEND_ROW`]).
    pub scenario: String,
    /// The node.
    pub node: String,
    /// Pass, fail, n/a.
    pub verdict: Verdict,
    /// A failure's first difference between expected and observed, or
    /// why the scenario does not apply.
    pub difference: Option<String>,
    /// What the cell shows instead of `pass` (the backend row shows the
    /// backend).
    #[serde(default)]
    pub shown: Option<String>,
    /// How long it took.
    pub seconds: f64,
    /// What each step did, for the JUnit output and the JSON.
    #[serde(default)]
    pub log: Vec<String>,
}

/// One configuration (a node) of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRun {
    /// The node's name (`k6-12-bpf`, `host`).
    pub node: String,
    /// The configuration (`6.12 lsm=bpf`, `host`).
    pub config: String,
    /// The kernel release booted (or the host's).
    pub kernel: Option<String>,
    /// Wall time of the boot (or the host run).
    pub seconds: f64,
    /// Why the node produced no (or not every) result: a boot failure, a
    /// guest that exited early.
    pub error: Option<String>,
    /// Boots of this configuration that failed in the guest itself (a
    /// kernel panic, a hang) and were retried once.
    #[serde(default)]
    pub retried_after: Vec<String>,
    /// The results the node reported.
    pub cells: Vec<Cell>,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// The scenarios run, in order (the rows).
    pub scenarios: Vec<String>,
    /// The nodes, in order (the columns).
    pub nodes: Vec<NodeRun>,
    /// What `--break` flipped, if it was given.
    pub broken: Option<String>,
    /// The whole run's wall time.
    pub wall_seconds: f64,
}

impl Run {
    /// Every cell of the matrix, with a failing cell for each scenario a
    /// node never reported (its boot failed or its guest died).
    pub fn complete(&self) -> Vec<(String, Vec<Cell>)> {
        let mut rows = vec![BACKEND_ROW.to_string()];
        rows.extend(self.scenarios.iter().cloned());
        rows.into_iter()
            .map(|scenario| {
                let cells = self
                    .nodes
                    .iter()
                    .map(|n| {
                        n.cells
                            .iter()
                            .find(|c| c.scenario == scenario)
                            .cloned()
                            .unwrap_or_else(|| Cell {
                                scenario: scenario.clone(),
                                node: n.node.clone(),
                                verdict: Verdict::Fail,
                                difference: Some(format!(
                                    "no result: {}",
                                    n.error.as_deref().unwrap_or("the node did not report it")
                                )),
                                shown: None,
                                seconds: 0.0,
                                log: Vec::new(),
                            })
                    })
                    .collect();
                (scenario, cells)
            })
            .collect()
    }

    /// Whether every cell passed or does not apply.
    pub fn passed(&self) -> bool {
        self.complete()
            .iter()
            .all(|(_, cells)| cells.iter().all(|c| c.verdict != Verdict::Fail))
    }

    /// Counts of pass, fail and n/a cells.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for (_, cells) in self.complete() {
            for c in cells {
                match c.verdict {
                    Verdict::Pass => counts.0 += 1,
                    Verdict::Fail => counts.1 += 1,
                    Verdict::NotApplicable => counts.2 += 1,
                }
            }
        }
        counts
    }

    fn describe_node(&self, node: &str) -> String {
        match self.nodes.iter().find(|n| n.node == node) {
            Some(n) => match &n.kernel {
                Some(k) => format!("{} ({}, kernel {k})", n.node, n.config),
                None => format!("{} ({})", n.node, n.config),
            },
            None => node.to_string(),
        }
    }

    /// The matrix table, then one line per failure (the first difference)
    /// and per n/a cell (the reason), then the totals.
    pub fn table(&self) -> String {
        let rows = self.complete();
        let first = rows
            .iter()
            .map(|(s, _)| s.len())
            .max()
            .unwrap_or(8)
            .max("SCENARIO".len());
        let text = |c: &Cell| match c.verdict {
            Verdict::Pass => c.shown.clone().unwrap_or_else(|| "pass".into()),
            Verdict::Fail => "FAIL".into(),
            Verdict::NotApplicable => "n/a".into(),
        };
        let widths: Vec<usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                rows.iter()
                    .map(|(_, cells)| cells.get(i).map_or(0, |c| text(c).len()))
                    .max()
                    .unwrap_or(0)
                    .max(n.node.len())
            })
            .collect();
        let mut out = String::new();
        let _ = write!(out, "{:<first$}", "SCENARIO");
        for (n, w) in self.nodes.iter().zip(&widths) {
            let _ = write!(out, "  {:<w$}", n.node);
        }
        out.push('\n');
        for (scenario, cells) in &rows {
            let _ = write!(out, "{scenario:<first$}");
            for (c, w) in cells.iter().zip(&widths) {
                let _ = write!(out, "  {:<w$}", text(c));
            }
            out.push('\n');
        }
        let mut notes = Vec::new();
        for (scenario, cells) in &rows {
            for c in cells {
                let node = self.describe_node(&c.node);
                match c.verdict {
                    Verdict::Fail => notes.push(format!(
                        "FAIL {scenario} on {node}: {}",
                        c.difference
                            .as_deref()
                            .unwrap_or("(no difference recorded)")
                    )),
                    Verdict::NotApplicable => notes.push(format!(
                        "n/a  {scenario} on {node}: {}",
                        c.difference.as_deref().unwrap_or("")
                    )),
                    Verdict::Pass => {}
                }
            }
        }
        if !notes.is_empty() {
            out.push('\n');
            for n in notes {
                out.push_str(&n);
                out.push('\n');
            }
        }
        for n in &self.nodes {
            if !n.retried_after.is_empty() {
                let _ = writeln!(
                    out,
                    "retried {} after: {}",
                    n.node,
                    n.retried_after.join("; ")
                );
            }
        }
        let (pass, fail, na) = self.counts();
        let _ = writeln!(
            out,
            "\n{} scenarios x {} nodes: {pass} passed, {fail} failed, {na} not applicable, in {:.0}s",
            self.scenarios.len(),
            self.nodes.len(),
            self.wall_seconds
        );
        if let Some(b) = &self.broken {
            let _ = writeln!(out, "--break: {b} (this run must fail)");
        }
        out
    }

    /// The run as JUnit XML: a test suite per node, a test case per
    /// scenario, `failure` with the first difference, `skipped` with the
    /// reason a scenario does not apply.
    pub fn junit(&self) -> String {
        let rows = self.complete();
        let mut by_node: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
        for (_, cells) in &rows {
            for c in cells {
                by_node.entry(c.node.as_str()).or_default().push(c);
            }
        }
        let (_, fail, _) = self.counts();
        let total: usize = rows.iter().map(|(_, c)| c.len()).sum();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"conformance\" tests=\"{total}\" failures=\"{fail}\" time=\"{:.3}\">",
            self.wall_seconds
        );
        for n in &self.nodes {
            let cells = by_node.get(n.node.as_str()).cloned().unwrap_or_default();
            let failures = cells.iter().filter(|c| c.verdict == Verdict::Fail).count();
            let skipped = cells
                .iter()
                .filter(|c| c.verdict == Verdict::NotApplicable)
                .count();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\" time=\"{:.3}\">",
                xml(&self.describe_node(&n.node)),
                cells.len(),
                n.seconds
            );
            for c in cells {
                let _ = write!(
                    out,
                    "    <testcase classname=\"conformance.{}\" name=\"{}\" time=\"{:.3}\"",
                    xml(&c.node),
                    xml(&c.scenario),
                    c.seconds
                );
                let log = c.log.join("\n");
                match c.verdict {
                    Verdict::Pass => {
                        if log.is_empty() {
                            out.push_str("/>\n");
                        } else {
                            let _ = write!(
                                out,
                                ">\n      <system-out>{}</system-out>\n    </testcase>\n",
                                xml(&log)
                            );
                        }
                    }
                    Verdict::Fail => {
                        let d = c.difference.as_deref().unwrap_or("");
                        let _ = write!(
                            out,
                            ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                            xml(d),
                            xml(&log)
                        );
                    }
                    Verdict::NotApplicable => {
                        let _ = write!(
                            out,
                            ">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                            xml(c.difference.as_deref().unwrap_or(""))
                        );
                    }
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }

    /// The run as JSON: the nodes with every cell (the missing ones filled
    /// in as failures) and the verdict.
    pub fn json(&self) -> serde_json::Value {
        let mut run = self.clone();
        for (_, cells) in self.complete() {
            for c in cells {
                if let Some(n) = run.nodes.iter_mut().find(|n| n.node == c.node) {
                    if !n.cells.iter().any(|x| x.scenario == c.scenario) {
                        n.cells.push(c);
                    }
                }
            }
        }
        let (pass, fail, na) = self.counts();
        serde_json::json!({
            "passed": self.passed(),
            "counts": {"pass": pass, "fail": fail, "notApplicable": na},
            "run": run,
        })
    }
}

/// Escapes text for XML attributes and content; control characters other
/// than tab and newline (which XML 1.0 cannot carry) become `?`.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(scenario: &str, node: &str, verdict: Verdict, difference: Option<&str>) -> Cell {
        Cell {
            scenario: scenario.into(),
            node: node.into(),
            verdict,
            difference: difference.map(Into::into),
            shown: None,
            seconds: 1.5,
            log: vec!["step 1: ok".into()],
        }
    }

    fn run() -> Run {
        Run {
            scenarios: vec!["exec-deny".into(), "service-name".into()],
            nodes: vec![
                NodeRun {
                    node: "k6-12-bpf".into(),
                    config: "6.12 lsm=bpf".into(),
                    kernel: Some("6.12.1".into()),
                    seconds: 80.0,
                    error: None,
                    retried_after: vec![],
                    cells: vec![
                        Cell {
                            shown: Some("bpf_lsm".into()),
                            ..cell(BACKEND_ROW, "k6-12-bpf", Verdict::Pass, None)
                        },
                        cell(
                            "exec-deny",
                            "k6-12-bpf",
                            Verdict::Fail,
                            Some("step 2 (exec /x in ns/web): expected refused (EPERM), observed allowed <&>"),
                        ),
                        cell("service-name", "k6-12-bpf", Verdict::Pass, None),
                    ],
                },
                NodeRun {
                    node: "host".into(),
                    config: "host".into(),
                    kernel: None,
                    seconds: 20.0,
                    error: Some("the node exited 101".into()),
                    retried_after: vec![],
                    cells: vec![cell(
                        "service-name",
                        "host",
                        Verdict::NotApplicable,
                        Some("no route"),
                    )],
                },
            ],
            broken: Some("exec-deny step 2".into()),
            wall_seconds: 100.0,
        }
    }

    #[test]
    fn the_table_names_the_first_difference_and_the_missing_results() {
        let r = run();
        let t = r.table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["SCENARIO", "k6-12-bpf", "host"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["(node)", "open/exec", "backend", "bpf_lsm", "FAIL"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["exec-deny", "FAIL", "FAIL"]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["service-name", "pass", "n/a"]
        );
        assert!(t.contains("FAIL exec-deny on k6-12-bpf (6.12 lsm=bpf, kernel 6.12.1): step 2 (exec /x in ns/web): expected refused (EPERM), observed allowed"), "{t}");
        assert!(
            t.contains("FAIL exec-deny on host (host): no result: the node exited 101"),
            "{t}"
        );
        assert!(
            t.contains("n/a  service-name on host (host): no route"),
            "{t}"
        );
        assert!(
            t.contains("2 scenarios x 2 nodes: 2 passed, 3 failed, 1 not applicable"),
            "{t}"
        );
        assert!(!r.passed());
    }

    #[test]
    fn junit_and_json_carry_every_cell() {
        let r = run();
        let x = r.junit();
        assert!(
            x.contains("<testsuites name=\"conformance\" tests=\"6\" failures=\"3\""),
            "{x}"
        );
        assert!(x.contains("<failure message=\"step 2 (exec /x in ns/web): expected refused (EPERM), observed allowed &lt;&amp;&gt;\">"), "{x}");
        assert!(x.contains("<skipped message=\"no route\"/>"), "{x}");
        let j = r.json();
        assert_eq!(j["passed"], false);
        assert_eq!(j["counts"]["fail"], 3);
        let host = &j["run"]["nodes"][1];
        assert_eq!(host["cells"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_run_of_passes_and_na_passes() {
        let mut r = run();
        r.nodes.truncate(1);
        for c in &mut r.nodes[0].cells {
            c.verdict = Verdict::Pass;
        }
        assert!(r.passed());
    }
}
