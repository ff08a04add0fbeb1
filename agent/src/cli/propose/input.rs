//! Reading findings: OpenReports Reports (from a file or the cluster) and
//! the reference collector's JSON lines, each finding with the workload it
//! is about.

use super::build::Sighting;
use anyhow::{bail, Context as _};
use kyverno_runtime_api::openreports::{Report, ReportResult};
use kyverno_runtime_push::CollectedFinding;
use kyverno_runtime_report::{property, Behavior, SOURCE};
use serde::Deserialize as _;
use std::fmt;
use std::path::Path;

/// A workload as an input names it: a Report's scope, or a finding's pod
/// owner (or the pod, when it has none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadRef {
    /// Namespace.
    pub namespace: String,
    /// Kind, as Kubernetes spells it.
    pub kind: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            super::build::printable(&self.kind),
            super::build::printable(&self.namespace),
            super::build::printable(&self.name)
        )
    }
}

/// One finding read, with what it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The workload: the pod's owner when it has one, else the pod.
    pub workload: WorkloadRef,
    /// The pod's name, when the input names one pod.
    pub pod: Option<String>,
    /// The finding.
    pub sighting: Sighting,
}

/// The kinds a workload may be named by, in `KIND/NAME`, with kubectl's
/// short names; `None` for any other.
pub fn canonical_kind(kind: &str) -> Option<&'static str> {
    Some(match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" | "po" => "Pod",
        "deployment" | "deployments" | "deploy" => "Deployment",
        "replicaset" | "replicasets" | "rs" => "ReplicaSet",
        "statefulset" | "statefulsets" | "sts" => "StatefulSet",
        "daemonset" | "daemonsets" | "ds" => "DaemonSet",
        "job" | "jobs" => "Job",
        "cronjob" | "cronjobs" | "cj" => "CronJob",
        _ => return None,
    })
}

/// Parses `KIND/NAME`.
pub fn parse_workload(s: &str) -> anyhow::Result<(&'static str, String)> {
    let Some((kind, name)) = s.split_once('/') else {
        bail!("workload {s:?} is not KIND/NAME (deployment/web, pod/web-0, ...)");
    };
    let Some(kind) = canonical_kind(kind) else {
        bail!("workload kind {kind:?} is not one of pod, deployment, replicaset, statefulset, daemonset, job, cronjob");
    };
    if name.is_empty() || name.contains('/') {
        bail!("workload {s:?} is not KIND/NAME");
    }
    Ok((kind, name.to_string()))
}

fn behavior_named(name: &str) -> Option<Behavior> {
    Behavior::ALL.into_iter().find(|b| b.as_str() == name)
}

/// A result of ours as a sighting; `None` for a result another tool wrote
/// or one without a behavior and a target.
pub fn result_sighting(report_source: Option<&str>, r: &ReportResult) -> Option<Sighting> {
    if r.source.as_deref().or(report_source) != Some(SOURCE) {
        return None;
    }
    let props = r.properties.as_ref()?;
    let behavior = behavior_named(r.rule.as_deref()?)?;
    let target = props.get(property::TARGET)?.clone();
    Some(Sighting {
        policy: r.policy.clone(),
        behavior,
        target,
        enforced: props.get(property::ENFORCED).is_some_and(|e| e == "true"),
        // A count that does not parse still says it happened.
        count: props
            .get(property::COUNT)
            .and_then(|c| c.parse().ok())
            .filter(|c| *c > 0)
            .unwrap_or(1),
    })
}

/// Every finding of a Report, and how many results were not ours.
pub fn report_findings(report: &Report) -> (Vec<Found>, usize) {
    let namespace = report.metadata.namespace.clone().unwrap_or_default();
    let scope = report.spec.scope.as_ref();
    let scope_kind = scope.and_then(|s| s.kind.clone()).unwrap_or_default();
    let scope_name = scope.and_then(|s| s.name.clone()).unwrap_or_default();
    let mut out = Vec::new();
    let mut skipped = 0;
    for r in report.spec.results.iter().flatten() {
        let Some(sighting) = result_sighting(report.spec.source.as_deref(), r) else {
            skipped += 1;
            continue;
        };
        let props = r.properties.as_ref();
        let owner = props.and_then(|p| {
            Some((
                p.get(property::OWNER_KIND)?.clone(),
                p.get(property::OWNER_NAME)?.clone(),
            ))
        });
        let (workload, pod) = match (scope_kind.as_str(), owner) {
            ("Pod", Some((kind, name))) => (
                WorkloadRef {
                    namespace: namespace.clone(),
                    kind,
                    name,
                },
                Some(scope_name.clone()),
            ),
            ("Pod", None) => (
                WorkloadRef {
                    namespace: namespace.clone(),
                    kind: "Pod".into(),
                    name: scope_name.clone(),
                },
                Some(scope_name.clone()),
            ),
            _ => (
                WorkloadRef {
                    namespace: namespace.clone(),
                    kind: scope_kind.clone(),
                    name: scope_name.clone(),
                },
                None,
            ),
        };
        out.push(Found {
            workload,
            pod,
            sighting,
        });
    }
    (out, skipped)
}

