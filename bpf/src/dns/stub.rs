//! The observer of a build without BPF objects (no clang, or
//! `KRT_BPF_STUB=1`): loading fails at once, saying how to get a real
//! build, so no value of these types ever exists.

use std::convert::Infallible;
use std::path::Path;

use super::{DnsError, DnsQuestion, DnsStats, Result};

#[derive(Debug)]
pub(super) struct Observer {
    never: Infallible,
}

impl Observer {
    pub(super) fn load() -> Result<Self> {
        Err(DnsError::NotBuilt)
    }

    pub(super) fn uses_current_cgroup_fallback(&self) -> bool {
        match self.never {}
    }

    pub(super) fn admit(&self, _: u64) -> Result<()> {
        match self.never {}
    }

    pub(super) fn revoke(&self, _: u64) -> Result<bool> {
        match self.never {}
    }

    pub(super) fn read_stats(&self) -> Result<DnsStats> {
        match self.never {}
    }

    pub(super) fn attach(&self, _: &Path) -> Result<Link> {
        match self.never {}
    }

    pub(super) fn reader(&self) -> Result<crate::ring::RecordReader<DnsQuestion>> {
        match self.never {}
    }

    pub(super) fn test_run(&self, _: &[u8]) -> Result<u32> {
        match self.never {}
    }
}

#[derive(Debug)]
pub(super) struct Link {
    _never: Infallible,
}
