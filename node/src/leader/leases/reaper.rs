//! The reaper: while this node is the promoted leader, proposes the expiry of leases the keeper
//! says have lapsed (C2 `reapExpired`, docs/DESIGN.md D-lease).
//!
//! Owns the reap tick and the per-tick bound. Never decides a lock outcome: each expiry is a
//! command conditional on the token (`ExpireLock`) or the session (`ExpireSession`), and the
//! state machine decides. Expiry is already true at the deadline, so the reaper is liveness
//! only: it bounds how long a lapsed key stays unavailable to others.

use std::sync::Arc;
use std::time::Duration;

use lock_raft_store::{Command, Raft, Response};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use super::LeaseKeeper;
use crate::leader::proposer::Proposer;

/// Most expiries the reaper proposes per tick.
///
/// A mass expiry (a partitioned client fleet, a restarted leader with thousands of stale
/// leases) must not turn into one giant burst of log writes that starves client requests;
/// at [`REAP_TICK`] of 100 ms this still expires 2,560 leases a second.
pub const REAP_PER_TICK_MAX: usize = 256;

/// How often the reaper looks for lapsed leases. Expiry is already true at the deadline (the
/// reaper is liveness only, C2 `reapExpired`), so this only bounds how long a lapsed key stays
/// unavailable to others. A tick with nothing lapsed costs one look at the front of the
/// keeper's deadline index, so the tick can stay short at any number of leases.
pub const REAP_TICK: Duration = Duration::from_millis(100);

/// Every [`REAP_TICK`] while this node is the promoted leader, proposes the expiry of up to
/// [`REAP_PER_TICK_MAX`] lapsed leases. Returns when Raft shuts down.
pub async fn run_reaper(raft: Raft, proposer: Proposer, keeper: Arc<LeaseKeeper>) {
    let mut tick = tokio::time::interval(REAP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (state, term) = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            (m.state, m.current_term)
        };
        if state == ServerState::Shutdown {
            return;
        }
        if state != ServerState::Leader || keeper.promoted_term() != Some(term) {
            continue;
        }
        // After a promote the keeper rewrites the index entries of untouched leases in
        // bounded steps; while it says there is more, go on without waiting a tick.
        while reap_step(&proposer, &keeper, REAP_PER_TICK_MAX).await.1 {
            tokio::task::yield_now().await;
        }
    }
}

/// Proposes the expiry of up to `max` lapsed leases and waits for the answers; returns how many
/// grants and sessions the state machine expired.
pub async fn reap_once(proposer: &Proposer, keeper: &LeaseKeeper, max: usize) -> usize {
    reap_step(proposer, keeper, max).await.0
}

/// [`reap_once`], and whether the keeper stopped early with more to look at
/// ([`crate::leader::leases::Lapsed::more`]).
async fn reap_step(proposer: &Proposer, keeper: &LeaseKeeper, max: usize) -> (usize, bool) {
    let lapsed = keeper.take_lapsed(max);
    let more = lapsed.more;
    if lapsed.grants.is_empty() && lapsed.sessions.is_empty() {
        return (0, more);
    }
    let grant_expiries = lapsed.grants.into_iter().map(|(key, token)| async move {
        let answer = proposer
            .propose(Command::ExpireLock {
                key: key.clone(),
                token,
            })
            .await;
        match answer {
            Ok(Response::LockExpired { expired }) => {
                // Not expired: the grant was already gone (released, revoked, a newer token).
                keeper.forget_grant(&key, token);
                usize::from(expired)
            }
            Ok(other) => {
                tracing::warn!(key, token, ?other, "expiry answered unexpectedly");
                keeper.expiry_failed(&key, token);
                0
            }
            Err(err) => {
                tracing::debug!(key, token, %err, "expiry not applied; will retry");
                keeper.expiry_failed(&key, token);
                0
            }
        }
    });
    let session_expiries = lapsed.sessions.into_iter().map(|id| async move {
        match proposer
            .propose(Command::ExpireSession {
                session_id: id.clone(),
            })
            .await
        {
            Ok(Response::SessionClosed { .. }) => 1,
            Ok(other) => {
                tracing::warn!(
                    session_id = id,
                    ?other,
                    "session expiry answered unexpectedly"
                );
                keeper.session_expiry_failed(&id);
                0
            }
            Err(err) => {
                tracing::debug!(session_id = id, %err, "session expiry not applied; will retry");
                keeper.session_expiry_failed(&id);
                0
            }
        }
    });
    let (grants, sessions) = futures::future::join(
        futures::future::join_all(grant_expiries),
        futures::future::join_all(session_expiries),
    )
    .await;
    (
        grants.into_iter().sum::<usize>() + sessions.into_iter().sum::<usize>(),
        more,
    )
}