fn read_input(path: &Path) -> anyhow::Result<String> {
    Ok(crate::cli::input::read_text(path)?)
}

/// The Reports of a YAML or JSON file: Report objects, several documents,
/// or a List of them (`kubectl get reports -o yaml`).
pub fn read_report_file(path: &Path) -> anyhow::Result<Vec<Report>> {
    let text = read_input(path)?;
    let mut reports = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let at = || format!("{}: document {}", path.display(), i + 1);
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("{}: not YAML or JSON", at()))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let items = if kind.ends_with("List") {
            value
                .get("items")
                .and_then(|i| i.as_sequence())
                .cloned()
                .unwrap_or_default()
        } else {
            vec![value]
        };
        for (j, item) in items.into_iter().enumerate() {
            let kind = item
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or("(none)");
            if kind != "Report" {
                bail!(
                    "{}, item {}: kind {kind:?}, not an OpenReports Report",
                    at(),
                    j + 1
                );
            }
            let report: Report = serde_yaml::from_value(item)
                .with_context(|| format!("{}, item {}: not a Report", at(), j + 1))?;
            reports.push(report);
        }
    }
    Ok(reports)
}

/// The findings of the collector's JSON lines (`kyverno-runtime
/// collector --output`). A line that is not a finding is an error with its
/// number: nothing is skipped silently.
pub fn read_collector_file(path: &Path) -> anyhow::Result<Vec<Found>> {
    let text = read_input(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: CollectedFinding = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a collector finding", path.display(), i + 1))?;
        let Some(behavior) = behavior_named(&f.behavior) else {
            bail!(
                "{}:{}: unknown behavior {:?}",
                path.display(),
                i + 1,
                f.behavior
            );
        };
        let workload = match (&f.pod.owner_kind, &f.pod.owner_name) {
            (Some(kind), Some(name)) => WorkloadRef {
                namespace: f.pod.namespace.clone(),
                kind: kind.clone(),
                name: name.clone(),
            },
            _ => WorkloadRef {
                namespace: f.pod.namespace.clone(),
                kind: "Pod".into(),
                name: f.pod.name.clone(),
            },
        };
        out.push(Found {
            workload,
            pod: Some(f.pod.name.clone()),
            sighting: Sighting {
                policy: f.policy,
                behavior,
                target: f.target,
                enforced: f.enforced,
                count: f.count.max(1),
            },
        });
    }
    Ok(out)
}

