//! The SDK's one clock: every instant the SDK reads (a send instant, a deadline check, a retry
//! schedule) comes from [`now`].
//!
//! It reads Tokio's clock, not `std::time::Instant::now()` directly, because the SDK's timers
//! are Tokio's (`sleep_until`, `timeout`): with one clock, a test that pauses Tokio's time
//! (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`) moves the deadlines the SDK
//! checks and the timers that enforce them together, and can drive a lease to its end without
//! waiting for it. Outside a paused test Tokio's clock *is* the monotonic clock. The public
//! API keeps `std::time::Instant` (`LockHandle::client_deadline` is one), so the conversion
//! happens here, once.

use std::time::Instant;

/// The current instant on Tokio's clock, as a `std::time::Instant`.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
