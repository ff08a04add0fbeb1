//! Fuzzes the exec tracer's record decoder: it must never panic, and a
//! record it accepts with UTF-8 strings must re-encode to its own bytes
//! (`kyverno_runtime_bpf::exectrace::fuzz_decode_exec` asserts both).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kyverno_runtime_bpf::exectrace::fuzz_decode_exec(data);
});
