//! libFuzzer's entry to the `cel_expr` harness; `harness/cel_expr.rs` says what
//! it fuzzes and the invariants it asserts. The same harness runs on stable
//! in every `cargo test` (agent/tests/fuzz_corpora.rs).

#![no_main]

#[path = "../harness/common.rs"]
mod common;
#[path = "../harness/cel_expr.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::fuzz_one(data));
