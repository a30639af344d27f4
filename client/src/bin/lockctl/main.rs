//! `lockctl`: lockd from the shell. Acquire, renew, release, inspect and revoke locks, read the
//! revocation audit log, show the cluster, and run a command while holding a lock (`exec`, like
//! `consul lock` and `etcdctl lock`).
//!
//! Owns the commands' flow and JSON output; every lock operation is the `lock-client`
//! library's. Errors are one line on stderr and a non-zero exit.
//!
//! - `args`: the command line and the checks of its values.
//! - `exit`: the exit-code table and the wording of failures.
//! - `exec`: running a command under a lock.
//!
//! # Exit codes
//!
//! The table is `exit::EXIT_CODES`, which `lockctl --help` prints:
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | done (`exec`: CMD's own status instead — its exit code, or 128 + signal) |
//! | 1 | the cluster refused the request (e.g. an unknown session), or CMD could not be run |
//! | 2 | bad command line: unknown flag, missing or invalid value (a blank key, a TTL outside 1s–1h, a malformed endpoint) |
//! | 3 | a negative answer: not granted (`acquire`, `try`, `exec`), lost (`renew`), nothing released (`release`, with the reason) |
//! | 4 | `exec`: the lock was lost while CMD ran, and CMD was killed |
//! | 5 | the cluster is unavailable: no endpoint answered, or no decision within `--timeout` |
//!
//! # TLS
//!
//! Against nodes that serve TLS (the default of `lockd run` and `lockd dev`), lockctl needs the
//! cluster's CA and, where the nodes require one, a client certificate: `--tls-ca`,
//! `--tls-cert`, `--tls-key` or `LOCKD_CA`, `LOCKD_CERT`, `LOCKD_KEY` (the lines `lockd dev`
//! prints). `--auth-token` / `LOCKD_TOKEN` sends a bearer token instead, over TLS only. Without
//! them a TLS node closes the connection, and lockctl exits 5 saying to set `LOCKD_CA`.
//! (`--key` and `--token` are the lock key and the fencing token of the commands.)
//!
//! # Lifetime of a lock taken by `acquire` / `try`
//!
//! The command opens a session whose TTL is the lock's TTL (or `--session-ttl`), takes the
//! lock, prints it and exits **without closing the session**. The lock therefore lives until
//! its TTL lapses, until `lockctl release`, or until `lockctl renew` extends it (which also
//! heartbeats the session). `exec` is the command to hold a lock for as long as a process runs.

mod args;
mod exec;
mod exit;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use lock_client::client::server_expiry_unix_ms;
use lock_client::config::{ATTEMPT_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT};
use lock_client::deadline::unix_ms;
use lock_client::{ClientConfig, LockClient, LockError, LockHandle};
use serde_json::json;

use crate::args::{Cli, Cmd, GrantArgs, LockArgs};
use crate::exit::{EXIT_NEGATIVE, Failure, report, say};

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("lockctl@{host}:{}", std::process::id())
}

fn handle_json(handle: &LockHandle, session_ttl: Option<Duration>) -> serde_json::Value {
    let mut value = json!({
        "key": handle.key,
        "owner": handle.owner_id,
        "session_id": handle.session_id,
        "fencing_token": handle.fencing_token,
        "ttl_ms": handle.ttl.as_millis() as u64,
        "server_expiry_unix_ms": server_expiry_unix_ms(handle),
    });
    if let Some(ttl) = session_ttl {
        value["session_ttl_ms"] = json!(ttl.as_millis() as u64);
    }
    value
}

fn print_json(value: &serde_json::Value) {
    print_line(&value.to_string());
}

/// Writes one line to stdout. A reader that went away (`lockctl status | head -1`) is not
/// lockctl's failure: it stops quietly with exit 0, as other command-line tools do, where
/// `println!` would panic on the broken pipe. Any other write error is exit 1.
fn print_line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(err) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("lockctl: cannot write to stdout: {err}");
        std::process::exit(1);
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // Parsed in two steps to learn whether the endpoints are the default ones, which the
    // "unavailable" error then says. Clap's own errors exit 2 (EXIT_USAGE).
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    cli.endpoints_defaulted = matches.value_source("endpoints") == Some(ValueSource::DefaultValue);
    init_logging();
    match run(&cli).await {
        Ok(code) => code,
        Err(failure) => report(failure, &cli),
    }
}

/// Logs go to stderr only when `LOCKCTL_LOG` asks for them (e.g. `LOCKCTL_LOG=debug`), so the
/// default stderr is the one error line.
fn init_logging() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("LOCKCTL_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
}

