//! The egress filter against the kernel.
//!
//! The object is loaded through libbpf-rs's generic API rather than the
//! generated skeleton: an [`Object`] owns its programs and maps (the
//! skeleton borrows caller-provided storage, which a long-lived handle
//! cannot hold without a self-referential struct), and it is `Send + Sync`.
//! The maps are kept as [`MapHandle`]s (owned fds); the skeleton still
//! supplies every layout (`key.rs`). No `unsafe` here.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::hash::{BuildHasher as _, RandomState};
use std::net::IpAddr;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use libbpf_rs::query::LinkTypeInfo;
use libbpf_rs::{
    Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, OpenObject, ProgramInput,
};

use super::{
    key, Domain, DomainVerdicts, EgressError, FilterFlags, Learned, LedgerKind, Observation,
    PinOutcome, PinnedLinks, PinnedState, Prefix, Result, SnoopStats, Stats, Verdict,
};
use crate::cgroup_attach::{attach_egress, CgroupLink};
use crate::libbpf_log::Capture;
use crate::pins;
use crate::skel::dnssnoop::snoop;
use crate::skel::egress::egress_filter;
use crate::sys::{self, errno};

/// The program's name in `egress_filter.bpf.c`.
const PROGRAM: &str = "krt_egress";
/// The snooper's program in `dnssnoop/snoop.bpf.c`.
const SNOOP_PROGRAM: &str = "krt_dns_snoop";

/// Map names in `egress_filter.bpf.c`.
const CGROUP_FILTERS: &str = "cgroup_filters";
const ALLOW_V4: &str = "allow_v4";
const DENY_V4: &str = "deny_v4";
const ALLOW_V6: &str = "allow_v6";
const DENY_V6: &str = "deny_v6";
const HOSTS: &str = "egress_hosts";
const OBSERVATIONS: &str = "observations";
const STATS: &str = "stats";
const META: &str = "egress_meta";
const POLICIES: &str = "egress_policies";
const RULES: &str = "egress_rules";
const BINDINGS: &str = "egress_bindings";
const DOMAINS: &str = "egress_domains";
const LEARNED: &str = "egress_learned";
const DOMAIN_RULES: &str = "egress_domain_rules";
/// Each set's share of `egress_learned` (not pinned: written at every
/// load).
const LEARNED_SHARE: &str = "learned_share";
/// What each set added to `egress_learned` (the snooper's side) and what
/// userspace removed of it.
const LEARNED_BUDGET: &str = "learned_budget";
const LEARNED_RELEASED: &str = "learned_released";
/// The generations cached verdicts are checked against (not pinned: a
/// new load starts a new socket cache too).
const GENERATION: &str = "egress_generation";
/// The snooper's counters, the question side added by the filter (not
/// pinned: counters since load).
const SNOOP_STATS: &str = "snoop_stats";
/// The declared resolvers (`dnsquestion.h`; not pinned: written at every
/// start).
const RESOLVERS: &str = "dns_resolvers";
/// The pending DNS questions (not pinned: a new load starts with none).
const QUESTIONS: &str = "dns_questions";
/// The DNS questions each cgroup noted this second (the filter's own).
const QUESTION_BUDGET: &str = "dns_question_budget";
/// The drain epoch and each set's share of `observations` (not pinned).
const OBSERVE_SHARE: &str = "observe_share";
/// Each set's use of its share (not pinned).
const OBSERVE_BUDGET: &str = "observe_budget";

/// The filter's maps the snooper object declares too (`egress_maps.h`)
/// and reuses instead of creating.
const SHARED_WITH_SNOOP: [&str; 10] = [
    CGROUP_FILTERS,
    DOMAINS,
    LEARNED,
    LEARNED_SHARE,
    LEARNED_BUDGET,
    LEARNED_RELEASED,
    GENERATION,
    RESOLVERS,
    QUESTIONS,
    SNOOP_STATS,
];

/// Every map pinned (all of the object's but libbpf's internal `.bss`, the
/// generations, the per-socket verdict cache and its seen-once slots, and
/// the DNS question side, which a new load starts afresh): the pin layout's (`crate::pins`), the one list the removal knows too.
const PINNED_MAPS: [&str; 17] = pins::EGRESS_MAPS;

/// Subdirectories of a pin directory.
const MAPS_DIR: &str = pins::EGRESS_MAPS_DIR;
const LINKS_DIR: &str = pins::EGRESS_LINKS_DIR;
const SNOOP_LINKS_DIR: &str = pins::EGRESS_SNOOP_LINKS_DIR;
/// Suffix of a link pin staged before its rename over the real one (bpffs
/// names cannot hold a `.`).
const STAGED: &str = pins::STAGED_SUFFIX;

#[derive(Debug)]
pub(super) struct Filter {
    cgroup_filters: Map,
    allow_v4: Map,
    deny_v4: Map,
    allow_v6: Map,
    deny_v6: Map,
    hosts: Map,
    observations: Map,
    /// Keys of `observations` the drains removed since load (see
    /// [`super::Evictions`]).
    observations_taken: AtomicU64,
    stats: Map,
    meta: Map,
    policies: Map,
    rules: Map,
    bindings: Map,
    domains: Map,
    learned: Map,
    /// Each set's share of `learned` and its use (see `egress_maps.h`).
    learned_share: Map,
    learned_budget: Map,
    learned_released: Map,
    /// A bound on the share below the equal one, if set
    /// ([`super::EgressFilter::cap_learned_share`]).
    learned_cap: AtomicU64,
    domain_rules: Map,
    /// The snooper's maps this object creates (see [`SHARED_WITH_SNOOP`]).
    resolvers: Map,
    questions: Map,
    snoop_stats: Map,
    /// Per-cgroup question budgets, reset when a cgroup is removed.
    question_budget: Map,
    /// The drain epoch and the per-set share of `observations`, and each
    /// set's use of it.
    observe_share: Map,
    observe_budget: Map,
    /// The drain epoch last written.
    observe_epoch: AtomicU64,
    /// `egress_generation`, shared with the snooper.
    generation: Arc<PolicyGeneration>,
    /// What the occupancy bits of `cgroup_filters` are computed from.
    occupancy: Mutex<Occupancy>,
    /// The DNS answer snooper over this filter's maps, or why the kernel
    /// refused it.
    snoop: std::result::Result<Snoop, EgressError>,
    /// The pin directory, when loaded with one.
    pin_dir: Option<PathBuf>,
    outcome: PinOutcome,
    /// Found at load, until the caller takes them.
    pinned_links: PinnedLinks,
    /// Keeps the program loaded (the maps are held by their own fds).
    object: Object,
}

/// What the handle knows of every set's entries and of the cgroups using
/// each set, to keep the occupancy bits of their `cgroup_filters` entries
/// (`key::Slot`) current: the program skips the host map, or a trie, that
/// the cgroup's flags say its set has no entries in.
///
/// A bit is set on every cgroup of the set *before* the set's first entry
/// of its slot is written, and cleared after its last one is removed, so a
/// set's entry is never skipped; a bit left over (a failed clear) costs a
/// lookup that misses, never a verdict. Every write of the entry maps and
/// of `cgroup_filters` happens under the lock, in that order.
#[derive(Debug, Default)]
struct Occupancy {
    /// Entries per set, by `Slot::index` (an `egress_hosts` key on both
    /// lists counts once).
    counts: HashMap<u32, [u32; 6]>,
    /// `cgroup_filters` as written: cgroup id to its set and flags.
    cgroups: HashMap<u64, (u32, FilterFlags)>,
    /// Cgroups per set in `cgroups` (the sets in use: the divisor of the
    /// observation share).
    set_users: HashMap<u32, u32>,
}

