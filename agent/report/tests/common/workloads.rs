//! Workloads as their controllers would have made them: there is no
//! kube-controller-manager creating ReplicaSets, Jobs or Pods here, so the
//! tests create every object themselves, with the ownerReferences, uids,
//! labels and selectors the real controllers write.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use super::{ignore_conflict, ignore_not_found};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::NamespaceResourceScope;
use kube::Resource;
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_report::PodIdentity;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::fmt::Debug;
use std::time::Duration;

/// An object's reference as its dependents carry it.
#[derive(Clone, Debug)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// The ownerReference a controller writes on what it makes.
    pub fn reference(&self) -> Value {
        json!({
            "apiVersion": self.api_version, "kind": self.kind, "name": self.name,
            "uid": self.uid, "controller": true, "blockOwnerDeletion": true,
        })
    }

    /// The same reference with another uid (a pod lying about its owner).
    pub fn with_uid(&self, uid: &str) -> Owner {
        Owner {
            uid: uid.into(),
            ..self.clone()
        }
    }
}

async fn create<K>(client: &kube::Client, ns: &str, object: Value) -> K
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> Owner {
    Owner {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: object.meta().name.clone().unwrap(),
        uid: object.meta().uid.clone().unwrap(),
    }
}

async fn delete_all<K>(client: &kube::Client, ns: &str)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    ignore_not_found(
        // Background: the orphaning default of a Job would leave it
        // Terminating until a garbage collector removes its finalizer,
        // and there may be none.
        api.delete_collection(
            &DeleteParams::background().grace_period(0),
            &ListParams::default(),
        )
        .await,
    );
    // Never scheduled pods go at once; wait until the list is empty so
    // the names can be reused.
    for _ in 0..100 {
        if api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("objects of kind {} in {ns} did not go", K::kind(&()));
}

/// A namespace with its `default` ServiceAccount (there is no controller
/// to create it, and admission requires it of a pod), emptied of every
/// workload and Report an earlier run left.
pub async fn fresh_namespace(client: &kube::Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    ignore_conflict(namespaces.create(&PostParams::default(), &namespace).await);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    ignore_conflict(accounts.create(&PostParams::default(), &account).await);
    delete_all::<Pod>(client, ns).await;
    delete_all::<ReplicaSet>(client, ns).await;
    delete_all::<Deployment>(client, ns).await;
    delete_all::<StatefulSet>(client, ns).await;
    delete_all::<DaemonSet>(client, ns).await;
    delete_all::<Job>(client, ns).await;
    delete_all::<CronJob>(client, ns).await;
    delete_all::<Report>(client, ns).await;
}

/// A monitor RuntimePolicy `name`, recreated (a fresh uid), with the
/// `pod-policies.kyverno.io/autogen-controllers` annotation when given.
/// Returns its uid.
pub async fn fresh_policy(client: &kube::Client, name: &str, autogen: Option<&str>) -> String {
    let api: Api<RuntimePolicy> = Api::all(client.clone());
    ignore_not_found(api.delete(name, &DeleteParams::default()).await);
    for _ in 0..100 {
        if api.get_opt(name).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut metadata = json!({"name": name});
    if let Some(value) = autogen {
        metadata["annotations"] = json!({ kyverno_runtime_report::AUTOGEN_ANNOTATION: value });
    }
    let policy: RuntimePolicy = serde_json::from_value(json!({
        "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
        "metadata": metadata,
        "spec": {"mode": "monitor", "behaviors": [{"exec": {"deny": {"values": ["/bin/sh"]}}}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &policy)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

fn template(labels: &Value) -> Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    })
}

/// A pod `name` with `labels`, owned by `owner` (if any) on `node`, as the
/// engine would describe it in a finding: its first ownerReference's kind
/// and name, unverified.
pub async fn pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    labels: &Value,
    owner: Option<&Owner>,
) -> PodIdentity {
    let mut metadata = json!({"name": name, "labels": labels});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner.reference()]);
    }
    let pod: Pod = create(
        client,
        ns,
        json!({
            "metadata": metadata,
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "app", "image": "busybox"}]},
        }),
    )
    .await;
    PodIdentity {
        namespace: ns.into(),
        name: name.into(),
        uid: pod.metadata.uid.unwrap(),
        container: Some("app".into()),
        owner_kind: owner.map(|o| o.kind.clone()),
        owner_name: owner.map(|o| o.name.clone()),
    }
}

