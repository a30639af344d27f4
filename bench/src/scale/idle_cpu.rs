//! W5's idle CPU figure: the CPU every node uses over a window with the held locks' sessions
//! kept alive and no lock traffic, as a percentage of one core. The leader's is the one the
//! issue targets (its lease keeper's work should not grow with the number of locks).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::cluster::Cluster;
use super::procfs;

/// CPU over an idle window.
#[derive(Debug, Clone, Serialize)]
pub struct IdleCpu {
    /// The window, in seconds.
    pub secs: f64,
    /// The leader's CPU, % of one core.
    pub leader_pct: Option<f64>,
    /// Every node's, by node id: (id, % of one core).
    pub nodes_pct: Vec<(u64, Option<f64>)>,
}

/// Measures every node's CPU over `window` while nothing but keep-alives runs.
pub async fn measure(cluster: &Cluster, window: Duration) -> IdleCpu {
    let pids: Vec<Option<u32>> = (0..cluster.nodes.len()).map(|i| cluster.pid(i)).collect();
    let before: Vec<Option<f64>> = pids
        .iter()
        .map(|p| p.and_then(procfs::cpu_seconds))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let secs = started.elapsed().as_secs_f64();
    let nodes_pct: Vec<(u64, Option<f64>)> = cluster
        .nodes
        .iter()
        .zip(pids.iter().zip(before))
        .map(|(node, (pid, before))| {
            let after = pid.and_then(procfs::cpu_seconds);
            let pct = after
                .zip(before)
                .map(|(after, before)| (after - before) / secs * 100.0);
            (node.id, pct)
        })
        .collect();
    IdleCpu {
        secs,
        leader_pct: nodes_pct.get(cluster.leader.get()).and_then(|(_, p)| *p),
        nodes_pct,
    }
}
