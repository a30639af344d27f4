//! [`LockClientSession`]: one server session, its heartbeat, the handles acquired on it, their
//! keep-alives, the watchdog that notices a passed deadline, and the lost-lock listeners.
//!
//! Owns the client-side view of "which grants does this session hold, until when". It never
//! decides that a grant is lost because of a transient failure: only the server's answer (renew
//! without a grant, heartbeat `alive = false`) or a passed *local* deadline marks a grant lost
//! (docs/DESIGN.md D-errors, FR-11). It does not pick endpoints or retry; the private `router`
//! module does.
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

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lock_api::{LockError, LockHandle, LockInfo, LockOutcome, LockService, validate};
use lock_proto::v1;
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

use crate::backoff::Backoff;
use crate::client::LockClient;
use crate::deadline::{check_margin, client_deadline, handle_from_grant};
use crate::guard::LockGuard;
use crate::router::{Budget, Router};

/// Heartbeats and keep-alive renewals go every `ttl / RENEW_FRACTION`: a third of the lease,
/// so two consecutive attempts can fail (or a failover can happen) before the lease runs out.
pub const RENEW_FRACTION: u32 = 3;

/// How many lost grants a session remembers, so that `check_still_held` on a handle whose loss
/// was reported by the server answers `LockLost` even though the handle's own deadline has not
/// passed. Bounded because a long-lived session may lose many grants; past this, the oldest are
/// forgotten and only their (passed, or soon passing) deadlines speak for them.
const LOST_REMEMBERED_MAX: usize = 1024;

/// Shortest pause between two heartbeat rounds that failed transiently, so a node that refuses
/// connections instantly does not turn the heartbeat into a busy loop.
const HEARTBEAT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A lost-lock listener (see [`LockClientSession::on_lock_lost`]).
type Listener = Arc<dyn Fn(&LockHandle) + Send + Sync + 'static>;

/// `(key, fencing token)`: one grant. A token is unique across the cluster, the key makes
/// the pair readable.
type GrantId = (String, u64);

/// Whether the session can still be used.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Life {
    Open,
    /// Closed, dropped or detached by the caller.
    Closed,
    /// The server declared it dead, or its local deadline passed.
    Dead {
        /// Why, for errors.
        reason: String,
        /// The server itself said so (then it holds nothing of the session any more).
        by_server: bool,
    },
}

struct Held {
    /// The latest handle of this grant (renewals replace it).
    handle: LockHandle,
    keep_alive: Option<AbortHandle>,
}

struct SessionState {
    life: Life,
    /// The session's own local deadline: the instant before the last answered heartbeat (or
    /// the open) was sent, plus the session TTL, minus the safety margin. Every grant of the
    /// session is gone once the session is, so a handle is held only until
    /// `min(handle deadline, session deadline)`.
    deadline: Instant,
    held: HashMap<GrantId, Held>,
    lost: HashSet<GrantId>,
    lost_order: VecDeque<GrantId>,
    listeners: Vec<Listener>,
}

impl SessionState {
    fn remember_lost(&mut self, id: GrantId) {
        if self.lost.insert(id.clone()) {
            self.lost_order.push_back(id);
            if self.lost_order.len() > LOST_REMEMBERED_MAX
                && let Some(oldest) = self.lost_order.pop_front()
            {
                self.lost.remove(&oldest);
            }
        }
    }
}

/// What the session's tasks and guards share. Tasks hold an `Arc` of it, so it outlives the
/// [`LockClientSession`] value until they have stopped.
pub(crate) struct SessionInner {
    pub(crate) client: LockClient,
    pub(crate) session_id: String,
    owner_id: String,
    ttl: Duration,
    margin: Duration,
    runtime: tokio::runtime::Handle,
    next_request_id: AtomicU64,
    state: Mutex<SessionState>,
    /// This session's key in its client's heartbeat schedule.
    heartbeat_key: u64,
    /// Wakes the watchdog when a deadline changes.
    changed: Notify,
    /// `true` tells every task of the session to stop.
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for SessionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionInner")
            .field("session_id", &self.session_id)
            .field("owner_id", &self.owner_id)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

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

impl SessionInner {
    fn state(&self) -> MutexGuard<'_, SessionState> {
        // Every critical section below leaves the state consistent before it can panic, so a
        // poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn router(&self) -> &Router {
        self.client.router()
    }

    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    fn check_open(&self) -> Result<(), LockError> {
        match &self.state().life {
            Life::Open => Ok(()),
            Life::Closed => Err(LockError::invalid(format!(
                "session {} is closed; open a new session",
                self.session_id
            ))),
            Life::Dead { reason, .. } => Err(LockError::invalid(format!(
                "session {} is dead ({reason}); its locks are gone — open a new session",
                self.session_id
            ))),
        }
    }

