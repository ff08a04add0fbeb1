//! The observer against the kernel.
//!
//! The object is loaded through libbpf-rs's generic object API, whose
//! `Object` owns its maps and program (no borrowed skeleton storage) and is
//! `Send + Sync`; the generated skeleton supplies the layouts (`types`),
//! checked against the decoder's offsets at compile time. No `unsafe` here.

use std::ffi::OsStr;
use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd as _;
use std::path::Path;

use libbpf_rs::{
    libbpf_sys, Map, MapCore as _, MapFlags, Object, ObjectBuilder, ProgramInput, ProgramMut,
    ProgramType,
};

use super::name::DOMAIN_KEY_LEN;
use super::{
    decode_query, DnsError, DnsQuestion, DnsStats, Result, CGROUP_ID_AT, QNAME_AT, RECORD_LEN,
};
use crate::libbpf_log::Capture;
use crate::ring::{RecordReader, RingError};
use crate::skel::dns::query::{types, OBJECT};
use crate::sys::errno;

/// Name given to the object; libbpf derives the `.rodata` map's from it.
const OBJECT_NAME: &str = "krt_dns";
/// Names in `bpf/dns/query.bpf.c`.
const PROGRAM: &str = "krt_dns_egress";
const CGIDS: &str = "krt_dns_cgids";
const EVENTS: &str = "krt_dns_events";
const STATS: &str = "krt_dns_stats";

// The decoder is pure and exists in stub builds too, so it carries its own
// offsets; they must be the skeleton's.
const _: () = {
    assert!(size_of::<types::dns_query_event>() == RECORD_LEN);
    assert!(offset_of!(types::dns_query_event, cgroup_id) == CGROUP_ID_AT);
    assert!(offset_of!(types::dns_query_event, qname) == QNAME_AT);
    assert!(size_of::<types::domain_key>() == DOMAIN_KEY_LEN);
};

fn open_err(e: &libbpf_rs::Error) -> DnsError {
    DnsError::Open {
        message: format!("{e:#}"),
    }
}

fn load_err(e: &libbpf_rs::Error) -> DnsError {
    DnsError::Load {
        errno: errno(e),
        message: format!("{e:#}"),
        verifier_log: None,
    }
}

fn map_err(map: &'static str, op: &'static str, e: &libbpf_rs::Error) -> DnsError {
    DnsError::Map {
        map,
        op,
        errno: errno(e),
        message: format!("{e:#}"),
    }
}

fn layout(what: impl Into<String>) -> DnsError {
    DnsError::Layout { what: what.into() }
}

/// Whether `cgroup_skb` programs may call `bpf_get_current_cgroup_id` on
/// this kernel. A probe that cannot run answers "no": the program then
/// keeps to `bpf_skb_cgroup_id`, which every supported kernel allows.
fn current_cgroup_helper_allowed() -> bool {
    ProgramType::CgroupSkb
        .is_helper_supported(libbpf_sys::BPF_FUNC_get_current_cgroup_id)
        .unwrap_or(false)
}

#[derive(Debug)]
pub(super) struct Observer {
    object: Object,
    current_cgroup_fallback: bool,
}

impl Observer {
    pub(super) fn load() -> Result<Self> {
        // Probed before the capture starts, so the capture holds only the
        // object's own log.
        let fallback = current_cgroup_helper_allowed();
        let capture = Capture::start();
        let object = open_and_load(fallback).map_err(|e| match e {
            DnsError::Load { errno, message, .. } => DnsError::Load {
                errno,
                message,
                verifier_log: capture.log(),
            },
            other => other,
        })?;
        drop(capture);
        let observer = Self {
            object,
            current_cgroup_fallback: fallback,
        };
        // Fail now, not at first use, if the object is not the one this
        // handle was written for.
        observer.program()?;
        for name in [CGIDS, EVENTS, STATS] {
            observer.map(name)?;
        }
        Ok(observer)
    }

    pub(super) fn uses_current_cgroup_fallback(&self) -> bool {
        self.current_cgroup_fallback
    }

    fn map(&self, name: &'static str) -> Result<Map<'_>> {
        self.object
            .maps()
            .find(|m| m.name() == OsStr::new(name))
            .ok_or_else(|| layout(format!("no map {name}")))
    }

    /// The program (the `Mut` flavour: libbpf-rs puts attaching and test
    /// runs there, though both only need the loaded program's fd).
    fn program(&self) -> Result<ProgramMut<'_>> {
        self.object
            .progs_mut()
            .find(|p| p.name() == OsStr::new(PROGRAM))
            .ok_or_else(|| layout(format!("no program {PROGRAM}")))
    }

