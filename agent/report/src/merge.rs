//! Merging one flush's findings into the stored Report of a pod or of a
//! controller.
//!
//! Pure: given what the API server holds (or nothing) and the findings of
//! this flush, [`desired_pod_report`] and [`desired_controller_report`]
//! say what the Report should be. The writer then skips the write when
//! that equals what is stored, so a flush with nothing new is no write at
//! all. [`without_policies`] is the cleanup's counterpart: the Report with
//! the results of deleted policies removed.

use crate::finding::{Finding, Fingerprint};
use crate::name::{controller_report_name, report_name};
use crate::owners::Controller;
use crate::result::{
    controller_result, last_seen, object_reference, pod_result, property, stored_pods,
    stored_stats, typed_reference, OwnerMark, MAX_PODS_LISTED, SOURCE,
};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kyverno_runtime_api::openreports::{
    Limits, Report, ReportConfiguration, ReportFields, ReportResult, ReportSummary,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

/// The label every Report this crate writes carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "kyverno-runtime";
/// How many results have been dropped from a Report to keep it within
/// `max_results`, over its lifetime (absent while none has been).
pub const TRUNCATED_ANNOTATION: &str = "runtime.nirmata.io/truncated-results";
/// A Report carries one label `policy.runtime.nirmata.io/<policy uid>` per
/// policy it has results of (the value is the policy's name when that is
/// a valid label value, else empty), the way Kyverno labels its reports
/// with their policies: the cleanup after a policy is deleted finds the
/// Reports to edit with a label selector instead of reading every Report
/// in the cluster.
pub const POLICY_LABEL_PREFIX: &str = "policy.runtime.nirmata.io/";

/// The pod a Report is about: the part of a finding's identity that
/// addresses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub(crate) fn of(finding: &Finding) -> PodKey {
        PodKey {
            namespace: finding.pod.namespace.clone(),
            name: finding.pod.name.clone(),
            uid: finding.pod.uid.clone(),
        }
    }
}

/// What a Report is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subject<'a> {
    Pod(&'a PodKey),
    Controller(&'a Controller),
}

impl Subject<'_> {
    pub(crate) fn namespace(&self) -> &str {
        match self {
            Subject::Pod(p) => &p.namespace,
            Subject::Controller(c) => &c.namespace,
        }
    }

    /// The Report's name.
    pub(crate) fn report_name(&self) -> String {
        match self {
            Subject::Pod(p) => report_name(&p.name),
            Subject::Controller(c) => controller_report_name(c.kind, &c.name),
        }
    }

    fn uid(&self) -> &str {
        match self {
            Subject::Pod(p) => &p.uid,
            Subject::Controller(c) => &c.uid,
        }
    }

    fn api_version_and_kind(&self) -> (&'static str, &'static str) {
        match self {
            Subject::Pod(_) => ("v1", "Pod"),
            Subject::Controller(c) => (c.kind.api_version(), c.kind.as_str()),
        }
    }

    fn scope(&self) -> ObjectReference {
        match self {
            Subject::Pod(p) => object_reference(&p.namespace, &p.name, &p.uid),
            Subject::Controller(c) => typed_reference(
                c.kind.api_version(),
                c.kind.as_str(),
                &c.namespace,
                &c.name,
                &c.uid,
            ),
        }
    }

    /// The Report's owner reference to its subject, so the garbage
    /// collector deletes the Report with the pod or the controller.
    ///
    /// `controller: false`: the subject does not manage the Report (no
    /// controller reconciles it from the pod or the Deployment), and a
    /// controller reference is exclusive, so claiming it would be both
    /// untrue and in the way of a real one. `blockOwnerDeletion: false`:
    /// deleting a pod or a controller must never wait on its findings, and
    /// setting it to true needs permission to update the owner's
    /// finalizers, which the daemon is not granted.
    fn owner_reference(&self) -> OwnerReference {
        let (api_version, kind) = self.api_version_and_kind();
        let name = match self {
            Subject::Pod(p) => &p.name,
            Subject::Controller(c) => &c.name,
        };
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.clone(),
            uid: self.uid().to_string(),
            controller: Some(false),
            block_owner_deletion: Some(false),
        }
    }
}

/// What a merge produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Merged {
    /// The Report to write (or to leave alone, if it equals what is stored).
    pub report: Report,
    /// Results this merge dropped to stay within `max_results`.
    pub dropped: u64,
}

/// One result in the merged list, with what it is ordered by.
struct Row {
    last: SystemTime,
    fingerprint: Option<Fingerprint>,
    result: ReportResult,
}

/// The Report for `pod` after merging `findings` (already redacted, keyed by
/// fingerprint) into `stored`, without owner verification marks.
#[cfg(test)]
pub(crate) fn desired_report(
    stored: Option<&Report>,
    pod: &PodKey,
    findings: &BTreeMap<Fingerprint, Finding>,
    max_results: usize,
) -> Merged {
    desired_pod_report(stored, pod, findings, max_results, None)
}

