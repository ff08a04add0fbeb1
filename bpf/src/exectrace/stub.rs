//! The tracer of a build without BPF objects: loading fails at once,
//! saying how to get a real build, so no value of these types exists.

use std::convert::Infallible;

use super::{ExecRecord, ExecTraceError, ExecTraceStats};
use crate::ring::RecordReader;

#[derive(Debug)]
pub(super) struct Tracer {
    never: Infallible,
}

impl Tracer {
    pub(super) fn load(_: Option<&libbpf_rs::MapHandle>) -> Result<Self, ExecTraceError> {
        Err(ExecTraceError::NotBuilt)
    }

    pub(super) fn admit(&self, _: u64) -> Result<(), ExecTraceError> {
        match self.never {}
    }

    pub(super) fn revoke(&self, _: u64) -> Result<bool, ExecTraceError> {
        match self.never {}
    }

    pub(super) fn read_stats(&self) -> Result<ExecTraceStats, ExecTraceError> {
        match self.never {}
    }

    pub(super) fn reader(&self) -> Result<RecordReader<ExecRecord>, ExecTraceError> {
        match self.never {}
    }
}