/// Runs `calls` within `limit`, so that no endpoint that accepts connections and then stays
/// silent, and no chain of retries, keeps lockctl past its `--timeout`.
async fn within<T>(
    limit: Duration,
    calls: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, calls).await {
        Ok(answer) => answer,
        Err(_elapsed) => Err(Failure::TimedOut(limit)),
    }
}

async fn connect(cli: &Cli, session_ttl: Option<Duration>) -> Result<LockClient, Failure> {
    let mut config = ClientConfig {
        call_timeout: cli.timeout,
        // One attempt (and one TCP connect) takes at most half the budget, so that a short
        // --timeout holds against an endpoint that accepts and never answers, and an attempt
        // at another endpoint still fits: connecting then fails naming each endpoint.
        attempt_timeout: ATTEMPT_TIMEOUT_DEFAULT.min(cli.timeout / 2),
        connect_timeout: CONNECT_TIMEOUT_DEFAULT.min(cli.timeout / 2),
        tls: cli.tls().map_err(Failure::Connect)?,
        token: cli.token(),
        ..ClientConfig::default()
    };
    if let Some(ttl) = session_ttl {
        config.session_ttl = ttl;
    }
    LockClient::connect_with(&cli.endpoints, config)
        .await
        .map_err(Failure::Connect)
}

async fn run(cli: &Cli) -> Result<ExitCode, Failure> {
    let timeout = cli.timeout;
    match &cli.command {
        Cmd::Acquire { lock, wait } => {
            within(timeout + *wait, acquire(cli, lock, Some(*wait))).await
        }
        Cmd::Try { lock } => within(timeout, acquire(cli, lock, None)).await,
        Cmd::Renew { grant, ttl } => within(timeout, renew(cli, grant, *ttl)).await,
        Cmd::Release { grant } => within(timeout, release(cli, grant)).await,
        Cmd::Inspect { key } => within(timeout, inspect(cli, key)).await,
        Cmd::Revoke {
            key,
            operator,
            reason,
        } => within(timeout, revoke(cli, key, operator.as_deref(), reason)).await,
        Cmd::Audit { key } => within(timeout, audit(cli, key.as_deref())).await,
        Cmd::Status => within(timeout, status(cli)).await,
        Cmd::Exec { lock, wait, cmd } => exec::exec(cli, lock, *wait, cmd).await,
    }
}

async fn renew(cli: &Cli, grant: &GrantArgs, ttl: Duration) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    if !client.heartbeat_session(&grant.session).await? {
        say(format!(
            "session {} is gone (closed, or it expired), and every lock on it",
            grant.session
        ));
        return Ok(ExitCode::from(EXIT_NEGATIVE));
    }
    match client
        .renew_detached(&grant.session, &grant.key, grant.token, ttl)
        .await?
    {
        Some(handle) => {
            print_json(&handle_json(&handle, None));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            say(format!(
                "the lock on {:?} with token {} is lost",
                grant.key, grant.token
            ));
            Ok(ExitCode::from(EXIT_NEGATIVE))
        }
    }
}

/// Why a release removed nothing, as far as the cluster can still tell: the server answers
/// only "not released", so the key is inspected afterwards. `(tag for the JSON, sentence)`.
async fn why_not_released(client: &LockClient, grant: &GrantArgs) -> (&'static str, String) {
    let (key, token) = (&grant.key, grant.token);
    match client.inspect(key).await {
        Ok(None) => (
            "free",
            format!(
                "nothing released: {key:?} is free; the grant with token {token} was already \
                 released, or it expired (its lease or its session ran out), or it was revoked"
            ),
        ),
        // Release is compare-and-delete on (key, token) for any live session, so the token
        // can only still hold if the session named was not one the cluster knows.
        Ok(Some(info)) if info.fencing_token == token => (
            "unknown_session",
            format!(
                "nothing released: session {} is not known to the cluster (closed, or it \
                 expired); token {token} on {key:?} is held by owner {:?} in another session: \
                 pass that session's id (printed by the `acquire` or `try` that took it)",
                grant.session, info.owner_id
            ),
        ),
        Ok(Some(info)) => (
            "held_by_another_token",
            format!(
                "nothing released: {key:?} is held by another grant (token {}, owner {:?}); \
                 the grant with token {token} had already been released, expired or been \
                 revoked",
                info.fencing_token, info.owner_id
            ),
        ),
        Err(err) => (
            "unknown",
            format!(
                "nothing released: the grant with token {token} on {key:?} was already gone \
                 (released, expired or revoked); inspecting the key failed: {err}"
            ),
        ),
    }
}

