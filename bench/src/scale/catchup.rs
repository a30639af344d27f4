//! W5's follower catch-up figure: stop a follower, write log entries until the leader has
//! taken a new snapshot and purged the log the follower would need (`lockd_raft_purged_index`
//! past the follower's last entry, so it can only catch up from the snapshot), restart the
//! follower and time how long it takes to catch up — until its applied index reaches the
//! leader's commit index of the restart, and until the leader sees it matched (replication
//! lag 0).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::future::join_all;
use lock_proto::v1::{ReleaseRequest, TryAcquireRequest};
use serde::Serialize;

use super::cluster::Cluster;
use super::held::Held;
use super::router::{CALL_TIMEOUT, Router};
use super::snapshots;

/// Longest the entries are written, whether or not a snapshot came.
const WRITE_MAX: Duration = Duration::from_secs(180);
/// Longest wait for the restarted follower to catch up.
const CATCH_UP_MAX: Duration = Duration::from_secs(180);
/// Pause between two polls of the follower (and of the leader while writing).
const POLL: Duration = Duration::from_millis(20);
/// Held sessions writing at once while the follower is down. The leader's snapshot policy
/// counts commands as well as log bytes: at a million held locks, one call at a time wrote
/// 217,100 entries in [`WRITE_MAX`] without the leader taking a snapshot (session 26).
const WRITERS: usize = 32;

/// What the catch-up measured.
#[derive(Debug, Clone, Serialize)]
pub struct CatchUp {
    /// The follower stopped and restarted.
    pub node_id: u64,
    /// Its applied index when stopped.
    pub stopped_at_index: u64,
    /// Log entries written meanwhile (leader's commit index growth).
    pub entries_written: u64,
    /// Time taken to write them, in seconds.
    pub write_secs: f64,
    /// The leader's newest snapshot at the restart: its index and size.
    pub leader_snapshot_index: Option<u64>,
    /// Its size in bytes.
    pub leader_snapshot_bytes: Option<u64>,
    /// Whether that snapshot is past the stopped follower's index.
    pub snapshot_past_follower: bool,
    /// The leader's purged index at the restart (`lockd_raft_purged_index`).
    pub leader_purged_index: Option<u64>,
    /// Whether the leader had purged past everything the follower held, so that it could only
    /// catch up by installing the leader's snapshot. openraft postpones a purge while an
    /// append to a peer still uses the entries, so writes go on until it has (or until
    /// [`WRITE_MAX`]); `false` means the follower caught up from the log.
    pub from_snapshot: bool,
    /// The leader's commit index at the restart: the target.
    pub target_index: u64,
    /// From the restart until the follower's metrics answered (the process is up).
    pub up_secs: Option<f64>,
    /// From the restart until its applied index reached the target.
    pub caught_up_secs: Option<f64>,
    /// From the restart until the leader's replication lag for it was 0.
    pub leader_matched_secs: Option<f64>,
    /// The follower's newest snapshot after catching up (its index).
    pub follower_snapshot_index_after: Option<u64>,
    /// Snapshots the follower built itself since the restart (0 with a newer snapshot file:
    /// it installed the leader's).
    pub follower_snapshot_builds_after: Option<u64>,
    /// The follower's resident memory after catching up, in MiB (state rebuilt from the
    /// snapshot): now and peak.
    pub follower_memory_after: Option<super::procfs::Memory>,
    /// The leader's resident memory after the catch-up: now and its peak since it started,
    /// which covers sending the snapshot.
    pub leader_memory_after: Option<super::procfs::Memory>,
}

