//! The open/exec object against the kernel. Loaded through libbpf-rs's
//! generic object API (the handle owns its `Object`); every layout comes
//! from the skeleton's types. No `unsafe` here.

use std::mem::{offset_of, size_of};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use libbpf_rs::query::ProgInfoIter;
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, Program};

use super::{
    CgroupSlots, Decision, Denial, Dimension, Hooks, OpenExecError, OpenExecStats, PathRule,
    ProgramRunStats, RawObservation, Result, SlotMasks, NAME_KEY_LEN, OWNER_LEN, PATH_KEY_LEN,
    SLOTS,
};
use crate::libbpf_log::Capture;
use crate::pins;
use crate::ring::RecordReader;
use crate::skel::openexec::{fmod_ret, lsm};
use crate::sys::{self, errno};

use lsm::types;

/// `KRT_OE_LAYOUT_VERSION` in `openexec.h`.
const LAYOUT_VERSION: u32 = 2;

const CGROUPS: &str = "oe_cgroups";
const OPEN_PATHS: &str = "oe_open_paths";
const EXEC_PATHS: &str = "oe_exec_paths";
const CONFIG: &str = "oe_config";
const OWNERS: &str = "oe_owners";
const OBSERVATIONS: &str = "oe_observations";
const STATS: &str = "oe_stats";
const NAMES: &str = "oe_names";
const DENIALS: &str = "oe_denials";
const EXEC_RESOLVED: &str = "oe_exec_resolved";
const POD_FALLBACK: &str = "oe_pod_fallback";
const POD_EXEMPT: &str = "oe_pod_exempt";

/// Maps pinned: the pin layout's (`crate::pins`), the one list the
/// removal knows too.
const PINNED_MAPS: [&str; 11] = pins::OPENEXEC_MAPS;

/// (program, link pin) of each hook set; the pin names are the layout's.
const LSM_PROGRAMS: &[(&str, &str)] = &[
    ("krt_oe_lsm_file_open", pins::OPENEXEC_LSM_LINKS[0]),
    ("krt_oe_lsm_bprm_check", pins::OPENEXEC_LSM_LINKS[1]),
];
const FMOD_RET_PROGRAMS: &[(&str, &str)] = &[
    (
        "krt_oe_fmod_ret_file_open",
        pins::OPENEXEC_FMOD_RET_LINKS[0],
    ),
    (
        "krt_oe_fmod_ret_bprm_check",
        pins::OPENEXEC_FMOD_RET_LINKS[1],
    ),
];

// The layouts this code writes by hand must be the skeleton's.
const _: () = {
    assert!(size_of::<types::krt_oe_rule>() == 16);
    assert!(size_of::<types::krt_oe_cgroup>() == 16);
    assert!(size_of::<types::krt_oe_pod_fallback>() == 16);
    assert!(size_of::<types::krt_oe_owner>() == OWNER_LEN);
    assert!(
        offset_of!(types::krt_oe_event, path) + PATH_KEY_LEN == size_of::<types::krt_oe_event>()
    );
    assert!(size_of::<types::krt_oe_denial>() == super::DENIAL_RECORD_LEN);
    assert!(offset_of!(types::krt_oe_denial, ev) == 0);
    assert!(offset_of!(types::krt_oe_event, cgroup) == super::DENIAL_CGROUP_AT);
    assert!(offset_of!(types::krt_oe_event, dim) == super::DENIAL_DIM_AT);
    assert!(offset_of!(types::krt_oe_event, decision) == super::DENIAL_DECISION_AT);
    assert!(offset_of!(types::krt_oe_event, path) == super::DENIAL_PATH_AT);
    assert!(offset_of!(types::krt_oe_denial, pid) == super::DENIAL_PID_AT);
    assert!(offset_of!(types::krt_oe_denial, comm) == super::DENIAL_COMM_AT);
};

#[derive(Debug)]
struct Map {
    name: &'static str,
    handle: MapHandle,
}

impl Map {
    fn err(&self, op: &'static str, e: &libbpf_rs::Error) -> OpenExecError {
        match errno(e) {
            Some(libc::E2BIG | libc::ENOSPC | libc::ENOMEM) if op == "update" => {
                OpenExecError::MapFull {
                    map: self.name,
                    max_entries: self.handle.max_entries(),
                }
            }
            errno => OpenExecError::Map {
                map: self.name,
                op,
                errno,
                message: format!("{e:#}"),
            },
        }
    }

    fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.handle
            .lookup(key, MapFlags::ANY)
            .map_err(|e| self.err("lookup", &e))
    }

    fn update(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.handle
            .update(key, value, MapFlags::ANY)
            .map_err(|e| self.err("update", &e))
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        match self.handle.delete(key) {
            Err(e) if errno(&e) != Some(libc::ENOENT) => Err(self.err("delete", &e)),
            _ => Ok(()),
        }
    }

    fn layout(&self, what: String) -> OpenExecError {
        OpenExecError::Layout {
            map: self.name,
            what,
        }
    }

    /// Every key, each once.
    fn keys(&self) -> Vec<Vec<u8>> {
        sys::unique_keys(&self.handle)
    }
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

#[derive(Debug)]
pub(super) struct Inner {
    hooks: Hooks,
    adopted: bool,
    cgroups: Map,
    open_paths: Map,
    exec_paths: Map,
    config: Map,
    owners: Map,
    names: Map,
    observations: Map,
    stats: Map,
    denials: Map,
    exec_resolved: Map,
    pod_fallback: Map,
    pod_exempt: Map,
    /// The budget of denial records per cgroup and second, written with
    /// the masks (one config entry holds both).
    denials_per_sec: AtomicU32,
    /// The attached programs' links (dropping one detaches its program
    /// unless it is pinned).
    _links: Vec<Link>,
    object: Object,
}

