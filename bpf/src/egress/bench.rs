//! Timing with `BPF_PROG_TEST_RUN`'s repeat count, for the benchmark: the
//! kernel runs a program `repeat` times on one frame and reports the mean
//! time per run, which is the cost of the program plus the harness.
//! [`FloorProgram`] (an empty `cgroup_skb/egress` program,
//! `bpf/egress/floor.bpf.c`) measures the harness alone.

use std::time::Duration;

use super::{EgressError, Result};

/// One timed test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedRun {
    /// The program's verdict (1 pass, 0 drop), of the last run.
    pub verdict: u32,
    /// The kernel's mean time per run.
    pub per_run: Duration,
}

/// The empty `cgroup_skb/egress` program: the floor a benchmark's figures
/// are compared with.
#[derive(Debug)]
pub struct FloorProgram {
    #[cfg(not(krt_bpf_stub))]
    object: libbpf_rs::Object,
}

#[cfg(not(krt_bpf_stub))]
const FLOOR_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/egress/floor.bpf.o"));

#[cfg(not(krt_bpf_stub))]
const FLOOR_PROGRAM: &str = "krt_floor";

impl FloorProgram {
    /// Loads it (root needed). Fails with [`EgressError::NotBuilt`] in a
    /// stub build.
    #[cfg(not(krt_bpf_stub))]
    pub fn load() -> Result<Self> {
        let open = libbpf_rs::ObjectBuilder::default()
            .open_memory(FLOOR_OBJECT)
            .map_err(|e| EgressError::Open {
                message: format!("{e:#}"),
            })?;
        let object = open.load().map_err(|e| EgressError::Load {
            errno: crate::sys::errno(&e),
            message: format!("{e:#}"),
            verifier_log: None,
        })?;
        Ok(Self { object })
    }

    /// Loads it: always [`EgressError::NotBuilt`] in a stub build.
    #[cfg(krt_bpf_stub)]
    pub fn load() -> Result<Self> {
        Err(EgressError::NotBuilt)
    }

    /// Runs it `repeat` times on `frame` (an Ethernet frame).
    #[cfg(not(krt_bpf_stub))]
    pub fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<TimedRun> {
        let program = self.program().ok_or_else(|| EgressError::TestRun {
            errno: None,
            message: format!("the object has no program {FLOOR_PROGRAM}"),
        })?;
        timed(&program, frame, repeat)
    }

    /// Attaches it to the egress of the cgroup v2 directory `dir`, so real
    /// traffic can be timed beside the filter's.
    #[cfg(not(krt_bpf_stub))]
    pub fn attach(&self, dir: &std::path::Path) -> Result<crate::cgroup_attach::CgroupLink> {
        let program = self.program().ok_or_else(|| EgressError::Load {
            errno: None,
            message: format!("the object has no program {FLOOR_PROGRAM}"),
            verifier_log: None,
        })?;
        Ok(crate::cgroup_attach::attach_egress(
            &program,
            FLOOR_PROGRAM,
            dir,
        )?)
    }

    #[cfg(not(krt_bpf_stub))]
    fn program(&self) -> Option<libbpf_rs::ProgramMut<'_>> {
        self.object
            .progs_mut()
            .find(|p| p.name().to_str() == Some(FLOOR_PROGRAM))
    }

    /// Attaches it: unreachable in a stub build (no handle exists).
    #[cfg(krt_bpf_stub)]
    pub fn attach(&self, _dir: &std::path::Path) -> Result<crate::cgroup_attach::CgroupLink> {
        Err(EgressError::NotBuilt)
    }

    /// Runs it: unreachable in a stub build (no handle exists).
    #[cfg(krt_bpf_stub)]
    pub fn test_run_repeat(&self, _frame: &[u8], _repeat: u32) -> Result<TimedRun> {
        Err(EgressError::NotBuilt)
    }
}

/// `BPF_PROG_TEST_RUN` of `program` on `frame`, `repeat` times.
#[cfg(not(krt_bpf_stub))]
pub(crate) fn timed(
    program: &libbpf_rs::ProgramMut<'_>,
    frame: &[u8],
    repeat: u32,
) -> Result<TimedRun> {
    let input = libbpf_rs::ProgramInput {
        data_in: Some(frame),
        repeat,
        ..libbpf_rs::ProgramInput::default()
    };
    program
        .test_run(input)
        .map(|out| TimedRun {
            verdict: out.return_value,
            per_run: out.duration,
        })
        .map_err(|e| EgressError::TestRun {
            errno: crate::sys::errno(&e),
            message: format!("{e:#}"),
        })
}
