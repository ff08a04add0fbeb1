//! The tracer against the kernel, through libbpf-rs's generic object API
//! (the `Object` owns its maps and program and is `Send + Sync`); the
//! skeleton supplies the layouts, checked against the decoder's offsets at
//! compile time.

use std::ffi::OsStr;
use std::mem::{offset_of, size_of};

use std::os::fd::AsFd;

use libbpf_rs::{Map, MapCore as _, MapFlags, MapHandle, Object, ObjectBuilder};

use super::{
    decode_exec, ExecRecord, ExecTraceError, ExecTraceStats, ARGC_AT, ARGV_AT, CGROUP_ID_AT,
    COMM_AT, FILENAME_AT, FLAGS_AT, PID_AT, PPID_AT, RECORDED_AT, RECORD_LEN, RESOLVED_AT,
    RESOLVED_COUNT_AT,
};
use crate::libbpf_log::Capture;
use crate::ring::RecordReader;
use crate::skel::exectrace::exec_trace::{types, OBJECT};
use crate::sys::errno;

const OBJECT_NAME: &str = "krt_exectrace";
const PROGRAM: &str = "krt_exec_trace";
const CGROUPS: &str = "krt_et_cgroups";
const EVENTS: &str = "krt_et_events";
const STATS: &str = "krt_et_stats";
const RESOLVED: &str = "oe_exec_resolved";

const _: () = {
    assert!(size_of::<types::krt_exec_record>() == RECORD_LEN);
    assert!(offset_of!(types::krt_exec_record, cgroup_id) == CGROUP_ID_AT);
    assert!(offset_of!(types::krt_exec_record, pid) == PID_AT);
    assert!(offset_of!(types::krt_exec_record, ppid) == PPID_AT);
    assert!(offset_of!(types::krt_exec_record, argc) == ARGC_AT);
    assert!(offset_of!(types::krt_exec_record, flags) == FLAGS_AT);
    assert!(offset_of!(types::krt_exec_record, recorded) == RECORDED_AT);
    assert!(offset_of!(types::krt_exec_record, comm) == COMM_AT);
    assert!(offset_of!(types::krt_exec_record, filename) == FILENAME_AT);
    assert!(offset_of!(types::krt_exec_record, argv) == ARGV_AT);
    assert!(offset_of!(types::krt_exec_record, resolved_count) == RESOLVED_COUNT_AT);
    assert!(offset_of!(types::krt_exec_record, resolved) == RESOLVED_AT);
};

fn layout(what: impl Into<String>) -> ExecTraceError {
    ExecTraceError::Layout { what: what.into() }
}

fn map_err(map: &'static str, op: &'static str, e: &libbpf_rs::Error) -> ExecTraceError {
    ExecTraceError::Map {
        map,
        op,
        errno: errno(e),
        message: format!("{e:#}"),
    }
}

#[derive(Debug)]
pub(super) struct Tracer {
    // Dropped before the object: detaches the program.
    _link: libbpf_rs::Link,
    object: Object,
}

impl Tracer {
    pub(super) fn load(resolved: Option<&MapHandle>) -> Result<Self, ExecTraceError> {
        let capture = Capture::start();
        let mut builder = ObjectBuilder::default();
        builder
            .name(OBJECT_NAME)
            .map_err(|e| ExecTraceError::Open {
                message: format!("{e:#}"),
            })?;
        let mut open = builder
            .open_memory(OBJECT)
            .map_err(|e| ExecTraceError::Open {
                message: format!("{e:#}"),
            })?;
        if let Some(shared) = resolved {
            let mut map = open
                .maps_mut()
                .find(|m| m.name() == OsStr::new(RESOLVED))
                .ok_or_else(|| layout(format!("no map {RESOLVED}")))?;
            map.reuse_fd(shared.as_fd())
                .map_err(|e| map_err(RESOLVED, "reuse", &e))?;
        }
        let object = open.load().map_err(|e| ExecTraceError::Load {
            errno: errno(&e),
            message: format!("{e:#}"),
            verifier_log: capture.log(),
        })?;
        drop(capture);
        let prog = object
            .progs_mut()
            .find(|p| p.name() == OsStr::new(PROGRAM))
            .ok_or_else(|| layout(format!("no program {PROGRAM}")))?;
        let link = prog.attach().map_err(|e| ExecTraceError::Attach {
            errno: errno(&e),
            message: format!("{e:#}"),
        })?;
        let tracer = Self {
            _link: link,
            object,
        };
        for name in [CGROUPS, EVENTS, STATS] {
            tracer.map(name)?;
        }
        Ok(tracer)
    }

    fn map(&self, name: &'static str) -> Result<Map<'_>, ExecTraceError> {
        self.object
            .maps()
            .find(|m| m.name() == OsStr::new(name))
            .ok_or_else(|| layout(format!("no map {name}")))
    }

    pub(super) fn admit(&self, cgroup_id: u64) -> Result<(), ExecTraceError> {
        if cgroup_id == 0 {
            return Err(ExecTraceError::InvalidCgroupId);
        }
        self.map(CGROUPS)?
            .update(&cgroup_id.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .map_err(|e| map_err(CGROUPS, "update", &e))
    }

    pub(super) fn revoke(&self, cgroup_id: u64) -> Result<bool, ExecTraceError> {
        if cgroup_id == 0 {
            return Err(ExecTraceError::InvalidCgroupId);
        }
        match self.map(CGROUPS)?.delete(&cgroup_id.to_ne_bytes()) {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(map_err(CGROUPS, "delete", &e)),
        }
    }

    pub(super) fn read_stats(&self) -> Result<ExecTraceStats, ExecTraceError> {
        let per_cpu = self
            .map(STATS)?
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| map_err(STATS, "lookup", &e))?
            .ok_or_else(|| layout(format!("map {STATS} has no value at key 0")))?;
        let field = |value: &[u8], at: usize| {
            value
                .get(at..at + size_of::<u64>())
                .and_then(|b| b.try_into().ok())
                .map(u64::from_ne_bytes)
                .ok_or_else(|| layout(format!("a per-CPU {STATS} value of {} bytes", value.len())))
        };
        let mut s = ExecTraceStats::default();
        for v in &per_cpu {
            s.ringbuf_full = s
                .ringbuf_full
                .saturating_add(field(v, offset_of!(types::krt_et_stats, ringbuf_full))?);
            s.argv_truncated = s
                .argv_truncated
                .saturating_add(field(v, offset_of!(types::krt_et_stats, argv_truncated))?);
            s.argv_unreadable = s
                .argv_unreadable
                .saturating_add(field(v, offset_of!(types::krt_et_stats, argv_unreadable))?);
        }
        Ok(s)
    }

    pub(super) fn reader(&self) -> Result<RecordReader<ExecRecord>, ExecTraceError> {
        let map = self.map(EVENTS)?;
        Ok(crate::ring::reader(EVENTS, &map, decode_exec)?)
    }
}
