//! The chart's ValidatingAdmissionPolicy, as `policy check` applies it.
//!
//! The chart installs it by default (`admissionPolicy.enabled: true`), so
//! it is part of what the API server answers to `kubectl apply`. The
//! template is compiled into the binary and its Helm actions stripped:
//! whole-line actions (`{{- if ... }}`, `{{- include ... | nindent 4 }}`)
//! are dropped and inline ones (the release name) become
//! `kyverno-runtime`. The policy's CEL, its match rules and its messages
//! are read from the template as written, so a change to the chart changes
//! what `policy check` applies; `agent/tests/policy_check_kube.rs` installs
//! the template as `helm template` renders it and compares verdicts.

use kyverno_runtime_policy::admission::{Admission, AdmissionPolicy, SetupError};

/// The template, as committed.
const TEMPLATE: &str =
    include_str!("../../../charts/kyverno-runtime/templates/admission-policy.yaml");

/// The template without its Helm actions.
fn render(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    for line in template.lines() {
        let t = line.trim();
        if t.starts_with("{{") && t.ends_with("}}") {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            match rest[start..].find("}}") {
                Some(end) => {
                    out.push_str("kyverno-runtime");
                    rest = &rest[start + end + 2..];
                }
                None => {
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// The chart's admission policies, compiled for `crd`.
pub(crate) fn policies(crd: &Admission) -> Result<Vec<AdmissionPolicy>, SetupError> {
    let rendered = render(TEMPLATE);
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&rendered) {
        let value = serde::Deserialize::deserialize(doc).map_err(|e: serde_yaml::Error| {
            SetupError::Policy(format!("the chart's template: {e}"))
        })?;
        let json: serde_json::Value = serde_json::to_value::<serde_yaml::Value>(value)
            .map_err(|e| SetupError::Policy(format!("the chart's template: {e}")))?;
        if json.get("kind").and_then(|k| k.as_str()) == Some("ValidatingAdmissionPolicy") {
            out.push(AdmissionPolicy::new(&json, crd)?);
        }
    }
    if out.is_empty() {
        return Err(SetupError::Policy(
            "the chart's template holds no ValidatingAdmissionPolicy".into(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_renders_to_one_policy() {
        let crd = Admission::runtime_policy().unwrap_or_else(|e| panic!("{e}"));
        let policies = policies(&crd).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["kyverno-runtime-autogen-controllers"]);
    }

    #[test]
    fn null_annotations_are_absent_as_the_server_decodes_them() {
        // Found by policy_check_kube's mutants: the server accepts
        // `annotations: null` (ObjectMeta has no annotations then), so the
        // policy's `has(object.metadata.annotations)` is false.
        let crd = Admission::runtime_policy().unwrap_or_else(|e| panic!("{e}"));
        let admission = policies(&crd)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .fold(crd, Admission::with_policy);
        let review = |annotations: serde_json::Value| {
            admission.review(&serde_json::json!({
                "apiVersion": "runtime.nirmata.io/v1alpha1", "kind": "RuntimePolicy",
                "metadata": {"name": "p", "annotations": annotations},
                "spec": {"mode": "monitor"}}))
        };
        let null = review(serde_json::Value::Null);
        assert!(null.accepted(), "{:?}", null.errors);
        let bad = review(serde_json::json!({"pod-policies.kyverno.io/autogen-controllers": "Pod"}));
        assert!(!bad.accepted(), "an unknown kind is still refused");
    }
}
