//! Tier 3: controller roll-up against a real kube-apiserver and etcd.
//!
//! The workloads are made the way their controllers would make them (there
//! is no controller-manager here): a Deployment, its ReplicaSet and its
//! Pods with the right ownerReferences, uids, labels and selectors, and
//! StatefulSets, DaemonSets, Jobs and CronJobs likewise. Then:
//!
//! - a 20-pod Deployment whose findings two reporters (two nodes) write
//!   has exactly one Report, on the Deployment, with the exact sums and no
//!   pod Reports (and 20 pod Reports under `autogen-controllers: none`,
//!   each naming the Deployment as the pod's verified owner);
//! - `StatefulSet` alone rolls up only StatefulSets, `all` the others too;
//!   a CronJob's Job pods roll up to the CronJob, `Job` alone to the Job;
//! - a pod claiming an owner it does not have (wrong uid, selector not
//!   matching, a Deployment named directly, a Deployment that does not
//!   select it) is reported on itself, marked unverified;
//! - a deleted policy's results disappear from controller and pod Reports,
//!   also when it was deleted while no reporter ran.
//!
//! A deleted pod's late findings: `rollup_late_kube.rs`.
// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::rollup::*;
use common::workloads::*;
use common::*;
use kube::api::{Api, DeleteParams};
use kyverno_runtime_api::openreports::Report;
use kyverno_runtime_api::runtimepolicy::RuntimePolicy;
use kyverno_runtime_report::{
    controller_report_name, policy_label, property, report_name, ControllerKind, DropReason,
    PodIdentity, ReporterOptions, WriteResult, MAX_PODS_LISTED,
};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A Deployment `web` with 20 pods, the first 10 on node-a, the others on
/// node-b.
async fn twenty_pod_deployment(
    client: &kube::Client,
    ns: &str,
) -> (DeploymentChain, Vec<PodIdentity>) {
    let chain = deployment(client, ns, "web").await;
    let mut pods = Vec::new();
    for i in 0..20 {
        let node = if i < 10 { "node-a" } else { "node-b" };
        let name = format!("web-5d9c8-p{i:02}");
        pods.push(
            pod(
                client,
                ns,
                &name,
                node,
                &chain.labels,
                Some(&chain.replicaset),
            )
            .await,
        );
    }
    (chain, pods)
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_pods_one_report_with_roll_up_twenty_without() {
    let plain = client().await;

    // --- roll-up (no annotation: every controller) --------------------------
    let ns = "krt-rollup-deploy";
    fresh_namespace(&plain, ns).await;
    let uid = fresh_policy(&plain, "rollup-deploy-all", None).await;
    let policy = ("rollup-deploy-all", uid.as_str());
    let (chain, pods) = twenty_pod_deployment(&plain, ns).await;

    let interfere = Interfere::default();
    let writes = Writes::default();
    let node_a = reporter(client_with(&interfere).await, "node-a", writes.options());
    let node_b = Arc::new(reporter(
        plain.clone(),
        "node-b",
        ReporterOptions::default(),
    ));
    let mut want_count = 0;
    for (i, p) in pods.iter().enumerate() {
        let i = i as u64;
        let f = finding(policy, p, "/bin/sh", i + 1, 100 + i, 200 + i);
        want_count += i + 1;
        if i < 10 {
            node_a.handle().submit(f);
        } else {
            node_b.handle().submit(f);
        }
    }
    node_a
        .handle()
        .submit(finding(policy, &pods[0], "/bin/bash", 2, 50, 60));
    node_b
        .handle()
        .submit(finding(policy, &pods[15], "/bin/bash", 3, 70, 80));

    // Node B writes first while node A's create is held back, so A's
    // create loses (409) and A merges into what B wrote.
    let theirs = Arc::clone(&node_b);
    interfere.arm(Action::Before(Box::pin(async move {
        let flushed = theirs.flush().await;
        assert_eq!(flushed.outcomes.len(), 1, "{flushed:?}");
        assert_eq!(
            flushed.outcomes[0].result.as_ref().unwrap(),
            &WriteResult::Created
        );
    })));
    let flushed = node_a.flush().await;
    assert!(!interfere.is_armed(), "the write went through the layer");
    assert_eq!(flushed.outcomes.len(), 1, "{flushed:?}");
    let name = controller_report_name(ControllerKind::Deployment, "web");
    assert_eq!(flushed.outcomes[0].report, name);
    assert_eq!(
        flushed.outcomes[0].result.as_ref().unwrap(),
        &WriteResult::Updated
    );
    assert_eq!(writes.take(), [WriteResult::Conflict, WriteResult::Updated]);

    let stored = reports(&plain, ns).await;
    assert_eq!(
        names(&stored),
        BTreeSet::from([name.clone()]),
        "no pod Reports"
    );
    let report = named(&stored, &name);
    let scope = report.spec.scope.as_ref().unwrap();
    assert_eq!(
        (
            scope.kind.as_deref(),
            scope.name.as_deref(),
            scope.uid.as_deref()
        ),
        (
            Some("Deployment"),
            Some("web"),
            Some(chain.deployment.uid.as_str())
        )
    );
    let owner = &report.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Deployment", chain.deployment.uid.as_str())
    );
    let labels = report.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[&policy_label(&uid).unwrap()], "rollup-deploy-all");
    let sh = result_of(report, policy.0, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), want_count.to_string());
    assert_eq!(prop(sh, property::POD_COUNT), "20");
    assert_eq!(prop(sh, property::FIRST_TIMESTAMP), rfc3339(100));
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(219));
    // The pods of the latest write first (node A's, B's were written
    // before), each write's most recent first, at most 10.
    let listed: Vec<&str> = sh
        .resources
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.name.as_deref().unwrap())
        .collect();
    let want: Vec<String> = (0..10)
        .rev()
        .map(|i| format!("web-5d9c8-p{i:02}"))
        .collect();
    assert_eq!(listed, want);
    assert_eq!(listed.len(), MAX_PODS_LISTED);
    let bash = result_of(report, policy.0, "/bin/bash");
    assert_eq!(prop(bash, property::COUNT), "5");
    assert_eq!(prop(bash, property::POD_COUNT), "2");
    assert_eq!(report.spec.summary.unwrap().fail, 2);

    // Both nodes again, at the same time: one of them loses the race and
    // retries; the sums stay exact and no pod is counted twice.
    for (i, p) in pods.iter().enumerate() {
        let f = finding(policy, p, "/bin/sh", 1, 300, 300);
        if i < 10 {
            node_a.handle().submit(f);
        } else {
            node_b.handle().submit(f);
        }
    }
    let (a, b) = tokio::join!(node_a.flush(), node_b.flush());
    for outcome in a.outcomes.iter().chain(&b.outcomes) {
        assert_eq!(outcome.result.as_ref().unwrap(), &WriteResult::Updated);
    }
    let stored = reports(&plain, ns).await;
    assert_eq!(stored.len(), 1);
    let sh = result_of(&stored[0], policy.0, "/bin/sh");
    assert_eq!(prop(sh, property::COUNT), (want_count + 20).to_string());
    assert_eq!(prop(sh, property::POD_COUNT), "20");
    assert_eq!(prop(sh, property::LAST_TIMESTAMP), rfc3339(300));
    let rolled_up = stored.len();

    // --- the same Deployment under `autogen-controllers: none` ---------------
    let ns = "krt-rollup-none";
    fresh_namespace(&plain, ns).await;
    let uid = fresh_policy(&plain, "rollup-deploy-none", Some("none")).await;
    let policy = ("rollup-deploy-none", uid.as_str());
    let (_, pods) = twenty_pod_deployment(&plain, ns).await;
    let node_a = reporter(plain.clone(), "node-a", ReporterOptions::default());
    let node_b = reporter(plain.clone(), "node-b", ReporterOptions::default());
    for (i, p) in pods.iter().enumerate() {
        let f = finding(policy, p, "/bin/sh", 1, 100, 100);
        if i < 10 {
            node_a.handle().submit(f);
        } else {
            node_b.handle().submit(f);
        }
    }
    node_a.flush().await;
    node_b.flush().await;
    let stored = reports(&plain, ns).await;
    let want: BTreeSet<String> = pods.iter().map(|p| report_name(&p.name)).collect();
    assert_eq!(names(&stored), want, "one Report per pod");
    for report in &stored {
        let r = result_of(report, policy.0, "/bin/sh");
        assert_eq!(prop(r, property::COUNT), "1");
        assert_eq!(prop(r, property::OWNER_VERIFIED), "true");
        // The finding claims the ReplicaSet (the pod's ownerReference);
        // the verified owner is the ReplicaSet's controller, the
        // Deployment, and that is what the result names.
        assert_eq!(
            (prop(r, property::OWNER_KIND), prop(r, property::OWNER_NAME)),
            ("Deployment", "web")
        );
    }
    let per_pod = stored.len();

    println!(
        "Report objects for the findings of a 20-pod Deployment: {rolled_up} with roll-up \
         (autogen-controllers absent), {per_pod} without (autogen-controllers: none)"
    );
    assert_eq!((rolled_up, per_pod), (1, 20));
}

