//! Generates the push stream's message types, client and server from
//! `proto/` into `OUT_DIR`.
//!
//! `protox` parses the `.proto` files in Rust (its bundled well-known types
//! supply `google/protobuf/timestamp.proto`), so building needs no `protoc`
//! on the machine; `tonic-prost-build` turns the descriptors into code.

use anyhow::Context as _;

const PROTO_ROOT: &str = "proto";
const PROTO: &str = "kyverno_runtime/push/v1/push.proto";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let descriptors = protox::compile([PROTO], [PROTO_ROOT])
        .with_context(|| format!("compiling {PROTO_ROOT}/{PROTO}"))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)
        .context("generating the gRPC code")?;
    Ok(())
}
