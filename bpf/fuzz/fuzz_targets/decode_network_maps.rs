//! Fuzzes the decoders of the egress filter's and the protocol
//! classifier's maps (observation counters, learned addresses, sets,
//! domains, the restart ledger): none may panic on any bytes. Build without
//! KRT_BPF_STUB (the decoders read the skeleton's layouts).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kyverno_runtime_bpf::egress::fuzz_decode_maps(data);
    kyverno_runtime_bpf::protocol::fuzz_decode_maps(data);
});
