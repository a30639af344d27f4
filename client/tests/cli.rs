//! `lockctl` as a user meets it: a cluster that cannot be reached, a malformed command line.
//! Each failure is one clear line on stderr and a non-zero exit.

use std::process::Command;

fn lockctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env_remove("LOCKD_ENDPOINTS")
        .output()
        .expect("run lockctl")
}

/// An address nothing listens on (bound, then closed).
fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

#[test]
fn an_unreachable_endpoint_is_one_clear_stderr_line_and_exit_1() {
    let endpoint = dead_endpoint();
    let output = lockctl(&["--endpoints", &endpoint, "status"]);
    // Connecting asks every endpoint for its status; none answering is an error.
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("lockctl: "), "{stderr}");
    assert!(stderr.contains(&endpoint), "{stderr}");
    assert!(output.stdout.is_empty());

    let output = lockctl(&["--endpoints", &endpoint, "try", "--key", "k"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no lockd endpoint answered"), "{stderr}");
}

#[test]
fn a_malformed_endpoint_is_named() {
    let output = lockctl(&["--endpoints", "not an endpoint", "inspect", "--key", "k"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not an endpoint"), "{stderr}");
}

#[test]
fn a_bad_command_line_exits_2() {
    let output = lockctl(&["exec", "--key", "k"]);
    assert_eq!(output.status.code(), Some(2));
    let output = lockctl(&["try", "--key", "k", "--ttl", "soon"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn endpoints_come_from_lockd_endpoints_when_no_flag_is_given() {
    let endpoint = dead_endpoint();
    let output = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["inspect", "--key", "k"])
        .env("LOCKD_ENDPOINTS", &endpoint)
        .output()
        .expect("run lockctl");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&endpoint), "{stderr}");
    assert!(!stderr.contains("7101"), "the default was used: {stderr}");
}
