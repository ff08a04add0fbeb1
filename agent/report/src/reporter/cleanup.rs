//! Removing a deleted policy's results from the Reports that hold them.
//!
//! Every Report carries a `policy.runtime.nirmata.io/<uid>` label per
//! policy it has results of, so the Reports to edit are found with a label
//! selector, from the API server's watch cache (`resourceVersion=0`), not
//! by reading every Report. A result is removed only once its policy is
//! confirmed gone (deleted by the watch, or not found by name with that
//! uid), so a policy the watch has not delivered yet keeps its results.
//! A Report left without results is kept (empty): deleting Reports would
//! need a verb the daemon does not otherwise use, and its owner's garbage
//! collection removes it with its pod or controller.

use super::{Reporter, WriteResult};
use crate::error::{Error, Result};
use crate::merge::{
    policy_label, result_policy_uid, without_policies, MANAGED_BY, MANAGED_BY_LABEL,
    POLICY_LABEL_PREFIX,
};
use crate::policies::{Cleanup, PolicyState};
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use kyverno_runtime_api::openreports::Report;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::time::Duration;
use tokio::sync::mpsc;

impl Reporter {
    /// Where in `cleanup_spread` this node starts a cleanup: the same for
    /// a node every time, spread evenly over node names.
    fn cleanup_delay(&self) -> Duration {
        let digest = Sha256::digest(self.node.as_bytes());
        let slot = u32::from(digest[0]) << 8 | u32::from(digest[1]);
        self.cleanup_spread.mul_f64(f64::from(slot) / 65_536.0)
    }

    /// Runs the cleanups the policy watch asks for, one at a time, each
    /// after [`cleanup_delay`](Self::cleanup_delay), batching whatever
    /// arrived meanwhile.
    pub(super) async fn cleanup_loop(&self, mut requests: mpsc::UnboundedReceiver<Cleanup>) {
        while let Some(first) = requests.recv().await {
            tokio::time::sleep(self.cleanup_delay()).await;
            let mut deleted: HashSet<String> = HashSet::new();
            let mut orphans = false;
            let mut next = Some(first);
            while let Some(request) = next {
                match request {
                    Cleanup::Deleted(uids) => deleted.extend(uids),
                    Cleanup::Orphans => orphans = true,
                }
                next = requests.try_recv().ok();
            }
            if !deleted.is_empty() {
                self.sweep_deleted(&deleted).await;
            }
            if orphans {
                self.sweep_orphans().await;
            }
        }
    }

    /// Removes the results of the `deleted` policies from every Report
    /// labelled with one of them.
    pub(super) async fn sweep_deleted(&self, deleted: &HashSet<String>) {
        let api: Api<Report> = Api::all(self.client.clone());
        let mut reports: Vec<(String, String)> = Vec::new();
        for uid in deleted {
            let Some(label) = policy_label(uid) else {
                continue;
            };
            let params = ListParams::default()
                .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY},{label}"))
                .match_any();
            match api.list_metadata(&params).await {
                Ok(list) => reports.extend(
                    list.items
                        .iter()
                        .filter_map(|r| Some((r.namespace()?, r.name_any()))),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "listing the Reports of a deleted policy failed; its results stay until the next cleanup");
                }
            }
        }
        reports.sort();
        reports.dedup();
        let n = reports.len();
        let edited = self.prune_all(reports, &|uid| deleted.contains(uid)).await;
        tracing::info!(
            policies = deleted.len(),
            reports = n,
            edited,
            "removed the results of deleted policies"
        );
    }

    /// Removes the results of policies that no longer exist from every
    /// Report of ours: a policy deleted while no daemon watched.
    pub(super) async fn sweep_orphans(&self) {
        let api: Api<Report> = Api::all(self.client.clone());
        let params = ListParams::default()
            .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"))
            .match_any();
        let list = match api.list_metadata(&params).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "listing Reports to find results of deleted policies failed; they stay until a policy is deleted again or the daemon restarts");
                return;
            }
        };
        let unknown = |uid: &str| self.policies.is_watched(uid) != Some(true);
        let reports: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|r| {
                r.labels()
                    .keys()
                    .filter_map(|k| k.strip_prefix(POLICY_LABEL_PREFIX))
                    .any(unknown)
            })
            .filter_map(|r| Some((r.namespace()?, r.name_any())))
            .collect();
        if reports.is_empty() {
            return;
        }
        let n = reports.len();
        let edited = self.prune_all(reports, &unknown).await;
        tracing::info!(
            reports = n,
            edited,
            "removed the results of policies deleted while no daemon watched"
        );
    }

    /// [`prune`](Self::prune) on each Report; returns how many changed.
    async fn prune_all(
        &self,
        reports: Vec<(String, String)>,
        candidate: &(dyn Fn(&str) -> bool + Sync),
    ) -> usize {
        let mut edited = 0;
        for (namespace, name) in reports {
            match self.prune(&namespace, &name, candidate).await {
                Ok(WriteResult::Updated) => edited += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "removing a deleted policy's results failed; they stay until the next cleanup")
                }
            }
        }
        edited
    }

    /// Removes from one Report the results whose policy uid is a
    /// `candidate` and is confirmed deleted, retrying lost races from a
    /// fresh read.
    pub(super) async fn prune(
        &self,
        namespace: &str,
        name: &str,
        candidate: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<WriteResult> {
        let api: Api<Report> = Api::namespaced(self.client.clone(), namespace);
        let api_err = |source| Error::Api {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        };
        for attempt in 1..=self.max_write_attempts {
            let Some(stored) = api.get_opt(name).await.map_err(api_err)? else {
                return Ok(WriteResult::Unchanged);
            };
            let mut gone: HashSet<String> = HashSet::new();
            let mut live: HashSet<String> = HashSet::new();
            for result in stored.spec.results.iter().flatten() {
                let Some(uid) = result_policy_uid(result) else {
                    continue;
                };
                if !candidate(uid) || gone.contains(uid) || live.contains(uid) {
                    continue;
                }
                match self
                    .policies
                    .state(&result.policy, uid)
                    .await
                    .map_err(api_err)?
                {
                    PolicyState::Deleted => gone.insert(uid.to_string()),
                    PolicyState::Live(_) => live.insert(uid.to_string()),
                };
            }
            let Some(pruned) = without_policies(&stored, &|uid| gone.contains(uid)) else {
                return Ok(WriteResult::Unchanged);
            };
            match api.replace(name, &PostParams::default(), &pruned).await {
                Ok(_) => {
                    self.wrote(WriteResult::Updated);
                    return Ok(WriteResult::Updated);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.wrote(WriteResult::Conflict);
                    tokio::time::sleep(super::write::backoff(name, attempt)).await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Ok(WriteResult::Unchanged);
                }
                Err(e) => {
                    self.write_failed(&e);
                    return Err(api_err(e));
                }
            }
        }
        self.wrote(WriteResult::Error);
        Err(Error::Conflicts {
            namespace: namespace.to_string(),
            name: name.to_string(),
            attempts: self.max_write_attempts,
        })
    }
}
