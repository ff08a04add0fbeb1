#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::finding::{Behavior, PodIdentity};
use std::time::{SystemTime, UNIX_EPOCH};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

type Drops = Arc<Mutex<Vec<(DropReason, u64)>>>;

fn shared(max_buffered: usize, max_results: usize) -> (Shared, Drops) {
    let drops = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&drops);
    let hook: DropHook = Arc::new(move |r, n| seen.lock().unwrap().push((r, n)));
    (
        Shared {
            buffer: Mutex::new(FindingBuffer::default()),
            announced: Mutex::new(HashMap::new()),
            track_announced: false,
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            max_buffered,
            max_results,
            on_drop: Some(hook),
            seen: SeenPods::new(KEEP_CHAINS_FOR, MAX_REMEMBERED),
        },
        drops,
    )
}

fn finding(pod: &str, target: &str, count: u64, first: u64, last: u64) -> Finding {
    Finding {
        policy: "p".into(),
        policy_uid: "u".into(),
        behavior: Behavior::Open,
        pod: PodIdentity {
            namespace: "ns".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            container: None,
            owner_kind: None,
            owner_name: None,
        },
        target: target.into(),
        enforced: false,
        decision: None,
        count,
        first_observed: at(first),
        last_observed: at(last),
        process: None,
        matched: Vec::new(),
    }
}

#[test]
fn submissions_are_deduplicated_by_fingerprint() {
    let (s, drops) = shared(10, 500);
    s.submit(finding("a", "/etc/x", 2, 10, 20));
    s.submit(finding("a", "/etc/x", 3, 5, 15));
    s.submit(finding("a", "/etc/y", 1, 1, 1));
    s.submit(finding("b", "/etc/x", 1, 1, 1));
    let taken = s.take();
    assert_eq!(taken.len(), 3);
    let x = &taken[&finding("a", "/etc/x", 0, 0, 0).fingerprint()];
    assert_eq!(x.count, 5);
    assert_eq!(x.first_observed, at(5));
    assert_eq!(x.last_observed, at(20));
    assert!(drops.lock().unwrap().is_empty());
    assert!(s.take().is_empty(), "take empties the buffer");
}

#[test]
fn submissions_are_redacted_and_windows_normalized() {
    let (s, _) = shared(10, 500);
    s.submit(finding("a", "/bin/mysql --password=hunter2", 1, 20, 10));
    let taken = s.take();
    let f = taken.values().next().unwrap();
    assert_eq!(f.target, "/bin/mysql --password=***");
    assert_eq!((f.first_observed, f.last_observed), (at(10), at(20)));
}

#[test]
fn a_full_buffer_drops_and_counts_new_findings_only() {
    let (s, drops) = shared(2, 500);
    s.submit(finding("a", "/1", 1, 1, 1));
    s.submit(finding("a", "/2", 1, 1, 1));
    s.submit(finding("a", "/3", 1, 1, 1));
    s.submit(finding("a", "/1", 1, 2, 2)); // known: still folds in
    assert_eq!(s.dropped.load(Ordering::Relaxed), 1);
    assert_eq!(*drops.lock().unwrap(), [(DropReason::BufferFull, 1)]);
    let taken = s.take();
    assert_eq!(taken.len(), 2);
    assert_eq!(taken[&finding("a", "/1", 0, 0, 0).fingerprint()].count, 2);
}

#[test]
fn unattributed_and_late_findings_are_counted() {
    let (s, drops) = shared(10, 500);
    let mut f = finding("a", "/1", 1, 1, 1);
    f.pod.namespace.clear();
    s.submit(f);
    s.closed.store(true, Ordering::Relaxed);
    s.submit(finding("a", "/1", 1, 1, 1));
    assert_eq!(
        *drops.lock().unwrap(),
        [(DropReason::Unattributed, 1), (DropReason::Shutdown, 1)]
    );
    assert!(s.take().is_empty());
}

#[test]
fn requeued_findings_merge_with_new_ones_within_the_caps() {
    let (s, drops) = shared(100, 2);
    s.submit(finding("a", "/new", 1, 50, 50));
    let mut group = BTreeMap::new();
    for (i, target) in ["/old1", "/old2", "/new"].iter().enumerate() {
        let f = finding("a", target, 1, 10 + i as u64, 10 + i as u64).redact();
        group.insert(f.fingerprint(), f);
    }
    s.requeue([group]);
    // Per pod, the two most recent of the three kept; the oldest counted.
    assert_eq!(*drops.lock().unwrap(), [(DropReason::BufferFull, 1)]);
    let taken = s.take();
    assert_eq!(taken.len(), 2);
    let new = &taken[&finding("a", "/new", 0, 0, 0).fingerprint()];
    assert_eq!(new.count, 2);
    assert_eq!((new.first_observed, new.last_observed), (at(12), at(50)));
    assert!(taken.contains_key(&finding("a", "/old2", 0, 0, 0).fingerprint()));
}

#[test]
fn the_requeue_cap_is_per_pod_in_a_controllers_group() {
    let (s, drops) = shared(100, 2);
    // A controller's group: two findings each of three pods.
    let mut group = BTreeMap::new();
    for pod in ["a", "b", "c"] {
        for target in ["/x", "/y"] {
            let f = finding(pod, target, 1, 10, 10).redact();
            group.insert(f.fingerprint(), f);
        }
    }
    s.requeue([group]);
    assert!(drops.lock().unwrap().is_empty());
    assert_eq!(s.take().len(), 6);
}

