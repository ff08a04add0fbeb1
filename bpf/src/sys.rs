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
