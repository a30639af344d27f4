//! Generates the etcd v3 client stubs the benchmark needs from `proto/etcd/`.
//!
//! The `etcd-client` crate compiles etcd's protos with `prost-build`, which needs a `protoc`
//! binary that this workspace does not install (DESIGN D-deps: protox, no protoc). So the
//! benchmark carries the small, wire-compatible subset of etcd's v3 API it calls (leases,
//! maintenance status, v3lock) and compiles it in-process with `protox`, like `lock-proto`.

/// The proto sources, relative to the crate root; also the include root.
const PROTO_ROOT: &str = "proto";

/// The etcd API subset, relative to [`PROTO_ROOT`].
const PROTO_FILES: &[&str] = &["etcd/etcdserverpb.proto", "etcd/v3lockpb.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    println!("cargo:rerun-if-changed=build.rs");
    let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
    compiler.include_imports(true);
    compiler.open_files(PROTO_FILES)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
