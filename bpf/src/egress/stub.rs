//! The egress filter of a build without BPF objects (no clang, or
//! `KRT_BPF_STUB=1`): loading fails at once, saying how to get a real
//! build, so no handle can exist and every other method is unreachable.

use std::path::Path;

use super::{EgressError, FilterFlags, Observation, Prefix, Result, Stats, Verdict};
use crate::cgroup_attach::CgroupLink;

/// Uninhabited: [`Filter::load`] never returns one.
#[derive(Debug)]
pub(super) enum Filter {}

impl Filter {
    pub(super) fn load() -> Result<Self> {
        Err(EgressError::NotBuilt)
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
