//! W5's many-sessions figure: W1 with and without (nearly) `SESSIONS_MAX` sessions kept alive
//! at a third of their TTL, over `--w5-many-rounds` alternated rounds. Each round runs W1
//! without the sessions, opens a fresh set of them (each group of 1,024 beating as soon as it
//! is open), runs W1 with them and closes them; one more W1 slice without them ends the step.
//! So every slice with the sessions has a slice without them on either side (without, with,
//! without, …, with, without), and a host that drifts during the step weighs on both kinds
//! alike. What the beats alone cost, with no lock traffic, is measured once, in the first
//! round.
//!
//! W1's cost is reported combined (every slice of a kind together, as before the rounds) and
//! per round (the round's slice with the sessions against the mean of the two slices without
//! them around it), with the rounds' median, least and greatest: on a noisy 2-core host one
//! combined figure swung from -20 % to +2 % between runs of the same binary, and the rounds'
//! spread shows how far a single figure can be trusted. The leader's live-session count is
//! polled throughout, and whether any session was lost. The sessions are opened, kept alive
//! and closed through W5's router, which retries refusals (W4's keepers do not: a refusal is a
//! failure there), so a leader that refuses for a while shows in the refusal counts instead of
//! ending the step.

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
    /// Sessions opened and kept alive in each round (fresh ones each round).
    pub sessions: usize,
    /// Their TTL, in milliseconds.
    pub session_ttl_ms: u64,
    /// Seconds to open them all in the first round (each round's is in `rounds`). The first
    /// round's, as the step opened them once before it had rounds.
    pub open_secs: f64,
    /// Seconds to close them all in the first round (each round's is in `rounds`).
    pub close_secs: f64,
    /// Sessions live before the first round opened its own (the leader's `lockd_sessions`).
    pub live_before: u64,
    /// The most sessions live at once, as the leader's gauge showed each second.
    pub live_peak: u64,
    /// Session beats due per second (sessions / (TTL / 3)).
    pub beats_offered_per_sec: f64,
    /// Every node's CPU over a window with the sessions beating and no lock traffic, in the
    /// first round.
    pub beats_only: IdleCpu,
    /// The leader's CPU in that window per beat due, in microseconds (its idle CPU without the
    /// sessions, about 1 % of a core, included).
    pub leader_us_per_beat: Option<f64>,
    /// What keeping them alive did (beats answered, lost sessions), every round together: its
    /// `sessions` counts every round's fresh ones, rounds × `sessions`.
    pub keepalive: KeepAliveReport,
    /// Refusals met opening, beating and closing them, every round, by kind (each was retried).
    pub refusals: BTreeMap<String, RefusalCount>,
    /// W1 with the sessions: every round's slice together.
    pub w1_with: LoopResult,
    /// W1 without them: every slice without them together (one more than the rounds).
    pub w1_without: LoopResult,
    /// How much W1 lost with them, in percent of W1 without them: `w1_with` against
    /// `w1_without`.
    pub w1_cost_pct: f64,
    /// W1 pairs/s of each slice without the sessions, in order: before each round, then after
    /// the last.
    pub w1_without_pairs_per_sec: Vec<f64>,
    /// Each round, in order.
    pub rounds: Vec<ManyRound>,
    /// The median of the rounds' `w1_cost_pct` (of the middle two for an even count).
    pub w1_cost_pct_median: f64,
    /// The least of the rounds' `w1_cost_pct`.
    pub w1_cost_pct_min: f64,
    /// The greatest of the rounds' `w1_cost_pct`.
    pub w1_cost_pct_max: f64,
}

/// One round of the many-sessions step: its sessions opened, W1 with them, them closed.
#[derive(Debug, Clone, Serialize)]
pub struct ManyRound {
    /// Seconds to open the round's sessions.
    pub open_secs: f64,
    /// Seconds to close them, once their beats had stopped.
    pub close_secs: f64,
    /// W1 pairs/s with them.
    pub w1_with_pairs_per_sec: f64,
    /// How much W1 lost with them, in percent of the mean pairs/s of the two slices without
    /// them around this round's (the one before it and the one after it).
    pub w1_cost_pct: f64,
    /// Session beats answered alive.
    pub beats_ok: u64,
    /// `HeartbeatBatch` calls that failed after their retries.
    pub batches_failed: u64,
    /// Sessions answered `alive = false`.
    pub lost_count: usize,
}

