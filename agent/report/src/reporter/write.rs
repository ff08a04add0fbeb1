//! Writing a Report: read, merge, skip when unchanged, create or replace
//! with the resourceVersion read, and start over from a fresh read when
//! another writer got there first.

use super::{Reporter, WriteResult};
use crate::error::{Error, Result};
use crate::finding::{Finding, Fingerprint};
use crate::merge::{desired_controller_report, other_pod, Merged, PodKey, Rollup, Subject};
use crate::owners::Controller;
use kube::api::{Api, PostParams};
use kyverno_runtime_api::openreports::Report;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::PoisonError;
use std::time::Duration;

/// The pods a writer has counted for each controller result: a pod that
/// has fallen off the result's listed pods is still not counted twice.
/// Bounded; when full it starts over, so the count can then over-count a
/// pod that is no longer listed (never under-count).
#[derive(Default)]
pub(super) struct Counted {
    pods: HashMap<Fingerprint, HashSet<String>>,
    entries: usize,
}

/// At most this many (result, pod) pairs are remembered (a few MB).
const MAX_COUNTED: usize = 100_000;

impl Counted {
    pub(super) fn contains(&self, fingerprint: &Fingerprint, uid: &str) -> bool {
        self.pods
            .get(fingerprint)
            .is_some_and(|pods| pods.contains(uid))
    }

    pub(super) fn record(&mut self, rollups: &BTreeMap<Fingerprint, Rollup>) {
        let new: usize = rollups
            .iter()
            .map(|(fp, r)| r.seen().filter(|(uid, _)| !self.contains(fp, uid)).count())
            .sum();
        if self.entries + new > MAX_COUNTED {
            tracing::warn!(
                entries = self.entries,
                "too many counted (result, pod) pairs to remember; starting over (a pod no longer listed on a controller's result may be counted again)"
            );
            *self = Counted::default();
        }
        for (fp, rollup) in rollups {
            let pods = self.pods.entry(*fp).or_default();
            for (uid, _) in rollup.seen() {
                if pods.insert(uid.clone()) {
                    self.entries += 1;
                }
            }
        }
    }
}

impl Reporter {
    /// Merges the findings of a controller's pods into its Report.
    pub(super) async fn write_controller(
        &self,
        controller: &Controller,
        findings: &BTreeMap<Fingerprint, Finding>,
    ) -> Result<WriteResult> {
        let mut rollups: BTreeMap<Fingerprint, Rollup> = BTreeMap::new();
        for finding in findings.values() {
            let fingerprint = finding.rollup_fingerprint(controller);
            match rollups.get_mut(&fingerprint) {
                Some(rollup) => rollup.add(finding.clone()),
                None => {
                    rollups.insert(fingerprint, Rollup::new(finding.clone()));
                }
            }
        }
        let max = self.shared.max_results;
        let result = self
            .write(Subject::Controller(controller), None, |stored| {
                let counted = self.counted.lock().unwrap_or_else(PoisonError::into_inner);
                desired_controller_report(
                    stored,
                    controller,
                    &rollups,
                    &|fp, uid| counted.contains(fp, uid),
                    max,
                )
            })
            .await;
        if result.is_ok() {
            self.counted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(&rollups);
        }
        result
    }

    pub(super) fn wrote(&self, result: WriteResult) {
        if let Some(hook) = &self.on_write {
            hook(result);
        }
    }

    /// A write (or the read before it) failed with `e`.
    pub(super) fn write_failed(&self, e: &kube::Error) {
        self.wrote(WriteResult::Error);
        if let Some(hook) = &self.on_write_error {
            hook(e);
        }
    }

    /// Merges into a Report with `merge`, retrying lost races from a
    /// fresh read.
    ///
    /// For a pod's Report (`pod`), a stored Report about another pod of the
    /// same name is replaced only when `pod` is the live pod of that name
    /// (read through the API): otherwise `pod` was replaced, and its late
    /// write must not take the live pod's Report ([`Error::Superseded`]).
    pub(super) async fn write(
        &self,
        subject: Subject<'_>,
        pod: Option<&PodKey>,
        merge: impl Fn(Option<&Report>) -> Merged,
    ) -> Result<WriteResult> {
        let namespace = subject.namespace();
        let api: Api<Report> = Api::namespaced(self.client.clone(), namespace);
        let name = subject.report_name();
        let api_err = |source| Error::Api {
            namespace: namespace.to_string(),
            name: name.clone(),
            source,
        };
        // Whether `pod` is the live pod of its name, once asked.
        let mut live: Option<bool> = None;
        for attempt in 1..=self.max_write_attempts {
            let stored = match api.get_opt(&name).await {
                Ok(stored) => stored,
                Err(e) => {
                    self.write_failed(&e);
                    return Err(api_err(e));
                }
            };
            if let (Some(pod), Some(report)) = (pod, stored.as_ref()) {
                if let Some(current) = other_pod(report, pod) {
                    let is_live = match live {
                        Some(is_live) => is_live,
                        None => {
                            let uid = match self.owners.live_uid(namespace, &pod.name).await {
                                Ok(uid) => uid,
                                Err(e) => {
                                    self.write_failed(&e);
                                    return Err(api_err(e));
                                }
                            };
                            *live.insert(uid.as_deref() == Some(pod.uid.as_str()))
                        }
                    };
                    if !is_live {
                        return Err(Error::Superseded {
                            namespace: namespace.to_string(),
                            name,
                            uid: pod.uid.clone(),
                            current: current.to_string(),
                        });
                    }
                }
            }
            let merged = merge(stored.as_ref());
            if stored.as_ref() == Some(&merged.report) {
                self.wrote(WriteResult::Unchanged);
                return Ok(WriteResult::Unchanged);
            }
            let written = match &stored {
                None => api
                    .create(&PostParams::default(), &merged.report)
                    .await
                    .map(|_| WriteResult::Created),
                Some(_) => api
                    .replace(&name, &PostParams::default(), &merged.report)
                    .await
                    .map(|_| WriteResult::Updated),
            };
            match written {
                Ok(result) => {
                    if merged.dropped > 0 {
                        tracing::info!(%namespace, report = %name, dropped = merged.dropped, "Report at its result cap; dropped the oldest results");
                    }
                    self.wrote(result);
                    return Ok(result);
                }
                // 409: a replace with a stale resourceVersion, or a create
                // that lost to another creator. 404 on a replace: the
                // Report was deleted in between. Either way, start over
                // from what is there now.
                Err(kube::Error::Api(status))
                    if status.code == 409 || (status.code == 404 && stored.is_some()) =>
                {
                    tracing::debug!(%namespace, report = %name, attempt, "Report write lost a race; retrying from a fresh read");
                    self.wrote(WriteResult::Conflict);
                    tokio::time::sleep(backoff(&name, attempt)).await;
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
            name,
            attempts: self.max_write_attempts,
        })
    }
}

/// A short wait that grows with the attempt and differs between Reports,
/// so writers that collided do not collide again in lockstep.
pub(super) fn backoff(name: &str, attempt: u32) -> Duration {
    let spread = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        % 20;
    Duration::from_millis(10 * u64::from(attempt.min(10)) + spread)
}
