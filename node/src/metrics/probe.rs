//! What the metrics endpoint reads from the node at each request: the families set at scrape
//! time (Raft gauges, the applied lock table's gauges, sizes on disk) and the readiness answer.
//! A Raft node and a stateless one (`--backend pg|etcd`) differ only here.
//!
//! Owns reading; changes nothing in the node.

use lock_raft_store::StateReader;
use tokio::sync::watch;

use super::families::Families;
use super::raft::RaftProbe;
use super::storage::StorageDir;

/// The node behind an endpoint.
#[derive(Clone, Debug)]
pub enum NodeProbe {
    /// A Raft node: its Raft metrics, its applied lock table and its storage directory.
    Raft {
        /// openraft's metrics and the readiness rule.
        raft: RaftProbe,
        /// The applied lock table.
        reader: StateReader,
        /// The storage directory, for its sizes.
        storage: StorageDir,
    },
    /// A stateless node: ready while its backend serves (its store answers).
    Stateless {
        /// The backend's serving watch (the health service's too).
        serving: watch::Receiver<bool>,
    },
}

impl NodeProbe {
    /// Sets the families read at scrape time. May block on the file system: run it off the
    /// async workers.
    pub fn refresh(&self, f: &Families) {
        match self {
            NodeProbe::Raft {
                raft,
                reader,
                storage,
            } => {
                raft.refresh(f);
                // While a snapshot install replaces the table the gauges keep their last
                // values rather than dropping to zero for its duration.
                let counts = reader.read_applied(|table| {
                    (
                        table.session_count(),
                        table.grant_count(),
                        table.waiter_total(),
                    )
                });
                if let Some((sessions, locks, waiters)) = counts {
                    f.sessions.set(sessions as i64);
                    f.locks_held.set(locks as i64);
                    f.waiters.set(waiters as i64);
                }
                storage.refresh(f);
            }
            NodeProbe::Stateless { .. } => {}
        }
    }

    /// `Ok` when the node is ready to serve, else why not.
    pub async fn ready(&self) -> Result<(), String> {
        match self {
            NodeProbe::Raft { raft, .. } => raft.ready().await,
            NodeProbe::Stateless { serving } => {
                if *serving.borrow() {
                    Ok(())
                } else {
                    Err("the backend's store does not answer".to_owned())
                }
            }
        }
    }
}