    fn check_own(&self, handle: &LockHandle) -> Result<(), LockError> {
        if handle.session_id != self.session_id {
            return Err(LockError::invalid(format!(
                "the handle of {:?} belongs to session {}, not to this session {}",
                handle.key, handle.session_id, self.session_id
            )));
        }
        Ok(())
    }

    /// Records (or refreshes) a held grant and wakes the watchdog. A grant already known lost
    /// stays lost: a late renewal answer never revives it.
    fn track(&self, handle: &LockHandle) {
        let id = (handle.key.clone(), handle.fencing_token);
        {
            let mut state = self.state();
            if state.lost.contains(&id) || state.life != Life::Open {
                return;
            }
            match state.held.get_mut(&id) {
                Some(held) => {
                    if handle.client_deadline > held.handle.client_deadline {
                        held.handle = handle.clone();
                    }
                }
                None => {
                    state.held.insert(
                        id,
                        Held {
                            handle: handle.clone(),
                            keep_alive: None,
                        },
                    );
                }
            }
        }
        self.changed.notify_one();
    }

    /// Forgets a grant the caller released (no listener fires).
    pub(crate) fn untrack(&self, key: &str, token: u64) {
        let removed = self.state().held.remove(&(key.to_owned(), token));
        if let Some(Held {
            keep_alive: Some(task),
            ..
        }) = removed
        {
            task.abort();
        }
        self.changed.notify_one();
    }

    /// Marks a grant lost and fires the listeners with its latest handle. Idempotent: a grant
    /// is reported lost at most once.
    fn mark_lost(&self, handle: &LockHandle) {
        let id = (handle.key.clone(), handle.fencing_token);
        let (latest, listeners, keep_alive) = {
            let mut state = self.state();
            if state.lost.contains(&id) {
                return;
            }
            let held = state.held.remove(&id);
            state.remember_lost(id);
            let (latest, keep_alive) = match held {
                Some(held) => (held.handle, held.keep_alive),
                None => (handle.clone(), None),
            };
            (latest, state.listeners.clone(), keep_alive)
        };
        if let Some(task) = keep_alive {
            task.abort();
        }
        tracing::warn!(
            key = %latest.key,
            token = latest.fencing_token,
            session = %self.session_id,
            "lock lost"
        );
        self.fire(&latest, listeners);
    }

    /// Calls every listener with `handle`, each on the blocking pool, each guarded.
    fn fire(&self, handle: &LockHandle, listeners: Vec<Listener>) {
        for listener in listeners {
            let handle = handle.clone();
            self.runtime.spawn_blocking(move || {
                let call = std::panic::catch_unwind(AssertUnwindSafe(|| listener(&handle)));
                if call.is_err() {
                    tracing::error!(
                        key = %handle.key,
                        token = handle.fencing_token,
                        "a lost-lock listener panicked"
                    );
                }
            });
        }
    }

    /// Ends the session as dead: every held grant is lost (listeners fire), tasks stop.
    /// `by_server`: the server answered that the session is gone.
    pub(crate) fn die(&self, reason: String, by_server: bool) {
        let handles: Vec<LockHandle> = {
            let mut state = self.state();
            if state.life != Life::Open {
                return;
            }
            tracing::warn!(session = %self.session_id, %reason, "session dead");
            state.life = Life::Dead { reason, by_server };
            state.held.values().map(|h| h.handle.clone()).collect()
        };
        let _ = self.shutdown.send(true);
        self.client.heartbeats().deregister(self.heartbeat_key);
        for handle in handles {
            self.mark_lost(&handle);
        }
    }

    /// Stops the tasks and forgets every grant without firing listeners (close, drop, detach).
    fn finish(&self) {
        let held: Vec<Held> = {
            let mut state = self.state();
            if state.life == Life::Open {
                state.life = Life::Closed;
            }
            state.held.drain().map(|(_, h)| h).collect()
        };
        for held in held {
            if let Some(task) = held.keep_alive {
                task.abort();
            }
        }
        let _ = self.shutdown.send(true);
        self.client.heartbeats().deregister(self.heartbeat_key);
    }

