//! The redaction chokepoint, end to end: no string field of a [`Finding`]
//! escapes [`sanitize`] on any way out (its redaction, its `Debug`, its
//! Report result, the Report a flush writes), and no secret of the
//! redaction table (`sanitize/cases.rs`) in an exec's argv does either.
//!
//! Adding a string field to `Finding` or `PodIdentity` breaks the
//! exhaustive destructurings below at compile time: give the new field a
//! secret in [`secret_finding`] and a check in [`every_field_is_scrubbed`].
//! Widen these tests deliberately; never loosen them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::autogen::ControllerKind;
use crate::merge::{desired_controller_report, desired_pod_report, desired_report, PodKey, Rollup};
use crate::owners::Controller;
use crate::result::OwnerMark;
use crate::{property, report_result, Behavior, Decision, Finding, PodIdentity, Process};
use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

/// A secret that every masking rule must catch in its own context.
const SECRET: &str = "hunter2SECRET";

/// One secret-bearing value per string field, each in a different disguise,
/// so that the field names in the output tell which one leaked.
fn secret_finding() -> Finding {
    // Exhaustive literal: a new field does not compile until it gets a
    // secret here.
    Finding {
        policy: format!("policy --password={SECRET}"),
        policy_uid: format!("uid token={SECRET}"),
        behavior: Behavior::Exec,
        pod: PodIdentity {
            namespace: format!("ns Authorization: Bearer {SECRET}"),
            name: format!("name https://user:{SECRET}@host"),
            uid: format!("uid --token {SECRET}"),
            container: Some(format!("container api_key={SECRET}")),
            owner_kind: Some(format!("kind secret: {SECRET}")),
            owner_name: Some(format!("owner \"password\": \"{SECRET}\"")),
        },
        target: format!("/usr/bin/mysql -u root --password {SECRET}\n--auth=x"),
        enforced: true,
        decision: Some(Decision::Denied),
        count: 1,
        first_observed: UNIX_EPOCH + Duration::from_secs(1),
        last_observed: UNIX_EPOCH + Duration::from_secs(2),
        process: Some(Process {
            pid: 7,
            comm: format!("x --password={SECRET}"),
            argv: vec![
                "curl".into(),
                format!("-H Authorization: Bearer {SECRET}"),
                format!("--token={SECRET}"),
            ],
        }),
        matched: vec![format!("api.svc token={SECRET}")],
    }
}

#[track_caller]
fn scrubbed(field: &str, value: &str) {
    assert!(!value.contains(SECRET), "{field} leaked: {value:?}");
    assert!(!value.contains("hunter2"), "{field} leaked: {value:?}");
    assert!(!value.contains('\n'), "{field} kept a newline: {value:?}");
    assert!(
        value.contains(crate::MASK),
        "{field} was not masked: {value:?}"
    );
}

#[test]
fn every_field_is_scrubbed() {
    let Finding {
        policy,
        policy_uid,
        behavior: _,
        pod:
            PodIdentity {
                namespace,
                name,
                uid,
                container,
                owner_kind,
                owner_name,
            },
        target,
        enforced: _,
        decision: _,
        count: _,
        first_observed: _,
        last_observed: _,
        process,
        matched,
    } = secret_finding().redact();
    let Process { pid: _, comm, argv } = process.unwrap();
    scrubbed("process.comm", &comm);
    scrubbed("process.argv[1]", &argv[1]);
    scrubbed("process.argv[2]", &argv[2]);
    scrubbed("policy", &policy);
    scrubbed("policy_uid", &policy_uid);
    scrubbed("pod.namespace", &namespace);
    scrubbed("pod.name", &name);
    scrubbed("pod.uid", &uid);
    scrubbed("pod.container", &container.unwrap());
    scrubbed("pod.owner_kind", &owner_kind.unwrap());
    scrubbed("pod.owner_name", &owner_name.unwrap());
    scrubbed("target", &target);
    scrubbed("matched[0]", &matched[0]);
}

#[test]
fn debug_prints_the_redaction() {
    let f = secret_finding();
    let debug = format!("{f:?} {:?}", f.pod);
    assert!(!debug.contains(SECRET), "{debug}");
    let redacted = format!("{:?}", f.clone().redact());
    assert!(!redacted.contains(SECRET), "{redacted}");
}

#[test]
fn the_report_result_carries_no_secret_and_only_closed_keys() {
    for behavior in Behavior::ALL {
        let mut f = secret_finding();
        f.behavior = behavior;
        let result = report_result(&f);
        let json = serde_json::to_string(&result).unwrap();
        assert!(!json.contains(SECRET), "{behavior}: {json}");
        for (key, value) in result.properties.as_ref().unwrap() {
            assert!(property::ALL.contains(&key.as_str()), "{key}");
            assert!(!value.contains(SECRET), "{key}");
            assert!(value.chars().count() <= crate::MAX_CHARS, "{key}");
        }
        let message = result.message.unwrap();
        assert!(!message.contains(SECRET));
        assert!(message.chars().count() <= crate::MAX_CHARS);
    }
}

