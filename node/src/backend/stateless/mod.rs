//! [`StatelessBackend`]: the [`Backend`] over any [`lock_api::RequestStore`] — PostgreSQL or
//! etcd — where the lock table, its FIFO queues and the remembered requests live in the
//! store, so this node holds no lock state and every node serves every call.
//!
//! Owns the node-side rules of each request exactly as the Raft backend has them: the same
//! `lock_api::validate` calls in the same order (so a bad argument is the same error on every
//! backend), then one store call. A waiting acquire queues in the store and waits for its
//! hand-off (`wait`); a bounded, concurrent batch heartbeat; the periodic `reap_expired`
//! (`reaper`). Admin: this node reports itself as the leader and only member (it serves every
//! call), and refuses initialisation and membership changes (there is no membership). Decides
//! no lock outcome itself: the store does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lock_api::{Acquired, LockError, LockHandle, RequestStore, validate};
use tokio::sync::watch;

use crate::backend::{AuditRecord, Backend, Grant, KeyState, Member, NodeStatus, Revocation, Role};
use crate::clock::Clock;
use crate::log_limit::LogLimit;

mod reaper;
mod wait;

#[cfg(test)]
pub(crate) mod memory;
#[cfg(test)]
mod tests;

/// Most sessions of one `HeartbeatBatch` kept alive at once: each is one round trip to the
/// store, and a full batch (`lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`) sent all at
/// once would take that many of the store's connections from every other call.
pub const KEEP_ALIVE_CONCURRENCY_MAX: usize = 16;

struct Inner<S> {
    store: S,
    node_id: u64,
    /// This node's address, as `Status` names the leader and the only member.
    advertised: String,
    clock: Arc<dyn Clock>,
    stop: watch::Receiver<bool>,
    /// Always `true`: the store, not this node, decides whether a call succeeds. The sender is
    /// kept so that the health service never sees the watch close.
    serving: watch::Receiver<bool>,
    _serving_tx: watch::Sender<bool>,
    /// Abandoned acquires whose cancel failed (logged once, then summarised).
    cancel_failures: Mutex<LogLimit>,
}

/// The backend over `S`. Cheap to clone; every clone is the same backend.
pub struct StatelessBackend<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for StatelessBackend<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S> std::fmt::Debug for StatelessBackend<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatelessBackend")
            .field("node_id", &self.inner.node_id)
            .field("advertised", &self.inner.advertised)
            .finish_non_exhaustive()
    }
}

