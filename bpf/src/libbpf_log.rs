//! Capturing libbpf's log (including verifier logs) while one object loads.
//!
//! libbpf has one process-global print callback, and libbpf-rs's
//! [`libbpf_rs::set_print`] takes a plain `fn`, not a closure; so the
//! callback appends to a static buffer, and a [`Capture`] holds a process-wide
//! lock for the load's duration so two loads never mix their logs (which
//! also serializes them). Every backend (probe, egress, protocol, dns) uses
//! this one module, so there is one lock for the whole process. The previous
//! callback (e.g. the daemon's tracing bridge) is restored when the capture
//! ends.

use std::sync::{Mutex, MutexGuard, PoisonError};

use libbpf_rs::{PrintCallback, PrintLevel};

/// Bytes of log a load error carries: the end of the log, where libbpf
/// prints why it gave up.
pub(crate) const KEEP_BYTES: usize = 4 * 1024;

/// Bytes buffered before older output is discarded (a verifier log can be
/// megabytes; only its tail is kept anyway).
const BUFFER_BYTES: usize = 64 * 1024;

/// Held by the running load.
static LOADING: Mutex<()> = Mutex::new(());

/// What libbpf printed during the running load.
static LOG: Mutex<String> = Mutex::new(String::new());

/// Locks `m` even if a panicking thread poisoned it: the data (a log buffer,
/// or nothing) stays usable, and the callback runs inside libbpf, where a
/// panic must never start.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The libbpf print callback installed during a capture.
fn collect(_level: PrintLevel, msg: String) {
    let mut log = lock(&LOG);
    log.push_str(&msg);
    if log.len() > BUFFER_BYTES {
        let cut = tail_start(&log, KEEP_BYTES);
        log.drain(..cut);
    }
}

/// Byte offset where the last `max` bytes of `s` start, moved forward to a
/// character boundary, and to the next line start when one is near
/// (so the kept log does not begin mid-line).
fn tail_start(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return 0;
    }
    let mut at = s.len() - max;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    match s[at..].find('\n') {
        Some(nl) if nl < 256 && at + nl + 1 < s.len() => at + nl + 1,
        _ => at,
    }
}

/// The last ~`max` bytes of `s`, or `None` when it holds nothing but
/// whitespace.
pub(crate) fn tail(s: &str, max: usize) -> Option<String> {
    let t = s[tail_start(s, max)..].trim_end();
    (!t.trim_start().is_empty()).then(|| t.to_owned())
}

/// libbpf's log, captured from [`Capture::start`] until drop.
pub(crate) struct Capture {
    previous: Option<(PrintLevel, PrintCallback)>,
    // Released after `Drop::drop` restored the previous callback.
    _probe: MutexGuard<'static, ()>,
}

impl Capture {
    /// Waits for any other probe to finish, then routes libbpf's messages
    /// (warnings and info; libbpf prints a refused program's verifier log as
    /// a warning) into the buffer.
    pub(crate) fn start() -> Self {
        let probe = lock(&LOADING);
        lock(&LOG).clear();
        let previous = libbpf_rs::set_print(Some((PrintLevel::Info, collect)));
        Self {
            previous,
            _probe: probe,
        }
    }

    /// The tail of what libbpf printed so far (see [`tail`]).
    pub(crate) fn log(&self) -> Option<String> {
        tail(&lock(&LOG), KEEP_BYTES)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        libbpf_rs::set_print(self.previous.take());
        lock(&LOG).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_logs_are_kept_whole() {
        assert_eq!(tail("libbpf: x\n", 100).as_deref(), Some("libbpf: x"));
        assert_eq!(tail(" \n\n", 100), None);
        assert_eq!(tail("", 100), None);
    }

    #[test]
    fn long_logs_keep_their_end_from_a_line_start() {
        let log: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let t = tail(&log, KEEP_BYTES).unwrap();
        assert!(t.len() <= KEEP_BYTES);
        assert!(t.ends_with("line 999"));
        assert!(t.starts_with("line "), "{}", &t[..20]);
    }

    #[test]
    fn tail_never_splits_a_character() {
        let log = "é".repeat(3000);
        let t = tail(&log, 101).unwrap();
        assert!(t.len() <= 101);
        assert!(t.chars().all(|c| c == 'é'));
    }

    #[test]
    fn capture_collects_and_restores() {
        fn before(_: PrintLevel, _: String) {}
        let outer = libbpf_rs::set_print(Some((PrintLevel::Warn, before)));
        {
            let capture = Capture::start();
            collect(PrintLevel::Warn, "libbpf: refused\n".to_owned());
            assert_eq!(capture.log().as_deref(), Some("libbpf: refused"));
        }
        let restored = libbpf_rs::get_print();
        assert_eq!(restored.map(|(level, _)| level), Some(PrintLevel::Warn));
        libbpf_rs::set_print(outer);
    }
}