/// The Report for `pod` after merging `findings` (already redacted, keyed by
/// fingerprint) into `stored`; `owner` is what the API said of the owner
/// the pod names, when it names one ([`property::OWNER_VERIFIED`]).
///
/// - A result is matched by the `fingerprint` property: counts add,
///   `firstTimestamp` is the earlier and `lastTimestamp` the later; the
///   rest of the result (message, enforced, decision) comes from the new
///   finding, the newest word on it.
/// - Stored results this flush has nothing for are kept verbatim, and so
///   are results without a fingerprint (not written by us): nothing is
///   lost because it was not understood.
/// - Results are ordered most recent first; beyond `max_results` the
///   oldest go, and [`TRUNCATED_ANNOTATION`] adds up how many.
/// - The summary and the [`POLICY_LABEL_PREFIX`] labels are recomputed
///   from the results.
/// - A stored Report whose scope is another uid ([`other_pod`]) was about
///   an earlier pod of the same name (a StatefulSet's pod recreated): its
///   results are not about this pod, so they are replaced rather than
///   merged, and its owner reference moves to this pod. Only the live pod
///   of the name may do that: the writer checks it through the API first,
///   so a late write for an earlier pod never replaces a newer one's
///   Report.
/// - Metadata this crate does not own (other labels, annotations, owner
///   references to anything but a Pod) is kept.
pub(crate) fn desired_pod_report(
    stored: Option<&Report>,
    pod: &PodKey,
    findings: &BTreeMap<Fingerprint, Finding>,
    max_results: usize,
    owner: Option<&OwnerMark>,
) -> Merged {
    let incoming = findings.iter().map(|(fp, finding)| {
        let build = move |stored: Option<&ReportResult>| {
            let mut merged = finding.clone();
            if let Some(s) = stored.and_then(stored_stats) {
                merged.count = merged.count.saturating_add(s.count);
                if let Some(first) = s.first {
                    merged.first_observed = merged.first_observed.min(first);
                }
                if let Some(last) = s.last {
                    merged.last_observed = merged.last_observed.max(last);
                }
            }
            pod_result(&merged, owner)
        };
        (*fp, build)
    });
    merge(stored, Subject::Pod(pod), incoming, max_results)
}

/// The uid of the pod a stored pod Report is about when that is not
/// `pod`: another pod of the same name, before or after it. Merging would
/// replace such a Report, so the writer must know first that `pod` is the
/// live one.
pub(crate) fn other_pod<'a>(stored: &'a Report, pod: &PodKey) -> Option<&'a str> {
    stored
        .spec
        .scope
        .as_ref()
        .and_then(|s| s.uid.as_deref())
        .filter(|uid| *uid != pod.uid)
}

/// One result of a controller's Report, gathered from this flush's
/// findings of its pods.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rollup {
    /// The newest of the findings (its details win), with `count` the sum
    /// of all of them and the window their union.
    pub finding: Finding,
    /// The pods they came from, by uid.
    pub pods: BTreeMap<String, SeenOn>,
}

/// One pod's part in a [`Rollup`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SeenOn {
    pub name: String,
    /// Its latest occurrence.
    pub last: SystemTime,
    /// Its occurrences in this flush: a pod whose findings add none (a
    /// count of 0) has not been seen again, and neither moves up the
    /// listed pods nor counts as a new one.
    pub count: u64,
}

impl Rollup {
    /// Starts a result from one pod's finding.
    pub(crate) fn new(finding: Finding) -> Rollup {
        let mut rollup = Rollup {
            finding: finding.clone(),
            pods: BTreeMap::new(),
        };
        rollup.note_pod(&finding);
        rollup
    }

    /// Folds another pod's (or the same pod's) finding in.
    pub(crate) fn add(&mut self, finding: Finding) {
        self.note_pod(&finding);
        self.finding.absorb(finding);
    }

    fn note_pod(&mut self, finding: &Finding) {
        let seen = self
            .pods
            .entry(finding.pod.uid.clone())
            .or_insert_with(|| SeenOn {
                name: finding.pod.name.clone(),
                last: finding.last_observed,
                count: 0,
            });
        seen.last = seen.last.max(finding.last_observed);
        seen.count = seen.count.saturating_add(finding.count);
    }

    /// The pods with occurrences in this flush.
    pub(crate) fn seen(&self) -> impl Iterator<Item = (&String, &SeenOn)> {
        self.pods.iter().filter(|(_, p)| p.count > 0)
    }
}

