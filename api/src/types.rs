//! The records of the contract (C2 §2.3): [`LockHandle`], [`LockInfo`], [`LockOutcome`]; and
//! [`RevocationRecord`], the audit log's record of one revoke (C2's `lock_revocation` row).
//! Immutable values, free to share between threads (C2 §2.8).

use std::time::{Duration, Instant, SystemTime};

/// Proof of a held grant: the only object that authorises a protected side effect (C2 §2.3).
///
/// Two clocks, on purpose (decision D3): [`LockHandle::client_deadline`] is a monotonic
/// [`Instant`] of *this process* and is authoritative for it — the SDK starts it *before* the
/// request is sent and subtracts a safety margin (FR-11). [`LockHandle::server_expiry`] is the
/// server's wall clock, for logs and dashboards only: comparing it with a local wall clock would
/// import clock skew and NTP steps into a safety decision.
///
/// Holding a handle whose deadline has not passed does **not** prove the grant is still yours
/// (a process can pause at any point); the [`LockHandle::fencing_token`] presented to the
/// resource is what decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHandle {
    /// The locked key.
    pub key: String,
    /// The owner the grant was made to.
    pub owner_id: String,
    /// The session the grant belongs to; the grant dies with the session (FR-04).
    pub session_id: String,
    /// The fencing token: never zero, unique across the cluster, strictly increasing per key in
    /// grant order (FR-02, INV-04). `renew` keeps it. Pass it to every protected write, as a
    /// `u64` argument or the [`crate::HEADER_FENCING_TOKEN`] header — never through a
    /// thread-local or task-local (C2 §2.7).
    pub fencing_token: u64,
    /// The lease length the grant was made (and is renewed) with.
    ///
    /// C2's record leaves it to the SDK's bookkeeping; carrying it makes a handle
    /// self-contained, so `renew(&handle)` needs nothing else.
    pub ttl: Duration,
    /// Past this instant the caller MUST assume the grant is lost (FR-11). Authoritative for
    /// this process; never sent over the wire.
    pub client_deadline: Instant,
    /// The server's wall-clock expiry. Informational only.
    pub server_expiry: SystemTime,
}

impl LockHandle {
    /// Time left before [`LockHandle::client_deadline`] as seen at `now`; zero once it passed.
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.client_deadline.saturating_duration_since(now)
    }

    /// Whether the client deadline has passed at `now` (reaching it counts as passed).
    pub fn is_expired_at(&self, now: Instant) -> bool {
        now >= self.client_deadline
    }
}

/// A diagnostic snapshot of a key, returned by `inspect` (C2 §2.3).
///
/// **Never usable for a correctness decision** (FR-07): it is stale the moment it is returned
/// and may come from a follower. Only a fencing token presented to a resource decides anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The key.
    pub key: String,
    /// The current holder's owner id.
    pub owner_id: String,
    /// The session the current grant belongs to. C2's record leaves it out; lockd's wire
    /// carries it, and an operator looking at a stuck key needs it to find the holder.
    pub session_id: String,
    /// The current grant's fencing token.
    pub fencing_token: u64,
    /// When the grant was made (server wall clock, display only).
    pub acquired_at: SystemTime,
    /// When the grant expires unless renewed (server wall clock, display only).
    pub expires_at: SystemTime,
    /// How many acquires are queued for the key.
    pub waiter_count: u32,
}

/// The result of a force-revoke, and of nothing else (C2 §2.3), for the audit trail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOutcome {
    /// The key.
    pub key: String,
    /// `true` if a grant was deleted; `false` if the key was not held (the floor still
    /// advances, so no token issued before the revoke can ever be accepted again).
    pub revoked: bool,
    /// The displaced holder's owner id, if there was one. C2's record has a non-null string;
    /// Rust says "none" with [`Option`] rather than an empty string.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's fencing token, if there was one.
    pub previous_token: Option<u64>,
    /// The token floor after the revoke: every later grant's token is greater than this, so the
    /// displaced holder is fenced out at every resource (FR-08, INV-04).
    pub new_token_floor: u64,
}

/// One force-revoke as the audit log keeps it: who revoked which key, why, whom it displaced,
/// and the token floor it set. A backend keeps the newest
/// [`AUDIT_LOG_MAX`](crate::limits::AUDIT_LOG_MAX) of them.
///
/// `new_token_floor` is unique across the backend (every revoke burns a token) and only grows
/// from one revoke to the next, so it is the order of the log: a higher floor is a later
/// revoke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationRecord {
    /// The revoked key.
    pub key: String,
    /// Who revoked (the authenticated principal where the node authenticates callers).
    pub operator: String,
    /// Why, as the operator wrote it.
    pub reason: String,
    /// The displaced holder's owner id; `None` if the key was free.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's fencing token; `None` if the key was free.
    pub previous_token: Option<u64>,
    /// The token floor after the revoke: every later grant's token is greater.
    pub new_token_floor: u64,
    /// When the backend applied the revoke (its wall clock, display only).
    pub revoked_at: SystemTime,
    /// The revoke's request id; 0 if the caller gave none.
    pub request_id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_arithmetic_uses_the_monotonic_clock() {
        let now = Instant::now();
        let handle = LockHandle {
            key: "k".into(),
            owner_id: "o".into(),
            session_id: "s".into(),
            fencing_token: 1,
            ttl: Duration::from_secs(10),
            client_deadline: now + Duration::from_secs(3),
            server_expiry: SystemTime::UNIX_EPOCH,
        };
        assert_eq!(handle.remaining_at(now), Duration::from_secs(3));
        assert!(!handle.is_expired_at(now));
        assert!(handle.is_expired_at(now + Duration::from_secs(3)));
        assert_eq!(
            handle.remaining_at(now + Duration::from_secs(4)),
            Duration::ZERO
        );
    }
}
