//! Tier 3: a deleted pod's late findings against a real kube-apiserver and
//! etcd (issue 38, point 7): they roll up to the controller's Report, by
//! the chain the reporter verified while the pod lived or, never verified,
//! by the owner the pod watch saw (checked by uid through the API).
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::rollup::*;
use common::workloads::*;
use common::*;
use kube::api::{Api, DeleteParams};
use kyverno_runtime_report::{
    controller_report_name, property, report_name, ControllerKind, DropReason, PodIdentity,
    Reporter, ReporterOptions, WriteResult,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Deletes pod `name` in `ns` (never scheduled: at once) and waits until
/// it is gone.
async fn delete_pod(client: &kube::Client, ns: &str, name: &str) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    for _ in 0..100 {
        if pods.get_opt(name).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod {ns}/{name} did not go");
}

/// Issue 38, point 7: the last findings of a pod deleted before the flush
/// (a Deployment's pod scaled away; a StatefulSet's pod deleted and
/// recreated under its name) still reach the controller's Report: the
/// reporter keeps the owner chains it verified, by pod uid.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_pods_late_findings_reach_its_controllers_report() {
    let client = client().await;
    let ns = "krt-rollup-late";
    fresh_namespace(&client, ns).await;
    let uid = fresh_policy(&client, "rollup-late", None).await;
    let policy = ("rollup-late", uid.as_str());
    let web = deployment(&client, ns, "web").await;
    let (db, db_labels) = statefulset(&client, ns, "db").await;
    let gone = pod(
        &client,
        ns,
        "web-5d9c8-gone",
        "node-a",
        &web.labels,
        Some(&web.replicaset),
    )
    .await;
    let db0 = pod(&client, ns, "db-0", "node-a", &db_labels, Some(&db)).await;

    let drops = Arc::new(Mutex::new(Vec::new()));
    let seen = drops.clone();
    // No lookup cache: by the time a deleted pod's last findings are
    // flushed, what was cached about it has long expired.
    let reporter = reporter(
        client.clone(),
        "node-a",
        ReporterOptions {
            lookup_ttl: Duration::ZERO,
            on_drop: Some(Arc::new(move |reason, n| {
                seen.lock().unwrap().push((reason, n))
            })),
            ..ReporterOptions::default()
        },
    );
    let handle = reporter.handle();
    handle.submit(finding(policy, &gone, "/bin/sh", 2, 10, 10));
    handle.submit(finding(policy, &db0, "/bin/sh", 1, 10, 10));
    for outcome in reporter.flush().await.outcomes {
        assert_eq!(outcome.result.unwrap(), WriteResult::Created);
    }

    // The Deployment's pod is deleted; the StatefulSet's is deleted and
    // recreated under its name. Their last findings arrive after.
    delete_pod(&client, ns, "web-5d9c8-gone").await;
    delete_pod(&client, ns, "db-0").await;
    let db0_new = pod(&client, ns, "db-0", "node-a", &db_labels, Some(&db)).await;
    assert_ne!(db0_new.uid, db0.uid);
    handle.submit(finding(policy, &gone, "/bin/sh", 3, 20, 20));
    handle.submit(finding(policy, &db0, "/bin/sh", 4, 20, 20));
    let flushed = reporter.flush().await;
    for outcome in &flushed.outcomes {
        assert_eq!(
            outcome.result.as_ref().unwrap(),
            &WriteResult::Updated,
            "only the controllers' Reports are written: {outcome:?}"
        );
    }

    let stored = reports(&client, ns).await;
    let deploy = controller_report_name(ControllerKind::Deployment, "web");
    let sts = controller_report_name(ControllerKind::StatefulSet, "db");
    assert_eq!(
        names(&stored),
        BTreeSet::from([deploy.clone(), sts.clone()]),
        "no pod Reports (owned by dead uids, they would be collected)"
    );
    let web_result = result_of(named(&stored, &deploy), policy.0, "/bin/sh");
    assert_eq!(prop(web_result, property::COUNT), "5");
    assert_eq!(prop(web_result, property::LAST_TIMESTAMP), rfc3339(20));
    let db_result = result_of(named(&stored, &sts), policy.0, "/bin/sh");
    assert_eq!(prop(db_result, property::COUNT), "5");
    assert_eq!(prop(db_result, property::POD_COUNT), "1");
    assert!(
        drops.lock().unwrap().is_empty(),
        "{:?}",
        drops.lock().unwrap()
    );
}

