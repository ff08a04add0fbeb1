//! The open/exec handle in a build without BPF objects: every operation
//! fails with [`OpenExecError::NotBuilt`].

use std::path::Path;

use super::{
    CgroupSlots, Denial, Dimension, Hooks, OpenExecError, OpenExecStats, PathRule, ProgramRunStats,
    RawObservation, Result, SlotMasks, NAME_KEY_LEN, PATH_KEY_LEN,
};

#[derive(Debug)]
pub(super) enum Inner {}

impl Inner {
    pub(super) fn load(_: Hooks, _: Option<&Path>, _: Option<u32>) -> Result<Self> {
        Err(OpenExecError::NotBuilt)
    }
    pub(super) fn hooks(&self) -> Hooks {
        match *self {}
    }
    pub(super) fn adopted(&self) -> bool {
        match *self {}
    }
    pub(super) fn owner(&self, _: Dimension, _: usize) -> Result<Option<Vec<u8>>> {
        match *self {}
    }
    pub(super) fn set_owner(&self, _: Dimension, _: usize, _: Option<&[u8]>) -> Result<()> {
        match *self {}
    }
    pub(super) fn rule(&self, _: Dimension, _: &[u8; PATH_KEY_LEN]) -> Result<PathRule> {
        match *self {}
    }
    pub(super) fn set_rule(&self, _: Dimension, _: &[u8; PATH_KEY_LEN], _: PathRule) -> Result<()> {
        match *self {}
    }
    pub(super) fn rules(&self, _: Dimension) -> Result<Vec<([u8; PATH_KEY_LEN], PathRule)>> {
        match *self {}
    }
    pub(super) fn set_name(&self, _: &[u8; NAME_KEY_LEN], _: bool) -> Result<()> {
        match *self {}
    }
    pub(super) fn names(&self) -> Result<Vec<[u8; NAME_KEY_LEN]>> {
        match *self {}
    }
    pub(super) fn cgroup(&self, _: u64) -> Result<CgroupSlots> {
        match *self {}
    }
    pub(super) fn set_cgroup(&self, _: u64, _: CgroupSlots) -> Result<()> {
        match *self {}
    }
    pub(super) fn cgroups(&self) -> Result<Vec<(u64, CgroupSlots)>> {
        match *self {}
    }
    pub(super) fn masks(&self) -> Result<SlotMasks> {
        match *self {}
    }
    pub(super) fn set_masks(&self, _: &SlotMasks) -> Result<()> {
        match *self {}
    }
    pub(super) fn drain_observations(&self) -> Result<Vec<RawObservation>> {
        match *self {}
    }
    pub(super) fn stats(&self) -> Result<OpenExecStats> {
        match *self {}
    }
    pub(super) fn run_stats(&self) -> Result<Vec<ProgramRunStats>> {
        match *self {}
    }
    pub(super) fn set_denial_rate(&self, _: u32) -> Result<()> {
        match *self {}
    }
    pub(super) fn denial_rate(&self) -> Result<u32> {
        match *self {}
    }
    pub(super) fn set_pod_fallback(&self, _: bool) -> Result<()> {
        match *self {}
    }
    pub(super) fn set_pod_exempt(&self, _: u64, _: bool) -> Result<()> {
        match *self {}
    }
    pub(super) fn pod_fallback(&self) -> Result<(bool, u64)> {
        match *self {}
    }
    pub(super) fn exec_resolved_map(&self) -> Result<libbpf_rs::MapHandle> {
        match *self {}
    }
    pub(super) fn denial_reader(&self) -> Result<crate::ring::RecordReader<Denial>> {
        match *self {}
    }
}
