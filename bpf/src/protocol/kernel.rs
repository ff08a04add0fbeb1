//! The classifier against the kernel.
//!
//! The object is loaded through libbpf-rs's generic object API rather than
//! the generated skeleton: an [`Object`] owns its programs and maps (the
//! skeleton borrows caller-provided storage, which a long-lived handle
//! cannot hold without a self-referential struct), and it is `Send + Sync`.
//! The maps are kept as [`MapHandle`]s (owned fds); the skeleton still
//! supplies every layout (`key.rs`). No `unsafe` here.

use std::collections::HashSet;
use std::mem::offset_of;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use libbpf_rs::{
    libbpf_sys, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, ProgramInput, ProgramType,
};

use super::{key, ProtoEvent, ProtoFlags, ProtoKey, ProtoStats, ProtocolError, Result, Verdict};
use crate::cgroup_attach::{attach_egress, CgroupLink};
use crate::libbpf_log::Capture;
use crate::skel::protocol::classifier::{types, OBJECT};
use crate::sys::{self, errno};

/// Name given to the object; libbpf derives the `.rodata` map's from it.
const OBJECT_NAME: &str = "krt_proto";
/// Names in `classifier.bpf.c`.
const PROGRAM: &str = "krt_protocol";
const CGROUPS: &str = "proto_cgroups";
const ALLOWED: &str = "allowed_protos";
const BANNED: &str = "banned_protos";
const EVENTS: &str = "proto_events";
const STATS: &str = "proto_stats";
const GENERATION: &str = "proto_generation";

fn load_err(message: String) -> ProtocolError {
    ProtocolError::Load {
        errno: None,
        message,
        verifier_log: None,
    }
}

/// Locks `m` even if a panicking thread poisoned it: the data (a counter)
/// stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `cgroup_skb` programs may call `bpf_get_current_cgroup_id` on
/// this kernel (5.10 and 6.1 refuse it). A probe that cannot run answers
/// "no": the program then keeps to `bpf_skb_cgroup_id`, which every
/// supported kernel allows.
fn current_cgroup_helper_allowed() -> bool {
    ProgramType::CgroupSkb
        .is_helper_supported(libbpf_sys::BPF_FUNC_get_current_cgroup_id)
        .unwrap_or(false)
}

/// A map with the name its errors report.
#[derive(Debug)]
struct Map {
    name: &'static str,
    handle: MapHandle,
}

impl Map {
    fn err(&self, op: &'static str, e: &libbpf_rs::Error) -> ProtocolError {
        let errno = errno(e);
        match errno {
            // A full hash map says E2BIG.
            Some(libc::E2BIG | libc::ENOSPC) if op == "update" => ProtocolError::MapFull {
                map: self.name,
                max_entries: self.handle.max_entries(),
            },
            _ => ProtocolError::Map {
                map: self.name,
                op,
                errno,
                message: format!("{e:#}"),
            },
        }
    }

    fn update(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.handle
            .update(key, value, MapFlags::ANY)
            .map_err(|e| self.err("update", &e))
    }

    /// Deletes `key`; whether it was there.
    fn delete(&self, key: &[u8]) -> Result<bool> {
        match self.handle.delete(key) {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(self.err("delete", &e)),
        }
    }

    fn layout(&self, what: String) -> ProtocolError {
        ProtocolError::Layout {
            map: self.name,
            what,
        }
    }
}

#[derive(Debug)]
pub(super) struct Classifier {
    cgroups: Map,
    allowed: Map,
    banned: Map,
    events: Map,
    stats: Map,
    generation: Map,
    /// The last generation written; held while a change and its bump are
    /// made, so bumps reach the kernel in order.
    last_generation: Mutex<u64>,
    /// Keeps the program loaded (the maps are held by their own fds).
    object: Object,
}

impl Classifier {
    pub(super) fn load() -> Result<Self> {
        Self::load_with(false)
    }

    /// [`load`](Self::load), with the test hook that updates a gate between
    /// the program's reads (`krt_proto_test_update_between_reads`) set.
    #[cfg(feature = "host-tests")]
    pub(super) fn load_with_update_between_reads() -> Result<Self> {
        Self::load_with(true)
    }