/// W1's cost per round and over the rounds, in percent of W1 without the sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundCosts {
    /// Each round's, in order.
    pub per_round: Vec<f64>,
    /// Their median (the mean of the middle two for an even count).
    pub median: f64,
    /// The least.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

/// How much W1 lost at `with` pairs/s against `without`, in percent of `without` (negative
/// when it gained).
pub fn cost_pct(with: f64, without: f64) -> f64 {
    (1.0 - with / without.max(f64::EPSILON)) * 100.0
}

/// Each round's cost from the pairs/s of its slice with the sessions, `with[i]`, and of the
/// slices without them, `without[i]` before round `i` and `without[i + 1]` after it: the slice
/// with them against the mean of the two around it, which cancels a host that drifts evenly
/// across the round. `None` unless there is at least one round and exactly one more slice
/// without the sessions than with them.
pub fn round_costs(with: &[f64], without: &[f64]) -> Option<RoundCosts> {
    if with.is_empty() || without.len() != with.len() + 1 {
        return None;
    }
    let per_round: Vec<f64> = with
        .iter()
        .zip(without.windows(2))
        .map(|(&with, around)| cost_pct(with, (around[0] + around[1]) / 2.0))
        .collect();
    let mut sorted = per_round.clone();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    };
    Some(RoundCosts {
        median,
        min: sorted[0],
        max: sorted[sorted.len() - 1],
        per_round,
    })
}

/// The most sessions each round may open: `SESSIONS_MAX` minus those live and those the W1
/// slices of `rounds` rounds will open (two slices a round and one more).
pub fn room(live: u64, rounds: usize) -> usize {
    lock_raft_store::limits::SESSIONS_MAX
        .saturating_sub(live as usize)
        .saturating_sub((2 * rounds + 1) * workload::W1_WORKERS + HEADROOM)
}

/// One round's sessions, in groups of at most [`HEARTBEAT_BATCH_SESSIONS_MAX`], each group
/// kept alive by its own [`KeepAlive`] from the moment it is open.
#[derive(Debug)]
struct Beating {
    keepers: Vec<KeepAlive>,
    groups: Vec<Arc<Held>>,
}

impl Beating {
    /// Opens `count` sessions of `ttl` through `routers`, each group beating as soon as it is
    /// open: opening 100,000 sessions can take longer than their TTL, and a session opened
    /// first must not lapse meanwhile. If an open fails, the groups already open are stopped
    /// and closed before the error is answered, so that none beats on past the step.
    async fn open(routers: &[Arc<Router>], count: usize, ttl: Duration) -> Result<Self> {
        let ttl_ms = ttl.as_millis() as u64;
        let mut beating = Self {
            keepers: Vec::new(),
            groups: Vec::new(),
        };
        let mut left = count;
        while left > 0 {
            let group = left.min(HEARTBEAT_BATCH_SESSIONS_MAX);
            let ids = match super::fill::open_sessions(routers, "w5-many", group, ttl_ms).await {
                Ok(ids) => ids,
                Err(e) => {
                    let (_, open) = beating.stop().await;
                    if let Err(close) = close_sessions(routers, &open).await {
                        eprintln!("lock-bench w5: closing the sessions opened so far: {close:#}");
                    }
                    return Err(e);
                }
            };
            left -= group;
            let held = Arc::new(Held::new(ids, 0, ttl_ms));
            let router = routers[beating.keepers.len() % routers.len()].clone();
            beating
                .keepers
                .push(KeepAlive::start(router, held.clone(), ttl, ttl));
            beating.groups.push(held);
        }
        Ok(beating)
    }

    /// Stops every group's beats (each waits for its batches in flight) and answers what they
    /// did, with every session's id for closing them.
    async fn stop(self) -> (KeepAliveReport, Vec<String>) {
        let mut reports = Vec::with_capacity(self.keepers.len());
        for keeper in self.keepers {
            reports.push(keeper.stop().await);
        }
        let ids = self
            .groups
            .iter()
            .flat_map(|g| g.sessions.iter().cloned())
            .collect();
        (KeepAliveReport::combine(reports), ids)
    }
}

/// What the rounds and the last slice measured, before the figures are derived from them.
#[derive(Debug)]
struct Slices {
    with: Vec<LoopResult>,
    without: Vec<LoopResult>,
    /// Per round: open and close seconds, and what its beats did.
    rounds: Vec<(f64, f64, KeepAliveReport)>,
    beats_only: IdleCpu,
}

