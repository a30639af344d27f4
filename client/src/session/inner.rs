//! [`SessionInner`]: what a session's tasks, guards and heartbeat schedule share — its
//! identity, its [`SessionState`] behind a mutex, and the side effects of the state's changes.
//!
//! Owns the step from a state change to what must follow it: waking the watchdog when a
//! deadline moved, aborting a keep-alive task, calling the lost-lock listeners (on the
//! blocking pool, each inside `catch_unwind`, so a slow or panicking listener delays or breaks
//! no other and no SDK task), taking the session off its client's heartbeat schedule. It reads
//! the time only from [`crate::clock`]. The calls to the server are in the sibling `rpc`
//! module, the tasks in `keepalive`.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lock_api::{LockError, LockHandle};
use tokio::sync::{Notify, watch};

use super::keepalive::keep_alive;
use super::state::{Listener, Lost, RENEW_FRACTION, SessionState, grant_id};
use crate::client::LockClient;
use crate::clock;
use crate::deadline::client_deadline;
use crate::heartbeat::HEARTBEAT_RETRY_PAUSE;
use crate::router::Router;

/// What the session's tasks and guards share. Tasks hold an `Arc` of it, so it outlives the
/// `LockClientSession` value until they have stopped.
pub(crate) struct SessionInner {
    pub(crate) client: LockClient,
    pub(crate) session_id: String,
    pub(super) owner_id: String,
    pub(super) ttl: Duration,
    margin: Duration,
    pub(super) runtime: tokio::runtime::Handle,
    next_request_id: AtomicU64,
    state: Mutex<SessionState>,
    /// This session's key in its client's heartbeat schedule.
    heartbeat_key: u64,
    /// Wakes the watchdog when a deadline changes.
    pub(super) changed: Notify,
    /// `true` tells every task of the session to stop.
    pub(super) shutdown: watch::Sender<bool>,
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

impl SessionInner {
    /// A session opened with an OpenSession request sent at `sent_at`, alive until
    /// `sent_at + ttl - margin`, with key `heartbeat_key` in its client's schedule (not yet
    /// registered there).
    pub(super) fn new(
        client: LockClient,
        session_id: String,
        owner_id: String,
        ttl: Duration,
        sent_at: Instant,
        heartbeat_key: u64,
    ) -> Self {
        let margin = client.router().config().safety_margin.for_ttl(ttl);
        let (shutdown, _) = watch::channel(false);
        Self {
            client,
            session_id,
            owner_id,
            ttl,
            margin,
            runtime: tokio::runtime::Handle::current(),
            next_request_id: AtomicU64::new(1),
            state: Mutex::new(SessionState::new(client_deadline(sent_at, ttl, margin))),
            heartbeat_key,
            changed: Notify::new(),
            shutdown,
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, SessionState> {
        // Every method of `SessionState` leaves it consistent before it can panic, so a
        // poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn router(&self) -> &Router {
        self.client.router()
    }

    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The safety margin the client's config gives a lease of `ttl`.
    pub(super) fn margin_for(&self, ttl: Duration) -> Duration {
        self.router().config().safety_margin.for_ttl(ttl)
    }

    pub(super) fn check_open(&self) -> Result<(), LockError> {
        self.state().check_open(&self.session_id)
    }

    pub(super) fn check_own(&self, handle: &LockHandle) -> Result<(), LockError> {
        if handle.session_id != self.session_id {
            return Err(LockError::invalid(format!(
                "the handle of {:?} belongs to session {}, not to this session {}",
                handle.key, handle.session_id, self.session_id
            )));
        }
        Ok(())
    }

    /// The `LockService` form of acquire names an owner; a session acquires only for the
    /// owner it was opened for (the server records the session's owner on the grant).
    pub(super) fn check_owner(&self, owner_id: &str) -> Result<(), LockError> {
        lock_api::validate::owner_id(owner_id)?;
        if owner_id != self.owner_id {
            return Err(LockError::invalid(format!(
                "owner id {owner_id:?} is not this session's owner {:?}; open a session per owner",
                self.owner_id
            )));
        }
        Ok(())
    }

    /// Records (or refreshes) a held grant obtained by a request sent at `sent_at`, and wakes
    /// the watchdog (see [`SessionState::track`]).
    pub(super) fn track(&self, handle: &LockHandle, sent_at: Instant) {
        if self.state().track(handle, sent_at) {
            self.changed.notify_one();
        }
    }

    /// Forgets a grant the caller released (no listener fires).
    pub(crate) fn untrack(&self, key: &str, token: u64) {
        let keep_alive = self.state().untrack(&(key.to_owned(), token));
        if let Some(task) = keep_alive {
            task.abort();
        }
        self.changed.notify_one();
    }

    /// Marks a grant lost and fires the listeners with its latest handle. Idempotent: a grant
    /// is reported lost at most once.
    pub(super) fn mark_lost(&self, handle: &LockHandle) {
        let Some(Lost {
            handle,
            listeners,
            keep_alive,
        }) = self.state().mark_lost(handle)
        else {
            return;
        };
        if let Some(task) = keep_alive {
            task.abort();
        }
        tracing::warn!(
            key = %handle.key,
            token = handle.fencing_token,
            session = %self.session_id,
            "lock lost"
        );
        self.fire(&handle, listeners);
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
        let handles = {
            let mut state = self.state();
            let Some(handles) = state.die(reason.clone(), by_server) else {
                return;
            };
            handles
        };
        tracing::warn!(session = %self.session_id, %reason, "session dead");
        let _ = self.shutdown.send(true);
        self.client.heartbeats().deregister(self.heartbeat_key);
        for handle in handles {
            self.mark_lost(&handle);
        }
    }

    /// Stops the tasks and forgets every grant without firing listeners (close, drop, detach).
    pub(super) fn finish(&self) {
        let keep_alives = self.state().finish();
        for task in keep_alives {
            task.abort();
        }
        let _ = self.shutdown.send(true);
        self.client.heartbeats().deregister(self.heartbeat_key);
    }

    /// The session's local deadline if it is still open (the next heartbeat must be answered
    /// before it); `None` once it is closed or dead.
    pub(crate) fn heartbeat_deadline(&self) -> Option<Instant> {
        self.state().heartbeat_deadline()
    }

    /// Applies the answer to a heartbeat of this session sent at `sent_at` (alone or in a
    /// batch): `Ok(Some(ttl))` moves the local deadline to `sent_at + ttl - margin`;
    /// `Ok(None)` (the server says the session is gone) and `InvalidArgument` / `LockLost` /
    /// `Unauthenticated` / `PermissionDenied` kill the session; any other error is transient and retried after a short pause, up to
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
                let deadline = client_deadline(sent_at, ttl, self.margin);
                if !self.state().heartbeat_answered(deadline) {
                    return None;
                }
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
            // A refusal of the caller's credentials repeats on every retry: the session cannot
            // be kept alive by this caller, so it ends now instead of at its deadline.
            Err(err @ (LockError::Unauthenticated { .. } | LockError::PermissionDenied { .. })) => {
                self.die(format!("the server refused the heartbeat: {err}"), true);
                None
            }
            Err(err) => {
                tracing::debug!(session = %self.session_id, %err, "heartbeat failed; retrying");
                self.heartbeat_deadline()
                    .map(|_| clock::now() + HEARTBEAT_RETRY_PAUSE)
            }
        }
    }

