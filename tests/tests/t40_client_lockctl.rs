//! `lockctl` against a real three-node cluster: two `exec` runs on one key never overlap and
//! hand the key over with increasing fencing tokens; `try`, `inspect`, `renew`, `release`,
//! `revoke` and `status` round-trip; a release that removed nothing says why. And without
//! one: no cluster, or a silent one, is "unavailable" (exit 5) within `--timeout`, with how to
//! start one; a blank key or an out-of-range `--ttl` is a bad command line (exit 2).
//!
//! The `lockctl` binary is found at `$LOCKCTL_BIN`, else next to the test executable's `deps/`
//! directory (built by `cargo test --workspace` / `cargo nextest run --workspace`, or by
//! `cargo build -p lock-client`).

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use lock_tests::Cluster;
use lock_tests::pki::HARNESS_IDENTITY;
use tokio::process::Command;

/// Environment variable naming the `lockctl` binary to test.
const LOCKCTL_BIN_ENV: &str = "LOCKCTL_BIN";

fn lockctl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(LOCKCTL_BIN_ENV) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let candidate = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("lockctl"))
        .expect("the test executable lives in target/<profile>/deps");
    assert!(
        candidate.is_file(),
        "lockctl not found at {}; build it with `cargo build -p lock-client` or set {LOCKCTL_BIN_ENV}",
        candidate.display()
    );
    candidate
}

/// The variables lockctl reads its TLS config and token from; removed from every run so a
/// developer's exported `lockd dev` settings cannot leak into a test.
const TLS_VARS: [&str; 4] = ["LOCKD_CA", "LOCKD_CERT", "LOCKD_KEY", "LOCKD_TOKEN"];

/// lockctl at `cluster`, over TLS as `admin` (some tests revoke), configured as a user would
/// after `lockd dev`: through `LOCKD_CA`, `LOCKD_CERT` and `LOCKD_KEY`.
fn lockctl(cluster: &Cluster, args: &[&str]) -> Command {
    let mut command = lockctl_without_tls(cluster, args);
    let (ca, cert, key) = cluster.sdk_tls("admin");
    command
        .env("LOCKD_CA", ca)
        .env("LOCKD_CERT", cert)
        .env("LOCKD_KEY", key);
    command
}

/// lockctl at `cluster` with no TLS config at all.
fn lockctl_without_tls(cluster: &Cluster, args: &[&str]) -> Command {
    let mut command = Command::new(lockctl_binary());
    command
        .arg("--endpoints")
        .arg(
            cluster
                .ids()
                .into_iter()
                .map(|id| cluster.addr(id))
                .collect::<Vec<_>>()
                .join(","),
        )
        .args(args)
        .env_remove("LOCKD_ENDPOINTS")
        .kill_on_drop(true);
    for var in TLS_VARS {
        command.env_remove(var);
    }
    command
}

async fn run(cluster: &Cluster, args: &[&str]) -> Output {
    lockctl(cluster, args).output().await.expect("run lockctl")
}

/// lockctl's exit codes (its `--help` table) that these tests check.
const EXIT_USAGE: i32 = 2;
const EXIT_NEGATIVE: i32 = 3;
const EXIT_UNAVAILABLE: i32 = 5;

/// Runs lockctl with `args` only (no cluster, no `LOCKD_ENDPOINTS`, no TLS variables).
async fn run_bare(args: &[&str]) -> Output {
    let mut command = Command::new(lockctl_binary());
    command
        .args(args)
        .env_remove("LOCKD_ENDPOINTS")
        .kill_on_drop(true);
    for var in TLS_VARS {
        command.env_remove(var);
    }
    command.output().await.expect("run lockctl")
}

/// An address nothing listens on: bound, then closed.
fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

