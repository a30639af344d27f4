//! `bench/layers.py` (session 21): each sample of a fixed `perf script` excerpt lands in the layer
//! its innermost frames name, the busiest process is taken for the leader, and the per-pair
//! microseconds scale with the CPU figure given. Needs `python3`, which README's test command
//! (`scripts/test`) installs.

use std::ffi::OsStr;

mod tool;

/// Runs layers.py on the fixture with 0.2 ms of CPU per pair and answers its output.
fn layers_of_fixture() -> String {
    let fixture = tool::bench_path("tests/data/layers-script.txt");
    tool::run_ok("layers.py", [fixture.as_os_str(), OsStr::new("0.2")])
}

/// The row of `layer` in the table, with its cells trimmed.
fn row<'a>(table: &'a str, layer: &str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {layer} |")))
        .unwrap_or_else(|| panic!("no row {layer:?} in:\n{table}"));
    line.trim_matches('|').split('|').map(str::trim).collect()
}

#[test]
fn each_sample_counts_once_in_the_layer_of_its_innermost_frames() {
    let table = layers_of_fixture();
    assert!(
        table.starts_with("8 samples;"),
        "eight samples in the fixture:\n{table}"
    );
    assert!(table.contains("the leader is taken to be 100"), "{table}");
    // One sample of eight each, at 0.2 ms per pair: 12.5 % and 25 µs.
    for layer in [
        "kernel: socket reads and writes (loopback TCP)",
        "disk: `fdatasync` and WAL `pwrite`",
        "openraft",
        "allocator and copies",
        "kernel: wake-ups, scheduling, interrupts",
        "TLS (rustls, ring)",
        "HTTP/2 and gRPC (h2, hyper, tonic, prost)",
    ] {
        assert_eq!(row(&table, layer)[1], "12.5 % (25 µs)", "{layer}:\n{table}");
    }
    // The timer interrupt's frames are the sampling: that sample is the state machine's apply,
    // lockd's own code although its symbol names openraft's trait.
    let own = row(
        &table,
        "lockd's own code (serving, apply, log store and codec, Raft transport)",
    );
    assert_eq!(own[1..], ["12.5 % (25 µs)", "12.5 %", "0.0 %"], "{table}");
    // Process 101 had three samples: the allocator, the epoll wait and TLS.
    assert_eq!(row(&table, "TLS (rustls, ring)")[2..], ["0.0 %", "12.5 %"]);
    assert!(
        !table.contains("| tokio"),
        "no sample is tokio's own:\n{table}"
    );
}
