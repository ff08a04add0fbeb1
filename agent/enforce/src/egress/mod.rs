//! The network egress behavior: its kernel backend ([`EgressEnforcer`],
//! over `kyverno-runtime-bpf`'s cgroup_skb egress filter) and its manager
//! ([`EgressManager`]: RuntimePolicies and pods in, programs and bindings
//! out).
//!
//! # Union in userspace
//!
//! The kernel filter holds one *set* per container cgroup (allow and deny
//! LPM tries of any prefix length, IPv4 and IPv6, and the default-deny and
//! observe flags). The seam is policy-level, so the backend computes each
//! cgroup's set as the union of the policies bound to it: every allow
//! prefix of any bound enforce policy, every deny prefix, default deny
//! while at least one bound enforce policy is default deny, observe while
//! at least one bound policy observes (both are counts, see
//! [`EgressEnforcer::flag_counts`]). The kernel's verdict on that union
//! (deny > allow > default deny > unmatched) is exactly the seam's
//! precedence over the bound policies. A bound observe policy adds the
//! domains it names on an observe side, which the DNS answer snooper
//! learns for and the filter ignores, so the monitor knows what an address
//! was answered for without any verdict changing.
//!
//! # Ordering
//!
//! A cgroup's first binding programs its set and flags, *then* attaches
//! the program to the cgroup's directory (which the manager registers
//! through [`CgroupPaths`]); the DNS answer snooper is attached before
//! both (it is gated by the filter map, so it does nothing until the
//! cgroup is in it). Its last unbinding revokes it from the filter map,
//! *then* detaches the filter, then the snooper, then clears the set and
//! forgets what the set learned (set ids are reused). Within a change the backend
//! tightens first and loosens last: deny entries added, allow entries
//! removed, default deny raised, allow entries added, flags lowered, deny
//! entries removed.
//!
//! # Values
//!
//! A network value is an address or a CIDR of any length, a cluster
//! Service, or a domain name ([`compile_network`]):
//!
//! - addresses and CIDRs are [`Destination::Prefix`]es in the tries;
//! - a Service (`<name>.<namespace>.svc[.<cluster domain>]`) is resolved
//!   by the manager to the addresses the API gives it (ClusterIPs and
//!   EndpointSlice endpoints, see [`crate::names`]) and programmed as
//!   their host prefixes, following the Service as it changes;
//! - any other name is a [`Destination::Domain`] of the set: the kernel's
//!   DNS answer snooper learns its addresses from the answers to the
//!   pod's own questions, and the filter treats an unexpired learned
//!   address like an entry of the name's side. That is a convenience,
//!   not a containment boundary: DNS over TCP, TLS or HTTPS teaches
//!   nothing, nor does an answer cached before the policy, and an address
//!   shared with other names is allowed or denied for all of them (a
//!   deny by domain is best effort).
//!
//! A value that cannot be programmed (invalid, or a domain on a node
//! whose kernel refused the snooper) is refused as an [`EgressRejection`]
//! with its field path, counted ([`EgressManager::rejected_total`]) and
//! kept for the policy's status, never dropped silently.
//!
//! # Restarts
//!
//! [`EgressEnforcer::load_pinned`] pins the filter's maps and every
//! per-cgroup link under a bpffs directory (`<dir>/maps/<name>`,
//! `<dir>/links/<cgroup id>`), so the programs stay attached and keep
//! enforcing when the daemon exits. The next daemon's `load_pinned` over
//! the same directory reuses the maps before its object loads and switches
//! each pinned link to its own program atomically: no packet of a filtered
//! cgroup passes unfiltered across the restart.
//!
//! The maps hold per-cgroup unions, from which the per-policy state
//! ([`Enforcer::held`]) cannot be recovered: two policies bound to one
//! cgroup leave one set. So the backend also writes a *ledger* into three
//! pinned maps the program never reads (no regular files can live on
//! bpffs): per policy its kind and default-deny flag, its prefixes, and its
//! bound cgroups. On adoption ([`EgressEnforcer::adopt`]):
//!
//! - each ledger policy becomes a [`Held`] (program from its record and
//!   prefixes, cgroups from its bindings); bindings of cgroups whose link
//!   is not pinned any more are dropped (held never claims what the kernel
//!   does not enforce, so the manager re-binds them);
//! - each filtered cgroup's mirror (its set id, entries and flags) is read
//!   from `cgroup_filters` and the tries, so it is what the kernel really
//!   holds, and set ids continue after the highest adopted one;
//! - leftovers of an interrupted change are cleaned (entries of sets no
//!   cgroup uses, map entries without a link, ledger entries without a
//!   policy record), and each cgroup is synced once to the union of its
//!   adopted policies, which writes nothing when the previous process
//!   stopped between changes.
//!
//! The ledger is written before the kernel for what a call adds and in the
//! same call for what it removes, so after a crash at any point the ledger
//! describes the state before or after the interrupted call (or, for an
//! update, part of its diff), and the adoption's sync makes the kernel
//! match it. [`EgressManager::new`] then starts from the adopted state and,
//! until [`EgressManager::reconcile_adopted`], keeps every adopted policy
//! and every adopted binding of a pod it has not seen yet.
//!
//! A pin directory of another layout version (or an incomplete one) is
//! discarded and logged: its map pins are removed and the backend starts
//! empty, while its links keep enforcing the old state until the cgroup is
//! attached anew (which replaces the pin) or until `reconcile_adopted`
//! releases them. [`EgressEnforcer::remove_pins`] removes every pin of the layout
//! (uninstall).
//!
//! # Limits
//!
//! - Per-destination observations: every refusal is counted (so an
//!   enforce-only pod's denials become findings); allowed packets only for
//!   cgroups bound to an observe policy. Counts are packets, not
//!   connections.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kyverno_runtime_bpf::cgroup_attach::CgroupLink;
use kyverno_runtime_bpf::dns::name::EncodeError;
use kyverno_runtime_bpf::egress::{
    self as bpf, Domain, DomainVerdicts, EgressError, EgressFilter, FilterFlags, Learned,
    LedgerKind, PinOutcome, PinnedState, Prefix, Verdict,
};
use kyverno_runtime_compat::{Backend, Behavior};
use kyverno_runtime_policy::selector::PodTarget;
use kyverno_runtime_policy::values::{parse_network, NetworkTarget, Reason, ValueError, STAR};

use crate::fake::FakeEnforcer;
use crate::names::{ServiceAddresses, ServiceName};
use crate::openexec::{BehaviorLists, Mode, Step};
use crate::seam::{
    CgroupId, Decision, EnforceError, Enforcer, Held, Observation, PolicyId, Program, ProgramDiff,
    Result, Rules,
};

const BEHAVIOR: &str = "network";

/// The snooper's program, as its links name it.
const SNOOP_PROGRAM: &str = "krt_dns_snoop";

mod backend;
mod enforcer;
mod kernel;
mod manager;
mod values;

pub use backend::*;
pub use kernel::*;
pub use manager::*;
pub use values::*;

#[cfg(test)]
mod tests;
