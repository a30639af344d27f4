//! Bounded, jittered exponential backoff (FR-28).
//!
//! Owns the delay arithmetic only: it never sleeps and reads no clock, so it is tested by its
//! outputs. The retry loop in the private `router` module asks it for the next delay and does the waiting.
//!
//! The delay before retry `n` (0-based) is drawn uniformly from `[ceiling/2, ceiling]` with
//! `ceiling = min(max, initial * multiplier^n)` ("equal jitter"). The jitter spreads the retries
//! of many clients that failed together (a leader crash fails every client at once), and the
//! lower half-bound keeps every retry from being immediate.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::BackoffConfig;

/// The delays of one call's retries. Create one per call; it is not shared.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    ceiling: Duration,
    rng: StdRng,
}

impl Backoff {
    /// A backoff whose jitter comes from `seed` (replayable) or, if `None`, from the OS.
    pub fn new(config: BackoffConfig, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Self {
            config,
            ceiling: config.initial.min(config.max),
            rng,
        }
    }

    /// The ceiling the next delay will be drawn under.
    pub fn ceiling(&self) -> Duration {
        self.ceiling
    }

    /// The delay before the next retry, in `[ceiling/2, ceiling]`; then grows the ceiling by
    /// the multiplier, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        let half = ceiling / 2;
        let spread_ns = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(self.rng.gen_range(0..=spread_ns));
        self.ceiling = ceiling
            .saturating_mul(self.config.multiplier)
            .min(self.config.max);
        half + jitter
    }

    /// Starts the ceilings over from `initial` (after a success, for a long-lived loop).
    pub fn reset(&mut self) {
        self.ceiling = self.config.initial.min(self.config.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BackoffConfig {
        BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(300),
            multiplier: 2,
        }
    }

    #[test]
    fn delays_stay_within_half_ceiling_and_ceiling_and_the_ceiling_is_capped() {
        for seed in 0..50 {
            let mut backoff = Backoff::new(config(), Some(seed));
            let mut expected_ceiling = Duration::from_millis(10);
            for _ in 0..20 {
                assert_eq!(backoff.ceiling(), expected_ceiling);
                let delay = backoff.next_delay();
                assert!(
                    delay >= expected_ceiling / 2 && delay <= expected_ceiling,
                    "seed {seed}: {delay:?} outside [{:?}, {expected_ceiling:?}]",
                    expected_ceiling / 2
                );
                expected_ceiling = (expected_ceiling * 2).min(Duration::from_millis(300));
            }
            assert_eq!(backoff.ceiling(), Duration::from_millis(300));
        }
    }

    #[test]
    fn jitter_varies_and_a_seed_replays() {
        let draw = |seed| {
            let mut b = Backoff::new(config(), Some(seed));
            (0..10).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // At the cap, many draws are not all the same value.
        let mut b = Backoff::new(config(), Some(1));
        for _ in 0..10 {
            b.next_delay();
        }
        let capped: std::collections::BTreeSet<_> = (0..20).map(|_| b.next_delay()).collect();
        assert!(capped.len() > 10, "no jitter at the cap: {capped:?}");
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(config(), Some(3));
        for _ in 0..5 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(10));
        assert!(b.next_delay() <= Duration::from_millis(10));
    }
}
