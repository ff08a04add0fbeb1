//! The egress filter of a build without BPF objects (no clang, or
//! `KRT_BPF_STUB=1`): loading fails at once, saying how to get a real
//! build, so no handle can exist and every other method is unreachable.

use std::path::Path;

use super::{
    EgressError, FilterFlags, LedgerKind, Observation, PinOutcome, PinnedLinks, PinnedState,
    Prefix, Result, Stats, Verdict,
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

    pub(super) fn test_run(&self, _: &[u8]) -> Result<u32> {
        match *self {}
    }

    pub(super) fn attach(&self, _: &Path) -> Result<CgroupLink> {
        match *self {}
    }

    pub(super) fn test_run_repeat(&self, _: &[u8], _: u32) -> Result<super::TimedRun> {
        match *self {}
    }
}