/// Opens `count` sessions (or as many as fit under `SESSIONS_MAX` when `None`) of `ttl` in
/// each of `rounds` rounds (at least one), and runs W1 over `secs` with them, split evenly
/// over the rounds' slices with them, and over `secs` without them, split evenly over the
/// slice before each round and the one after the last.
pub async fn measure(
    cluster: &Cluster,
    count: Option<usize>,
    ttl: Duration,
    secs: f64,
    rounds: usize,
) -> Result<ManySessions> {
    let rounds = rounds.max(1);
    let leader = cluster.leader.get();
    let live_before = cluster
        .scrape(leader)
        .await?
        .count("lockd_sessions")
        .context("the leader's lockd_sessions")?;
    let count = count.unwrap_or_else(|| room(live_before, rounds));
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
    let outcome = run_rounds(cluster, &routers, count, ttl, secs, rounds).await;
    poller.abort();
    let slices = outcome?;
    let pairs_per_sec =
        |slices: &[LoopResult]| -> Vec<f64> { slices.iter().map(|s| s.pairs_per_sec).collect() };
    let w1_without_pairs_per_sec = pairs_per_sec(&slices.without);
    let costs = round_costs(&pairs_per_sec(&slices.with), &w1_without_pairs_per_sec)
        .context("the rounds' W1 slices do not alternate")?;
    let rounds: Vec<ManyRound> = slices
        .rounds
        .iter()
        .zip(&slices.with)
        .zip(&costs.per_round)
        .map(
            |(((open_secs, close_secs, beats), with), &cost)| ManyRound {
                open_secs: *open_secs,
                close_secs: *close_secs,
                w1_with_pairs_per_sec: with.pairs_per_sec,
                w1_cost_pct: cost,
                beats_ok: beats.beats_ok,
                batches_failed: beats.batches_failed,
                lost_count: beats.lost_count,
            },
        )
        .collect();
    let beats_offered_per_sec = count as f64 / (ttl.as_secs_f64() / 3.0);
    let missing = || anyhow::anyhow!("no W1 slice ran");
    let w1_with = LoopResult::combine(slices.with).ok_or_else(missing)?;
    let w1_without = LoopResult::combine(slices.without).ok_or_else(missing)?;
    let first = rounds.first().ok_or_else(missing)?;
    Ok(ManySessions {
        sessions: count,
        session_ttl_ms: ttl.as_millis() as u64,
        open_secs: first.open_secs,
        close_secs: first.close_secs,
        live_before,
        live_peak: peak.load(Ordering::Relaxed),
        beats_offered_per_sec,
        leader_us_per_beat: slices
            .beats_only
            .leader_pct
            .map(|pct| pct / 100.0 / beats_offered_per_sec * 1e6),
        beats_only: slices.beats_only,
        keepalive: KeepAliveReport::combine(slices.rounds.into_iter().map(|r| r.2).collect()),
        refusals: refusals.counts(),
        w1_cost_pct: cost_pct(w1_with.pairs_per_sec, w1_without.pairs_per_sec),
        w1_with,
        w1_without,
        w1_without_pairs_per_sec,
        rounds,
        w1_cost_pct_median: costs.median,
        w1_cost_pct_min: costs.min,
        w1_cost_pct_max: costs.max,
    })
}