impl<S: RequestStore + 'static> StatelessBackend<S> {
    /// Serves `store` as node `node_id` reachable at `advertised`; `stop` turns `true` when the
    /// node starts shutting down.
    pub fn new(
        store: S,
        node_id: u64,
        advertised: String,
        clock: Arc<dyn Clock>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let (serving_tx, serving) = watch::channel(true);
        Self {
            inner: Arc::new(Inner {
                store,
                node_id,
                advertised,
                clock,
                stop,
                serving,
                _serving_tx: serving_tx,
                cancel_failures: Mutex::new(LogLimit::default()),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// Resolves once the node starts shutting down.
    async fn stopping(&self) {
        let mut stop = self.inner.stop.clone();
        // A dropped sender means the node is gone: treat it as stopping too.
        let _ = stop.wait_for(|stopping| *stopping).await;
    }

    fn no_membership(&self) -> LockError {
        LockError::invalid(format!(
            "membership: a node on the {} backend has no Raft membership to change",
            self.inner.store.backend_id()
        ))
    }
}

fn ttl(ttl_ms: u64) -> Result<Duration, LockError> {
    validate::ttl(Duration::from_millis(ttl_ms)).map(Duration::from_millis)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// A store's grant as the seam's record.
fn grant(h: LockHandle) -> Grant {
    Grant {
        key: h.key,
        owner_id: h.owner_id,
        session_id: h.session_id,
        token: h.fencing_token,
        ttl_ms: millis(h.ttl),
        expires_at_ms: unix_ms(h.server_expiry),
    }
}

impl<S: RequestStore + 'static> Backend for StatelessBackend<S> {
    async fn open_session(
        &self,
        caller: Option<&str>,
        owner_id: &str,
        ttl_ms: u64,
    ) -> Result<(String, u64), LockError> {
        validate::owner_id(owner_id)?;
        let ttl = ttl(ttl_ms)?;
        let store = &self.inner.store;
        let (session_id, kept) = match caller {
            Some(principal) => {
                validate::principal(principal)?;
                store.open_bound_session(owner_id, ttl, principal).await?
            }
            None => store.open_session_with_ttl(owner_id, ttl).await?,
        };
        Ok((session_id, millis(kept)))
    }

    async fn keep_alive(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<Option<u64>, LockError> {
        validate::session_id(session_id)?;
        self.check_session_owner(caller, session_id).await?;
        Ok(self.inner.store.keep_alive(session_id).await?.map(millis))
    }

    /// Each session is kept alive as `keep_alive` would, at most
    /// [`KEEP_ALIVE_CONCURRENCY_MAX`] at once, answers in request order; any failure is that
    /// session's own answer (there is no leader whose loss would fail them all).
    async fn keep_alive_batch(
        &self,
        caller: Option<&str>,
        session_ids: &[String],
    ) -> Result<Vec<Result<Option<u64>, LockError>>, LockError> {
        // Built up front rather than in the stream's `map`: a closure over `&String` makes the
        // future's lifetime higher-ranked, and the compiler cannot then prove it `Send`.
        let beats: Vec<_> = session_ids
            .iter()
            .map(|id| self.keep_alive(caller, id))
            .collect();
        Ok(futures::stream::iter(beats)
            .buffered(KEEP_ALIVE_CONCURRENCY_MAX)
            .collect()
            .await)
    }

    async fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<u32, LockError> {
        validate::session_id(session_id)?;
        self.check_session_owner(caller, session_id).await?;
        let released = self.inner.store.close_session(session_id).await?;
        Ok(u32::try_from(released).unwrap_or(u32::MAX))
    }

    async fn locks_of(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        self.check_session_owner(caller, session_id).await?;
        self.inner.store.locks_of(session_id).await
    }

    async fn try_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms: u64,
    ) -> Result<Option<Grant>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        let ttl = ttl(ttl_ms)?;
        self.check_session_owner(caller, session_id).await?;
        self.try_once(session_id, request_id, key, ttl).await
    }

    async fn acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms: u64,
        max_wait_ms: u64,
    ) -> Result<Option<Grant>, LockError> {
        let max_wait_ms = validate::max_wait(Duration::from_millis(max_wait_ms))?;
        if max_wait_ms == 0 {
            return self
                .try_acquire(caller, session_id, request_id, key, ttl_ms)
                .await;
        }
        validate::session_id(session_id)?;
        validate::key(key)?;
        let ttl = ttl(ttl_ms)?;
        self.check_session_owner(caller, session_id).await?;
        self.wait_for(
            session_id,
            request_id,
            key,
            ttl,
            Duration::from_millis(max_wait_ms),
        )
        .await
    }

    async fn cancel_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        self.check_session_owner(caller, session_id).await?;
        let cancelled = self
            .inner
            .store
            .cancel_request(session_id, request_id, key, true)
            .await?;
        Ok(cancelled.released)
    }

    /// `extend` on the store: the grant is named by `(key, token)`, as on the Raft backend,
    /// where the lease, not the caller's session, decides.
    async fn renew(
        &self,
        caller: Option<&str>,
        session_id: &str,
        _request_id: u64,
        key: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<Option<Grant>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        let ttl = ttl(ttl_ms)?;
        self.check_session_owner(caller, session_id).await?;
        self.check_grant_owner(caller, key, token).await?;
        Ok(self.inner.store.extend(key, token, ttl).await?.map(grant))
    }

    async fn release(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        self.check_session_owner(caller, session_id).await?;
        self.check_grant_owner(caller, key, token).await?;
        self.inner
            .store
            .release_request(session_id, request_id, key, token)
            .await
    }

    /// Every read is of the shared store, which is the lock table itself: no node can answer
    /// from a stale copy, so `leader_confirmed` asks for nothing more here.
    async fn inspect(
        &self,
        key: &str,
        _leader_confirmed: bool,
    ) -> Result<Option<KeyState>, LockError> {
        validate::key(key)?;
        Ok(self.inner.store.read(key).await?.map(|info| KeyState {
            key: info.key,
            owner_id: info.owner_id,
            session_id: info.session_id,
            token: info.fencing_token,
            acquired_at_ms: unix_ms(info.acquired_at),
            expires_at_ms: unix_ms(info.expires_at),
            waiter_count: info.waiter_count,
        }))
    }

    async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<Revocation, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        let outcome = self
            .inner
            .store
            .revoke_request(key, operator, reason, request_id)
            .await?;
        Ok(Revocation {
            key: outcome.key,
            previous_owner_id: outcome.previous_owner_id,
            previous_token: outcome.previous_token,
            new_token_floor: outcome.new_token_floor,
        })
    }

    async fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, LockError> {
        if let Some(key) = key {
            validate::key(key)?;
        }
        let records = self
            .inner
            .store
            .revocations(key, before_floor, limit)
            .await?;
        Ok(records
            .into_iter()
            .map(|r| AuditRecord {
                key: r.key,
                operator: r.operator,
                reason: r.reason,
                previous_owner_id: r.previous_owner_id,
                previous_token: r.previous_token,
                new_token_floor: r.new_token_floor,
                revoked_at_ms: unix_ms(r.revoked_at),
                request_id: r.request_id,
            })
            .collect())
    }

    fn status(&self) -> NodeStatus {
        NodeStatus {
            node_id: self.inner.node_id,
            role: Role::Leader,
            current_term: 0,
            leader_id: Some(self.inner.node_id),
            leader_addr: self.inner.advertised.clone(),
            commit_index: 0,
            applied_index: 0,
            last_log_index: 0,
            members: vec![Member {
                node_id: self.inner.node_id,
                addr: self.inner.advertised.clone(),
                voter: true,
            }],
            initialized: true,
        }
    }

    async fn init(&self, _members: BTreeMap<u64, String>) -> Result<(), LockError> {
        Err(self.no_membership())
    }

    async fn add_learner(&self, _node_id: u64, _addr: String) -> Result<(), LockError> {
        Err(self.no_membership())
    }

    async fn change_membership(
        &self,
        _voters: BTreeSet<u64>,
        _retain: bool,
    ) -> Result<(), LockError> {
        Err(self.no_membership())
    }

    fn serving(&self) -> watch::Receiver<bool> {
        self.inner.serving.clone()
    }

    fn stop_signal(&self) -> watch::Receiver<bool> {
        self.inner.stop.clone()
    }
}

