//! Helpers for tests of the pin directory (this crate's and the agent's
//! host tests): they create pins, never remove any.

use std::path::Path;

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore as _, MapFlags, MapHandle, MapType};

use super::{Entry, Kind, Layout};

/// Pins a new one-entry array map named `name` (truncated to the kernel's
/// 15 characters) at `path`: a stand-in for a map of ours, or a foreign
/// tool's map.
pub fn pin_map(path: &Path, name: &str) -> Result<(), String> {
    pin_array(path, name, 4, &[0; 4])
}

fn pin_array(path: &Path, name: &str, value_size: u32, value: &[u8]) -> Result<(), String> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    let short: String = name.chars().take(15).collect();
    let mut map = MapHandle::create(MapType::Array, Some(short), 4, value_size, 1, &opts)
        .map_err(|e| format!("creating map {name}: {e:#}"))?;
    map.update(&0u32.to_ne_bytes(), value, MapFlags::ANY)
        .map_err(|e| format!("filling map {name}: {e:#}"))?;
    map.pin(path)
        .map_err(|e| format!("pinning {}: {e:#}", path.display()))
}

/// Pins a stand-in map at every map name of `layout` under `dir` (which
/// must be claimed already), creating its plain subdirectories: the pins
/// a backend that cannot load on this kernel would make. Returns how many.
pub fn pin_stand_in_maps(dir: &Path, layout: &Layout) -> Result<usize, String> {
    fn walk(dir: &Path, entries: &[Entry]) -> Result<usize, String> {
        let mut made = 0;
        for entry in entries {
            match entry {
                Entry::Map(name) => {
                    pin_map(&dir.join(name), name)?;
                    made += 1;
                }
                Entry::Dir(name, sub) => {
                    let sub_dir = dir.join(name);
                    std::fs::create_dir_all(&sub_dir)
                        .map_err(|e| format!("creating {}: {e}", sub_dir.display()))?;
                    made += walk(&sub_dir, sub)?;
                }
                Entry::Link(_) | Entry::CgroupLinks | Entry::Marked(..) => {}
            }
        }
        Ok(made)
    }
    walk(dir, layout.entries)
}

/// Writes a marker of `kind` in `dir` with none of [`super::claim`]'s
/// checks: to prove that the checks of [`super::remove`] refuse a mount
/// root or a symlink even when it carries one.
pub fn write_marker_unchecked(dir: &Path, kind: Kind) -> Result<(), String> {
    let fd = std::fs::File::open(dir).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    super::marker::write(std::os::fd::AsFd::as_fd(&fd), kind)
}

/// Pins a map named like the marker at `dir/krt_pin_layout` whose value
/// is not a marker's (the same shape, other bytes).
pub fn pin_forged_marker(dir: &Path) -> Result<(), String> {
    let mut value = [0u8; 24];
    value[..16].copy_from_slice(b"someone-else\0\0\0\0");
    pin_array(&dir.join(super::MARKER), super::MARKER, 24, &value)
}
