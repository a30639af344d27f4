//! W5's many-sessions figure: W1 with and without (nearly) `SESSIONS_MAX` sessions kept alive
//! at a third of their TTL, in W4's alternating order (without, with, with, without, so the
//! sessions are opened once and closed once), with the cluster's live-session count polled
//! meanwhile, and whether any session was lost. The sessions are opened, kept alive and closed
//! through W5's router, which retries refusals (W4's keepers do not: a refusal is a failure
//! there), so a leader that refuses for a while shows in the refusal counts instead of ending
//! the step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX;
use lock_proto::v1::CloseSessionRequest;
use serde::Serialize;
use tokio::task::JoinSet;

use super::cluster::Cluster;
use super::held::Held;
use super::idle_cpu::{self, IdleCpu};
use super::keepalive::{KeepAlive, KeepAliveReport};
use super::loads;
use super::router::{RefusalCount, Refusals, Router};
use crate::workload::{self, LoopResult};

/// Sessions left free for the W1 workers' own (each slice opens [`workload::W1_WORKERS`],
/// which live on for their TTL) and for W5's later sessions and probes.
const HEADROOM: usize = 64;
/// W1 slices: two without the sessions, two with them.
const SLICES: u32 = 4;
/// Connections the sessions are opened, kept alive and closed on.
const CONNECTIONS: usize = 8;
/// Concurrent `CloseSession` calls.
const CLOSE_LANES: usize = 64;
/// Shortest window over which the beats' CPU is measured with no lock traffic.
const BEATS_ONLY: Duration = Duration::from_secs(10);
/// How often the leader's live-session gauge is polled.
const POLL: Duration = Duration::from_secs(1);

/// What the many-sessions step measured.
#[derive(Debug, Clone, Serialize)]
pub struct ManySessions {
    /// Sessions opened and kept alive.
    pub sessions: usize,
    /// Their TTL, in milliseconds.
    pub session_ttl_ms: u64,
    /// Seconds to open them all.
    pub open_secs: f64,
    /// Seconds to close them all.
    pub close_secs: f64,
    /// Sessions live before they were opened (the leader's `lockd_sessions`).
    pub live_before: u64,
    /// The most sessions live at once, as the leader's gauge showed each second.
    pub live_peak: u64,
    /// Session beats due per second (sessions / (TTL / 3)).
    pub beats_offered_per_sec: f64,
    /// Every node's CPU over a window with the sessions beating and no lock traffic.
    pub beats_only: IdleCpu,
    /// The leader's CPU in that window per beat due, in microseconds (its idle CPU without the
    /// sessions, about 1 % of a core, included).
    pub leader_us_per_beat: Option<f64>,
    /// What keeping them alive did (beats answered, lost sessions).
    pub keepalive: KeepAliveReport,
    /// Refusals met opening, beating and closing them, by kind (each was retried).
    pub refusals: BTreeMap<String, RefusalCount>,
    /// W1 with the sessions: both slices together.
    pub w1_with: LoopResult,
    /// W1 without them: both slices together.
    pub w1_without: LoopResult,
    /// How much W1 lost with them, in percent of W1 without them.
    pub w1_cost_pct: f64,
}

/// The most sessions the step may open: `SESSIONS_MAX` minus those live and those the W1
/// slices will open.
pub fn room(live: u64) -> usize {
    lock_raft_store::limits::SESSIONS_MAX
        .saturating_sub(live as usize)
        .saturating_sub(SLICES as usize * workload::W1_WORKERS + HEADROOM)
}

