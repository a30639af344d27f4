//! `lockctl` as a user meets it: a cluster that cannot be reached, a malformed command line.
//! Each failure is one clear line on stderr and the exit code of lockctl's table (`--help`).

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
fn an_unreachable_endpoint_is_one_clear_stderr_line_and_exit_5() {
    let endpoint = dead_endpoint();
    let output = lockctl(&["--endpoints", &endpoint, "status"]);
    // Connecting asks every endpoint for its status; none answering is "unavailable".
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("lockctl: "), "{stderr}");
    assert!(stderr.contains(&endpoint), "{stderr}");
    assert!(output.stdout.is_empty());

    let output = lockctl(&["--endpoints", &endpoint, "try", "--key", "k"]);
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cluster unavailable"), "{stderr}");
    assert!(stderr.contains("no lockd endpoint answered"), "{stderr}");
    // The connect error itself, not only tonic's "tcp connect error".
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains("lockd dev"), "{stderr}");
    assert!(!stderr.contains("contention"), "{stderr}");
}

#[test]
fn a_malformed_endpoint_is_a_bad_command_line_naming_it() {
    let output = lockctl(&["--endpoints", "not an endpoint", "inspect", "--key", "k"]);
    assert_eq!(output.status.code(), Some(2));
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
    for (flag, value) in [
        ("--ttl", "2h"),
        ("--session-ttl", "500ms"),
        ("--wait", "6m"),
        ("--owner", " "),
        ("--timeout", "0s"),
    ] {
        let output = lockctl(&["acquire", "--key", "k", flag, value]);
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
    for args in [
        &["release", "--session", "s", "--key", "k", "--token", "0"][..],
        &["release", "--session", "", "--key", "k", "--token", "1"],
        &["revoke", "--key", "k", "--operator", "", "--reason", "r"],
    ] {
        assert_eq!(lockctl(args).status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn help_shows_the_exit_code_table() {
    let output = lockctl(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8_lossy(&output.stdout);
    for row in [
        "Exit codes:",
        "2  bad command line",
        "3  a negative answer",
        "5  the cluster is unavailable",
    ] {
        assert!(help.contains(row), "{row:?} missing from:\n{help}");
    }
}

#[test]
fn endpoints_come_from_lockd_endpoints_when_no_flag_is_given() {
    let endpoint = dead_endpoint();
    let output = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["inspect", "--key", "k"])
        .env("LOCKD_ENDPOINTS", &endpoint)
        .output()
        .expect("run lockctl");
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&endpoint), "{stderr}");
    // Neither tried nor called the default (the start hint still names the dev ports).
    assert!(
        !stderr.contains("127.0.0.1:7101:"),
        "the default was used: {stderr}"
    );
    assert!(!stderr.contains("default endpoints"), "{stderr}");
}
