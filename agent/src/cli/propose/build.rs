//! From sightings to a proposal: which observed targets become allow
//! values, which are left out and why, and the RuntimePolicy documents.
//!
//! Everything here is pure: the inputs (Reports, collector lines, the
//! cluster) are read elsewhere into [`Sighting`]s and a [`Workload`].
//!
//! The proposal is the policy that, switched to enforce, allows exactly
//! what was observed: per behavior the workload exercised, an allow list of
//! the observed targets and `deny: ["*"]`. Values are checked with the
//! parsers the daemon programs from, so what the proposal holds is what
//! the kernel will hold. What cannot or should not be allowed is left out,
//! each with its reason:
//!
//! - a target the daemon refused (an enforce finding): it never happened;
//! - a redacted target (the chokepoint masked it as a secret): the real
//!   value is not known;
//! - an invalid value (a traced exec named relatively, an unresolved open);
//! - an open or exec path under `/proc/<pid>/`: open and exec values are
//!   exact paths (the path syntax has no wildcard and no directory prefix,
//!   `agent/policy/src/values/path.rs`, because the kernel keys whole
//!   paths), so the next process's path would never match;
//! - fewer occurrences than `--min-count` (`--open-min-count` for opens,
//!   the long tail of most workloads, since paths cannot be grouped under
//!   a directory);
//! - the `unclassified` protocol: not a value a policy may name. The
//!   protocol behavior then gets no default deny, so enforce does not drop
//!   the flows that were seen;
//! - more values than a policy holds (64 behaviors of 64 values).
//!
//! A dns behavior is observation only (enforce refuses it), so observed
//! names go to a second, monitor-only policy whose allow list is the
//! expected set: a name outside it is reported.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kyverno_runtime_api::runtimepolicy::{
    DnsBehavior, DnsRule, DnsValue, NetworkBehavior, NetworkRule, NetworkValue, PathBehavior,
    PathRule, PathValue, PolicyBehavior, ProtocolBehavior, ProtocolRule, ProtocolValue,
    RuntimePolicy, RuntimePolicyMode, RuntimePolicySpec, MAX_BEHAVIORS, MAX_VALUES,
};
use kyverno_runtime_policy::values::{
    parse_dns, parse_network, parse_path, parse_protocol, AbsPath, FieldPath, NetworkTarget,
};
use kyverno_runtime_report::{Behavior, MASK};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The label the API server gives every namespace: what the proposal's
/// namespaceSelector matches.
pub use kyverno_runtime_policy::selector::NAMESPACE_NAME_LABEL;

/// The widest IPv4 prefix `--aggregate-ipv4` may ask for.
pub const WIDEST_IPV4_PREFIX: u8 = 16;
/// The widest IPv6 prefix `--aggregate-ipv6` may ask for.
pub const WIDEST_IPV6_PREFIX: u8 = 48;

/// The classifier's name for a flow it recognized no protocol in.
const UNCLASSIFIED: &str = "unclassified";

/// One finding, as propose reads it from any input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// The policy that reported it.
    pub policy: String,
    /// The behavior.
    pub behavior: Behavior,
    /// What was seen (as the Report shows it: redacted).
    pub target: String,
    /// Whether the kernel refused it (an enforce policy's finding).
    pub enforced: bool,
    /// Occurrences.
    pub count: u64,
}

/// The workload a proposal is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Its namespace.
    pub namespace: String,
    /// Its kind (`Deployment`, ..., `Pod`).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The labels its pods carry: the podSelector.
    pub labels: BTreeMap<String, String>,
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            printable(&self.kind),
            printable(&self.namespace),
            printable(&self.name)
        )
    }
}

/// What to leave out and how to group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The policy's name.
    pub name: String,
    /// Only findings of these policies (empty: every policy's).
    pub policies: Vec<String>,
    /// Fewest occurrences for a value to be allowed.
    pub min_count: u64,
    /// The same for open paths.
    pub open_min_count: u64,
    /// Aggregate IPv4 destinations sharing a prefix of this length.
    pub aggregate_ipv4: Option<u8>,
    /// Aggregate IPv6 destinations sharing a prefix of this length.
    pub aggregate_ipv6: Option<u8>,
}

