//! [`LockClientSession`]: one server session — the unit that owns grants — and its public
//! API: acquire, try-acquire, renew, release, keep-alive, `check_still_held`, lost-lock
//! listeners, close and detach, and the [`LockService`] implementation.
//!
//! It never decides that a grant is lost because of a transient failure: only the server's
//! answer (renew without a grant, heartbeat `alive = false`) or a passed *local* deadline
//! marks a grant lost (docs/DESIGN.md D-errors, FR-11). It does not pick endpoints or retry;
//! the private `router` module does.
//!
//! # Layout
//!
//! - this module: the public type, a thin layer over the shared `SessionInner`;
//! - `state`: what the session knows (life, deadlines, grants held and lost, listeners) and
//!   every change of it, as plain data without IO or a clock;
//! - `inner`: `SessionInner`, the state behind a mutex and the side effects of its changes
//!   (waking the watchdog, stopping tasks, calling listeners);
//! - `rpc`: the calls to the server and the bookkeeping of their answers;
//! - `keepalive`: the keep-alive task of a grant and the deadline watchdog.
//!
//! Every instant comes from `crate::clock` (Tokio's clock), so tests with paused time drive
//! deadlines and timers together.
//!
//! # Tasks
//!
//! Opening a session spawns a task on the caller's Tokio runtime, puts the session on its
//! client's heartbeat schedule, and keep-alive spawns one task per handle; all stop when the
//! session is closed, dropped, detached or dies:
//!
//! - the client's **heartbeat** schedule (the private `heartbeat` module) heartbeats the
//!   session every third of its TTL, together with the client's other sessions due then
//!   (`HeartbeatBatch`), retrying transient failures up to the session's local deadline;
//!   `alive = false` kills the session;
//! - the **watchdog** sleeps until the earliest local deadline (of a handle or of the session)
//!   and marks what passed as lost;
//! - a **keep-alive** task renews its handle every third of its TTL until it is released or
//!   lost.
//!
//! Listeners are called on Tokio's blocking pool, one call per spawned job, each inside
//! `catch_unwind`, so a slow or panicking listener delays or breaks no other listener and none
//! of the tasks above.

mod inner;
mod keepalive;
mod rpc;
mod state;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_api::{LockError, LockHandle, LockInfo, LockOutcome, LockService};

pub(crate) use inner::SessionInner;
use state::Life;
pub use state::RENEW_FRACTION;

use crate::client::LockClient;
use crate::guard::LockGuard;

/// A session of lockd: the unit that owns grants, kept alive by heartbeats (C2 §2.6
/// `openSession`). Obtained from [`LockClient::open_session`].
///
/// Its own methods [`acquire`](LockClientSession::acquire),
/// [`try_acquire`](LockClientSession::try_acquire), [`renew`](LockClientSession::renew) and
/// [`release`](LockClientSession::release) act on this session's grants, for the owner the
/// session was opened for — an acquire does not name the owner again. The session also
/// implements [`LockService`], for code written against any backend; there `acquire` and
/// `try_acquire` take an `owner_id`, which must be the session's, and `inspect` and
/// `force_revoke` are passed to the client. The session's own methods win over the trait's in
/// method calls, so `session.acquire(key, ttl, max_wait)` is the session's; call
/// `LockService::acquire(&session, key, owner, ttl, max_wait)` for the trait's.
///
/// Every mutating call carries a request id from the session's counter, and a retry of the same
/// call reuses it, so a lost answer followed by a retry never acts twice
/// (docs/DESIGN.md D-idempotency).
///
/// # Ending
///
/// - [`LockClientSession::close`] stops the tasks and closes the session on the server, which
///   releases every lock of the session. Closing fires no lost-lock listener: the caller gave
///   the locks up.
/// - Dropping it without `close` stops the tasks and *starts* a best-effort close on the
///   runtime it was opened on; nobody learns whether it arrived. If it did not, the server ends
///   the session (and its locks) when its TTL lapses.
/// - [`LockClientSession::detach`] stops heartbeating without closing: the locks live until the
///   session TTL lapses (this is what `lockctl acquire` does).
/// - The session **dies** when the server answers a heartbeat with `alive = false`, or when no
///   heartbeat is answered before its local deadline. Then every handle of the session is
///   lost and the lost-lock listeners fire for each.
#[derive(Debug)]
pub struct LockClientSession {
    inner: Arc<SessionInner>,
    /// Set by `close` and `detach`, so `Drop` does not close again.
    finished: bool,
}

impl LockClientSession {
    /// Builds the session value and starts its tasks; `sent_at` is the instant before the
    /// OpenSession request was sent.
    pub(crate) fn start(
        client: LockClient,
        session_id: String,
        owner_id: String,
        ttl: Duration,
        sent_at: Instant,
    ) -> Self {
        let heartbeats = Arc::clone(client.heartbeats());
        let heartbeat_key = heartbeats.new_key();
        let inner = Arc::new(SessionInner::new(
            client,
            session_id,
            owner_id,
            ttl,
            sent_at,
            heartbeat_key,
        ));
        let interval = ttl / RENEW_FRACTION;
        heartbeats.register(heartbeat_key, &inner, interval, sent_at + interval);
        tokio::spawn(keepalive::watchdog(Arc::clone(&inner)));
        Self {
            inner,
            finished: false,
        }
    }