#[test]
fn the_written_report_carries_no_secret() {
    let f = secret_finding();
    let redacted = f.clone().redact();
    let pod = PodKey::of(&redacted);
    let findings = BTreeMap::from([(redacted.fingerprint(), redacted)]);
    let merged = desired_report(None, &pod, &findings, 500);
    let json = serde_json::to_string(&merged.report).unwrap();
    assert!(!json.contains(SECRET), "{json}");
}

#[test]
fn a_controller_report_carries_no_secret_and_only_closed_keys() {
    // The controller's identity comes from the API, not from the finding;
    // every string of the finding reaches the result through its
    // redaction, and the pods listed come from redacted findings.
    let controller = Controller {
        kind: ControllerKind::Deployment,
        namespace: "shop".into(),
        name: "web".into(),
        uid: "dddddddd-0000-0000-0000-000000000000".into(),
    };
    for behavior in Behavior::ALL {
        let mut f = secret_finding();
        f.behavior = behavior;
        let redacted = f.redact();
        let rollups = BTreeMap::from([(
            redacted.rollup_fingerprint(&controller),
            Rollup::new(redacted),
        )]);
        let merged = desired_controller_report(None, &controller, &rollups, &|_, _| false, 500);
        let json = serde_json::to_string(&merged.report).unwrap();
        assert!(!json.contains(SECRET), "{behavior}: {json}");
        for result in merged.report.spec.results.as_ref().unwrap() {
            for (key, value) in result.properties.as_ref().unwrap() {
                assert!(property::ALL.contains(&key.as_str()), "{key}");
                assert!(value.chars().count() <= crate::MAX_CHARS, "{key}");
            }
            assert_eq!(result.resources.as_ref().unwrap().len(), 1);
        }
    }
}

#[test]
fn a_marked_pod_result_keeps_to_the_closed_keys() {
    let verified = OwnerMark::Verified(crate::owners::NamedOwner {
        kind: "Deployment".into(),
        name: "web".into(),
    });
    for mark in [Some(&verified), Some(&OwnerMark::Unverified), None] {
        let redacted = secret_finding().redact();
        let pod = PodKey::of(&redacted);
        let findings = BTreeMap::from([(redacted.fingerprint(), redacted)]);
        let merged = desired_pod_report(None, &pod, &findings, 500, mark);
        let json = serde_json::to_string(&merged.report).unwrap();
        assert!(!json.contains(SECRET), "{json}");
        let result = &merged.report.spec.results.as_ref().unwrap()[0];
        for key in result.properties.as_ref().unwrap().keys() {
            assert!(property::ALL.contains(&key.as_str()), "{key}");
        }
    }
}

#[test]
fn a_raw_finding_given_to_report_result_is_scrubbed_too() {
    // `report_result` redacts itself: a caller cannot bypass the chokepoint
    // by handing it an unredacted finding.
    let json = serde_json::to_string(&report_result(&secret_finding())).unwrap();
    assert!(!json.contains(SECRET));
}

/// A finding per row of the redaction table, its argv the row's.
fn table_findings() -> Vec<(Finding, &'static crate::redaction_cases::Case)> {
    crate::redaction_cases::CASES
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let mut f = secret_finding();
            f.policy = "watch-exec".into();
            f.policy_uid = "11111111-2222-3333-4444-555555555555".into();
            f.pod = PodIdentity {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
                container: Some("app".into()),
                owner_kind: None,
                owner_name: None,
            };
            f.target = format!("/usr/bin/tool-{i:03}");
            f.process = Some(Process {
                pid: 7,
                comm: "tool".into(),
                argv: case.argv(),
            });
            (f, case)
        })
        .collect()
}

/// Every row of the redaction table through each way a finding is
/// written out in this crate: its redaction, its `Debug`, its Report
/// result (the argv property is the row's redaction, joined), and the
/// Report a flush writes for all of them.
#[test]
fn no_secret_of_the_redaction_table_reaches_a_report() {
    let rows = table_findings();
    let mut findings = BTreeMap::new();
    for (f, case) in &rows {
        let redacted = f.clone().redact();
        let debug = format!("{f:?}");
        let result = serde_json::to_string(&report_result(f)).unwrap();
        for secret in case.secrets {
            for (path, text) in [("Debug", &debug), ("result", &result)] {
                assert!(!text.contains(secret), "{}: {secret} in {path}", case.rule);
            }
        }
        let props = report_result(f).properties.unwrap();
        assert_eq!(
            props[property::ARGV],
            crate::sanitize(&case.redacted.join(" ")),
            "{}",
            case.rule
        );
        findings.insert(redacted.fingerprint(), redacted);
    }
    let pod = PodKey::of(&rows[0].0.clone().redact());
    let merged = desired_report(None, &pod, &findings, 500);
    let json = serde_json::to_string(&merged.report).unwrap();
    assert_eq!(
        merged.report.spec.results.as_ref().unwrap().len(),
        rows.len()
    );
    for secret in crate::redaction_cases::all_secrets() {
        assert!(!json.contains(secret), "{secret} in the Report");
    }
}
