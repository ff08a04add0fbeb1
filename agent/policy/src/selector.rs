//! Label selectors: a RuntimePolicy's `podSelector` and `namespaceSelector`
//! compiled once into a [`Selector`], and the two ANDed into the
//! [`PodTarget`] that answers "does this policy apply to this pod".
//!
//! The semantics are Kubernetes' (`metav1.LabelSelectorAsSelector`), with
//! one deliberate difference the RuntimePolicy API documents: an *absent*
//! selector selects everything, like `{}` (Kubernetes reads a nil selector
//! as "nothing"). Requirements are ANDed; `matchLabels` `k: v` is `k In (v)`.
//!
//! | operator       | values            | matches a label set that        |
//! |----------------|-------------------|---------------------------------|
//! | `In`           | one or more       | has the key with one of them    |
//! | `NotIn`        | one or more       | lacks the key, or has another   |
//! | `Exists`       | none              | has the key                     |
//! | `DoesNotExist` | none              | lacks the key                   |
//!
//! A malformed selector is refused at compile time with a [`SelectorError`]
//! naming the field, so it becomes a policy condition rather than a
//! selector that silently matches something else. Keys and values are
//! checked as the API server checks pod labels (qualified names and label
//! values): labels that could exist can only be those, and a `NotIn` or
//! `DoesNotExist` on a key no label can carry would otherwise select every
//! pod without anyone noticing the typo.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::values::FieldPath;

/// Longest label name (the part of a key after any `prefix/`), and longest
/// label value, in characters.
pub const MAX_LABEL_NAME_LEN: usize = 63;

/// Longest key prefix (a DNS subdomain).
pub const MAX_LABEL_PREFIX_LEN: usize = 253;

/// A selector refused at compile time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct SelectorError {
    /// The offending field, such as
    /// `spec.podSelector.matchExpressions[1].operator`.
    pub path: String,
    /// What is wrong with it.
    pub reason: SelectorReason,
}

impl SelectorError {
    fn new(path: &FieldPath, reason: SelectorReason) -> Self {
        Self {
            path: path.as_str().to_string(),
            reason,
        }
    }
}

/// Why a selector was refused: one variant per rule, so a status writer or
/// test can tell them apart without reading messages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorReason {
    /// An operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`
    /// (operators are case-sensitive; `Gt`/`Lt` exist only for node
    /// selectors).
    #[error("{0:?} is not a valid label selector operator: use In, NotIn, Exists or DoesNotExist")]
    UnknownOperator(String),
    /// `In` or `NotIn` without values.
    #[error("operator {0} requires at least one value")]
    ValuesRequired(&'static str),
    /// `Exists` or `DoesNotExist` with values.
    #[error("operator {0} takes no values")]
    ValuesForbidden(&'static str),
    /// A key that no label can carry.
    #[error("{key:?} is not a valid label key: {why}")]
    InvalidKey {
        /// The key as written.
        key: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// A value that no label can carry.
    #[error("{value:?} is not a valid label value: {why}")]
    InvalidValue {
        /// The value as written.
        value: String,
        /// Which rule it breaks.
        why: &'static str,
    },
}

/// One compiled requirement's operator and values.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

/// The label the API server sets on every namespace to its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// One compiled requirement: a key and what its label must be.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match (&self.op, value) {
            (Op::In(values), Some(v)) => values.contains(v),
            (Op::In(_), None) => false,
            (Op::NotIn(values), Some(v)) => !values.contains(v),
            (Op::NotIn(_), None) => true,
            (Op::Exists, v) => v.is_some(),
            (Op::DoesNotExist, v) => v.is_none(),
        }
    }
}