    pub(super) fn admit(&self, cgroup_id: u64) -> Result<()> {
        if cgroup_id == 0 {
            return Err(DnsError::InvalidCgroupId);
        }
        self.map(CGIDS)?
            .update(&cgroup_id.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .map_err(|e| map_err(CGIDS, "update", &e))
    }

    pub(super) fn revoke(&self, cgroup_id: u64) -> Result<bool> {
        if cgroup_id == 0 {
            return Err(DnsError::InvalidCgroupId);
        }
        match self.map(CGIDS)?.delete(&cgroup_id.to_ne_bytes()) {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(map_err(CGIDS, "delete", &e)),
        }
    }

    pub(super) fn read_stats(&self) -> Result<DnsStats> {
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
                .ok_or_else(|| {
                    layout(format!(
                        "map {STATS} returned a per-CPU value of {} bytes",
                        value.len()
                    ))
                })
        };
        let mut stats = DnsStats::default();
        for value in &per_cpu {
            let full = field(value, offset_of!(types::dns_stats, ringbuf_full))?;
            let unreadable = field(value, offset_of!(types::dns_stats, name_unreadable))?;
            stats.ringbuf_full = stats.ringbuf_full.saturating_add(full);
            stats.name_unreadable = stats.name_unreadable.saturating_add(unreadable);
        }
        Ok(stats)
    }

    pub(super) fn attach(&self, dir: &Path) -> Result<Link> {
        let cgroup = File::open(dir).map_err(|e| DnsError::Cgroup {
            path: dir.to_owned(),
            errno: e.raw_os_error(),
            message: e.to_string(),
        })?;
        let link = self
            .program()?
            .attach_cgroup(cgroup.as_raw_fd())
            .map_err(|e| DnsError::Attach {
                path: dir.to_owned(),
                errno: errno(&e),
                message: format!("{e:#}"),
            })?;
        Ok(Link { _link: link })
    }

    pub(super) fn reader(&self) -> Result<RecordReader<DnsQuestion>> {
        let events = self.map(EVENTS)?;
        // The ring buffer maps the map's memory, which keeps the map alive
        // after `events` (and even the observer) is gone.
        crate::ring::reader(EVENTS, &events, decode_query).map_err(|e| match e {
            RingError::Setup { errno, message, .. } | RingError::Read { errno, message, .. } => {
                DnsError::RingBuffer {
                    op: "setup",
                    errno,
                    message,
                }
            }
        })
    }

    pub(super) fn test_run(&self, frame: &[u8]) -> Result<u32> {
        let input = ProgramInput {
            data_in: Some(frame),
            ..ProgramInput::default()
        };
        self.program()?
            .test_run(input)
            .map(|out| out.return_value)
            .map_err(|e| DnsError::TestRun {
                errno: errno(&e),
                message: format!("{e:#}"),
            })
    }
}

/// Opens the embedded object, tells it whether it may use the current
/// task's cgroup, and loads it.
fn open_and_load(current_cgroup_fallback: bool) -> Result<Object> {
    let mut builder = ObjectBuilder::default();
    builder.name(OBJECT_NAME).map_err(|e| open_err(&e))?;
    let mut open = builder.open_memory(OBJECT).map_err(|e| open_err(&e))?;
    let at = offset_of!(types::rodata, krt_dns_use_current_cgroup);
    let mut set = false;
    for mut map in open.maps_mut() {
        if !map.name().to_str().is_some_and(|n| n.ends_with(".rodata")) {
            continue;
        }
        let byte = map
            .initial_value_mut()
            .and_then(|data| data.get_mut(at))
            .ok_or_else(|| layout(".rodata is shorter than its skeleton type"))?;
        *byte = u8::from(current_cgroup_fallback);
        set = true;
    }
    if !set {
        return Err(layout("no .rodata map"));
    }
    open.load().map_err(|e| load_err(&e))
}

/// An attachment; detached when dropped.
#[derive(Debug)]
pub(super) struct Link {
    _link: libbpf_rs::Link,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_recovered_from_libbpf_errors() {
        use libbpf_rs::ErrorExt as _;
        let e = libbpf_rs::Error::from_raw_os_error(libc::E2BIG).context("update");
        assert_eq!(errno(&e), Some(libc::E2BIG));
        let e = libbpf_rs::Error::from(std::io::Error::other("bad ELF"));
        assert_eq!(errno(&e), None);
    }
}