    /// The deadline of `handle`'s grant if it has not passed; otherwise marks the grant lost
    /// (listeners fire if this is the first to notice) and answers `Err(LockLost)`.
    pub(super) fn deadline_ahead(&self, handle: &LockHandle) -> Result<Instant, LockError> {
        self.check_own(handle)?;
        let deadline = self.state().effective_deadline(handle)?;
        if clock::now() >= deadline {
            self.mark_lost(handle);
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        Ok(deadline)
    }

    /// FR-13, local part: `Ok` while the deadline has not passed.
    pub(super) fn check_still_held(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.deadline_ahead(handle).map(|_| ())
    }

    /// Starts the keep-alive task of `handle`'s grant unless it has one.
    pub(super) fn start_keep_alive(self: &Arc<Self>, handle: &LockHandle) -> Result<(), LockError> {
        self.check_own(handle)?;
        let id = grant_id(handle);
        self.state()
            .ensure_keep_alive(handle, clock::now(), &self.session_id, || {
                self.runtime
                    .spawn(keep_alive(Arc::clone(self), id))
                    .abort_handle()
            })?;
        self.changed.notify_one();
        Ok(())
    }

    /// The newest handle of `handle`'s grant, if the local check still holds it.
    pub(super) fn latest(&self, handle: &LockHandle) -> Result<LockHandle, LockError> {
        self.check_still_held(handle)?;
        Ok(self.state().latest(handle))
    }
}
