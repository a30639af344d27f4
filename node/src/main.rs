//! The `lockd` binary: see [`lockd::process::cli`].

#![forbid(unsafe_code)]

/// mimalloc instead of the system allocator. A node's hot path allocates for every message
/// (HTTP/2 frames, tonic buffers, log entries, answers), and glibc's malloc and free were 5–6 %
/// of the cluster's samples under W1, with `malloc_consolidate` among them (issue 7). Interleaved
/// lock-bench runs measured 7–13 % less server CPU per W1 pair with it; throughput differences
/// were within this machine's noise.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    lockd::process::cli::main()
}
