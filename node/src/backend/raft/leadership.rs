//! Leadership on the Raft backend: who may answer a request, and when this node serves.
//!
//! Owns the leader check (`NotLeader` naming the leader and its address from the membership),
//! lease readiness (this leader's promote has applied in its term, so its lease deadlines are
//! authoritative, D-lease), the leadership-confirmation round behind renewals, heartbeats and
//! confirmed inspects (coalesced by `crate::leader::confirm`), and the serving watch the health
//! service reports. Proposes nothing.

use std::sync::Arc;
use std::time::Duration;

use lock_api::LockError;
use lock_raft_store::Raft;
use openraft::ReadPolicy;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};
use tokio::sync::watch;

use super::RaftBackend;
use crate::clock::Clock;
use crate::leader::confirm::Confirmer;
use crate::leader::proposer::not_leader;
use crate::log_limit::{LogLimit, Note};

/// Longest one leadership confirmation round may take. A round is one heartbeat to each
/// follower; a second means the quorum is not answering, and the caller retries.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// One leadership confirmation round on `raft`.
async fn ensure_leader(raft: &Raft) -> Result<(), LockError> {
    let Ok(confirmed) = tokio::time::timeout(
        CONFIRM_TIMEOUT,
        raft.ensure_linearizable(ReadPolicy::ReadIndex),
    )
    .await
    else {
        return Err(LockError::contention(format!(
            "leadership not confirmed within {CONFIRM_TIMEOUT:?}"
        )));
    };
    match confirmed {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => Err(not_leader(f)),
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => Err(
            LockError::contention(format!("leadership not confirmed by a quorum: {e}")),
        ),
        Err(RaftError::Fatal(fatal)) => {
            Err(LockError::contention(format!("raft is stopped: {fatal}")))
        }
    }
}

/// One confirmation round, its failures logged as `failing` says: a leader that cannot confirm
/// its leadership fails every renewal and heartbeat round after round, and says so once when
/// that starts, once a minute while it lasts and once when it ends.
async fn confirm_round(
    raft: &Raft,
    clock: &dyn Clock,
    failing: &std::sync::Mutex<LogLimit>,
) -> Result<(), LockError> {
    let result = ensure_leader(raft).await;
    let now = clock.now();
    let mut failing = failing.lock().unwrap_or_else(|e| e.into_inner());
    match &result {
        Ok(()) => {
            if let Some(ended) = failing.succeeded(now) {
                tracing::info!(
                    failing_ms = ended.lasted.as_millis() as u64,
                    failed_rounds = ended.total,
                    "leadership confirmed again"
                );
            }
        }
        // Not a failure to confirm: this node no longer leads, and clients are sent on.
        Err(LockError::NotLeader { .. }) => {
            if let Some(ended) = failing.succeeded(now) {
                tracing::info!(
                    failing_ms = ended.lasted.as_millis() as u64,
                    failed_rounds = ended.total,
                    "leadership no longer confirmed: this node is not the leader"
                );
            }
        }
        Err(err) => match failing.failed(now, err) {
            None => {}
            Some(Note::Began) => tracing::warn!(
                error = %err,
                "leadership not confirmed; renewals and heartbeats fail until a quorum answers"
            ),
            Some(Note::Summary(s)) => tracing::warn!(
                failing_s = s.lasted.as_secs(),
                failed_rounds = s.count,
                last_error = %s.last_error,
                "leadership still not confirmed"
            ),
        },
    }
    result
}

/// The coalescing confirmer over `raft`'s rounds.
pub(super) fn confirmer(raft: Raft, clock: Arc<dyn Clock>) -> Confirmer {
    let failing = Arc::new(std::sync::Mutex::new(LogLimit::default()));
    Confirmer::new(Arc::new(move || {
        let (raft, clock, failing) = (raft.clone(), clock.clone(), failing.clone());
        Box::pin(async move { confirm_round(&raft, &*clock, &failing).await })
    }))
}

/// A watch that is `true` while `raft` knows a leader and is not shutting down, kept by a task
/// that ends with the Raft node.
pub(super) fn spawn_serving_watch(raft: Raft) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        // The server metrics change only with the vote, the state, the leader or the
        // membership, not with every entry as the full metrics do.
        let mut metrics = raft.server_metrics();
        loop {
            let (has_leader, shutting_down) = {
                let m = metrics.borrow_and_update();
                (m.current_leader.is_some(), m.state == ServerState::Shutdown)
            };
            tx.send_if_modified(|serving| {
                let now = has_leader && !shutting_down;
                std::mem::replace(serving, now) != now
            });
            if shutting_down || metrics.changed().await.is_err() {
                tx.send_if_modified(|serving| std::mem::replace(serving, false));
                return;
            }
        }
    });
    rx
}

impl RaftBackend {
    /// `NotLeader` naming the leader this node knows of, with its address from the membership.
    pub fn not_leader(&self) -> LockError {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        let leader_id = m
            .current_leader
            .filter(|id| *id != self.inner.node_id || m.state == ServerState::Leader);
        let leader_addr = leader_id.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.addr.clone())
        });
        LockError::NotLeader {
            leader_id,
            leader_addr,
        }
    }

    /// `Ok` if this node is the leader and holds its applied state, else `NotLeader`. A leader
    /// whose own snapshot still loads behind its start (a whole cluster restarted at a large
    /// state; `StateReader::has_table`) answers `Contention` until it has loaded: the leader
    /// paths after this check read the table.
    pub fn leader_check(&self) -> Result<(), LockError> {
        if self.inner.raft.server_metrics().borrow_watched().state != ServerState::Leader {
            return Err(self.not_leader());
        }
        if !self.inner.reader.has_table() {
            return Err(LockError::contention(
                "this node just became leader and is still loading its state from its \
                 snapshot; retry shortly",
            ));
        }
        Ok(())
    }

    /// `Ok` if this node leads and its promote applied in this term, so its lease deadlines are
    /// authoritative.
    pub(super) fn leases_ready(&self) -> Result<(), LockError> {
        self.leader_check()?;
        let term = self
            .inner
            .raft
            .server_metrics()
            .borrow_watched()
            .vote
            .leader_id
            .term;
        if self.inner.keeper.promoted_term() == Some(term) {
            Ok(())
        } else {
            Err(LockError::contention(
                "this node just became leader and is restarting leases; retry shortly",
            ))
        }
    }

    /// Confirms leadership with a quorum round and no log write (openraft
    /// `ensure_linearizable`), so a deposed leader cannot hand out a deadline the new leader
    /// will not honour, nor a terminal "lost" or "gone" read from its own lease keeper: a
    /// leader cut off from its successor still believes it leads (its promote applied in its
    /// term, so `leases_ready` passes), and its keeper lacks every grant and session made
    /// since. Every answer taken from leader-local state, positive or negative, is given only
    /// after a round that started after that state was read. Concurrent callers share rounds
    /// (see [`crate::leader::confirm`]).
    pub async fn confirm_leadership(&self) -> Result<(), LockError> {
        self.inner.confirmer.confirm().await
    }
}