async fn release(cli: &Cli, grant: &GrantArgs) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    let released = client
        .release_detached(&grant.session, &grant.key, grant.token)
        .await?;
    if released {
        print_json(&json!({ "key": grant.key, "released": true }));
        return Ok(ExitCode::SUCCESS);
    }
    let (why, sentence) = why_not_released(&client, grant).await;
    print_json(&json!({ "key": grant.key, "released": false, "why": why }));
    say(sentence);
    Ok(ExitCode::from(EXIT_NEGATIVE))
}

async fn inspect(cli: &Cli, key: &str) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    let value = match client.inspect(key).await? {
        Some(info) => json!({
            "key": info.key,
            "held": true,
            "owner": info.owner_id,
            "fencing_token": info.fencing_token,
            "acquired_at_unix_ms": unix_ms(info.acquired_at),
            "expires_at_unix_ms": unix_ms(info.expires_at),
            "waiter_count": info.waiter_count,
        }),
        None => json!({ "key": key, "held": false }),
    };
    print_json(&value);
    Ok(ExitCode::SUCCESS)
}

async fn revoke(
    cli: &Cli,
    key: &str,
    operator: Option<&str>,
    reason: &str,
) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    let outcome = match operator {
        Some(operator) => client.force_revoke(key, operator, reason).await?,
        None => client.force_revoke_as_caller(key, reason).await?,
    };
    print_json(&json!({
        "key": outcome.key,
        "revoked": outcome.revoked,
        "previous_owner": outcome.previous_owner_id,
        "previous_token": outcome.previous_token,
        "new_token_floor": outcome.new_token_floor,
    }));
    Ok(ExitCode::SUCCESS)
}

/// Pages `lockctl audit` follows at most: enough for the whole log one record a page, so a
/// server that kept answering tokens could not keep lockctl printing for ever.
const AUDIT_PAGES_MAX: usize = lock_client::limits::AUDIT_LOG_MAX + 1;

/// Prints the audit log as JSON lines, page after page, each line as soon as its page came.
async fn audit(cli: &Cli, key: Option<&str>) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    let mut token: Option<String> = None;
    for _ in 0..AUDIT_PAGES_MAX {
        let page = client.list_revocations(key, 0, token.as_deref()).await?;
        for r in &page.revocations {
            print_json(&json!({
                "key": r.key,
                "operator": r.operator,
                "reason": r.reason,
                "previous_owner_id": r.previous_owner_id,
                "previous_token": r.previous_token,
                "new_token_floor": r.new_token_floor,
                "revoked_at_unix_ms": unix_ms(r.revoked_at),
                "request_id": r.request_id,
            }));
        }
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => return Ok(ExitCode::SUCCESS),
        }
    }
    Err(LockError::contention(format!(
        "the audit log did not end within {AUDIT_PAGES_MAX} pages; the server keeps answering \
         next pages"
    ))
    .into())
}

async fn status(cli: &Cli) -> Result<ExitCode, Failure> {
    let client = connect(cli, None).await?;
    let nodes = client.cluster_status().await;
    let text = serde_json::to_string_pretty(&nodes)
        .map_err(|err| LockError::invalid(format!("cannot print the status: {err}")))?;
    print_line(&text);
    Ok(ExitCode::SUCCESS)
}

async fn acquire(cli: &Cli, lock: &LockArgs, wait: Option<Duration>) -> Result<ExitCode, Failure> {
    let session_ttl = lock.session_ttl.unwrap_or(lock.ttl);
    let client = connect(cli, Some(session_ttl)).await?;
    let owner = lock.owner.clone().unwrap_or_else(default_owner);
    let session = client.open_session(&owner).await?;
    let granted = match wait {
        Some(wait) => session.acquire(&lock.key, lock.ttl, wait).await,
        None => session.try_acquire(&lock.key, lock.ttl).await,
    };
    match granted {
        Ok(Some(handle)) => {
            print_json(&handle_json(&handle, Some(session.ttl())));
            // The lock must outlive this command: leave the session to its TTL.
            session.detach();
            Ok(ExitCode::SUCCESS)
        }
        Ok(None) => {
            session.close().await?;
            say(format!("{:?} is held by someone else", lock.key));
            Ok(ExitCode::from(EXIT_NEGATIVE))
        }
        Err(err) => {
            // Closing the session releases anything an unknown-outcome acquire left behind.
            let _ = session.close().await;
            Err(err.into())
        }
    }
}
