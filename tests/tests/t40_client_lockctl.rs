//! `lockctl` against a real three-node cluster: two `exec` runs on one key never overlap and
//! hand the key over with increasing fencing tokens; `try`, `inspect`, `renew`, `release`,
//! `revoke` and `status` round-trip.
//!
//! The `lockctl` binary is found at `$LOCKCTL_BIN`, else next to the test executable's `deps/`
//! directory (built by `cargo test --workspace` / `cargo nextest run --workspace`, or by
//! `cargo build -p lock-client`).

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use lock_tests::Cluster;
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

fn lockctl(cluster: &Cluster, args: &[&str]) -> Command {
    let mut command = Command::new(lockctl_binary());
    command
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(args)
        .env_remove("LOCKD_ENDPOINTS")
        .kill_on_drop(true);
    command
}

async fn run(cluster: &Cluster, args: &[&str]) -> Output {
    lockctl(cluster, args).output().await.expect("run lockctl")
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
            "revoke",
            "--key",
            "t40/cli",
            "--operator",
            "t40",
            "--reason",
            "test",
        ],
    )
    .await;
    assert_eq!(revoked.status.code(), Some(0), "{}", text(&revoked.stderr));
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
            "t40",
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
