//! The worker sweep (`--sweep-workers`): W1 (random keys out of 100,000) at each of a list of
//! worker counts, for each lockd client style and for etcd, so the report can plot throughput
//! against workers. Owns the sweep's plan and its JSON shape; the loop is `workload`'s.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::system::LockSystem;
use crate::workload::{self, Keys, LoopResult, LoopSpec};

/// The worker counts `--sweep-workers` runs when given no list: one worker, a few, W2's and
/// W1's counts.
pub const DEFAULT_WORKERS: &[usize] = &[1, 4, 16, 32];
/// Most worker counts one sweep takes.
pub const POINTS_MAX: usize = 16;
/// Most workers one point may have.
pub const WORKERS_MAX: usize = 256;
/// Measured window of each point, in seconds, unless `--sweep-secs` says otherwise.
pub const SECS_DEFAULT: f64 = 5.0;
/// The same with `--quick`.
pub const SECS_QUICK: f64 = 1.0;

/// What the sweep runs: each of `workers` for `secs` after `warmup_secs`.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPlan {
    /// Worker counts, in the order run.
    pub workers: Vec<usize>,
    /// Measured window of each point, in seconds.
    pub secs: f64,
    /// Unmeasured warm-up before each point, in seconds.
    pub warmup_secs: f64,
}

impl SweepPlan {
    /// Checks `workers` (`--sweep-workers`; empty means [`DEFAULT_WORKERS`]): 1 to
    /// [`POINTS_MAX`] counts, each 1 to [`WORKERS_MAX`], none twice.
    pub fn new(workers: &[usize], secs: f64, warmup_secs: f64) -> Result<Self> {
        let workers = if workers.is_empty() {
            DEFAULT_WORKERS.to_vec()
        } else {
            workers.to_vec()
        };
        if workers.len() > POINTS_MAX {
            bail!(
                "--sweep-workers: {} worker counts, at most {POINTS_MAX}",
                workers.len()
            );
        }
        if let Some(bad) = workers.iter().find(|&&w| w == 0 || w > WORKERS_MAX) {
            bail!("--sweep-workers: {bad} workers; each count must be 1 to {WORKERS_MAX}");
        }
        if let Some(twice) = workers
            .iter()
            .enumerate()
            .find_map(|(i, w)| workers[..i].contains(w).then_some(w))
        {
            bail!("--sweep-workers: {twice} workers given twice");
        }
        if !(secs.is_finite() && secs > 0.0) {
            bail!("--sweep-secs: {secs} is not a positive number of seconds");
        }
        Ok(Self {
            workers,
            secs,
            warmup_secs,
        })
    }

    /// The loop of the point with `workers` workers.
    fn spec(&self, workers: usize) -> LoopSpec {
        LoopSpec {
            name: "sweep",
            workers,
            keys: Keys::Random {
                count: workload::W1_KEYS,
            },
            warmup: Duration::from_secs_f64(self.warmup_secs.max(0.0)),
            measure: Duration::from_secs_f64(self.secs),
        }
    }
}

/// One system's (and for lockd one client style's) sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SweepSeries {
    /// The series' name in the plot: "etcd", or the lockd client style's label.
    pub label: String,
    /// One point per worker count, in the order run.
    pub points: Vec<SweepPoint>,
}

/// W1 at one worker count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SweepPoint {
    /// Concurrent workers.
    pub workers: usize,
    /// Pairs completed per second in the measured window.
    pub pairs_per_sec: f64,
    /// Acquire latency p50, in milliseconds.
    pub acquire_p50_ms: Option<f64>,
    /// Acquire latency p99, in milliseconds.
    pub acquire_p99_ms: Option<f64>,
    /// Server CPU per pair, in milliseconds (three nodes).
    pub server_cpu_ms_per_pair: Option<f64>,
    /// Failed operations.
    pub errors: u64,
}

impl SweepPoint {
    fn of(result: &LoopResult) -> Self {
        Self {
            workers: result.workers,
            pairs_per_sec: result.pairs_per_sec,
            acquire_p50_ms: result.acquire.p50_ms,
            acquire_p99_ms: result.acquire.p99_ms,
            server_cpu_ms_per_pair: result.server_cpu_ms_per_pair,
            errors: result.errors,
        }
    }
}

/// Runs the point of `workers` workers of `plan` against `system`.
pub async fn point<S: LockSystem>(
    system: &S,
    plan: &SweepPlan,
    workers: usize,
) -> Result<SweepPoint> {
    let result = workload::run_loop(system, &plan.spec(workers))
        .await
        .with_context(|| format!("sweep: W1 with {workers} workers"))?;
    Ok(SweepPoint::of(&result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_is_the_default_set_and_bad_lists_are_named() {
        let plan = SweepPlan::new(&[], 5.0, 2.0).expect("the default set");
        assert_eq!(plan.workers, DEFAULT_WORKERS);
        assert_eq!(plan.spec(4).workers, 4);
        let error = |workers: &[usize], secs| {
            SweepPlan::new(workers, secs, 0.0)
                .expect_err("refused")
                .to_string()
        };
        assert!(error(&[0], 1.0).contains("0 workers"));
        assert!(error(&[300], 1.0).contains("300 workers"));
        assert!(error(&[4, 8, 4], 1.0).contains("4 workers given twice"));
        assert!(error(&[1; 17], 1.0).contains("at most 16"));
        assert!(error(&[1], 0.0).contains("--sweep-secs"));
        assert!(error(&[1], f64::NAN).contains("--sweep-secs"));
    }
}