/// Why a target was left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The kernel refused it under these enforce policies.
    Refused(BTreeSet<String>),
    /// The redaction chokepoint masked or cut it.
    Redacted,
    /// The daemon's parser refuses it (its words).
    Invalid(String),
    /// An open or exec path naming a process id.
    ProcessId(String),
    /// Seen fewer times than the threshold (which flag set it).
    Rare {
        /// The threshold.
        min: u64,
        /// `--min-count` or `--open-min-count`.
        flag: &'static str,
    },
    /// The `unclassified` protocol.
    Unclassified,
    /// No room left in the policy.
    NoRoom,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Refused(policies) => write!(
                f,
                "refused by enforce policy {}: it did not happen, so it is not proposed",
                policies
                    .iter()
                    .map(|p| printable(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Reason::Redacted => f.write_str(
                "redacted in the Report (it looked like a secret, or was cut): the real value is unknown",
            ),
            Reason::Invalid(why) => write!(f, "not a value a policy can hold: {why}"),
            Reason::ProcessId(pid) => write!(
                f,
                "names process {pid}: a later process opens another path, and open and exec \
                 values are exact paths (no wildcard, no directory), so it would never match again"
            ),
            Reason::Rare { min, flag } => write!(f, "seen fewer than {min} times ({flag})"),
            Reason::Unclassified => f.write_str(
                "flows with no recognized protocol cannot be allowed by value, so the protocol \
                 behavior has no default deny (enforce would drop them)",
            ),
            Reason::NoRoom => write!(
                f,
                "the policy is full ({MAX_BEHAVIORS} behaviors of {MAX_VALUES} values): raise \
                 --min-count or --open-min-count"
            ),
        }
    }
}

/// A target that is not in the proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    /// The behavior.
    pub behavior: Behavior,
    /// The target as the input showed it.
    pub target: String,
    /// Occurrences.
    pub count: u64,
    /// Why.
    pub reason: Reason,
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (seen {}): {}",
            self.behavior,
            printable(&self.target),
            self.count,
            self.reason
        )
    }
}

/// The proposal: the policy, the dns policy when names were seen, and the
/// explanations.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// The policy (mode monitor).
    pub policy: RuntimePolicy,
    /// The monitor-only dns policy, when DNS names were allowed.
    pub dns_policy: Option<RuntimePolicy>,
    /// What was left out.
    pub left_out: Vec<LeftOut>,
    /// Other things a reader must know (aggregations, ignored findings).
    pub notes: Vec<String>,
    /// Monitor findings used.
    pub used: usize,
    /// Enforce findings (refusals) used.
    pub refusals: usize,
    /// Allow values in both policies.
    pub allowed: usize,
}

/// A string as it may stand in a YAML comment or a terminal line: as is,
/// or quoted and escaped when it holds a control character (a newline
/// would end the comment and start YAML).
pub fn printable(s: &str) -> String {
    if s.chars().any(char::is_control) {
        format!("{s:?}")
    } else {
        s.to_string()
    }
}

/// One observed target, added up.
#[derive(Default)]
struct Tally {
    count: u64,
    refused_by: BTreeSet<String>,
    refused_count: u64,
}

