//! `lockctl`: lockd from the shell. Acquire, renew, release, inspect and revoke locks, show the
//! cluster, and run a command while holding a lock (`exec`, like `consul lock` and
//! `etcdctl lock`).
//!
//! Owns argument parsing, JSON output and exit codes only; every lock operation is the
//! `lock-client` library's. Errors are one line on stderr and a non-zero exit.
//!
//! # Exit codes
//!
//! - `0`: done (for `exec`: CMD's own status is passed through instead — its exit code, or
//!   `128 + signal` if a signal ended it);
//! - `1`: an error (cluster unreachable, invalid argument, …), printed as one line;
//! - `2`: bad command line (from the argument parser);
//! - `3`: a negative answer — `acquire`/`try`/`exec` not granted, `renew` found the lock lost;
//! - `4`: `exec` only: the lock was lost while CMD ran, and CMD was killed.
//!
//! # Lifetime of a lock taken by `acquire` / `try`
//!
//! The command opens a session whose TTL is the lock's TTL (or `--session-ttl`), takes the
//! lock, prints it and exits **without closing the session**. The lock therefore lives until
//! its TTL lapses, until `lockctl release`, or until `lockctl renew` extends it (which also
//! heartbeats the session). `exec` is the command to hold a lock for as long as a process runs.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lock_api::{LockError, LockHandle};
use lock_client::client::server_expiry_unix_ms;
use lock_client::deadline::unix_ms;
use lock_client::{ClientConfig, LockClient, LockClientSession};
use serde_json::json;
use tokio::process::Command;

/// The endpoints of the cluster `lockd dev` starts, used when neither `--endpoints` nor
/// `LOCKD_ENDPOINTS` is given.
const DEV_ENDPOINTS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

/// Exit code of a negative answer (not granted, lost).
const EXIT_NEGATIVE: u8 = 3;
/// Exit code of `exec` when the lock was lost and CMD killed.
const EXIT_LOCK_LOST: u8 = 4;

