//! The egress filter against the kernel.
//!
//! The object is loaded through libbpf-rs's generic API rather than the
//! generated skeleton: an [`Object`] owns its programs and maps (the
//! skeleton borrows caller-provided storage, which a long-lived handle
//! cannot hold without a self-referential struct), and it is `Send + Sync`.
//! The maps are kept as [`MapHandle`]s (owned fds); the skeleton still
//! supplies every layout (`key.rs`). No `unsafe` here.

use std::collections::HashSet;
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, ProgramInput};

use super::{key, EgressError, FilterFlags, Observation, Prefix, Result, Stats, Verdict};
use crate::cgroup_attach::{attach_egress, CgroupLink};
use crate::libbpf_log::Capture;
use crate::skel::egress::egress_filter;
use crate::sys::{self, errno};

/// The program's name in `egress_filter.bpf.c`.
const PROGRAM: &str = "krt_egress";

/// Map names in `egress_filter.bpf.c`.
const CGROUP_FILTERS: &str = "cgroup_filters";
const ALLOW_V4: &str = "allow_v4";
const DENY_V4: &str = "deny_v4";
const ALLOW_V6: &str = "allow_v6";
const DENY_V6: &str = "deny_v6";
const OBSERVATIONS: &str = "observations";
const STATS: &str = "stats";

#[derive(Debug)]
pub(super) struct Filter {
    cgroup_filters: Map,
    allow_v4: Map,
    deny_v4: Map,
    allow_v6: Map,
    deny_v6: Map,
    observations: Map,
    stats: Map,
    /// Keeps the program loaded (the maps are held by their own fds).
    object: Object,
}

/// A map with the name its errors report.
#[derive(Debug)]
struct Map {
    name: &'static str,
    handle: MapHandle,
}

