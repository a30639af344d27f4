//! Generates the `lockd.v1` messages, clients and servers from `proto/`.
//!
//! The `.proto` files are compiled in-process by `protox`, so the build needs
//! no `protoc` binary. The same file descriptor set feeds the code generator
//! and is written to `OUT_DIR` for gRPC reflection (`FILE_DESCRIPTOR_SET`).
//!
//! With cargo feature `etcd` only, it also generates tonic clients for the
//! subset of etcd's v3 API under `proto/etcd/` (the `etcd-client` crate would
//! need a `protoc` binary). Default builds do not compile it.

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

/// The etcd API subset, relative to [`PROTO_ROOT`] (feature `etcd` only);
/// `etcd/mvccpb/kv.proto` comes in as an import.
const ETCD_PROTO_FILES: &[&str] = &["etcd/etcdserverpb/rpc.proto", "etcd/v3lockpb/v3lock.proto"];

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

    // lockd's own codec: a body that cannot be decoded is INVALID_ARGUMENT with an
    // ErrorDetail, where prost's codec answers a detail-less INTERNAL (src/codec.rs).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::LockdCodec")
        .compile_fds(compiler.file_descriptor_set())?;

    // Cargo sets this for the build script of a package built with feature `etcd`.
    if std::env::var_os("CARGO_FEATURE_ETCD").is_some() {
        compile_etcd()?;
    }
    Ok(())
}

/// Generates the etcd clients (no servers: nothing here serves etcd's API),
/// in a descriptor set of their own so that `FILE_DESCRIPTOR_SET` stays
/// `lockd.v1` only.
fn compile_etcd() -> Result<(), Box<dyn std::error::Error>> {
    let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(ETCD_PROTO_FILES)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