impl Occupancy {
    /// One cgroup fewer uses `set_id`; whether that was its last.
    fn set_unused(&mut self, set_id: u32) -> bool {
        let Some(n) = self.set_users.get_mut(&set_id) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.set_users.remove(&set_id);
            return true;
        }
        false
    }

    /// The occupancy bits of set `set_id`.
    fn bits(&self, set_id: u32) -> u32 {
        let Some(counts) = self.counts.get(&set_id) else {
            return 0;
        };
        key::Slot::ALL
            .iter()
            .filter(|slot| counts[slot.index()] > 0)
            .fold(0, |bits, slot| bits | slot.flag())
    }

    fn count(&self, set_id: u32, slot: key::Slot) -> u32 {
        self.counts.get(&set_id).map_or(0, |c| c[slot.index()])
    }

    fn added(&mut self, set_id: u32, slot: key::Slot) {
        let n = &mut self.counts.entry(set_id).or_default()[slot.index()];
        *n = n.saturating_add(1);
    }

    fn removed(&mut self, set_id: u32, slot: key::Slot) {
        if let Some(counts) = self.counts.get_mut(&set_id) {
            let n = &mut counts[slot.index()];
            *n = n.saturating_sub(1);
            if counts.iter().all(|n| *n == 0) {
                self.counts.remove(&set_id);
            }
        }
    }
}

/// A map with the name its errors report.
#[derive(Debug)]
struct Map {
    name: &'static str,
    handle: MapHandle,
    /// Set for `cgroup_filters`: every change to it writes a new policy
    /// generation, so no socket keeps a cached verdict the change could
    /// alter. (The entry maps advance it through
    /// `Filter::entries_changed`, only for sets some cgroup uses.)
    generation: Option<Arc<PolicyGeneration>>,
}

/// The userspace slot of `egress_generation` (`KRT_EGRESS_GEN_POLICY`).
///
/// Each change writes a value that never repeats rather than a count:
/// the kernel copies an array value with `memcpy`, which a program on
/// another CPU may read half written, and a half-old, half-new count could
/// equal an older count that some socket cached. Keyed SipHash of a counter
/// (the key random per load) gives values that neither repeat nor mix into
/// an older one in practice.
#[derive(Debug)]
struct PolicyGeneration {
    handle: MapHandle,
    /// The hash key and the number of changes so far; the lock also
    /// orders the writes, so a later value is never overwritten by an
    /// earlier one.
    state: Mutex<(RandomState, u64)>,
}

impl PolicyGeneration {
    fn new(handle: MapHandle) -> Self {
        Self {
            handle,
            state: Mutex::new((RandomState::new(), 0)),
        }
    }

    /// Writes a new generation: every socket's cached verdict is decided
    /// again at its next packet.
    fn advance(&self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1 += 1;
        let value = state.0.hash_one(state.1);
        self.handle
            .update(
                &key::GENERATION_POLICY_KEY,
                &value.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| EgressError::Map {
                map: GENERATION,
                op: "update",
                errno: errno(&e),
                message: format!("{e:#}"),
            })
    }
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

    /// After a change: a new policy generation if verdicts read this map.
    fn changed(&self) -> Result<()> {
        self.generation.as_ref().map_or(Ok(()), |g| g.advance())
    }

    fn update(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.handle
            .update(key, value, MapFlags::ANY)
            .map_err(|e| self.err("update", &e))?;
        self.changed()
    }

    /// Inserts `key` unless it is there (for an LPM trie: that exact
    /// prefix); whether it was inserted.
    fn insert_new(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        match self.handle.update(key, value, MapFlags::NO_EXIST) {
            Ok(()) => self.changed().map(|()| true),
            Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(self.err("update", &e)),
        }
    }

    fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.handle
            .lookup(key, MapFlags::ANY)
            .map_err(|e| self.err("lookup", &e))
    }

    /// The `u64` count under `key` (a value of another size is a layout
    /// error).
    fn lookup_count(&self, key: &[u8]) -> Result<Option<u64>> {
        self.lookup(key)?
            .map(|v| {
                key::decode_count(&v)
                    .ok_or_else(|| self.layout(format!("a value of {} bytes", v.len())))
            })
            .transpose()
    }

    /// Deletes `key`; whether it was there.
    fn delete(&self, key: &[u8]) -> Result<bool> {
        match self.handle.delete(key) {
            Ok(()) => self.changed().map(|()| true),
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

    /// Every key, each once.
    fn keys(&self) -> Vec<Vec<u8>> {
        sys::unique_keys(&self.handle)
    }
}

/// The loaded snooper: its object (program and private maps) and its
/// counters.
#[derive(Debug)]
struct Snoop {
    stats: Map,
    object: Object,
}

impl Snoop {
    /// Loads the snooper object over `filter`'s shared maps
    /// ([`SHARED_WITH_SNOOP`]); every one of them must be reused, so the
    /// snooper can never write maps the filter does not read.
    fn load(filter: &Filter, capture: &Capture) -> Result<Self> {
        let mut open = ObjectBuilder::default()
            .open_memory(snoop::OBJECT)
            .map_err(|e| EgressError::Open {
                message: format!("{e:#}"),
            })?;
        let mut reused = Vec::new();
        for mut map in open.maps_mut() {
            let Some((name, shared)) = map.name().to_str().and_then(|name| filter.shared_map(name))
            else {
                continue;
            };
            map.reuse_fd(shared.as_fd())
                .map_err(|e| EgressError::Load {
                    errno: errno(&e),
                    message: format!("reusing map {name} for the snooper: {e:#}"),
                    verifier_log: None,
                })?;
            reused.push(name);
        }
        if let Some(missing) = SHARED_WITH_SNOOP.iter().find(|m| !reused.contains(m)) {
            return Err(EgressError::Load {
                errno: None,
                message: format!("the snooper object declares no map {missing}"),
                verifier_log: None,
            });
        }
        let object = open.load().map_err(|e| EgressError::Load {
            errno: errno(&e),
            message: format!("{e:#}"),
            verifier_log: capture.log(),
        })?;
        let stats = object
            .maps()
            .find(|m| m.name().to_str() == Some(SNOOP_STATS))
            .ok_or_else(|| EgressError::Load {
                errno: None,
                message: format!("the snooper object has no map {SNOOP_STATS}"),
                verifier_log: None,
            })
            .and_then(|m| {
                MapHandle::try_from(&m).map_err(|e| EgressError::Load {
                    errno: errno(&e),
                    message: format!("duplicating the fd of map {SNOOP_STATS}: {e:#}"),
                    verifier_log: None,
                })
            })?;
        let snoop = Self {
            stats: Map {
                name: SNOOP_STATS,
                handle: stats,
                generation: None,
            },
            object,
        };
        if snoop.program().is_none() {
            return Err(EgressError::Load {
                errno: None,
                message: format!("the snooper object has no program {SNOOP_PROGRAM}"),
                verifier_log: None,
            });
        }
        Ok(snoop)
    }

    fn program(&self) -> Option<libbpf_rs::ProgramMut<'_>> {
        self.object
            .progs_mut()
            .find(|p| p.name().to_str() == Some(SNOOP_PROGRAM))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`,
/// which learned entries expire by.
fn monotonic_ns() -> Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_err(|e| {
        EgressError::Map {
            map: LEARNED,
            op: "clock_gettime",
            errno: Some(e as i32),
            message: e.to_string(),
        }
    })?;
    let secs = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

fn pin_err(path: &Path, message: impl std::fmt::Display) -> EgressError {
    EgressError::Pin {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn load_err(e: &libbpf_rs::Error) -> EgressError {
    EgressError::Load {
        errno: errno(e),
        message: format!("{e:#}"),
        verifier_log: None,
    }
}

/// Removes the file at `path`; a missing one is not an error.
fn remove_pin(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(pin_err(path, e)),
        _ => Ok(()),
    }
}

/// Removes the map pins of the layout under `maps_dir` (anything else
/// there is not ours and stays). Only the map pins: the links keep their
/// maps alive (through their program) and keep enforcing until they are
/// replaced or released.
fn remove_map_pins(maps_dir: &Path) -> Result<()> {
    for name in PINNED_MAPS {
        remove_pin(&maps_dir.join(name))?;
    }
    Ok(())
}

/// The layout version in the `egress_meta` pin under `maps_dir`; `None`
/// when there is no such pin.
fn read_layout_version(maps_dir: &Path) -> Result<Option<u32>> {
    let path = maps_dir.join(META);
    if !path.exists() {
        return Ok(None);
    }
    let handle =
        MapHandle::from_pinned_path(&path).map_err(|e| pin_err(&path, format!("{e:#}")))?;
    let value = handle
        .lookup(&key::META_KEY, MapFlags::ANY)
        .map_err(|e| pin_err(&path, format!("{e:#}")))?
        .ok_or_else(|| pin_err(&path, "no element 0"))?;
    key::decode_meta(&value)
        .map(Some)
        .ok_or_else(|| pin_err(&path, format!("a value of {} bytes", value.len())))
}

/// Why the map pins under `maps_dir` cannot be adopted by `open`'s maps,
/// or `None` if they can (or nothing is pinned).
fn incompatible_pins(open: &OpenObject, maps_dir: &Path) -> Option<String> {
    let present: Vec<&str> = PINNED_MAPS
        .into_iter()
        .filter(|name| maps_dir.join(name).exists())
        .collect();
    if present.is_empty() {
        return None;
    }
    match read_layout_version(maps_dir) {
        Ok(Some(v)) if v == key::LAYOUT_VERSION => {}
        Ok(Some(v)) => {
            return Some(format!(
                "the pins are of layout version {v}; this build reads and writes version {}",
                key::LAYOUT_VERSION
            ))
        }
        Ok(None) => return Some(format!("the pins have no {META} (an incomplete set)")),
        Err(e) => return Some(format!("the layout version cannot be read: {e}")),
    }
    let missing: Vec<&str> = PINNED_MAPS
        .into_iter()
        .filter(|name| !present.contains(name))
        .collect();
    if !missing.is_empty() {
        return Some(format!("pinned maps missing: {}", missing.join(", ")));
    }
    for map in open.maps() {
        let Some(name) = map.name().to_str() else {
            continue;
        };
        if !PINNED_MAPS.contains(&name) {
            continue;
        }
        let path = maps_dir.join(name);
        let info = match MapHandle::from_pinned_path(&path).and_then(|h| h.info()) {
            Ok(info) => info.info,
            Err(e) => return Some(format!("pinned map {name} cannot be read: {e:#}")),
        };
        let want = (
            u32::from(map.map_type()),
            map.key_size(),
            map.value_size(),
            map.max_entries(),
            map.map_flags(),
        );
        let have = (
            info.type_,
            info.key_size,
            info.value_size,
            info.max_entries,
            info.map_flags,
        );
        if want != have {
            return Some(format!(
                "pinned map {name} has (type, key size, value size, max entries, flags) \
                 {have:?}; this build's has {want:?}"
            ));
        }
    }
    None
}

impl Filter {
    pub(super) fn load(pin_dir: Option<&Path>) -> Result<Self> {
        let capture = Capture::start();
        let loaded = match pin_dir {
            None => Self::open()
                .and_then(|open| Self::load_open(open, &capture))
                .map(|f| Self {
                    outcome: PinOutcome::Unpinned,
                    ..f
                }),
            Some(dir) => Self::load_pinned(dir, &capture),
        };
        loaded.map_err(|e| match e {
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

    pub(super) fn discard_pinned_maps(dir: &Path) -> Result<()> {
        remove_map_pins(&dir.join(MAPS_DIR))
    }

    pub(super) fn pinned_layout_version(dir: &Path) -> Result<Option<u32>> {
        read_layout_version(&dir.join(MAPS_DIR))
    }

    pub(super) fn set_pinned_layout_version(dir: &Path, version: u32) -> Result<()> {
        let path = dir.join(MAPS_DIR).join(META);
        let handle =
            MapHandle::from_pinned_path(&path).map_err(|e| pin_err(&path, format!("{e:#}")))?;
        handle
            .update(&key::META_KEY, &key::meta_value(version), MapFlags::ANY)
            .map_err(|e| pin_err(&path, format!("{e:#}")))
    }

    fn open() -> Result<OpenObject> {
        ObjectBuilder::default()
            .open_memory(egress_filter::OBJECT)
            .map_err(|e| EgressError::Open {
                message: format!("{e:#}"),
            })
    }

    /// Loads over the pins under `dir` (see the module docs of `egress`):
    /// checks them, discards them if this object cannot read them, reuses
    /// or creates the maps, then adopts the pinned links.
    fn load_pinned(dir: &Path, capture: &Capture) -> Result<Self> {
        let maps_dir = dir.join(MAPS_DIR);
        let links_dir = dir.join(LINKS_DIR);
        let snoop_links_dir = dir.join(SNOOP_LINKS_DIR);
        // Marked as ours before the first pin goes in (and refused when it
        // is not a bpffs directory of this layout).
        pins::claim(dir, &pins::EGRESS).map_err(|e| pin_err(dir, e))?;
        for d in [&maps_dir, &links_dir, &snoop_links_dir] {
            fs::create_dir_all(d).map_err(|e| pin_err(d, e))?;
        }
        let mut open = Self::open()?;
        let discarded = incompatible_pins(&open, &maps_dir);
        if discarded.is_some() {
            remove_map_pins(&maps_dir)?;
        }
        let adopting = discarded.is_none() && maps_dir.join(META).exists();
        for mut map in open.maps_mut() {
            let name = map.name().to_str().unwrap_or_default().to_owned();
            if PINNED_MAPS.contains(&name.as_str()) {
                let path = maps_dir.join(&name);
                // libbpf reuses the map pinned there (it was checked
                // above), or creates the map and pins it.
                map.set_pin_path(&path)
                    .map_err(|e| pin_err(&path, format!("{e:#}")))?;
            }
        }
        let mut filter = Self::load_open(open, capture)?;
        filter.pin_dir = Some(dir.to_owned());
        filter.outcome = match discarded {
            Some(reason) => PinOutcome::Discarded { reason },
            None if adopting => PinOutcome::Adopted,
            None => PinOutcome::Fresh,
        };
        if adopting {
            filter.adopt_occupancy()?;
        } else {
            // Written last: maps pinned without it read as an incomplete
            // set and are discarded by the next load.
            filter
                .meta
                .update(&key::META_KEY, &key::meta_value(key::LAYOUT_VERSION))?;
        }
        filter.pinned_links = filter.open_pinned_links(&links_dir, adopting, false)?;
        let snoop_links = filter.open_pinned_links(&snoop_links_dir, adopting, true)?;
        filter.pinned_links.snoop_adopted = snoop_links.adopted;
        filter.pinned_links.snoop_stale = snoop_links.stale;
        Ok(filter)
    }

    fn load_open(open: OpenObject, capture: &Capture) -> Result<Self> {
        let object = open.load().map_err(|e| load_err(&e))?;
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
            Ok(Map {
                name,
                handle,
                generation: None,
            })
        };
        let generation = Arc::new(PolicyGeneration::new(map(GENERATION)?.handle));
        let mut filter = Self {
            // See `Map::generation`.
            cgroup_filters: Map {
                generation: Some(Arc::clone(&generation)),
                ..map(CGROUP_FILTERS)?
            },
            allow_v4: map(ALLOW_V4)?,
            deny_v4: map(DENY_V4)?,
            allow_v6: map(ALLOW_V6)?,
            deny_v6: map(DENY_V6)?,
            hosts: map(HOSTS)?,
            observations: map(OBSERVATIONS)?,
            observations_taken: AtomicU64::new(0),
            stats: map(STATS)?,
            meta: map(META)?,
            policies: map(POLICIES)?,
            rules: map(RULES)?,
            bindings: map(BINDINGS)?,
            domains: map(DOMAINS)?,
            learned: map(LEARNED)?,
            learned_share: map(LEARNED_SHARE)?,
            learned_budget: map(LEARNED_BUDGET)?,
            learned_released: map(LEARNED_RELEASED)?,
            learned_cap: AtomicU64::new(u64::MAX),
            domain_rules: map(DOMAIN_RULES)?,
            resolvers: map(RESOLVERS)?,
            questions: map(QUESTIONS)?,
            snoop_stats: map(SNOOP_STATS)?,
            question_budget: map(QUESTION_BUDGET)?,
            observe_share: map(OBSERVE_SHARE)?,
            observe_budget: map(OBSERVE_BUDGET)?,
            observe_epoch: AtomicU64::new(0),
            generation,
            occupancy: Mutex::default(),
            snoop: Err(EgressError::SnoopUnavailable {
                reason: "not loaded yet".to_owned(),
            }),
            pin_dir: None,
            outcome: PinOutcome::Fresh,
            pinned_links: PinnedLinks::default(),
            object,
        };
        if filter.program().is_none() {
            return Err(EgressError::Load {
                errno: None,
                message: format!("the object has no program {PROGRAM}"),
                verifier_log: None,
            });
        }
        // A refused snooper costs the domains only: the filter serves
        // everything else.
        filter.snoop = Snoop::load(&filter, capture).map_err(|e| EgressError::SnoopUnavailable {
            reason: match &e {
                EgressError::Load {
                    verifier_log: Some(log),
                    ..
                } => format!(
                    "{e}: {}",
                    crate::verifier_log::verifier_reason(log).unwrap_or(log.as_str())
                ),
                _ => e.to_string(),
            },
        });
        Ok(filter)
    }

    /// The filter's map named `name` if the snooper shares it.
    fn shared_map(&self, name: &str) -> Option<(&'static str, &MapHandle)> {
        let map = match name {
            CGROUP_FILTERS => &self.cgroup_filters,
            DOMAINS => &self.domains,
            LEARNED => &self.learned,
            LEARNED_SHARE => &self.learned_share,
            LEARNED_BUDGET => &self.learned_budget,
            LEARNED_RELEASED => &self.learned_released,
            RESOLVERS => &self.resolvers,
            QUESTIONS => &self.questions,
            SNOOP_STATS => &self.snoop_stats,
            GENERATION => return Some((GENERATION, &self.generation.handle)),
            _ => return None,
        };
        Some((map.name, &map.handle))
    }

    /// Opens every link pinned under `links_dir`: links of cgroups this
    /// object's (adopted) maps filter are switched to this object's
    /// program and adopted; links of removed cgroups are unpinned; the
    /// rest are stale. Files that are not egress links are left alone.
    fn open_pinned_links(
        &self,
        links_dir: &Path,
        adopting: bool,
        snooper: bool,
    ) -> Result<PinnedLinks> {
        let names = |dir: &Path| -> Result<Vec<String>> {
            let mut names: Vec<String> = fs::read_dir(dir)
                .map_err(|e| pin_err(dir, e))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            Ok(names)
        };
        // A pin staged by a replace that did not finish: its link is the
        // newer one (attached after its cgroup was programmed), so the
        // replace is finished now (best effort: a staged pin left over is
        // not read, and the next pin of its cgroup replaces it).
        let is_staged_link = |n: &&String| {
            n.strip_suffix(STAGED)
                .is_some_and(|id| id.parse::<u64>().is_ok())
        };
        for staged in names(links_dir)?.iter().filter(is_staged_link) {
            let real = links_dir.join(staged.trim_end_matches(STAGED));
            let _ = fs::rename(links_dir.join(staged), real);
        }
        let (program_name, object) = if snooper {
            (SNOOP_PROGRAM, self.snoop.as_ref().ok().map(|s| &s.object))
        } else {
            (PROGRAM, Some(&self.object))
        };
        let program =
            object.and_then(|o| o.progs().find(|p| p.name().to_str() == Some(program_name)));
        // Without a loaded snooper nothing can run its links: they are
        // stale (released once the cgroup is re-programmed).
        let filtered: BTreeSet<u64> = if adopting && program.is_some() {
            self.cgroup_filters
                .keys()
                .iter()
                .filter_map(|k| Some(u64::from_ne_bytes(k.as_slice().try_into().ok()?)))
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut out = PinnedLinks::default();
        for name in names(links_dir)? {
            let Ok(id) = name.parse::<u64>() else {
                continue;
            };
            let path = links_dir.join(&name);
            let Ok(link) = Link::open(&path) else {
                continue;
            };
            let Ok(info) = link.info() else {
                continue;
            };
            let LinkTypeInfo::Cgroup(cgroup) = info.info else {
                continue;
            };
            if cgroup.cgroup_id == 0 {
                // Its cgroup was removed: the link is defunct.
                drop(link);
                remove_pin(&path)?;
                continue;
            }
            let mut link = CgroupLink::from_pin(program_name, &path, id, link);
            if cgroup.cgroup_id != id || !filtered.contains(&id) {
                out.stale.push(link);
                continue;
            }
            if let Some(program) = &program {
                match link.link_mut().update_prog(program) {
                    Ok(()) => {}
                    Err(e) if errno(&e) == Some(libc::ENOLINK) => {
                        drop(link);
                        remove_pin(&path)?;
                        continue;
                    }
                    // The earlier program reads the same (adopted) maps:
                    // it enforces the same entries.
                    Err(_) => {}
                }
            }
            out.adopted.push(link);
        }
        Ok(out)
    }

    pub(super) fn pin_outcome(&self) -> &PinOutcome {
        &self.outcome
    }

    pub(super) fn pin_dir(&self) -> Option<&Path> {
        self.pin_dir.as_deref()
    }

    pub(super) fn take_pinned_links(&mut self) -> PinnedLinks {
        std::mem::take(&mut self.pinned_links)
    }

    /// Pins `link` at `links/<cgroup id>` (with a pin directory): staged
    /// under another name, then renamed over whatever was pinned there, so
    /// the cgroup's previous link (if any) stays pinned until this one is.
    pub(super) fn pin_link(&self, link: &mut CgroupLink) -> Result<()> {
        self.pin_link_in(link, LINKS_DIR)
    }

    /// [`Self::pin_link`] for a snooper link, under `snoop_links`.
    pub(super) fn pin_snoop_link(&self, link: &mut CgroupLink) -> Result<()> {
        self.pin_link_in(link, SNOOP_LINKS_DIR)
    }

    fn pin_link_in(&self, link: &mut CgroupLink, subdir: &str) -> Result<()> {
        let Some(dir) = &self.pin_dir else {
            return Ok(());
        };
        let links = dir.join(subdir);
        let id = link.cgroup_id();
        let path = links.join(id.to_string());
        let staged = links.join(format!("{id}{STAGED}"));
        remove_pin(&staged)?;
        link.link_mut()
            .pin(&staged)
            .map_err(|e| pin_err(&staged, format!("{e:#}")))?;
        if let Err(e) = fs::rename(&staged, &path) {
            let _ = fs::remove_file(&staged);
            return Err(pin_err(&path, e));
        }
        link.set_pin(Some(path));
        Ok(())
    }

    /// Removes `link`'s pin, unless the pin holds another link by now.
    pub(super) fn unpin_link(&self, link: &CgroupLink) -> Result<()> {
        let Some(pin) = link.pin_path() else {
            return Ok(());
        };
        let ours = link.link().info().map(|i| i.id).ok();
        let pinned = Link::open(pin)
            .ok()
            .and_then(|l| l.info().ok())
            .map(|i| i.id);
        match (ours, pinned) {
            (Some(a), Some(b)) if a != b => Ok(()),
            _ => remove_pin(pin),
        }
    }

    pub(super) fn read_state(&self) -> Result<PinnedState> {
        StateMaps {
            cgroup_filters: &self.cgroup_filters,
            allow_v4: &self.allow_v4,
            deny_v4: &self.deny_v4,
            allow_v6: &self.allow_v6,
            deny_v6: &self.deny_v6,
            hosts: &self.hosts,
            policies: &self.policies,
            rules: &self.rules,
            bindings: &self.bindings,
            domains: &self.domains,
            domain_rules: &self.domain_rules,
        }
        .read()
    }

    /// [`Self::read_state`] of the maps pinned under `dir`, without
    /// loading anything (nothing pinned: an empty state).
    pub(super) fn read_pinned_state(dir: &Path) -> Result<PinnedState> {
        let maps_dir = dir.join(MAPS_DIR);
        if !maps_dir.join(META).exists() {
            return Ok(PinnedState::default());
        }
        let open = |name: &'static str| -> Result<Map> {
            let path = maps_dir.join(name);
            MapHandle::from_pinned_path(&path)
                .map(|handle| Map {
                    name,
                    handle,
                    generation: None,
                })
                .map_err(|e| pin_err(&path, format!("{e:#}")))
        };
        let maps = [
            open(CGROUP_FILTERS)?,
            open(ALLOW_V4)?,
            open(DENY_V4)?,
            open(ALLOW_V6)?,
            open(DENY_V6)?,
            open(HOSTS)?,
            open(POLICIES)?,
            open(RULES)?,
            open(BINDINGS)?,
            open(DOMAINS)?,
            open(DOMAIN_RULES)?,
        ];
        let [cgroup_filters, allow_v4, deny_v4, allow_v6, deny_v6, hosts, policies, rules, bindings, domains, domain_rules] =
            &maps;
        StateMaps {
            cgroup_filters,
            allow_v4,
            deny_v4,
            allow_v6,
            deny_v6,
            hosts,
            policies,
            rules,
            bindings,
            domains,
            domain_rules,
        }
        .read()
    }
}

/// The maps [`Filter::read_state`] decodes, wherever they come from.
struct StateMaps<'a> {
    cgroup_filters: &'a Map,
    allow_v4: &'a Map,
    deny_v4: &'a Map,
    allow_v6: &'a Map,
    deny_v6: &'a Map,
    hosts: &'a Map,
    policies: &'a Map,
    rules: &'a Map,
    bindings: &'a Map,
    domains: &'a Map,
    domain_rules: &'a Map,
}

impl StateMaps<'_> {
    fn read(&self) -> Result<PinnedState> {
        let mut state = PinnedState::default();
        let map = self.cgroup_filters;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (id, set_id, flags) = key::decode_filter(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            state.filters.insert(id, (set_id, flags));
        }
        for (map, v6, verdict) in [
            (self.allow_v4, false, Verdict::Allow),
            (self.deny_v4, false, Verdict::Deny),
            (self.allow_v6, true, Verdict::Allow),
            (self.deny_v6, true, Verdict::Deny),
        ] {
            for k in map.keys() {
                let (set_id, prefix) = key::decode_trie_key(&k, v6)
                    .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
                let set = state.sets.entry(set_id).or_default();
                match verdict {
                    Verdict::Allow => set.allow.insert(prefix),
                    Verdict::Deny => set.deny.insert(prefix),
                };
            }
        }
        let map = self.hosts;
        for k in map.keys() {
            // Gone since the walk listed it: nothing to adopt.
            let Some(v) = map.lookup(&k)? else { continue };
            let (set_id, prefix, lists) = key::decode_host(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            let set = state.sets.entry(set_id).or_default();
            if lists.allow {
                set.allow.insert(prefix);
            }
            if lists.deny {
                set.deny.insert(prefix);
            }
        }
        let map = self.policies;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (id, kind) = key::decode_policy(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            state.ledger.entry(id).or_default().kind = Some(kind);
        }
        let map = self.rules;
        for k in map.keys() {
            let (id, verdict, prefix) = key::decode_rule_key(&k)
                .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
            let policy = state.ledger.entry(id).or_default();
            match verdict {
                Verdict::Allow => policy.allow.insert(prefix),
                Verdict::Deny => policy.deny.insert(prefix),
            };
        }
        let map = self.bindings;
        for k in map.keys() {
            let (id, cgroup) = key::decode_binding_key(&k)
                .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
            state.ledger.entry(id).or_default().cgroups.insert(cgroup);
        }
        let map = self.domains;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (set_id, domain, verdicts, name_id) = key::decode_domain(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            state
                .sets
                .entry(set_id)
                .or_default()
                .domains
                .insert(domain, (verdicts, name_id));
        }
        let map = self.domain_rules;
        for k in map.keys() {
            let (id, verdict, domain) = key::decode_domain_rule_key(&k)
                .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
            let policy = state.ledger.entry(id).or_default();
            match verdict {
                Verdict::Allow => policy.allow_domains.insert(domain),
                Verdict::Deny => policy.deny_domains.insert(domain),
            };
        }
        Ok(state)
    }
}

impl Filter {
    pub(super) fn ledger_set_policy(&self, id: &[u8], kind: Option<LedgerKind>) -> Result<()> {
        let key = key::policy_key(id).ok_or(EgressError::InvalidLedgerId { len: id.len() })?;
        match kind {
            Some(kind) => self.policies.update(&key, &key::policy_value(kind)),
            None => self.policies.delete(&key).map(|_| ()),
        }
    }

    pub(super) fn ledger_set_rule(
        &self,
        id: &[u8],
        verdict: Verdict,
        prefix: Prefix,
        present: bool,
    ) -> Result<()> {
        let key = key::rule_key(id, verdict, &prefix)
            .ok_or(EgressError::InvalidLedgerId { len: id.len() })?;
        if present {
            self.rules.update(&key, &key::TRIE_VALUE)
        } else {
            self.rules.delete(&key).map(|_| ())
        }
    }

    pub(super) fn ledger_set_binding(
        &self,
        id: &[u8],
        cgroup_id: u64,
        present: bool,
    ) -> Result<()> {
        let key = key::binding_key(id, cgroup_id)
            .ok_or(EgressError::InvalidLedgerId { len: id.len() })?;
        if present {
            self.bindings.update(&key, &key::TRIE_VALUE)
        } else {
            self.bindings.delete(&key).map(|_| ())
        }
    }

    pub(super) fn ledger_set_domain_rule(
        &self,
        id: &[u8],
        verdict: Verdict,
        domain: &Domain,
        present: bool,
    ) -> Result<()> {
        let key = key::domain_rule_key(id, verdict, domain)
            .ok_or(EgressError::InvalidLedgerId { len: id.len() })?;
        if present {
            self.domain_rules.update(&key, &key::TRIE_VALUE)
        } else {
            self.domain_rules.delete(&key).map(|_| ())
        }
    }

    pub(super) fn set_domain(
        &self,
        set_id: u32,
        domain: &Domain,
        verdicts: DomainVerdicts,
        name_id: u32,
    ) -> Result<()> {
        self.domains.update(
            &key::domain_key(set_id, domain),
            &key::domain_value(verdicts, name_id),
        )
    }

    pub(super) fn remove_domain(&self, set_id: u32, domain: &Domain) -> Result<bool> {
        self.domains.delete(&key::domain_key(set_id, domain))
    }

    pub(super) fn learned(&self) -> Result<Vec<Learned>> {
        let map = &self.learned;
        let now = monotonic_ns()?;
        let mut out = Vec::new();
        for k in map.keys() {
            // Gone since the walk listed it (evicted): nothing to report.
            let Some(v) = map.lookup(&k)? else { continue };
            let (set_id, addr, verdicts, name_id, expires) = key::decode_learned(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            out.push(Learned {
                set_id,
                addr,
                verdicts,
                name_id,
                remaining: (expires > now).then(|| Duration::from_nanos(expires - now)),
            });
        }
        out.sort();
        Ok(out)
    }

    pub(super) fn forget_learned(&self, set_id: u32, name_id: Option<u32>) -> Result<usize> {
        let occupancy = self.occupancy();
        let map = &self.learned;
        let mut forgotten = 0;
        for k in map.keys() {
            if key::learned_key_set(&k) != Some(set_id) {
                continue;
            }
            if let Some(name_id) = name_id {
                let Some(v) = map.lookup(&k)? else { continue };
                if key::learned_value_name_id(&v) != Some(name_id) {
                    continue;
                }
            }
            if map.delete(&k)? {
                forgotten += 1;
            }
        }
        if name_id.is_none() {
            // The set holds nothing now: its counts start again (its id
            // is about to be reused, or it was freed).
            self.learned_budget.delete(&key::set_key(set_id))?;
            self.learned_released.delete(&key::set_key(set_id))?;
        } else {
            self.release_learned(set_id, forgotten)?;
        }
        if forgotten > 0 {
            self.entries_changed(&occupancy, set_id)?;
        }
        Ok(forgotten)
    }

    /// Adds `n` entries to what userspace removed of set `set_id`'s (a
    /// negative `n`: entries it added), the other half of what the set
    /// holds (see `learned_released`). Called under the occupancy lock, so
    /// the read-modify-write has no other writer.
    fn release_learned(&self, set_id: u32, n: usize) -> Result<()> {
        self.adjust_released(set_id, i64::try_from(n).unwrap_or(i64::MAX))
    }

    fn adjust_released(&self, set_id: u32, by: i64) -> Result<()> {
        if by == 0 {
            return Ok(());
        }
        let map = &self.learned_released;
        let k = key::set_key(set_id);
        let was = map.lookup_count(&k)?.unwrap_or(0);
        map.update(&k, &was.wrapping_add_signed(by).to_ne_bytes())
    }

    /// Removes every expired entry of `egress_learned` (the map never
    /// evicts: an expired entry takes room in its set's share until it is
    /// removed) and returns how many went. An entry the snooper refreshes
    /// between the read and the removal is removed too: the address is
    /// learned again from the pod's next answer for it.
    pub(super) fn sweep_learned(&self) -> Result<usize> {
        let occupancy = self.occupancy();
        let map = &self.learned;
        let now = monotonic_ns()?;
        let mut swept: HashMap<u32, usize> = HashMap::new();
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (Some(set_id), Some(expires)) =
                (key::learned_key_set(&k), key::learned_value_expires(&v))
            else {
                return Err(map.layout(format!("an entry {k:02x?} => {v:02x?}")));
            };
            if expires <= now && map.delete(&k)? {
                *swept.entry(set_id).or_default() += 1;
            }
        }
        let mut total = 0;
        for (set_id, n) in swept {
            self.release_learned(set_id, n)?;
            total += n;
        }
        drop(occupancy);
        Ok(total)
    }

    /// Each set's use of its share of `egress_learned`, by set id.
    pub(super) fn learned_use(&self) -> Result<Vec<super::LearnedUse>> {
        let _occupancy = self.occupancy();
        let map = &self.learned_budget;
        let mut out = Vec::new();
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (set_id, [inserted, over_share, answers_refused]) =
                key::decode_learned_budget(&k, &v)
                    .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            let released = self.learned_released.lookup_count(&k)?.unwrap_or(0);
            // Negative (the top bit) only for a moment of a race: none.
            let held = inserted.wrapping_sub(released);
            out.push(super::LearnedUse {
                set_id,
                held: if held >> 63 == 1 { 0 } else { held },
                over_share,
                answers_refused,
            });
        }
        out.sort_unstable_by_key(|u| u.set_id);
        Ok(out)
    }

    /// The entries of `egress_learned` each set may hold now (`None`: no
    /// limit is written).
    pub(super) fn learned_share(&self) -> Result<Option<u64>> {
        let map = &self.learned_share;
        let share = map
            .lookup_count(&key::set_key(0))?
            .ok_or_else(|| map.layout("no share slot".to_owned()))?;
        Ok((share > 0).then_some(share))
    }

    /// Bounds each set's share of `egress_learned` by `cap` (below the
    /// equal share it would get), from now on.
    pub(super) fn cap_learned_share(&self, cap: u64) -> Result<()> {
        self.learned_cap.store(cap.max(1), Ordering::Relaxed);
        let occupancy = self.occupancy();
        self.write_learned_share(&occupancy)
    }

    /// Gives each set in use an equal share of `egress_learned`, less a
    /// margin for the CPUs that may pass the snooper's check at once (it
    /// reads the counts without a lock), so the shares never sum past the
    /// map: a set at its share is refused, and nothing of another set's is
    /// ever displaced.
    fn write_learned_share(&self, occupancy: &Occupancy) -> Result<()> {
        let sets = u64::try_from(occupancy.set_users.len().max(1)).unwrap_or(u64::MAX);
        let cpus = libbpf_rs::num_possible_cpus()
            .ok()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(1);
        let share = (super::LEARNED_MAX / sets)
            .saturating_sub(cpus)
            .min(self.learned_cap.load(Ordering::Relaxed))
            .max(1);
        self.learned_share
            .update(&key::set_key(0), &share.to_ne_bytes())
    }

    pub(super) fn insert_learned(
        &self,
        set_id: u32,
        addr: IpAddr,
        verdicts: DomainVerdicts,
        name_id: u32,
        counts_for: Duration,
    ) -> Result<()> {
        let nanos = u64::try_from(counts_for.as_nanos()).unwrap_or(u64::MAX);
        let expires = monotonic_ns()?.saturating_add(nanos);
        let occupancy = self.occupancy();
        let k = key::learned_key(set_id, addr);
        let value = key::learned_value(expires, verdicts, name_id);
        // A key userspace adds counts against the set's share as one it
        // removed less.
        if self.learned.insert_new(&k, &value)? {
            self.adjust_released(set_id, -1)?;
        } else {
            self.learned.update(&k, &value)?;
        }
        self.entries_changed(&occupancy, set_id)
    }

    pub(super) fn set_dns_resolvers(&self, addrs: &[IpAddr]) -> Result<()> {
        let wanted: std::collections::BTreeSet<Vec<u8>> =
            addrs.iter().map(|a| key::resolver_key(*a)).collect();
        if wanted.len() > super::DNS_RESOLVERS_MAX {
            return Err(EgressError::MapFull {
                map: RESOLVERS,
                max_entries: super::DNS_RESOLVERS_MAX as u32,
            });
        }
        for old in self.resolvers.keys() {
            if !wanted.contains(&old) {
                self.resolvers.delete(&old)?;
            }
        }
        for k in &wanted {
            self.resolvers.update(k, &key::RESOLVER_VALUE)?;
        }
        Ok(())
    }

    pub(super) fn snoop_error(&self) -> Option<&EgressError> {
        self.snoop.as_ref().err()
    }

    fn snooper(&self) -> Result<&Snoop> {
        self.snoop.as_ref().map_err(Clone::clone)
    }

    pub(super) fn read_snoop_stats(&self) -> Result<SnoopStats> {
        let map = &self.snooper()?.stats;
        let per_cpu = map
            .handle
            .lookup_percpu(&key::STATS_KEY, MapFlags::ANY)
            .map_err(|e| map.err("lookup", &e))?
            .ok_or_else(|| map.layout("no element 0".to_owned()))?;
        key::sum_snoop_stats(&per_cpu).ok_or_else(|| {
            map.layout(format!(
                "per-CPU values of {:?} bytes",
                per_cpu.iter().map(Vec::len).collect::<HashSet<_>>()
            ))
        })
    }

    pub(super) fn attach_snoop(&self, dir: &Path) -> Result<CgroupLink> {
        let program = self
            .snooper()?
            .program()
            .ok_or_else(|| EgressError::SnoopUnavailable {
                reason: format!("the snooper object has no program {SNOOP_PROGRAM}"),
            })?;
        Ok(attach_egress(&program, SNOOP_PROGRAM, dir)?)
    }

    pub(super) fn test_run_snoop_repeat(
        &self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<super::TimedRun> {
        let program = self
            .snooper()?
            .program()
            .ok_or_else(|| EgressError::TestRun {
                errno: None,
                message: format!("the snooper object has no program {SNOOP_PROGRAM}"),
            })?;
        super::bench::timed(&program, frame, repeat)
    }

    pub(super) fn test_run_snoop(&self, frame: &[u8]) -> Result<u32> {
        let program = self
            .snooper()?
            .program()
            .ok_or_else(|| EgressError::TestRun {
                errno: None,
                message: format!("the snooper object has no program {SNOOP_PROGRAM}"),
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

    fn occupancy(&self) -> MutexGuard<'_, Occupancy> {
        // A panic under the lock cannot leave it half-updated in a way
        // that matters: at worst a count is off, which costs lookups.
        self.occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// After a change to set `set_id`'s entries (or learned addresses):
    /// a new policy generation if some cgroup uses the set. A set no cgroup
    /// uses has no cached verdict that holds: the change that took its
    /// last cgroup away wrote `cgroup_filters`, which advanced the
    /// generation after every verdict cached for it. So a set is programmed
    /// before its first cgroup without a write per entry. Called under the
    /// occupancy lock, which `set_filter` holds too.
    fn entries_changed(&self, occupancy: &Occupancy, set_id: u32) -> Result<()> {
        if occupancy.cgroups.values().any(|(set, _)| *set == set_id) {
            self.generation.advance()?;
        }
        Ok(())
    }

    /// Rewrites the `cgroup_filters` entry of every cgroup of set
    /// `set_id` with occupancy bits `bits`.
    fn refresh(&self, occupancy: &Occupancy, set_id: u32, bits: u32) -> Result<()> {
        let mut result = Ok(());
        for (cgroup_id, (set, flags)) in &occupancy.cgroups {
            if *set != set_id {
                continue;
            }
            let written = self.cgroup_filters.update(
                &key::cgroup_key(*cgroup_id),
                &key::filter_value(set_id, *flags, bits),
            );
            if result.is_ok() {
                result = written;
            }
        }
        result
    }

    /// Rebuilds the occupancy from adopted maps (the entries and
    /// `cgroup_filters` a previous daemon wrote), and rewrites the bits of
    /// every cgroup whose entry does not have the ones it gives: whatever
    /// a daemon stopped between an entry and its bits left behind is
    /// mended here (and nothing is written otherwise).
    fn adopt_occupancy(&self) -> Result<()> {
        let mut occupancy = Occupancy::default();
        let mut written = HashMap::new();
        let map = &self.cgroup_filters;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (id, set_id, flags) = key::decode_filter(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            occupancy.cgroups.insert(id, (set_id, flags));
            *occupancy.set_users.entry(set_id).or_default() += 1;
            written.insert(id, v);
        }
        // Counted by the map an entry is in, whatever its length: that is
        // where the program has to look for it.
        for (map, v6, slot) in [
            (&self.deny_v4, false, key::Slot::DenyV4),
            (&self.allow_v4, false, key::Slot::AllowV4),
            (&self.deny_v6, true, key::Slot::DenyV6),
            (&self.allow_v6, true, key::Slot::AllowV6),
        ] {
            for k in map.keys() {
                let (set_id, _) = key::decode_trie_key(&k, v6)
                    .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
                occupancy.added(set_id, slot);
            }
        }
        let map = &self.hosts;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (set_id, prefix, _) = key::decode_host(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            let slot = if prefix.addr().is_ipv4() {
                key::Slot::HostsV4
            } else {
                key::Slot::HostsV6
            };
            occupancy.added(set_id, slot);
        }
        for (cgroup_id, (set_id, flags)) in &occupancy.cgroups {
            let value = key::filter_value(*set_id, *flags, occupancy.bits(*set_id));
            if written.get(cgroup_id) != Some(&value) {
                self.cgroup_filters
                    .update(&key::cgroup_key(*cgroup_id), &value)?;
            }
        }
        // The shares are not pinned: the adopted sets' share is written
        // afresh.
        self.write_set_shares(&occupancy)?;
        *self.occupancy() = occupancy;
        Ok(())
    }

    pub(super) fn set_filter(&self, cgroup_id: u64, set_id: u32, flags: FilterFlags) -> Result<()> {
        if cgroup_id == 0 {
            return Err(EgressError::InvalidCgroupId);
        }
        let mut occupancy = self.occupancy();
        self.cgroup_filters.update(
            &key::cgroup_key(cgroup_id),
            &key::filter_value(set_id, flags, occupancy.bits(set_id)),
        )?;
        let sets_before = occupancy.set_users.len();
        if let Some((old_set, _)) = occupancy.cgroups.insert(cgroup_id, (set_id, flags)) {
            occupancy.set_unused(old_set);
        }
        *occupancy.set_users.entry(set_id).or_default() += 1;
        if occupancy.set_users.len() != sets_before {
            self.write_set_shares(&occupancy)?;
        }
        Ok(())
    }

    /// Writes both per-set shares for the sets in use: of `observations`
    /// per drain (see `observe_share` in the program: the shares sum to at
    /// most the map, so its LRU never evicts one set's counts for
    /// another's) and of `egress_learned` ([`Self::write_learned_share`]).
    fn write_set_shares(&self, occupancy: &Occupancy) -> Result<()> {
        let sets = occupancy.set_users.len().max(1);
        let share = super::OBSERVATIONS_MAX / u64::try_from(sets).unwrap_or(u64::MAX);
        self.observe_share.update(
            &key::obs_share_slot(key::ObsShareSlot::Share),
            &share.max(1).to_ne_bytes(),
        )?;
        self.write_learned_share(occupancy)
    }

    pub(super) fn remove_cgroup(&self, cgroup_id: u64) -> Result<bool> {
        let mut occupancy = self.occupancy();
        let removed = self.cgroup_filters.delete(&key::cgroup_key(cgroup_id))?;
        if let Some((set_id, _)) = occupancy.cgroups.remove(&cgroup_id) {
            // A set no cgroup uses any more is freed (its id reused): its
            // budget goes with it, and the others' shares grow.
            if occupancy.set_unused(set_id) {
                self.observe_budget.delete(&set_id.to_ne_bytes())?;
                self.write_set_shares(&occupancy)?;
            }
        }
        // A cgroup filtered again starts a new budget of DNS questions (an
        // LRU: a stale entry would only go when the map is full).
        self.question_budget.delete(&key::cgroup_key(cgroup_id))?;
        Ok(removed)
    }

    pub(super) fn insert(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<()> {
        let slot = key::Slot::of(verdict, &prefix);
        let mut occupancy = self.occupancy();
        let before = occupancy.bits(set_id);
        // The bit first (see Occupancy): a failure here leaves at most a
        // bit without an entry.
        if before & slot.flag() == 0 {
            self.refresh(&occupancy, set_id, before | slot.flag())?;
        }
        let inserted = if key::is_host(&prefix) {
            self.insert_host(set_id, verdict, prefix.addr())
        } else {
            self.trie(verdict, &prefix)
                .insert_new(&key::trie_key(set_id, &prefix), &key::TRIE_VALUE)
        };
        // An entry found there already is counted too if the counts did
        // not know it (they always should: see adopt_occupancy), so its
        // bit stays.
        if let Ok(created) = inserted {
            if created || occupancy.count(set_id, slot) == 0 {
                occupancy.added(set_id, slot);
            }
        }
        if inserted.is_ok() {
            self.entries_changed(&occupancy, set_id)?;
        }
        let after = occupancy.bits(set_id);
        if after != before | slot.flag() {
            // Nothing was inserted (a full map): the bit goes again. Best
            // effort, the insert's error is the one to report; a bit left
            // costs a lookup.
            let _ = self.refresh(&occupancy, set_id, after);
        }
        inserted.map(|_| ())
    }

    /// Puts `addr` on list `verdict` of set `set_id` in `egress_hosts`;
    /// whether that created the key (it may hold the other list already).
    fn insert_host(&self, set_id: u32, verdict: Verdict, addr: IpAddr) -> Result<bool> {
        let key = key::host_key(set_id, addr);
        let mut lists = DomainVerdicts {
            allow: verdict == Verdict::Allow,
            deny: verdict == Verdict::Deny,
            observe: false,
        };
        if self.hosts.insert_new(&key, &key::host_value(lists))? {
            return Ok(true);
        }
        let current = self.hosts.lookup(&key)?;
        if let Some(v) = &current {
            let held = key::decode_host_value(v)
                .ok_or_else(|| self.hosts.layout(format!("a value {v:02x?}")))?;
            if (held.allow || !lists.allow) && (held.deny || !lists.deny) {
                return Ok(false);
            }
            lists.allow |= held.allow;
            lists.deny |= held.deny;
        }
        self.hosts.update(&key, &key::host_value(lists))?;
        Ok(current.is_none())
    }

    pub(super) fn remove(&self, set_id: u32, verdict: Verdict, prefix: Prefix) -> Result<bool> {
        let slot = key::Slot::of(verdict, &prefix);
        let mut occupancy = self.occupancy();
        let (removed, key_gone) = if key::is_host(&prefix) {
            self.remove_host(set_id, verdict, prefix.addr())?
        } else {
            let removed = self
                .trie(verdict, &prefix)
                .delete(&key::trie_key(set_id, &prefix))?;
            (removed, removed)
        };
        if removed {
            self.entries_changed(&occupancy, set_id)?;
        }
        if key_gone {
            occupancy.removed(set_id, slot);
            if occupancy.count(set_id, slot) == 0 {
                // The bit after the entry (see Occupancy). Best effort:
                // the entry is gone, which is what the caller asked; a bit
                // left costs a lookup that misses.
                let _ = self.refresh(&occupancy, set_id, occupancy.bits(set_id));
            }
        }
        Ok(removed)
    }

    /// Takes `addr` off list `verdict` of set `set_id` in `egress_hosts`:
    /// whether it was on it, and whether the key went with it (it was on
    /// no other list).
    fn remove_host(&self, set_id: u32, verdict: Verdict, addr: IpAddr) -> Result<(bool, bool)> {
        let key = key::host_key(set_id, addr);
        let Some(v) = self.hosts.lookup(&key)? else {
            return Ok((false, false));
        };
        let mut lists = key::decode_host_value(&v)
            .ok_or_else(|| self.hosts.layout(format!("a value {v:02x?}")))?;
        let held = match verdict {
            Verdict::Allow => std::mem::take(&mut lists.allow),
            Verdict::Deny => std::mem::take(&mut lists.deny),
        };
        if !held {
            return Ok((false, false));
        }
        if lists.is_empty() {
            let gone = self.hosts.delete(&key)?;
            return Ok((true, gone));
        }
        self.hosts.update(&key, &key::host_value(lists))?;
        Ok((true, false))
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
        let taken = values.iter().filter(|v| v.is_some()).count();
        // What was read is gone: every set's share starts again.
        let epoch = self.observe_epoch.fetch_add(1, Ordering::Relaxed) + 1;
        self.observe_share.update(
            &key::obs_share_slot(key::ObsShareSlot::Epoch),
            &epoch.to_ne_bytes(),
        )?;
        self.observations_taken
            .fetch_add(u64::try_from(taken).unwrap_or(u64::MAX), Ordering::Relaxed);
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

    pub(super) fn observations_over_share(&self) -> Result<Vec<(u32, u64)>> {
        let map = &self.observe_budget;
        let mut out = Vec::new();
        for k in map.keys() {
            let Some(value) = map
                .handle
                .lookup(&k, MapFlags::ANY)
                .map_err(|e| map.err("lookup", &e))?
            else {
                continue;
            };
            let (set_id, over) = key::decode_obs_budget(&k, &value).ok_or_else(|| {
                map.layout(format!("an entry of {} and {} bytes", k.len(), value.len()))
            })?;
            if over > 0 {
                out.push((set_id, over));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    pub(super) fn observation_share(&self) -> Result<Option<u64>> {
        let map = &self.observe_share;
        let share = map
            .lookup_count(&key::obs_share_slot(key::ObsShareSlot::Share))?
            .ok_or_else(|| map.layout("no share slot".to_owned()))?;
        Ok((share > 0).then_some(share))
    }

    pub(super) fn observations_taken(&self) -> u64 {
        self.observations_taken.load(Ordering::Relaxed)
    }

    pub(super) fn count_observations(&self) -> u64 {
        u64::try_from(sys::unique_keys(&self.observations.handle).len()).unwrap_or(u64::MAX)
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

    /// Every map the pin layout names is a map of the object (so a load
    /// pins each of them), and every other map of the object is one the
    /// filter keeps unpinned on purpose.
    #[test]
    fn the_pin_layout_names_the_objects_maps() {
        let open = Filter::open().unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<String> = open
            .maps()
            .map(|m| m.name().to_string_lossy().into_owned())
            .collect();
        for name in PINNED_MAPS {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
        for name in &names {
            assert!(
                PINNED_MAPS.contains(&name.as_str())
                    || [
                        GENERATION,
                        "egress_cpu_cache",
                        // The DNS question side: rewritten at every start
                        // (the resolvers), or short-lived (the questions
                        // and budgets), or counters since load.
                        RESOLVERS,
                        QUESTIONS,
                        QUESTION_BUDGET,
                        SNOOP_STATS,
                        // Written at every load from the sets in use.
                        LEARNED_SHARE,
                        "question_scratch",
                        OBSERVE_SHARE,
                        OBSERVE_BUDGET,
                    ]
                    .contains(&name.as_str())
                    || name.ends_with(".bss"),
                "{name} is neither pinned nor known to stay unpinned"
            );
        }
    }
}
