//! A Report with every field, nested ones included, set: shared by the
//! round trips of `openreports_compat.rs` and the API server's of
//! `openreports_kube.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kyverno_runtime_api::openreports::{
    Limits, PolicyResult, ReportConfiguration, ReportFields, ReportResult, ReportSummary, Severity,
    Timestamp,
};

fn object_reference(kind: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        field_path: Some("spec.containers{web}".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        namespace: Some("shop".into()),
        resource_version: Some("4711".into()),
        uid: Some("0b7e5b1c-6a0e-4b8a-9d1e-3c1f3a2f5e10".into()),
    }
}

fn label_selector() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "In".into(),
            values: Some(vec!["web".into(), "api".into()]),
        }]),
        match_labels: Some(BTreeMap::from([("app".into(), "shop".into())])),
    }
}

/// Report fields with every field, nested ones included, set.
pub fn every_field() -> ReportFields {
    ReportFields {
        source: Some("kyverno-runtime".into()),
        scope: Some(object_reference("Pod", "web-0")),
        scope_selector: Some(label_selector()),
        configuration: Some(ReportConfiguration {
            limits: Limits {
                max_results: Some(100),
                status_filter: Some(vec![PolicyResult::Fail, PolicyResult::Warn]),
            },
        }),
        summary: Some(ReportSummary {
            pass: 1,
            fail: 2,
            warn: 3,
            error: 4,
            skip: 5,
        }),
        results: Some(vec![ReportResult {
            source: Some("kyverno-runtime".into()),
            policy: "deny-shell".into(),
            rule: Some("exec".into()),
            category: Some("Runtime Security".into()),
            severity: Some(Severity::High),
            timestamp: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 123_456_789,
            }),
            result: Some(PolicyResult::Fail),
            scored: Some(true),
            resources: Some(vec![object_reference("Pod", "web-0")]),
            resource_selector: Some(label_selector()),
            message: Some("/bin/sh was executed".into()),
            properties: Some(BTreeMap::from([("process".into(), "/bin/sh".into())])),
        }]),
    }
}
