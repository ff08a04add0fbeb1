//! The egress filter of a build without BPF objects (no clang, or
//! `KRT_BPF_STUB=1`): loading fails at once, saying how to get a real
//! build, so no handle can exist and every other method is unreachable.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::{
    Domain, DomainVerdicts, EgressError, FilterFlags, Learned, LedgerKind, Observation, PinOutcome,
    PinnedLinks, PinnedState, Prefix, Result, SnoopStats, Stats, Verdict,
};
use crate::cgroup_attach::CgroupLink;

/// Uninhabited: [`Filter::load`] never returns one.
#[derive(Debug)]
pub(super) enum Filter {}

impl Filter {
    pub(super) fn load(_: Option<&Path>) -> Result<Self> {
        Err(EgressError::NotBuilt)
    }

    pub(super) fn discard_pinned_maps(_: &Path) -> Result<()> {
        Err(EgressError::NotBuilt)
    }

    pub(super) fn pinned_layout_version(_: &Path) -> Result<Option<u32>> {
        Err(EgressError::NotBuilt)
    }

    pub(super) fn set_pinned_layout_version(_: &Path, _: u32) -> Result<()> {
        Err(EgressError::NotBuilt)
    }

    pub(super) fn read_pinned_state(_: &Path) -> Result<PinnedState> {
        Err(EgressError::NotBuilt)
    }

    pub(super) fn pin_outcome(&self) -> &PinOutcome {
        match *self {}
    }

    pub(super) fn pin_dir(&self) -> Option<&Path> {
        match *self {}
    }

    pub(super) fn take_pinned_links(&mut self) -> PinnedLinks {
        match *self {}
    }

    pub(super) fn pin_link(&self, _: &mut CgroupLink) -> Result<()> {
        match *self {}
    }

    pub(super) fn unpin_link(&self, _: &CgroupLink) -> Result<()> {
        match *self {}
    }

    pub(super) fn read_state(&self) -> Result<PinnedState> {
        match *self {}
    }

    pub(super) fn ledger_set_policy(&self, _: &[u8], _: Option<LedgerKind>) -> Result<()> {
        match *self {}
    }

    pub(super) fn ledger_set_rule(&self, _: &[u8], _: Verdict, _: Prefix, _: bool) -> Result<()> {
        match *self {}
    }

    pub(super) fn ledger_set_binding(&self, _: &[u8], _: u64, _: bool) -> Result<()> {
        match *self {}
    }

    pub(super) fn set_filter(&self, _: u64, _: u32, _: FilterFlags) -> Result<()> {
        match *self {}
    }

    pub(super) fn remove_cgroup(&self, _: u64) -> Result<bool> {
        match *self {}
    }

    pub(super) fn insert(&self, _: u32, _: Verdict, _: Prefix) -> Result<()> {
        match *self {}
    }

    pub(super) fn remove(&self, _: u32, _: Verdict, _: Prefix) -> Result<bool> {
        match *self {}
    }

    pub(super) fn read_stats(&self) -> Result<Stats> {
        match *self {}
    }

    pub(super) fn drain_observations(&self) -> Result<Vec<Observation>> {
        match *self {}
    }

    pub(super) fn observations_taken(&self) -> u64 {
        match *self {}
    }

    pub(super) fn count_observations(&self) -> u64 {
        match *self {}
    }

    pub(super) fn test_run(&self, _: &[u8]) -> Result<u32> {
        match *self {}
    }

    pub(super) fn attach(&self, _: &Path) -> Result<CgroupLink> {
        match *self {}
    }

    pub(super) fn test_run_repeat(&self, _: &[u8], _: u32) -> Result<super::TimedRun> {
        match *self {}
    }

    pub(super) fn set_domain(&self, _: u32, _: &Domain, _: DomainVerdicts, _: u32) -> Result<()> {
        match *self {}
    }

    pub(super) fn remove_domain(&self, _: u32, _: &Domain) -> Result<bool> {
        match *self {}
    }

    pub(super) fn learned(&self) -> Result<Vec<Learned>> {
        match *self {}
    }

    pub(super) fn forget_learned(&self, _: u32, _: Option<u32>) -> Result<usize> {
        match *self {}
    }

    pub(super) fn insert_learned(
        &self,
        _: u32,
        _: IpAddr,
        _: DomainVerdicts,
        _: u32,
        _: Duration,
    ) -> Result<()> {
        match *self {}
    }

    pub(super) fn set_dns_resolvers(&self, _: &[IpAddr]) -> Result<()> {
        match *self {}
    }

    pub(super) fn observations_over_share(&self) -> Result<Vec<(u32, u64)>> {
        match *self {}
    }

    pub(super) fn observation_share(&self) -> Result<Option<u64>> {
        match *self {}
    }

    pub(super) fn sweep_learned(&self) -> Result<usize> {
        match *self {}
    }

    pub(super) fn learned_use(&self) -> Result<Vec<super::LearnedUse>> {
        match *self {}
    }

    pub(super) fn learned_share(&self) -> Result<Option<u64>> {
        match *self {}
    }

    pub(super) fn cap_learned_share(&self, _: u64) -> Result<()> {
        match *self {}
    }

    pub(super) fn snoop_error(&self) -> Option<&EgressError> {
        match *self {}
    }

    pub(super) fn read_snoop_stats(&self) -> Result<SnoopStats> {
        match *self {}
    }

    pub(super) fn attach_snoop(&self, _: &Path) -> Result<CgroupLink> {
        match *self {}
    }

    pub(super) fn pin_snoop_link(&self, _: &mut CgroupLink) -> Result<()> {
        match *self {}
    }

    pub(super) fn test_run_snoop(&self, _: &[u8]) -> Result<u32> {
        match *self {}
    }

    pub(super) fn test_run_snoop_repeat(&self, _: &[u8], _: u32) -> Result<super::TimedRun> {
        match *self {}
    }

    pub(super) fn ledger_set_domain_rule(
        &self,
        _: &[u8],
        _: Verdict,
        _: &Domain,
        _: bool,
    ) -> Result<()> {
        match *self {}
    }
}
