//! Status, initialisation and membership on the Raft backend, straight from and to openraft.
//!
//! Owns reading this node's Raft metrics as the seam's [`NodeStatus`] and mapping openraft's
//! admin errors to `LockError`s. Membership changes need the leader; elsewhere they answer
//! `NotLeader` like every other call.

use std::collections::{BTreeMap, BTreeSet};

use lock_api::LockError;
use lock_raft_store::TypeConfig;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ServerState};

use super::RaftBackend;
use crate::backend::{Member, NodeStatus, Role};
use crate::leader::proposer::not_leader;

fn write_error(err: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> LockError {
    match err {
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(f) | ClientWriteError::LogEntryDiscarded(f),
        ) => not_leader(f),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            LockError::invalid(format!("membership change refused: {e}"))
        }
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
            LockError::contention(format!("write refused: {e}"))
        }
        RaftError::Fatal(f) => LockError::contention(format!("raft is stopped: {f}")),
    }
}

/// openraft's server state as the seam's role.
fn role(state: ServerState) -> Role {
    match state {
        ServerState::Leader => Role::Leader,
        ServerState::Candidate => Role::Candidate,
        ServerState::Follower => Role::Follower,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Shutdown,
    }
}

impl RaftBackend {
    /// This node's view of the cluster from its Raft metrics.
    pub(super) fn node_status(&self) -> NodeStatus {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| Member {
                node_id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_addr = m
            .current_leader
            .and_then(|id| membership.get_node(&id).map(|n| n.addr.clone()))
            .unwrap_or_default();
        NodeStatus {
            node_id: m.id,
            role: role(m.state),
            current_term: m.current_term,
            leader_id: m.current_leader,
            leader_addr,
            // What this node knows to be committed (openraft's local committed log id; the
            // applied index trails it).
            commit_index: m.local_committed.map_or(0, |id| id.index),
            applied_index: m.last_applied.map_or(0, |id| id.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            members,
            initialized: m.membership_config.log_id().is_some(),
        }
    }

    /// Initialises the cluster with `members` as voters; they must include this node.
    pub(super) async fn initialize(&self, members: BTreeMap<u64, String>) -> Result<(), LockError> {
        let members: BTreeMap<u64, BasicNode> = members
            .into_iter()
            .map(|(id, addr)| (id, BasicNode { addr }))
            .collect();
        if !members.contains_key(&self.node_id()) {
            return Err(LockError::invalid(format!(
                "members must include the node that receives Init (node {})",
                self.node_id()
            )));
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                Err(LockError::invalid(format!("already initialised: {e}")))
            }
            Err(RaftError::APIError(InitializeError::NotInMembers(e))) => {
                Err(LockError::invalid(e.to_string()))
            }
            Err(RaftError::Fatal(f)) => Err(LockError::contention(format!("raft is stopped: {f}"))),
        }
    }

    /// Adds a learner on the leader, waiting until it has caught up.
    pub(super) async fn learner(&self, node_id: u64, addr: String) -> Result<(), LockError> {
        self.leader_check()?;
        self.inner
            .raft
            .add_learner(node_id, BasicNode { addr }, true)
            .await
            .map_err(write_error)?;
        Ok(())
    }

    /// Changes the voters on the leader.
    pub(super) async fn membership(
        &self,
        voters: BTreeSet<u64>,
        retain: bool,
    ) -> Result<(), LockError> {
        if voters.is_empty() {
            return Err(LockError::invalid("voter_ids must not be empty"));
        }
        self.leader_check()?;
        self.inner
            .raft
            .change_membership(voters, retain)
            .await
            .map_err(write_error)?;
        Ok(())
    }
}
