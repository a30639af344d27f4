//! The one place for seam → proto conversions of the node's gRPC services.
//!
//! Owns field mapping only: no validation (the backend validates), no error mapping (that is
//! `lock_proto::error`), no IO. Every backend's answers pass through here, so a field means
//! the same on the Raft node and on a stateless one.

use lock_proto::v1;

use crate::backend::{AuditRecord, Grant, KeyState, NodeStatus, Revocation, Role};

/// A grant as the wire carries it. `server_expiry_unix_ms` is the grant's expiry on the
/// backend's clock: informational only (C2 D3).
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
        key: state.key,
        owner_id: state.owner_id,
        session_id: state.session_id,
        fencing_token: state.token,
        acquired_at_unix_ms: state.acquired_at_ms,
        expires_at_unix_ms: state.expires_at_ms,
        waiter_count: state.waiter_count,
    }
}

/// A force-revoke's outcome (empty owner and 0 token when the key was not held, as the proto
/// documents).
pub fn outcome(revocation: Revocation) -> v1::LockOutcome {
    v1::LockOutcome {
        key: revocation.key,
        revoked: revocation.previous_token.is_some(),
        previous_owner_id: revocation.previous_owner_id.unwrap_or_default(),
        previous_token: revocation.previous_token.unwrap_or(0),
        new_token_floor: revocation.new_token_floor,
    }
}

/// An audit log record as `ListRevocations` answers it (the previous owner and token absent
/// when the key was free).
pub fn audit_record(record: AuditRecord) -> v1::RevocationRecord {
    v1::RevocationRecord {
        key: record.key,
        operator: record.operator,
        reason: record.reason,
        previous_owner_id: record.previous_owner_id,
        previous_token: record.previous_token,
        new_token_floor: record.new_token_floor,
        revoked_at_unix_ms: record.revoked_at_ms,
        request_id: record.request_id,
    }
}

/// The seam's role as the admin role.
pub fn role(role: Role) -> v1::Role {
    match role {
        Role::Leader => v1::Role::Leader,
        Role::Candidate => v1::Role::Candidate,
        Role::Follower => v1::Role::Follower,
        Role::Learner => v1::Role::Learner,
        Role::Shutdown => v1::Role::Shutdown,
    }
}

/// A node's view of its cluster; `cluster_id` is answered once the cluster is initialised.
pub fn status(s: NodeStatus, cluster_id: &str) -> v1::StatusResponse {
    v1::StatusResponse {
        node_id: s.node_id,
        role: role(s.role) as i32,
        current_term: s.current_term,
        leader_id: s.leader_id,
        leader_addr: s.leader_addr,
        commit_index: s.commit_index,
        applied_index: s.applied_index,
        last_log_index: s.last_log_index,
        members: s
            .members
            .into_iter()
            .map(|m| v1::Member {
                node_id: m.node_id,
                addr: m.addr,
                voter: m.voter,
            })
            .collect(),
        cluster_id: if s.initialized {
            cluster_id.to_owned()
        } else {
            String::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Member;

    #[test]
    fn an_unheld_revoke_has_empty_owner_and_zero_token() {
        let out = outcome(Revocation {
            key: "k".into(),
            previous_owner_id: None,
            previous_token: None,
            new_token_floor: 9,
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
            token: 11,
            ttl_ms: 1_500,
            expires_at_ms: 1_510,
        });
        assert_eq!(g.fencing_token, 11);
        assert_eq!(g.server_expiry_unix_ms, 1_510);
        assert_eq!(g.ttl_ms, 1_500);
    }

    #[test]
    fn inspect_carries_the_holders_session_and_the_queue() {
        let info = lock_info(KeyState {
            key: "k".into(),
            owner_id: "o".into(),
            session_id: "s-1".into(),
            token: 3,
            acquired_at_ms: 1_000,
            expires_at_ms: 2_000,
            waiter_count: 2,
        });
        assert_eq!(info.session_id, "s-1");
        assert_eq!(info.waiter_count, 2);
        assert_eq!(info.acquired_at_unix_ms, 1_000);
        assert_eq!(info.expires_at_unix_ms, 2_000);
    }

    #[test]
    fn an_uninitialised_cluster_has_no_cluster_id() {
        let mut s = NodeStatus {
            node_id: 1,
            role: Role::Follower,
            current_term: 0,
            leader_id: None,
            leader_addr: String::new(),
            commit_index: 0,
            applied_index: 0,
            last_log_index: 0,
            members: vec![Member {
                node_id: 1,
                addr: "a:1".into(),
                voter: true,
            }],
            initialized: false,
        };
        assert_eq!(status(s.clone(), "c").cluster_id, "");
        s.initialized = true;
        let out = status(s, "c");
        assert_eq!(out.cluster_id, "c");
        assert_eq!(out.role, v1::Role::Follower as i32);
        assert_eq!(out.members.len(), 1);
    }
}
