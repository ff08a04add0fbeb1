//! `RuntimePolicy` (`runtime.nirmata.io/v1alpha1`): the one CRD the daemon
//! is driven by.
//!
//! The field set is the Go original's, so the same manifests work with
//! both. Where the original checks value shapes only in the daemon (its
//! Known Gaps say a malformed dns value is accepted by `kubectl apply` and
//! only shows up as `CompileFailed` later), this schema refuses at
//! admission everything CEL can decide within the API server's cost
//! budget: each value kind has its own string type carrying its own rule,
//! so the server's error names the exact field (for example
//! `spec.behaviors[2].network.deny.values[0]`) and the value.
//!
//! The bounds below (`maxItems`, `maxLength`) are what make the per-value
//! rules affordable: the server estimates a rule's cost as its cost times
//! the largest number of times it could run, and refuses the CRD when the
//! estimate exceeds its budget.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Most behaviors one policy may carry. Also what keeps the per-behavior
/// rules within the cost budget.
pub const MAX_BEHAVIORS: usize = 64;
/// Most literal values one allow or deny rule may carry. With
/// [`MAX_BEHAVIORS`] this bounds how often a value rule can run per object
/// (64 x 64), which is what the API server's cost estimate multiplies by:
/// at 128 the hostname rules exceed the per-rule budget (measured against
/// kube-apiserver 1.37). Longer lists belong in an expression, whose result
/// the daemon checks with the same parsers, or across several behaviors.
pub const MAX_VALUES: usize = 64;
/// Most variables one policy may declare.
pub const MAX_VARIABLES: usize = 64;
/// Fewest monitorFilter expressions (an empty filter is refused, not inert).
pub const MONITOR_FILTER_MIN: usize = 1;
/// Most monitorFilter expressions.
pub const MONITOR_FILTER_MAX: usize = 64;
/// Longest CEL expression accepted (compiled by the daemon, not here).
pub const MAX_EXPRESSION_LEN: usize = 10_240;
/// Longest hostname a policy may name: the kernel programs hold a name in
/// a 128-byte key in wire form (length-prefixed labels and a final zero
/// byte, so 2 bytes more than the dotted name), the same width the DNS
/// observer reads questions into. A longer name could never match, so it is
/// refused rather than silently inert. (RFC 1035 allows 253.)
pub const MAX_HOSTNAME_LEN: usize = 126;
/// Longest exec or open path: the kernel programs key paths in a fixed
/// 256-byte buffer (the path plus its NUL), so a longer one could never
/// match and is refused rather than silently inert.
pub const MAX_PATH_LEN: usize = 255;
/// Longest ALPN identifier in a `tls/<alpn>` protocol token: the width of
/// the classifier's ALPN key.
pub const MAX_ALPN_LEN: usize = 16;

/// The messages of the admission rules a policy author meets most, shared
/// by the CRD's rules and the compiler (so `policy check`, the API server
/// and the daemon's status say the same thing). Each contains, word for
/// word, the phrase of the Go original's message that its users' scripts
/// and its own admission tests match on (issue 30), then says what to do.
pub mod messages {
    /// A behavior item with zero or several kinds.
    pub const ONE_KIND_PER_BEHAVIOR: &str =
        "exactly one of network, exec, open, protocol, or dns must be specified: \
         each behavior sets one kind; write one behavior per kind";
    /// An enforce policy without a selector.
    pub const ENFORCE_NEEDS_SELECTOR: &str =
        "an enforce-mode policy must state the pods it applies to: set spec.podSelector \
         or spec.namespaceSelector, or set spec.podSelector to {} to enforce on every \
         pod on the node";
    /// A monitorFilter on an enforce policy.
    pub const MONITOR_FILTER_IN_ENFORCE: &str =
        "a monitorFilter narrows what a monitor-mode policy reports; an enforce-mode \
         policy reports only operations the kernel actually denied, and those are never \
         suppressed: remove spec.monitorFilter, or set spec.mode to monitor";
    /// A dns behavior in an enforce policy.
    pub const DNS_IN_ENFORCE: &str =
        "a dns behavior reports the names a workload resolves, it does not block them: \
         set spec.mode to \"monitor\", or express the destinations you want blocked as a \
         network behavior, which enforces domain values";
}