fn pin_err(path: &Path, message: impl std::fmt::Display) -> OpenExecError {
    OpenExecError::Pin {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

impl Inner {
    pub(super) fn load(hooks: Hooks, pin_dir: Option<&Path>, paths: Option<u32>) -> Result<Self> {
        let Some(dir) = pin_dir else {
            return Self::load_once(hooks, None, paths);
        };
        // Marked as ours before the first pin goes in (and refused when it
        // is not a bpffs directory of this layout).
        pins::claim(dir, &pins::OPENEXEC).map_err(|e| pin_err(dir, e))?;
        match Self::load_once(hooks, Some(dir), paths) {
            Ok(inner) => Ok(inner),
            // Pinned maps this object cannot reuse (another layout): start
            // from fresh maps. The old links keep the old maps alive and
            // keep enforcing until the new links replace them.
            Err(OpenExecError::Load { .. } | OpenExecError::Layout { .. })
                if dir.join(CONFIG).exists() =>
            {
                for name in PINNED_MAPS {
                    let path = dir.join(name);
                    if path.exists() {
                        std::fs::remove_file(&path).map_err(|e| pin_err(&path, e))?;
                    }
                }
                Self::load_once(hooks, Some(dir), paths)
            }
            Err(e) => Err(e),
        }
    }

    fn load_once(hooks: Hooks, pin_dir: Option<&Path>, paths: Option<u32>) -> Result<Self> {
        let (bytes, programs) = match hooks {
            Hooks::BpfLsm => (lsm::OBJECT, LSM_PROGRAMS),
            Hooks::FmodRet => (fmod_ret::OBJECT, FMOD_RET_PROGRAMS),
        };
        let adopted = pin_dir.is_some_and(|d| d.join(CONFIG).exists());
        let capture = Capture::start();
        let mut open =
            ObjectBuilder::default()
                .open_memory(bytes)
                .map_err(|e| OpenExecError::Open {
                    hooks: hooks.name(),
                    message: format!("{e:#}"),
                })?;
        if let Some(paths) = paths {
            for mut map in open.maps_mut() {
                let name = map.name().to_str().unwrap_or_default().to_owned();
                if [OPEN_PATHS, EXEC_PATHS, NAMES].contains(&name.as_str()) {
                    map.set_max_entries(paths)
                        .map_err(|e| OpenExecError::Open {
                            hooks: hooks.name(),
                            message: format!("sizing map {name}: {e:#}"),
                        })?;
                }
            }
        }
        if let Some(dir) = pin_dir {
            for mut map in open.maps_mut() {
                let name = map.name().to_str().unwrap_or_default().to_owned();
                if PINNED_MAPS.contains(&name.as_str()) {
                    let path = dir.join(&name);
                    map.set_pin_path(&path)
                        .map_err(|e| pin_err(&path, format!("{e:#}")))?;
                }
            }
        }
        let object = open.load().map_err(|e| OpenExecError::Load {
            hooks: hooks.name(),
            errno: errno(&e),
            message: format!("{e:#}"),
            verifier_log: capture.log(),
        })?;
        drop(capture);

        let map = |name: &'static str| -> Result<Map> {
            let m = object
                .maps()
                .find(|m| m.name().to_str() == Some(name))
                .ok_or_else(|| OpenExecError::Load {
                    hooks: hooks.name(),
                    errno: None,
                    message: format!("the object has no map {name}"),
                    verifier_log: None,
                })?;
            let handle = MapHandle::try_from(&m).map_err(|e| OpenExecError::Load {
                hooks: hooks.name(),
                errno: errno(&e),
                message: format!("duplicating the fd of map {name}: {e:#}"),
                verifier_log: None,
            })?;
            Ok(Map { name, handle })
        };
        let mut inner = Self {
            hooks,
            adopted,
            cgroups: map(CGROUPS)?,
            open_paths: map(OPEN_PATHS)?,
            exec_paths: map(EXEC_PATHS)?,
            config: map(CONFIG)?,
            owners: map(OWNERS)?,
            names: map(NAMES)?,
            observations: map(OBSERVATIONS)?,
            stats: map(STATS)?,
            denials: map(DENIALS)?,
            exec_resolved: map(EXEC_RESOLVED)?,
            pod_fallback: map(POD_FALLBACK)?,
            pod_exempt: map(POD_EXEMPT)?,
            denials_per_sec: AtomicU32::new(0),
            _links: Vec::new(),
            object,
        };

        let config = inner.read_config()?;
        if adopted && config.layout_version != LAYOUT_VERSION {
            return Err(inner.config.layout(format!(
                "layout version {} (this build writes {LAYOUT_VERSION})",
                config.layout_version
            )));
        }
        if adopted {
            inner
                .denials_per_sec
                .store(config.denials_per_sec, Ordering::Relaxed);
        } else {
            inner.write_config(&SlotMasks::default())?;
        }

        let mut links = Vec::new();
        for (program, pin) in programs {
            let prog = inner
                .object
                .progs_mut()
                .find(|p| p.name().to_str() == Some(program))
                .ok_or_else(|| OpenExecError::Load {
                    hooks: hooks.name(),
                    errno: None,
                    message: format!("the object has no program {program}"),
                    verifier_log: None,
                })?;
            let mut link = prog.attach().map_err(|e| OpenExecError::Attach {
                program,
                errno: errno(&e),
                message: format!("{e:#}"),
            })?;
            if let Some(dir) = pin_dir {
                replace_pin(&mut link, &dir.join(pin))?;
            }
            links.push(link);
        }
        // Only now that this object's programs are attached do the other
        // hook set's pinned links go (a switch between BPF-LSM and
        // fmod_ret never leaves a moment without enforcement).
        if let Some(dir) = pin_dir {
            let ours: Vec<&str> = programs.iter().map(|(_, pin)| *pin).collect();
            for (_, pin) in LSM_PROGRAMS.iter().chain(FMOD_RET_PROGRAMS) {
                let path = dir.join(pin);
                if !ours.contains(pin) && path.exists() {
                    std::fs::remove_file(&path).map_err(|e| pin_err(&path, e))?;
                }
            }
        }
        inner._links = links;
        Ok(inner)
    }

    pub(super) fn hooks(&self) -> Hooks {
        self.hooks
    }

    pub(super) fn adopted(&self) -> bool {
        self.adopted
    }

    fn paths(&self, dim: Dimension) -> &Map {
        match dim {
            Dimension::Open => &self.open_paths,
            Dimension::Exec => &self.exec_paths,
        }
    }

    fn owner_key(dim: Dimension, slot: usize) -> Result<[u8; 4]> {
        if slot >= SLOTS {
            return Err(OpenExecError::Invalid(format!(
                "slot {slot} is not below {SLOTS}"
            )));
        }
        let index = u32::try_from(dim.index() * SLOTS + slot)
            .map_err(|_| OpenExecError::Invalid(format!("slot {slot}")))?;
        Ok(index.to_ne_bytes())
    }

    pub(super) fn owner(&self, dim: Dimension, slot: usize) -> Result<Option<Vec<u8>>> {
        let key = Self::owner_key(dim, slot)?;
        let value = self.owners.lookup(&key)?.ok_or_else(|| {
            self.owners
                .layout(format!("no entry at index of slot {slot}"))
        })?;
        let id: Vec<u8> = value.iter().copied().take_while(|b| *b != 0).collect();
        Ok((!id.is_empty()).then_some(id))
    }

    pub(super) fn set_owner(
        &self,
        dim: Dimension,
        slot: usize,
        owner: Option<&[u8]>,
    ) -> Result<()> {
        let key = Self::owner_key(dim, slot)?;
        let mut value = [0u8; OWNER_LEN];
        if let Some(id) = owner {
            if id.is_empty() || id.len() >= OWNER_LEN || id.contains(&0) {
                return Err(OpenExecError::Invalid(format!(
                    "owner id of {} bytes (1 to {} without NUL)",
                    id.len(),
                    OWNER_LEN - 1
                )));
            }
            put(&mut value, 0, id);
        }
        self.owners.update(&key, &value)
    }

    pub(super) fn rule(&self, dim: Dimension, path: &[u8; PATH_KEY_LEN]) -> Result<PathRule> {
        let map = self.paths(dim);
        match map.lookup(path)? {
            None => Ok(PathRule::default()),
            Some(v) => {
                decode_rule(&v).ok_or_else(|| map.layout(format!("a rule of {} bytes", v.len())))
            }
        }
    }

    pub(super) fn set_rule(
        &self,
        dim: Dimension,
        path: &[u8; PATH_KEY_LEN],
        rule: PathRule,
    ) -> Result<()> {
        let map = self.paths(dim);
        if rule.is_empty() {
            return map.delete(path);
        }
        let mut value = [0u8; 16];
        put(
            &mut value,
            offset_of!(types::krt_oe_rule, deny),
            &rule.deny.to_ne_bytes(),
        );
        put(
            &mut value,
            offset_of!(types::krt_oe_rule, allow),
            &rule.allow.to_ne_bytes(),
        );
        map.update(path, &value)
    }

    pub(super) fn rules(&self, dim: Dimension) -> Result<Vec<([u8; PATH_KEY_LEN], PathRule)>> {
        let map = self.paths(dim);
        let mut out = Vec::new();
        for key in map.keys() {
            let path: [u8; PATH_KEY_LEN] = key
                .as_slice()
                .try_into()
                .map_err(|_| map.layout(format!("a key of {} bytes", key.len())))?;
            // Deleted since the walk: skip.
            let Some(v) = map.lookup(&key)? else { continue };
            let rule = decode_rule(&v)
                .ok_or_else(|| map.layout(format!("a rule of {} bytes", v.len())))?;
            out.push((path, rule));
        }
        Ok(out)
    }

    pub(super) fn set_name(&self, name: &[u8; NAME_KEY_LEN], present: bool) -> Result<()> {
        if present {
            self.names.update(name, &[1])
        } else {
            self.names.delete(name)
        }
    }

    pub(super) fn names(&self) -> Result<Vec<[u8; NAME_KEY_LEN]>> {
        self.names
            .keys()
            .into_iter()
            .map(|k| {
                k.as_slice()
                    .try_into()
                    .map_err(|_| self.names.layout(format!("a key of {} bytes", k.len())))
            })
            .collect()
    }

    pub(super) fn cgroup(&self, cgroup: u64) -> Result<CgroupSlots> {
        match self.cgroups.lookup(&cgroup.to_ne_bytes())? {
            None => Ok(CgroupSlots::default()),
            Some(v) => decode_cgroup(&v)
                .ok_or_else(|| self.cgroups.layout(format!("a value of {} bytes", v.len()))),
        }
    }

    pub(super) fn set_cgroup(&self, cgroup: u64, slots: CgroupSlots) -> Result<()> {
        if cgroup == 0 {
            return Err(OpenExecError::Invalid("cgroup id 0".to_owned()));
        }
        let key = cgroup.to_ne_bytes();
        if slots.is_empty() {
            return self.cgroups.delete(&key);
        }
        let mut value = [0u8; 16];
        let at = offset_of!(types::krt_oe_cgroup, slots);
        put(&mut value, at, &slots.0[0].to_ne_bytes());
        put(&mut value, at + 8, &slots.0[1].to_ne_bytes());
        self.cgroups.update(&key, &value)
    }

    pub(super) fn cgroups(&self) -> Result<Vec<(u64, CgroupSlots)>> {
        let mut out = Vec::new();
        for key in self.cgroups.keys() {
            let id = u64_at(&key, 0)
                .ok_or_else(|| self.cgroups.layout(format!("a key of {} bytes", key.len())))?;
            let Some(v) = self.cgroups.lookup(&key)? else {
                continue;
            };
            let slots = decode_cgroup(&v)
                .ok_or_else(|| self.cgroups.layout(format!("a value of {} bytes", v.len())))?;
            out.push((id, slots));
        }
        Ok(out)
    }

    fn read_config(&self) -> Result<types::krt_oe_config> {
        let v = self
            .config
            .lookup(&0u32.to_ne_bytes())?
            .ok_or_else(|| self.config.layout("no entry 0".to_owned()))?;
        let bad = || self.config.layout(format!("a value of {} bytes", v.len()));
        let dd = offset_of!(types::krt_oe_config, default_deny);
        let ob = offset_of!(types::krt_oe_config, observe);
        Ok(types::krt_oe_config {
            default_deny: [
                u64_at(&v, dd).ok_or_else(bad)?,
                u64_at(&v, dd + 8).ok_or_else(bad)?,
            ],
            observe: [
                u64_at(&v, ob).ok_or_else(bad)?,
                u64_at(&v, ob + 8).ok_or_else(bad)?,
            ],
            layout_version: u32_at(&v, offset_of!(types::krt_oe_config, layout_version))
                .ok_or_else(bad)?,
            denials_per_sec: u32_at(&v, offset_of!(types::krt_oe_config, denials_per_sec))
                .ok_or_else(bad)?,
        })
    }

    fn write_config(&self, masks: &SlotMasks) -> Result<()> {
        let mut value = vec![0u8; size_of::<types::krt_oe_config>()];
        let dd = offset_of!(types::krt_oe_config, default_deny);
        let ob = offset_of!(types::krt_oe_config, observe);
        for i in 0..2 {
            put(&mut value, dd + 8 * i, &masks.default_deny[i].to_ne_bytes());
            put(&mut value, ob + 8 * i, &masks.observe[i].to_ne_bytes());
        }
        put(
            &mut value,
            offset_of!(types::krt_oe_config, layout_version),
            &LAYOUT_VERSION.to_ne_bytes(),
        );
        put(
            &mut value,
            offset_of!(types::krt_oe_config, denials_per_sec),
            &self.denials_per_sec.load(Ordering::Relaxed).to_ne_bytes(),
        );
        self.config.update(&0u32.to_ne_bytes(), &value)
    }

    pub(super) fn set_denial_rate(&self, per_second: u32) -> Result<()> {
        let masks = self.masks()?;
        self.denials_per_sec.store(per_second, Ordering::Relaxed);
        self.write_config(&masks)
    }

    pub(super) fn denial_rate(&self) -> Result<u32> {
        Ok(self.read_config()?.denials_per_sec)
    }

    pub(super) fn set_pod_fallback(&self, on: bool) -> Result<()> {
        // The hits so far are kept: the value is read, then rewritten.
        let mut value = vec![0u8; size_of::<types::krt_oe_pod_fallback>()];
        if let Some(old) = self.pod_fallback.lookup(&0u32.to_ne_bytes())? {
            if old.len() == value.len() {
                value.copy_from_slice(&old);
            }
        }
        put(
            &mut value,
            offset_of!(types::krt_oe_pod_fallback, on),
            &u32::from(on).to_ne_bytes(),
        );
        self.pod_fallback.update(&0u32.to_ne_bytes(), &value)
    }

    pub(super) fn set_pod_exempt(&self, cgroup: u64, exempt: bool) -> Result<()> {
        let key = cgroup.to_ne_bytes();
        if exempt {
            self.pod_exempt.update(&key, &[1])
        } else {
            self.pod_exempt.delete(&key)
        }
    }

    pub(super) fn pod_fallback(&self) -> Result<(bool, u64)> {
        let value = self
            .pod_fallback
            .lookup(&0u32.to_ne_bytes())?
            .unwrap_or_default();
        let on = u32_at(&value, offset_of!(types::krt_oe_pod_fallback, on));
        let hits = u64_at(&value, offset_of!(types::krt_oe_pod_fallback, hits));
        match (on, hits) {
            (Some(on), Some(hits)) => Ok((on != 0, hits)),
            _ => Err(self
                .pod_fallback
                .layout(format!("{} bytes, not a krt_oe_pod_fallback", value.len()))),
        }
    }

    pub(super) fn exec_resolved_map(&self) -> Result<MapHandle> {
        MapHandle::try_from(&self.exec_resolved.handle).map_err(|e| OpenExecError::Map {
            map: EXEC_RESOLVED,
            op: "duplicate",
            errno: errno(&e),
            message: format!("{e:#}"),
        })
    }

    pub(super) fn denial_reader(&self) -> Result<RecordReader<Denial>> {
        Ok(crate::ring::reader(
            DENIALS,
            &self.denials.handle,
            super::decode_denial,
        )?)
    }

    pub(super) fn masks(&self) -> Result<SlotMasks> {
        let c = self.read_config()?;
        Ok(SlotMasks {
            default_deny: c.default_deny,
            observe: c.observe,
        })
    }

    pub(super) fn set_masks(&self, masks: &SlotMasks) -> Result<()> {
        self.write_config(masks)
    }

    pub(super) fn drain_observations(&self) -> Result<Vec<RawObservation>> {
        let map = &self.observations;
        // Decode every key before consuming any: a key this code cannot
        // read fails the drain with the map intact.
        let keys = map.keys();
        let decoded = keys
            .iter()
            .map(|raw| {
                decode_event(raw)
                    .ok_or_else(|| map.layout(format!("an undecodable key {raw:02x?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let values = sys::take_each(&map.handle, &keys).map_err(|(op, e)| map.err(op, &e))?;
        let mut out = Vec::with_capacity(keys.len());
        for ((cgroup, dimension, decision, path), value) in decoded.into_iter().zip(values) {
            let Some(value) = value else { continue };
            let count = u64_at(&value, 0)
                .ok_or_else(|| map.layout(format!("a count of {} bytes", value.len())))?;
            if count > 0 {
                out.push(RawObservation {
                    cgroup,
                    dimension,
                    decision,
                    path,
                    count,
                });
            }
        }
        Ok(out)
    }

    pub(super) fn stats(&self) -> Result<OpenExecStats> {
        let map = &self.stats;
        let per_cpu = map
            .handle
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| map.err("lookup", &e))?
            .ok_or_else(|| map.layout("no entry 0".to_owned()))?;
        let mut total = OpenExecStats::default();
        let bad = |len: usize| map.layout(format!("a per-CPU value of {len} bytes"));
        for v in per_cpu {
            let at = |off: usize| u64_at(&v, off).ok_or_else(|| bad(v.len()));
            let d = offset_of!(types::krt_oe_stats, decisions);
            for dim in 0..2 {
                for dec in 0..4 {
                    total.decisions[dim][dec] += at(d + 8 * (dim * 4 + dec))?;
                }
                total.unresolved_passed[dim] +=
                    at(offset_of!(types::krt_oe_stats, unresolved_passed) + 8 * dim)?;
                total.unresolved_denied[dim] +=
                    at(offset_of!(types::krt_oe_stats, unresolved_denied) + 8 * dim)?;
            }
            total.observe_failed += at(offset_of!(types::krt_oe_stats, observe_failed))?;
            total.denials_sent += at(offset_of!(types::krt_oe_stats, denials_sent))?;
            total.denials_rate_limited +=
                at(offset_of!(types::krt_oe_stats, denials_rate_limited))?;
            total.denials_ringbuf_full +=
                at(offset_of!(types::krt_oe_stats, denials_ringbuf_full))?;
        }
        Ok(total)
    }

    pub(super) fn run_stats(&self) -> Result<Vec<ProgramRunStats>> {
        let mut ids = Vec::new();
        for prog in self.object.progs() {
            let id = Program::id_from_fd(prog.as_fd()).map_err(|e| OpenExecError::Map {
                map: "programs",
                op: "get info",
                errno: errno(&e),
                message: format!("{e:#}"),
            })?;
            ids.push((id, prog.name().to_string_lossy().into_owned()));
        }
        let mut out = Vec::new();
        for info in ProgInfoIter::default() {
            if let Some((_, name)) = ids.iter().find(|(id, _)| *id == info.id) {
                out.push(ProgramRunStats {
                    name: name.clone(),
                    run_time_ns: info.run_time_ns,
                    run_count: info.run_cnt,
                });
            }
        }
        Ok(out)
    }
}

/// Pins `link` at `path`, replacing a link pinned there before only once
/// the new one is pinned: bpffs renames atomically, so the hook always has
/// a program (old or new) attached.
fn replace_pin(link: &mut Link, path: &Path) -> Result<()> {
    // bpffs refuses names with a dot.
    let mut staged = PathBuf::from(path).into_os_string();
    staged.push(pins::STAGED_SUFFIX);
    let staged = PathBuf::from(staged);
    if staged.exists() {
        std::fs::remove_file(&staged).map_err(|e| pin_err(&staged, e))?;
    }
    link.pin(&staged)
        .map_err(|e| pin_err(&staged, format!("{e:#}")))?;
    if std::fs::rename(&staged, path).is_err() {
        // A bpffs without rename: drop the old pin first (the old program
        // detaches a moment before the new pin exists; the new link is
        // already attached, so enforcement has no gap).
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| pin_err(path, e))?;
        }
        std::fs::rename(&staged, path).map_err(|e| pin_err(path, e))?;
    }
    Ok(())
}

fn decode_rule(v: &[u8]) -> Option<PathRule> {
    Some(PathRule {
        deny: u64_at(v, offset_of!(types::krt_oe_rule, deny))?,
        allow: u64_at(v, offset_of!(types::krt_oe_rule, allow))?,
    })
}

fn decode_cgroup(v: &[u8]) -> Option<CgroupSlots> {
    let at = offset_of!(types::krt_oe_cgroup, slots);
    Some(CgroupSlots([u64_at(v, at)?, u64_at(v, at + 8)?]))
}

/// `(cgroup, dimension, decision, path)` of an observation key.
fn decode_event(raw: &[u8]) -> Option<(u64, Dimension, Decision, Vec<u8>)> {
    if raw.len() != size_of::<types::krt_oe_event>() {
        return None;
    }
    let cgroup = u64_at(raw, offset_of!(types::krt_oe_event, cgroup))?;
    let dimension = match u32_at(raw, offset_of!(types::krt_oe_event, dim))? {
        0 => Dimension::Open,
        1 => Dimension::Exec,
        _ => return None,
    };
    let decision = Decision::from_raw(u32_at(raw, offset_of!(types::krt_oe_event, decision))?)?;
    let path_at = offset_of!(types::krt_oe_event, path);
    let path = raw
        .get(path_at..)?
        .iter()
        .copied()
        .take_while(|b| *b != 0)
        .collect();
    Some((cgroup, dimension, decision, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every map the pin layout names is a map of both objects, so each
    /// hook set's load pins all of them.
    #[test]
    fn the_pin_layout_names_maps_of_both_objects() {
        for (hooks, bytes) in [
            (Hooks::BpfLsm, lsm::OBJECT),
            (Hooks::FmodRet, fmod_ret::OBJECT),
        ] {
            let open = ObjectBuilder::default()
                .open_memory(bytes)
                .unwrap_or_else(|e| panic!("{hooks:?}: {e:#}"));
            let names: Vec<String> = open
                .maps()
                .map(|m| m.name().to_string_lossy().into_owned())
                .collect();
            for name in PINNED_MAPS {
                assert!(
                    names.iter().any(|n| n == name),
                    "{hooks:?}: {name} not in {names:?}"
                );
            }
        }
    }
}