/// Builds the proposal for `workload` from `sightings`.
pub fn propose(workload: &Workload, sightings: &[Sighting], options: &Options) -> Proposal {
    let mut notes = Vec::new();
    let mut tallies: BTreeMap<(Behavior, String), Tally> = BTreeMap::new();
    let mut ignored = 0usize;
    let (mut used, mut refusals) = (0usize, 0usize);
    for s in sightings {
        if !options.policies.is_empty() && !options.policies.contains(&s.policy) {
            ignored += 1;
            continue;
        }
        let t = tallies.entry((s.behavior, s.target.clone())).or_default();
        if s.enforced {
            refusals += 1;
            t.refused_by.insert(s.policy.clone());
            t.refused_count = t.refused_count.saturating_add(s.count);
        } else {
            used += 1;
            t.count = t.count.saturating_add(s.count);
        }
    }
    if ignored > 0 {
        notes.push(format!(
            "{ignored} finding{} of other policies than {} ignored (--policy)",
            if ignored == 1 { "" } else { "s" },
            options
                .policies
                .iter()
                .map(|p| printable(p))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    let mut left_out = Vec::new();
    // Per behavior: the values to allow (sorted, unique), and whether the
    // workload exercised it at all.
    let mut allow: BTreeMap<Behavior, Vec<String>> = BTreeMap::new();
    let mut exercised: BTreeSet<Behavior> = BTreeSet::new();
    let mut net_addrs: Vec<(IpAddr, u64)> = Vec::new();
    let mut unclassified = false;
    for ((behavior, target), t) in &tallies {
        let behavior = *behavior;
        if t.count == 0 {
            // Only refusals: the kernel refused it every time.
            left_out.push(LeftOut {
                behavior,
                target: target.clone(),
                count: t.refused_count,
                reason: Reason::Refused(t.refused_by.clone()),
            });
            continue;
        }
        exercised.insert(behavior);
        let mut out = |reason| {
            left_out.push(LeftOut {
                behavior,
                target: target.clone(),
                count: t.count,
                reason,
            })
        };
        if target.contains(MASK) || target.ends_with('…') {
            out(Reason::Redacted);
            continue;
        }
        if behavior == Behavior::Protocol && target == UNCLASSIFIED {
            unclassified = true;
            out(Reason::Unclassified);
            continue;
        }
        if let Err(why) = valid(behavior, target) {
            out(Reason::Invalid(why));
            continue;
        }
        if matches!(behavior, Behavior::Open | Behavior::Exec) {
            if let Some(pid) = process_id(target) {
                out(Reason::ProcessId(pid));
                continue;
            }
        }
        let (min, flag) = if behavior == Behavior::Open {
            (options.open_min_count, "--open-min-count")
        } else {
            (options.min_count, "--min-count")
        };
        if t.count < min {
            out(Reason::Rare { min, flag });
            continue;
        }
        if behavior == Behavior::Network {
            if let Ok(NetworkTarget::Ip(ip)) = parse_network(target, &FieldPath::spec()) {
                net_addrs.push((ip, t.count));
                continue;
            }
        }
        allow.entry(behavior).or_default().push(target.clone());
    }
    let network = aggregate(&net_addrs, options, &mut notes);
    allow.entry(Behavior::Network).or_default().extend(network);
    for values in allow.values_mut() {
        values.sort();
        values.dedup();
    }
    for ((behavior, target), t) in &tallies {
        if t.count > 0 && t.refused_count > 0 {
            notes.push(format!(
                "{behavior} {} was also refused {} time{} by enforce policy {}",
                printable(target),
                t.refused_count,
                if t.refused_count == 1 { "" } else { "s" },
                t.refused_by
                    .iter()
                    .map(|p| printable(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }

    // The enforceable behaviors, in the order a reader expects.
    let mut behaviors = Vec::new();
    let mut allowed = 0usize;
    for behavior in [
        Behavior::Exec,
        Behavior::Open,
        Behavior::Network,
        Behavior::Protocol,
    ] {
        if !exercised.contains(&behavior) {
            continue;
        }
        let values = allow.remove(&behavior).unwrap_or_default();
        let default_deny = !(behavior == Behavior::Protocol && unclassified);
        let room = MAX_BEHAVIORS.saturating_sub(behaviors.len()) * MAX_VALUES;
        let (fits, spill) = values.split_at(values.len().min(room));
        for v in spill {
            left_out.push(LeftOut {
                behavior,
                target: v.clone(),
                count: tallies.get(&(behavior, v.clone())).map_or(0, |t| t.count),
                reason: Reason::NoRoom,
            });
        }
        allowed += fits.len();
        let mut chunks: Vec<&[String]> = fits.chunks(MAX_VALUES).collect();
        if chunks.is_empty() {
            // Exercised, nothing allowed: the default deny alone.
            chunks.push(&[]);
        }
        for (i, chunk) in chunks.into_iter().enumerate() {
            // The default deny once, on the first entry: the daemon merges
            // every entry of a kind, and "*" in one makes the kind
            // default-deny.
            if let Some(b) = behavior_entry(behavior, chunk, default_deny && i == 0) {
                if behaviors.len() < MAX_BEHAVIORS {
                    behaviors.push(b);
                }
            }
        }
    }
    if behaviors.is_empty() && !exercised.contains(&Behavior::Dns) {
        notes.push(
            "no behavior was observed as allowed: the policy selects the workload and says nothing"
                .to_string(),
        );
    }
    let policy = runtime_policy(&options.name, workload, behaviors);

    let dns_values = allow.remove(&Behavior::Dns).unwrap_or_default();
    let dns_policy = if dns_values.is_empty() {
        if exercised.contains(&Behavior::Dns) {
            notes.push(
                "no DNS name could be allowed: no dns policy is proposed (an empty expected set reports nothing)"
                    .to_string(),
            );
        }
        None
    } else {
        let (fits, spill) = dns_values.split_at(dns_values.len().min(MAX_BEHAVIORS * MAX_VALUES));
        for v in spill {
            left_out.push(LeftOut {
                behavior: Behavior::Dns,
                target: v.clone(),
                count: tallies
                    .get(&(Behavior::Dns, v.clone()))
                    .map_or(0, |t| t.count),
                reason: Reason::NoRoom,
            });
        }
        allowed += fits.len();
        let behaviors = fits
            .chunks(MAX_VALUES)
            .filter_map(|c| behavior_entry(Behavior::Dns, c, false))
            .collect();
        Some(runtime_policy(
            &dns_policy_name(&options.name),
            workload,
            behaviors,
        ))
    };
    Proposal {
        policy,
        dns_policy,
        left_out,
        notes,
        used,
        refusals,
        allowed,
    }
}

/// The dns policy's name: the policy's with `-dns` (cut to fit 253).
pub fn dns_policy_name(name: &str) -> String {
    let mut base = name.to_string();
    while base.len() > 249 {
        base.pop();
    }
    format!("{}-dns", base.trim_end_matches(['-', '.']))
}

/// Whether the daemon's parser takes `target` as an allow value of
/// `behavior`; its reason when not.
fn valid(behavior: Behavior, target: &str) -> Result<(), String> {
    let at = FieldPath::spec();
    if target == "*" {
        return Err("\"*\" is refused in allow".to_string());
    }
    let result = match behavior {
        Behavior::Open | Behavior::Exec => parse_path(target, &at).map(drop),
        Behavior::Network => parse_network(target, &at).map(drop),
        Behavior::Protocol => parse_protocol(target, &at).map(drop),
        Behavior::Dns => parse_dns(target, &at).map(drop),
    };
    result.map_err(|e| format!("{} {}", printable(target), e.reason))
}

/// The pid an absolute path under `/proc/<pid>` names.
fn process_id(path: &str) -> Option<String> {
    let p = AbsPath::parse(path).ok()?;
    let mut segments = p.as_str().split('/').skip(1);
    let (Some("proc"), Some(pid)) = (segments.next(), segments.next()) else {
        return None;
    };
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then(|| pid.to_string())
}

/// The network allow values: every address, or, when asked, addresses
/// sharing a prefix of the asked length replaced by the narrowest CIDR
/// covering them (never wider than asked), each aggregation noted.
fn aggregate(addrs: &[(IpAddr, u64)], options: &Options, notes: &mut Vec<String>) -> Vec<String> {
    let mut v4: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut v6: BTreeMap<u128, Vec<u128>> = BTreeMap::new();
    let mut out = Vec::new();
    for (ip, _) in addrs {
        match (ip, options.aggregate_ipv4, options.aggregate_ipv6) {
            (IpAddr::V4(a), Some(len), _) => {
                let bits = u32::from(*a);
                v4.entry(bits & mask32(len)).or_default().push(bits);
            }
            (IpAddr::V6(a), _, Some(len)) => {
                let bits = u128::from(*a);
                v6.entry(bits & mask128(len)).or_default().push(bits);
            }
            _ => out.push(ip.to_string()),
        }
    }
    for (_, mut group) in v4 {
        group.sort_unstable();
        group.dedup();
        match (group.first(), group.last()) {
            (Some(&lo), Some(&hi)) if lo != hi => {
                let len = (lo ^ hi).leading_zeros() as u8;
                let net = Ipv4Addr::from(lo & mask32(len));
                let cidr = format!("{net}/{len}");
                notes.push(aggregation_note(
                    &cidr,
                    group.iter().map(|a| Ipv4Addr::from(*a).to_string()),
                    (1u128 << (32 - u32::from(len))) - group.len() as u128,
                ));
                out.push(cidr);
            }
            (Some(&a), _) => out.push(Ipv4Addr::from(a).to_string()),
            _ => {}
        }
    }
    for (_, mut group) in v6 {
        group.sort_unstable();
        group.dedup();
        match (group.first(), group.last()) {
            (Some(&lo), Some(&hi)) if lo != hi => {
                let len = (lo ^ hi).leading_zeros() as u8;
                let net = Ipv6Addr::from(lo & mask128(len));
                let cidr = format!("{net}/{len}");
                let span = 128 - u32::from(len);
                let unseen = if span >= 128 {
                    u128::MAX
                } else {
                    (1u128 << span).saturating_sub(group.len() as u128)
                };
                notes.push(aggregation_note(
                    &cidr,
                    group.iter().map(|a| Ipv6Addr::from(*a).to_string()),
                    unseen,
                ));
                out.push(cidr);
            }
            (Some(&a), _) => out.push(Ipv6Addr::from(a).to_string()),
            _ => {}
        }
    }
    out
}

fn aggregation_note(cidr: &str, members: impl Iterator<Item = String>, unseen: u128) -> String {
    format!(
        "network {cidr} stands for {} (aggregated); it also allows {unseen} address{} never seen",
        members.collect::<Vec<_>>().join(", "),
        if unseen == 1 { "" } else { "es" }
    )
}

fn mask32(len: u8) -> u32 {
    match len {
        0 => 0,
        l if l >= 32 => u32::MAX,
        l => u32::MAX << (32 - u32::from(l)),
    }
}

fn mask128(len: u8) -> u128 {
    match len {
        0 => 0,
        l if l >= 128 => u128::MAX,
        l => u128::MAX << (128 - u32::from(l)),
    }
}

/// One behavior entry allowing `values`, with `deny: ["*"]` when asked;
/// `None` for an entry that would say nothing.
fn behavior_entry(
    behavior: Behavior,
    values: &[String],
    default_deny: bool,
) -> Option<PolicyBehavior> {
    if values.is_empty() && !default_deny {
        return None;
    }
    macro_rules! lists {
        ($rule:ident, $value:ident) => {
            (
                (!values.is_empty()).then(|| $rule {
                    values: Some(values.iter().map(|v| $value(v.clone())).collect()),
                    expression: None,
                }),
                default_deny.then(|| $rule {
                    values: Some(vec![$value("*".to_string())]),
                    expression: None,
                }),
            )
        };
    }
    let mut entry = PolicyBehavior::default();
    match behavior {
        Behavior::Exec | Behavior::Open => {
            let (allow, deny) = lists!(PathRule, PathValue);
            let b = Some(PathBehavior { allow, deny });
            if behavior == Behavior::Exec {
                entry.exec = b;
            } else {
                entry.open = b;
            }
        }
        Behavior::Network => {
            let (allow, deny) = lists!(NetworkRule, NetworkValue);
            entry.network = Some(NetworkBehavior { allow, deny });
        }
        Behavior::Protocol => {
            let (allow, deny) = lists!(ProtocolRule, ProtocolValue);
            entry.protocol = Some(ProtocolBehavior { allow, deny });
        }
        Behavior::Dns => {
            let (allow, deny) = lists!(DnsRule, DnsValue);
            entry.dns = Some(DnsBehavior { allow, deny });
        }
    }
    Some(entry)
}

fn runtime_policy(
    name: &str,
    workload: &Workload,
    behaviors: Vec<PolicyBehavior>,
) -> RuntimePolicy {
    let selector = |labels: BTreeMap<String, String>| LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    };
    RuntimePolicy {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: RuntimePolicySpec {
            pod_selector: Some(selector(workload.labels.clone())),
            namespace_selector: Some(selector(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                workload.namespace.clone(),
            )]))),
            behaviors: (!behaviors.is_empty()).then_some(behaviors),
            mode: Some(RuntimePolicyMode::Monitor),
            ..RuntimePolicySpec::default()
        },
        status: None,
    }
}

/// Where the findings came from, for the header.
#[derive(Clone, Debug)]
pub struct Provenance {
    /// The inputs, as a person names them.
    pub sources: Vec<String>,
    /// The policies whose findings were read.
    pub policies: BTreeSet<String>,
}

impl Proposal {
    /// The documents as YAML, each after its comment block.
    pub fn to_yaml(&self, workload: &Workload, from: &Provenance) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# RuntimePolicy proposed by `kyverno-runtime propose` for {workload}"
        );
        let refusals = match self.refusals {
            0 => String::new(),
            1 => " and 1 refusal".to_string(),
            n => format!(" and {n} refusals"),
        };
        let _ = writeln!(
            out,
            "# from {} monitor finding{}{refusals} (polic{} {}) in {}.",
            self.used,
            if self.used == 1 { "" } else { "s" },
            if from.policies.len() == 1 { "y" } else { "ies" },
            from.policies
                .iter()
                .map(|p| printable(p))
                .collect::<Vec<_>>()
                .join(", "),
            from.sources
                .iter()
                .map(|s| printable(s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = write!(
            out,
            "# Each behavior the workload exercised allows what it was seen doing and denies\n\
             # everything else (deny: [\"*\"]). Mode monitor: apply it, check that its Report stays\n\
             # empty while the workload runs, then switch it to enforce:\n\
             #   kubectl patch rpol {} --type merge -p '{{\"spec\":{{\"mode\":\"enforce\"}}}}'\n",
            printable(self.policy.metadata.name.as_deref().unwrap_or_default())
        );
        if !self.left_out.is_empty() {
            out.push_str("#\n# Left out (enforce will refuse these):\n");
            for l in &self.left_out {
                let _ = writeln!(out, "#   {l}");
            }
        }
        if !self.notes.is_empty() {
            out.push_str("#\n# Notes:\n");
            for n in &self.notes {
                let _ = writeln!(out, "#   {n}");
            }
        }
        out.push_str(&yaml(&self.policy));
        if let Some(dns) = &self.dns_policy {
            out.push_str(
                "---\n# The DNS names the workload resolved. A dns behavior is observation only (enforce\n\
                 # refuses it), so this policy stays in monitor mode: a name outside the list is\n\
                 # reported (a warn result), none is refused.\n",
            );
            out.push_str(&yaml(dns));
        }
        out
    }
}

/// The policy as YAML, its spec's `mode` first: the field a reader switches.
fn yaml(policy: &RuntimePolicy) -> String {
    // A RuntimePolicy is strings, lists and maps: it always serializes.
    let Ok(mut value) = serde_yaml::to_value(policy) else {
        return String::new();
    };
    if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_mapping_mut()) {
        let mode = serde_yaml::Value::from("mode");
        if let Some(m) = spec.remove(&mode) {
            let rest = std::mem::take(spec);
            spec.insert(mode, m);
            spec.extend(rest);
        }
    }
    serde_yaml::to_string(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::cli::policy::check_clean;

    fn workload() -> Workload {
        Workload {
            namespace: "shop".into(),
            kind: "Deployment".into(),
            name: "web".into(),
            labels: BTreeMap::from([("app".into(), "web".into())]),
        }
    }

    fn options() -> Options {
        Options {
            name: "web-allow".into(),
            policies: Vec::new(),
            min_count: 1,
            open_min_count: 1,
            aggregate_ipv4: None,
            aggregate_ipv6: None,
        }
    }

    fn seen(behavior: Behavior, target: &str, count: u64) -> Sighting {
        Sighting {
            policy: "discover".into(),
            behavior,
            target: target.into(),
            enforced: false,
            count,
        }
    }

    fn lists(p: &RuntimePolicy) -> Vec<(String, Vec<String>, Vec<String>)> {
        let v = serde_json::to_value(p.spec.behaviors.clone().unwrap_or_default()).unwrap();
        let mut out = Vec::new();
        for b in v.as_array().unwrap() {
            let (kind, body) = b.as_object().unwrap().iter().next().unwrap();
            let values = |side: &str| -> Vec<String> {
                body[side]["values"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                    .unwrap_or_default()
            };
            out.push((kind.clone(), values("allow"), values("deny")));
        }
        out
    }

    /// Each document of the YAML, through `policy check`.
    fn check(yaml: &str) -> String {
        use serde::Deserialize as _;
        let mut out = String::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value = serde_yaml::Value::deserialize(doc).unwrap();
            let (text, ok) = check_clean(value);
            assert!(ok, "{text}\n{yaml}");
            out.push_str(&text);
        }
        out
    }

    #[test]
    fn each_exercised_behavior_allows_what_was_seen_and_denies_the_rest() {
        let p = propose(
            &workload(),
            &[
                seen(Behavior::Exec, "/usr/bin/curl", 2),
                seen(Behavior::Open, "/etc/app.conf", 3),
                seen(Behavior::Open, "/usr/bin/curl", 2),
                seen(Behavior::Network, "10.0.0.7", 40),
                seen(Behavior::Protocol, "tls/h2", 4),
                seen(Behavior::Dns, "api.example.com", 1),
            ],
            &options(),
        );
        let star = vec!["*".to_string()];
        assert_eq!(
            lists(&p.policy),
            [
                ("exec".into(), vec!["/usr/bin/curl".into()], star.clone()),
                (
                    "open".into(),
                    vec!["/etc/app.conf".into(), "/usr/bin/curl".into()],
                    star.clone()
                ),
                ("network".into(), vec!["10.0.0.7".into()], star.clone()),
                ("protocol".into(), vec!["tls/h2".into()], star),
            ]
        );
        assert_eq!(p.policy.spec.mode, Some(RuntimePolicyMode::Monitor));
        let spec = serde_json::to_value(&p.policy.spec).unwrap();
        assert_eq!(spec["podSelector"]["matchLabels"]["app"], "web");
        assert_eq!(
            spec["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "shop"
        );
        let dns = p.dns_policy.as_ref().unwrap();
        assert_eq!(dns.metadata.name.as_deref(), Some("web-allow-dns"));
        assert_eq!(
            lists(dns),
            [("dns".into(), vec!["api.example.com".into()], vec![])],
            "the expected set, no deny: a name outside it is reported"
        );
        assert!(p.left_out.is_empty(), "{:?}", p.left_out);
        assert_eq!(p.allowed, 6);

        let yaml = p.to_yaml(
            &workload(),
            &Provenance {
                sources: vec!["the Report shop/kyverno-runtime-deployment.web".into()],
                policies: BTreeSet::from(["discover".to_string()]),
            },
        );
        assert!(yaml.starts_with("# RuntimePolicy proposed by `kyverno-runtime propose` for Deployment shop/web\n# from 6 monitor findings (policy discover) in the Report shop/kyverno-runtime-deployment.web.\n"), "{yaml}");
        let checked = check(&yaml);
        assert!(
            checked.contains("policy web-allow (mode monitor)"),
            "{checked}"
        );
        assert!(
            checked.contains("policy web-allow-dns (mode monitor)"),
            "{checked}"
        );

        // Switched to enforce, the main policy still passes the check.
        let enforce = yaml.replacen("mode: monitor", "mode: enforce", 1);
        let checked = check(&enforce);
        assert!(
            checked.contains("policy web-allow (mode enforce)"),
            "{checked}"
        );
    }

    #[test]
    fn what_cannot_or_should_not_be_allowed_is_left_out_with_the_reason() {
        let mut refused = seen(Behavior::Exec, "/usr/bin/nc", 3);
        refused.enforced = true;
        refused.policy = "deny-nc".into();
        let p = propose(
            &workload(),
            &[
                refused,
                seen(Behavior::Exec, "/bin/sh", 1),
                seen(Behavior::Exec, "./relative", 1),
                seen(Behavior::Open, "/opt/run --password=***", 1),
                seen(Behavior::Open, "/proc/4242/status", 9),
                seen(Behavior::Open, "/proc/self/status", 9),
                seen(Behavior::Open, "/etc/rare", 1),
                seen(Behavior::Open, "/etc/often", 5),
                seen(Behavior::Network, "10.0.0.9", 1),
                seen(Behavior::Protocol, "unclassified", 7),
                seen(Behavior::Protocol, "ssh", 7),
            ],
            &Options {
                min_count: 1,
                open_min_count: 2,
                ..options()
            },
        );
        let why = |target: &str| {
            p.left_out
                .iter()
                .find(|l| l.target == target)
                .map(|l| l.to_string())
                .unwrap_or_else(|| panic!("{target} not left out: {:?}", p.left_out))
        };
        assert_eq!(
            why("/usr/bin/nc"),
            "exec /usr/bin/nc (seen 3): refused by enforce policy deny-nc: it did not happen, so it is not proposed"
        );
        assert_eq!(
            why("./relative"),
            "exec ./relative (seen 1): not a value a policy can hold: ./relative is not an absolute path: it must start with /"
        );
        assert!(why("/opt/run --password=***").contains("redacted"));
        assert!(why("/proc/4242/status").contains("names process 4242"));
        assert_eq!(
            why("/etc/rare"),
            "open /etc/rare (seen 1): seen fewer than 2 times (--open-min-count)"
        );
        assert!(why("unclassified").contains("no default deny"));
        let got = lists(&p.policy);
        assert_eq!(
            got,
            [
                ("exec".into(), vec!["/bin/sh".into()], vec!["*".into()]),
                (
                    "open".into(),
                    vec!["/etc/often".into(), "/proc/self/status".into()],
                    vec!["*".into()]
                ),
                ("network".into(), vec!["10.0.0.9".into()], vec!["*".into()]),
                ("protocol".into(), vec!["ssh".into()], vec![]),
            ],
            "/proc/self is the path as written, not a pid; protocol: no default deny"
        );
        assert!(p.dns_policy.is_none());
        let yaml = p.to_yaml(
            &workload(),
            &Provenance {
                sources: vec!["a file".into()],
                policies: BTreeSet::from(["deny-nc".to_string(), "discover".to_string()]),
            },
        );
        assert!(
            yaml.contains("# from 10 monitor findings and 1 refusal (policies deny-nc, discover) in a file.\n"),
            "{yaml}"
        );
    }

    #[test]
    fn only_refused_behavior_is_not_exercised_and_a_fully_left_out_one_still_denies() {
        let mut refused = seen(Behavior::Network, "10.9.9.9", 1);
        refused.enforced = true;
        let p = propose(
            &workload(),
            &[refused, seen(Behavior::Open, "/proc/77/stat", 1)],
            &options(),
        );
        assert_eq!(
            lists(&p.policy),
            [("open".into(), vec![], vec!["*".into()])],
            "open was exercised (all of it left out): default deny alone; network was only refused"
        );
    }

    #[test]
    fn addresses_aggregate_only_when_asked_and_never_wider_than_asked() {
        let addrs = [
            "10.1.2.3", "10.1.2.9", "10.1.7.1", "10.2.0.1", "fd00::1", "fd00::2",
        ];
        let sightings: Vec<_> = addrs
            .iter()
            .map(|a| seen(Behavior::Network, a, 1))
            .collect();
        let p = propose(&workload(), &sightings, &options());
        assert_eq!(
            lists(&p.policy)[0].1.len(),
            6,
            "no aggregation unless asked"
        );

        let p = propose(
            &workload(),
            &sightings,
            &Options {
                aggregate_ipv4: Some(24),
                aggregate_ipv6: Some(64),
                ..options()
            },
        );
        assert_eq!(
            lists(&p.policy)[0].1,
            ["10.1.2.0/28", "10.1.7.1", "10.2.0.1", "fd00::/126"]
        );
        assert!(p.notes.iter().any(|n| n
            == "network 10.1.2.0/28 stands for 10.1.2.3, 10.1.2.9 (aggregated); it also allows 14 addresses never seen"), "{:?}", p.notes);

        let p = propose(
            &workload(),
            &sightings,
            &Options {
                aggregate_ipv4: Some(16),
                ..options()
            },
        );
        assert_eq!(
            lists(&p.policy)[0].1,
            ["10.1.0.0/21", "10.2.0.1", "fd00::1", "fd00::2"],
            "the narrowest CIDR covering the /16 group"
        );
    }

    #[test]
    fn long_lists_are_split_in_entries_of_64_values() {
        let sightings: Vec<_> = (0..150)
            .map(|i| seen(Behavior::Open, &format!("/data/f{i:03}"), 1))
            .collect();
        let p = propose(&workload(), &sightings, &options());
        let got = lists(&p.policy);
        assert_eq!(got.len(), 3);
        assert_eq!(
            got.iter().map(|(_, a, _)| a.len()).collect::<Vec<_>>(),
            [64, 64, 22]
        );
        assert_eq!(got[0].2, ["*"]);
        assert!(got[1].2.is_empty() && got[2].2.is_empty());
        check(&p.to_yaml(
            &workload(),
            &Provenance {
                sources: vec![],
                policies: BTreeSet::new(),
            },
        ));
    }

    #[test]
    fn a_policy_filter_ignores_other_policies_and_says_so() {
        let mut other = seen(Behavior::Exec, "/bin/other", 1);
        other.policy = "someone-else".into();
        let p = propose(
            &workload(),
            &[seen(Behavior::Exec, "/bin/sh", 1), other],
            &Options {
                policies: vec!["discover".into()],
                ..options()
            },
        );
        assert_eq!(lists(&p.policy)[0].1, ["/bin/sh"]);
        assert_eq!(
            p.notes,
            ["1 finding of other policies than discover ignored (--policy)"]
        );
    }

    #[test]
    fn a_newline_in_a_target_cannot_leave_the_comment() {
        // A newline is a byte a path may hold, but not a policy value (the
        // parser refuses control characters): left out, whether rare or
        // not, it is in a comment, escaped.
        let p = propose(
            &workload(),
            &[
                seen(Behavior::Open, "/x\nspec: {mode: enforce}", 1),
                seen(Behavior::Open, "/y\nspec: {mode: enforce}", 5),
            ],
            &Options {
                open_min_count: 2,
                ..options()
            },
        );
        let yaml = p.to_yaml(
            &workload(),
            &Provenance {
                sources: vec![],
                policies: BTreeSet::new(),
            },
        );
        assert!(
            yaml.contains(r#"#   open "/x\nspec: {mode: enforce}" (seen 1)"#),
            "{yaml}"
        );
        assert!(
            yaml.contains(r#"#   open "/y\nspec: {mode: enforce}" (seen 5): not a value a policy can hold: "/y\nspec: {mode: enforce}" contains the control character U+000A"#),
            "{yaml}"
        );
        assert!(!yaml.contains("\nspec: {mode: enforce}"), "{yaml}");
        let checked = check(&yaml);
        assert!(checked.contains("(mode monitor)"), "{checked}");
        assert_eq!(
            lists(&p.policy),
            [("open".to_string(), vec![], vec!["*".to_string()])]
        );
    }
}
