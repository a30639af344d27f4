//! The node's clocks, behind one injected trait: the wall clock the leader stamps commands with
//! (docs/DESIGN.md D-time) and the monotonic clock lease deadlines are kept in (D-lease).
//!
//! Owns reading time and nothing else. Nothing outside this module calls `SystemTime::now()` or
//! `Instant::now()` for a decision, so tests can drive time by hand ([`ManualClock`]) and the
//! hidden `--test-clock-offset-ms` flag can skew one leader's stamps.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time. Implementations are cheap to call and thread-safe.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Wall-clock milliseconds since the Unix epoch, as the leader stamps commands with.
    /// Display and stamp only; never compared across processes for a safety decision.
    fn wall_ms(&self) -> u64;

    /// The monotonic clock that lease deadlines are measured on.
    fn now(&self) -> Instant;
}

/// The real clocks, with an optional offset added to the wall clock (test-only skew).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock {
    /// Added to every [`Clock::wall_ms`] reading; may be negative.
    pub wall_offset_ms: i64,
}

impl SystemClock {
    /// The real clocks with `wall_offset_ms` added to the wall clock.
    pub fn with_offset(wall_offset_ms: i64) -> Self {
        Self { wall_offset_ms }
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        // A clock before 1970 reads as 0: the proposer clamps stamps to never go backwards, so
        // a broken clock can only stall stamps, never reorder them.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        ms.saturating_add(self.wall_offset_ms).max(0) as u64
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to, for tests of lease and proposer logic.
#[derive(Debug)]
pub struct ManualClock {
    state: Mutex<(Instant, u64)>,
}

impl ManualClock {
    /// A clock reading `wall_ms` on the wall and "now" on the monotonic clock.
    pub fn new(wall_ms: u64) -> Self {
        Self {
            state: Mutex::new((Instant::now(), wall_ms)),
        }
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 += by;
        state.1 += by.as_millis() as u64;
    }

    /// Sets the wall clock alone (a clock step), leaving the monotonic clock where it is.
    pub fn set_wall_ms(&self, wall_ms: u64) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = wall_ms;
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    fn now(&self) -> Instant {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_moves_the_wall_clock_only() {
        let plain = SystemClock::default().wall_ms();
        let ahead = SystemClock::with_offset(60_000).wall_ms();
        assert!(ahead >= plain + 60_000, "{ahead} vs {plain}");
        assert_eq!(SystemClock::with_offset(i64::MIN).wall_ms(), 0);
    }

    #[test]
    fn manual_clock_advances_both() {
        let clock = ManualClock::new(1_000);
        let t0 = clock.now();
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.wall_ms(), 1_250);
        assert_eq!(clock.now() - t0, Duration::from_millis(250));
    }
}
