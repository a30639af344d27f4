//! [`LockService`]: the whole caller-visible lock contract (C2 §2.2).

use std::future::Future;
use std::time::Duration;

use crate::{LockError, LockHandle, LockInfo, LockOutcome};

/// The six operations a caller has. Implementations are thread-safe and shareable (C2 §2.8).
///
/// Every method validates its arguments first (see [`crate::validate`]): a blank or over-long
/// key, owner, operator or reason, or a TTL or wait out of bounds, is
/// [`LockError::InvalidArgument`], never a lock outcome.
///
/// Only [`LockService::acquire`] may wait longer than one round trip, bounded by `max_wait`.
/// Dropping any returned future abandons the call; dropping an `acquire` future abandons the
/// wait and, if a grant was already recorded, releases it (C2 §2.8 "Cancellation").
pub trait LockService: Send + Sync {
    /// Acquires `key` for `owner_id` with a lease of `ttl`, waiting up to `max_wait` for a
    /// conflicting holder to go away. Retries transient failures internally with bounded,
    /// jittered backoff (FR-28); never takes longer than `max_wait` plus one in-flight round
    /// trip.
    ///
    /// - `Ok(Some(handle))`: granted; pass `handle.fencing_token` to every protected write.
    /// - `Ok(None)`: `max_wait` elapsed while the lock was legitimately held by someone else.
    ///   **Not an error, and must not be retried in a tight loop**: it means "not mine, do not
    ///   proceed" (FR-27).
    /// - `Err(Contention)`: a store-level conflict could not be resolved within the deadline;
    ///   retry with backoff.
    /// - `Err(NotLeader)`: the addressed node is not the leader; retry at the hinted leader.
    fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Single-shot acquire: one attempt, no waiting, no backoff.
    ///
    /// `Ok(None)` means the lock is currently held by anyone else — including a holder whose
    /// lease has lapsed but not yet been reaped. That is the normal, expected outcome under
    /// contention, not an error.
    fn try_acquire(
        &self,
        key: &str,
        owner_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Extends the lease of a grant this caller still owns, by the handle's TTL.
    ///
    /// - `Ok(Some(new_handle))`: the same fencing token with a later deadline; use the new
    ///   handle from now on.
    /// - `Ok(None)`: **THE LOCK IS LOST NOW** — expired, revoked, or taken over. Terminal for
    ///   this handle: the caller MUST abandon the critical section and MUST NOT treat it as a
    ///   transient error (C2 §2.5, FR-06, FR-12).
    /// - `Err(Contention | NotLeader)`: transient; the grant may still be held until its
    ///   deadline. Retry before the deadline, and stop at it.
    fn renew(
        &self,
        handle: &LockHandle,
    ) -> impl Future<Output = Result<Option<LockHandle>, LockError>> + Send;

    /// Compare-and-delete release of the caller's own grant, identified by `(key, token)`
    /// (FR-05, decision D1: taking the handle makes "release someone else's lock"
    /// inexpressible). Idempotent.
    ///
    /// `Ok(true)`: this handle's grant was the one removed. `Ok(false)`: the grant had already
    /// expired or been revoked — informational only, never an error path.
    fn release(&self, handle: &LockHandle) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// A diagnostic snapshot of `key`: `Ok(Some(info))` for the current grant, `Ok(None)` if
    /// unheld at the instant of the read.
    ///
    /// **Never usable for a correctness decision** (FR-07): the value is stale the moment it
    /// returns. Only a fencing token presented to a resource decides anything.
    fn inspect(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LockInfo>, LockError>> + Send;

    /// Break-glass: deletes the current grant of `key` regardless of owner and advances the
    /// token floor past it, so the displaced holder is fenced out at every resource
    /// (FR-08, INV-04, decision D4).
    ///
    /// `operator` (who) and `reason` (why) must be non-blank; both are recorded in the
    /// revocation audit log. Returns the previous owner and both token values.
    fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> impl Future<Output = Result<LockOutcome, LockError>> + Send;
}