/// Selects pods and declares allow/deny rules for what they may do.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "runtime.nirmata.io",
    version = "v1alpha1",
    kind = "RuntimePolicy",
    plural = "runtimepolicies",
    singular = "runtimepolicy",
    shortname = "rpol",
    status = "RuntimePolicyStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Applied","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.mode) || self.mode != 'enforce' || has(self.podSelector) || has(self.namespaceSelector)"
).message(messages::ENFORCE_NEEDS_SELECTOR))]
#[x_kube(validation = Rule::new(
    "!has(self.monitorFilter) || !has(self.mode) || self.mode != 'enforce'"
).message(messages::MONITOR_FILTER_IN_ENFORCE))]
#[x_kube(validation = Rule::new(
    "!has(self.mode) || self.mode != 'enforce' || !has(self.behaviors) || !self.behaviors.exists(b, has(b.dns))"
).message(messages::DNS_IN_ENFORCE))]
pub struct RuntimePolicySpec {
    /// Pods this policy applies to. Absent and `{}` both select every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Narrows podSelector to pods in namespaces carrying these labels.
    /// Absent and `{}` both select every namespace. ANDed with podSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// When set, the policy is re-evaluated on this interval (a Go duration
    /// such as `30s` or `5m`), picking up changes in `resource.get` and
    /// `http.get` data; otherwise only when the policy changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "evaluation_interval_schema")]
    pub evaluation_interval: Option<String>,
    /// Named CEL expressions usable in behavior expressions as `variables.<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_VARIABLES))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub variables: Option<Vec<Variable>>,
    /// The allow/deny rules, one behavior kind per entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_BEHAVIORS))]
    pub behaviors: Option<Vec<PolicyBehavior>>,
    /// `monitor` (the default) observes and reports; `enforce` makes the
    /// kernel refuse what the policy denies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "monitor"))]
    pub mode: Option<RuntimePolicyMode>,
    /// Per-event CEL predicates narrowing which monitor observations become
    /// findings. Refused with `mode: enforce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_filter: Option<MonitorFilter>,
}

/// Whether a policy enforces or only observes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum RuntimePolicyMode {
    /// Observe and report what would have been denied.
    #[default]
    Monitor,
    /// Program the kernel to refuse what the policy denies.
    Enforce,
}

impl RuntimePolicyMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimePolicyMode::Monitor => "monitor",
            RuntimePolicyMode::Enforce => "enforce",
        }
    }
}

fn evaluation_interval_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 64,
        "x-kubernetes-validations": [{
            "rule": "self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s')",
            "messageExpression": "'evaluationInterval must be a duration of at least 1s such as 30s or 5m, not \"' + self + '\"'"
        }]
    })
}

/// A named CEL expression (admissionregistration.k8s.io/v1 Variable).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Referenced as `variables.<name>`: a CEL identifier.
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z_][a-zA-Z0-9_]*$')").message("a variable name must be a CEL identifier: a letter or _ followed by letters, digits or _"))]
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A CEL expression evaluating to `list(string)`.
    #[schemars(length(min = 1, max = MAX_EXPRESSION_LEN))]
    pub expression: String,
}

/// One behavior entry: exactly one of its kinds is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new(
    "[has(self.network), has(self.exec), has(self.open), has(self.protocol), has(self.dns)].filter(k, k).size() == 1"
).message(messages::ONE_KIND_PER_BEHAVIOR))]
pub struct PolicyBehavior {
    /// Egress destinations: IP addresses, CIDRs, cluster Service names, domain names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkBehavior>,
    /// Programs executed: absolute paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<PathBehavior>,
    /// Files opened: absolute paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<PathBehavior>,
    /// Application protocols of egress flows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolBehavior>,
    /// DNS names resolved (observation only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsBehavior>,
}

