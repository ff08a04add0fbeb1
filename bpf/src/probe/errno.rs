//! Naming the errnos that BPF syscalls return.
#![cfg_attr(krt_bpf_stub, allow(dead_code))]

/// Kernel-internal "operation not supported" (`include/linux/errno.h`),
/// distinct from `EOPNOTSUPP`; BPF returns it to userspace, e.g. from
/// `BPF_PROG_TEST_RUN` for a program type without test-run support, or
/// when attaching a program type the kernel has no trampoline for.
pub(crate) const ENOTSUPP: i32 = 524;

/// The symbolic name of `errno` (`EPERM`), for the errnos BPF calls return;
/// `None` for others.
pub(crate) fn name(errno: i32) -> Option<&'static str> {
    // Linux values (libc's), so the table follows the target.
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ELOOP => "ELOOP",
        libc::ENOMSG => "ENOMSG",
        libc::ENOLINK => "ENOLINK",
        libc::EPROTO => "EPROTO",
        libc::EBADMSG => "EBADMSG",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENOBUFS => "ENOBUFS",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EALREADY => "EALREADY",
        libc::ECANCELED => "ECANCELED",
        libc::ENOKEY => "ENOKEY",
        libc::EKEYREJECTED => "EKEYREJECTED",
        ENOTSUPP => "ENOTSUPP",
        _ => return None,
    })
}

/// `EPERM (Operation not permitted)`: the errno's name and the C library's
/// description of it (`errno N (...)` for an errno without a name here).
pub(crate) fn describe(errno: i32) -> String {
    let text = if errno == ENOTSUPP {
        // Not a userspace errno, so libc only knows it as "Unknown error 524".
        "Operation not supported".to_owned()
    } else {
        let full = std::io::Error::from_raw_os_error(errno).to_string();
        // std appends " (os error N)"; the name says that already.
        match full.rfind(" (os error ") {
            Some(at) => full[..at].to_owned(),
            None => full,
        }
    };
    match name(errno) {
        Some(name) => format!("{name} ({text})"),
        None => format!("errno {errno} ({text})"),
    }
}

/// The errno of the innermost `std::io::Error` in an error chain printed as
/// one line, i.e. the last `(os error N)` in `text`.
pub(crate) fn os_error_in(text: &str) -> Option<i32> {
    const MARK: &str = "(os error ";
    let at = text.rfind(MARK)? + MARK.len();
    let rest = &text[at..];
    let end = rest.find(')')?;
    rest[..end].parse().ok().filter(|n: &i32| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_common_bpf_errnos() {
        assert_eq!(describe(1), "EPERM (Operation not permitted)");
        assert_eq!(describe(libc::EINVAL), "EINVAL (Invalid argument)");
        assert_eq!(describe(libc::E2BIG), "E2BIG (Argument list too long)");
        assert_eq!(describe(ENOTSUPP), "ENOTSUPP (Operation not supported)");
        assert!(
            describe(4000).starts_with("errno 4000 ("),
            "{}",
            describe(4000)
        );
    }

    #[test]
    fn names_are_unique_and_round_trip_through_libc() {
        assert_eq!(name(libc::EOPNOTSUPP), Some("EOPNOTSUPP"));
        assert_eq!(name(libc::EACCES), Some("EACCES"));
        assert_eq!(name(0), None);
        assert_eq!(name(-1), None);
    }

    #[test]
    fn finds_the_innermost_os_error() {
        assert_eq!(
            os_error_in("failed to load: Operation not permitted (os error 1)"),
            Some(1)
        );
        assert_eq!(os_error_in("a (os error 22): b (os error 524)"), Some(524));
        assert_eq!(os_error_in("bad ELF"), None);
        assert_eq!(os_error_in("(os error x)"), None);
        assert_eq!(os_error_in("(os error 0)"), None);
        assert_eq!(os_error_in("(os error 7"), None);
    }
}
