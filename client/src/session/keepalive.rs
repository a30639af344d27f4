//! The session's own tasks: the **keep-alive** of one grant, and the **watchdog** that notices
//! a passed deadline.
//!
//! Owns *when* things happen: a keep-alive renews its grant at the renewal instant the state
//! stored for it (a third of the TTL after the request that produced the current handle was
//! sent), retrying transient failures with backoff; the watchdog sleeps until the earliest
//! local deadline (of a grant or of the session) and marks what passed as lost. *What* a
//! renewal or a passed deadline changes is the state's. Both tasks sleep on Tokio's timers and
//! read [`crate::clock`], so a test with paused time drives them. The session's heartbeats are
//! on its client's schedule (the private `heartbeat` module), not here.

use std::sync::Arc;

use lock_api::LockError;

use super::inner::SessionInner;
use super::state::GrantId;
use crate::backoff::Backoff;
use crate::clock;

/// Keeps one grant alive: renews it every third of its TTL until it is released or lost, or
/// the session ends. Transient failures are retried with backoff; the watchdog reports the
/// loss if they last past the deadline.
pub(super) async fn keep_alive(inner: Arc<SessionInner>, id: GrantId) {
    let mut shutdown = inner.shutdown.subscribe();
    let config = inner.router().config().clone();
    let mut backoff = Backoff::new(config.backoff, config.jitter_seed);
    let Some((_, mut next)) = inner.state().renewal(&id) else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let Some((handle, _)) = inner.state().renewal(&id) else {
            return;
        };
        match inner.renew_tracked(&handle).await {
            Ok(Some(_)) => {
                backoff.reset();
                // The renewal was tracked with its send instant; its schedule is the state's.
                // A schedule not ahead (the state kept a handle with a later deadline that
                // was never renewed by a send it knows) is retried after a pause rather than
                // in a busy loop.
                let now = clock::now();
                match inner.state().renewal(&id) {
                    Some((_, at)) if at > now => next = at,
                    Some(_) => next = now + backoff.next_delay(),
                    None => return,
                }
            }
            Ok(None) | Err(LockError::LockLost { .. }) => return,
            Err(LockError::InvalidArgument { message }) => {
                tracing::warn!(key = %handle.key, %message, "keep-alive refused; the grant is lost");
                inner.mark_lost(&handle);
                return;
            }
            Err(err) => {
                tracing::debug!(key = %handle.key, %err, "keep-alive renewal failed; retrying");
                next = clock::now() + backoff.next_delay();
            }
        }
    }
}

/// Marks lost every grant whose local deadline passed, and the session dead when its own did.
pub(super) async fn watchdog(inner: Arc<SessionInner>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let watch = inner.state().watch(clock::now());
        if watch.session_passed {
            inner.die(
                "no heartbeat was answered before the session's local deadline".into(),
                false,
            );
            return;
        }
        for handle in watch.due {
            inner.expire(&handle);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(watch.next.into()) => {}
            _ = inner.changed.notified() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}