    /// The server-issued session id, which every grant of the session carries.
    pub fn session_id(&self) -> &str {
        &self.inner.session_id
    }

    /// The owner the session was opened for: every grant of the session is made to it.
    pub fn owner_id(&self) -> &str {
        &self.inner.owner_id
    }

    /// The session TTL the server granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// `true` while the session is open and not known dead. `false` is final.
    pub fn is_alive(&self) -> bool {
        self.inner.state().is_open()
    }

    /// Acquires `key` for the session's owner with a lease of `ttl`, waiting up to `max_wait`
    /// for a conflicting holder to go away (C2 §2.2; the contract's answers are
    /// [`LockService::acquire`]'s):
    ///
    /// - `Ok(Some(handle))`: granted; present `handle.fencing_token` with every protected write.
    /// - `Ok(None)`: `max_wait` passed while someone else held the lock. **Not an error, and
    ///   not to be retried in a tight loop**: "not mine, do not proceed" (FR-27).
    /// - `Err(Contention | NotLeader)`: the cluster could not decide within `max_wait` plus
    ///   [`ClientConfig::call_timeout`](crate::ClientConfig::call_timeout); retry later.
    /// - `Err(InvalidArgument)`: a blank or over-long key, a `ttl` outside
    ///   [`limits::TTL_MIN`](crate::limits::TTL_MIN)..=[`limits::TTL_MAX`](crate::limits::TTL_MAX)
    ///   or not longer than the safety margin, a `max_wait` over
    ///   [`limits::MAX_WAIT_MAX`](crate::limits::MAX_WAIT_MAX), or a session that ended.
    ///
    /// The server holds the request for up to `max_wait`, so a hand-off takes one commit;
    /// transient failures are retried with backoff under one request id. Dropping the future
    /// cancels the server-side wait and releases a grant already recorded. The handle's
    /// deadline counts from before the first send, minus the safety margin; after a long wait
    /// the SDK renews once so the handle is not handed out nearly expired.
    pub async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.inner.acquire(key, ttl, Some(max_wait)).await
    }

    /// One attempt at `key` for the session's owner, without waiting (C2 `tryAcquire`):
    /// `Ok(None)` if anyone else holds it now — including a holder whose lease has lapsed but
    /// not yet been reaped. The SDK still finds the leader and retries transport failures
    /// under the same request id. Errors as [`LockClientSession::acquire`].
    pub async fn try_acquire(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.inner.acquire(key, ttl, None).await
    }

    /// Extends `handle`'s lease by its TTL (see [`LockService::renew`]). `Ok(Some(new))`: use
    /// the new handle from now on. `Ok(None)`: **the lock is lost now** — the listeners fire.
    /// `Err(LockLost)` without a round trip for a handle already known lost or past its
    /// deadline; transient failures are retried only until that deadline.
    pub async fn renew(&self, handle: &LockHandle) -> Result<Option<LockHandle>, LockError> {
        self.inner.renew_tracked(handle).await
    }

    /// Releases `handle`'s grant (compare-and-delete on key and fencing token; see
    /// [`LockService::release`]) and stops its keep-alive; no listener fires. `Ok(true)`: this
    /// grant was the one removed. `Ok(false)`: it had already expired or been revoked —
    /// informational, not an error.
    pub async fn release(&self, handle: &LockHandle) -> Result<bool, LockError> {
        self.inner.release(handle).await
    }

    /// Registers `listener`, called once for every grant of this session that is lost from now
    /// on: its local deadline passed, a renewal answered "lost", keep-alive was refused, or the
    /// session died (C2 §2.6 `onLockLost`, FR-12). It receives the grant's latest handle.
    ///
    /// The listener runs on the SDK's blocking pool, never on the caller's task and never on
    /// the SDK's heartbeat or keep-alive tasks; each call is isolated, so a slow or panicking
    /// listener delays or breaks no other. It should still return quickly — signal the work to
    /// stop (a channel, a flag) rather than do the stopping itself. A release or close by the
    /// caller never fires it. There is no way to unregister; listeners live as long as the
    /// session.
    pub fn on_lock_lost<F>(&self, listener: F)
    where
        F: Fn(&LockHandle) + Send + Sync + 'static,
    {
        self.inner.state().add_listener(Arc::new(listener));
    }

    /// C2 §2.6 `checkStillHeld`, local only: `Ok(())` if `handle`'s grant is still held as far
    /// as this process can tell — not known lost, and neither its deadline (extended by any
    /// renewal this session made, keep-alive included) nor the session's deadline has passed.
    /// Otherwise `Err(LockLost)` (listeners fire if this check is the first to notice), or
    /// `Err(InvalidArgument)` for a handle of another session.
    ///
    /// `Ok` narrows the race window, it does not close it: the lease can lapse between this
    /// check and the side effect. Present the fencing token to the resource; that is what makes
    /// a stale holder harmless.
    pub fn check_still_held(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.inner.check_still_held(handle)
    }

    /// [`LockClientSession::check_still_held`], then confirms with the leader (FR-13): a
    /// leader-confirmed inspect of the key must show this grant (the same fencing token).
    ///
    /// `Ok(())`: held at the instant the leader answered. `Err(LockLost)`: the leader shows
    /// another grant or none — the loss is recorded and listeners fire. `Err(Contention |
    /// NotLeader)`: the leader could not be asked; the grant may still be held (fall back on the
    /// local deadline, which `check_still_held` enforces).
    pub async fn check_still_held_confirmed(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.inner.check_still_held(handle)?;
        let info = self.inner.client.inspect_with(&handle.key, true).await?;
        match info {
            // Tokens are unique across the cluster, so the token alone names this grant.
            Some(info) if info.fencing_token == handle.fencing_token => Ok(()),
            _ => {
                self.inner.mark_lost(handle);
                Err(LockError::LockLost {
                    key: handle.key.clone(),
                })
            }
        }
    }

    /// Opts `handle`'s grant into keep-alive: the SDK renews it every third of its TTL, before
    /// the deadline, until it is released or lost or the session ends. Transient failures are
    /// retried with backoff; if they last past the deadline the grant is reported lost (the
    /// listeners fire). Calling it again for the same grant does nothing.
    ///
    /// Use [`LockClientSession::latest`] to get the current handle; `check_still_held` already
    /// counts the renewals. `Err(LockLost)` if the grant is known lost;
    /// `Err(InvalidArgument)` for a handle of another session or a session that ended.
    pub fn keep_alive(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.inner.start_keep_alive(handle)
    }

    /// The newest handle of `handle`'s grant (after renewals, including keep-alive), if it is
    /// still held by the local check; `Err(LockLost)` otherwise.
    pub fn latest(&self, handle: &LockHandle) -> Result<LockHandle, LockError> {
        self.inner.latest(handle)
    }

    /// Wraps `handle` in a guard that releases the grant when dropped (see [`LockGuard`]).
    pub fn guard(&self, handle: LockHandle) -> LockGuard {
        LockGuard::new(Arc::clone(&self.inner), handle)
    }

    /// Closes the session: stops its tasks and asks the server to close it, which releases
    /// every lock of the session. Returns how many grants the server released.
    ///
    /// Listeners do not fire. `Err(Contention | NotLeader)`: the close may not have arrived;
    /// the session then ends with its TTL. A session that already died closes as `Ok(0)`
    /// without asking the server again only if the server said it was dead; otherwise the
    /// close is still sent, to free grants the server may still hold.
    pub async fn close(mut self) -> Result<u32, LockError> {
        self.finished = true;
        let server_said_dead = matches!(
            self.inner.state().life(),
            Life::Dead {
                by_server: true,
                ..
            }
        );
        self.inner.finish();
        if server_said_dead {
            return Ok(0);
        }
        self.inner.close_rpc().await
    }

    /// Stops heartbeating and forgets the session without closing it: its locks stay held on
    /// the server until the session TTL lapses (or until someone closes the session by id).
    /// Returns the session id. Listeners never fire after this. This is what `lockctl acquire`
    /// does, so the lock outlives the command.
    pub fn detach(mut self) -> String {
        self.finished = true;
        self.inner.finish();
        self.inner.session_id.clone()
    }
}

