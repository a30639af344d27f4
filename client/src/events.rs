//! The events only the client sees (C2, issue 20): `session_lost`, `lease_expired` and
//! `fenced_out`, each a `tracing` event with that name and a counter through the [`metrics`]
//! facade, so the application picks the exporter (Prometheus, StatsD, none). Without an
//! installed recorder a counter costs a check and nothing more.
//!
//! Owns the names and the fields; the session and the router call these where they notice
//! each event, once per event.
//!
//! | event | counter | when |
//! |---|---|---|
//! | `session_lost` | `lock.session.lost` | a session is dead: the server says it is gone, or no heartbeat was answered before its local deadline |
//! | `lease_expired` | `lock.lease.expired` | a grant's local deadline passed before a renewal extended it |
//! | `fenced_out` | `lock.fenced.out` | a [`lock_api::Fence`] refused a token ([`admit`]), or a call answered `FencedOut` |

use lock_api::{Fence, LockError};

/// Counter of [`session_lost`] events.
pub const SESSION_LOST_COUNTER: &str = "lock.session.lost";
/// Counter of [`lease_expired`] events.
pub const LEASE_EXPIRED_COUNTER: &str = "lock.lease.expired";
/// Counter of [`fenced_out`] events (C2's `lock.fenced.out`).
pub const FENCED_OUT_COUNTER: &str = "lock.fenced.out";

/// A session died. `by_server`: the server answered that it is gone (else its local deadline
/// passed with no heartbeat answered). Every grant it held is lost with it.
pub fn session_lost(session_id: &str, reason: &str, by_server: bool) {
    tracing::warn!(
        name: "session_lost",
        session = %session_id,
        by_server,
        %reason,
        "session_lost"
    );
    metrics::counter!(SESSION_LOST_COUNTER).increment(1);
}

/// The local deadline of the grant `(key, token)` passed: the caller must stop acting under
/// it.
pub fn lease_expired(key: &str, token: u64) {
    tracing::warn!(name: "lease_expired", %key, token, "lease_expired");
    metrics::counter!(LEASE_EXPIRED_COUNTER).increment(1);
}

/// A resource refused `presented` for `key` because it had accepted `stored` (not lower).
pub fn fenced_out(key: &str, presented: u64, stored: u64) {
    tracing::warn!(name: "fenced_out", %key, presented, stored, "fenced_out");
    metrics::counter!(FENCED_OUT_COUNTER).increment(1);
}

/// Reports `err` as [`fenced_out`] if it is a [`LockError::FencedOut`].
pub(crate) fn observe(err: &LockError) {
    if let LockError::FencedOut {
        key,
        presented,
        stored,
    } = err
    {
        fenced_out(key, *presented, *stored);
    }
}

/// [`Fence::admit`], reporting a rejection as [`fenced_out`]: a resource guarded by a
/// `lock_api::Fence` calls this instead, so every refused stale holder is counted and logged
/// (lock-api itself stays free of dependencies). Answers exactly what `Fence::admit` answers.
pub fn admit(fence: &mut Fence, token: u64) -> Result<(), LockError> {
    let admitted = fence.admit(token);
    if let Err(err) = &admitted {
        observe(err);
    }
    admitted
}