type Drops = Arc<Mutex<Vec<(DropReason, u64)>>>;

/// A Deployment `web` in a fresh `ns` and a pod of it, which the pod
/// watch of node-a's reporter saw (no finding yet, so the reporter never
/// read it) and which is then deleted; a fresh policy `ns`.
async fn seen_then_deleted(
    client: &kube::Client,
    ns: &str,
) -> (DeploymentChain, PodIdentity, String, Reporter, Drops) {
    fresh_namespace(client, ns).await;
    let uid = fresh_policy(client, ns, None).await;
    let web = deployment(client, ns, "web").await;
    let short = "web-5d9c8-short";
    let identity = pod(
        client,
        ns,
        short,
        "node-a",
        &web.labels,
        Some(&web.replicaset),
    )
    .await;
    let drops = Drops::default();
    let seen = drops.clone();
    let reporter = reporter(
        client.clone(),
        "node-a",
        ReporterOptions {
            lookup_ttl: Duration::ZERO,
            on_drop: Some(Arc::new(move |reason, n| {
                seen.lock().unwrap().push((reason, n))
            })),
            ..ReporterOptions::default()
        },
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    reporter.handle().saw_pod(&pods.get(short).await.unwrap());
    delete_pod(client, ns, short).await;
    (web, identity, uid, reporter, drops)
}

/// Issue 38, point 7, the rest: a pod whose first findings are flushed
/// after it was deleted (a short-lived Job's pod; a pod deleted within a
/// flush interval of its first denied exec) was never verified while it
/// lived. The owner reference the daemon's pod watch saw is verified from
/// its owner up (the ReplicaSet by uid, then its Deployment), so the
/// findings reach the Deployment's Report, and no pod Report is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_deleted_before_its_first_flush_rolls_up_by_what_the_watch_saw() {
    let client = client().await;
    let ns = "krt-rollup-seen";
    let (_, short, uid, reporter, drops) = seen_then_deleted(&client, ns).await;
    let policy = (ns, uid.as_str());
    reporter
        .handle()
        .submit(finding(policy, &short, "/bin/sh", 2, 10, 10));
    let flushed = reporter.flush().await;
    let stored = reports(&client, ns).await;
    let deploy = controller_report_name(ControllerKind::Deployment, "web");
    assert_eq!(
        names(&stored),
        BTreeSet::from([deploy.clone()]),
        "the Deployment's Report only, no pod Report: {flushed:?}"
    );
    let result = result_of(named(&stored, &deploy), policy.0, "/bin/sh");
    assert_eq!(prop(result, property::COUNT), "2");
    assert_eq!(prop(result, property::POD_COUNT), "1");
    assert!(drops.lock().unwrap().is_empty(), "{drops:?}");
}

/// What the watch saw names an owner by uid: a ReplicaSet deleted and
/// recreated under its name (another uid) since is not that owner, and
/// the findings stay on the pod's own Report, marked unverified, as for
/// a pod the watch never saw.
#[tokio::test(flavor = "multi_thread")]
async fn a_recreated_owner_does_not_get_a_gone_pods_findings() {
    let client = client().await;
    let ns = "krt-rollup-seen-recreated";
    let (web, short, uid, reporter, _) = seen_then_deleted(&client, ns).await;
    let policy = (ns, uid.as_str());
    // The ReplicaSet is deleted and made again under its name.
    let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(client.clone(), ns);
    let rs = &web.replicaset.name;
    sets.delete(rs, &DeleteParams::default()).await.unwrap();
    for _ in 0..100 {
        if sets.get_opt(rs).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = replicaset(&client, ns, rs, &web.deployment, &web.labels).await;
    assert_ne!(again.uid, web.replicaset.uid);

    reporter
        .handle()
        .submit(finding(policy, &short, "/bin/sh", 2, 10, 10));
    let flushed = reporter.flush().await;
    let stored = reports(&client, ns).await;
    let own = report_name("web-5d9c8-short");
    assert_eq!(
        names(&stored),
        BTreeSet::from([own.clone()]),
        "no controller Report: {flushed:?}"
    );
    let result = result_of(named(&stored, &own), policy.0, "/bin/sh");
    assert_eq!(prop(result, property::COUNT), "2");
    assert_eq!(prop(result, property::OWNER_VERIFIED), "false");
}