/// A Deployment `name` (selector `app: <name>`) and its ReplicaSet
/// `<name>-5d9c8` (selector and labels with the pod-template-hash).
pub struct DeploymentChain {
    pub deployment: Owner,
    pub replicaset: Owner,
    /// What the pods of the ReplicaSet carry.
    pub labels: Value,
}

pub async fn deployment(client: &kube::Client, ns: &str, name: &str) -> DeploymentChain {
    let app = json!({"app": name});
    let d: Deployment = create(
        client,
        ns,
        json!({
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": app}, "template": template(&app)},
        }),
    )
    .await;
    let deployment = owner_of(&d);
    let labels = json!({"app": name, "pod-template-hash": "5d9c8"});
    let replicaset = replicaset(client, ns, &format!("{name}-5d9c8"), &deployment, &labels).await;
    DeploymentChain {
        deployment,
        replicaset,
        labels,
    }
}

/// A ReplicaSet `name` controlled by `owner`, selecting `labels`.
pub async fn replicaset(
    client: &kube::Client,
    ns: &str,
    name: &str,
    owner: &Owner,
    labels: &Value,
) -> Owner {
    let rs: ReplicaSet = create(
        client,
        ns,
        json!({
            "metadata": {"name": name, "labels": labels, "ownerReferences": [owner.reference()]},
            "spec": {"selector": {"matchLabels": labels}, "template": template(labels)},
        }),
    )
    .await;
    owner_of(&rs)
}

/// A StatefulSet `name` (selector `app: <name>`); its pods carry `labels`.
pub async fn statefulset(client: &kube::Client, ns: &str, name: &str) -> (Owner, Value) {
    let app = json!({"app": name});
    let s: StatefulSet = create(
        client,
        ns,
        json!({
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": app}, "serviceName": name,
                     "template": template(&app)},
        }),
    )
    .await;
    (owner_of(&s), app)
}

/// A DaemonSet `name` (selector `app: <name>`).
pub async fn daemonset(client: &kube::Client, ns: &str, name: &str) -> (Owner, Value) {
    let app = json!({"app": name});
    let d: DaemonSet = create(
        client,
        ns,
        json!({
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": app}, "template": template(&app)},
        }),
    )
    .await;
    (owner_of(&d), app)
}

/// A Job `name`, owned by `cronjob` if given. The API server generates its
/// selector (`batch.kubernetes.io/controller-uid: <uid>`) and the template
/// labels its pods must carry, which are returned.
pub async fn job(
    client: &kube::Client,
    ns: &str,
    name: &str,
    cronjob: Option<&Owner>,
) -> (Owner, Value) {
    let mut metadata = json!({"name": name});
    if let Some(c) = cronjob {
        metadata["ownerReferences"] = json!([c.reference()]);
    }
    let j: Job = create(
        client,
        ns,
        json!({
            "metadata": metadata,
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "app", "image": "busybox"}]}}},
        }),
    )
    .await;
    let labels = serde_json::to_value(
        j.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap(),
    )
    .unwrap();
    (owner_of(&j), labels)
}

/// A CronJob `name`.
pub async fn cronjob(client: &kube::Client, ns: &str, name: &str) -> Owner {
    let c: CronJob = create(
        client,
        ns,
        json!({
            "metadata": {"name": name},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "app", "image": "busybox"}]}}}}},
        }),
    )
    .await;
    owner_of(&c)
}

/// Every Report in `ns`, by name.
pub async fn reports(client: &kube::Client, ns: &str) -> Vec<Report> {
    let api: Api<Report> = Api::namespaced(client.clone(), ns);
    let mut list = api.list(&ListParams::default()).await.unwrap().items;
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    list
}