/// The one line lockctl printed on stderr (it prints exactly one on failure).
fn one_line(output: &Output) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    stderr
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value of a top-level field of lockctl's one-line JSON output, as raw text
/// (`"k"` for strings, `5` for numbers).
fn field(json: &str, name: &str) -> String {
    let tag = format!("\"{name}\":");
    let start = json
        .find(&tag)
        .unwrap_or_else(|| panic!("no {name} in {json}"))
        + tag.len();
    let rest = &json[start..];
    let end = match rest.strip_prefix('"') {
        Some(quoted) => quoted.find('"').expect("closing quote") + 2,
        None => rest.find([',', '}']).expect("end of value"),
    };
    rest[..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_exec_runs_never_overlap() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("critical-section.log");
    let script = format!(
        "echo \"start $LOCK_FENCING_TOKEN $LOCK_KEY\" >> {log}; sleep 0.3; \
         echo \"end $LOCK_FENCING_TOKEN $LOCK_KEY\" >> {log}",
        log = log.display()
    );
    const RUNS: usize = 3;
    let mut children = Vec::new();
    for _ in 0..RUNS {
        children.push(
            lockctl(
                &cluster,
                &[
                    "exec", "--key", "t40/exec", "--ttl", "5s", "--wait", "60s", "--", "sh", "-c",
                    &script,
                ],
            )
            .output(),
        );
    }
    for child in children {
        let output = child.await.expect("run lockctl exec");
        assert_eq!(
            output.status.code(),
            Some(0),
            "stderr: {}",
            text(&output.stderr)
        );
    }

    let lines: Vec<String> = std::fs::read_to_string(&log)
        .expect("the critical sections wrote their log")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2 * RUNS, "{lines:#?}");
    let mut last_token = 0u64;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(start[0], "start", "interleaved: {lines:#?}");
        assert_eq!(end[0], "end", "interleaved: {lines:#?}");
        assert_eq!(start[1], end[1], "interleaved: {lines:#?}");
        assert_eq!(start[2], "t40/exec");
        let token: u64 = start[1].parse().expect("a numeric fencing token");
        assert!(token > last_token, "tokens not increasing: {lines:#?}");
        last_token = token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_commands_round_trip() {
    let cluster = Cluster::start(3).await;

    let acquired = run(
        &cluster,
        &["try", "--key", "t40/cli", "--owner", "ops", "--ttl", "30s"],
    )
    .await;
    assert_eq!(
        acquired.status.code(),
        Some(0),
        "{}",
        text(&acquired.stderr)
    );
    let handle = text(&acquired.stdout);
    let token = field(&handle, "fencing_token");
    let session = field(&handle, "session_id").trim_matches('"').to_owned();
    assert_eq!(field(&handle, "key"), "\"t40/cli\"");
    assert_eq!(field(&handle, "owner"), "\"ops\"");

    // The lock outlives the command; a second try is refused (exit 3).
    let refused = run(&cluster, &["try", "--key", "t40/cli"]).await;
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert_eq!(text(&refused.stderr).lines().count(), 1);

    let inspected = run(&cluster, &["inspect", "--key", "t40/cli"]).await;
    assert_eq!(
        inspected.status.code(),
        Some(0),
        "{}",
        text(&inspected.stderr)
    );
    let info = text(&inspected.stdout);
    assert_eq!(field(&info, "held"), "true");
    assert_eq!(field(&info, "fencing_token"), token);

    let renewed = run(
        &cluster,
        &[
            "renew",
            "--session",
            &session,
            "--key",
            "t40/cli",
            "--token",
            &token,
        ],
    )
    .await;
    assert_eq!(renewed.status.code(), Some(0), "{}", text(&renewed.stderr));
    assert_eq!(field(&text(&renewed.stdout), "fencing_token"), token);

    let released = run(
        &cluster,
        &[
            "release",
            "--session",
            &session,
            "--key",
            "t40/cli",
            "--token",
            &token,
        ],
    )
    .await;
    assert_eq!(
        released.status.code(),
        Some(0),
        "{}",
        text(&released.stderr)
    );
    assert_eq!(field(&text(&released.stdout), "released"), "true");

    // A released grant cannot be renewed: lost, exit 3.
    let lost = run(
        &cluster,
        &[
            "renew",
            "--session",
            &session,
            "--key",
            "t40/cli",
            "--token",
            &token,
        ],
    )
    .await;
    assert_eq!(lost.status.code(), Some(3), "{}", text(&lost.stderr));

    // Break-glass on a fresh grant: the floor moves past it.
    let again = run(&cluster, &["try", "--key", "t40/cli", "--ttl", "30s"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    let second: u64 = field(&text(&again.stdout), "fencing_token")
        .parse()
        .expect("token");
    assert!(second > token.parse::<u64>().expect("token"));
    let revoked = run(
        &cluster,
        &[
            // No --operator: over TLS the node records the caller's principal.
            "revoke", "--key", "t40/cli", "--reason", "test",
        ],
    )
    .await;
    assert_eq!(revoked.status.code(), Some(0), "{}", text(&revoked.stderr));
    let audit = run(&cluster, &["audit", "--key", "t40/cli"]).await;
    assert_eq!(audit.status.code(), Some(0), "{}", text(&audit.stderr));
    assert_eq!(
        field(&text(&audit.stdout), "operator"),
        format!("{HARNESS_IDENTITY:?}"),
        "the revoke is recorded under the certificate's principal"
    );
    let outcome = text(&revoked.stdout);
    assert_eq!(field(&outcome, "revoked"), "true");
    assert_eq!(field(&outcome, "previous_token"), second.to_string());
    assert!(
        field(&outcome, "new_token_floor")
            .parse::<u64>()
            .expect("floor")
            >= second
    );

    let status = run(&cluster, &["status"]).await;
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    let status = text(&status.stdout);
    assert_eq!(
        status.matches("\"role\": \"leader\"").count(),
        1,
        "{status}"
    );
    assert_eq!(
        status.matches("\"role\": \"follower\"").count(),
        2,
        "{status}"
    );

    // `lockctl status | head -1`: a reader gone before lockctl writes is a quiet exit 0, not a
    // panic on the broken pipe. The pipe's read end is closed before lockctl starts, so every
    // write it makes meets EPIPE.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let gone = lockctl(&cluster, &["status"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .expect("run lockctl");
    assert_eq!(gone.status.code(), Some(0), "{}", text(&gone.stderr));
    assert!(
        !text(&gone.stderr).contains("panicked"),
        "{}",
        text(&gone.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_exec_waits_then_gives_up_with_exit_3() {
    let cluster = Cluster::start(3).await;
    let held = run(&cluster, &["try", "--key", "t40/busy", "--ttl", "60s"]).await;
    assert_eq!(held.status.code(), Some(0), "{}", text(&held.stderr));
    let started = std::time::Instant::now();
    let output = run(
        &cluster,
        &["exec", "--key", "t40/busy", "--wait", "1s", "--", "true"],
    )
    .await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(text(&output.stderr).lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_exec_kills_the_command_when_the_lock_is_revoked() {
    let cluster = Cluster::start(3).await;
    let exec = lockctl(
        &cluster,
        &[
            "exec",
            "--key",
            "t40/revoked",
            "--ttl",
            "3s",
            "--",
            "sleep",
            "60",
        ],
    )
    .output();
    let exec = tokio::spawn(exec);
    lock_tests::poll_until("exec to hold the key", Duration::from_secs(20), || {
        let inspect = run(&cluster, &["inspect", "--key", "t40/revoked"]);
        async move {
            let out = text(&inspect.await.stdout);
            if out.contains("\"held\":true") {
                Ok(())
            } else {
                Err(out)
            }
        }
    })
    .await
    .expect("held");
    let revoked = run(
        &cluster,
        &[
            "revoke",
            "--key",
            "t40/revoked",
            "--operator",
            HARNESS_IDENTITY,
            "--reason",
            "test",
        ],
    )
    .await;
    assert_eq!(revoked.status.code(), Some(0), "{}", text(&revoked.stderr));

    // The next keep-alive renewal (every second) learns the grant is gone; CMD is killed long
    // before its 60 s are up.
    let output = tokio::time::timeout(Duration::from_secs(20), exec)
        .await
        .expect("lockctl exec ends after the revoke")
        .expect("join")
        .expect("run lockctl exec");
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_without_a_cluster_says_unavailable_and_how_to_start_one() {
    let endpoint = dead_endpoint();
    for args in [
        &["try", "--key", "k"][..],
        &["acquire", "--key", "k", "--wait", "1s"],
        &["inspect", "--key", "k"],
        &["status"],
        &["exec", "--key", "k", "--", "true"],
    ] {
        let mut full = vec!["--endpoints", endpoint.as_str()];
        full.extend_from_slice(args);
        let output = run_bare(&full).await;
        assert_eq!(
            output.status.code(),
            Some(EXIT_UNAVAILABLE),
            "{args:?}: {output:?}"
        );
        let stderr = one_line(&output);
        assert!(stderr.contains("cluster unavailable"), "{stderr}");
        // The endpoints tried and why each failed.
        assert!(stderr.contains(&endpoint), "{stderr}");
        assert!(stderr.contains("refused"), "{stderr}");
        // How to get a cluster.
        assert!(stderr.contains("lockd dev"), "{stderr}");
        assert!(stderr.contains("cargo run -p lockd -- dev"), "{stderr}");
        assert!(!stderr.contains("contention"), "{stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_gives_up_on_a_silent_endpoint_within_its_timeout() {
    // Accepts connections (the kernel completes them into the backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = silent.local_addr().expect("addr").to_string();
    const TIMEOUT: Duration = Duration::from_secs(2);
    // Process start and exit on a loaded machine; far below the default 10 s budget.
    const SLACK: Duration = Duration::from_secs(5);
    for args in [
        &["try", "--key", "k"][..],
        &["acquire", "--key", "k", "--wait", "0s"],
        &["status"],
    ] {
        let mut full = vec!["--endpoints", endpoint.as_str(), "--timeout", "2s"];
        full.extend_from_slice(args);
        let started = Instant::now();
        let output = run_bare(&full).await;
        let took = started.elapsed();
        assert_eq!(
            output.status.code(),
            Some(EXIT_UNAVAILABLE),
            "{args:?}: {output:?}"
        );
        assert!(took < TIMEOUT + SLACK, "{args:?} took {took:?}");
        let stderr = one_line(&output);
        assert!(stderr.contains("cluster unavailable"), "{stderr}");
        assert!(stderr.contains(&endpoint), "{stderr}");
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_without_tls_settings_at_a_tls_cluster_names_tls_and_lockd_ca() {
    let cluster = Cluster::start(1).await;
    const TIMEOUT: Duration = Duration::from_secs(3);
    // Process start and exit on a loaded machine.
    const SLACK: Duration = Duration::from_secs(5);
    for args in [&["status"][..], &["try", "--key", "k"]] {
        let mut full = vec!["--timeout", "3s"];
        full.extend_from_slice(args);
        let started = Instant::now();
        let output = lockctl_without_tls(&cluster, &full)
            .output()
            .await
            .expect("run lockctl");
        let took = started.elapsed();
        assert_eq!(
            output.status.code(),
            Some(EXIT_UNAVAILABLE),
            "{args:?}: {output:?}"
        );
        assert!(took < TIMEOUT + SLACK, "{args:?} took {took:?}");
        let stderr = one_line(&output);
        assert!(stderr.contains("TLS"), "{stderr}");
        assert!(stderr.contains("LOCKD_CA"), "{stderr}");
        // The cluster is up: advice to start one would send the user the wrong way.
        assert!(!stderr.contains("lockd dev"), "{stderr}");
    }
    // The same command with the variables set works.
    let output = lockctl(&cluster, &["status"]).output().await.expect("run");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // And with the flags instead of the variables.
    let (ca, cert, key) = cluster.sdk_tls("client");
    let (ca, cert, key) = (
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
    );
    let output = lockctl_without_tls(
        &cluster,
        &[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "inspect",
            "--key",
            "k",
        ],
    )
    .output()
    .await
    .expect("run");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_with_a_ca_that_did_not_sign_the_nodes_names_tls() {
    let cluster = Cluster::start(1).await;
    let foreign = cluster.pki().foreign();
    let (cert, key) = foreign.identity("admin");
    let output = lockctl_without_tls(&cluster, &["--timeout", "3s", "status"])
        .env("LOCKD_CA", foreign.ca())
        .env("LOCKD_CERT", cert)
        .env("LOCKD_KEY", key)
        .output()
        .await
        .expect("run lockctl");
    assert_eq!(output.status.code(), Some(EXIT_UNAVAILABLE), "{output:?}");
    let stderr = one_line(&output);
    assert!(stderr.contains("TLS handshake failed"), "{stderr}");
    assert!(stderr.contains("LOCKD_CA"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_tls_settings_that_do_not_fit_are_a_usage_error_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-ca.pem");
    let missing = missing.display().to_string();
    let endpoint = dead_endpoint();
    let output = run_bare(&["--endpoints", &endpoint, "--tls-ca", &missing, "status"]).await;
    assert_eq!(output.status.code(), Some(EXIT_USAGE), "{output:?}");
    let stderr = one_line(&output);
    assert!(
        stderr.contains("no-such-ca.pem") && stderr.contains("LOCKD_CA"),
        "{stderr}"
    );

    let output = run_bare(&[
        "--endpoints",
        &endpoint,
        "--tls-ca",
        &missing,
        "--tls-cert",
        "c.pem",
        "status",
    ])
    .await;
    assert_eq!(output.status.code(), Some(EXIT_USAGE), "{output:?}");
    let stderr = one_line(&output);
    assert!(
        stderr.contains("--tls-key") && stderr.contains("LOCKD_KEY"),
        "{stderr}"
    );

    let output = run_bare(&["--endpoints", &endpoint, "--auth-token", "t0ken", "status"]).await;
    assert_eq!(output.status.code(), Some(EXIT_USAGE), "{output:?}");
    let stderr = one_line(&output);
    assert!(
        stderr.contains("--auth-token") && stderr.contains("TLS"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_blank_key_is_a_usage_error() {
    for key in ["", " ", "\t"] {
        for args in [
            &["try", "--key", key][..],
            &["inspect", "--key", key],
            &["release", "--session", "s", "--key", key, "--token", "1"],
            &["exec", "--key", key, "--", "true"],
        ] {
            let output = run_bare(args).await;
            assert_eq!(
                output.status.code(),
                Some(EXIT_USAGE),
                "{args:?}: {output:?}"
            );
            let stderr = text(&output.stderr);
            assert!(stderr.contains("--key"), "{stderr}");
            assert!(stderr.contains("blank"), "{stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_ttl_out_of_range_names_ttl_and_the_range() {
    for (args, flag) in [
        (&["try", "--key", "k", "--ttl", "0s"][..], "--ttl"),
        (&["acquire", "--key", "k", "--ttl", "0"], "--ttl"),
        (
            &["exec", "--key", "k", "--ttl", "0s", "--", "true"],
            "--ttl",
        ),
        (&["try", "--key", "k", "--ttl", "2h"], "--ttl"),
        (
            &[
                "renew",
                "--session",
                "s",
                "--key",
                "k",
                "--token",
                "1",
                "--ttl",
                "0s",
            ],
            "--ttl",
        ),
        (
            &["try", "--key", "k", "--session-ttl", "0s"],
            "--session-ttl",
        ),
    ] {
        let output = run_bare(args).await;
        assert_eq!(
            output.status.code(),
            Some(EXIT_USAGE),
            "{args:?}: {output:?}"
        );
        let stderr = text(&output.stderr);
        assert!(stderr.contains(flag), "{stderr}");
        // The allowed range, from lock-api's limits (TTL_MIN = 1 s, TTL_MAX = 1 h).
        assert!(stderr.contains("between 1s and 1h"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_release_of_a_lock_not_held_says_why() {
    let cluster = Cluster::start(3).await;
    let first = run(&cluster, &["try", "--key", "t40/gone", "--ttl", "30s"]).await;
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let first = text(&first.stdout);
    let (token, session) = (
        field(&first, "fencing_token"),
        field(&first, "session_id").trim_matches('"').to_owned(),
    );
    let release = |session: String, token: String| {
        let cluster = &cluster;
        async move {
            run(
                cluster,
                &[
                    "release",
                    "--session",
                    &session,
                    "--key",
                    "t40/gone",
                    "--token",
                    &token,
                ],
            )
            .await
        }
    };
    let released = release(session.clone(), token.clone()).await;
    assert_eq!(
        released.status.code(),
        Some(0),
        "{}",
        text(&released.stderr)
    );
    assert_eq!(field(&text(&released.stdout), "released"), "true");

    // Released twice: the key is free, and lockctl says the grant is already gone.
    let again = release(session.clone(), token.clone()).await;
    assert_eq!(again.status.code(), Some(EXIT_NEGATIVE), "{again:?}");
    assert_eq!(field(&text(&again.stdout), "released"), "false");
    assert_eq!(field(&text(&again.stdout), "why"), "\"free\"");
    let stderr = one_line(&again);
    assert!(stderr.contains("nothing released"), "{stderr}");
    assert!(stderr.contains("is free"), "{stderr}");
    assert!(stderr.contains("already"), "{stderr}");

    // Someone else holds the key now: the old token's release says so, and names the holder.
    let second = run(
        &cluster,
        &[
            "try", "--key", "t40/gone", "--owner", "other", "--ttl", "30s",
        ],
    )
    .await;
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let second = text(&second.stdout);
    let second_token = field(&second, "fencing_token");
    let stale = release(session.clone(), token.clone()).await;
    assert_eq!(stale.status.code(), Some(EXIT_NEGATIVE), "{stale:?}");
    assert_eq!(
        field(&text(&stale.stdout), "why"),
        "\"held_by_another_token\""
    );
    let stderr = one_line(&stale);
    assert!(stderr.contains("another grant"), "{stderr}");
    assert!(
        stderr.contains(&format!("token {second_token}")),
        "{stderr}"
    );
    assert!(stderr.contains("\"other\""), "{stderr}");

    // The right token with a session the cluster does not know: the grant is not removed,
    // and lockctl says the session is the problem.
    let wrong_session = release("no-such-session".to_owned(), second_token.clone()).await;
    assert_eq!(
        wrong_session.status.code(),
        Some(EXIT_NEGATIVE),
        "{wrong_session:?}"
    );
    assert_eq!(
        field(&text(&wrong_session.stdout), "why"),
        "\"unknown_session\""
    );
    let stderr = one_line(&wrong_session);
    assert!(stderr.contains("no-such-session"), "{stderr}");
    assert!(stderr.contains("not known"), "{stderr}");
    let inspected = run(&cluster, &["inspect", "--key", "t40/gone"]).await;
    assert_eq!(
        field(&text(&inspected.stdout), "fencing_token"),
        second_token
    );
}

/// `lockctl audit` prints the force-revoke audit log as JSON lines with the record's field
/// names, newest first, following every page (here more revokes than one page holds); `--key`
/// keeps one key's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_lockctl_audit_prints_every_page_newest_first() {
    let mut cluster = Cluster::start(1).await;
    let node = cluster.leader_client().await;
    let ttl = Duration::from_secs(60);
    let session = node
        .open_session("t40-audit-holder", ttl)
        .await
        .expect("open");
    let grant = node
        .try_acquire(&session.id, "t40/audit/held", ttl)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let held = node
        .force_revoke("t40/audit/held", HARNESS_IDENTITY, "t40: stuck holder")
        .await
        .expect("revoke the held key");
    // One more page than the default page size: lockctl must follow the token.
    let many = lock_proto::audit::REVOCATIONS_PAGE_SIZE_DEFAULT + 5;
    for n in 0..many {
        node.force_revoke("t40/audit/many", HARNESS_IDENTITY, &format!("t40: {n}"))
            .await
            .expect("revoke");
    }

    let keyed = run(&cluster, &["audit", "--key", "t40/audit/many"]).await;
    assert_eq!(keyed.status.code(), Some(0), "{}", text(&keyed.stderr));
    let lines: Vec<String> = text(&keyed.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), many, "one line per revoke of the key");
    let floors: Vec<u64> = lines
        .iter()
        .map(|l| field(l, "new_token_floor").parse().expect("a number"))
        .collect();
    assert!(
        floors.windows(2).all(|w| w[0] > w[1]),
        "not newest first: {floors:?}"
    );
    for line in &lines {
        assert_eq!(field(line, "key"), "\"t40/audit/many\"", "{line}");
        assert_eq!(
            field(line, "operator"),
            format!("{HARNESS_IDENTITY:?}"),
            "{line}"
        );
        assert_eq!(field(line, "previous_owner_id"), "null", "{line}");
        assert_eq!(field(line, "previous_token"), "null", "{line}");
        assert_ne!(field(line, "request_id"), "0", "{line}");
        assert_ne!(field(line, "revoked_at_unix_ms"), "0", "{line}");
    }
    assert_eq!(field(&lines[0], "reason"), format!("\"t40: {}\"", many - 1));
    assert_eq!(field(&lines[many - 1], "reason"), "\"t40: 0\"");

    let all = run(&cluster, &["audit"]).await;
    assert_eq!(all.status.code(), Some(0), "{}", text(&all.stderr));
    let lines: Vec<String> = text(&all.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), many + 1, "every revoke of every key");
    let oldest = &lines[many];
    assert_eq!(field(oldest, "key"), "\"t40/audit/held\"", "{oldest}");
    assert_eq!(field(oldest, "reason"), "\"t40: stuck holder\"", "{oldest}");
    assert_eq!(
        field(oldest, "previous_owner_id"),
        "\"t40-audit-holder\"",
        "{oldest}"
    );
    assert_eq!(
        field(oldest, "previous_token"),
        grant.fencing_token.to_string(),
        "{oldest}"
    );
    assert_eq!(
        field(oldest, "new_token_floor"),
        held.new_token_floor.to_string(),
        "{oldest}"
    );
}