/// A compiled label selector: every requirement must hold. No
/// requirements selects every label set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that selects every label set (absent, or `{}`).
    pub fn everything() -> Self {
        Self::default()
    }

    /// Compiles a selector; `path` is the selector's field
    /// (`spec.podSelector`). `None` selects everything, as `{}` does.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    /// use kyverno_runtime_policy::selector::Selector;
    /// use kyverno_runtime_policy::values::FieldPath;
    ///
    /// let app = LabelSelector {
    ///     match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
    ///     ..Default::default()
    /// };
    /// let s = Selector::compile(Some(&app), &FieldPath::spec().field("podSelector")).unwrap();
    /// assert!(s.matches(&BTreeMap::from([("app".into(), "web".into())])));
    /// assert!(!s.matches(&BTreeMap::new()));
    /// ```
    pub fn compile(
        selector: Option<&LabelSelector>,
        path: &FieldPath,
    ) -> Result<Self, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Self::everything());
        };
        let mut requirements = Vec::new();
        if let Some(labels) = &selector.match_labels {
            // The API server names the map, not the entry, for a bad entry.
            let at = path.field("matchLabels");
            for (key, value) in labels {
                check_key(key, &at)?;
                check_value(value, &at)?;
                requirements.push(Requirement {
                    key: key.clone(),
                    op: Op::In(BTreeSet::from([value.clone()])),
                });
            }
        }
        if let Some(expressions) = &selector.match_expressions {
            let at = path.field("matchExpressions");
            for (i, expression) in expressions.iter().enumerate() {
                requirements.push(compile_requirement(expression, &at.index(i))?);
            }
        }
        Ok(Self { requirements })
    }

    /// Whether a label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector selects every label set.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

fn compile_requirement(
    expression: &LabelSelectorRequirement,
    path: &FieldPath,
) -> Result<Requirement, SelectorError> {
    check_key(&expression.key, &path.field("key"))?;
    let values = expression.values.as_deref().unwrap_or_default();
    let values_path = path.field("values");
    let with_values = |name: &'static str| -> Result<BTreeSet<String>, SelectorError> {
        if values.is_empty() {
            return Err(SelectorError::new(
                &values_path,
                SelectorReason::ValuesRequired(name),
            ));
        }
        for (i, value) in values.iter().enumerate() {
            check_value(value, &values_path.index(i))?;
        }
        Ok(values.iter().cloned().collect())
    };
    let without_values = |name: &'static str, op: Op| -> Result<Op, SelectorError> {
        if values.is_empty() {
            Ok(op)
        } else {
            Err(SelectorError::new(
                &values_path,
                SelectorReason::ValuesForbidden(name),
            ))
        }
    };
    let op = match expression.operator.as_str() {
        "In" => Op::In(with_values("In")?),
        "NotIn" => Op::NotIn(with_values("NotIn")?),
        "Exists" => without_values("Exists", Op::Exists)?,
        "DoesNotExist" => without_values("DoesNotExist", Op::DoesNotExist)?,
        other => {
            return Err(SelectorError::new(
                &path.field("operator"),
                SelectorReason::UnknownOperator(other.to_string()),
            ))
        }
    };
    Ok(Requirement {
        key: expression.key.clone(),
        op,
    })
}

/// A label name or value body: alphanumerics at both ends, `-`, `_`, `.`
/// inside (the API server's `qualifiedName`/label value pattern).
fn name_shape(s: &str) -> Result<(), &'static str> {
    let bytes = s.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err("must not be empty");
    };
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("must begin and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("may hold only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated labels of lowercase alphanumerics
/// and `-`, each starting and ending alphanumeric.
fn dns_subdomain(s: &str) -> Result<(), &'static str> {
    if s.len() > MAX_LABEL_PREFIX_LEN {
        return Err("its prefix must be at most 253 characters");
    }
    for label in s.split('.') {
        let bytes = label.as_bytes();
        let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
            return Err("its prefix must be a DNS subdomain (an empty label)");
        };
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !alnum(first) || !alnum(last) || !bytes.iter().all(|b| alnum(b) || *b == b'-') {
            return Err(
                "its prefix must be a DNS subdomain: lowercase letters, digits, '-' and '.'",
            );
        }
    }
    Ok(())
}

fn check_key(key: &str, path: &FieldPath) -> Result<(), SelectorError> {
    let invalid = |why| {
        SelectorError::new(
            path,
            SelectorReason::InvalidKey {
                key: key.to_string(),
                why,
            },
        )
    };
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Err(invalid("its prefix must not be empty"));
            }
            dns_subdomain(prefix).map_err(invalid)?;
            name
        }
        None => key,
    };
    if name.len() > MAX_LABEL_NAME_LEN {
        return Err(invalid("its name must be at most 63 characters"));
    }
    name_shape(name).map_err(invalid)
}

fn check_value(value: &str, path: &FieldPath) -> Result<(), SelectorError> {
    // The empty value is a valid label value (`app: ""`).
    if value.is_empty() {
        return Ok(());
    }
    let invalid = |why| {
        SelectorError::new(
            path,
            SelectorReason::InvalidValue {
                value: value.to_string(),
                why,
            },
        )
    };
    if value.len() > MAX_LABEL_NAME_LEN {
        return Err(invalid("must be at most 63 characters"));
    }
    name_shape(value).map_err(invalid)
}