impl Map {
    fn err(&self, op: &'static str, e: &libbpf_rs::Error) -> EgressError {
        let errno = errno(e);
        match errno {
            // Hash maps say E2BIG when full, LPM tries ENOSPC.
            Some(libc::E2BIG | libc::ENOSPC) if op == "update" => EgressError::MapFull {
                map: self.name,
                max_entries: self.handle.max_entries(),
            },
            _ => EgressError::Map {
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

    fn layout(&self, what: String) -> EgressError {
        EgressError::Layout {
            map: self.name,
            what,
        }
    }
}

impl Filter {
    pub(super) fn load() -> Result<Self> {
        let capture = Capture::start();
        Self::open_and_load().map_err(|e| match e {
            EgressError::Load {
                errno,
                message,
                verifier_log: _,
            } => EgressError::Load {
                errno,
                message,
                verifier_log: capture.log(),
            },
            other => other,
        })
    }

    fn open_and_load() -> Result<Self> {
        let open = ObjectBuilder::default()
            .open_memory(egress_filter::OBJECT)
            .map_err(|e| EgressError::Open {
                message: format!("{e:#}"),
            })?;
        let object = open.load().map_err(|e| EgressError::Load {
            errno: errno(&e),
            message: format!("{e:#}"),
            verifier_log: None,
        })?;
        let map = |name: &'static str| -> Result<Map> {
            let m = object
                .maps()
                .find(|m| m.name().to_str() == Some(name))
                .ok_or_else(|| EgressError::Load {
                    errno: None,
                    message: format!("the object has no map {name}"),
                    verifier_log: None,
                })?;
            let handle = MapHandle::try_from(&m).map_err(|e| EgressError::Load {
                errno: errno(&e),
                message: format!("duplicating the fd of map {name}: {e:#}"),
                verifier_log: None,
            })?;
            Ok(Map { name, handle })
        };
        let filter = Self {
            cgroup_filters: map(CGROUP_FILTERS)?,
            allow_v4: map(ALLOW_V4)?,
            deny_v4: map(DENY_V4)?,
            allow_v6: map(ALLOW_V6)?,
            deny_v6: map(DENY_V6)?,
            observations: map(OBSERVATIONS)?,
            stats: map(STATS)?,
            object,
        };
        if filter.program().is_none() {
            return Err(EgressError::Load {
                errno: None,
                message: format!("the object has no program {PROGRAM}"),
                verifier_log: None,
            });
        }
        Ok(filter)
    }

    /// The program (mutable in libbpf-rs's terms only: a test run is a
    /// syscall on its fd).
    fn program(&self) -> Option<libbpf_rs::ProgramMut<'_>> {
        self.object
            .progs_mut()
            .find(|p| p.name().to_str() == Some(PROGRAM))
    }

    fn trie(&self, verdict: Verdict, prefix: &Prefix) -> &Map {
        match (verdict, prefix.addr().is_ipv4()) {
            (Verdict::Allow, true) => &self.allow_v4,
            (Verdict::Deny, true) => &self.deny_v4,
            (Verdict::Allow, false) => &self.allow_v6,
            (Verdict::Deny, false) => &self.deny_v6,
        }
    }

    pub(super) fn set_filter(&self, cgroup_id: u64, set_id: u32, flags: FilterFlags) -> Result<()> {
        if cgroup_id == 0 {
            return Err(EgressError::InvalidCgroupId);
        }
        self.cgroup_filters.update(
            &key::cgroup_key(cgroup_id),
            &key::filter_value(set_id, flags),
        )
    }

    pub(super) fn remove_cgroup(&self, cgroup_id: u64) -> Result<bool> {
        self.cgroup_filters.delete(&key::cgroup_key(cgroup_id))
    }

    pub(super) fn insert(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<()> {
        self.trie(verdict, &prefix)
            .update(&key::trie_key(set_id, &prefix), &key::TRIE_VALUE)
    }

    pub(super) fn remove(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<bool> {
        self.trie(verdict, &prefix)
            .delete(&key::trie_key(set_id, &prefix))
    }

    pub(super) fn read_stats(&self) -> Result<Stats> {
        let map = &self.stats;
        let per_cpu = map
            .handle
            .lookup_percpu(&key::STATS_KEY, MapFlags::ANY)
            .map_err(|e| map.err("lookup", &e))?
            .ok_or_else(|| map.layout("no element 0".to_owned()))?;
        key::sum_stats(&per_cpu).ok_or_else(|| {
            map.layout(format!(
                "per-CPU values of {:?} bytes",
                per_cpu.iter().map(Vec::len).collect::<HashSet<_>>()
            ))
        })
    }

    pub(super) fn drain_observations(&self) -> Result<Vec<Observation>> {
        let map = &self.observations;
        // Snapshot the keys first (deleting while walking restarts the
        // walk), and decode them all before consuming anything: a key this
        // code cannot read fails the drain with the map intact.
        let keys = sys::unique_keys(&map.handle);
        let decoded = keys
            .iter()
            .map(|raw| {
                key::decode_observation_key(raw)
                    .ok_or_else(|| map.layout(format!("an undecodable key {raw:02x?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let values = sys::take_each(&map.handle, &keys).map_err(|(op, e)| map.err(op, &e))?;
        let mut out = Vec::with_capacity(keys.len());
        for (decoded, value) in decoded.into_iter().zip(values) {
            // None: evicted since the snapshot (its count is gone).
            let Some(value) = value else { continue };
            let count = key::decode_count(&value)
                .ok_or_else(|| map.layout(format!("a value of {} bytes", value.len())))?;
            if count > 0 {
                out.push(key::observation(decoded, count));
            }
        }
        Ok(out)
    }

    pub(super) fn attach(&self, dir: &Path) -> Result<CgroupLink> {
        let program = self.program().ok_or_else(|| EgressError::Load {
            errno: None,
            message: format!("the object has no program {PROGRAM}"),
            verifier_log: None,
        })?;
        Ok(attach_egress(&program, PROGRAM, dir)?)
    }

    pub(super) fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<super::TimedRun> {
        let program = self.program().ok_or_else(|| EgressError::TestRun {
            errno: None,
            message: format!("the object has no program {PROGRAM}"),
        })?;
        super::bench::timed(&program, frame, repeat)
    }

    pub(super) fn test_run(&self, frame: &[u8]) -> Result<u32> {
        let program = self.program().ok_or_else(|| EgressError::TestRun {
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
            .map_err(|e| EgressError::TestRun {
                errno: errno(&e),
                message: format!("{e:#}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::ErrorExt as _;

    #[test]
    fn errno_is_recovered_from_libbpf_errors() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::ENOSPC).context("update");
        assert_eq!(errno(&e), Some(libc::ENOSPC));
        let e = libbpf_rs::Error::from(std::io::Error::other("bad ELF"));
        assert_eq!(errno(&e), None);
    }
}
