//! The opt-in startup taint (`--startup-taint KEY`, the chart's
//! `daemon.startupTaint`): a node joins with a `KEY:NoExecute` taint (the
//! kubelet's `registerWithTaints`), so the scheduler places no workload
//! there and the kubelet admits none, until this daemon has listed every
//! policy, namespace and pod of the node and handed them to the engine,
//! which programs the kernel before it returns. Then the daemon removes the
//! taint and workloads arrive on a node that already enforces. The same
//! shape as Cilium's `node.cilium.io/agent-not-ready`.
//!
//! The removal is a merge patch carrying the resourceVersion it read (the
//! API server then applies it only to that version), so a concurrent change
//! to the Node's taints is never overwritten: a conflict reads the Node
//! again. Every other taint is kept. Failures are retried
//! with a backoff (1 s doubling to 30 s) until the taint is gone or the
//! daemon stops, each distinct failure logged once.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The node's taints without those of `key`, or `None` when it has none of
/// them (nothing to remove).
pub fn without(taints: &[Taint], key: &str) -> Option<Vec<Taint>> {
    if !taints.iter().any(|t| t.key == key) {
        return None;
    }
    Some(taints.iter().filter(|t| t.key != key).cloned().collect())
}

/// The merge patch that replaces `spec.taints` by `kept`, only if the Node
/// is still at `resource_version` (409 Conflict otherwise).
pub fn removal_patch(resource_version: &str, kept: &[Taint]) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"taints": kept},
    })
}

/// What one attempt did.
enum Attempt {
    Removed,
    Absent,
    Conflict,
}

async fn attempt(api: &Api<Node>, node: &str, key: &str) -> Result<Attempt, String> {
    let current = api
        .get(node)
        .await
        .map_err(|e| format!("reading the Node: {e}"))?;
    let taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let Some(kept) = without(&taints, key) else {
        return Ok(Attempt::Absent);
    };
    let version = current
        .metadata
        .resource_version
        .clone()
        .ok_or("the Node has no resourceVersion")?;
    let patch = removal_patch(&version, &kept);
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Attempt::Removed),
        // The Node changed since it was read: read it again.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
        Err(e) => Err(format!("patching the Node: {e}")),
    }
}

/// Waits until `reconciled` says the first full reconcile is done, then
/// removes `key`'s taints from `node`, retrying until it is gone or `stop`
/// completes.
pub async fn remove_when_reconciled(
    client: kube::Client,
    node: String,
    key: String,
    mut reconciled: watch::Receiver<bool>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let started = tokio::time::Instant::now();
    tokio::select! {
        () = &mut stop => return,
        r = reconciled.wait_for(|done| *done) => {
            if r.is_err() {
                return;
            }
        }
    }
    let api: Api<Node> = Api::all(client);
    let mut delay = FIRST_RETRY;
    let mut last_error = String::new();
    loop {
        match attempt(&api, &node, &key).await {
            Ok(Attempt::Removed) => {
                tracing::info!(%node, taint = %key, after = ?started.elapsed(), "startup taint removed after the first full reconcile of policies and pods: workloads may be scheduled and admitted here");
                return;
            }
            Ok(Attempt::Absent) => {
                tracing::info!(%node, taint = %key, "no startup taint on this node (the kubelet's registerWithTaints adds it to a node joining): nothing to remove");
                return;
            }
            Ok(Attempt::Conflict) => continue,
            Err(e) => {
                if e != last_error {
                    tracing::warn!(%node, taint = %key, error = %e, "the startup taint could not be removed yet (retrying): workloads stay off this node until it is");
                    last_error = e;
                }
            }
        }
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's default key.
    const DEFAULT_KEY: &str = "kyverno-runtime.io/agent-not-ready";

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: Some("true".into()),
            time_added: None,
        }
    }

    #[test]
    fn only_the_startup_taint_goes_and_every_other_stays() {
        let foreign = taint("node.example.com/maintenance", "NoSchedule");
        let ours = taint(DEFAULT_KEY, "NoExecute");
        // Both effects of our key go (an operator may have added NoSchedule
        // too); the foreign taint stays, in its place.
        let taints = [
            ours.clone(),
            foreign.clone(),
            taint(DEFAULT_KEY, "NoSchedule"),
        ];
        assert_eq!(without(&taints, DEFAULT_KEY), Some(vec![foreign.clone()]));
        assert_eq!(without(std::slice::from_ref(&foreign), DEFAULT_KEY), None);
        assert_eq!(without(&[], DEFAULT_KEY), None);
        assert_eq!(without(&[ours], DEFAULT_KEY), Some(vec![]));
    }

    #[test]
    fn the_patch_is_guarded_by_the_version_read() {
        let kept = [taint("a", "NoSchedule")];
        let p = removal_patch("4711", &kept);
        assert_eq!(p["metadata"]["resourceVersion"], "4711");
        assert_eq!(p["spec"]["taints"][0]["key"], "a");
        assert_eq!(p["spec"]["taints"].as_array().map(Vec::len), Some(1));
        // With nothing kept, an empty list (a merge patch's null would
        // delete the field, which is the same; the list says it plainly).
        assert_eq!(
            removal_patch("1", &[])["spec"]["taints"],
            serde_json::json!([])
        );
    }
}