/// Stops the follower after the leader, writes at least `entries` log entries and until the
/// leader has purged past the follower's log (through [`WRITERS`] held sessions at once),
/// restarts it and times its catch-up.
pub async fn measure(
    cluster: &mut Cluster,
    router: &Router,
    held: &Held,
    entries: u64,
) -> Result<CatchUp> {
    let leader = cluster.leader.get();
    let follower = (leader + 1) % cluster.nodes.len();
    let node_id = cluster.nodes[follower].id;
    let stopped_at_index = cluster
        .scrape(follower)
        .await?
        .view()
        .applied_index
        .context("the follower's applied index")?;
    cluster
        .lockd
        .node_process_mut(follower)
        .context("the follower's process")?
        .terminate()
        .await?;
    let target = cluster.nodes[leader].metrics.clone();
    // What the leader's metrics say now (`None` while a scrape fails).
    let leader_view = || {
        let target = target.clone();
        async move { super::metrics::scrape(&target).await.ok().map(|s| s.view()) }
    };
    let commit = || async { leader_view().await.and_then(|v| v.commit_index) };
    // The leader's commit index once the follower is gone bounds the follower's log: with
    // one entry in flight, whatever reached the follower is committed by the time this reads.
    let start_commit = commit().await.context("the leader's commit index")?;
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let writer = |w: usize| {
        let (stop, written) = (&stop, &written);
        async move {
            let wrote = write_pairs(router, held, w, written, stop).await;
            // One writer's failure ends the step: the others stop at their next pair.
            stop.store(true, Ordering::Relaxed);
            wrote
        }
    };
    let watch = async {
        while !stop.load(Ordering::Relaxed) {
            let view = leader_view().await.unwrap_or_default();
            let now_commit = view.commit_index.unwrap_or(start_commit);
            let purged_past = view.purged_index.is_some_and(|p| p > start_commit);
            if (now_commit.saturating_sub(stopped_at_index) >= entries && purged_past)
                || started.elapsed() > WRITE_MAX
            {
                stop.store(true, Ordering::Relaxed);
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let writers = WRITERS.min(held.sessions.len());
    let (wrote, ()) = tokio::join!(join_all((0..writers).map(writer)), watch);
    wrote.into_iter().collect::<Result<Vec<()>>>()?;
    let write_secs = started.elapsed().as_secs_f64();
    let target_index = commit().await.context("the leader's commit index")?;
    let leader_purged_index = leader_view().await.and_then(|v| v.purged_index);
    let leader_snapshot = snapshots::current(&cluster.nodes[leader].data_dir);
    cluster
        .lockd
        .node_process_mut(follower)
        .context("the follower's process")?
        .restart()?;
    let restarted = Instant::now();
    let lag_series = format!("lockd_raft_replication_lag_entries{{peer=\"{node_id}\"}}");
    let (mut up_secs, mut caught_up_secs, mut leader_matched_secs) = (None, None, None);
    while restarted.elapsed() < CATCH_UP_MAX
        && (caught_up_secs.is_none() || leader_matched_secs.is_none())
    {
        let at = restarted.elapsed().as_secs_f64();
        if let Ok(scrape) = cluster.scrape(follower).await {
            up_secs.get_or_insert(at);
            if caught_up_secs.is_none()
                && scrape
                    .view()
                    .applied_index
                    .is_some_and(|a| a >= target_index)
            {
                caught_up_secs = Some(at);
            }
        }
        if leader_matched_secs.is_none()
            && let Ok(scrape) = cluster.scrape(leader).await
            && scrape.get(&lag_series) == Some(0.0)
        {
            leader_matched_secs = Some(at);
        }
        tokio::time::sleep(POLL).await;
    }
    if caught_up_secs.is_none() {
        bail!("node {node_id} did not catch up to index {target_index} within {CATCH_UP_MAX:?}");
    }
    let after = cluster.scrape(follower).await.ok().map(|s| s.view());
    Ok(CatchUp {
        node_id,
        stopped_at_index,
        entries_written: target_index.saturating_sub(start_commit),
        write_secs,
        leader_snapshot_index: leader_snapshot.as_ref().map(|s| s.index),
        leader_snapshot_bytes: leader_snapshot.as_ref().map(|s| s.bytes),
        snapshot_past_follower: leader_snapshot.is_some_and(|s| s.index > stopped_at_index),
        leader_purged_index,
        from_snapshot: leader_purged_index.is_some_and(|p| p > start_commit),
        target_index,
        up_secs,
        caught_up_secs,
        leader_matched_secs,
        follower_snapshot_index_after: snapshots::current(&cluster.nodes[follower].data_dir)
            .map(|s| s.index),
        follower_snapshot_builds_after: after.and_then(|v| v.snapshot_builds),
        follower_memory_after: cluster.pid(follower).and_then(super::procfs::memory),
        leader_memory_after: cluster.pid(leader).and_then(super::procfs::memory),
    })
}

/// Acquires and releases fresh keys as held session `w` until `stop`, numbering the keys
/// through `written`.
async fn write_pairs(
    router: &Router,
    held: &Held,
    w: usize,
    written: &AtomicU64,
    stop: &AtomicBool,
) -> Result<()> {
    let session_id = &held.sessions[w];
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w5/catch-up/{}", written.fetch_add(1, Ordering::Relaxed));
        let request = TryAcquireRequest {
            session_id: session_id.clone(),
            request_id: held.request_id(w),
            key: key.clone(),
            ttl_ms: 60_000,
        };
        let grant = router
            .call("TryAcquire", |node| {
                let (pipeline, request) = (router.pipeline(node), request.clone());
                async move { pipeline.try_acquire(request, CALL_TIMEOUT).await }
            })
            .await?
            .grant
            .with_context(|| format!("{key}: not granted"))?;
        let request = ReleaseRequest {
            session_id: session_id.clone(),
            request_id: held.request_id(w),
            key,
            fencing_token: grant.fencing_token,
        };
        router
            .call("Release", |node| {
                let (pipeline, request) = (router.pipeline(node), request.clone());
                async move { pipeline.release(request, CALL_TIMEOUT).await }
            })
            .await?;
    }
    Ok(())
}