/// Which pods a policy applies to: its pod selector ANDed with its
/// namespace selector.
///
/// A half that is missing ([`PodTarget::nothing`]) matches nothing, so a
/// policy whose selectors failed to compile never widens its scope: it
/// applies to no pod until it is fixed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    pod: Option<Selector>,
    namespace: Option<Selector>,
}

impl PodTarget {
    /// Compiles both selectors of a policy. `spec` is the field holding
    /// them (normally [`FieldPath::spec`]); errors name
    /// `<spec>.podSelector...` or `<spec>.namespaceSelector...`. Absent
    /// and `{}` select everything.
    pub fn compile(
        pod: Option<&LabelSelector>,
        namespace: Option<&LabelSelector>,
        spec: &FieldPath,
    ) -> Result<Self, SelectorError> {
        Ok(Self {
            pod: Some(Selector::compile(pod, &spec.field("podSelector"))?),
            namespace: Some(Selector::compile(
                namespace,
                &spec.field("namespaceSelector"),
            )?),
        })
    }

    /// The target of a policy whose selectors could not be built: it
    /// matches no pod.
    pub fn nothing() -> Self {
        Self {
            pod: None,
            namespace: None,
        }
    }

    /// The target selecting every pod in every namespace.
    pub fn everything() -> Self {
        Self {
            pod: Some(Selector::everything()),
            namespace: Some(Selector::everything()),
        }
    }

    /// This target without the pods of the namespaces `names`, by the
    /// label the API server puts on every namespace
    /// ([`NAMESPACE_NAME_LABEL`]; callers must give a pod's namespace
    /// labels with it).
    pub fn excluding_namespaces(mut self, names: &BTreeSet<String>) -> Self {
        if let (Some(ns), false) = (&mut self.namespace, names.is_empty()) {
            ns.requirements.push(Requirement {
                key: NAMESPACE_NAME_LABEL.to_owned(),
                op: Op::NotIn(names.clone()),
            });
        }
        self
    }

    /// Whether the namespace half selects a namespace with
    /// `namespace_labels` (some of its pods may then be selected).
    pub fn namespace_selects(&self, namespace_labels: &BTreeMap<String, String>) -> bool {
        self.namespace
            .as_ref()
            .is_some_and(|s| s.matches(namespace_labels))
    }

    /// Whether a pod with `pod_labels`, in a namespace with
    /// `namespace_labels`, is selected: both halves must match.
    pub fn matches(
        &self,
        namespace_labels: &BTreeMap<String, String>,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        let half = |s: &Option<Selector>, labels| s.as_ref().is_some_and(|s| s.matches(labels));
        half(&self.namespace, namespace_labels) && half(&self.pod, pod_labels)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, name: &str, v: &BTreeSet<String>| {
            let v: Vec<&str> = v.iter().map(String::as_str).collect();
            write!(f, " {name} ({})", v.join(","))
        };
        match self {
            Op::In(v) => list(f, "in", v),
            Op::NotIn(v) => list(f, "notin", v),
            Op::Exists => Ok(()),
            Op::DoesNotExist => Ok(()),
        }
    }
}

