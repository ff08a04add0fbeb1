//! libFuzzer's entry to the `policy_yaml` harness; `harness/policy_yaml.rs` says what
//! it fuzzes and the invariants it asserts. The same harness runs on stable
//! in every `cargo test` (agent/tests/fuzz_corpora.rs).

#![no_main]

#[path = "../harness/common.rs"]
mod common;
#[path = "../harness/policy_yaml.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::fuzz_one(data));