/// Declares, for one value kind, a behavior (allow and deny rules), its
/// rule type, and its value type with the admission rules every value must
/// pass: the shape rule (`rule`, refused as "not <what>"), then any further
/// rules (`refuse`: a CEL condition true of a value that is refused, and
/// the message), each its own `x-kubernetes-validations` entry so the
/// server's message names which one failed and each stays within the
/// per-rule cost budget. Their messages are fixed text: the server shows
/// the value beside them (escaped), and a message made from a value that
/// holds a newline would be dropped for the bare rule. `"*"` is accepted by the value type and
/// refused in allow by the behavior's rules; in deny it makes the behavior
/// default deny beside any explicit denies (which still win over every
/// allow), except where `star_alone_in_deny` confines it to standing alone
/// (dns, whose `deny: ["*"]` is the discovery form).
macro_rules! behavior_kind {
    (
        $(#[$bdoc:meta])* behavior $behavior:ident,
        $(star_alone_in_deny: $star_why:literal,)?
        $(#[$rdoc:meta])* rule $rule:ident,
        $(#[$vdoc:meta])* value $value:ident {
            max_length: $max:expr,
            rule: $cel:expr,
            what: $what:expr
            $(, refuse: [$(($refused:expr, $why:expr $(,)?)),* $(,)?])? $(,)?
        }
    ) => {
        $(#[$bdoc])*
        #[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
        #[x_kube(validation = Rule::new(
            "!has(self.allow) || !has(self.allow.values) || !self.allow.values.exists(v, v == '*')"
        ).message("\"*\" is only meaningful in deny, where it makes the behavior default-deny; it is refused in allow"))]
        $(#[x_kube(validation = Rule::new(
            "!has(self.deny) || !has(self.deny.values) || !self.deny.values.exists(v, v == '*') || self.deny.values.size() == 1"
        ).message($star_why))])?
        pub struct $behavior {
            /// What is allowed (under a default deny, the only things allowed).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub allow: Option<$rule>,
            /// What is denied; `values: ["*"]` makes the behavior default-deny.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub deny: Option<$rule>,
        }

        $(#[$rdoc])*
        #[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
        pub struct $rule {
            /// Literal values, unioned with the expression's result.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(length(max = MAX_VALUES))]
            pub values: Option<Vec<$value>>,
            /// A CEL expression evaluating to `list(string)`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(length(max = MAX_EXPRESSION_LEN))]
            pub expression: Option<String>,
        }

        impl $rule {
            /// The literal values as strings.
            pub fn literal_values(&self) -> impl Iterator<Item = &str> {
                self.values.iter().flatten().map(|v| v.0.as_str())
            }
        }

        $(#[$vdoc])*
        #[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[serde(transparent)]
        pub struct $value(pub String);

        impl $value {
            /// The value as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $value {
            fn from(s: &str) -> Self {
                $value(s.to_string())
            }
        }

        impl JsonSchema for $value {
            fn schema_name() -> Cow<'static, str> {
                stringify!($value).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": $max,
                    "x-kubernetes-validations": [{
                        "rule": concat!("self == '*' || (", $cel, ")"),
                        "messageExpression": concat!("'\"' + self + '\" is not ", $what, "'"),
                    } $($(, {
                        "rule": concat!("!(", $refused, ")"),
                        "message": $why,
                    })*)?]
                })
            }
        }
    };
}

/// A value of numbers and dots as `inet_aton` writes them (decimal, octal
/// with a leading 0, or `0x` hex), one trailing dot allowed: the C library
/// reads it as an IPv4 address, never as a name to look up. (RE2, in a CEL
/// string.)
macro_rules! numeric_name {
    () => {
        "^(0[xX][0-9a-fA-F]*|[0-9]+)([.](0[xX][0-9a-fA-F]*|[0-9]+))*[.]?$"
    };
}

behavior_kind! {
    /// The network behavior: egress destinations.
    behavior NetworkBehavior,
    /// Allowed or denied egress destinations.
    rule NetworkRule,
    /// An IPv4 or IPv6 address, a CIDR of any prefix length, a cluster
    /// Service name or a domain name (no wildcards: a destination must
    /// resolve to addresses the kernel can hold).
    value NetworkValue {
        max_length: MAX_HOSTNAME_LEN,
        rule: "self.contains('/') ? isCIDR(self) : self.contains(':') || self.matches('^[0-9.]+$') ? isIP(self) : self.matches('^[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?([.][a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?)*[.]?$')",
        what: "an IPv4 or IPv6 address, a CIDR, a Service name or a domain name (network values take no wildcards)",
        refuse: [(
            concat!("!self.contains('/') && !self.contains(':') && !self.matches('^[0-9.]+$') && self.matches('", numeric_name!(), "')"),
            "numbers and dots (decimal, octal or 0x hex) are an IPv4 address to the C library (inet_aton), connected to without a DNS lookup, not a name: write the address in dotted decimal",
        )],
    }
}

