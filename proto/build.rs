//! Generates the `lockd.v1` messages, clients and servers from `proto/`.
//!
//! The `.proto` files are compiled in-process by `protox`, so the build needs
//! no `protoc` binary. The same file descriptor set feeds the code generator
//! and is written to `OUT_DIR` for gRPC reflection (`FILE_DESCRIPTOR_SET`).

use std::path::PathBuf;

/// The proto sources, relative to the crate root; also the include root.
const PROTO_ROOT: &str = "proto";

/// Every file of package `lockd.v1`, relative to [`PROTO_ROOT`].
const PROTO_FILES: &[&str] = &[
    "lockd/v1/admin.proto",
    "lockd/v1/error.proto",
    "lockd/v1/lock.proto",
    "lockd/v1/raft.proto",
    "lockd/v1/session.proto",
];

/// The file in `OUT_DIR` that holds the encoded descriptor set.
const DESCRIPTOR_FILE: &str = "lockd_v1_descriptor.bin";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A directory makes cargo rerun this script when any file below it changes.
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    println!("cargo:rerun-if-changed=build.rs");

    let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
    // Source info carries the comments into the generated rustdoc; imports
    // (google/protobuf/any.proto) make the set self-contained for reflection.
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(PROTO_FILES)?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join(DESCRIPTOR_FILE),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