#[tokio::test(flavor = "multi_thread")]
async fn statefulset_alone_rolls_up_only_statefulsets() {
    let client = client().await;
    let ns = "krt-rollup-kinds";
    fresh_namespace(&client, ns).await;
    let sts_uid = fresh_policy(&client, "rollup-kinds-sts", Some("StatefulSet")).await;
    let all_uid = fresh_policy(&client, "rollup-kinds-all", Some("all")).await;
    let only_sts = ("rollup-kinds-sts", sts_uid.as_str());
    let all = ("rollup-kinds-all", all_uid.as_str());

    let (db, db_labels) = statefulset(&client, ns, "db").await;
    let api = deployment(&client, ns, "api").await;
    let (agent, agent_labels) = daemonset(&client, ns, "agent").await;
    let pods = [
        pod(&client, ns, "db-0", "node-a", &db_labels, Some(&db)).await,
        pod(&client, ns, "db-1", "node-a", &db_labels, Some(&db)).await,
        pod(
            &client,
            ns,
            "api-5d9c8-a",
            "node-a",
            &api.labels,
            Some(&api.replicaset),
        )
        .await,
        pod(
            &client,
            ns,
            "api-5d9c8-b",
            "node-a",
            &api.labels,
            Some(&api.replicaset),
        )
        .await,
        pod(
            &client,
            ns,
            "agent-x1",
            "node-a",
            &agent_labels,
            Some(&agent),
        )
        .await,
    ];
    let reporter = reporter(client.clone(), "node-a", ReporterOptions::default());
    for p in &pods {
        reporter
            .handle()
            .submit(finding(only_sts, p, "/bin/sh", 1, 10, 10));
        reporter
            .handle()
            .submit(finding(all, p, "/bin/sh", 1, 10, 10));
    }
    let flushed = reporter.flush().await;
    for outcome in &flushed.outcomes {
        assert_eq!(outcome.result.as_ref().unwrap(), &WriteResult::Created);
    }

    let stored = reports(&client, ns).await;
    let sts = controller_report_name(ControllerKind::StatefulSet, "db");
    let deploy = controller_report_name(ControllerKind::Deployment, "api");
    let ds = controller_report_name(ControllerKind::DaemonSet, "agent");
    let pod_reports = [
        report_name("api-5d9c8-a"),
        report_name("api-5d9c8-b"),
        report_name("agent-x1"),
    ];
    let want: BTreeSet<String> = [sts.clone(), deploy.clone(), ds.clone()]
        .into_iter()
        .chain(pod_reports.iter().cloned())
        .collect();
    assert_eq!(names(&stored), want);

    // Both policies roll up the StatefulSet's pods.
    let report = named(&stored, &sts);
    assert_eq!(
        policies_of(report),
        BTreeSet::from([only_sts.0.into(), all.0.into()])
    );
    for policy in [only_sts.0, all.0] {
        assert_eq!(
            prop(result_of(report, policy, "/bin/sh"), property::POD_COUNT),
            "2"
        );
    }
    // Only `all` rolls up the Deployment's and the DaemonSet's ...
    for (name, pods) in [(&deploy, "2"), (&ds, "1")] {
        let report = named(&stored, name);
        assert_eq!(policies_of(report), BTreeSet::from([all.0.into()]));
        assert_eq!(
            prop(result_of(report, all.0, "/bin/sh"), property::POD_COUNT),
            pods
        );
    }
    // ... and `StatefulSet` leaves their findings on the pods, whose owners
    // verified.
    for name in &pod_reports {
        let report = named(&stored, name);
        assert_eq!(policies_of(report), BTreeSet::from([only_sts.0.into()]));
        assert_eq!(
            prop(
                result_of(report, only_sts.0, "/bin/sh"),
                property::OWNER_VERIFIED
            ),
            "true"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cronjobs_job_pods_roll_up_to_the_cronjob() {
    let client = client().await;
    let ns = "krt-rollup-cron";
    fresh_namespace(&client, ns).await;
    let all_uid = fresh_policy(&client, "rollup-cron-all", None).await;
    let job_uid = fresh_policy(&client, "rollup-cron-job", Some("Job")).await;
    let all = ("rollup-cron-all", all_uid.as_str());
    let only_job = ("rollup-cron-job", job_uid.as_str());

    let nightly = cronjob(&client, ns, "nightly").await;
    let (run, run_labels) = job(&client, ns, "nightly-29000000", Some(&nightly)).await;
    let (once, once_labels) = job(&client, ns, "once", None).await;
    let pods = [
        pod(
            &client,
            ns,
            "nightly-29000000-a",
            "node-a",
            &run_labels,
            Some(&run),
        )
        .await,
        pod(
            &client,
            ns,
            "nightly-29000000-b",
            "node-b",
            &run_labels,
            Some(&run),
        )
        .await,
        pod(&client, ns, "once-x", "node-a", &once_labels, Some(&once)).await,
    ];
    let reporter = reporter(client.clone(), "node-a", ReporterOptions::default());
    for p in &pods {
        reporter
            .handle()
            .submit(finding(all, p, "/bin/sh", 2, 10, 10));
        reporter
            .handle()
            .submit(finding(only_job, p, "/bin/sh", 1, 10, 10));
    }
    reporter.flush().await;

    let stored = reports(&client, ns).await;
    let cron = controller_report_name(ControllerKind::CronJob, "nightly");
    let run_report = controller_report_name(ControllerKind::Job, "nightly-29000000");
    let once_report = controller_report_name(ControllerKind::Job, "once");
    assert_eq!(
        names(&stored),
        BTreeSet::from([cron.clone(), run_report.clone(), once_report.clone()]),
        "no pod Reports"
    );
    // `all`: the CronJob (the top of the chain) for its Job's pods, the Job
    // for a Job without a CronJob.
    let report = named(&stored, &cron);
    assert_eq!(policies_of(report), BTreeSet::from([all.0.into()]));
    let r = result_of(report, all.0, "/bin/sh");
    assert_eq!(
        (prop(r, property::COUNT), prop(r, property::POD_COUNT)),
        ("4", "2")
    );
    let scope = report.spec.scope.as_ref().unwrap();
    assert_eq!(
        (
            scope.api_version.as_deref(),
            scope.kind.as_deref(),
            scope.uid.as_deref()
        ),
        (
            Some("batch/v1"),
            Some("CronJob"),
            Some(nightly.uid.as_str())
        )
    );
    // `Job` alone: the Job, whether or not a CronJob made it.
    let report = named(&stored, &run_report);
    assert_eq!(policies_of(report), BTreeSet::from([only_job.0.into()]));
    assert_eq!(
        prop(
            result_of(report, only_job.0, "/bin/sh"),
            property::POD_COUNT
        ),
        "2"
    );
    let report = named(&stored, &once_report);
    assert_eq!(
        policies_of(report),
        BTreeSet::from([all.0.into(), only_job.0.into()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_claiming_an_owner_it_does_not_have_is_reported_on_itself() {
    let client = client().await;
    let ns = "krt-rollup-liars";
    fresh_namespace(&client, ns).await;
    let uid = fresh_policy(&client, "rollup-liars-all", None).await;
    let policy = ("rollup-liars-all", uid.as_str());

    let real = deployment(&client, ns, "real").await;
    // A Deployment that does not select what its ReplicaSet selects.
    let narrow = deployment(&client, ns, "narrow").await;
    let odd_labels = json!({"tier": "odd"});
    let odd = replicaset(&client, ns, "narrow-odd", &narrow.deployment, &odd_labels).await;

    let honest = pod(
        &client,
        ns,
        "real-5d9c8-ok",
        "node-a",
        &real.labels,
        Some(&real.replicaset),
    )
    .await;
    let liars = [
        // The real ReplicaSet's name, another uid.
        pod(
            &client,
            ns,
            "wrong-uid",
            "node-a",
            &real.labels,
            Some(
                &real
                    .replicaset
                    .with_uid("00000000-0000-0000-0000-00000000dead"),
            ),
        )
        .await,
        // The real ReplicaSet, whose selector does not match.
        pod(
            &client,
            ns,
            "wrong-labels",
            "node-a",
            &json!({"app": "other"}),
            Some(&real.replicaset),
        )
        .await,
        // The Deployment itself, uid and all: Deployments own ReplicaSets.
        pod(
            &client,
            ns,
            "names-deployment",
            "node-a",
            &real.labels,
            Some(&real.deployment),
        )
        .await,
        // A ReplicaSet that selects it, of a Deployment that does not.
        pod(
            &client,
            ns,
            "narrow-odd-x",
            "node-a",
            &odd_labels,
            Some(&odd),
        )
        .await,
    ];
    let reporter = reporter(client.clone(), "node-a", ReporterOptions::default());
    reporter
        .handle()
        .submit(finding(policy, &honest, "/bin/sh", 1, 10, 10));
    for p in &liars {
        reporter
            .handle()
            .submit(finding(policy, p, "/bin/sh", 1, 10, 10));
    }
    reporter.flush().await;

    let stored = reports(&client, ns).await;
    let deploy = controller_report_name(ControllerKind::Deployment, "real");
    let want: BTreeSet<String> = std::iter::once(deploy.clone())
        .chain(liars.iter().map(|p| report_name(&p.name)))
        .collect();
    assert_eq!(names(&stored), want);
    let r = result_of(named(&stored, &deploy), policy.0, "/bin/sh");
    assert_eq!(prop(r, property::POD_COUNT), "1", "only the honest pod");
    assert_eq!(
        r.resources.as_ref().unwrap()[0].name.as_deref(),
        Some("real-5d9c8-ok")
    );
    for p in &liars {
        let report = named(&stored, &report_name(&p.name));
        let r = result_of(report, policy.0, "/bin/sh");
        assert_eq!(prop(r, property::OWNER_VERIFIED), "false", "{}", p.name);
        assert_eq!(Some(prop(r, property::OWNER_KIND)), p.owner_kind.as_deref());
        assert_eq!(Some(prop(r, property::OWNER_NAME)), p.owner_name.as_deref());
        assert_eq!(
            report.spec.scope.as_ref().unwrap().kind.as_deref(),
            Some("Pod")
        );
    }
}

/// Polls `check` every 200 ms for up to `secs` seconds.
async fn eventually<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(()) => return,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not after {secs} s: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The policies whose results the named Reports in `ns` hold.
async fn policies_in(client: &kube::Client, ns: &str, name: &str) -> BTreeSet<String> {
    let api: Api<Report> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .unwrap()
        .map(|r| policies_of(&r))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_policys_results_disappear_from_every_report() {
    let client = client().await;
    let ns = "krt-rollup-cleanup";
    fresh_namespace(&client, ns).await;
    let keep_uid = fresh_policy(&client, "rollup-cleanup-keep", None).await;
    let gone_uid = fresh_policy(&client, "rollup-cleanup-gone", None).await;
    let orphan_uid = fresh_policy(&client, "rollup-cleanup-orphan", None).await;
    let keep = ("rollup-cleanup-keep", keep_uid.as_str());
    let gone = ("rollup-cleanup-gone", gone_uid.as_str());
    let orphan = ("rollup-cleanup-orphan", orphan_uid.as_str());
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
        pod(&client, ns, "solo", "node-a", &json!({"app": "solo"}), None).await,
    ];
    let deploy = controller_report_name(ControllerKind::Deployment, "web");
    let solo = report_name("solo");
    let all_three: BTreeSet<String> = [keep.0, gone.0, orphan.0].map(String::from).into();

    // Results of all three policies, on the Deployment's Report and the
    // bare pod's.
    let writer = reporter(client.clone(), "node-a", ReporterOptions::default());
    for p in &pods {
        for policy in [keep, gone, orphan] {
            writer
                .handle()
                .submit(finding(policy, p, "/bin/sh", 1, 10, 10));
        }
    }
    writer.flush().await;
    for name in [&deploy, &solo] {
        assert_eq!(policies_in(&client, ns, name).await, all_three);
    }

    // 1. Deleted while no reporter runs: the next one to start removes its
    //    results once it has listed the policies.
    let policies: Api<RuntimePolicy> = Api::all(client.clone());
    policies
        .delete(orphan.0, &DeleteParams::default())
        .await
        .unwrap();
    let drops = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&drops);
    let running = reporter(
        client.clone(),
        "node-a",
        ReporterOptions {
            interval: Duration::from_millis(200),
            on_drop: Some(Arc::new(move |reason, n| {
                seen.lock().unwrap().push((reason, n))
            })),
            ..ReporterOptions::default()
        },
    );
    let handle = running.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(running.run(async {
        let _ = stopped.await;
    }));
    let two: BTreeSet<String> = [keep.0, gone.0].map(String::from).into();
    eventually("the orphaned policy's results removed", 30, || async {
        for name in [&deploy, &solo] {
            let now = policies_in(&client, ns, name).await;
            if now != two {
                return Err(format!("{name}: {now:?}"));
            }
        }
        Ok(())
    })
    .await;

    // 2. Deleted while the reporter runs: its watch sees it go.
    policies
        .delete(gone.0, &DeleteParams::default())
        .await
        .unwrap();
    let one: BTreeSet<String> = [keep.0.to_string()].into();
    eventually("the deleted policy's results removed", 30, || async {
        for name in [&deploy, &solo] {
            let now = policies_in(&client, ns, name).await;
            if now != one {
                return Err(format!("{name}: {now:?}"));
            }
        }
        Ok(())
    })
    .await;
    let api: Api<Report> = Api::namespaced(client.clone(), ns);
    for name in [&deploy, &solo] {
        let report = api.get(name).await.unwrap();
        let labels = report.metadata.labels.unwrap();
        assert!(
            !labels.contains_key(&policy_label(&gone_uid).unwrap()),
            "{name}: {labels:?}"
        );
        assert!(
            !labels.contains_key(&policy_label(&orphan_uid).unwrap()),
            "{name}: {labels:?}"
        );
        assert!(
            labels.contains_key(&policy_label(&keep_uid).unwrap()),
            "{name}: {labels:?}"
        );
        assert_eq!(report.spec.summary.unwrap().fail, 1);
    }

    // A late finding of the deleted policy is not written back: dropped,
    // and counted.
    handle.submit(finding(gone, &pods[0], "/bin/sh", 1, 20, 20));
    handle.submit(finding(keep, &pods[2], "/bin/sh", 1, 20, 20));
    eventually("the live policy's new finding written", 30, || async {
        let report = api.get(&solo).await.unwrap();
        let count = prop(result_of(&report, keep.0, "/bin/sh"), property::COUNT).to_string();
        (count == "2").then_some(()).ok_or(count)
    })
    .await;
    assert_eq!(policies_in(&client, ns, &deploy).await, one);
    assert_eq!(*drops.lock().unwrap(), [(DropReason::PolicyDeleted, 1)]);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap();
}
