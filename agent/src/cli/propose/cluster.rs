//! Reading a workload's findings from the cluster: the workload (a pod is
//! taken up to its controller), its pods' labels, and the Reports the
//! daemons wrote about it (the controller's roll-up Report and its pods'
//! Reports).

use super::build::{Sighting, Workload};
use super::input::report_findings;
use anyhow::{bail, Context as _};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams};
use kube::Client;
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_report::{controller_report_name, report_name, ControllerKind};
use std::collections::{BTreeMap, BTreeSet};

/// Labels Kubernetes puts on pods per pod, per revision or per Job: a
/// selector naming them would miss the workload's next pods.
const GENERATED_LABELS: [&str; 9] = [
    "pod-template-hash",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/job-completion-index",
];

/// What is needed of one object.
struct Object {
    uid: String,
    owners: Vec<OwnerReference>,
    /// The pod labels: a pod's own, a controller's pod template's.
    pod_labels: BTreeMap<String, String>,
}

fn object(meta: ObjectMeta, pod_labels: Option<BTreeMap<String, String>>) -> Object {
    Object {
        uid: meta.uid.unwrap_or_default(),
        owners: meta.owner_references.unwrap_or_default(),
        pod_labels: pod_labels.unwrap_or_default(),
    }
}

fn template_labels(t: Option<PodTemplateSpec>) -> Option<BTreeMap<String, String>> {
    t?.metadata?.labels
}