    fn load_with(update_between_reads: bool) -> Result<Self> {
        // Probed before the capture starts, so the capture holds only the
        // object's own log.
        let fallback = current_cgroup_helper_allowed();
        let capture = Capture::start();
        let object = open_and_load(fallback, update_between_reads).map_err(|e| match e {
            ProtocolError::Load { errno, message, .. } => ProtocolError::Load {
                errno,
                message,
                verifier_log: capture.log(),
            },
            other => other,
        })?;
        drop(capture);

        let map = |name: &'static str| -> Result<Map> {
            let m = object
                .maps()
                .find(|m| m.name().to_str() == Some(name))
                .ok_or_else(|| load_err(format!("the object has no map {name}")))?;
            let handle = MapHandle::try_from(&m).map_err(|e| ProtocolError::Load {
                errno: errno(&e),
                message: format!("duplicating the fd of map {name}: {e:#}"),
                verifier_log: None,
            })?;
            Ok(Map { name, handle })
        };
        let classifier = Self {
            cgroups: map(CGROUPS)?,
            allowed: map(ALLOWED)?,
            banned: map(BANNED)?,
            events: map(EVENTS)?,
            stats: map(STATS)?,
            generation: map(GENERATION)?,
            last_generation: Mutex::new(0),
            object,
        };
        if classifier.program().is_none() {
            return Err(load_err(format!("the object has no program {PROGRAM}")));
        }
        Ok(classifier)
    }

    /// The program (mutable in libbpf-rs's terms only: a test run is a
    /// syscall on its fd).
    fn program(&self) -> Option<libbpf_rs::ProgramMut<'_>> {
        self.object
            .progs_mut()
            .find(|p| p.name().to_str() == Some(PROGRAM))
    }

    fn rules(&self, verdict: Verdict) -> &Map {
        match verdict {
            Verdict::Allow => &self.allowed,
            Verdict::Deny => &self.banned,
        }
    }

    /// Runs `change` (a map update) and then bumps `proto_generation`, so
    /// that cached verdicts are recomputed at their flows' next packet.
    /// The bump follows even a failed change: it may have half-happened
    /// (e.g. a delete that raced an insert), and a spurious bump only costs
    /// one recomputation per flow.
    fn changing<T>(&self, change: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut last = lock(&self.last_generation);
        let result = change();
        let next = last.wrapping_add(1);
        self.generation
            .update(&key::ZERO_KEY, &key::generation_value(next))?;
        *last = next;
        result
    }

    pub(super) fn set_filter(&self, cgroup_id: u64, set_id: u32, flags: ProtoFlags) -> Result<()> {
        if cgroup_id == 0 {
            return Err(ProtocolError::InvalidCgroupId);
        }
        self.changing(|| {
            self.cgroups
                .update(&key::cgroup_key(cgroup_id), &key::gate_value(set_id, flags))
        })
    }

    pub(super) fn remove_cgroup(&self, cgroup_id: u64) -> Result<bool> {
        self.changing(|| self.cgroups.delete(&key::cgroup_key(cgroup_id)))
    }

    pub(super) fn insert(&self, set_id: u32, verdict: Verdict, rule: ProtoKey) -> Result<()> {
        self.changing(|| {
            self.rules(verdict)
                .update(&key::rule_key(set_id, &rule), &key::RULE_VALUE)
        })
    }

    pub(super) fn remove(&self, set_id: u32, verdict: Verdict, rule: ProtoKey) -> Result<bool> {
        self.changing(|| self.rules(verdict).delete(&key::rule_key(set_id, &rule)))
    }

    pub(super) fn read_stats(&self) -> Result<ProtoStats> {
        let map = &self.stats;
        let per_cpu = map
            .handle
            .lookup_percpu(&key::ZERO_KEY, MapFlags::ANY)
            .map_err(|e| map.err("lookup", &e))?
            .ok_or_else(|| map.layout("no element 0".to_owned()))?;
        key::sum_stats(&per_cpu).ok_or_else(|| {
            map.layout(format!(
                "per-CPU values of {:?} bytes",
                per_cpu.iter().map(Vec::len).collect::<HashSet<_>>()
            ))
        })
    }

    pub(super) fn drain_events(&self) -> Result<Vec<ProtoEvent>> {
        let map = &self.events;
        // Snapshot the keys first (deleting while walking restarts the
        // walk), and decode them all before consuming anything: a key this
        // code cannot read fails the drain with the map intact.
        let keys = sys::unique_keys(&map.handle);
        let decoded = keys
            .iter()
            .map(|raw| {
                key::decode_event_key(raw)
                    .ok_or_else(|| map.layout(format!("an undecodable key {raw:02x?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let values = sys::take_each(&map.handle, &keys).map_err(|(op, e)| map.err(op, &e))?;
        let mut out = Vec::with_capacity(keys.len());
        for (decoded, value) in decoded.into_iter().zip(values) {
            // None: deleted since the snapshot (by a concurrent drain).
            let Some(value) = value else { continue };
            let count = key::decode_count(&value)
                .ok_or_else(|| map.layout(format!("a value of {} bytes", value.len())))?;
            if count > 0 {
                out.push(key::event(decoded, count));
            }
        }
        Ok(out)
    }

    pub(super) fn attach(&self, dir: &Path) -> Result<CgroupLink> {
        let program = self
            .program()
            .ok_or_else(|| load_err(format!("the object has no program {PROGRAM}")))?;
        Ok(attach_egress(&program, PROGRAM, dir)?)
    }

    pub(super) fn test_run_repeat(
        &self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<crate::egress::TimedRun> {
        let program = self
            .program()
            .ok_or_else(|| load_err(format!("the object has no program {PROGRAM}")))?;
        let input = ProgramInput {
            data_in: Some(frame),
            repeat,
            ..ProgramInput::default()
        };
        program
            .test_run(input)
            .map(|out| crate::egress::TimedRun {
                verdict: out.return_value,
                per_run: out.duration,
            })
            .map_err(|e| ProtocolError::TestRun {
                errno: errno(&e),
                message: format!("{e:#}"),
            })
    }

    pub(super) fn test_run(&self, frame: &[u8]) -> Result<u32> {
        let program = self.program().ok_or_else(|| ProtocolError::TestRun {
            errno: None,
            message: format!("the object has no program {PROGRAM}"),
        })?;
        let input = ProgramInput {
            data_in: Some(frame),
            ..ProgramInput::default()
        };
        program
            .test_run(input)
            .map(|out| out.return_value)
            .map_err(|e| ProtocolError::TestRun {
                errno: errno(&e),
                message: format!("{e:#}"),
            })
    }
}

/// Opens the embedded object, tells it whether it may use the current
/// task's cgroup (and whether to run the test hook), and loads it.
fn open_and_load(current_cgroup_fallback: bool, update_between_reads: bool) -> Result<Object> {
    let open_err = |e: libbpf_rs::Error| ProtocolError::Open {
        message: format!("{e:#}"),
    };
    let layout = |what: &str| ProtocolError::Layout {
        map: ".rodata",
        what: what.to_owned(),
    };
    let mut builder = ObjectBuilder::default();
    builder.name(OBJECT_NAME).map_err(open_err)?;
    let mut open = builder.open_memory(OBJECT).map_err(open_err)?;
    let knobs = [
        (
            offset_of!(types::rodata, krt_proto_use_current_cgroup),
            current_cgroup_fallback,
        ),
        (
            offset_of!(types::rodata, krt_proto_test_update_between_reads),
            update_between_reads,
        ),
    ];
    let mut set = false;
    for mut map in open.maps_mut() {
        if !map.name().to_str().is_some_and(|n| n.ends_with(".rodata")) {
            continue;
        }
        let data = map
            .initial_value_mut()
            .ok_or_else(|| layout("a value shorter than its skeleton type"))?;
        for (at, value) in knobs {
            let byte = data
                .get_mut(at)
                .ok_or_else(|| layout("a value shorter than its skeleton type"))?;
            *byte = u8::from(value);
        }
        set = true;
    }
    if !set {
        return Err(layout("nothing: the object has no .rodata map"));
    }
    open.load().map_err(|e| ProtocolError::Load {
        errno: errno(&e),
        message: format!("{e:#}"),
        verifier_log: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::ErrorExt as _;

    #[test]
    fn errno_is_recovered_from_libbpf_errors() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::E2BIG).context("update");
        assert_eq!(errno(&e), Some(libc::E2BIG));
        let e = libbpf_rs::Error::from(std::io::Error::other("bad ELF"));
        assert_eq!(errno(&e), None);
    }
}
