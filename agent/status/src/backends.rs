//! A node shard's `backends`: which kernel mechanism serves each behavior
//! on that node, from the probe's plan.
//!
//! On a mixed cluster the aggregate conditions say whether a policy is in
//! force; this says how, node by node, so an operator can see which nodes
//! fell back to fmod_ret (and so enforce exec differently) and why. The
//! reason is carried only where the backend is not the one a fully capable
//! kernel gets — a fallback, none, or an operator override — because that
//! is the case someone has to act on, and because the shard is repeated in
//! every policy's status.

use kyverno_runtime_api::runtimepolicy::BehaviorBackend;
use kyverno_runtime_compat::{Backend, Behavior, Plan};

/// The backend a kernel with every capability serves `behavior` with.
fn preferred(behavior: Behavior) -> Backend {
    match behavior {
        Behavior::Open | Behavior::Exec => Backend::BpfLsm,
        Behavior::Network => Backend::CgroupSkbEgress,
        Behavior::Protocol => Backend::CgroupSkbClassifier,
        Behavior::Dns => Backend::CgroupSkbDns,
        Behavior::ExecArgv => Backend::RawTpExec,
    }
}

/// Every behavior's backend on this node, in the plan's report order, with
/// the plan's reason where it fell back, is none, or was forced.
pub fn backends(plan: &Plan) -> Vec<BehaviorBackend> {
    Behavior::ALL
        .into_iter()
        .map(|behavior| {
            let entry = plan.entry(behavior);
            let deviates = entry.backend != preferred(behavior) || !entry.available || entry.forced;
            BehaviorBackend {
                behavior: behavior.name().to_string(),
                backend: entry.backend.id().to_string(),
                reason: deviates.then(|| entry.reason.clone()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kyverno_runtime_compat::PlanEntry;

    fn entry(backend: Backend, reason: &str) -> PlanEntry {
        PlanEntry {
            backend,
            available: backend != Backend::None,
            reason: reason.into(),
            forced: false,
        }
    }

    fn plan() -> Plan {
        Plan {
            open: entry(
                Backend::FmodRet,
                "fmod_ret/security_file_open loaded, attached and ran when triggered (BPF-LSM unavailable: bpf is not in the active LSM list (lockdown,capability))",
            ),
            exec: entry(Backend::FmodRet, "fmod_ret/security_file_open loaded; an exec is told apart by the exec bit"),
            network: entry(Backend::CgroupSkbEgress, "cgroup_skb/egress attached"),
            protocol: entry(Backend::CgroupSkbClassifier, "cgroup_skb/egress attached"),
            dns: entry(Backend::None, "ringbuf map: load refused: EINVAL"),
            exec_argv: entry(Backend::RawTpExec, "raw_tp/sched_process_exec loaded"),
        }
    }

    #[test]
    fn every_behavior_is_named_with_a_reason_only_where_it_deviates() {
        let got = backends(&plan());
        let summary: Vec<(&str, &str, bool)> = got
            .iter()
            .map(|b| (b.behavior.as_str(), b.backend.as_str(), b.reason.is_some()))
            .collect();
        assert_eq!(
            summary,
            [
                ("open", "fmod_ret", true),
                ("exec", "fmod_ret", true),
                ("network", "cgroup_skb_egress", false),
                ("protocol", "cgroup_skb_classifier", false),
                ("dns", "none", true),
                ("execArgv", "raw_tp_exec", false),
            ]
        );
        assert!(
            got[0]
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("bpf is not in the active LSM list")),
            "{got:?}"
        );
        assert_eq!(
            got[4].reason.as_deref(),
            Some("ringbuf map: load refused: EINVAL")
        );
    }

    #[test]
    fn an_override_is_explained_even_when_it_picks_the_preferred_backend() {
        let mut plan = plan();
        plan.open = PlanEntry {
            forced: true,
            ..entry(Backend::BpfLsm, "forced by --open-exec=bpf_lsm")
        };
        let got = backends(&plan);
        assert_eq!(got[0].backend, "bpf_lsm");
        assert_eq!(
            got[0].reason.as_deref(),
            Some("forced by --open-exec=bpf_lsm")
        );
    }
}
