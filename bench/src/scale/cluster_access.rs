//! What W5 (`crate::scale`) needs of a running [`LockdCluster`] beyond the workloads' seam:
//! its node processes (to read their memory and CPU, stop, kill and restart one), the TLS
//! config its connections use, and re-pointing it at a new leader after a failover, so that
//! the workloads (`crate::workload`) keep driving the cluster. A child module of `lockd` so
//! that it reads the cluster's fields without making them public; it holds no state.

use anyhow::Result;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use tonic::transport::ClientTlsConfig;

use super::{LockdCluster, channel_with};
use crate::procs::NodeProcess;

impl LockdCluster {
    /// The node processes, node `i + 1` at index `i`.
    pub fn node_processes(&self) -> &[NodeProcess] {
        &self.nodes
    }

    /// Node `index`'s process (node id `index + 1`), for stopping and restarting it.
    pub fn node_process_mut(&mut self, index: usize) -> Option<&mut NodeProcess> {
        self.nodes.get_mut(index)
    }

    /// The TLS config every connection to the nodes uses; `None` when they run `--insecure`.
    pub fn client_tls(&self) -> Option<&ClientTlsConfig> {
        self.tls.as_ref()
    }

    /// Points the workloads and the admin client at `leader_addr` (after a failover). A
    /// shared connection (`Connections::Shared`) is not re-pointed: W5 runs per-worker ones.
    pub async fn set_leader(&mut self, leader_addr: &str) -> Result<()> {
        self.admin = AdminServiceClient::new(channel_with(leader_addr, self.tls.as_ref()).await?);
        leader_addr.clone_into(&mut self.leader_addr);
        Ok(())
    }
}