#[derive(Parser, Debug)]
#[command(
    name = "lockctl",
    version,
    about = "Acquire, inspect and manage locks of a lockd cluster",
    after_help = "Exit codes: 0 done (exec: CMD's own status); 1 error; 2 bad command line; \
                  3 not granted, or renew found the lock lost; 4 exec: the lock was lost and CMD killed."
)]
struct Cli {
    /// Comma-separated lockd endpoints (host:port); any node will do, the leader is found.
    #[arg(long, env = "LOCKD_ENDPOINTS", default_value = DEV_ENDPOINTS, value_delimiter = ',', global = true)]
    endpoints: Vec<String>,
    /// Budget of each call, retries included (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Acquire a lock, waiting up to --wait; print the handle as JSON.
    Acquire {
        #[command(flatten)]
        lock: LockArgs,
        /// How long to wait for the current holder (at most 5m).
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        wait: Duration,
    },
    /// Try once to acquire a lock, without waiting; print the handle as JSON.
    Try {
        #[command(flatten)]
        lock: LockArgs,
    },
    /// Extend a lock's lease (and heartbeat its session); print the new handle as JSON.
    Renew {
        #[command(flatten)]
        grant: GrantArgs,
        /// The new lease length.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Release a lock; prints {"released": true|false}.
    Release {
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Show a key's current holder (advisory only, never for correctness decisions).
    Inspect {
        /// The lock key.
        #[arg(long)]
        key: String,
    },
    /// Break-glass: delete a key's grant whoever holds it and fence its holder out (audited).
    Revoke {
        /// The lock key.
        #[arg(long)]
        key: String,
        /// Who is revoking (recorded in the audit log).
        #[arg(long)]
        operator: String,
        /// Why (recorded in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Show each node's view of the cluster: role, leader, term, members, log indexes.
    Status,
    /// Run CMD while holding the lock on --key; CMD gets LOCK_FENCING_TOKEN, LOCK_KEY and
    /// LOCK_OWNER in its environment, is killed if the lock is lost, and its exit status is
    /// lockctl's.
    Exec {
        #[command(flatten)]
        lock: LockArgs,
        /// How long to wait for the current holder (at most 5m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        wait: Duration,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
}

#[derive(Args, Debug)]
struct LockArgs {
    /// The lock key.
    #[arg(long)]
    key: String,
    /// The owner id (default: lockctl@HOST:PID).
    #[arg(long)]
    owner: Option<String>,
    /// The lease length (renewed automatically by `exec`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// The session TTL (default: the lease length).
    #[arg(long, value_parser = parse_duration)]
    session_ttl: Option<Duration>,
}

#[derive(Args, Debug)]
struct GrantArgs {
    /// The session id printed by `acquire` / `try`.
    #[arg(long)]
    session: String,
    /// The lock key.
    #[arg(long)]
    key: String,
    /// The fencing token printed by `acquire` / `try`.
    #[arg(long)]
    token: u64,
}

/// Parses `500ms`, `30s`, `2m` or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s or 2m"))?;
    let millis = match unit {
        "ms" => Some(value),
        "" | "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("lockctl@{host}:{}", std::process::id())
}

/// An error line for stderr: one line, whatever the message holds.
fn fail(err: impl std::fmt::Display) -> ExitCode {
    let line = err.to_string().replace(['\n', '\r'], " ");
    eprintln!("lockctl: {line}");
    ExitCode::FAILURE
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
    println!("{value}");
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli).await {
        Ok(code) => code,
        Err(err) => fail(err),
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

async fn connect(cli: &Cli, session_ttl: Option<Duration>) -> Result<LockClient, LockError> {
    let mut config = ClientConfig {
        call_timeout: cli.timeout,
        ..ClientConfig::default()
    };
    if let Some(ttl) = session_ttl {
        config.session_ttl = ttl;
    }
    LockClient::connect_with(&cli.endpoints, config).await
}

async fn run(cli: Cli) -> Result<ExitCode, LockError> {
    match &cli.command {
        Cmd::Acquire { lock, wait } => acquire(&cli, lock, Some(*wait)).await,
        Cmd::Try { lock } => acquire(&cli, lock, None).await,
        Cmd::Renew { grant, ttl } => {
            let client = connect(&cli, None).await?;
            if !client.heartbeat_session(&grant.session).await? {
                eprintln!(
                    "lockctl: session {} is gone, and every lock on it",
                    grant.session
                );
                return Ok(ExitCode::from(EXIT_NEGATIVE));
            }
            match client
                .renew_detached(&grant.session, &grant.key, grant.token, *ttl)
                .await?
            {
                Some(handle) => {
                    print_json(&handle_json(&handle, None));
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!(
                        "lockctl: the lock on {:?} with token {} is lost",
                        grant.key, grant.token
                    );
                    Ok(ExitCode::from(EXIT_NEGATIVE))
                }
            }
        }
        Cmd::Release { grant } => {
            let client = connect(&cli, None).await?;
            let released = client
                .release_detached(&grant.session, &grant.key, grant.token)
                .await?;
            print_json(&json!({ "key": grant.key, "released": released }));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Inspect { key } => {
            let client = connect(&cli, None).await?;
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
        Cmd::Revoke {
            key,
            operator,
            reason,
        } => {
            let client = connect(&cli, None).await?;
            let outcome = client.force_revoke(key, operator, reason).await?;
            print_json(&json!({
                "key": outcome.key,
                "revoked": outcome.revoked,
                "previous_owner": outcome.previous_owner_id,
                "previous_token": outcome.previous_token,
                "new_token_floor": outcome.new_token_floor,
            }));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status => {
            let client = connect(&cli, None).await?;
            let nodes = client.cluster_status().await;
            let text = serde_json::to_string_pretty(&nodes)
                .map_err(|err| LockError::contention(format!("cannot print the status: {err}")))?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec { lock, wait, cmd } => exec(&cli, lock, *wait, cmd).await,
    }
}

async fn acquire(
    cli: &Cli,
    lock: &LockArgs,
    wait: Option<Duration>,
) -> Result<ExitCode, LockError> {
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
            eprintln!("lockctl: {:?} is held by someone else", lock.key);
            Ok(ExitCode::from(EXIT_NEGATIVE))
        }
        Err(err) => {
            // Closing the session releases anything an unknown-outcome acquire left behind.
            let _ = session.close().await;
            Err(err)
        }
    }
}

/// How a child ended, as a shell would report it.
fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

async fn exec(
    cli: &Cli,
    lock: &LockArgs,
    wait: Duration,
    cmd: &[String],
) -> Result<ExitCode, LockError> {
    let (program, args) = cmd
        .split_first()
        .ok_or_else(|| LockError::invalid("exec needs a command after --"))?;
    let session_ttl = lock.session_ttl.unwrap_or(lock.ttl);
    let client = connect(cli, Some(session_ttl)).await?;
    let owner = lock.owner.clone().unwrap_or_else(default_owner);
    let session = client.open_session(&owner).await?;
    let (lost_tx, mut lost_rx) = tokio::sync::mpsc::unbounded_channel::<LockHandle>();
    session.on_lock_lost(move |handle| {
        // Never blocks: an unbounded send only queues.
        let _ = lost_tx.send(handle.clone());
    });
    let handle = match session.acquire(&lock.key, lock.ttl, wait).await {
        Ok(Some(handle)) => handle,
        Ok(None) => {
            session.close().await?;
            eprintln!(
                "lockctl: {:?} is held by someone else; gave up after {} ms",
                lock.key,
                wait.as_millis()
            );
            return Ok(ExitCode::from(EXIT_NEGATIVE));
        }
        Err(err) => {
            let _ = session.close().await;
            return Err(err);
        }
    };
    session.keep_alive(&handle)?;
    let spawned = Command::new(program)
        .args(args)
        .env("LOCK_FENCING_TOKEN", handle.fencing_token.to_string())
        .env("LOCK_KEY", &handle.key)
        .env("LOCK_OWNER", &handle.owner_id)
        .env("LOCK_SESSION_ID", &handle.session_id)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            let _ = session.close().await;
            return Err(LockError::invalid(format!("cannot run {program:?}: {err}")));
        }
    };
    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let outcome = tokio::select! {
        status = child.wait() => Ended::Exited(status),
        Some(lost) = lost_rx.recv() => Ended::Lost(lost),
        _ = terminate.recv() => Ended::Signalled(15),
        _ = interrupt.recv() => Ended::Signalled(2),
    };
    match outcome {
        Ended::Exited(status) => {
            let status = status
                .map_err(|err| LockError::invalid(format!("waiting for {program:?}: {err}")))?;
            finish(session, &handle).await;
            Ok(ExitCode::from(exit_code_of(status)))
        }
        Ended::Lost(lost) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let _ = session.close().await;
            eprintln!(
                "lockctl: the lock on {:?} (token {}) was lost; killed {program:?}",
                lost.key, lost.fencing_token
            );
            Ok(ExitCode::from(EXIT_LOCK_LOST))
        }
        Ended::Signalled(signal) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            finish(session, &handle).await;
            Ok(ExitCode::from(128 + signal))
        }
    }
}

enum Ended {
    Exited(std::io::Result<std::process::ExitStatus>),
    Lost(LockHandle),
    Signalled(u8),
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Result<tokio::signal::unix::Signal, LockError> {
    tokio::signal::unix::signal(kind)
        .map_err(|err| LockError::invalid(format!("cannot watch signals: {err}")))
}

/// Releases the lock and closes the session; failures are reported but do not change the exit
/// code (the lock then ends with its TTL).
async fn finish(session: LockClientSession, handle: &LockHandle) {
    if let Err(err) = session.release(handle).await {
        eprintln!(
            "lockctl: warning: could not release {:?}: {err}",
            handle.key
        );
    }
    if let Err(err) = session.close().await {
        eprintln!("lockctl: warning: could not close the session: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "s", "1h", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