impl<S: RequestStore + 'static> StatelessBackend<S> {
    /// Refuses `caller` on a session another principal opened (docs/SECURITY.md §3), before
    /// the call reaches the store. Checking first and acting after is sound without a
    /// transaction around both because the store never changes a session's principal and
    /// never reuses a session id (`RequestStore::session_principal`): the answer read here is
    /// the one that holds when the call acts, or the session is gone and the call finds
    /// nothing. One more round trip to the store per call, and only with a caller.
    async fn check_session_owner(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<(), LockError> {
        if caller.is_none() {
            return Ok(());
        }
        let opened_by = self.inner.store.session_principal(session_id).await?;
        validate::session_principal(caller, opened_by.as_deref())
    }

    /// [`StatelessBackend::check_session_owner`] for the session holding grant `(key, token)`:
    /// renew and release name a grant by `(key, token)` whichever session presents it, and a
    /// grant's session never changes (a token is issued once).
    async fn check_grant_owner(
        &self,
        caller: Option<&str>,
        key: &str,
        token: u64,
    ) -> Result<(), LockError> {
        if caller.is_none() {
            return Ok(());
        }
        match self.inner.store.read(key).await? {
            Some(info) if info.fencing_token == token => {
                self.check_session_owner(caller, &info.session_id).await
            }
            _ => Ok(()),
        }
    }

    /// One attempt, no wait. A store that queues a zero-wait request breaks its contract: the
    /// request is withdrawn (releasing a grant that raced it) and the caller told the outcome
    /// is unknown.
    async fn try_once(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        match self
            .inner
            .store
            .acquire_request(session_id, request_id, key, ttl, Duration::ZERO)
            .await?
        {
            Acquired::Granted(h) => Ok(Some(grant(h))),
            Acquired::NotGranted => Ok(None),
            Acquired::Queued => {
                tracing::error!(
                    key,
                    backend = self.inner.store.backend_id(),
                    "the store queued an acquire with no wait; withdrawing it"
                );
                self.inner
                    .store
                    .cancel_request(session_id, request_id, key, true)
                    .await?;
                Err(LockError::contention(
                    "unknown outcome: the store queued an acquire with no wait; retry with a new request id",
                ))
            }
        }
    }
}
