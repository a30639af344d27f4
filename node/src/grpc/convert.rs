//! The one place for proto ↔ domain conversions of the node's gRPC services.
//!
//! Owns field mapping only: no validation (the store validates), no error mapping (that is
//! `lock_proto::error`), no IO.

use lock_proto::v1;
use lock_raft_store::{Grant, Revocation, TypeConfig};
use openraft::{RaftMetrics, ServerState};

use crate::store::raft::KeyState;

/// A grant as the wire carries it. `server_expiry_unix_ms` is the grant's expiry on the
/// leader's stamp clock: informational only (C2 D3).
pub fn grant(grant: Grant) -> v1::Grant {
    v1::Grant {
        key: grant.key,
        owner_id: grant.owner_id,
        session_id: grant.session_id,
        fencing_token: grant.token,
        ttl_ms: grant.ttl_ms,
        server_expiry_unix_ms: grant.expires_at_ms,
    }
}

/// The diagnostic view of a key.
pub fn lock_info(state: KeyState) -> v1::LockInfo {
    v1::LockInfo {
        key: state.grant.key,
        owner_id: state.grant.owner_id,
        session_id: state.grant.session_id,
        fencing_token: state.grant.token,
        acquired_at_unix_ms: state.grant.acquired_at_ms,
        expires_at_unix_ms: state.grant.expires_at_ms,
        waiter_count: state.waiter_count,
    }
}

/// A force-revoke's audit record as the caller's outcome (empty owner and 0 token when the key
/// was not held, as the proto documents).
pub fn outcome(revocation: Revocation) -> v1::LockOutcome {
    v1::LockOutcome {
        key: revocation.key,
        revoked: revocation.previous_token.is_some(),
        previous_owner_id: revocation.previous_owner_id.unwrap_or_default(),
        previous_token: revocation.previous_token.unwrap_or(0),
        new_token_floor: revocation.new_token_floor,
    }
}

/// openraft's server state as the admin role.
pub fn role(state: ServerState) -> v1::Role {
    match state {
        ServerState::Leader => v1::Role::Leader,
        ServerState::Candidate => v1::Role::Candidate,
        ServerState::Follower => v1::Role::Follower,
        ServerState::Learner => v1::Role::Learner,
        ServerState::Shutdown => v1::Role::Shutdown,
    }
}

/// A node's view of the cluster from its Raft metrics.
pub fn status(m: &RaftMetrics<TypeConfig>, cluster_id: &str) -> v1::StatusResponse {
    let membership = m.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, node)| v1::Member {
            node_id: *id,
            addr: node.addr.clone(),
            voter: voters.contains(id),
        })
        .collect();
    let leader_addr = m
        .current_leader
        .and_then(|id| membership.get_node(&id).map(|n| n.addr.clone()))
        .unwrap_or_default();
    v1::StatusResponse {
        node_id: m.id,
        role: role(m.state) as i32,
        current_term: m.current_term,
        leader_id: m.current_leader,
        leader_addr,
        // What this node knows to be committed (openraft's local committed log id; the
        // applied index trails it).
        commit_index: m.local_committed.map_or(0, |id| id.index),
        applied_index: m.last_applied.map_or(0, |id| id.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        members,
        cluster_id: if m.membership_config.log_id().is_some() {
            cluster_id.to_owned()
        } else {
            String::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unheld_revoke_has_empty_owner_and_zero_token() {
        let out = outcome(Revocation {
            key: "k".into(),
            operator: "op".into(),
            reason: "r".into(),
            previous_owner_id: None,
            previous_token: None,
            new_token_floor: 9,
            at_ms: 1,
            request_id: 0,
        });
        assert!(!out.revoked);
        assert_eq!(out.previous_owner_id, "");
        assert_eq!(out.previous_token, 0);
        assert_eq!(out.new_token_floor, 9);
    }

    #[test]
    fn a_grant_keeps_its_token_and_expiry() {
        let g = grant(Grant {
            key: "k".into(),
            owner_id: "o".into(),
            session_id: "s".into(),
            request_id: 4,
            token: 11,
            ttl_ms: 1_500,
            acquired_at_ms: 10,
            expires_at_ms: 1_510,
        });
        assert_eq!(g.fencing_token, 11);
        assert_eq!(g.server_expiry_unix_ms, 1_510);
        assert_eq!(g.ttl_ms, 1_500);
    }
}