behavior_kind! {
    /// The exec and open behaviors: absolute file paths.
    behavior PathBehavior,
    /// Allowed or denied paths.
    rule PathRule,
    /// An absolute, normalized path of at most 255 bytes, as the kernel
    /// resolves it (no `//`, `/./`, `/../` or trailing `/`), so that a
    /// value can actually match.
    value PathValue {
        max_length: MAX_PATH_LEN,
        rule: "self.startsWith('/') && (self == '/' || !self.endsWith('/')) && !self.contains('//') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..') && !self.contains('*') && !self.contains('\\u0000') && bytes(self).size() <= 255",
        what: "an absolute normalized path of at most 255 bytes (starting with /, without //, /./, /../, a trailing / or *)",
        refuse: [
            (
                "self.matches('[\\\\p{Cc}]')",
                "a path holds no control character (a newline, a carriage return, a tab, an escape): it would hide what the path is",
            ),
            (
                "self.matches('[\\\\x{61c}\\\\x{200e}\\\\x{200f}\\\\x{202a}-\\\\x{202e}\\\\x{2066}-\\\\x{2069}]')",
                "a path holds no bidirectional control character: it would display as another path than the one compared",
            ),
            (
                "self.matches('\\\\p{Z}$')",
                "a path does not end with whitespace: the kernel would compare it as part of the name",
            ),
        ],
    }
}

behavior_kind! {
    /// The protocol behavior: application protocols of egress flows.
    behavior ProtocolBehavior,
    /// Allowed or denied protocol tokens.
    rule ProtocolRule,
    /// A protocol token: `ssh`, `tls`, `tls/<alpn>` (1 to 16 printable
    /// characters), `dns`, `http/1.1`, `http/2` or `quic`.
    value ProtocolValue {
        max_length: MAX_ALPN_LEN + 4,
        rule: "self in ['ssh', 'tls', 'dns', 'http/1.1', 'http/2', 'quic'] || self.matches('^tls/[!-)+-~]{1,16}$')",
        what: "a protocol token: ssh, tls, tls/<alpn>, dns, http/1.1, http/2 or quic",
    }
}

behavior_kind! {
    /// The dns behavior: question names (observation only).
    behavior DnsBehavior,
    star_alone_in_deny: "\"*\" in a dns deny list must be the only value: alone it reports every name",
    /// Expected or reported names.
    rule DnsRule,
    /// A hostname, or a left wildcard `*.example.com` matching its
    /// subdomains (never the apex).
    value DnsValue {
        max_length: MAX_HOSTNAME_LEN,
        rule: "!self.contains(':') && !self.matches('^[0-9.]+$') && self.matches('^([*][.])?[a-zA-Z0-9_]([-a-zA-Z0-9_]{0,61}[a-zA-Z0-9_])?([.][a-zA-Z0-9_]([-a-zA-Z0-9_]{0,61}[a-zA-Z0-9_])?)*[.]?$')",
        what: "a hostname or a left wildcard such as *.example.com (a wildcard may only be the whole leftmost label; an address is not a name)",
        refuse: [(
            concat!("!self.matches('^[0-9.]+$') && self.matches('", numeric_name!(), "')"),
            "numbers and dots (decimal, octal or 0x hex) are an IPv4 address to the C library (inet_aton), which asks DNS no question for it, not a name",
        )],
    }
}

/// Per-event predicates narrowing monitor findings.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MonitorFilter {
    /// ANDed in order, short-circuiting on the first false one.
    #[schemars(length(min = MONITOR_FILTER_MIN, max = MONITOR_FILTER_MAX))]
    pub expressions: Vec<NamedExpression>,
}

/// A named bool CEL expression over `event`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NamedExpression {
    /// Names the expression in compile errors, conditions and metrics.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A CEL expression evaluating to `bool`.
    #[schemars(length(min = 1, max = MAX_EXPRESSION_LEN))]
    pub expression: String,
}

/// Observed state, written by the daemons (one shard per node).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuntimePolicyStatus {
    /// Cluster-wide conditions: the spec-level ones (TargetsValid,
    /// ExecRulesValid, OpenRulesValid) verbatim, the node-level ones
    /// (EnforcementAvailable, ObservationAvailable, PodsMatched,
    /// EventSourcesAvailable) aggregated across shards, and Applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One shard per node; each daemon replaces only its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodePolicyStatus>,
    /// The newest evaluation time across all shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluated_time: Option<Time>,
}

/// One node's report on one policy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodePolicyStatus {
    /// The node this shard belongs to.
    pub node_name: String,
    /// The `metadata.generation` of the spec this node applied. The
    /// cluster conditions count only shards at the object's current
    /// generation: a node still at an older one is pending, so `Applied`
    /// never describes a spec no node has applied. (A shard needs no uid:
    /// a node writes only to the object whose uid it evaluated, and a
    /// deleted policy's status goes with it.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether this node could attach the enforcement behind the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement_available: Option<bool>,
    /// Whether this node could attach the observation behind the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_available: Option<bool>,
    /// Whether any pod on this node matches the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_matched: Option<bool>,
    /// What is unavailable here, when something is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How many pods this policy selects on this node have a container
    /// whose cgroup could not be found: nothing is enforced or observed in
    /// those containers, and this says so instead of staying silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved_pod_count: Option<i32>,
    /// The first of those pods (at most 16), with how many of their
    /// containers are unresolved and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unresolved_pods: Vec<UnresolvedPod>,
    /// The state of each event source this policy depends on, on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_sources: Vec<EventSourceStatus>,
    /// Which backend serves each behavior on this node, from its probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<BehaviorBackend>,
    /// When this node last evaluated the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluated_time: Option<Time>,
}

