//! The retry policy for one unreachable Raft peer: capped exponential backoff with jitter.
//!
//! After the n-th failure in a row the next attempt waits a delay drawn from
//! `[b/2, b]`, where `b = min(BACKOFF_INITIAL · 2ⁿ⁻¹, BACKOFF_CAP)` ("equal jitter"): it doubles
//! quickly away from a dead peer, never waits longer than the cap (so a peer that comes back
//! is tried again within one cap), and the random half keeps the nodes of a cluster from
//! retrying a restarted peer in lockstep. A success resets it.
//!
//! Owns the delay sequence only. Pure: it reads no clock and does no IO, and its randomness
//! is a small PRNG seeded by the caller, so a seed fixes the whole sequence (tests assert it).

use std::time::Duration;

/// The delay after the first failure. A peer that is restarting answers again within a
/// fraction of a second; trying again this soon costs one refused connection.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(50);

/// The longest delay between two attempts. A peer that comes back is reached within this of
/// listening again (issue 17 asks for prompt catch-up); a dead peer costs at most about one
/// connection attempt per path per `BACKOFF_CAP / 2`, which is nothing.
pub const BACKOFF_CAP: Duration = Duration::from_secs(1);

const _: () = assert!(BACKOFF_INITIAL.as_nanos() > 0);
const _: () = assert!(BACKOFF_INITIAL.as_nanos() <= BACKOFF_CAP.as_nanos());

/// Failures in a row past which the delay no longer grows (`2^20 · 50 ms` is far past the
/// cap); bounds the shift.
const DOUBLINGS_MAX: u32 = 20;

/// Capped exponential backoff with equal jitter (see the module docs).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    /// Failures since the last success.
    failures: u32,
    /// splitmix64 state: the jitter source.
    rng: u64,
}

impl Backoff {
    /// The policy of the module docs ([`BACKOFF_INITIAL`], [`BACKOFF_CAP`]) with its jitter
    /// drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_limits(BACKOFF_INITIAL, BACKOFF_CAP, seed)
    }

    /// A policy starting at `initial` and never above `cap`, with jitter from `seed`.
    ///
    /// # Panics
    ///
    /// If `initial` is zero or above `cap` (a programmer error).
    pub fn with_limits(initial: Duration, cap: Duration, seed: u64) -> Self {
        assert!(
            !initial.is_zero() && initial <= cap,
            "backoff initial {initial:?} must be non-zero and at most the cap {cap:?}"
        );
        Self {
            initial,
            cap,
            failures: 0,
            rng: seed,
        }
    }

    /// Records one more failure and returns how long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let doublings = self.failures.min(DOUBLINGS_MAX);
        self.failures = self.failures.saturating_add(1);
        let ceiling = self.initial.saturating_mul(1 << doublings).min(self.cap);
        let half = ceiling / 2;
        // A uniform fraction of the other half, from the top 53 bits of the PRNG.
        let fraction = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        half + (ceiling - half).mul_f64(fraction)
    }

    /// Forgets the failures: the next failure starts from the initial delay again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures recorded since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// splitmix64 (Steele, Lea, Flood 2014): tiny, and every seed gives a good sequence.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn delays_double_within_their_jitter_band_up_to_the_cap() {
        for seed in 0..200 {
            let mut backoff = Backoff::with_limits(ms(50), ms(2_000), seed);
            let ceilings = [50, 100, 200, 400, 800, 1_600, 2_000, 2_000, 2_000, 2_000];
            for (n, ceiling) in ceilings.into_iter().enumerate() {
                let delay = backoff.next_delay();
                assert!(
                    delay >= ms(ceiling) / 2 && delay <= ms(ceiling),
                    "seed {seed}, failure {}: {delay:?} outside [{}/2, {ceiling}] ms",
                    n + 1,
                    ceiling
                );
            }
            assert_eq!(backoff.failures(), 10);
        }
    }

    #[test]
    fn the_default_policy_starts_at_the_initial_delay_and_stays_under_the_cap() {
        let mut backoff = Backoff::new(7);
        let first = backoff.next_delay();
        assert!(
            first >= BACKOFF_INITIAL / 2 && first <= BACKOFF_INITIAL,
            "{first:?}"
        );
        let mut ceiling = BACKOFF_INITIAL;
        while ceiling < BACKOFF_CAP {
            ceiling = (ceiling * 2).min(BACKOFF_CAP);
            let delay = backoff.next_delay();
            assert!(
                delay <= ceiling && delay >= ceiling / 2,
                "{delay:?} vs {ceiling:?}"
            );
        }
        for _ in 0..100 {
            let delay = backoff.next_delay();
            assert!(
                delay <= BACKOFF_CAP && delay >= BACKOFF_CAP / 2,
                "{delay:?}"
            );
        }
    }

    #[test]
    fn a_reset_starts_over_from_the_initial_delay() {
        let mut backoff = Backoff::with_limits(ms(50), ms(2_000), 1);
        for _ in 0..8 {
            backoff.next_delay();
        }
        backoff.reset();
        assert_eq!(backoff.failures(), 0);
        let delay = backoff.next_delay();
        assert!(delay >= ms(25) && delay <= ms(50), "{delay:?}");
    }

    #[test]
    fn one_seed_gives_one_sequence_and_seeds_differ() {
        let run = |seed| {
            let mut backoff = Backoff::with_limits(ms(50), ms(2_000), seed);
            (0..10).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn the_jitter_spreads_over_the_band() {
        // At the cap the delay is in [cap/2, cap]; over many draws both quarters of the band
        // are hit, so two nodes retrying one peer do not do so in lockstep.
        let mut backoff = Backoff::with_limits(ms(1_000), ms(1_000), 3);
        let draws: Vec<_> = (0..1_000).map(|_| backoff.next_delay()).collect();
        assert!(draws.iter().any(|d| *d < ms(625)));
        assert!(draws.iter().any(|d| *d > ms(875)));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut backoff = Backoff::with_limits(ms(50), ms(2_000), 9);
        for _ in 0..10_000 {
            assert!(backoff.next_delay() <= ms(2_000));
        }
    }

    #[test]
    #[should_panic(expected = "must be non-zero")]
    fn a_zero_initial_delay_is_refused() {
        Backoff::with_limits(Duration::ZERO, ms(10), 0);
    }
}
