//! Field paths in the API server's notation (`spec.behaviors[2].network.deny.values[0]`).

use std::fmt;

/// A field path in the API server's notation, built from a root by
/// [`field`](Self::field) and [`index`](Self::index) steps, so an error
/// from these parsers names a field the same way `kubectl apply` does.
///
/// ```
/// use kyverno_runtime_policy::values::{BehaviorKind, FieldPath, RuleSide};
///
/// let p = FieldPath::spec().field("behaviors").index(2).field("network").field("deny").field("values").index(0);
/// assert_eq!(p.as_str(), "spec.behaviors[2].network.deny.values[0]");
/// assert_eq!(p, FieldPath::values(2, BehaviorKind::Network, RuleSide::Deny).index(0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// A path of one segment, such as `spec` or `status`.
    pub fn root(name: &str) -> Self {
        FieldPath(name.to_string())
    }

    /// The root every RuntimePolicy value lives under: `spec`.
    pub fn spec() -> Self {
        Self::root("spec")
    }

    /// The literal values of one allow or deny list:
    /// `spec.behaviors[<behavior>].<kind>.<side>.values`.
    pub fn values(behavior: usize, kind: BehaviorKind, side: RuleSide) -> Self {
        Self::spec()
            .field("behaviors")
            .index(behavior)
            .field(kind.as_str())
            .field(side.as_str())
            .field("values")
    }

    /// This path followed by `.<name>`.
    pub fn field(&self, name: &str) -> Self {
        FieldPath(format!("{}.{name}", self.0))
    }

    /// This path followed by `[<i>]`.
    pub fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{i}]", self.0))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The behavior kinds of a RuntimePolicy, by their field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BehaviorKind {
    /// `network`: egress destinations.
    Network,
    /// `exec`: programs executed.
    Exec,
    /// `open`: files opened.
    Open,
    /// `protocol`: application protocols of egress flows.
    Protocol,
    /// `dns`: question names (observation only).
    Dns,
}

impl BehaviorKind {
    /// Every kind, in the CRD's field order.
    pub const ALL: [BehaviorKind; 5] = [
        BehaviorKind::Network,
        BehaviorKind::Exec,
        BehaviorKind::Open,
        BehaviorKind::Protocol,
        BehaviorKind::Dns,
    ];

    /// The field name in a behavior entry.
    pub fn as_str(self) -> &'static str {
        match self {
            BehaviorKind::Network => "network",
            BehaviorKind::Exec => "exec",
            BehaviorKind::Open => "open",
            BehaviorKind::Protocol => "protocol",
            BehaviorKind::Dns => "dns",
        }
    }
}

impl fmt::Display for BehaviorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which list of a behavior a value is in: where `"*"` may stand depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleSide {
    /// `allow`: `"*"` is refused.
    Allow,
    /// `deny`: `"*"` alone makes the behavior default-deny.
    Deny,
}

impl RuleSide {
    /// The field name in a behavior.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleSide::Allow => "allow",
            RuleSide::Deny => "deny",
        }
    }
}

impl fmt::Display for RuleSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
