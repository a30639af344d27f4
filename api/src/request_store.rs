//! [`RequestStore`]: what a backend adds to C2's SPI so that a node serves its clients exactly
//! as the Raft cluster does (docs/DESIGN.md D-serve).
//!
//! C2's [`LockStore`] and [`SessionRegistry`] carry no request identity, no waits and no
//! session TTL: `try_insert` is single-shot, a retried call cannot be told from a new one, and a
//! waiting `acquire` could only be built over them by polling. What clients meet is richer — a
//! FIFO queue per key with a hand-off that needs no poll, request-id idempotency, the TTL a
//! heartbeat renews by — so every backend implements this trait as well, and one serving layer
//! in the node is written over it. C2's methods keep their contracts unchanged; nothing here
//! weakens one.
//!
//! # The request identity
//!
//! Every mutating call names itself by `(session_id, request_id)` (`request_id` is non-zero,
//! chosen by the client, and a retry carries the same one). A backend remembers each request's
//! answer for at least [`REQUEST_RETENTION`](crate::limits::REQUEST_RETENTION) (or for as long as the session lives, if shorter),
//! and a retry within that time gets the first answer — or, for an acquire still waiting, its
//! current state — never a second effect. A retry of a request the backend no longer remembers
//! must not be guessed at: it is answered [`LockError::Contention`] ("unknown outcome").
//! Rejections (invalid arguments, an unknown session) change nothing and need not be remembered.
//!
//! # The queue
//!
//! A key's waiters form one FIFO queue, ordered by when each request first reached the backend.
//! Whatever frees the key — a release, an expiry found by the reaper, a revoke, the end of the
//! holder's session — grants it to the first waiter whose wait has not ended, **in the same
//! atomic step** (or, where a backend cannot do that, in a step that any node may complete and
//! that is conditional on the key still being free, so two nodes completing it grant once). A
//! new acquire never overtakes a waiter, even when the key is momentarily free. A waiter leaves
//! the queue when it is granted, when its wait deadline passes, when it is cancelled, or when its
//! session ends. `LockInfo::waiter_count` is the queue's length.

use std::future::Future;
use std::time::Duration;

use crate::{LockError, LockHandle, LockOutcome, LockStore, RevocationRecord, SessionRegistry};

/// The answer of [`RequestStore::acquire_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The key is this request's: now, or by an earlier attempt of the same request.
    Granted(LockHandle),
    /// The key is held (or others wait for it) and the request waits in the key's queue; learn
    /// the outcome with [`RequestStore::wait_for_grant`].
    Queued,
    /// Not granted, and not waiting: the key was held and the wait was zero, the session
    /// already holds the key (acquires are not re-entrant), or an earlier attempt of the same
    /// request waited to its deadline without a grant.
    NotGranted,
}

/// The answer of [`RequestStore::cancel_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancelled {
    /// The grant the request had received before the cancel took effect, when the cancel was
    /// asked to keep it (`release_if_granted == false`). `None` otherwise.
    pub grant: Option<LockHandle>,
    /// `true` if the request had been granted and the cancel released that grant.
    pub released: bool,
}

/// A backend's request-carrying operations; see the module documentation for the rules every
/// method shares. Implementations are thread-safe and shareable (C2 §2.8).
pub trait RequestStore: LockStore + SessionRegistry {
    /// How often every node should call [`LockStore::reap_expired`]. Where the reaper is what
    /// hands an expired grant's key to its first waiter, this bounds how late that hand-off
    /// comes after the lease ends; a backend whose reap is cheap asks for a short interval.
    fn reap_interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Opens a session for `owner_id` with a lease of `ttl`; returns its id and the TTL the
    /// backend actually keeps (never shorter than `ttl`; etcd, for one, rounds up to whole
    /// seconds), which every heartbeat renews it by.
    fn open_session_with_ttl(
        &self,
        owner_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<(String, Duration), LockError>> + Send;

    /// [`RequestStore::open_session_with_ttl`] for a session bound to `principal`, the
    /// authenticated caller that opens it (docs/SECURITY.md §3): the store records the
    /// principal with the session, atomically with it, and answers it from
    /// [`RequestStore::session_principal`] for as long as the session lives.
    fn open_bound_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: &str,
    ) -> impl Future<Output = Result<(String, Duration), LockError>> + Send;

