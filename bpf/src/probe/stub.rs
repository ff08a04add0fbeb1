//! The probes of a build without BPF objects (no clang, or `KRT_BPF_STUB=1`):
//! each one fails at once, saying how to get a real build.

use std::path::Path;

use super::{ProbeError, ProbeMap, ProbeProgram, ProgramProbe, Result, Stage};

fn not_built() -> ProbeError {
    ProbeError::new(
        Stage::Open,
        None,
        "built without BPF objects: install clang and rebuild",
    )
}

pub(super) fn probe_program(_: ProbeProgram, _: Option<&Path>) -> Result<ProgramProbe> {
    Err(not_built())
}

pub(super) fn probe_map(_: ProbeMap) -> Result<()> {
    Err(not_built())
}
