//! W5's many-sessions figure: W1 with and without (nearly) `SESSIONS_MAX` sessions kept alive
//! at a third of their TTL, in W4's alternating slices (`workload::run_sessions`), with the
//! cluster's live-session count polled meanwhile, and whether any session was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::cluster::Cluster;
use super::loads;
use crate::workload::{self, SessionsResult};

/// Rounds of one W1 slice without and one with the sessions.
const ROUNDS: usize = 2;
/// Sessions left free for the W1 workers' own (each slice opens [`workload::W1_WORKERS`],
/// which live on for their TTL) and for W5's probes.
const HEADROOM: usize = 64;
/// How often the leader's live-session gauge is polled.
const POLL: Duration = Duration::from_secs(1);

/// What the many-sessions step measured.
#[derive(Debug, Clone, Serialize)]
pub struct ManySessions {
    /// Sessions live before they were opened (the leader's `lockd_sessions`).
    pub live_before: u64,
    /// The most sessions live at once, as the leader's gauge showed each second.
    pub live_peak: u64,
    /// W1 with and without the sessions, and the keep-alive load.
    pub result: SessionsResult,
    /// How much W1 lost with them, in percent of W1 without them.
    pub w1_cost_pct: f64,
}

/// The most sessions the step may open: `SESSIONS_MAX` minus those live and those the W1
/// slices will open.
pub fn room(live: u64) -> usize {
    lock_raft_store::limits::SESSIONS_MAX
        .saturating_sub(live as usize)
        .saturating_sub(2 * ROUNDS * workload::W1_WORKERS + HEADROOM)
}

/// Opens `count` sessions (or as many as fit under `SESSIONS_MAX` when `None`) of `ttl`, and
/// runs W1 with and without them over `secs` each, in [`ROUNDS`] rounds.
pub async fn measure(
    cluster: &Cluster,
    count: Option<usize>,
    ttl: Duration,
    secs: f64,
) -> Result<ManySessions> {
    let leader = cluster.leader.get();
    let live_before = cluster
        .scrape(leader)
        .await?
        .count("lockd_sessions")
        .context("the leader's lockd_sessions")?;
    let count = count.unwrap_or_else(|| room(live_before));
    let peak = Arc::new(AtomicU64::new(live_before));
    let poller = tokio::spawn({
        let (peak, target) = (peak.clone(), cluster.nodes[leader].metrics.clone());
        async move {
            loop {
                tokio::time::sleep(POLL).await;
                if let Ok(scrape) = super::metrics::scrape(&target).await
                    && let Some(live) = scrape.count("lockd_sessions")
                {
                    peak.fetch_max(live, Ordering::Relaxed);
                }
            }
        }
    });
    let result =
        workload::run_sessions(&cluster.lockd, count, ttl, &loads::w1_spec(secs), ROUNDS).await;
    poller.abort();
    let result = result?;
    Ok(ManySessions {
        live_before,
        live_peak: peak.load(Ordering::Relaxed),
        w1_cost_pct: result.cost_pct(),
        result,
    })
}
