//! Generates NRI's messages and ttRPC bindings from `proto/api.proto`
//! (containerd/nri's `pkg/api/api.proto` at 8ec8b28, the v0.12 line
//! containerd 2.2 to 2.4 builds with; unchanged).
//!
//! The generated files open with inner attributes (`#![allow(..)]`),
//! which `include!` cannot take inside a module; they are dropped here and
//! the module that includes them carries the allowances instead.

use std::path::{Path, PathBuf};

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let out = PathBuf::from(
        std::env::var_os("OUT_DIR").ok_or_else(|| std::io::Error::other("OUT_DIR unset"))?,
    );
    let generated = out.join("generated");
    std::fs::create_dir_all(&generated)?;
    ttrpc_codegen::Codegen::new()
        .out_dir(&generated)
        .input("proto/api.proto")
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .run()?;
    for name in ["api.rs", "api_ttrpc.rs"] {
        strip_inner_attributes(&generated.join(name), &out.join(name))?;
    }
    Ok(())
}

fn strip_inner_attributes(from: &Path, to: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(from)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !{
            let t = l.trim_start();
            t.starts_with("#![") || t.starts_with("//!")
        })
        .collect();
    std::fs::write(to, kept.join("\n"))
}