/// The Report for `controller` after merging this flush's `rollups` (keyed
/// by [`Finding::rollup_fingerprint`]) into `stored`, as
/// [`desired_pod_report`] merges a pod's, and in addition:
///
/// - `resources` lists the pods a result was seen on, this flush's first
///   (most recent first), then the stored ones, at most
///   [`MAX_PODS_LISTED`];
/// - [`property::POD_COUNT`] adds the pods that are new to the result: in
///   neither the stored list nor `counted` (the pods this writer counted
///   for it before, which the list may no longer show). A pod runs on one
///   node, so one writer's memory is enough to count each pod once across
///   every node's writes.
pub(crate) fn desired_controller_report(
    stored: Option<&Report>,
    controller: &Controller,
    rollups: &BTreeMap<Fingerprint, Rollup>,
    counted: &dyn Fn(&Fingerprint, &str) -> bool,
    max_results: usize,
) -> Merged {
    let incoming = rollups.iter().map(|(fp, rollup)| {
        let build = move |stored: Option<&ReportResult>| {
            let mut merged = rollup.finding.clone();
            let (listed, stored_count) = stored.map(stored_pods).unwrap_or_default();
            if let Some(s) = stored.and_then(stored_stats) {
                merged.count = merged.count.saturating_add(s.count);
                if let Some(first) = s.first {
                    merged.first_observed = merged.first_observed.min(first);
                }
                if let Some(last) = s.last {
                    merged.last_observed = merged.last_observed.max(last);
                }
            }
            let listed_uids: HashSet<&str> =
                listed.iter().filter_map(|r| r.uid.as_deref()).collect();
            let new = rollup
                .seen()
                .filter(|(uid, _)| !listed_uids.contains(uid.as_str()) && !counted(fp, uid))
                .count() as u64;
            let mut recent: Vec<(&String, &SeenOn)> = rollup.seen().collect();
            recent.sort_by(|a, b| {
                b.1.last
                    .cmp(&a.1.last)
                    .then_with(|| a.1.name.cmp(&b.1.name))
            });
            let moved: HashSet<&str> = recent.iter().map(|(uid, _)| uid.as_str()).collect();
            let mut pods: Vec<ObjectReference> = recent
                .into_iter()
                .map(|(uid, seen)| object_reference(&controller.namespace, &seen.name, uid))
                .collect();
            pods.extend(
                listed
                    .into_iter()
                    .filter(|r| r.uid.as_deref().is_none_or(|u| !moved.contains(u))),
            );
            pods.truncate(MAX_PODS_LISTED);
            controller_result(&merged, *fp, &pods, stored_count.saturating_add(new))
        };
        (*fp, build)
    });
    merge(
        stored,
        Subject::Controller(controller),
        incoming,
        max_results,
    )
}

/// The merge both kinds of Report share: `incoming` builds each new
/// result from the stored one of the same fingerprint, if any.
fn merge<F>(
    stored: Option<&Report>,
    subject: Subject<'_>,
    incoming: impl IntoIterator<Item = (Fingerprint, F)>,
    max_results: usize,
) -> Merged
where
    F: FnOnce(Option<&ReportResult>) -> ReportResult,
{
    let stale = stored
        .and_then(|r| r.spec.scope.as_ref())
        .and_then(|s| s.uid.as_deref())
        .is_some_and(|uid| uid != subject.uid());
    let stored_results: &[ReportResult] = match stored {
        Some(r) if !stale => r.spec.results.as_deref().unwrap_or_default(),
        _ => &[],
    };

    let mut rows: Vec<Row> = Vec::with_capacity(stored_results.len());
    let mut index: HashMap<Fingerprint, usize> = HashMap::new();
    for result in stored_results {
        let fingerprint = stored_stats(result).map(|s| s.fingerprint);
        if let Some(fp) = fingerprint {
            // A duplicate (which we never write) stays a row of its own.
            index.entry(fp).or_insert(rows.len());
        }
        rows.push(Row {
            last: last_seen(result),
            fingerprint,
            result: result.clone(),
        });
    }
    for (fp, build) in incoming {
        let slot = index.get(&fp).copied();
        let result = build(slot.and_then(|i| rows.get(i)).map(|row| &row.result));
        let row = Row {
            last: last_seen(&result),
            fingerprint: Some(fp),
            result,
        };
        match slot.and_then(|i| rows.get_mut(i)) {
            Some(existing) => *existing = row,
            None => rows.push(row),
        }
    }

    // Most recent first; a stable sort keeps the stored order of ties, and
    // the fingerprint orders new ties, so the same inputs give the same
    // bytes and an unchanged merge compares equal.
    rows.sort_by(|a, b| {
        b.last
            .cmp(&a.last)
            .then_with(|| a.fingerprint.is_none().cmp(&b.fingerprint.is_none()))
            .then_with(|| a.fingerprint.cmp(&b.fingerprint))
    });
    let max_results = max_results.max(1);
    let dropped = rows.len().saturating_sub(max_results);
    rows.truncate(max_results);
    let results: Vec<ReportResult> = rows.into_iter().map(|r| r.result).collect();

    let name = subject.report_name();
    let mut report = match stored {
        Some(r) => r.clone(),
        None => Report::new(&name, ReportFields::default()),
    };
    let meta = &mut report.metadata;
    meta.name = Some(name);
    meta.namespace = Some(subject.namespace().to_string());

    let prior_dropped: u64 = if stale {
        0
    } else {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(TRUNCATED_ANNOTATION))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let total_dropped = prior_dropped.saturating_add(dropped as u64);
    if total_dropped > 0 {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(TRUNCATED_ANNOTATION.into(), total_dropped.to_string());
    } else if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(TRUNCATED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }

    let (api_version, kind) = subject.api_version_and_kind();
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    refs.retain(|r| !(r.api_version == api_version && r.kind == kind));
    refs.push(subject.owner_reference());

    report.spec = ReportFields {
        source: Some(SOURCE.into()),
        scope: Some(subject.scope()),
        configuration: Some(ReportConfiguration {
            limits: Limits {
                max_results: Some(i64::try_from(max_results).unwrap_or(i64::MAX)),
                status_filter: None,
            },
        }),
        ..report.spec
    };
    set_results(&mut report, results);
    Merged {
        report,
        dropped: dropped as u64,
    }
}