/// Opens `count` sessions (or as many as fit under `SESSIONS_MAX` when `None`) of `ttl`, and
/// runs W1 over `secs` with them and as long without, in four alternating slices.
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
    let slice = loads::w1_spec(secs * 2.0 / f64::from(SLICES));
    let refusals = Arc::new(Refusals::default());
    let routers = (0..CONNECTIONS)
        .map(|_| Router::new(cluster, refusals.clone()).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
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
    let outcome = async {
        eprintln!("lock-bench w5: W1 without the sessions (1)");
        let mut without = vec![
            workload::run_loop(&cluster.lockd, &slice)
                .await
                .context("W1 without the sessions (1)")?,
        ];
        eprintln!("lock-bench w5: opening {count} sessions");
        let opened = Instant::now();
        // Each group starts beating as soon as it is open: opening 100,000 sessions can take
        // longer than their TTL, and a session opened first must not lapse meanwhile.
        let (mut keepers, mut groups) = (Vec::new(), Vec::new());
        let mut left = count;
        while left > 0 {
            let group = left.min(HEARTBEAT_BATCH_SESSIONS_MAX);
            left -= group;
            let ids =
                super::fill::open_sessions(&routers, "w5-many", group, ttl.as_millis() as u64)
                    .await
                    .context("opening the sessions")?;
            let held = Arc::new(Held::new(ids, 0, ttl.as_millis() as u64));
            let router = routers[keepers.len() % routers.len()].clone();
            keepers.push(KeepAlive::start(router, held.clone(), ttl, ttl));
            groups.push(held);
        }
        let open_secs = opened.elapsed().as_secs_f64();
        // What the beats alone cost, with no lock traffic: every node's CPU over a window in
        // which each session beats at least once.
        let beats_only = idle_cpu::measure(cluster, BEATS_ONLY.max(ttl / 3)).await;
        let mut with = Vec::new();
        for n in 1..=2 {
            eprintln!("lock-bench w5: W1 with the sessions ({n})");
            let slice = workload::run_loop(&cluster.lockd, &slice).await;
            with.push(slice.with_context(|| format!("W1 with the sessions ({n})"))?);
        }
        let mut reports = Vec::with_capacity(keepers.len());
        for keeper in keepers {
            reports.push(keeper.stop().await);
        }
        let keepalive = KeepAliveReport::combine(reports);
        let closed = Instant::now();
        let ids: Vec<String> = groups
            .iter()
            .flat_map(|g| g.sessions.iter().cloned())
            .collect();
        close_sessions(&routers, &ids).await?;
        let close_secs = closed.elapsed().as_secs_f64();
        eprintln!("lock-bench w5: W1 without the sessions (2)");
        without.push(
            workload::run_loop(&cluster.lockd, &slice)
                .await
                .context("W1 without the sessions (2)")?,
        );
        anyhow::Ok((open_secs, close_secs, keepalive, beats_only, with, without))
    }
    .await;
    poller.abort();
    let (open_secs, close_secs, keepalive, beats_only, with, without) = outcome?;
    let beats_offered_per_sec = count as f64 / (ttl.as_secs_f64() / 3.0);
    let missing = || anyhow::anyhow!("no W1 slice ran");
    let w1_with = LoopResult::combine(with).ok_or_else(missing)?;
    let w1_without = LoopResult::combine(without).ok_or_else(missing)?;
    Ok(ManySessions {
        sessions: count,
        session_ttl_ms: ttl.as_millis() as u64,
        open_secs,
        close_secs,
        live_before,
        live_peak: peak.load(Ordering::Relaxed),
        beats_offered_per_sec,
        leader_us_per_beat: beats_only
            .leader_pct
            .map(|pct| pct / 100.0 / beats_offered_per_sec * 1e6),
        beats_only,
        keepalive,
        refusals: refusals.counts(),
        w1_cost_pct: (1.0 - w1_with.pairs_per_sec / w1_without.pairs_per_sec.max(f64::EPSILON))
            * 100.0,
        w1_with,
        w1_without,
    })
}

/// Closes every session of `ids` through `routers`, concurrently.
async fn close_sessions(routers: &[Arc<Router>], ids: &[String]) -> Result<()> {
    let ids: Arc<Vec<String>> = Arc::new(ids.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut lanes = JoinSet::new();
    for lane in 0..CLOSE_LANES.min(ids.len()) {
        let (router, ids, next) = (
            routers[lane % routers.len()].clone(),
            ids.clone(),
            next.clone(),
        );
        lanes.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else {
                    return anyhow::Ok(());
                };
                router
                    .call("CloseSession", |node| {
                        let mut sessions = router.session(node);
                        let session_id = id.clone();
                        async move {
                            sessions
                                .close_session(CloseSessionRequest { session_id })
                                .await
                        }
                    })
                    .await?;
            }
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane.context("a CloseSession lane panicked")??;
    }
    Ok(())
}