    /// The principal session `session_id` is bound to: `Ok(Some(principal))` for a session
    /// opened by [`RequestStore::open_bound_session`], `Ok(None)` for an unbound session or one
    /// the store does not hold (never opened, ended).
    ///
    /// MUST honour: a session's principal is recorded with the session and never changes, and
    /// a session id is never reused, so an answer read before a call on the session still
    /// holds when the call acts (the caller checks, then calls; no transaction spans both).
    fn session_principal(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<Option<String>, LockError>> + Send;

    /// Keeps `session_id` alive for another of its own TTL (the one it was opened with).
    ///
    /// `Ok(Some(ttl))`: alive, with that TTL. `Ok(None)` is terminal, as
    /// [`SessionRegistry::heartbeat`]'s `false`: the session and every lock on it are gone.
    fn keep_alive(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<Option<Duration>, LockError>> + Send;

    /// Acquires `key` for request `(session_id, request_id)`, for the session's owner, with a
    /// lease of `ttl`; if it cannot be granted now and `wait` is not zero, queues the request
    /// at the tail of the key's queue until `wait` from now.
    ///
    /// MUST honour: atomic; the token rule of [`LockStore::try_insert`]; FIFO (a free key with
    /// waiters goes to the first of them, not to this request); remembered (a retry answers the
    /// first attempt's current state: `Granted` with the same token, `Queued` while it waits,
    /// `NotGranted` once its wait ended); an unknown or ended session is
    /// `Err(InvalidArgument)`.
    fn acquire_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Acquired, LockError>> + Send;

    /// Resolves when the queued request `(session_id, request_id)` on `key` is granted
    /// (`Ok(Some(handle))`) or has left the queue without a grant (`Ok(None)`: its wait
    /// deadline passed, it was cancelled, or its session ended).
    ///
    /// MUST honour: woken by the hand-off itself (a notification or a watch), not by polling
    /// the store in a loop; a lost notification channel is re-established and the request's
    /// state read again, so no hand-off is missed. Never resolves before the outcome is
    /// recorded. The caller bounds the wait by dropping the future; dropping it changes
    /// nothing in the store (withdrawing is [`RequestStore::cancel_request`]).
    fn wait_for_grant(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Withdraws request `(session_id, request_id)` from `key`'s queue. If it was granted
    /// before the withdrawal took effect, `release_if_granted` decides: release the grant
    /// (the caller went away: C2 §2.8 "Cancellation") or keep it and return it (the caller's
    /// wait ran out just as the grant arrived: the grant is the caller's).
    ///
    /// MUST honour: atomic with respect to the hand-off (a request is either withdrawn before
    /// it is granted, or granted and then treated as `release_if_granted` says, never both or
    /// neither); an acquire of the same request that reaches the backend after its cancel
    /// does nothing; cancelling an unknown request or one of an ended session is
    /// `Ok(Cancelled { grant: None, released: false })`.
    fn cancel_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        release_if_granted: bool,
    ) -> impl Future<Output = Result<Cancelled, LockError>> + Send;

    /// [`LockStore::delete_if_owner`] for request `(session_id, request_id)`: compare-and-delete
    /// of grant `(key, fencing_token)`, handing the key to its first waiter in the same step.
    ///
    /// MUST honour: remembered (a retry answers `true` again after a first `true`, even though
    /// the grant is gone, and never deletes a later grant); `Ok(false)` only when the grant no
    /// longer matches; a session that ended answers `Ok(false)` (its grants ended with it).
    fn release_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// [`LockStore::revoke`] with a request id: a retry of `(key, operator, request_id)` within
    /// [`REVOKE_RETRY_WINDOW`](crate::limits::REVOKE_RETRY_WINDOW) of the first answers the first outcome instead of revoking again (a second
    /// revoke would displace the *next* holder). `request_id == 0` is never deduplicated. The
    /// key goes to its first waiter in the same step.
    fn revoke_request(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> impl Future<Output = Result<LockOutcome, LockError>> + Send;

    /// The newest revocation audit records, newest first (highest `new_token_floor` first):
    /// at most `limit` of them, only those whose floor is below `before_floor` (when given),
    /// and only of `key` (when given).
    ///
    /// MUST honour: the log is the newest
    /// [`AUDIT_LOG_MAX`](crate::limits::AUDIT_LOG_MAX) revokes across all keys — a record
    /// older than that is never answered, whether or not the store has deleted it yet — and
    /// every revoke that returned is in it (the audit record is written in the revoke's own
    /// atomic step, [`LockStore::revoke`]). Paging by `before_floor` is stable: a revoke made
    /// after the first page has a higher floor and never shifts the later pages. A read
    /// failure is `Err(Contention)`, never an empty list.
    fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RevocationRecord>, LockError>> + Send;
}