/// Puts `results` in, with the summary and the labels they imply.
fn set_results(report: &mut Report, results: Vec<ReportResult>) {
    let mut summary = ReportSummary::default();
    for result in results.iter().filter_map(|r| r.result) {
        summary.count(result);
    }
    let labels = report.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.retain(|k, _| !k.starts_with(POLICY_LABEL_PREFIX));
    for result in &results {
        if let Some((key, value)) = result_policy_uid(result).and_then(|uid| {
            let key = policy_label(uid)?;
            let value = if is_label_value(&result.policy) {
                result.policy.clone()
            } else {
                String::new()
            };
            Some((key, value))
        }) {
            labels.insert(key, value);
        }
    }
    report.spec.summary = Some(summary);
    report.spec.results = Some(results);
}

/// The uid of the policy a result of ours is about (`None` for a result
/// without a fingerprint: not ours).
pub(crate) fn result_policy_uid(result: &ReportResult) -> Option<&str> {
    let properties = result.properties.as_ref()?;
    properties.get(property::FINGERPRINT)?;
    properties.get(property::POLICY_UID).map(String::as_str)
}

/// The label naming a policy on the Reports holding its results, `None`
/// when the uid cannot be a label name (no real uid is like that).
pub fn policy_label(uid: &str) -> Option<String> {
    let ok = !uid.is_empty()
        && uid.len() <= 63
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && uid.starts_with(|c: char| c.is_ascii_alphanumeric())
        && uid.ends_with(|c: char| c.is_ascii_alphanumeric());
    ok.then(|| format!("{POLICY_LABEL_PREFIX}{uid}"))
}