/// The object `kind/name` in `namespace`, or `None`.
async fn get(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<Object>> {
    macro_rules! fetch {
        ($t:ty, |$o:ident| $labels:expr) => {{
            let api: Api<$t> = Api::namespaced(client.clone(), namespace);
            let found = api
                .get_opt(name)
                .await
                .with_context(|| format!("reading {kind} {namespace}/{name}"))?;
            found.map(|$o| {
                let labels = $labels;
                object($o.metadata, labels)
            })
        }};
    }
    Ok(match kind {
        "Pod" => fetch!(Pod, |o| o.metadata.labels.clone()),
        "ReplicaSet" => fetch!(ReplicaSet, |o| template_labels(o.spec.template)),
        "Deployment" => fetch!(Deployment, |o| template_labels(Some(o.spec.template))),
        "StatefulSet" => fetch!(StatefulSet, |o| template_labels(Some(o.spec.template))),
        "DaemonSet" => fetch!(DaemonSet, |o| template_labels(Some(o.spec.template))),
        "Job" => fetch!(Job, |o| template_labels(o.spec.map(|s| s.template))),
        "CronJob" => fetch!(CronJob, |o| template_labels(
            o.spec.job_template.spec.map(|s| s.template)
        )),
        other => bail!("cannot read a {other}"),
    })
}

fn controller_ref(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners.iter().find(|r| r.controller == Some(true))
}

/// Follows a controller reference one step up, when it leads to a kind a
/// workload may be (a pod's ReplicaSet or Job, a ReplicaSet's Deployment,
/// a Job's CronJob): the owner, checked to be the object the reference
/// names (same uid).
async fn owner(
    client: &Client,
    namespace: &str,
    of: &Object,
    kinds: &[&'static str],
) -> anyhow::Result<Option<(&'static str, String, Object)>> {
    let Some(r) = controller_ref(&of.owners) else {
        return Ok(None);
    };
    let Some(kind) = kinds.iter().find(|k| **k == r.kind) else {
        return Ok(None);
    };
    let Some(o) = get(client, namespace, kind, &r.name).await? else {
        bail!("the controller {} {namespace}/{} is gone", r.kind, r.name);
    };
    if o.uid != r.uid {
        bail!(
            "the controller reference names {} {namespace}/{} with uid {}, but that object has uid {}",
            r.kind,
            r.name,
            r.uid,
            o.uid
        );
    }
    Ok(Some((kind, r.name.clone(), o)))
}

/// Reads `kind/name` in `namespace` (a pod is taken up to its top
/// controller: ReplicaSet to Deployment, Job to CronJob), its pod labels,
/// and every finding in the Reports about it and its pods. Also returns
/// the Reports read, as a person names them.
pub async fn gather(
    client: &Client,
    namespace: &str,
    kind: &'static str,
    name: &str,
) -> anyhow::Result<(Workload, Vec<Sighting>, Vec<String>)> {
    let Some(mut top) = get(client, namespace, kind, name).await? else {
        bail!("{kind} {namespace}/{name} not found");
    };
    let (mut kind, mut name) = (kind, name.to_string());
    // Up the chain, as the reporter rolls findings up.
    loop {
        let up: &[&'static str] = match kind {
            "Pod" => &["ReplicaSet", "StatefulSet", "DaemonSet", "Job"],
            "ReplicaSet" => &["Deployment"],
            "Job" => &["CronJob"],
            _ => &[],
        };
        match owner(client, namespace, &top, up).await? {
            Some((k, n, o)) => {
                eprintln!("{kind} {namespace}/{name} is managed by {k} {namespace}/{n}: proposing for the {k}");
                (kind, name, top) = (k, n, o);
            }
            None => break,
        }
    }
    let (generated, labels): (BTreeMap<String, String>, BTreeMap<String, String>) = top
        .pod_labels
        .clone()
        .into_iter()
        .partition(|(k, _)| GENERATED_LABELS.contains(&k.as_str()));
    for key in generated.keys() {
        eprintln!(
            "label {key} left out of the podSelector: Kubernetes sets it per pod, revision or Job"
        );
    }

    let reports: Api<Report> = Api::namespaced(client.clone(), namespace);
    let mut sources = Vec::new();
    let mut sightings = Vec::new();
    let mut read = |report: Report, uid: &str, sources: &mut Vec<String>| {
        // A Report of that name about another object (a pod of the same
        // name before, a controller recreated) is not this workload's.
        let name = report.metadata.name.clone().unwrap_or_default();
        let scope_uid = report.spec.scope.as_ref().and_then(|s| s.uid.as_deref());
        if let Some(other) = scope_uid.filter(|u| *u != uid) {
            eprintln!("Report {namespace}/{name} is about another object (uid {other}, not {uid}): not read");
            return;
        }
        let (found, _) = report_findings(&report);
        sources.push(format!(
            "{namespace}/{name} ({} finding{})",
            found.len(),
            if found.len() == 1 { "" } else { "s" }
        ));
        sightings.extend(found.into_iter().map(|f| f.sighting));
    };
    if let Some(ck) = ControllerKind::from_kind(kind) {
        let report_name = controller_report_name(ck, &name);
        if let Some(r) = reports
            .get_opt(&report_name)
            .await
            .with_context(|| format!("reading Report {namespace}/{report_name}"))?
        {
            read(r, &top.uid, &mut sources);
        }
    }
    for (pod, uid) in pods_of(client, namespace, kind, &name, &top.uid).await? {
        let report_name = report_name(&pod);
        if let Some(r) = reports
            .get_opt(&report_name)
            .await
            .with_context(|| format!("reading Report {namespace}/{report_name}"))?
        {
            read(r, &uid, &mut sources);
        }
    }
    let workload = Workload {
        namespace: namespace.to_string(),
        kind: kind.to_string(),
        name,
        labels,
    };
    Ok((workload, sightings, sources))
}

/// The pods (name, uid) whose controller chain leads to the workload.
async fn pods_of(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    uid: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    if kind == "Pod" {
        return Ok(vec![(name.to_string(), uid.to_string())]);
    }
    let controlled_by = |meta: &ObjectMeta, owners: &BTreeSet<String>| {
        meta.owner_references
            .as_deref()
            .and_then(controller_ref)
            .is_some_and(|r| owners.contains(&r.uid))
    };
    let uids = |items: Vec<ObjectMeta>, owners: &BTreeSet<String>| -> BTreeSet<String> {
        items
            .into_iter()
            .filter(|m| controlled_by(m, owners))
            .filter_map(|m| m.uid)
            .collect()
    };
    let top = BTreeSet::from([uid.to_string()]);
    let lp = ListParams::default();
    // The objects that own the pods directly.
    let owners = match kind {
        "Deployment" => {
            let api: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
            let list = api.list(&lp).await.context("listing ReplicaSets")?;
            uids(list.items.into_iter().map(|o| o.metadata).collect(), &top)
        }
        "CronJob" => {
            let api: Api<Job> = Api::namespaced(client.clone(), namespace);
            let list = api.list(&lp).await.context("listing Jobs")?;
            uids(list.items.into_iter().map(|o| o.metadata).collect(), &top)
        }
        _ => top,
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = api.list(&lp).await.context("listing pods")?;
    Ok(list
        .items
        .into_iter()
        .map(|p| p.metadata)
        .filter(|m| controlled_by(m, &owners))
        .filter_map(|m| Some((m.name?, m.uid?)))
        .collect())
}
