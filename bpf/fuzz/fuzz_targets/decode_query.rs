//! Fuzzes the DNS question record decoder: it must never panic, and a
//! record it accepts must re-encode to its own key
//! (`kyverno_runtime_bpf::dns::fuzz_decode_query` asserts both).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kyverno_runtime_bpf::dns::fuzz_decode_query(data);
});
