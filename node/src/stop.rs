//! How a Raft node stops once its serve loop has drained: a last snapshot when that saves the
//! next start more than it costs now, then openraft's shutdown. Each step is bounded, so a step
//! that hangs costs a warning in the log, never a node that will not exit.
//!
//! The snapshot: a restart re-applies every command since the node's last snapshot before it
//! serves anything, up to the policy's bound (250,000–350,000 commands, 1–2 s at a million held
//! locks). A follower that stops cleanly, in a rolling restart say, builds one first when that
//! replay would take longer than the build ([`StopSnapshot::worth_building`]), so it comes back
//! after decoding its snapshot alone. A leader does not: it keeps sending heartbeats until Raft
//! stops, and each one would hold back the election its followers need, while it serves nobody.

use std::time::{Duration, Instant};

use lock_raft_store::Raft;
use lock_raft_store::storage::StopSnapshot;
use openraft::async_runtime::WatchReceiver;

/// How long a stopping node waits for its last snapshot. A million-lock table is built in
/// 0.6 s on an idle machine and a few seconds on a loaded one (docs/PERFORMANCE.md); past this
/// the node stops without it and replays its log at the next start, as after a crash. With the
/// serve loop's 3 s drain, a stop's first two steps fit the 10 s that `lockd dev` and the test
/// harness give a node before they SIGKILL it.
pub const STOP_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a shutdown waits for Raft to stop before giving up on it.
pub const RAFT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Stops node `node_id`'s Raft: the last snapshot if worth it ([`snapshot_before_stop`]), then
/// openraft's shutdown, within [`RAFT_SHUTDOWN_TIMEOUT`].
pub async fn stop_raft(raft: &Raft, node_id: u64, snapshot: &StopSnapshot) {
    snapshot_before_stop(raft, node_id, snapshot).await;
    tracing::info!("stopping raft");
    match tokio::time::timeout(RAFT_SHUTDOWN_TIMEOUT, raft.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown failed"),
        Err(_) => tracing::warn!("raft did not stop within {RAFT_SHUTDOWN_TIMEOUT:?}"),
    }
}

/// Builds a snapshot covering everything node `node_id` has applied, unless it leads, has
/// nothing worth building for, or the build outlasts [`STOP_SNAPSHOT_TIMEOUT`]. openraft builds
/// one snapshot at a time, and one it was already building may stop short of the applied
/// index, so the node asks again until a snapshot covers it.
pub async fn snapshot_before_stop(raft: &Raft, node_id: u64, snapshot: &StopSnapshot) {
    let mut metrics = raft.metrics();
    let (leads, applied) = {
        let m = metrics.borrow_watched();
        (
            m.current_leader == Some(node_id),
            m.last_applied.map(|id| id.index),
        )
    };
    let Some(applied) = applied else {
        return;
    };
    if leads {
        tracing::info!(
            "no snapshot at stop: this node leads, and its followers' election must not wait for a build"
        );
        return;
    }
    let Some(commands) = snapshot.worth_building() else {
        tracing::debug!(
            "no snapshot at stop: the replay at the next start is cheaper than a build"
        );
        return;
    };
    tracing::info!(
        commands,
        applied_index = applied,
        "building a snapshot before stopping, so the next start need not re-apply these commands"
    );
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + STOP_SNAPSHOT_TIMEOUT;
    loop {
        snapshot.request();
        if let Err(fatal) = raft.trigger().snapshot().await {
            tracing::warn!(%fatal, "no snapshot at stop: raft stopped");
            return;
        }
        let before = metrics.borrow_watched().snapshot.map(|id| id.index);
        let changed = tokio::time::timeout_at(deadline, async {
            loop {
                if metrics.changed().await.is_err() {
                    return false;
                }
                if metrics.borrow_watched().snapshot.map(|id| id.index) != before {
                    return true;
                }
            }
        })
        .await;
        let covered = metrics
            .borrow_watched()
            .snapshot
            .map(|id| id.index)
            .filter(|index| *index >= applied);
        match (changed, covered) {
            (_, Some(index)) => {
                tracing::info!(
                    index,
                    took_ms = started.elapsed().as_millis() as u64,
                    "snapshot built before stopping"
                );
                return;
            }
            (Ok(true), None) => continue,
            (Ok(false), None) => {
                tracing::warn!("no snapshot at stop: raft stopped while it was being built");
                return;
            }
            (Err(_), None) => {
                tracing::warn!(
                    "no snapshot at stop within {STOP_SNAPSHOT_TIMEOUT:?}: stopping without it; the next start re-applies the log since the last one"
                );
                return;
            }
        }
    }
}