/// The step's slices in order: per round, W1 without the sessions, the sessions opened (and
/// in the first round the beats' CPU alone), W1 with them, them closed; then W1 without them
/// once more.
async fn run_rounds(
    cluster: &Cluster,
    routers: &[Arc<Router>],
    count: usize,
    ttl: Duration,
    secs: f64,
    rounds: usize,
) -> Result<Slices> {
    let with_spec = loads::w1_spec(secs / rounds as f64);
    let without_spec = loads::w1_spec(secs / (rounds + 1) as f64);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut done, mut beats_only) = (Vec::new(), None);
    for round in 1..=rounds {
        eprintln!("lock-bench w5: W1 without the sessions, before round {round} of {rounds}");
        let slice = workload::run_loop(&cluster.lockd, &without_spec).await;
        without
            .push(slice.with_context(|| format!("W1 without the sessions before round {round}"))?);
        eprintln!("lock-bench w5: opening {count} sessions (round {round} of {rounds})");
        let opened = Instant::now();
        let beating = Beating::open(routers, count, ttl)
            .await
            .with_context(|| format!("opening the sessions of round {round}"))?;
        let open_secs = opened.elapsed().as_secs_f64();
        if beats_only.is_none() {
            // What the beats alone cost, with no lock traffic: every node's CPU over a window
            // in which each session beats at least once. Once: it does not need the rounds'
            // alternation, and every round would add its window to the step.
            beats_only = Some(idle_cpu::measure(cluster, BEATS_ONLY.max(ttl / 3)).await);
        }
        eprintln!("lock-bench w5: W1 with the sessions (round {round} of {rounds})");
        let slice = workload::run_loop(&cluster.lockd, &with_spec).await;
        // Stopped and closed even when W1 failed, so that no round's sessions outlive it.
        let (beats, ids) = beating.stop().await;
        let closed = Instant::now();
        let close = close_sessions(routers, &ids).await;
        let close_secs = closed.elapsed().as_secs_f64();
        with.push(slice.with_context(|| format!("W1 with the sessions (round {round})"))?);
        close.with_context(|| format!("closing the sessions of round {round}"))?;
        done.push((open_secs, close_secs, beats));
    }
    eprintln!("lock-bench w5: W1 without the sessions, after round {rounds}");
    let slice = workload::run_loop(&cluster.lockd, &without_spec).await;
    without.push(slice.with_context(|| format!("W1 without the sessions after round {rounds}"))?);
    Ok(Slices {
        with,
        without,
        rounds: done,
        beats_only: beats_only.context("no round ran")?,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn each_round_is_costed_against_the_slices_without_on_either_side() {
        // Round 1 against (1,000 + 800) / 2, round 2 against (800 + 1,200) / 2, round 3
        // against (1,200 + 1,000) / 2: a slice compared with only the one before it, or with
        // the mean of all four, would give other figures.
        let costs = round_costs(
            &[855.0, 1_100.0, 880.0],
            &[1_000.0, 800.0, 1_200.0, 1_000.0],
        )
        .expect("three rounds and four slices without");
        let want = [5.0, -10.0, 20.0];
        assert_eq!(costs.per_round.len(), want.len());
        for (got, want) in costs.per_round.iter().zip(want) {
            assert!(close(*got, want), "{:?}", costs.per_round);
        }
        assert!(close(costs.median, 5.0), "{costs:?}");
        assert!(close(costs.min, -10.0), "{costs:?}");
        assert!(close(costs.max, 20.0), "{costs:?}");
    }

    #[test]
    fn the_median_of_an_even_count_of_rounds_is_the_mean_of_the_middle_two() {
        let costs = round_costs(
            &[900.0, 1_000.0, 500.0, 1_100.0],
            &[1_000.0, 1_000.0, 1_000.0, 1_000.0, 1_000.0],
        )
        .expect("four rounds and five slices without");
        // Costs 10, 0, 50, -10: sorted -10, 0, 10, 50.
        assert!(close(costs.median, 5.0), "{costs:?}");
        assert!(close(costs.min, -10.0), "{costs:?}");
        assert!(close(costs.max, 50.0), "{costs:?}");
    }

    #[test]
    fn one_round_is_its_own_median() {
        let costs = round_costs(&[750.0], &[1_000.0, 500.0]).expect("one round");
        assert!(close(costs.per_round[0], 0.0), "{costs:?}");
        assert!(close(costs.median, 0.0) && close(costs.min, 0.0) && close(costs.max, 0.0));
    }

    #[test]
    fn slices_that_do_not_alternate_have_no_round_costs() {
        assert_eq!(round_costs(&[], &[1_000.0]), None);
        assert_eq!(round_costs(&[900.0], &[1_000.0]), None);
        assert_eq!(round_costs(&[900.0], &[1_000.0, 1_000.0, 1_000.0]), None);
    }

    #[test]
    fn cost_is_the_share_lost_and_negative_for_a_gain() {
        assert!(close(cost_pct(900.0, 1_000.0), 10.0));
        assert!(close(cost_pct(1_100.0, 1_000.0), -10.0));
    }

    #[test]
    fn each_round_leaves_room_for_its_two_w1_slices() {
        assert_eq!(room(0, 1) - room(0, 3), 4 * workload::W1_WORKERS);
        assert_eq!(room(1_000, 3), room(0, 3) - 1_000);
    }
}
