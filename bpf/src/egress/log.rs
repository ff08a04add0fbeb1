//! Capturing libbpf's log (the verifier's included) while the filter loads.
//!
//! libbpf has one process-global print callback, and libbpf-rs's
//! [`libbpf_rs::set_print`] takes a plain `fn`: the callback appends to a
//! static buffer, and a [`Capture`] holds a lock for the load's duration so
//! two loads never mix their logs. The previous callback (e.g. the daemon's
//! tracing bridge) is restored when the capture ends.
//!
//! This is the mechanism of `probe::log`, which is private to the probes.
//! The two locks are distinct, so a probe and a filter load must not run
//! concurrently in one process (the daemon probes before it loads any
//! backend). Folding both into one crate-level module is a follow-up that
//! touches the probes.

use std::sync::{Mutex, MutexGuard, PoisonError};

use libbpf_rs::{PrintCallback, PrintLevel};

/// Bytes of log an [`EgressError::Load`](super::EgressError::Load)
/// carries: the end of the log, where libbpf says why it gave up.
const KEEP_BYTES: usize = 4 * 1024;

/// Bytes buffered before older output is discarded (a verifier log can be
/// megabytes; only its tail is kept anyway).
const BUFFER_BYTES: usize = 64 * 1024;

/// Held by the running load.
static LOADING: Mutex<()> = Mutex::new(());

/// What libbpf printed during the running load.
static LOG: Mutex<String> = Mutex::new(String::new());

/// Locks `m` even if a panicking thread poisoned it: the data stays usable,
/// and the callback runs inside libbpf, where a panic must never start.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn collect(_level: PrintLevel, msg: String) {
    let mut log = lock(&LOG);
    log.push_str(&msg);
    if log.len() > BUFFER_BYTES {
        let cut = tail_start(&log, KEEP_BYTES);
        log.drain(..cut);
    }
}

/// Byte offset where the last `max` bytes of `s` start, moved forward to a
/// character boundary and, when one is near, to the next line start.
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

/// The last ~`max` bytes of `s`, or `None` when it is only whitespace.
fn tail(s: &str, max: usize) -> Option<String> {
    let t = s[tail_start(s, max)..].trim_end();
    (!t.trim_start().is_empty()).then(|| t.to_owned())
}

/// libbpf's log, captured from [`Capture::start`] until drop.
pub(super) struct Capture {
    previous: Option<(PrintLevel, PrintCallback)>,
    // Released after `Drop::drop` restored the previous callback.
    _loading: MutexGuard<'static, ()>,
}

impl Capture {
    /// Waits for any other load to finish, then routes libbpf's warnings
    /// and info (a refused program's verifier log is a warning) here.
    pub(super) fn start() -> Self {
        let loading = lock(&LOADING);
        lock(&LOG).clear();
        let previous = libbpf_rs::set_print(Some((PrintLevel::Info, collect)));
        Self {
            previous,
            _loading: loading,
        }
    }

    /// The tail of what libbpf printed so far.
    pub(super) fn log(&self) -> Option<String> {
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
    fn keeps_the_end_of_long_logs_from_a_line_start() {
        assert_eq!(tail("libbpf: x\n", 100).as_deref(), Some("libbpf: x"));
        assert_eq!(tail(" \n", 100), None);
        let log: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let t = tail(&log, KEEP_BYTES).unwrap();
        assert!(t.len() <= KEEP_BYTES);
        assert!(t.starts_with("line ") && t.ends_with("line 999"));
        let wide = "é".repeat(3000);
        assert!(tail(&wide, 101).unwrap().chars().all(|c| c == 'é'));
    }
}
