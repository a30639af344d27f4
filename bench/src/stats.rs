//! Latency samples and their percentiles. Owns only arithmetic on recorded durations; never
//! reads a clock itself.

use std::time::Duration;

use serde::Serialize;

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
}
