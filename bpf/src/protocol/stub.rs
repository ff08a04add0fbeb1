//! The classifier of a build without BPF objects (no clang, or
//! `KRT_BPF_STUB=1`): loading fails at once, saying how to get a real
//! build, so no handle can exist and every other method is unreachable.

use std::path::Path;

use super::{ProtoEvent, ProtoFlags, ProtoKey, ProtoStats, ProtocolError, Result, Verdict};
use crate::cgroup_attach::CgroupLink;

/// Uninhabited: [`Classifier::load`] never returns one.
#[derive(Debug)]
pub(super) enum Classifier {}

impl Classifier {
    pub(super) fn load() -> Result<Self> {
        Err(ProtocolError::NotBuilt)
    }

    #[cfg(feature = "host-tests")]
    pub(super) fn load_with_update_between_reads() -> Result<Self> {
        Err(ProtocolError::NotBuilt)
    }

    pub(super) fn set_filter(&self, _: u64, _: u32, _: ProtoFlags) -> Result<()> {
        match *self {}
    }

    pub(super) fn remove_cgroup(&self, _: u64) -> Result<bool> {
        match *self {}
    }

    pub(super) fn insert(&self, _: u32, _: Verdict, _: ProtoKey) -> Result<()> {
        match *self {}
    }

    pub(super) fn remove(&self, _: u32, _: Verdict, _: ProtoKey) -> Result<bool> {
        match *self {}
    }

    pub(super) fn read_stats(&self) -> Result<ProtoStats> {
        match *self {}
    }

    pub(super) fn drain_events(&self) -> Result<Vec<ProtoEvent>> {
        match *self {}
    }

    pub(super) fn test_run(&self, _: &[u8]) -> Result<u32> {
        match *self {}
    }

    pub(super) fn attach(&self, _: &Path) -> Result<CgroupLink> {
        match *self {}
    }

    pub(super) fn test_run_repeat(&self, _: &[u8], _: u32) -> Result<crate::egress::TimedRun> {
        match *self {}
    }
}
