//! Small facts about libbpf-rs errors that every backend's kernel code
//! needs, kept in one place.

/// Kernel-internal "operation not supported", returned by
/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` for hash maps before 5.14.
pub(crate) const ENOTSUPP: i32 = 524;

/// The errno at the bottom of a libbpf-rs error: every error from a failed
/// syscall ends in a `std::io::Error` built from the raw OS error, whose
/// text ends in `(os error N)` (libbpf-rs does not expose it otherwise).
pub(crate) fn errno(err: &libbpf_rs::Error) -> Option<i32> {
    const MARK: &str = "(os error ";
    let text = format!("{err:#}");
    let rest = &text[text.rfind(MARK)? + MARK.len()..];
    rest[..rest.find(')')?]
        .parse()
        .ok()
        .filter(|n: &i32| *n > 0)
}

/// Whether a `BPF_MAP_LOOKUP_AND_DELETE_ELEM` failed because the kernel
/// has none for hash maps (ENOTSUPP before 5.14; the others for kernels
/// that refuse the command or its flags).
pub(crate) fn lacks_lookup_and_delete(err: &libbpf_rs::Error) -> bool {
    matches!(errno(err), Some(ENOTSUPP | libc::EOPNOTSUPP | libc::EINVAL))
}

/// Every key of `map`, each once. Deleting or evicting under a walk restarts
/// it, so a key may come back and is folded; the walk is bounded at twice
/// the capacity in case the program inserts faster than it advances.
pub(crate) fn unique_keys(map: &libbpf_rs::MapHandle) -> Vec<Vec<u8>> {
    use libbpf_rs::MapCore as _;
    let bound = usize::try_from(map.max_entries())
        .unwrap_or(usize::MAX)
        .saturating_mul(2);
    let mut seen = std::collections::HashSet::new();
    map.keys()
        .take(bound)
        .filter(|k| seen.insert(k.clone()))
        .collect()
}

/// Reads and resets each of `keys` in a counter map, in order: `None` for a
/// key gone since it was listed. Uses `BPF_MAP_LOOKUP_AND_DELETE_ELEM`, or,
/// where the kernel has none for hash maps (before 5.14), a lookup then a
/// delete (an increment between the two is lost). A failure names the
/// operation that failed, for the caller's error.
pub(crate) fn take_each(
    map: &libbpf_rs::MapHandle,
    keys: &[Vec<u8>],
) -> Result<Vec<Option<Vec<u8>>>, (&'static str, libbpf_rs::Error)> {
    use libbpf_rs::{MapCore as _, MapFlags};
    let lookup_then_delete = |key: &[u8]| {
        let value = map.lookup(key, MapFlags::ANY).map_err(|e| ("lookup", e))?;
        match map.delete(key) {
            Err(e) if errno(&e) != Some(libc::ENOENT) => Err(("delete", e)),
            _ => Ok(value),
        }
    };
    let mut atomic = true;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let value = if atomic {
            match map.lookup_and_delete(key) {
                Ok(v) => v,
                Err(e) if lacks_lookup_and_delete(&e) => {
                    atomic = false;
                    lookup_then_delete(key)?
                }
                Err(e) => return Err(("lookup_and_delete", e)),
            }
        } else {
            lookup_then_delete(key)?
        };
        out.push(value);
    }
    Ok(out)
}
