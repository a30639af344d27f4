//! W5's memory figure: every node's resident memory now and at its peak (`VmRSS`, `VmHWM`).

use serde::Serialize;

use super::cluster::Cluster;
use super::procfs::{self, Memory};

/// One node's memory at a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct NodeMemory {
    /// The node's id.
    pub node_id: u64,
    /// Whether it led at the time.
    pub leader: bool,
    /// Its memory; `None` if the process was not running.
    pub memory: Option<Memory>,
}

/// Every node's memory now.
pub fn measure(cluster: &Cluster) -> Vec<NodeMemory> {
    let leader = cluster.leader.get();
    cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| NodeMemory {
            node_id: node.id,
            leader: index == leader,
            memory: cluster.pid(index).and_then(procfs::memory),
        })
        .collect()
}
