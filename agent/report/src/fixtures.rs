//! A finding for tests (the `fixtures` feature): one enforced exec refusal
//! with every identity field set, so each test names only what it varies
//! (`Finding { count: 3, ..fixtures::finding() }`).

use crate::{Behavior, Decision, Finding, PodIdentity};
use std::time::{Duration, UNIX_EPOCH};

/// `no-curl` refused `/usr/bin/curl` once, at second 100, in container
/// `app` of `shop/web-0` (a StatefulSet's pod); no process, no matched
/// value. Its fingerprint is pinned by the report crate's tests.
pub fn finding() -> Finding {
    Finding {
        policy: "no-curl".into(),
        policy_uid: "11111111-2222-3333-4444-555555555555".into(),
        behavior: Behavior::Exec,
        pod: PodIdentity {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            container: Some("app".into()),
            owner_kind: Some("StatefulSet".into()),
            owner_name: Some("web".into()),
        },
        target: "/usr/bin/curl".into(),
        enforced: true,
        decision: Some(Decision::Denied),
        count: 1,
        first_observed: UNIX_EPOCH + Duration::from_secs(100),
        last_observed: UNIX_EPOCH + Duration::from_secs(100),
        process: None,
        matched: Vec::new(),
    }
}
