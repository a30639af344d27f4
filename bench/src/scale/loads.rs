//! W5's load figures at a checkpoint: W1 (32 workers, random keys) and W3 (one worker, fresh
//! keys) of the comparison table, run by the same workload code on short windows, on keys
//! (`bench/w1/…`, `bench/w3/…`) disjoint from the held ones (`w5/held/…`).

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::cluster::Cluster;
use crate::workload::{self, Keys, LoopResult, LoopSpec};

/// Unmeasured warm-up of each load.
const WARMUP: Duration = Duration::from_millis(500);

/// W1 and W3 at one checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Loads {
    /// W1 uncontended.
    pub w1: LoopResult,
    /// W3 one client.
    pub w3: LoopResult,
}

/// W1's spec with a `secs` window.
pub fn w1_spec(secs: f64) -> LoopSpec {
    LoopSpec {
        name: "w1",
        workers: workload::W1_WORKERS,
        keys: Keys::Random {
            count: workload::W1_KEYS,
        },
        warmup: WARMUP,
        measure: Duration::from_secs_f64(secs),
    }
}

/// Runs W3 then W1, each over `secs`.
pub async fn measure(cluster: &Cluster, secs: f64) -> Result<Loads> {
    let w3 = LoopSpec {
        name: "w3",
        workers: 1,
        keys: Keys::Fresh,
        warmup: WARMUP,
        measure: Duration::from_secs_f64(secs),
    };
    let w3 = workload::run_loop(&cluster.lockd, &w3)
        .await
        .context("W3")?;
    let w1 = workload::run_loop(&cluster.lockd, &w1_spec(secs))
        .await
        .context("W1")?;
    Ok(Loads { w1, w3 })
}
