//! The specification's decision rule, spelled once.
//!
//! For one operation (an open, an exec, a connection, a flow's protocol)
//! and the policies that select a pod: an explicit deny of any of them
//! refuses it; else an explicit allow of any of them lets it through; else
//! a default deny (`deny: ["*"]`) of any of them refuses it; else it is
//! allowed. The order of policies, of behaviors and of values does not
//! matter. A policy may spell one kind in several behaviors: they are one
//! list ([`BehaviorLists::merge`]), and an explicit deny beside a default
//! deny is kept, since another behavior's or another policy's allow can
//! lift the default deny for that value and the explicit deny must still
//! win.
//!
//! The kernel programs implement the same order over the slots the
//! managers program from [`BehaviorLists`]; the monitor's matchers and
//! `policy check` call [`decide`] and [`BehaviorLists::merge`] rather than
//! carrying their own copy. `dns` is observation only and keeps its own
//! meaning of `"*"` (`deny: ["*"]` alone reports every name).

use crate::compile::EvaluationResult;
use crate::values::{BehaviorKind, FieldPath, STAR};

/// One behavior kind's evaluated lists in one policy (literal values
/// unioned with the expressions' results, every behavior of the kind
/// merged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BehaviorLists {
    /// The first behavior's field, such as `spec.behaviors[2].open`;
    /// rejections name `<field>.allow` or `<field>.deny`. (Not an element
    /// path: an evaluated value may come from an expression, which has no
    /// index.)
    pub field: FieldPath,
    /// The allow values.
    pub allow: Vec<String>,
    /// The deny values as the managers read them: `"*"` (first, when any
    /// behavior of the kind is default deny) makes the kind default deny,
    /// and every other value is an explicit deny, kept beside it.
    pub deny: Vec<String>,
}

impl BehaviorLists {
    /// The lists of every behavior of `kind` in an evaluation, merged:
    /// allows and explicit denies unioned in spec order, duplicates
    /// removed, `"*"` first in deny when any behavior is default deny.
    /// `None` when the policy has no behavior of that kind.
    pub fn merge(result: &EvaluationResult, kind: BehaviorKind) -> Option<BehaviorLists> {
        let mut behaviors = result
            .behaviors
            .iter()
            .filter(|b| b.kind == kind)
            .peekable();
        let first = behaviors.peek()?;
        let field = FieldPath::spec()
            .field("behaviors")
            .index(first.index)
            .field(first.kind.as_str());
        let (mut allow, mut deny) = (Unique::default(), Unique::default());
        let mut default_deny = false;
        for b in behaviors {
            allow.extend(&b.allow);
            deny.extend(&b.deny);
            default_deny |= b.default_deny;
        }
        let (allow, mut deny) = (allow.values, deny.values);
        // The sentinel is folded: the evaluated lists hold it only as
        // `default_deny`, but a value list may have carried it too.
        deny.retain(|v| v != STAR);
        if default_deny {
            deny.insert(0, STAR.to_string());
        }
        Some(BehaviorLists { field, allow, deny })
    }

    /// Whether the lists make the kind default deny (`"*"` in deny).
    pub fn default_deny(&self) -> bool {
        self.deny.iter().any(|v| v == STAR)
    }

    /// The explicit deny values (every deny value but `"*"`).
    pub fn explicit_denies(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(String::as_str).filter(|v| *v != STAR)
    }
}

/// Values in first-seen order, each once. A set beside the list: lists
/// read from data sources run to tens of thousands of values, and a
/// linear `contains` per value made merging them quadratic (300,000
/// values held the engine, and SIGTERM, for minutes).
#[derive(Default)]
struct Unique {
    values: Vec<String>,
    seen: std::collections::HashSet<String>,
}

impl Unique {
    fn extend(&mut self, from: &[String]) {
        for v in from {
            if self.seen.insert(v.clone()) {
                self.values.push(v.clone());
            }
        }
    }
}

/// What one policy's lists say about one operation: which of its lists
/// matched it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Matches {
    /// An explicit deny value matched.
    pub deny: bool,
    /// An allow value matched.
    pub allow: bool,
    /// The policy is default deny for the kind.
    pub default_deny: bool,
}

/// The outcome of the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Decision {
    /// An explicit deny matched: refused, whatever allows it.
    Denied,
    /// An explicit allow matched and no explicit deny did.
    Allowed,
    /// Nothing matched and some policy is default deny: refused.
    DefaultDenied,
    /// Nothing matched and no policy is default deny: allowed.
    Unmatched,
}

impl Decision {
    /// Whether the operation is refused (or, under monitor, would be).
    pub const fn refused(self) -> bool {
        matches!(self, Decision::Denied | Decision::DefaultDenied)
    }

    /// The name used in findings and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Decision::Denied => "denied",
            Decision::Allowed => "allowed",
            Decision::DefaultDenied => "default_denied",
            Decision::Unmatched => "unmatched",
        }
    }
}

/// The rule over the policies that select a pod (each one's [`Matches`]
/// for the operation, in any order): explicit deny > explicit allow >
/// default deny > allowed.
pub fn decide<I>(policies: I) -> Decision
where
    I: IntoIterator<Item = Matches>,
{
    let mut any = Matches::default();
    for m in policies {
        any.deny |= m.deny;
        any.allow |= m.allow;
        any.default_deny |= m.default_deny;
    }
    if any.deny {
        Decision::Denied
    } else if any.allow {
        Decision::Allowed
    } else if any.default_deny {
        Decision::DefaultDenied
    } else {
        Decision::Unmatched
    }
}

/// The policies a refusal belongs to (indices into `policies`, in order):
/// on [`Decision::Denied`] those whose explicit deny matched; on
/// [`Decision::DefaultDenied`] those that are default deny (no policy
/// allowed the operation, so none lifted it); none otherwise. A default
/// deny another policy's allow lifted is not blamed for an explicit deny.
pub fn blamed(policies: &[Matches]) -> Vec<usize> {
    let decision = decide(policies.iter().copied());
    policies
        .iter()
        .enumerate()
        .filter(|(_, m)| match decision {
            Decision::Denied => m.deny,
            Decision::DefaultDenied => m.default_deny,
            Decision::Allowed | Decision::Unmatched => false,
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests;
