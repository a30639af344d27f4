//! `lockctl exec`: run a command while holding a lock — acquire, keep alive, pass the grant
//! in the environment, kill the command if the lock is lost, release when it ends.

use std::process::ExitCode;
use std::time::Duration;

use lock_client::{LockClientSession, LockError, LockHandle};
use tokio::process::Command;

use crate::args::{Cli, LockArgs, show};
use crate::exit::{EXIT_LOCK_LOST, EXIT_NEGATIVE, Failure, say};
use crate::{connect, default_owner, within};

/// How a child ended, as a shell would report it.
fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// A lock `exec` holds, with the channel its loss arrives on.
struct Taken {
    session: LockClientSession,
    handle: LockHandle,
    lost: tokio::sync::mpsc::UnboundedReceiver<LockHandle>,
}

/// Connects, opens the session and acquires for `exec`: `Ok(None)` if someone else held the
/// lock for all of `wait` (already said on stderr).
async fn take(cli: &Cli, lock: &LockArgs, wait: Duration) -> Result<Option<Taken>, Failure> {
    let session_ttl = lock.session_ttl.unwrap_or(lock.ttl);
    let client = connect(cli, Some(session_ttl)).await?;
    let owner = lock.owner.clone().unwrap_or_else(default_owner);
    let session = client.open_session(&owner).await?;
    let (lost_tx, lost) = tokio::sync::mpsc::unbounded_channel::<LockHandle>();
    session.on_lock_lost(move |handle| {
        // Never blocks: an unbounded send only queues.
        let _ = lost_tx.send(handle.clone());
    });
    match session.acquire(&lock.key, lock.ttl, wait).await {
        Ok(Some(handle)) => Ok(Some(Taken {
            session,
            handle,
            lost,
        })),
        Ok(None) => {
            session.close().await?;
            say(format!(
                "{:?} is held by someone else; gave up after --wait {}",
                lock.key,
                show(wait)
            ));
            Ok(None)
        }
        Err(err) => {
            let _ = session.close().await;
            Err(err.into())
        }
    }
}

pub async fn exec(
    cli: &Cli,
    lock: &LockArgs,
    wait: Duration,
    cmd: &[String],
) -> Result<ExitCode, Failure> {
    let (program, args) = cmd
        .split_first()
        .ok_or_else(|| LockError::invalid("exec needs a command after --"))?;
    let Some(Taken {
        session,
        handle,
        lost: mut lost_rx,
    }) = within(cli.timeout + wait, take(cli, lock, wait)).await?
    else {
        return Ok(ExitCode::from(EXIT_NEGATIVE));
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
            return Err(LockError::invalid(format!("cannot run {program:?}: {err}")).into());
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
            say(format!(
                "the lock on {:?} (token {}) was lost; killed {program:?}",
                lost.key, lost.fencing_token
            ));
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
        say(format!(
            "warning: could not release {:?}: {err}",
            handle.key
        ));
    }
    if let Err(err) = session.close().await {
        say(format!("warning: could not close the session: {err}"));
    }
}
