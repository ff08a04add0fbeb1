//! Fuzzes the refusal record decoder of the open/exec programs: it must
//! never panic, and a record it accepts must re-encode to its own bytes
//! (`kyverno_runtime_bpf::openexec::fuzz_decode_denial` asserts both).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kyverno_runtime_bpf::openexec::fuzz_decode_denial(data);
});