    /// The session's local deadline if it is still open (the next heartbeat must be answered
    /// before it); `None` once it is closed or dead.
    pub(crate) fn heartbeat_deadline(&self) -> Option<Instant> {
        let state = self.state();
        (state.life == Life::Open).then_some(state.deadline)
    }

    /// Applies the answer to a heartbeat of this session sent at `sent_at` (alone or in a
    /// batch): `Ok(Some(ttl))` moves the local deadline to `sent_at + ttl - margin`;
    /// `Ok(None)` (the server says the session is gone) and `InvalidArgument` / `LockLost`
    /// kill the session; any other error is transient and retried after a short pause, up to
    /// the local deadline. Answers when the next heartbeat is due, or `None` when the session
    /// ended (or had already ended: a late answer changes nothing then).
    pub(crate) fn on_heartbeat(
        &self,
        sent_at: Instant,
        answer: Result<Option<Duration>, LockError>,
    ) -> Option<Instant> {
        match answer {
            Ok(Some(answered)) => {
                // Trust the shorter of what was asked and what was answered; a zero answer
                // (a server that does not fill the field) means the TTL asked for.
                let ttl = if answered.is_zero() {
                    self.ttl
                } else {
                    answered.min(self.ttl)
                };
                let mut state = self.state();
                if state.life != Life::Open {
                    return None;
                }
                state.deadline = client_deadline(sent_at, ttl, self.margin);
                drop(state);
                self.changed.notify_one();
                Some(sent_at + self.ttl / RENEW_FRACTION)
            }
            Ok(None) => {
                self.die("the server reports the session dead".into(), true);
                None
            }
            Err(LockError::InvalidArgument { message })
            | Err(LockError::LockLost { key: message }) => {
                self.die(format!("the server refused the heartbeat: {message}"), true);
                None
            }
            Err(err) => {
                tracing::debug!(session = %self.session_id, %err, "heartbeat failed; retrying");
                self.heartbeat_deadline()
                    .map(|_| Instant::now() + HEARTBEAT_RETRY_PAUSE)
            }
        }
    }

    /// The instant until which `handle`'s grant is held as far as this process knows: the
    /// latest tracked renewal's deadline, capped by the session's deadline. `Err(LockLost)` if
    /// the grant is known lost, or the session is dead.
    fn effective_deadline(&self, handle: &LockHandle) -> Result<Instant, LockError> {
        let lost = || LockError::LockLost {
            key: handle.key.clone(),
        };
        let state = self.state();
        let id = (handle.key.clone(), handle.fencing_token);
        if state.lost.contains(&id) || matches!(state.life, Life::Dead { .. }) {
            return Err(lost());
        }
        let own = state
            .held
            .get(&id)
            .map(|h| h.handle.client_deadline)
            .unwrap_or(handle.client_deadline)
            .max(handle.client_deadline);
        Ok(own.min(state.deadline))
    }

