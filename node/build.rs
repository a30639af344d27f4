//! Build script of `lockd`. With feature `etcd` only: compiles the etcd v3 API subset in
//! `proto/etcd/` into tonic clients, in-process with `protox` (the `etcd-client` crate would
//! need a `protoc` binary, which this workspace does not use). Without it, does nothing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "etcd")]
    {
        const PROTO_ROOT: &str = "proto";
        println!("cargo:rerun-if-changed={PROTO_ROOT}");
        let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
        compiler.include_imports(true);
        compiler.open_files(["etcd/rpc.proto"])?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(false)
            .compile_fds(compiler.file_descriptor_set())?;
    }
    Ok(())
}
