//! The layout marker: reading it, writing it, and claiming a directory.

use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::Path;

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore as _, MapFlags, MapHandle, MapType};
use rustix::fs::FileType;
use rustix::io::Errno;

use super::fs::{self, io_err, refused};
use super::{
    lookup, Kind, Layout, MarkerState, PinError, Refusal, Result, BPF_FS_MAGIC, LAYOUT_VERSION,
    MARKER,
};

/// The marker value starts with these bytes.
const MAGIC: [u8; 16] = *b"kyverno-runtime\0";
/// `MAGIC`, the kind (u32), the layout version (u32), native endian.
const VALUE_SIZE: usize = 24;
const KEY: [u8; 4] = 0u32.to_ne_bytes();

fn value(kind: Kind) -> [u8; VALUE_SIZE] {
    let mut v = [0u8; VALUE_SIZE];
    v[..16].copy_from_slice(&MAGIC);
    v[16..20].copy_from_slice(&kind.code().to_ne_bytes());
    v[20..24].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
    v
}

/// Decodes a marker value: its kind, or why it is not one of ours.
pub(crate) fn decode(v: &[u8]) -> std::result::Result<Kind, String> {
    if v.len() != VALUE_SIZE || v[..16] != MAGIC {
        return Err("its value does not start with \"kyverno-runtime\"".to_owned());
    }
    let word = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&v[at..at + 4]);
        u32::from_ne_bytes(b)
    };
    let version = word(20);
    if version != LAYOUT_VERSION {
        return Err(format!(
            "layout version {version}; this build knows version {LAYOUT_VERSION} (use the cleanup of the build that made it)"
        ));
    }
    Kind::from_code(word(16)).ok_or_else(|| format!("unknown kind {}", word(16)))
}

/// The marker of the directory `dir` is open on.
pub(crate) fn read(dir: BorrowedFd<'_>) -> MarkerState {
    match fs::entry_type(dir, &MARKER.into()) {
        Ok(None) => return MarkerState::Absent,
        Ok(Some(FileType::RegularFile)) => {}
        Ok(Some(other)) => return MarkerState::NotOurs(format!("it is a {other:?}, not a pin")),
        Err(e) => return MarkerState::NotOurs(format!("cannot stat it: {e}")),
    }
    match read_map(dir) {
        Ok(kind) => MarkerState::Ours(kind),
        Err(why) => MarkerState::NotOurs(why),
    }
}

fn read_map(dir: BorrowedFd<'_>) -> std::result::Result<Kind, String> {
    let map = MapHandle::from_pinned_path(fs::proc_path(dir, MARKER))
        .map_err(|e| format!("cannot open it: {e:#}"))?;
    let object = fs::fd_object(map.as_fd())?;
    if object != fs::FdObject::Map {
        return Err(format!("it is not a map ({object:?})"));
    }
    let shape = (
        map.map_type(),
        map.key_size(),
        map.value_size(),
        map.max_entries(),
    );
    let want = (MapType::Array, 4, VALUE_SIZE as u32, 1);
    if shape != want || map.name().to_str() != Some(MARKER) {
        return Err(format!(
            "a map {:?} of (type, key size, value size, entries) {shape:?}, not {MARKER:?} {want:?}",
            map.name()
        ));
    }
    let v = map
        .lookup(&KEY, MapFlags::ANY)
        .map_err(|e| format!("cannot read it: {e:#}"))?
        .ok_or_else(|| "it has no element 0".to_owned())?;
    decode(&v)
}

/// Creates the marker of `kind` in the directory `dir` is open on: the
/// map is filled and frozen before it is pinned, so a marker is never seen
/// half written and no process can rewrite it.
pub(crate) fn write(dir: BorrowedFd<'_>, kind: Kind) -> std::result::Result<(), String> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    let mut map = MapHandle::create(MapType::Array, Some(MARKER), 4, VALUE_SIZE as u32, 1, &opts)
        .map_err(|e| format!("creating the map: {e:#}"))?;
    map.update(&KEY, &value(kind), MapFlags::ANY)
        .map_err(|e| format!("filling the map: {e:#}"))?;
    map.freeze()
        .map_err(|e| format!("freezing the map: {e:#}"))?;
    map.pin(fs::proc_path(dir, MARKER))
        .map_err(|e| format!("pinning the map: {e:#}"))
}

/// See [`super::claim`].
pub(crate) fn claim(dir: &Path, layout: &'static Layout) -> Result<()> {
    // Nothing is created unless it would be on a bpffs.
    for ancestor in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match rustix::fs::statfs(ancestor) {
            Ok(found) => {
                // The field's integer type differs between targets.
                #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
                let magic = found.f_type as i64 as u64 & 0xffff_ffff;
                if magic != BPF_FS_MAGIC {
                    return Err(refused(dir, Refusal::NotBpffs { magic }));
                }
                break;
            }
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io_err(dir, "statfs", e)),
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| PinError::Io {
        dir: dir.to_owned(),
        op: "creating",
        error: e,
    })?;
    let Some((fd, _, found)) = fs::open_checked(dir)? else {
        return Err(io_err(dir, "opening", Errno::NOENT));
    };
    if found.fs_magic != BPF_FS_MAGIC {
        return Err(refused(
            dir,
            Refusal::NotBpffs {
                magic: found.fs_magic,
            },
        ));
    }
    if found.mount_root {
        return Err(refused(dir, Refusal::MountRoot));
    }
    match found.marker {
        MarkerState::Ours(kind) if kind == layout.kind => Ok(()),
        MarkerState::Ours(kind) => Err(refused(
            dir,
            Refusal::WrongKind {
                found: kind,
                want: layout.kind,
            },
        )),
        MarkerState::NotOurs(why) => Err(refused(dir, Refusal::BadMarker(why))),
        MarkerState::Absent => {
            let names = fs::names(fd.as_fd()).map_err(|e| io_err(dir, "listing", e))?;
            let foreign: Vec<String> = names
                .iter()
                .map(|n| n.to_string_lossy().into_owned())
                .filter(|n| lookup(layout.entries, n).is_none())
                .collect();
            if !foreign.is_empty() {
                return Err(refused(dir, Refusal::ForeignEntries(foreign)));
            }
            write(fd.as_fd(), layout.kind).map_err(|message| PinError::Marker {
                dir: dir.to_owned(),
                message,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_value_decodes_to_its_kind() {
        for kind in [Kind::Daemon, Kind::OpenExec, Kind::Egress] {
            assert_eq!(decode(&value(kind)), Ok(kind));
        }
    }

    #[test]
    fn other_values_are_not_markers() {
        let mut magic = value(Kind::Egress);
        magic[0] = b'K';
        let mut version = value(Kind::Egress);
        version[20..24].copy_from_slice(&(LAYOUT_VERSION + 1).to_ne_bytes());
        let mut kind = value(Kind::Egress);
        kind[16..20].copy_from_slice(&9u32.to_ne_bytes());
        let cases: [(&[u8], &str); 5] = [
            (&magic, "does not start with"),
            (&value(Kind::Egress)[..20], "does not start with"),
            (&[0u8; VALUE_SIZE], "does not start with"),
            (&version, "layout version 2"),
            (&kind, "unknown kind 9"),
        ];
        for (v, want) in cases {
            match decode(v) {
                Err(why) => assert!(why.contains(want), "{why}"),
                Ok(k) => panic!("{v:?} decoded as {k:?}"),
            }
        }
    }
}
