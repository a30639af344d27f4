//! Latency samples, their percentiles and their log-spaced histogram (what the latency CDF
//! plots are drawn from). Owns only arithmetic on recorded durations; never reads a clock
//! itself.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Each histogram bucket's upper bound is this many times its lower bound: 1 % wide, finer
/// than any difference a CDF plot shows.
pub const HISTOGRAM_GROWTH: f64 = 1.01;

/// Latency samples of one kind of operation, in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    nanos: Vec<u64>,
}

impl Samples {
    /// An empty set with room for `capacity` samples.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            nanos: Vec::with_capacity(capacity),
        }
    }

    /// Records one latency.
    pub fn push(&mut self, latency: Duration) {
        self.nanos
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: Samples) {
        self.nanos.extend(other.nanos);
    }

    /// The samples in log-spaced buckets ([`Histogram`]).
    pub fn histogram(&self) -> Histogram {
        Histogram::of(&self.nanos)
    }

    /// Sorts the samples and summarises them.
    pub fn summary(mut self) -> Summary {
        self.nanos.sort_unstable();
        let ms = |q: f64| percentile(&self.nanos, q).map(|ns| ns as f64 / 1e6);
        Summary {
            count: self.nanos.len() as u64,
            p50_ms: ms(0.50),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: self.nanos.last().map(|&ns| ns as f64 / 1e6),
        }
    }
}

/// The nearest-rank percentile `q` (0 < q ≤ 1) of sorted samples; `None` when empty.
fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Percentiles of one operation's latency, in milliseconds; `None` when nothing was recorded.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Summary {
    /// How many samples.
    pub count: u64,
    /// Median.
    pub p50_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// 99.9th percentile.
    pub p999_ms: Option<f64>,
    /// Slowest sample.
    pub max_ms: Option<f64>,
}

/// Latency samples in buckets [G^i, G^(i+1)) nanoseconds with G = [`HISTOGRAM_GROWTH`]:
/// enough to draw a CDF at 1 % resolution from a few hundred numbers instead of every sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    /// The ratio of each bucket's upper bound to its lower bound.
    pub growth: f64,
    /// The buckets that hold a sample, by increasing bound.
    pub buckets: Vec<Bucket>,
}

/// One [`Histogram`] bucket.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    /// The bucket's upper bound, in milliseconds: every sample in it is below this and at or
    /// above `upper_ms / growth`.
    pub upper_ms: f64,
    /// Samples in the bucket.
    pub count: u64,
}

impl Histogram {
    /// Buckets `nanos` (in any order; a zero counts as 1 ns).
    fn of(nanos: &[u64]) -> Self {
        let ln_growth = HISTOGRAM_GROWTH.ln();
        let mut counts = std::collections::BTreeMap::<u32, u64>::new();
        for &ns in nanos {
            // ln(u64::MAX) / ln(1.01) is about 4,460, so the index fits a u32.
            let index = ((ns.max(1) as f64).ln() / ln_growth).floor() as u32;
            *counts.entry(index).or_default() += 1;
        }
        Histogram {
            growth: HISTOGRAM_GROWTH,
            buckets: counts
                .into_iter()
                .map(|(index, count)| Bucket {
                    upper_ms: HISTOGRAM_GROWTH.powf(f64::from(index) + 1.0) / 1e6,
                    count,
                })
                .collect(),
        }
    }

    /// Samples in every bucket together.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.count).sum()
    }

    /// The cumulative distribution: for each bucket, (its upper bound in ms, the share of
    /// samples at or below it), rising to 1. Empty for an empty histogram.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let total = self.count();
        if total == 0 {
            return Vec::new();
        }
        let mut seen = 0;
        self.buckets
            .iter()
            .map(|b| {
                seen += b.count;
                (b.upper_ms, seen as f64 / total as f64)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples = Samples::default();
        for ms in 1..=1000u64 {
            samples.push(Duration::from_millis(ms));
        }
        let summary = samples.summary();
        assert_eq!(summary.count, 1000);
        assert_eq!(summary.p50_ms, Some(500.0));
        assert_eq!(summary.p99_ms, Some(990.0));
        assert_eq!(summary.p999_ms, Some(999.0));
        assert_eq!(summary.max_ms, Some(1000.0));
    }

    #[test]
    fn empty_has_no_percentiles() {
        let summary = Samples::default().summary();
        assert_eq!(summary.count, 0);
        assert_eq!(summary.p50_ms, None);
    }

    #[test]
    fn histogram_buckets_are_one_percent_wide_and_its_cdf_rises_to_one() {
        let mut samples = Samples::default();
        for ns in [100_000u64, 100_000, 100_500, 500_000, 2_000_000] {
            samples.push(Duration::from_nanos(ns));
        }
        samples.push(Duration::ZERO);
        let histogram = samples.histogram();
        assert_eq!(histogram.count(), 6);
        // 100 µs twice and 100.5 µs fall in one 1 % bucket; 0 counts as 1 ns.
        let counts: Vec<u64> = histogram.buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![1, 3, 1, 1]);
        let hundred = histogram.buckets[1];
        assert!(hundred.upper_ms > 0.1005 && hundred.upper_ms / HISTOGRAM_GROWTH <= 0.1);
        let cdf = histogram.cdf();
        assert_eq!(cdf.len(), 4);
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(cdf.last().map(|p| p.1), Some(1.0));
        assert!((cdf[1].1 - 4.0 / 6.0).abs() < 1e-12);
        assert!(Samples::default().histogram().cdf().is_empty());
    }
}
