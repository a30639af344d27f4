//! The Raft families and `/readyz` of a Raft node, from openraft's own metrics: term, role,
//! commit, applied and purged index, and on the leader each peer's reachability and
//! replication lag, read at each scrape; leader changes counted by a task that watches the
//! server metrics.
//!
//! Owns reading openraft's metrics only; changes nothing in Raft. The readiness rule is
//! docs/METRICS.md's: a leader heard from within an election timeout, and the applied index
//! within [`APPLY_LAG_READY_MAX`] entries of the commit index.

use std::sync::Arc;
use std::time::Duration;

use lock_raft_store::Raft;
use openraft::Instant as _;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use super::families::{Families, PeerLabels};

/// Most committed entries a ready node may still have to apply. A node further behind (one
/// catching up after a restart, or installing a snapshot) answers reads from an old state and
/// would make its waiting acquires slow, so a load balancer should skip it for now.
pub const APPLY_LAG_READY_MAX: u64 = 1_000;

/// Reads one Raft node's metrics into the families, and answers whether it is ready.
#[derive(Clone)]
pub struct RaftProbe {
    raft: Raft,
    node_id: u64,
    /// How recently a leader must have been heard from (the election timeout's upper bound:
    /// a follower that heard nothing for that long starts an election).
    election_timeout: Duration,
}

impl std::fmt::Debug for RaftProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftProbe")
            .field("node_id", &self.node_id)
            .field("election_timeout", &self.election_timeout)
            .finish_non_exhaustive()
    }
}

impl RaftProbe {
    /// Reads `raft`, node `node_id`, whose election timeout is at most `election_timeout`.
    pub fn new(raft: Raft, node_id: u64, election_timeout: Duration) -> Self {
        Self {
            raft,
            node_id,
            election_timeout,
        }
    }

    /// Sets the Raft gauges from openraft's current metrics.
    pub fn refresh(&self, f: &Families) {
        let watch = self.raft.metrics();
        let m = watch.borrow_watched();
        f.raft_term.set(gauge(m.current_term));
        f.raft_is_leader
            .set(i64::from(m.state == ServerState::Leader));
        f.raft_commit_index
            .set(gauge(m.local_committed.map_or(0, |l| l.index)));
        f.raft_applied_index
            .set(gauge(m.last_applied.map_or(0, |l| l.index)));
        f.raft_purged_index
            .set(gauge(m.purged.map_or(0, |l| l.index)));
        match (&m.replication, &m.heartbeat) {
            (Some(replication), Some(heartbeat)) if m.state == ServerState::Leader => {
                let last = m.last_log_index.unwrap_or(0);
                for (peer, matched) in replication {
                    if *peer == self.node_id {
                        continue;
                    }
                    let labels = PeerLabels { peer: *peer };
                    let lag = last.saturating_sub(matched.map_or(0, |l| l.index));
                    f.raft_replication_lag
                        .get_or_create(&labels)
                        .set(gauge(lag));
                    let reachable = heartbeat
                        .get(peer)
                        .and_then(Option::as_ref)
                        .is_some_and(|acked| acked.elapsed() < self.election_timeout);
                    f.raft_peer_reachable
                        .get_or_create(&labels)
                        .set(i64::from(reachable));
                }
            }
            // Only the leader knows its peers' progress: a follower exports no peer sample
            // rather than a stale one from the time it led.
            _ => {
                f.raft_replication_lag.clear();
                f.raft_peer_reachable.clear();
            }
        }
    }

    /// `Ok` when this node is ready to serve (see the module doc), else why not.
    pub async fn ready(&self) -> Result<(), String> {
        let (state, leader, committed_vote, quorum_acked, commit, applied) = {
            let watch = self.raft.metrics();
            let m = watch.borrow_watched();
            (
                m.state,
                m.current_leader,
                m.vote.committed,
                m.last_quorum_acked.as_ref().map(|t| t.elapsed()),
                m.local_committed.map_or(0, |l| l.index),
                m.last_applied.map_or(0, |l| l.index),
            )
        };
        let behind = commit.saturating_sub(applied);
        if behind > APPLY_LAG_READY_MAX {
            return Err(format!(
                "applied index {applied} is {behind} entries behind the commit index {commit} \
                 (at most {APPLY_LAG_READY_MAX})"
            ));
        }
        let timeout = self.election_timeout;
        if state == ServerState::Leader {
            return match quorum_acked {
                Some(ago) if ago < timeout => Ok(()),
                Some(ago) => Err(format!(
                    "leader, but no quorum acknowledged it for {ago:?} (election timeout {timeout:?})"
                )),
                None => Err("leader, not yet acknowledged by a quorum".to_owned()),
            };
        }
        let Some(leader) = leader.filter(|_| committed_vote) else {
            return Err(format!("{state:?} and knows no leader"));
        };
        // A follower's vote is touched by every append and heartbeat of the leader it follows;
        // a node cut off keeps its vote (pre-vote does not change it) but not the touch.
        let heard = self
            .raft
            .with_raft_state(|st| st.vote_last_modified())
            .await
            .map_err(|e| format!("raft is stopped: {e}"))?;
        match heard.map(|t| t.elapsed()) {
            Some(ago) if ago < timeout => Ok(()),
            Some(ago) => Err(format!(
                "last heard from leader {leader} {ago:?} ago (election timeout {timeout:?})"
            )),
            None => Err(format!("never heard from leader {leader}")),
        }
    }
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Counts `lockd_raft_leader_changes_total`: each time this node knows a leader for a term it
/// had not counted a leader for. Watches the server metrics, which change with the vote, the
/// role and the leader only (not with every apply). Ends when Raft stops.
pub async fn count_leader_changes(raft: Raft, families: Arc<Families>) {
    let mut server = raft.server_metrics();
    let mut counted: Option<(u64, u64)> = None;
    loop {
        let seen = {
            let m = server.borrow_watched();
            m.current_leader
                .map(|leader| (m.vote.leader_id.term, leader))
        };
        if let Some(seen) = seen
            && counted != Some(seen)
        {
            families.raft_leader_changes.inc();
            counted = Some(seen);
        }
        if server.changed().await.is_err() {
            return;
        }
    }
}