#[test]
fn a_dropped_pending_set_goes_back_to_the_buffer() {
    let (s, drops) = shared(100, 500);
    let f = finding("a", "/x", 4, 1, 1).redact();
    {
        let mut pending = Pending {
            shared: &s,
            groups: BTreeMap::new(),
        };
        pending
            .groups
            .entry(Dest::Pod(PodKey::of(&f)))
            .or_default()
            .insert(f.fingerprint(), f.clone());
    }
    let taken = s.take();
    assert_eq!(taken[&f.fingerprint()].count, 4);
    assert!(drops.lock().unwrap().is_empty());
}

#[test]
fn retryable_errors() {
    let conflict = Error::Conflicts {
        namespace: "n".into(),
        name: "r".into(),
        attempts: 5,
    };
    assert!(conflict.is_retryable());
    assert_eq!(conflict.metric_label(), "conflicts");
    let superseded = Error::Superseded {
        namespace: "n".into(),
        name: "r".into(),
        uid: "old".into(),
        current: "new".into(),
    };
    assert!(!superseded.is_retryable(), "a replaced pod stays replaced");
    assert_eq!(superseded.metric_label(), "superseded");
    let api = |code: u16| Error::Api {
        namespace: "n".into(),
        name: "r".into(),
        source: kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..kube::core::Status::default()
        })),
    };
    for code in [429, 500, 503, 401] {
        assert!(api(code).is_retryable(), "{code}");
    }
    for code in [400, 403, 404, 422] {
        assert!(!api(code).is_retryable(), "{code}");
    }
}

/// An API server that answers every request with a 503.
#[derive(Clone)]
struct Unavailable;

impl tower::Service<http::Request<kube::client::Body>> for Unavailable {
    type Response = http::Response<kube::client::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "ServiceUnavailable",
            "message": "unavailable", "code": 503,
        });
        let body = serde_json::to_vec(&status).unwrap();
        std::future::ready(Ok(http::Response::builder()
            .status(503)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body))
            .unwrap()))
    }
}

type Announced = Arc<Mutex<Vec<(String, String, u64, Fingerprint)>>>;

fn announcing() -> (ReporterOptions, Announced) {
    let seen: Announced = Arc::default();
    let sink = Arc::clone(&seen);
    let hook: FlushHook = Arc::new(move |f: &Finding, n| {
        sink.lock()
            .unwrap()
            .push((f.pod.name.clone(), f.target.clone(), n, f.fingerprint()));
    });
    let options = ReporterOptions {
        on_flush: Some(hook),
        ..ReporterOptions::default()
    };
    (options, seen)
}

fn take_sorted(seen: &Announced) -> Vec<(String, String, u64, Fingerprint)> {
    let mut v = std::mem::take(&mut *seen.lock().unwrap());
    v.sort();
    v
}

#[tokio::test]
async fn on_flush_sees_each_deduplicated_finding_whatever_the_write() {
    let (options, seen) = announcing();
    let reporter = Reporter::new(kube::Client::new(Unavailable, "default"), options);
    let handle = reporter.handle();
    let secret = "/bin/mysql --password=hunter2";
    handle.submit(finding("a", secret, 2, 10, 20));
    handle.submit(finding("a", secret, 3, 5, 30));
    handle.submit(finding("a", "/etc/x", 1, 1, 1));
    handle.submit(finding("b", "/etc/x", 1, 1, 1));

    let flushed = reporter.flush().await;
    assert_eq!(flushed.outcomes.len(), 2);
    for outcome in &flushed.outcomes {
        let error = outcome.result.as_ref().unwrap_err();
        assert!(error.is_retryable(), "{error}");
    }
    let fp = |pod: &str, target: &str| finding(pod, target, 0, 0, 0).fingerprint();
    assert_eq!(
        take_sorted(&seen),
        [
            (
                "a".into(),
                "/bin/mysql --password=***".into(),
                5,
                fp("a", secret)
            ),
            ("a".into(), "/etc/x".into(), 1, fp("a", "/etc/x")),
            ("b".into(), "/etc/x".into(), 1, fp("b", "/etc/x")),
        ],
        "once per deduplicated finding, with its merged count, the raw \
         finding's fingerprint, and nothing unredacted"
    );

    // The failed writes kept their findings. The next flush presents
    // them again, counting only what they gained in between.
    assert_eq!(handle.buffered(), 3);
    handle.submit(finding("a", secret, 4, 40, 40));
    handle.submit(finding("c", "/etc/y", 2, 1, 1));
    reporter.flush().await;
    assert_eq!(
        take_sorted(&seen),
        [
            (
                "a".into(),
                "/bin/mysql --password=***".into(),
                4,
                fp("a", secret)
            ),
            ("a".into(), "/etc/x".into(), 0, fp("a", "/etc/x")),
            ("b".into(), "/etc/x".into(), 0, fp("b", "/etc/x")),
            ("c".into(), "/etc/y".into(), 2, fp("c", "/etc/y")),
        ]
    );
    // What the Report will hold is still everything.
    let buffered = reporter.shared.take();
    assert_eq!(buffered[&fp("a", secret)].count, 9);
}

#[tokio::test]
async fn an_empty_flush_announces_nothing_and_no_hook_tracks_nothing() {
    let (options, seen) = announcing();
    let reporter = Reporter::new(kube::Client::new(Unavailable, "default"), options);
    assert!(reporter.flush().await.outcomes.is_empty());
    assert!(seen.lock().unwrap().is_empty());

    let quiet = Reporter::new(
        kube::Client::new(Unavailable, "default"),
        ReporterOptions::default(),
    );
    quiet.handle().submit(finding("a", "/etc/x", 1, 1, 1));
    quiet.flush().await;
    assert_eq!(quiet.handle().buffered(), 1);
    assert!(quiet.shared.lock_announced().is_empty());
}

#[test]
fn label_values() {
    assert_eq!(DropReason::BufferFull.as_str(), "buffer_full");
    assert_eq!(WriteResult::Unchanged.as_str(), "unchanged");
}
