//! The egress filter against the kernel.
//!
//! The object is loaded through libbpf-rs's generic API rather than the
//! generated skeleton: an [`Object`] owns its programs and maps (the
//! skeleton borrows caller-provided storage, which a long-lived handle
//! cannot hold without a self-referential struct), and it is `Send + Sync`.
//! The maps are kept as [`MapHandle`]s (owned fds); the skeleton still
//! supplies every layout (`key.rs`). No `unsafe` here.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use libbpf_rs::query::LinkTypeInfo;
use libbpf_rs::{
    Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, OpenObject, ProgramInput,
};

use super::{
    key, EgressError, FilterFlags, LedgerKind, Observation, PinOutcome, PinnedLinks, PinnedState,
    Prefix, Result, Stats, Verdict,
};
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
const META: &str = "egress_meta";
const POLICIES: &str = "egress_policies";
const RULES: &str = "egress_rules";
const BINDINGS: &str = "egress_bindings";

/// Every map pinned: all of the object's but libbpf's internal `.bss`.
const PINNED_MAPS: [&str; 11] = [
    CGROUP_FILTERS,
    ALLOW_V4,
    DENY_V4,
    ALLOW_V6,
    DENY_V6,
    OBSERVATIONS,
    STATS,
    META,
    POLICIES,
    RULES,
    BINDINGS,
];

/// Subdirectories of a pin directory.
const MAPS_DIR: &str = "maps";
const LINKS_DIR: &str = "links";
/// Suffix of a link pin staged before its rename over the real one (bpffs
/// names cannot hold a `.`).
const STAGED: &str = "_new";

#[derive(Debug)]
pub(super) struct Filter {
    cgroup_filters: Map,
    allow_v4: Map,
    deny_v4: Map,
    allow_v6: Map,
    deny_v6: Map,
    observations: Map,
    stats: Map,
    meta: Map,
    policies: Map,
    rules: Map,
    bindings: Map,
    /// The pin directory, when loaded with one.
    pin_dir: Option<PathBuf>,
    outcome: PinOutcome,
    /// Found at load, until the caller takes them.
    pinned_links: PinnedLinks,
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

    fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.handle
            .lookup(key, MapFlags::ANY)
            .map_err(|e| self.err("lookup", &e))
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

    /// Every key, each once.
    fn keys(&self) -> Vec<Vec<u8>> {
        sys::unique_keys(&self.handle)
    }
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

/// Removes every map pin under `maps_dir`. Only the map pins: the links
/// keep their maps alive (through their program) and keep enforcing until
/// they are replaced or released.
fn remove_map_pins(maps_dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(maps_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(pin_err(maps_dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| pin_err(maps_dir, e))?;
        remove_pin(&entry.path())?;
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
            None => Self::open().and_then(Self::load_open).map(|f| Self {
                outcome: PinOutcome::Unpinned,
                ..f
            }),
            Some(dir) => Self::load_pinned(dir),
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
    fn load_pinned(dir: &Path) -> Result<Self> {
        let maps_dir = dir.join(MAPS_DIR);
        let links_dir = dir.join(LINKS_DIR);
        for d in [&maps_dir, &links_dir] {
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
        let mut filter = Self::load_open(open)?;
        filter.pin_dir = Some(dir.to_owned());
        filter.outcome = match discarded {
            Some(reason) => PinOutcome::Discarded { reason },
            None if adopting => PinOutcome::Adopted,
            None => PinOutcome::Fresh,
        };
        if !adopting {
            // Written last: maps pinned without it read as an incomplete
            // set and are discarded by the next load.
            filter
                .meta
                .update(&key::META_KEY, &key::meta_value(key::LAYOUT_VERSION))?;
        }
        filter.pinned_links = filter.open_pinned_links(&links_dir, adopting)?;
        Ok(filter)
    }

    fn load_open(open: OpenObject) -> Result<Self> {
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
            meta: map(META)?,
            policies: map(POLICIES)?,
            rules: map(RULES)?,
            bindings: map(BINDINGS)?,
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
        Ok(filter)
    }

    /// Opens every link pinned under `links_dir`: links of cgroups this
    /// object's (adopted) maps filter are switched to this object's
    /// program and adopted; links of removed cgroups are unpinned; the
    /// rest are stale. Files that are not egress links are left alone.
    fn open_pinned_links(&self, links_dir: &Path, adopting: bool) -> Result<PinnedLinks> {
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
        for staged in names(links_dir)?.iter().filter(|n| n.ends_with(STAGED)) {
            let real = links_dir.join(staged.trim_end_matches(STAGED));
            let _ = fs::rename(links_dir.join(staged), real);
        }
        let filtered: BTreeSet<u64> = if adopting {
            self.cgroup_filters
                .keys()
                .iter()
                .filter_map(|k| Some(u64::from_ne_bytes(k.as_slice().try_into().ok()?)))
                .collect()
        } else {
            BTreeSet::new()
        };
        let program = self
            .object
            .progs()
            .find(|p| p.name().to_str() == Some(PROGRAM));
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
            let mut link = CgroupLink::from_pin(PROGRAM, &path, id, link);
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
        let Some(dir) = &self.pin_dir else {
            return Ok(());
        };
        let links = dir.join(LINKS_DIR);
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
        let mut state = PinnedState::default();
        let map = &self.cgroup_filters;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (id, set_id, flags) = key::decode_filter(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            state.filters.insert(id, (set_id, flags));
        }
        for (map, v6, verdict) in [
            (&self.allow_v4, false, Verdict::Allow),
            (&self.deny_v4, false, Verdict::Deny),
            (&self.allow_v6, true, Verdict::Allow),
            (&self.deny_v6, true, Verdict::Deny),
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
        let map = &self.policies;
        for k in map.keys() {
            let Some(v) = map.lookup(&k)? else { continue };
            let (id, kind) = key::decode_policy(&k, &v)
                .ok_or_else(|| map.layout(format!("an entry {k:02x?} => {v:02x?}")))?;
            state.ledger.entry(id).or_default().kind = Some(kind);
        }
        let map = &self.rules;
        for k in map.keys() {
            let (id, verdict, prefix) = key::decode_rule_key(&k)
                .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
            let policy = state.ledger.entry(id).or_default();
            match verdict {
                Verdict::Allow => policy.allow.insert(prefix),
                Verdict::Deny => policy.deny.insert(prefix),
            };
        }
        let map = &self.bindings;
        for k in map.keys() {
            let (id, cgroup) = key::decode_binding_key(&k)
                .ok_or_else(|| map.layout(format!("an undecodable key {k:02x?}")))?;
            state.ledger.entry(id).or_default().cgroups.insert(cgroup);
        }
        Ok(state)
    }

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