    /// FR-13, local part: `Ok` while the deadline has not passed.
    pub(crate) fn check_still_held(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.check_own(handle)?;
        let deadline = self.effective_deadline(handle)?;
        if Instant::now() >= deadline {
            self.mark_lost(handle);
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        Ok(())
    }

    /// One Renew RPC (with retries under one request id), no bookkeeping. The new handle's
    /// deadline counts from the instant before the first attempt was sent.
    async fn renew_rpc(
        &self,
        handle: &LockHandle,
        retry_until: Instant,
    ) -> Result<Option<LockHandle>, LockError> {
        let ttl_ms = validate::ttl(handle.ttl)?;
        let request = v1::RenewRequest {
            session_id: self.session_id.clone(),
            request_id: self.next_request_id(),
            key: handle.key.clone(),
            fencing_token: handle.fencing_token,
            ttl_ms,
        };
        let budget = Budget {
            deadline: retry_until,
            attempt_timeout: self.router().config().attempt_timeout,
        };
        let sent_at = Instant::now();
        let answer = self
            .router()
            .piped(
                "renew",
                budget,
                &request,
                |pipeline, request, timeout| async move { pipeline.renew(request, timeout).await },
            )
            .await;
        let grant = match answer {
            Ok(response) => response.grant,
            // The server's verdict that the grant is gone is the same answer as "no grant".
            Err(LockError::LockLost { .. }) => None,
            Err(err) => return Err(err),
        };
        match grant {
            None => Ok(None),
            Some(grant)
                if grant.fencing_token != handle.fencing_token || grant.key != handle.key =>
            {
                Err(LockError::contention(format!(
                    "renew of {:?} token {} was answered for {:?} token {}; not trusting it",
                    handle.key, handle.fencing_token, grant.key, grant.fencing_token
                )))
            }
            Some(grant) => Ok(Some(handle_from_grant(
                grant,
                handle.ttl,
                sent_at,
                self.margin_for(handle.ttl),
            ))),
        }
    }

    fn margin_for(&self, ttl: Duration) -> Duration {
        self.router().config().safety_margin.for_ttl(ttl)
    }

    /// `renew` with bookkeeping: refuses a handle known lost or past its deadline, retries
    /// transient failures only until the deadline, records the new deadline, and reports a loss.
    pub(crate) async fn renew_tracked(
        self: &Arc<Self>,
        handle: &LockHandle,
    ) -> Result<Option<LockHandle>, LockError> {
        self.check_own(handle)?;
        let deadline = self.effective_deadline(handle)?;
        if Instant::now() >= deadline {
            self.mark_lost(handle);
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        let retry_until = deadline.min(Instant::now() + self.router().config().call_timeout);
        match self.renew_rpc(handle, retry_until).await {
            Ok(Some(renewed)) => {
                self.track(&renewed);
                Ok(Some(renewed))
            }
            Ok(None) => {
                self.mark_lost(handle);
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// The `LockService` form of acquire names an owner; a session acquires only for the
    /// owner it was opened for (the server records the session's owner on the grant).
    fn check_owner(&self, owner_id: &str) -> Result<(), LockError> {
        validate::owner_id(owner_id)?;
        if owner_id != self.owner_id {
            return Err(LockError::invalid(format!(
                "owner id {owner_id:?} is not this session's owner {:?}; open a session per owner",
                self.owner_id
            )));
        }
        Ok(())
    }

    /// Acquires `key` for the session's owner: waits up to `max_wait` on the server, or makes
    /// one attempt (`TryAcquire`) when it is `None`.
    async fn acquire(
        self: &Arc<Self>,
        key: &str,
        ttl: Duration,
        max_wait: Option<Duration>,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        let ttl_ms = validate::ttl(ttl)?;
        let max_wait_ms = max_wait.map(validate::max_wait).transpose()?;
        let margin = self.margin_for(ttl);
        check_margin(ttl, margin)?;
        self.check_open()?;

        let request_id = self.next_request_id();
        // From here on, dropping this future (or failing with an unknown outcome) cancels the
        // server-side wait and releases a grant already recorded (C2 §2.8).
        let mut guard = AcquireGuard {
            inner: Arc::clone(self),
            key: key.to_owned(),
            request_id,
            token: None,
            armed: true,
        };
        let sent_at = Instant::now();
        let wait = max_wait.unwrap_or(Duration::ZERO);
        let budget = self.router().budget(wait);
        let session_id = self.session_id.clone();
        let wait_until = sent_at + wait;
        let mut first_attempt = true;
        let answer = self
            .router()
            .call_piped("acquire", budget, |pipeline, timeout| {
                let session_id = session_id.clone();
                let key = key.to_owned();
                // A retry waits only for what is left of `max_wait`, so the whole call stays
                // within `max_wait` plus the retry budget (C2: never much longer than max_wait).
                let retry = !std::mem::replace(&mut first_attempt, false);
                let remaining_ms = max_wait_ms.map(|asked| {
                    let left = wait_until.saturating_duration_since(Instant::now());
                    match retry {
                        true => asked.min(u64::try_from(left.as_millis()).unwrap_or(asked)),
                        false => asked,
                    }
                });
                async move {
                    match remaining_ms {
                        Some(max_wait_ms) => {
                            let request = v1::AcquireRequest {
                                session_id,
                                request_id,
                                key,
                                ttl_ms,
                                max_wait_ms,
                            };
                            pipeline.acquire(request, timeout).await
                        }
                        None => {
                            let request = v1::TryAcquireRequest {
                                session_id,
                                request_id,
                                key,
                                ttl_ms,
                            };
                            pipeline.try_acquire(request, timeout).await
                        }
                    }
                }
            })
            .await?;
        let Some(grant) = answer.into_inner().grant else {
            guard.armed = false;
            return Ok(None);
        };
        guard.token = Some(grant.fencing_token);
        let mut handle = handle_from_grant(grant, ttl, sent_at, margin);
        // A long wait may have eaten most of the lease as this process counts it (the deadline
        // counts from the send, the lease from the grant). Renewing now re-bases it on an
        // instant after the grant, instead of handing out a handle that is nearly expired.
        if handle.remaining_at(Instant::now()) < handle.ttl / 2 {
            let retry_until = Instant::now() + self.router().config().call_timeout;
            match self.renew_rpc(&handle, retry_until).await? {
                Some(renewed) => handle = renewed,
                None => {
                    guard.armed = false;
                    return Err(LockError::contention(format!(
                        "the grant of {key:?} lapsed before it reached the caller; retry the acquire"
                    )));
                }
            }
        }
        self.track(&handle);
        guard.armed = false;
        Ok(Some(handle))
    }

    /// Cleans up after an acquire whose caller gave up: withdraws the waiter, releases a grant
    /// already recorded. Best effort, bounded by one call budget.
    async fn cancel_acquire(&self, key: String, request_id: u64, token: Option<u64>) {
        if let Some(token) = token {
            self.untrack(&key, token);
        }
        let request = v1::CancelAcquireRequest {
            session_id: self.session_id.clone(),
            request_id,
            key: key.clone(),
        };
        let cancelled = self
            .router()
            .piped(
                "cancel acquire",
                self.router().budget(Duration::ZERO),
                &request,
                |pipeline, request, timeout| async move {
                    pipeline.cancel_acquire(request, timeout).await
                },
            )
            .await;
        if let Err(err) = cancelled {
            tracing::warn!(%key, request_id, %err, "could not cancel an abandoned acquire");
        }
        if let Some(token) = token
            && let Err(err) = self.release_rpc(&key, token).await
        {
            tracing::warn!(%key, token, %err, "could not release an abandoned grant");
        }
    }

    pub(crate) async fn release_rpc(&self, key: &str, token: u64) -> Result<bool, LockError> {
        let request = v1::ReleaseRequest {
            session_id: self.session_id.clone(),
            request_id: self.next_request_id(),
            key: key.to_owned(),
            fencing_token: token,
        };
        let answer = self
            .router()
            .piped(
                "release",
                self.router().budget(Duration::ZERO),
                &request,
                |pipeline, request, timeout| async move { pipeline.release(request, timeout).await },
            )
            .await?;
        Ok(answer.released)
    }

    pub(crate) async fn release(&self, handle: &LockHandle) -> Result<bool, LockError> {
        self.check_own(handle)?;
        validate::key(&handle.key)?;
        validate::fencing_token(handle.fencing_token)?;
        self.untrack(&handle.key, handle.fencing_token);
        self.release_rpc(&handle.key, handle.fencing_token).await
    }

    /// Spawns the release of a dropped guard's grant.
    pub(crate) fn spawn_release(self: &Arc<Self>, handle: LockHandle) {
        let inner = Arc::clone(self);
        self.runtime.spawn(async move {
            if let Err(err) = inner.release(&handle).await {
                tracing::warn!(key = %handle.key, token = handle.fencing_token, %err,
                    "could not release the grant of a dropped guard");
            }
        });
    }

    fn start_keep_alive(self: &Arc<Self>, handle: &LockHandle) -> Result<(), LockError> {
        self.check_own(handle)?;
        let id = (handle.key.clone(), handle.fencing_token);
        let mut state = self.state();
        if state.lost.contains(&id) {
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        if state.life != Life::Open {
            drop(state);
            return self.check_open();
        }
        let held = state.held.entry(id).or_insert_with(|| Held {
            handle: handle.clone(),
            keep_alive: None,
        });
        if held.keep_alive.is_none() {
            let task = self.runtime.spawn(keep_alive(
                Arc::clone(self),
                handle.key.clone(),
                handle.fencing_token,
            ));
            held.keep_alive = Some(task.abort_handle());
        }
        drop(state);
        self.changed.notify_one();
        Ok(())
    }

    fn latest(&self, handle: &LockHandle) -> Result<LockHandle, LockError> {
        self.check_own(handle)?;
        self.check_still_held(handle)?;
        let state = self.state();
        Ok(state
            .held
            .get(&(handle.key.clone(), handle.fencing_token))
            .map(|h| h.handle.clone())
            .unwrap_or_else(|| handle.clone()))
    }

    /// Closes the session on the server (releasing all its grants).
    async fn close_rpc(&self) -> Result<u32, LockError> {
        self.client.close_session(&self.session_id).await
    }
}

/// Keeps one grant alive: renews it every third of its TTL until it is released or lost, or
/// the session ends. Transient failures are retried with backoff; the watchdog reports the
/// loss if they last past the deadline.
async fn keep_alive(inner: Arc<SessionInner>, key: String, token: u64) {
    let mut shutdown = inner.shutdown.subscribe();
    let config = inner.router().config().clone();
    let mut backoff = Backoff::new(config.backoff, config.jitter_seed);
    let id = (key, token);
    let current = |inner: &SessionInner| inner.state().held.get(&id).map(|h| h.handle.clone());
    let next_renewal = |handle: &LockHandle, margin: Duration| {
        // The send instant of the request that produced this handle, recovered from its deadline.
        let sent_at = handle
            .client_deadline
            .checked_sub(handle.ttl.saturating_sub(margin))
            .unwrap_or_else(Instant::now);
        sent_at + handle.ttl / RENEW_FRACTION
    };
    let Some(first) = current(&inner) else {
        return;
    };
    let mut next = next_renewal(&first, inner.margin_for(first.ttl));
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let Some(handle) = current(&inner) else {
            return;
        };
        match inner.renew_tracked(&handle).await {
            Ok(Some(renewed)) => {
                backoff.reset();
                next = next_renewal(&renewed, inner.margin_for(renewed.ttl));
            }
            Ok(None) | Err(LockError::LockLost { .. }) => return,
            Err(LockError::InvalidArgument { message }) => {
                tracing::warn!(key = %handle.key, %message, "keep-alive refused; the grant is lost");
                inner.mark_lost(&handle);
                return;
            }
            Err(err) => {
                tracing::debug!(key = %handle.key, %err, "keep-alive renewal failed; retrying");
                next = Instant::now() + backoff.next_delay();
            }
        }
    }
}

/// Marks lost every grant whose local deadline passed, and the session dead when its own did.
async fn watchdog(inner: Arc<SessionInner>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let now = Instant::now();
        let (session_deadline, due, next) = {
            let state = inner.state();
            let mut due = Vec::new();
            let mut next = state.deadline;
            for held in state.held.values() {
                if held.handle.client_deadline <= now {
                    due.push(held.handle.clone());
                } else {
                    next = next.min(held.handle.client_deadline);
                }
            }
            (state.deadline, due, next)
        };
        if session_deadline <= now {
            inner.die(
                "no heartbeat was answered before the session's local deadline".into(),
                false,
            );
            return;
        }
        for handle in due {
            inner.mark_lost(&handle);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = inner.changed.notified() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Cancels an acquire that did not complete (dropped, or failed with an unknown outcome).
struct AcquireGuard {
    inner: Arc<SessionInner>,
    key: String,
    request_id: u64,
    /// The grant's token, once the server's answer carried one.
    token: Option<u64>,
    armed: bool,
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = Arc::clone(&self.inner);
        let key = std::mem::take(&mut self.key);
        let (request_id, token) = (self.request_id, self.token);
        self.inner.runtime.spawn(async move {
            inner.cancel_acquire(key, request_id, token).await;
        });
    }
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
        let margin = client.router().config().safety_margin.for_ttl(ttl);
        let (shutdown, _) = watch::channel(false);
        let heartbeats = Arc::clone(client.heartbeats());
        let heartbeat_key = heartbeats.new_key();
        let inner = Arc::new(SessionInner {
            client,
            session_id,
            owner_id,
            ttl,
            margin,
            runtime: tokio::runtime::Handle::current(),
            next_request_id: AtomicU64::new(1),
            state: Mutex::new(SessionState {
                life: Life::Open,
                deadline: client_deadline(sent_at, ttl, margin),
                held: HashMap::new(),
                lost: HashSet::new(),
                lost_order: VecDeque::new(),
                listeners: Vec::new(),
            }),
            heartbeat_key,
            changed: Notify::new(),
            shutdown,
        });
        let interval = ttl / RENEW_FRACTION;
        heartbeats.register(heartbeat_key, &inner, interval, sent_at + interval);
        tokio::spawn(watchdog(Arc::clone(&inner)));
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
        self.inner.state().life == Life::Open
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
        self.inner.state().listeners.push(Arc::new(listener));
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
            self.inner.state().life,
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
