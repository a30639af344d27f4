//! Deadline arithmetic of a handle (FR-11, C2 D3): pure functions of instants and durations.
//!
//! Owns the one rule: a grant's client deadline counts from the instant taken *before* the
//! request that obtained it was first sent, minus the safety margin. It reads no clock itself;
//! callers pass the instants, so the rule is unit-tested exactly.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_api::{LockError, LockHandle};
use lock_proto::v1;

/// The client deadline of a lease of `ttl` obtained by a request first sent at `sent_at`:
/// `sent_at + ttl - margin`. A margin not shorter than the TTL gives `sent_at` (born expired);
/// [`check_margin`] rejects such a TTL before any request is sent.
pub fn client_deadline(sent_at: Instant, ttl: Duration, margin: Duration) -> Instant {
    sent_at + ttl.saturating_sub(margin)
}

/// Rejects a TTL that the safety margin would consume entirely.
pub fn check_margin(ttl: Duration, margin: Duration) -> Result<(), LockError> {
    if margin >= ttl {
        return Err(LockError::invalid(format!(
            "ttl is {} ms but the client's safety margin is {} ms; the lease would be expired \
             on arrival — use a longer ttl or a smaller safety_margin",
            ttl.as_millis(),
            margin.as_millis()
        )));
    }
    Ok(())
}

/// A wall-clock instant from milliseconds since the Unix epoch (display only). Values past what
/// `SystemTime` can represent saturate at the epoch rather than panic: bytes from the network
/// never crash the client.
pub fn system_time_from_unix_ms(unix_ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(unix_ms))
        .unwrap_or(UNIX_EPOCH)
}

/// Milliseconds since the Unix epoch of a wall-clock instant; 0 before the epoch.
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Builds the caller's handle from a server grant answered to a request for a lease of `asked`
/// first sent at `sent_at`. The lease is the shorter of what was asked and what the server
/// granted: a server may grant less, and a larger (or absurd) value from the network is never
/// trusted.
pub fn handle_from_grant(
    grant: v1::Grant,
    asked: Duration,
    sent_at: Instant,
    margin: Duration,
) -> LockHandle {
    let ttl = Duration::from_millis(grant.ttl_ms).min(asked);
    LockHandle {
        client_deadline: client_deadline(sent_at, ttl, margin),
        server_expiry: system_time_from_unix_ms(grant.server_expiry_unix_ms),
        key: grant.key,
        owner_id: grant.owner_id,
        session_id: grant.session_id,
        fencing_token: grant.fencing_token,
        ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_send_instant_minus_the_margin() {
        let sent_at = Instant::now();
        let deadline = client_deadline(sent_at, Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!(deadline - sent_at, Duration::from_secs(9));
        // A margin as long as the TTL leaves nothing.
        assert_eq!(
            client_deadline(sent_at, Duration::from_secs(1), Duration::from_secs(2)),
            sent_at
        );
        assert!(check_margin(Duration::from_secs(1), Duration::from_secs(1)).is_err());
        assert!(check_margin(Duration::from_secs(2), Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn a_handle_takes_the_granted_ttl_and_the_send_instant() {
        let sent_at = Instant::now();
        let grant = v1::Grant {
            key: "k".into(),
            owner_id: "o".into(),
            session_id: "s".into(),
            fencing_token: 9,
            ttl_ms: 3_000,
            server_expiry_unix_ms: 1_700_000_000_000,
        };
        let handle = handle_from_grant(
            grant.clone(),
            Duration::from_secs(10),
            sent_at,
            Duration::from_millis(300),
        );
        assert_eq!(handle.fencing_token, 9);
        assert_eq!(handle.ttl, Duration::from_secs(3));
        assert_eq!(
            handle.client_deadline - sent_at,
            Duration::from_millis(2_700)
        );
        assert_eq!(unix_ms(handle.server_expiry), 1_700_000_000_000);
        // More than asked (or an absurd value) is cut to what was asked.
        let absurd = v1::Grant {
            ttl_ms: u64::MAX,
            ..grant
        };
        let handle = handle_from_grant(absurd, Duration::from_secs(2), sent_at, Duration::ZERO);
        assert_eq!(handle.ttl, Duration::from_secs(2));
        assert_eq!(handle.client_deadline - sent_at, Duration::from_secs(2));
    }

    #[test]
    fn absurd_wall_clock_values_do_not_panic() {
        let _ = system_time_from_unix_ms(u64::MAX);
        assert_eq!(unix_ms(UNIX_EPOCH), 0);
    }
}
