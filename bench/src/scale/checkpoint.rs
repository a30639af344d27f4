//! One W5 checkpoint: with `held` locks held and the fill paused, let the nodes settle
//! (applied up to commit, no snapshot being written), then measure every node's memory, the
//! idle CPU, each node's Raft and snapshot figures, and W1 and W3 on disjoint keys.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::cluster::Cluster;
use super::fill::FillStretch;
use super::idle_cpu::{self, IdleCpu};
use super::loads::{self, Loads};
use super::memory::{self, NodeMemory};
use super::metrics::NodeMetrics;
use super::procfs;
use super::snapshots::{self, SnapshotFile};

/// Longest wait for the nodes to settle before a checkpoint's measurements.
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// Shortest settle: the last calls' effects (batched applies, allocator) die down.
const SETTLE_MIN: Duration = Duration::from_secs(1);
/// Pause between two settle polls.
const SETTLE_POLL: Duration = Duration::from_millis(100);

/// What a checkpoint measured.
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    /// Locks held.
    pub held: usize,
    /// The machine's load average when the checkpoint began.
    pub load_average: String,
    /// The fill's stretch that led here (none for the first checkpoint).
    pub fill: Option<FillStretch>,
    /// Seconds waited for the nodes to settle.
    pub settle_secs: f64,
    /// Every node's memory after the idle window.
    pub memory: Vec<NodeMemory>,
    /// CPU with no lock traffic.
    pub idle_cpu: IdleCpu,
    /// Every node's metrics and current snapshot file.
    pub nodes: Vec<NodeState>,
    /// W1 and W3; `None` with the error if they failed.
    pub loads: Option<Loads>,
    /// Why the loads failed.
    pub loads_error: Option<String>,
}

/// A node's Raft and snapshot figures.
#[derive(Debug, Clone, Serialize)]
pub struct NodeState {
    /// The node's id.
    pub node_id: u64,
    /// What its `/metrics` said (`None` if it did not answer).
    pub metrics: Option<NodeMetrics>,
    /// Its newest snapshot file.
    pub snapshot: Option<SnapshotFile>,
    /// Bytes of its whole data dir (log, snapshot, identity).
    pub data_dir_bytes: u64,
}

/// Every node's state now.
pub async fn node_states(cluster: &Cluster) -> Vec<NodeState> {
    let scrapes = cluster.scrape_all().await;
    cluster
        .nodes
        .iter()
        .zip(scrapes)
        .map(|(node, scrape)| NodeState {
            node_id: node.id,
            metrics: scrape.map(|s| s.view()),
            snapshot: snapshots::current(&node.data_dir),
            data_dir_bytes: snapshots::bytes_under(&node.data_dir),
        })
        .collect()
}

/// Waits until every running node has applied its commit index and no snapshot file is
/// being written, at least [`SETTLE_MIN`] and at most [`SETTLE_MAX`]; answers the wait.
async fn settle(cluster: &Cluster) -> f64 {
    let started = Instant::now();
    tokio::time::sleep(SETTLE_MIN).await;
    while started.elapsed() < SETTLE_MAX {
        let mut settled = true;
        for (index, node) in cluster.nodes.iter().enumerate() {
            if cluster.pid(index).is_none() {
                continue;
            }
            let writing = std::fs::read_dir(snapshots::dir_of(&node.data_dir)).is_ok_and(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            });
            let applied = match cluster.scrape(index).await {
                Ok(s) => {
                    let v = s.view();
                    v.applied_index.is_some() && v.applied_index >= v.commit_index
                }
                Err(_) => false,
            };
            settled &= applied && !writing;
        }
        if settled {
            break;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
    started.elapsed().as_secs_f64()
}

/// Longest wait for a leader before a checkpoint.
const LEADER_WAIT: Duration = Duration::from_secs(60);

/// Measures a checkpoint with `held` locks held; `fill` is the stretch that led here. First
/// finds the leader (it may have moved during the fill) and points the workloads at it.
pub async fn measure(
    cluster: &mut Cluster,
    held: usize,
    fill: Option<FillStretch>,
    idle_window: Duration,
    load_secs: f64,
) -> Checkpoint {
    let load_average = procfs::load_average();
    let leader_error = cluster
        .await_leader(None, LEADER_WAIT)
        .await
        .err()
        .map(|e| format!("{e:#}"));
    let settle_secs = settle(cluster).await;
    let idle_cpu = idle_cpu::measure(cluster, idle_window).await;
    let memory = memory::measure(cluster);
    let nodes = node_states(cluster).await;
    let (loads, loads_error) = match leader_error {
        Some(e) => (None, Some(e)),
        None => match loads::measure(cluster, load_secs).await {
            Ok(loads) => (Some(loads), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
    };
    Checkpoint {
        held,
        load_average,
        fill,
        settle_secs,
        memory,
        idle_cpu,
        nodes,
        loads,
        loads_error,
    }
}