/// A valid label value: at most 63 of `[A-Za-z0-9-_.]`, alphanumeric at
/// both ends (or empty).
fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// `stored` without the results of ours whose policy uid is `gone`, or
/// `None` when it has none of them. The summary and the policy labels
/// follow; everything else is kept.
pub(crate) fn without_policies(stored: &Report, gone: &dyn Fn(&str) -> bool) -> Option<Report> {
    let results = stored.spec.results.as_deref().unwrap_or_default();
    let kept: Vec<ReportResult> = results
        .iter()
        .filter(|r| !result_policy_uid(r).is_some_and(gone))
        .cloned()
        .collect();
    if kept.len() == results.len() {
        return None;
    }
    let mut report = stored.clone();
    set_results(&mut report, kept);
    Some(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::finding::{Behavior, PodIdentity};
    use crate::result::property;
    use kyverno_runtime_api::openreports::PolicyResult;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn pod() -> PodKey {
        PodKey {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
        }
    }

    fn finding(target: &str, count: u64, first: u64, last: u64) -> Finding {
        let p = pod();
        Finding {
            policy: "no-curl".into(),
            policy_uid: "11111111-2222-3333-4444-555555555555".into(),
            behavior: Behavior::Exec,
            pod: PodIdentity {
                namespace: p.namespace,
                name: p.name,
                uid: p.uid,
                container: None,
                owner_kind: None,
                owner_name: None,
            },
            target: target.into(),
            enforced: true,
            decision: None,
            count,
            first_observed: at(first),
            last_observed: at(last),
            process: None,
            matched: Vec::new(),
        }
    }

    fn batch(findings: &[Finding]) -> BTreeMap<Fingerprint, Finding> {
        findings
            .iter()
            .map(|f| (f.fingerprint(), f.clone()))
            .collect()
    }

    fn prop<'a>(r: &'a ReportResult, key: &str) -> &'a str {
        r.properties.as_ref().unwrap()[key].as_str()
    }

    fn results(r: &Report) -> &[ReportResult] {
        r.spec.results.as_deref().unwrap()
    }

    #[test]
    fn a_fresh_report_for_a_pod() {
        let m = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 2, 10, 20)]), 500);
        let r = &m.report;
        assert_eq!(m.dropped, 0);
        assert_eq!(r.metadata.name.as_deref(), Some("kyverno-runtime-web-0"));
        assert_eq!(r.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            r.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGED_BY
        );
        assert!(r.metadata.annotations.is_none());
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "web-0", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        );
        assert_eq!(owner.controller, Some(false));
        assert_eq!(owner.block_owner_deletion, Some(false));
        let scope = r.spec.scope.as_ref().unwrap();
        assert_eq!(scope.kind.as_deref(), Some("Pod"));
        assert_eq!(scope.uid.as_deref(), Some(pod().uid.as_str()));
        assert_eq!(r.spec.source.as_deref(), Some("kyverno-runtime"));
        assert_eq!(r.spec.summary.unwrap().fail, 1);
        assert_eq!(prop(&results(r)[0], property::COUNT), "2");
    }

    #[test]
    fn merging_sums_counts_and_widens_the_window() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 2, 10, 20)]), 500);
        let m = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 3, 5, 15)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "5");
        assert_eq!(
            prop(&rs[0], property::FIRST_TIMESTAMP),
            "1970-01-01T00:00:05Z"
        );
        assert_eq!(
            prop(&rs[0], property::LAST_TIMESTAMP),
            "1970-01-01T00:00:20Z"
        );
        assert_eq!(rs[0].timestamp.unwrap().seconds, 20);

        let later = desired_report(
            Some(&m.report),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 30, 40)]),
            500,
        );
        let rs = results(&later.report);
        assert_eq!(prop(&rs[0], property::COUNT), "6");
        assert_eq!(
            prop(&rs[0], property::FIRST_TIMESTAMP),
            "1970-01-01T00:00:05Z"
        );
        assert_eq!(
            prop(&rs[0], property::LAST_TIMESTAMP),
            "1970-01-01T00:00:40Z"
        );
    }

    #[test]
    fn new_details_replace_old_ones() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 10, 10)]), 500);
        let mut newer = finding("/bin/sh", 1, 20, 20);
        newer.decision = Some(crate::finding::Decision::DefaultDenied);
        newer.pod.container = Some("sidecar".into());
        let m = desired_report(Some(&first.report), &pod(), &batch(&[newer]), 500);
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "2");
        assert_eq!(prop(&rs[0], property::DECISION), "default-denied");
        assert_eq!(prop(&rs[0], property::CONTAINER), "sidecar");
    }

    /// Issue 38, point 9: after a monitor -> enforce switch the refusals
    /// start a result of their own (their count, their first timestamp),
    /// and so does a policy recreated under the same name.
    #[test]
    fn a_mode_switch_and_a_recreated_policy_start_results_of_their_own() {
        let mut monitor = finding("/bin/sh", 3, 10, 20);
        monitor.enforced = false;
        let first = desired_report(None, &pod(), &batch(&[monitor]), 500);
        let enforced = finding("/bin/sh", 2, 30, 40);
        let m = desired_report(Some(&first.report), &pod(), &batch(&[enforced]), 500);
        let mut recreated = finding("/bin/sh", 1, 50, 50);
        recreated.policy_uid = "99999999-8888-7777-6666-555555555555".into();
        let m = desired_report(Some(&m.report), &pod(), &batch(&[recreated]), 500);
        let rs: Vec<(&str, &str, &str, &str)> = results(&m.report)
            .iter()
            .map(|r| {
                (
                    prop(r, property::POLICY_UID),
                    prop(r, property::ENFORCED),
                    prop(r, property::COUNT),
                    prop(r, property::FIRST_TIMESTAMP),
                )
            })
            .collect();
        assert_eq!(
            rs,
            [
                (
                    "99999999-8888-7777-6666-555555555555",
                    "true",
                    "1",
                    "1970-01-01T00:00:50Z"
                ),
                (
                    "11111111-2222-3333-4444-555555555555",
                    "true",
                    "2",
                    "1970-01-01T00:00:30Z"
                ),
                (
                    "11111111-2222-3333-4444-555555555555",
                    "false",
                    "3",
                    "1970-01-01T00:00:10Z"
                ),
            ]
        );
    }

    #[test]
    fn unrelated_and_foreign_results_are_kept() {
        let first = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 10, 10)]), 500);
        let mut stored = first.report.clone();
        let foreign = ReportResult {
            policy: "someone-else".into(),
            result: Some(PolicyResult::Pass),
            ..ReportResult::default()
        };
        stored.spec.results.as_mut().unwrap().push(foreign.clone());
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/bash", 1, 30, 30)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 3);
        assert_eq!(
            prop(&rs[0], property::TARGET),
            "/bin/bash",
            "most recent first"
        );
        assert_eq!(prop(&rs[1], property::TARGET), "/bin/sh");
        assert_eq!(rs[2], foreign);
        let s = m.report.spec.summary.unwrap();
        assert_eq!((s.fail, s.pass), (2, 1));
    }

    #[test]
    fn results_are_capped_keeping_the_most_recent() {
        let many: Vec<Finding> = (0..5)
            .map(|i| finding(&format!("/bin/t{i}"), 1, 100 + i, 100 + i))
            .collect();
        let m = desired_report(None, &pod(), &batch(&many), 3);
        assert_eq!(m.dropped, 2);
        let rs = results(&m.report);
        let targets: Vec<&str> = rs.iter().map(|r| prop(r, property::TARGET)).collect();
        assert_eq!(targets, ["/bin/t4", "/bin/t3", "/bin/t2"]);
        assert_eq!(
            m.report.metadata.annotations.as_ref().unwrap()[TRUNCATED_ANNOTATION],
            "2"
        );
        assert_eq!(m.report.spec.summary.unwrap().fail, 3);
        assert_eq!(
            m.report
                .spec
                .configuration
                .as_ref()
                .unwrap()
                .limits
                .max_results,
            Some(3)
        );

        // One newer and one older than everything kept: the older one is
        // the one dropped, and the annotation adds up.
        let more = [
            finding("/bin/new", 1, 200, 200),
            finding("/bin/old", 1, 1, 1),
        ];
        let m = desired_report(Some(&m.report), &pod(), &batch(&more), 3);
        let targets: Vec<&str> = results(&m.report)
            .iter()
            .map(|r| prop(r, property::TARGET))
            .collect();
        assert_eq!(targets, ["/bin/new", "/bin/t4", "/bin/t3"]);
        assert_eq!(m.dropped, 2);
        assert_eq!(
            m.report.metadata.annotations.as_ref().unwrap()[TRUNCATED_ANNOTATION],
            "4"
        );
    }

    #[test]
    fn nothing_new_merges_to_what_is_stored() {
        let first = desired_report(
            None,
            &pod(),
            &batch(&[finding("/bin/sh", 2, 10, 20), finding("/bin/ls", 1, 5, 5)]),
            500,
        );
        let again = desired_report(Some(&first.report), &pod(), &BTreeMap::new(), 500);
        assert_eq!(again.report, first.report);
        // A zero-count observation of a known finding changes nothing either.
        let zero = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 0, 10, 20)]),
            500,
        );
        assert_eq!(zero.report, first.report);
        // One more occurrence does.
        let one = desired_report(
            Some(&first.report),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 10, 20)]),
            500,
        );
        assert_ne!(one.report, first.report);
    }

    #[test]
    fn foreign_metadata_is_kept() {
        let mut stored =
            desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 1, 1)]), 500).report;
        stored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "shop".into());
        stored.metadata.annotations = Some(BTreeMap::from([("note".into(), "x".into())]));
        stored.metadata.resource_version = Some("42".into());
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 2, 2)]),
            500,
        );
        let meta = &m.report.metadata;
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "shop");
        assert_eq!(meta.annotations.as_ref().unwrap()["note"], "x");
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert_eq!(meta.owner_references.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_report_about_an_earlier_pod_of_the_same_name_is_replaced() {
        let mut stored =
            desired_report(None, &pod(), &batch(&[finding("/bin/sh", 9, 1, 1)]), 1).report;
        let mut old = pod();
        old.uid = "00000000-0000-0000-0000-000000000000".into();
        stored.spec.scope = Some(object_reference(&old.namespace, &old.name, &old.uid));
        stored.metadata.owner_references = Some(vec![Subject::Pod(&old).owner_reference()]);
        stored.metadata.annotations =
            Some(BTreeMap::from([(TRUNCATED_ANNOTATION.into(), "7".into())]));
        let m = desired_report(
            Some(&stored),
            &pod(),
            &batch(&[finding("/bin/sh", 1, 2, 2)]),
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "1");
        let refs = m.report.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, pod().uid);
        assert!(m.report.metadata.annotations.is_none());
    }

    /// Issue 38, point 8: the writer is told when a stored Report is about
    /// another pod of the name (before or after its own), which it may
    /// replace only as the live pod.
    #[test]
    fn a_report_about_another_pod_of_the_name_is_told_apart() {
        let ours = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 1, 1)]), 500);
        assert_eq!(other_pod(&ours.report, &pod()), None);
        let mut newer = pod();
        newer.uid = "ffffffff-0000-0000-0000-000000000000".into();
        assert_eq!(
            other_pod(&ours.report, &newer),
            Some(pod().uid.as_str()),
            "the stored Report is the other pod's"
        );
    }

    fn web() -> Controller {
        Controller {
            kind: crate::autogen::ControllerKind::Deployment,
            namespace: "shop".into(),
            name: "web".into(),
            uid: "dddddddd-0000-0000-0000-000000000000".into(),
        }
    }

    /// A finding of replica `i` of `web`.
    fn replica(i: u32, target: &str, count: u64, first: u64, last: u64) -> Finding {
        let mut f = finding(target, count, first, last);
        f.pod.name = format!("web-5d9-{i}");
        f.pod.uid = format!("00000000-0000-0000-0000-{i:012}");
        f.pod.owner_kind = Some("ReplicaSet".into());
        f.pod.owner_name = Some("web-5d9".into());
        f
    }

    fn rollups(findings: &[Finding]) -> BTreeMap<Fingerprint, Rollup> {
        let mut out: BTreeMap<Fingerprint, Rollup> = BTreeMap::new();
        for f in findings {
            let fp = f.rollup_fingerprint(&web());
            match out.get_mut(&fp) {
                Some(r) => r.add(f.clone()),
                None => {
                    out.insert(fp, Rollup::new(f.clone()));
                }
            }
        }
        out
    }

    fn nothing_counted(_: &Fingerprint, _: &str) -> bool {
        false
    }

    fn listed(r: &ReportResult) -> Vec<&str> {
        r.resources
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn a_controller_report_sums_its_pods() {
        let findings: Vec<Finding> = (0..3)
            .map(|i| {
                replica(
                    i,
                    "/bin/sh",
                    u64::from(i) + 1,
                    10 + u64::from(i),
                    20 + u64::from(i),
                )
            })
            .collect();
        let m = desired_controller_report(None, &web(), &rollups(&findings), &nothing_counted, 500);
        let r = &m.report;
        assert_eq!(
            r.metadata.name.as_deref(),
            Some("kyverno-runtime-deployment.web")
        );
        assert_eq!(r.metadata.namespace.as_deref(), Some("shop"));
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("apps/v1", "Deployment", "web", web().uid.as_str())
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(false), Some(false))
        );
        let scope = r.spec.scope.as_ref().unwrap();
        assert_eq!(
            (
                scope.api_version.as_deref(),
                scope.kind.as_deref(),
                scope.name.as_deref()
            ),
            (Some("apps/v1"), Some("Deployment"), Some("web"))
        );
        let rs = results(r);
        assert_eq!(rs.len(), 1, "one result for all the replicas");
        let result = &rs[0];
        assert_eq!(prop(result, property::COUNT), "6");
        assert_eq!(prop(result, property::POD_COUNT), "3");
        assert_eq!(
            prop(result, property::FIRST_TIMESTAMP),
            "1970-01-01T00:00:10Z"
        );
        assert_eq!(
            prop(result, property::LAST_TIMESTAMP),
            "1970-01-01T00:00:22Z"
        );
        assert_eq!(
            prop(result, property::FINGERPRINT),
            findings[0].rollup_fingerprint(&web()).to_string()
        );
        assert!(!result
            .properties
            .as_ref()
            .unwrap()
            .contains_key(property::OWNER_KIND));
        assert_eq!(
            listed(result),
            ["web-5d9-2", "web-5d9-1", "web-5d9-0"],
            "most recent first"
        );
        assert_eq!(r.spec.summary.unwrap().fail, 1);
        let label = policy_label("11111111-2222-3333-4444-555555555555").unwrap();
        assert_eq!(r.metadata.labels.as_ref().unwrap()[&label], "no-curl");
    }

    #[test]
    fn a_second_writer_adds_its_pods_and_counts_each_pod_once() {
        let node_a: Vec<Finding> = (0..8)
            .map(|i| replica(i, "/bin/sh", 1, 10, 10 + u64::from(i)))
            .collect();
        let first =
            desired_controller_report(None, &web(), &rollups(&node_a), &nothing_counted, 500);
        let node_b: Vec<Finding> = (8..20)
            .map(|i| replica(i, "/bin/sh", 2, 30, 30 + u64::from(i)))
            .collect();
        let second = desired_controller_report(
            Some(&first.report),
            &web(),
            &rollups(&node_b),
            &nothing_counted,
            500,
        );
        let result = &results(&second.report)[0];
        assert_eq!(prop(result, property::COUNT), (8 + 12 * 2).to_string());
        assert_eq!(prop(result, property::POD_COUNT), "20");
        let names = listed(result);
        assert_eq!(names.len(), MAX_PODS_LISTED);
        assert_eq!(names[0], "web-5d9-19");

        // Node A again, for a pod that is no longer listed: it counted that
        // pod already, so the pod count stays; a pod it never counted and
        // that is not listed is new.
        let fp = node_a[0].rollup_fingerprint(&web());
        let counted_by_a =
            |f: &Fingerprint, uid: &str| *f == fp && node_a.iter().any(|x| x.pod.uid == uid);
        let again = desired_controller_report(
            Some(&second.report),
            &web(),
            &rollups(&[
                replica(3, "/bin/sh", 5, 50, 50),
                replica(40, "/bin/sh", 1, 50, 50),
            ]),
            &counted_by_a,
            500,
        );
        let result = &results(&again.report)[0];
        assert_eq!(prop(result, property::POD_COUNT), "21");
        assert_eq!(prop(result, property::COUNT), (8 + 24 + 6).to_string());
        assert_eq!(&listed(result)[..2], ["web-5d9-3", "web-5d9-40"]);

        // A pod that is still listed is not new, whoever writes.
        let listed_again = desired_controller_report(
            Some(&again.report),
            &web(),
            &rollups(&[replica(40, "/bin/sh", 1, 60, 60)]),
            &nothing_counted,
            500,
        );
        assert_eq!(
            prop(&results(&listed_again.report)[0], property::POD_COUNT),
            "21"
        );
    }

    #[test]
    fn nothing_new_merges_to_the_stored_controller_report() {
        let findings: Vec<Finding> = (0..3).map(|i| replica(i, "/bin/sh", 1, 10, 10)).collect();
        let first =
            desired_controller_report(None, &web(), &rollups(&findings), &nothing_counted, 500);
        let again = desired_controller_report(
            Some(&first.report),
            &web(),
            &BTreeMap::new(),
            &nothing_counted,
            500,
        );
        assert_eq!(again.report, first.report);
        let zero = desired_controller_report(
            Some(&first.report),
            &web(),
            &rollups(&[replica(1, "/bin/sh", 0, 10, 10)]),
            &nothing_counted,
            500,
        );
        assert_eq!(zero.report, first.report);
    }

    #[test]
    fn a_recreated_controller_of_the_same_name_starts_over() {
        let first = desired_controller_report(
            None,
            &web(),
            &rollups(&[replica(1, "/bin/sh", 9, 10, 10)]),
            &nothing_counted,
            500,
        );
        let mut new_web = web();
        new_web.uid = "eeeeeeee-0000-0000-0000-000000000000".into();
        let f = replica(1, "/bin/sh", 1, 20, 20);
        let m = desired_controller_report(
            Some(&first.report),
            &new_web,
            &BTreeMap::from([(f.rollup_fingerprint(&new_web), Rollup::new(f.clone()))]),
            &nothing_counted,
            500,
        );
        let rs = results(&m.report);
        assert_eq!(rs.len(), 1);
        assert_eq!(prop(&rs[0], property::COUNT), "1");
        let refs = m.report.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, new_web.uid);
    }

    #[test]
    fn a_deleted_policys_results_and_label_go() {
        let mut other = finding("/bin/ls", 1, 30, 30);
        other.policy = "keep-me".into();
        other.policy_uid = "22222222-0000-0000-0000-000000000000".into();
        let m = desired_report(
            None,
            &pod(),
            &batch(&[finding("/bin/sh", 1, 10, 10), other]),
            500,
        );
        let mut stored = m.report.clone();
        let foreign = ReportResult {
            policy: "someone-else".into(),
            result: Some(PolicyResult::Pass),
            ..ReportResult::default()
        };
        stored.spec.results.as_mut().unwrap().push(foreign.clone());
        let gone_label = policy_label("11111111-2222-3333-4444-555555555555").unwrap();
        let kept_label = policy_label("22222222-0000-0000-0000-000000000000").unwrap();
        assert!(stored
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(&gone_label));

        let gone = |uid: &str| uid == "11111111-2222-3333-4444-555555555555";
        let pruned = without_policies(&stored, &gone).unwrap();
        let rs = results(&pruned);
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].policy, "keep-me");
        assert_eq!(rs[1], foreign, "results not ours are kept");
        let labels = pruned.metadata.labels.as_ref().unwrap();
        assert!(!labels.contains_key(&gone_label));
        assert_eq!(labels[&kept_label], "keep-me");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
        let s = pruned.spec.summary.unwrap();
        assert_eq!((s.fail, s.pass), (1, 1));
        assert_eq!(
            without_policies(&pruned, &gone),
            None,
            "nothing left to remove"
        );
    }

    #[test]
    fn policy_labels_need_label_shaped_uids_and_names() {
        assert_eq!(
            policy_label("11111111-2222-3333-4444-555555555555").as_deref(),
            Some("policy.runtime.nirmata.io/11111111-2222-3333-4444-555555555555")
        );
        for bad in ["", "-a", "a b", "***", &"a".repeat(64)] {
            assert_eq!(policy_label(bad), None, "{bad:?}");
        }
        let mut long = finding("/bin/sh", 1, 1, 1);
        long.policy = "p".repeat(100);
        let m = desired_report(None, &pod(), &batch(&[long]), 500);
        let label = policy_label("11111111-2222-3333-4444-555555555555").unwrap();
        assert_eq!(
            m.report.metadata.labels.as_ref().unwrap()[&label],
            "",
            "too long for a value"
        );
    }

    #[test]
    fn the_owner_mark_is_on_every_result_of_the_pod() {
        let m = desired_pod_report(
            None,
            &pod(),
            &batch(&[finding("/bin/sh", 1, 1, 1), finding("/bin/ls", 1, 1, 1)]),
            500,
            Some(&OwnerMark::Unverified),
        );
        for r in results(&m.report) {
            assert_eq!(prop(r, property::OWNER_VERIFIED), "false");
        }
        let m = desired_report(None, &pod(), &batch(&[finding("/bin/sh", 1, 1, 1)]), 500);
        assert!(!results(&m.report)[0]
            .properties
            .as_ref()
            .unwrap()
            .contains_key(property::OWNER_VERIFIED));
    }
}