/// The findings of one workload: the one `wanted` names (a pod matches by
/// its own name too), or the only one there is. Several workloads and no
/// choice is an error naming them.
pub fn select(
    found: Vec<Found>,
    namespace: Option<&str>,
    wanted: Option<(&str, &str)>,
) -> anyhow::Result<(WorkloadRef, Vec<Sighting>)> {
    let in_namespace: Vec<Found> = found
        .into_iter()
        .filter(|f| namespace.is_none_or(|ns| f.workload.namespace == ns))
        .collect();
    if let Some((kind, name)) = wanted {
        let picked: Vec<Found> = in_namespace
            .into_iter()
            .filter(|f| {
                (f.workload.kind == kind && f.workload.name == name)
                    || (kind == "Pod" && f.pod.as_deref() == Some(name))
            })
            .collect();
        let mut namespaces: Vec<&str> = picked
            .iter()
            .map(|f| f.workload.namespace.as_str())
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        match namespaces.as_slice() {
            [] => bail!("no finding about {kind} {name} in the input"),
            [ns] => {
                let workload = WorkloadRef {
                    namespace: (*ns).to_string(),
                    kind: kind.to_string(),
                    name: name.to_string(),
                };
                return Ok((workload, picked.into_iter().map(|f| f.sighting).collect()));
            }
            many => bail!(
                "{kind} {name} is in several namespaces ({}): pass --namespace",
                many.join(", ")
            ),
        }
    }
    let mut workloads: Vec<&WorkloadRef> = in_namespace.iter().map(|f| &f.workload).collect();
    workloads.sort();
    workloads.dedup();
    match workloads.as_slice() {
        [] => bail!("the input holds no finding of kyverno-runtime"),
        [one] => {
            let one = (*one).clone();
            Ok((one, in_namespace.into_iter().map(|f| f.sighting).collect()))
        }
        many => bail!(
            "the input has findings of {} workloads: name one as KIND/NAME ({})",
            many.len(),
            many.iter()
                .map(|w| format!(
                    "{}/{} in {}",
                    w.kind.to_ascii_lowercase(),
                    w.name,
                    w.namespace
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn report(yaml: &str) -> Report {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_controller_report_is_its_controller_and_others_results_are_skipped() {
        let r = report(
            r#"
apiVersion: openreports.io/v1alpha1
kind: Report
metadata: {name: kyverno-runtime-deployment.web, namespace: shop}
source: kyverno-runtime
scope: {apiVersion: apps/v1, kind: Deployment, name: web, uid: u1}
results:
- policy: discover
  rule: exec
  source: kyverno-runtime
  result: fail
  properties: {behavior: exec, target: /bin/sh, enforced: "false", count: "4"}
- policy: other-tool
  source: trivy
  result: fail
  properties: {target: x}
"#,
        );
        let (found, skipped) = report_findings(&r);
        assert_eq!(skipped, 1);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].workload,
            WorkloadRef {
                namespace: "shop".into(),
                kind: "Deployment".into(),
                name: "web".into()
            }
        );
        assert_eq!(found[0].sighting.count, 4);
        assert_eq!(found[0].sighting.target, "/bin/sh");
    }

    #[test]
    fn a_pod_report_is_its_owner_when_it_names_one() {
        let r = report(
            r#"
kind: Report
metadata: {name: kyverno-runtime-web-1, namespace: shop}
scope: {kind: Pod, name: web-1}
results:
- policy: discover
  rule: open
  source: kyverno-runtime
  properties: {target: /etc/hosts, enforced: "true", count: "2", ownerKind: StatefulSet, ownerName: web}
"#,
        );
        let (found, _) = report_findings(&r);
        assert_eq!(found[0].workload.kind, "StatefulSet");
        assert_eq!(found[0].pod.as_deref(), Some("web-1"));
        assert!(found[0].sighting.enforced);
        let (w, s) = select(found.clone(), None, Some(("Pod", "web-1"))).unwrap();
        assert_eq!((w.kind.as_str(), s.len()), ("Pod", 1));
        let (w, _) = select(found, None, None).unwrap();
        assert_eq!(w.name, "web");
    }

    #[test]
    fn several_workloads_need_a_choice() {
        let line = |ns: &str, pod: &str, owner: Option<(&str, &str)>| {
            serde_json::json!({"node":"n","policy":"p","policyUid":"u","behavior":"network",
                "pod":{"namespace":ns,"name":pod,"uid":"x","container":null,
                       "ownerKind":owner.map(|o| o.0),"ownerName":owner.map(|o| o.1)},
                "target":"10.0.0.1","enforced":false,"decision":"default-denied","count":3,
                "firstObserved":"2026-01-01T00:00:00Z","lastObserved":"2026-01-01T00:00:00Z",
                "fingerprint":"00"})
            .to_string()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.jsonl");
        std::fs::write(
            &path,
            [
                line("shop", "web-a", Some(("Deployment", "web"))),
                line("shop", "web-b", Some(("Deployment", "web"))),
                String::new(),
                line("shop", "db-0", None),
            ]
            .join("\n"),
        )
        .unwrap();
        let found = read_collector_file(&path).unwrap();
        let err = select(found.clone(), None, None).unwrap_err().to_string();
        assert_eq!(
            err,
            "the input has findings of 2 workloads: name one as KIND/NAME (deployment/web in shop, pod/db-0 in shop)"
        );
        let (w, s) = select(found, Some("shop"), Some(("Deployment", "web"))).unwrap();
        assert_eq!((w.name.as_str(), s.len(), s[0].count), ("web", 2, 3));

        std::fs::write(&path, "{\"not\": 1}\n").unwrap();
        let err = format!("{:#}", read_collector_file(&path).unwrap_err());
        assert!(
            err.contains("lines.jsonl:1: not a collector finding"),
            "{err}"
        );
    }

    #[test]
    fn workloads_are_named_as_kubectl_names_them() {
        assert_eq!(
            parse_workload("deploy/web").unwrap(),
            ("Deployment", "web".into())
        );
        assert_eq!(
            parse_workload("Pod/web-0").unwrap(),
            ("Pod", "web-0".into())
        );
        assert!(parse_workload("web").is_err());
        assert!(parse_workload("service/web").is_err());
    }
}
