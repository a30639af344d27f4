//! The `lockd` binary's start-up checks, run as a real process: configuration errors exit with
//! status 2 and name the field; a data dir of another cluster or node is refused naming both.
//! (Building this test also makes `cargo test` build the `lockd` binary the integration
//! harness runs.)

use std::path::Path;
use std::process::{Command, Output};

const LOCKD: &str = env!("CARGO_BIN_EXE_lockd");
const PEERS: &str = "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103";

fn lockd(args: &[&str]) -> Output {
    Command::new(LOCKD)
        .args(args)
        // The caller's environment must not leak LOCKD_* values into these checks.
        .env_clear()
        .output()
        .expect("lockd runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run_args<'a>(data_dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--node-id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir,
        "--peers",
        PEERS,
        "--insecure",
    ];
    args.extend_from_slice(extra);
    args
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

#[test]
fn a_missing_node_id_is_named() {
    let out = lockd(&[
        "run",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        "/tmp/x",
        "--peers",
        PEERS,
        "--insecure",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("node_id"), "{}", stderr(&out));
}

#[test]
fn timeout_relations_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = lockd(&run_args(
        path_str(dir.path()),
        &["--heartbeat-interval-ms", "500"],
    ));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("heartbeat_interval_ms"),
        "{}",
        stderr(&out)
    );

    let out = lockd(&run_args(
        path_str(dir.path()),
        &[
            "--election-timeout-min-ms",
            "900",
            "--election-timeout-max-ms",
            "800",
        ],
    ));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("election_timeout_min_ms"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn peers_without_this_node_are_refused() {
    let out = lockd(&[
        "run",
        "--node-id",
        "4",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        "/tmp/x",
        "--peers",
        PEERS,
        "--insecure",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("peers"), "{}", stderr(&out));
}

#[test]
fn env_variables_are_read() {
    let out = Command::new(LOCKD)
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/tmp/x",
            "--peers",
            PEERS,
        ])
        .env_clear()
        .env("LOCKD_NODE_ID", "0")
        .env("LOCKD_INSECURE", "true")
        .output()
        .expect("lockd runs");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("node_id"), "{}", stderr(&out));
}

#[test]
fn plaintext_is_refused_without_insecure_and_missing_tls_files_are_named() {
    let mut args = run_args("/tmp/x", &[]);
    args.retain(|a| *a != "--insecure");
    let out = lockd(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("tls_ca") && err.contains("--insecure"),
        "{err}"
    );

    let mut args = run_args("/tmp/x", &["--tls-ca", "/nonexistent/ca.pem"]);
    args.retain(|a| *a != "--insecure");
    let err = stderr(&lockd(&args));
    assert!(err.contains("tls_cert"), "{err}");

    let out = lockd(&run_args("/tmp/x", &["--tls-ca", "/nonexistent/ca.pem"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("insecure"), "{}", stderr(&out));
}

#[test]
fn a_data_dir_of_another_cluster_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("identity"),
        "lockd-identity v1\ncluster_name=other\nnode_id=1\n",
    )
    .unwrap();
    let out = lockd(&run_args(path_str(dir.path()), &["--cluster-name", "mine"]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("\"other\"") && err.contains("\"mine\""),
        "{err}"
    );
}