/// A selected pod with containers whose cgroup this node could not find.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UnresolvedPod {
    /// `namespace/name`.
    pub pod: String,
    /// How many of its containers are unresolved.
    pub containers: i32,
    /// The first unresolved container and why.
    pub reason: String,
}

/// The lifecycle state of one event source on one node.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EventSourceStatus {
    /// The source: `openexec-observe`, `exec-trace`, `egress-observe`, `dnsquery`.
    pub name: String,
    /// `Starting`, `Available` or `Failed`.
    pub state: EventSourceState,
    /// A bounded reason for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Lifecycle of an event source.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSourceState {
    /// Registered, not yet ready.
    Starting,
    /// Its reader is usable.
    Available,
    /// It failed; see the reason.
    Failed,
}

/// The backend serving one behavior on one node.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BehaviorBackend {
    /// `open`, `exec`, `network`, `protocol`, `dns` or `execArgv`.
    pub behavior: String,
    /// The backend id (`bpf_lsm`, `fmod_ret`, ..., `none`).
    pub backend: String,
    /// Why this backend, or why none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest in the Go original's shape deserializes field for field.
    #[test]
    fn an_original_manifest_reads_field_for_field() {
        let yaml = r#"
apiVersion: runtime.nirmata.io/v1alpha1
kind: RuntimePolicy
metadata:
  name: deny-shells
spec:
  mode: enforce
  podSelector:
    matchLabels: {app: web}
  namespaceSelector:
    matchLabels: {team: shop}
  evaluationInterval: 5m
  variables:
  - name: shells
    expression: "['/bin/sh', '/bin/bash']"
  behaviors:
  - exec:
      deny:
        values: [/usr/bin/nc]
        expression: variables.shells
  - network:
      allow: {values: [10.0.0.0/8, api.example.com]}
      deny: {values: ["*"]}
"#;
        let policy: RuntimePolicy = serde_yaml::from_str(yaml).unwrap();
        let spec = &policy.spec;
        assert_eq!(spec.mode, Some(RuntimePolicyMode::Enforce));
        assert_eq!(spec.evaluation_interval.as_deref(), Some("5m"));
        assert_eq!(spec.variables.as_ref().unwrap()[0].name, "shells");
        let behaviors = spec.behaviors.as_ref().unwrap();
        let exec = behaviors[0].exec.as_ref().unwrap().deny.as_ref().unwrap();
        assert_eq!(exec.literal_values().collect::<Vec<_>>(), ["/usr/bin/nc"]);
        assert_eq!(exec.expression.as_deref(), Some("variables.shells"));
        let network = behaviors[1].network.as_ref().unwrap();
        assert_eq!(network.allow.as_ref().unwrap().literal_values().count(), 2);
        assert_eq!(
            network
                .deny
                .as_ref()
                .unwrap()
                .literal_values()
                .collect::<Vec<_>>(),
            ["*"]
        );
        // Absent fields stay absent on the way back out.
        let back = serde_json::to_value(&policy).unwrap();
        assert!(back["spec"].get("monitorFilter").is_none());
        assert!(back["spec"]["behaviors"][0].get("network").is_none());
    }

    #[test]
    fn the_schema_carries_the_bounds_the_constants_name() {
        let crd = serde_json::to_value(crate::crd::runtime_policy()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["behaviors"]["maxItems"], MAX_BEHAVIORS);
        assert_eq!(spec["properties"]["mode"]["default"], "monitor");
        let exec = &spec["properties"]["behaviors"]["items"]["properties"]["exec"]["properties"]
            ["deny"]["properties"]["values"];
        assert_eq!(exec["maxItems"], MAX_VALUES);
        assert_eq!(exec["items"]["maxLength"], MAX_PATH_LEN);
        let filter = &spec["properties"]["monitorFilter"]["properties"]["expressions"];
        assert_eq!(
            (filter["minItems"].clone(), filter["maxItems"].clone()),
            (MONITOR_FILTER_MIN.into(), MONITOR_FILTER_MAX.into())
        );
    }
}