impl Drop for LockClientSession {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.inner.finish();
        let inner = Arc::clone(&self.inner);
        self.inner.runtime.spawn(async move {
            if let Err(err) = inner.close_rpc().await {
                tracing::warn!(session = %inner.session_id, %err,
                    "best-effort close of a dropped session failed; it ends with its TTL");
            }
        });
    }
}

impl LockService for LockClientSession {
    /// [`LockClientSession::acquire`] for code written against any [`LockService`]:
    /// `owner_id` must be the session's owner ([`LockClientSession::owner_id`]), else
    /// `Err(InvalidArgument)`.
    async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.inner.check_owner(owner_id)?;
        LockClientSession::acquire(self, key, ttl, max_wait).await
    }

    /// [`LockClientSession::try_acquire`] for code written against any [`LockService`]:
    /// `owner_id` must be the session's owner, else `Err(InvalidArgument)`.
    async fn try_acquire(
        &self,
        key: &str,
        owner_id: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.inner.check_owner(owner_id)?;
        LockClientSession::try_acquire(self, key, ttl).await
    }

    /// See [`LockClientSession::renew`].
    async fn renew(&self, handle: &LockHandle) -> Result<Option<LockHandle>, LockError> {
        LockClientSession::renew(self, handle).await
    }

    /// See [`LockClientSession::release`].
    async fn release(&self, handle: &LockHandle) -> Result<bool, LockError> {
        LockClientSession::release(self, handle).await
    }

    /// See [`LockService::inspect`] and [`LockClient::inspect`].
    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inner.client.inspect(key).await
    }

    /// See [`LockService::force_revoke`] and [`LockClient::force_revoke`].
    async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        self.inner.client.force_revoke(key, operator, reason).await
    }
}
