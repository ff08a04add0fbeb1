//! The reporter's buffer of distinct findings between flushes, shared
//! fairly across pods (issue 37, finding 5).
//!
//! It holds at most `max` distinct findings (by fingerprint); a finding
//! already held folds into its entry. While there is room, any pod may
//! take it. When it is full, a new finding of a pod that holds fewer
//! entries than the pod holding most takes the place of that pod's least
//! recently observed entry; a new finding of the pod holding most (or as
//! many as any) is dropped. So one pod flooding distinct findings can fill
//! an idle buffer, but never keeps out another pod's: each pod keeps at
//! least an equal share. Either way one finding is dropped, and counted.

use crate::finding::Fingerprint;
use crate::merge::PodKey;
use crate::Finding;
use std::collections::HashMap;

/// Distinct findings between flushes, and how many each pod holds.
#[derive(Debug, Default)]
pub(crate) struct FindingBuffer {
    findings: HashMap<Fingerprint, Finding>,
    per_pod: HashMap<PodKey, usize>,
}

impl FindingBuffer {
    /// Folds `finding` in; `true` if a finding (this one, or another pod's
    /// evicted for it) was dropped because the buffer held `max`.
    pub(crate) fn insert(
        &mut self,
        max: usize,
        fingerprint: Fingerprint,
        finding: Finding,
    ) -> bool {
        if let Some(existing) = self.findings.get_mut(&fingerprint) {
            existing.absorb(finding);
            return false;
        }
        let pod = PodKey::of(&finding);
        if self.findings.len() < max {
            self.add(pod, fingerprint, finding);
            return false;
        }
        let mine = self.per_pod.get(&pod).copied().unwrap_or(0);
        let hog = self
            .per_pod
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(p, n)| (p.clone(), *n));
        match hog {
            Some((hog, most)) if mine < most => {
                if let Some(victim) = self.oldest_of(&hog) {
                    self.remove(&victim);
                    self.add(pod, fingerprint, finding);
                }
                true
            }
            _ => true,
        }
    }

    /// How many distinct findings it holds.
    pub(crate) fn len(&self) -> usize {
        self.findings.len()
    }

    /// Everything held, leaving it empty.
    pub(crate) fn take(&mut self) -> HashMap<Fingerprint, Finding> {
        self.per_pod.clear();
        std::mem::take(&mut self.findings)
    }

    fn add(&mut self, pod: PodKey, fingerprint: Fingerprint, finding: Finding) {
        self.findings.insert(fingerprint, finding);
        *self.per_pod.entry(pod).or_default() += 1;
    }

    fn remove(&mut self, fingerprint: &Fingerprint) {
        if let Some(f) = self.findings.remove(fingerprint) {
            let pod = PodKey::of(&f);
            if let Some(n) = self.per_pod.get_mut(&pod) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_pod.remove(&pod);
                }
            }
        }
    }

    /// The fingerprint of `pod`'s least recently observed entry.
    fn oldest_of(&self, pod: &PodKey) -> Option<Fingerprint> {
        self.findings
            .iter()
            .filter(|(_, f)| {
                f.pod.uid == pod.uid && f.pod.namespace == pod.namespace && f.pod.name == pod.name
            })
            .min_by_key(|(_, f)| f.last_observed)
            .map(|(fp, _)| *fp)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn finding(pod: &str, target: &str, at: u64) -> (Fingerprint, Finding) {
        let mut f = crate::fixtures::finding();
        f.pod.name = pod.into();
        f.pod.uid = format!("uid-{pod}");
        f.target = target.into();
        f.last_observed = UNIX_EPOCH + Duration::from_secs(at);
        (f.fingerprint(), f)
    }

    fn held(b: &mut FindingBuffer) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = b
            .take()
            .into_values()
            .map(|f| (f.pod.name, f.target))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_flooding_pod_never_keeps_another_pods_findings_out() {
        let mut b = FindingBuffer::default();
        // The noisy pod fills an idle buffer.
        for i in 0..4 {
            let (fp, f) = finding("noisy", &format!("/{i}"), i);
            assert!(!b.insert(4, fp, f));
        }
        // A quiet pod's finding takes the noisy pod's oldest place.
        let (fp, f) = finding("quiet", "/q", 10);
        assert!(
            b.insert(4, fp, f),
            "one finding dropped: the noisy pod's oldest"
        );
        // The noisy pod, still the largest, is the one that loses.
        let (fp, f) = finding("noisy", "/new", 11);
        assert!(b.insert(4, fp, f));
        // Another quiet pod gets in too: down to two each.
        let (fp, f) = finding("quiet2", "/q2", 12);
        assert!(b.insert(4, fp, f));
        let (fp, f) = finding("quiet", "/q-again", 13);
        assert!(
            b.insert(4, fp, f),
            "quiet has 1, noisy 2: noisy's oldest goes"
        );
        assert_eq!(
            held(&mut b),
            [
                ("noisy".to_string(), "/3".to_string()),
                ("quiet".to_string(), "/q".to_string()),
                ("quiet".to_string(), "/q-again".to_string()),
                ("quiet2".to_string(), "/q2".to_string()),
            ]
        );
    }

    #[test]
    fn a_known_finding_folds_in_even_when_full_and_take_starts_over() {
        let mut b = FindingBuffer::default();
        let (fp, f) = finding("a", "/1", 1);
        assert!(!b.insert(1, fp, f.clone()));
        assert!(!b.insert(1, fp, f), "known: folds in");
        let (fp2, f2) = finding("a", "/2", 2);
        assert!(b.insert(1, fp2, f2), "the only pod is the largest: dropped");
        assert_eq!(b.take()[&fp].count, 2);
        let (fp2, f2) = finding("b", "/2", 2);
        assert!(!b.insert(1, fp2, f2), "emptied by take");
    }
}
