//! Tier 3 with a garbage collector: a Report goes with what it is about.
//!
//! Run against `ci/kube-up --with-gc` (kube-controller-manager with only
//! its garbage collector; `KRT_KUBE_GC=1`), which the other API tests must
//! not have: they create pods with made-up owners that it would delete.
//! Hence a feature of its own, `kube-gc-tests`, and a control plane of its
//! own in ci/test.
//!
//! A controller's Report is owned by the controller: deleting the
//! Deployment deletes its ReplicaSet, its pods and its Report. A pod's
//! Report is owned by the pod, and goes with it.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::workloads::*;
use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_report::{
    controller_report_name, report_name, Behavior, ControllerKind, Finding, PodIdentity, Reporter,
    ReporterOptions,
};
use std::time::{Duration, Instant, SystemTime};

fn finding(policy: (&str, &str), pod: &PodIdentity) -> Finding {
    Finding {
        policy: policy.0.into(),
        policy_uid: policy.1.into(),
        behavior: Behavior::Exec,
        pod: pod.clone(),
        target: "/bin/sh".into(),
        enforced: false,
        decision: None,
        count: 1,
        first_observed: SystemTime::now(),
        last_observed: SystemTime::now(),
        process: None,
        matched: Vec::new(),
    }
}

/// Waits (up to `secs`) until the Report `name` in `ns` is gone; returns
/// how long that took.
async fn gone(api: &Api<Report>, name: &str, secs: u64) -> Duration {
    let start = Instant::now();
    while api.get_opt(name).await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "Report {name} still there after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_report_is_collected_with_its_controller_and_with_its_pod() {
    assert_eq!(
        std::env::var("KRT_KUBE_GC").as_deref(),
        Ok("1"),
        "needs a control plane with a garbage collector: eval \"$(ci/kube-up --dir DIR --with-gc)\""
    );
    let client = client().await;
    let ns = "krt-rollup-gc";
    fresh_namespace(&client, ns).await;
    let uid = fresh_policy(&client, "rollup-gc-all", None).await;
    let policy = ("rollup-gc-all", uid.as_str());
    let web = deployment(&client, ns, "web").await;
    let pods = [
        pod(
            &client,
            ns,
            "web-5d9c8-a",
            "node-a",
            &web.labels,
            Some(&web.replicaset),
        )
        .await,
        pod(
            &client,
            ns,
            "web-5d9c8-b",
            "node-a",
            &web.labels,
            Some(&web.replicaset),
        )
        .await,
        pod(
            &client,
            ns,
            "solo",
            "node-a",
            &serde_json::json!({"app": "solo"}),
            None,
        )
        .await,
    ];
    let reporter = Reporter::new(client.clone(), ReporterOptions::default());
    for p in &pods {
        reporter.handle().submit(finding(policy, p));
    }
    reporter.flush().await;
    let reports: Api<Report> = Api::namespaced(client.clone(), ns);
    let deploy = controller_report_name(ControllerKind::Deployment, "web");
    let solo = report_name("solo");
    for name in [&deploy, &solo] {
        assert!(reports.get_opt(name).await.unwrap().is_some(), "{name}");
    }

    // The Deployment goes (as `kubectl delete` does it: in the
    // background); the collector takes its ReplicaSet, the pods and the
    // Report. A Report CRD created moments ago is watched by the collector
    // after its next discovery (every 30 s), hence the generous bound.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    let took = gone(&reports, &deploy, 120).await;
    println!("the Deployment's Report was collected {took:.1?} after the Deployment was deleted");
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    assert!(replicasets
        .get_opt(&web.replicaset.name)
        .await
        .unwrap()
        .is_none());
    assert!(
        reports.get_opt(&solo).await.unwrap().is_some(),
        "not the bare pod's"
    );

    let pod_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    pod_api
        .delete("solo", &DeleteParams::background().grace_period(0))
        .await
        .unwrap();
    let took = gone(&reports, &solo, 120).await;
    println!("the pod's Report was collected {took:.1?} after the pod was deleted");
}
