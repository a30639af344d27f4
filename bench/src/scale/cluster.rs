//! W5's view of the three-node cluster it measures: each node's id, client and metrics
//! addresses, data dir and process, which node leads, lazy connections to any node, and the
//! leader's hint-following. Wraps the [`LockdCluster`] lock-bench already starts (so W1 and W3
//! run through the same workers as the comparison table); measures nothing itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::{Role, StatusRequest};
use tonic::transport::{Channel, ClientTlsConfig};

use super::metrics::{self, Scrape};
use crate::lockd::LockdCluster;

/// Pause between two polls while waiting for a leader.
const POLL: Duration = Duration::from_millis(20);

/// One node of the cluster as W5 sees it.
#[derive(Debug, Clone)]
pub struct Node {
    /// Raft node id (index + 1).
    pub id: u64,
    /// Client (gRPC) address, `host:port`.
    pub addr: String,
    /// Metrics address, `host:port`.
    pub metrics: String,
    /// The node's `--data-dir`.
    pub data_dir: PathBuf,
}

/// The leader as every W5 client currently believes it to be: an index into the nodes.
#[derive(Debug, Default)]
pub struct LeaderCell(AtomicUsize);

impl LeaderCell {
    /// The index of the node believed to lead.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Believes node `index` leads.
    pub fn set(&self, index: usize) {
        self.0.store(index, Ordering::Relaxed);
    }
}

/// The running cluster W5 measures.
#[derive(Debug)]
pub struct Cluster {
    /// The cluster lock-bench started; the workloads run on it.
    pub lockd: LockdCluster,
    /// Node `i + 1` at index `i`.
    pub nodes: Vec<Node>,
    /// Which node leads, as last seen.
    pub leader: Arc<LeaderCell>,
    tls: Option<ClientTlsConfig>,
}

impl Cluster {
    /// Wraps a started cluster whose nodes keep their data in `<data_dir>/lockd-<id>`: asks
    /// its leader for every member's address.
    pub async fn new(lockd: LockdCluster, data_dir: &Path) -> Result<Self> {
        let tls = lockd.client_tls().cloned();
        let leader_addr = lockd.leader_addr().to_owned();
        let channel = lazy_channel(&leader_addr, tls.as_ref())?;
        let status = AdminServiceClient::new(channel)
            .status(StatusRequest {})
            .await
            .context("AdminService.Status of the leader")?
            .into_inner();
        let metrics = lockd.metrics_targets().to_vec();
        let mut nodes = Vec::new();
        for (index, metrics) in metrics.into_iter().enumerate() {
            let id = index as u64 + 1;
            let Some(member) = status.members.iter().find(|m| m.node_id == id) else {
                bail!(
                    "the leader's membership has no node {id}: {:?}",
                    status.members
                );
            };
            nodes.push(Node {
                id,
                addr: member.addr.clone(),
                metrics,
                data_dir: data_dir.join(format!("lockd-{id}")),
            });
        }
        let Some(leader) = nodes.iter().position(|n| n.addr == leader_addr) else {
            bail!("the leader {leader_addr} is not among the members {nodes:?}");
        };
        let cell = Arc::new(LeaderCell::default());
        cell.set(leader);
        Ok(Self {
            lockd,
            nodes,
            leader: cell,
            tls,
        })
    }

    /// A lazily connecting channel to node `index` (it connects on first use, so a channel to a
    /// stopped node is cheap and fails per call).
    pub fn channel(&self, index: usize) -> Result<Channel> {
        lazy_channel(&self.nodes[index].addr, self.tls.as_ref())
    }

    /// A lazily connecting channel to every node, by index.
    pub fn channels(&self) -> Result<Vec<Channel>> {
        (0..self.nodes.len()).map(|i| self.channel(i)).collect()
    }

    /// Node `index`'s process id, while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.lockd.node_processes().get(index)?.pid()
    }

    /// Node `index`'s metrics now.
    pub async fn scrape(&self, index: usize) -> Result<Scrape> {
        metrics::scrape(&self.nodes[index].metrics).await
    }

    /// Every node's metrics now (`None` for a node that does not answer).
    pub async fn scrape_all(&self) -> Vec<Option<Scrape>> {
        let mut all = Vec::with_capacity(self.nodes.len());
        for index in 0..self.nodes.len() {
            all.push(self.scrape(index).await.ok());
        }
        all
    }

    /// Waits until a node other than `excluded` reports itself leader in `Status`, answers
    /// its index and re-points the workloads at it; fails after `within`.
    pub async fn await_leader(
        &mut self,
        excluded: Option<usize>,
        within: Duration,
    ) -> Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            for index in 0..self.nodes.len() {
                if Some(index) == excluded {
                    continue;
                }
                let Ok(channel) = self.channel(index) else {
                    continue;
                };
                let status = AdminServiceClient::new(channel)
                    .status(StatusRequest {})
                    .await;
                if let Ok(status) = status
                    && status.into_inner().role == Role::Leader as i32
                {
                    self.leader.set(index);
                    let addr = self.nodes[index].addr.clone();
                    self.lockd.set_leader(&addr).await?;
                    return Ok(index);
                }
            }
            if Instant::now() > deadline {
                bail!("no node became leader within {within:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A channel to `addr` that connects on first use, Nagle off, with `tls` if given.
pub fn lazy_channel(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Channel> {
    Ok(crate::lockd::endpoint(addr, tls)?.connect_lazy())
}
