//! libFuzzer's entry to the `collector_decode` harness; `harness/collector_decode.rs` says what
//! it fuzzes and the invariants it asserts. The same harness runs on stable
//! in every `cargo test` (agent/tests/fuzz_corpora.rs).

#![no_main]

#[path = "../harness/collector_decode.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::fuzz_one(data));