/// Kubernetes' selector string form (`app in (web),!legacy`), for logs.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.op == Op::DoesNotExist {
                f.write_str("!")?;
            }
            write!(f, "{}{}", r.key, r.op)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_target_excluding_namespaces_leaves_their_pods_by_the_name_label() {
        let web = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        let ns = |name: &str| BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())]);
        let protected: BTreeSet<String> = ["kube-system".to_owned()].into();
        let t = PodTarget::everything().excluding_namespaces(&protected);
        assert!(!t.matches(&ns("kube-system"), &web));
        assert!(t.matches(&ns("shop"), &web));
        // Nothing excluded: the same target.
        assert_eq!(
            PodTarget::everything().excluding_namespaces(&BTreeSet::new()),
            PodTarget::everything()
        );
        // A target matching nothing still matches nothing.
        assert!(!PodTarget::nothing()
            .excluding_namespaces(&protected)
            .matches(&ns("shop"), &web));
    }
    use rstest::rstest;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn one(e: LabelSelectorRequirement) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![e]),
            match_labels: None,
        }
    }

    fn path() -> FieldPath {
        FieldPath::spec().field("podSelector")
    }

    fn compile(s: &LabelSelector) -> Result<Selector, SelectorError> {
        Selector::compile(Some(s), &path())
    }

    #[rstest]
    #[case::in_match(expr("app", "In", Some(&["web", "api"])), &[("app", "api")], true)]
    #[case::in_other_value(expr("app", "In", Some(&["web"])), &[("app", "db")], false)]
    #[case::in_absent(expr("app", "In", Some(&["web"])), &[], false)]
    #[case::in_empty_value(expr("app", "In", Some(&[""])), &[("app", "")], true)]
    #[case::notin_other_value(expr("app", "NotIn", Some(&["web"])), &[("app", "db")], true)]
    #[case::notin_listed(expr("app", "NotIn", Some(&["web", "db"])), &[("app", "db")], false)]
    #[case::notin_absent(expr("app", "NotIn", Some(&["web"])), &[("tier", "x")], true)]
    #[case::exists_present(expr("app", "Exists", None), &[("app", "")], true)]
    #[case::exists_absent(expr("app", "Exists", None), &[("tier", "a")], false)]
    #[case::exists_empty_values(expr("app", "Exists", Some(&[])), &[("app", "x")], true)]
    #[case::dne_absent(expr("app", "DoesNotExist", None), &[("tier", "a")], true)]
    #[case::dne_present(expr("app", "DoesNotExist", None), &[("app", "x")], false)]
    #[case::prefixed_key(expr("app.kubernetes.io/name", "In", Some(&["web"])), &[("app.kubernetes.io/name", "web")], true)]
    fn each_operator(
        #[case] e: LabelSelectorRequirement,
        #[case] pod: &[(&str, &str)],
        #[case] want: bool,
    ) {
        assert_eq!(compile(&one(e)).unwrap().matches(&labels(pod)), want);
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let s = LabelSelector {
            match_labels: Some(labels(&[("app", "web"), ("tier", "front")])),
            match_expressions: Some(vec![expr("legacy", "DoesNotExist", None)]),
        };
        let s = compile(&s).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("legacy", "")
        ])));
        assert_eq!(s.to_string(), "app in (web),tier in (front),!legacy");
    }

    #[rstest]
    #[case::absent(None)]
    #[case::empty(Some(LabelSelector::default()))]
    #[case::empty_lists(Some(LabelSelector { match_labels: Some(BTreeMap::new()), match_expressions: Some(vec![]) }))]
    fn absent_and_empty_select_everything(#[case] s: Option<LabelSelector>) {
        let s = Selector::compile(s.as_ref(), &path()).unwrap();
        assert!(s.is_everything());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("any", "thing")])));
    }

    #[rstest]
    #[case::unknown_operator(expr("app", "Equals", None), "spec.podSelector.matchExpressions[0].operator", SelectorReason::UnknownOperator("Equals".into()))]
    #[case::operator_is_case_sensitive(expr("app", "in", Some(&["a"])), "spec.podSelector.matchExpressions[0].operator", SelectorReason::UnknownOperator("in".into()))]
    #[case::gt_is_for_nodes(expr("app", "Gt", Some(&["1"])), "spec.podSelector.matchExpressions[0].operator", SelectorReason::UnknownOperator("Gt".into()))]
    #[case::in_without_values(
        expr("app", "In", None),
        "spec.podSelector.matchExpressions[0].values",
        SelectorReason::ValuesRequired("In")
    )]
    #[case::in_empty_values(expr("app", "In", Some(&[])), "spec.podSelector.matchExpressions[0].values", SelectorReason::ValuesRequired("In"))]
    #[case::notin_empty_values(expr("app", "NotIn", Some(&[])), "spec.podSelector.matchExpressions[0].values", SelectorReason::ValuesRequired("NotIn"))]
    #[case::exists_with_values(expr("app", "Exists", Some(&["a"])), "spec.podSelector.matchExpressions[0].values", SelectorReason::ValuesForbidden("Exists"))]
    #[case::dne_with_values(expr("app", "DoesNotExist", Some(&["a"])), "spec.podSelector.matchExpressions[0].values", SelectorReason::ValuesForbidden("DoesNotExist"))]
    fn refuses_with_the_field_path(
        #[case] e: LabelSelectorRequirement,
        #[case] want_path: &str,
        #[case] want: SelectorReason,
    ) {
        let err = compile(&one(e)).unwrap_err();
        assert_eq!(err.path, want_path);
        assert_eq!(err.reason, want);
        assert!(err.to_string().starts_with(want_path), "{err}");
    }

    #[rstest]
    #[case::empty_key("")]
    #[case::space("my app")]
    #[case::leading_dash("-app")]
    #[case::trailing_dot("app.")]
    #[case::empty_prefix("/app")]
    #[case::empty_name("example.com/")]
    #[case::upper_prefix("Example.com/app")]
    #[case::two_slashes("a/b/c")]
    #[case::long_name(&"a".repeat(64))]
    fn refuses_keys_no_label_can_carry(#[case] key: &str) {
        let err = compile(&one(expr(key, "DoesNotExist", None))).unwrap_err();
        assert_eq!(err.path, "spec.podSelector.matchExpressions[0].key");
        assert!(
            matches!(err.reason, SelectorReason::InvalidKey { .. }),
            "{err}"
        );
    }

    #[rstest]
    #[case::plain("app")]
    #[case::dotted_name("app.name_x-1")]
    #[case::prefixed("kubernetes.io/metadata.name")]
    #[case::digits("1")]
    #[case::longest_name(&"a".repeat(63))]
    fn accepts_valid_keys(#[case] key: &str) {
        assert!(compile(&one(expr(key, "Exists", None))).is_ok());
    }

    #[test]
    fn refuses_values_no_label_can_carry_naming_the_element() {
        let err = compile(&one(expr("app", "In", Some(&["web", "no spaces"])))).unwrap_err();
        assert_eq!(err.path, "spec.podSelector.matchExpressions[0].values[1]");
        assert!(matches!(err.reason, SelectorReason::InvalidValue { .. }));

        let s = LabelSelector {
            match_labels: Some(labels(&[("app", &"v".repeat(64))])),
            match_expressions: None,
        };
        let err = compile(&s).unwrap_err();
        assert_eq!(err.path, "spec.podSelector.matchLabels");
    }

    #[test]
    fn the_later_expression_is_named() {
        let s = LabelSelector {
            match_expressions: Some(vec![expr("a", "Exists", None), expr("b", "NotIn", None)]),
            match_labels: None,
        };
        assert_eq!(
            compile(&s).unwrap_err().path,
            "spec.podSelector.matchExpressions[1].values"
        );
    }

    #[test]
    fn pod_target_ands_both_halves() {
        let pod = one(expr("app", "In", Some(&["web"])));
        let ns = LabelSelector {
            match_labels: Some(labels(&[("team", "a")])),
            match_expressions: None,
        };
        let t = PodTarget::compile(Some(&pod), Some(&ns), &FieldPath::spec()).unwrap();
        let web = labels(&[("app", "web")]);
        let team_a = labels(&[("team", "a")]);
        assert!(t.matches(&team_a, &web));
        assert!(!t.matches(&labels(&[("team", "b")]), &web));
        assert!(!t.matches(&team_a, &labels(&[("app", "db")])));
        // The namespace's labels are never read as the pod's.
        assert!(!t.matches(&web, &team_a));
    }

    #[test]
    fn pod_target_absent_halves_select_everything() {
        let t = PodTarget::compile(None, None, &FieldPath::spec()).unwrap();
        assert_eq!(t, PodTarget::everything());
        assert!(t.matches(&labels(&[]), &labels(&[])));
        let ns_only = PodTarget::compile(
            None,
            Some(&one(expr("team", "Exists", None))),
            &FieldPath::spec(),
        )
        .unwrap();
        assert!(ns_only.matches(&labels(&[("team", "x")]), &labels(&[])));
        assert!(!ns_only.matches(&labels(&[]), &labels(&[("team", "x")])));
    }

    #[test]
    fn pod_target_names_the_half_that_failed() {
        let bad = one(expr("app", "Exists", Some(&["x"])));
        let err = PodTarget::compile(None, Some(&bad), &FieldPath::spec()).unwrap_err();
        assert_eq!(
            err.path,
            "spec.namespaceSelector.matchExpressions[0].values"
        );
        let err = PodTarget::compile(Some(&bad), None, &FieldPath::spec()).unwrap_err();
        assert_eq!(err.path, "spec.podSelector.matchExpressions[0].values");
    }

    #[test]
    fn nothing_matches_nothing() {
        let t = PodTarget::nothing();
        assert!(!t.matches(&labels(&[]), &labels(&[])));
        assert!(!t.matches(&labels(&[("a", "b")]), &labels(&[("a", "b")])));
    }
}
