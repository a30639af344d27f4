//! The backend SPI (C2 §2.5): [`LockStore`] and [`SessionRegistry`].
//!
//! lockd implements it over its Raft cluster, and optionally over PostgreSQL and etcd. All
//! backends **must be observably identical**: the rules below are the contract a conformance
//! suite checks against each of them.
//!
//! Cross-cutting rule for every method: a network blip, a pool timeout, a serialization failure
//! or a leader change is [`LockError::Contention`] or [`LockError::NotLeader`], never an empty
//! result or `false`. Reporting a transient failure as "lost" is the most common bug in
//! home-grown lock clients: the caller retries a lost lock as if it were transient and two
//! holders proceed.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::{LockError, LockHandle, LockInfo, LockOutcome};

/// Where grants live. Implementations are thread-safe and shareable (C2 §2.8).
pub trait LockStore: Send + Sync {
    /// Inserts a grant of `key` to `owner_id` on `session_id` for `ttl`, if the key is free.
    ///
    /// MUST honour: atomic; single-shot (never waits for the holder to leave); allocates a
    /// token strictly greater than any token ever issued for that key, **including revoked
    /// ones**. `Ok(None)` = held by another live grant. Must never block on a row lock longer
    /// than the call deadline.
    fn try_insert(
        &self,
        key: &str,
        owner_id: &str,
        session_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Extends the grant identified by `(key, fencing_token)` to `ttl` from now.
    ///
    /// MUST honour: conditional on `key` and `fencing_token` — that pair is the whole predicate,
    /// because one global sequence makes a token unique per grant. Returns the same token with
    /// a later expiry, or `Ok(None)` meaning LOST NOW. MUST NOT return `Ok(None)` for a network
    /// blip, a pool timeout or a serialization failure — those are `Err(Contention)`.
    fn extend(
        &self,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Deletes the grant of `key` if and only if its token is `fencing_token`.
    ///
    /// MUST honour: compare-and-delete on the pinned pair `(key, fencing_token)` and nothing
    /// else; `Ok(false)` only when the grant no longer matches. Never deletes another grant.
    /// Ownership is proved by the token, not by an owner id.
    fn delete_if_owner(
        &self,
        key: &str,
        fencing_token: u64,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Reads the current grant of `key`.
    ///
    /// MUST honour: point-in-time, may be a follower read, explicitly non-authoritative.
    fn read(&self, key: &str) -> impl Future<Output = Result<Option<LockInfo>, LockError>> + Send;

    /// Force-revokes the grant of `key`, recording `operator` and `reason`.
    ///
    /// MUST honour: deletes the grant and advances the token floor **in the same atomic step**,
    /// and appends the revocation audit record. Reusing or lowering a token silently disables
    /// fencing for that key (INV-04).
    fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> impl Future<Output = Result<LockOutcome, LockError>> + Send;

    /// Removes grants whose lease ended before `now`; returns how many it removed.
    ///
    /// MUST honour: idempotent and safe to run concurrently on many replicas. Reaping is a
    /// liveness mechanism only: a grant is already expired before the reaper runs.
    fn reap_expired(
        &self,
        now: SystemTime,
    ) -> impl Future<Output = Result<usize, LockError>> + Send;

    /// A short, stable name of the backend ("raft", "pg", "etcd"), used only as a metric tag.
    fn backend_id(&self) -> &'static str;
}

/// Sessions: the liveness unit that grants hang off (FR-04). Thread-safe and shareable.
pub trait SessionRegistry: Send + Sync {
    /// Opens a session for `owner_id` that lives `ttl` past each heartbeat; returns its id.
    fn open_session(
        &self,
        owner_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<String, LockError>> + Send;

    /// Keeps `session_id` alive for another `ttl`.
    ///
    /// MUST honour: `Ok(false)` is terminal — the session is gone and every lock on it is gone
    /// with it (FR-04); do not retry. The cascade removes all the session's grants and waiters.
    /// A transient failure is `Err(Contention)`, never `Ok(false)`.
    fn heartbeat(
        &self,
        session_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Closes `session_id`, releasing every lock it holds and dropping its waiters; returns how
    /// many locks were released (0 for a session that is already gone).
    fn close_session(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<usize, LockError>> + Send;

    /// The keys `session_id` currently holds (empty for a session that is gone).
    fn locks_of(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<BTreeSet<String>, LockError>> + Send;
}
