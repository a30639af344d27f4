//! Outages held for a while, under a light steady load: a follower killed and left down, the
//! leader killed and left down, a follower paused (SIGSTOP), a follower partitioned from the
//! other two. Each fault lasts [`OUTAGE_SECS_ENV`] seconds (30 by default).
//!
//! These tests are about the cost of a fault over time (issue 17, docs/DESIGN.md "D-cost"): a
//! node that cannot reach a peer must not spin a core retrying, flood its log, or leak memory
//! or sockets, however long the peer stays away. What must hold for each scenario:
//!
//! - the cluster keeps serving: the load's operations succeed in the later half of the fault;
//! - every node still running (and not paused) spends at most [`CPU_EXTRA_CORE_SHARE_MAX`] of
//!   one core more than it did in a baseline window with every node up, grows its log by at
//!   most [`LOG_BYTES_PER_30_SECS_MAX`] per 30 s, its resident memory by less than
//!   [`RSS_GROWTH_BYTES_MAX`] and its open descriptors by less than [`FDS_GROWTH_MAX`];
//! - once the fault ends, the faulted node has applied what the leader has within
//!   [`CATCH_UP_WAIT`].
//!
//! Every figure is printed, on success too; a failure lists all of them, not just the first
//! bound broken. The bounds are guards against spinning and leaking, not benchmarks: CPU is
//! compared with the same node's own baseline under the same load, so a busy machine (which
//! slows the node but does not make it burn more CPU time) does not fail them.
//!
//! Longer runs: `LOCKD_OUTAGE_SECS=600 cargo test -p lock-tests --test t35_outages -- --nocapture`
//! (nextest's profile kills a test after 5 minutes; `cargo test` has no such limit).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_tests::{
    Cluster, ClusterClient, ClusterConfig, LockError, NodeClient, ProcGrowth, ProcStats, Role,
    Session, poll_until,
};

/// Environment variable: how long each fault is held, in whole seconds.
const OUTAGE_SECS_ENV: &str = "LOCKD_OUTAGE_SECS";

/// How long each fault is held unless [`OUTAGE_SECS_ENV`] says otherwise: long enough that a
/// retry loop without backoff shows as seconds of CPU and megabytes of log, short enough for
/// a test suite.
const OUTAGE_SECS_DEFAULT: u64 = 30;

/// The shortest fault accepted: several failovers long, so that "the later half of the fault"
/// begins after the cluster has settled.
const OUTAGE_SECS_MIN: u64 = 10;

/// The baseline window is as long as the fault, but no longer than this; a longer fault's CPU
/// bound scales the baseline's rate.
const BASELINE_MAX: Duration = Duration::from_secs(30);

/// How much more CPU than its own baseline rate a node may use during the fault, as a share of
/// one core over the fault's length. A node that retries a dead peer with backoff costs a few
/// percent at most; one without backoff costs most of a core (issue 17: 81–94 %).
const CPU_EXTRA_CORE_SHARE_MAX: f64 = 0.25;

/// Log bytes a node may write per 30 s of fault. A node that logs each change of a peer's
/// state once and summarises repeats writes a few lines of a few hundred bytes per peer and
/// summary period, well under this (about forty such lines). A WARN per failed attempt does
/// not fit: against a refused connection that is megabytes per second (issue 17: ~21 MB/s),
/// and even one WARN per heartbeat to a peer that times out (paused or partitioned) is about
/// 190 lines, 31 KiB, per 30 s at the test heartbeat of 150 ms, which over a day of outage is
/// 90 MB.
const LOG_BYTES_PER_30_SECS_MAX: u64 = 16 * 1024;

/// How much a node's resident memory may grow over the fault.
const RSS_GROWTH_BYTES_MAX: i64 = 64 * 1024 * 1024;

/// How many more descriptors a node may hold at the end of the fault than at its start: a few
/// reconnections in flight are fine, a socket per retry is not.
const FDS_GROWTH_MAX: i64 = 64;

/// How long the faulted node may take, from its restart's ready line (or SIGCONT, or the heal)
/// to having applied what the leader has applied.
const CATCH_UP_WAIT: Duration = Duration::from_secs(20);

/// How often the load runs one round: heartbeat, try-acquire, release (three operations), so a
/// few operations per second.
const LOAD_PERIOD: Duration = Duration::from_millis(400);

/// The keys the load takes in turn.
const LOAD_KEYS: [&str; 3] = ["outage/a", "outage/b", "outage/c"];

/// Lease of the load's session and grants: a few failovers long, so one failover does not
/// lose the session.
const LOAD_TTL: Duration = Duration::from_secs(10);

/// How long one load operation keeps retrying (at other nodes) before it counts as failed.
const LOAD_RETRY_FOR: Duration = Duration::from_secs(3);

/// Successful load operations seen before the baseline starts (the load is in its stride).
const LOAD_WARM_OPS: u64 = 10;

/// How long the load may take to reach [`LOAD_WARM_OPS`] on a fresh cluster.
const LOAD_WARM_WAIT: Duration = Duration::from_secs(30);

/// How long one `Status` probe of the catch-up check may take (a node just restarted or
/// continued may be slow to answer its first call).
const STATUS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Load errors kept for the report.
const LOAD_ERRORS_KEPT: usize = 5;

/// A liveness bound on the next leader after the leader is killed (not a speed claim; the
/// failover speed is t30's subject).
const NEXT_LEADER_WAIT: Duration = Duration::from_secs(20);

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The four faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL a follower; restart it at the end.
    KillFollower,
    /// SIGKILL the leader; restart it at the end.
    KillLeader,
    /// SIGSTOP a follower; SIGCONT it at the end.
    PauseFollower,
    /// Cut every Raft link of a follower (both ways, like a DROP rule); heal at the end.
    IsolateFollower,
}

impl Fault {
    fn describe(self, target: u64) -> String {
        match self {
            Fault::KillFollower => format!("follower {target} SIGKILLed, left down"),
            Fault::KillLeader => format!("leader {target} SIGKILLed, left down"),
            Fault::PauseFollower => format!("follower {target} SIGSTOPped"),
            Fault::IsolateFollower => format!("follower {target} partitioned from the others"),
        }
    }

    /// Whether the faulted node runs (and is measured) during the fault.
    fn target_measured(self) -> bool {
        self == Fault::IsolateFollower
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_follower_killed_and_left_down_costs_the_others_little() {
    run_outage(Fault::KillFollower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_leader_killed_and_left_down_costs_the_others_little() {
    run_outage(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_paused_follower_costs_the_others_little() {
    run_outage(Fault::PauseFollower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_partitioned_follower_costs_every_node_little() {
    run_outage(Fault::IsolateFollower).await;
}

/// The fault's length, from [`OUTAGE_SECS_ENV`] or the default.
///
/// # Panics
/// If the variable is set but not a whole number of seconds of at least [`OUTAGE_SECS_MIN`].
fn outage() -> Duration {
    let secs = match std::env::var(OUTAGE_SECS_ENV) {
        Err(_) => OUTAGE_SECS_DEFAULT,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(secs) if secs >= OUTAGE_SECS_MIN => secs,
            _ => panic!(
                "{OUTAGE_SECS_ENV}={text:?}: expected whole seconds, at least {OUTAGE_SECS_MIN}"
            ),
        },
    };
    Duration::from_secs(secs)
}

async fn run_outage(fault: Fault) {
    let outage = outage();
    let baseline_len = outage.min(BASELINE_MAX);
    let config = ClusterConfig {
        proxied_links: fault == Fault::IsolateFollower,
        ..ClusterConfig::default()
    };
    let mut cluster = Cluster::start_with(config).await;
    let load = Load::start(cluster.cluster_client());
    poll_until("the load to warm up", LOAD_WARM_WAIT, || {
        let ok = load.log.ok_total();
        async move {
            if ok >= LOAD_WARM_OPS {
                Ok(())
            } else {
                Err(format!("{ok} successful operations"))
            }
        }
    })
    .await
    .expect("the load runs on a healthy cluster");

    // The baseline: every node up, the same load. Both windows are measurement periods whose
    // length is the point, so they are timed, not awaited conditions.
    let all = cluster.ids();
    let baseline_start = sample_nodes(&cluster, &all);
    tokio::time::sleep(baseline_len).await;
    let baseline_end = sample_nodes(&cluster, &all);

    let target = match fault {
        Fault::KillLeader => cluster.leader().await,
        _ => *cluster
            .followers()
            .await
            .last()
            .expect("a three-node cluster has followers"),
    };
    let measured: Vec<u64> = all
        .iter()
        .copied()
        .filter(|&id| id != target || fault.target_measured())
        .collect();
    let fault_start = sample_nodes(&cluster, &measured);
    let faulted_at = Instant::now();
    match fault {
        Fault::KillFollower | Fault::KillLeader => cluster.kill(target),
        Fault::PauseFollower => cluster.pause(target),
        Fault::IsolateFollower => cluster.isolate(target),
    }
    let next_leader = if fault == Fault::KillLeader {
        let leader = cluster
            .wait_for_leader(NEXT_LEADER_WAIT)
            .await
            .expect("a leader among the survivors");
        Some((leader, faulted_at.elapsed()))
    } else {
        None
    };
    tokio::time::sleep_until((faulted_at + outage).into()).await;
    let fault_end = sample_nodes(&cluster, &measured);
    let fault_end_at = Instant::now();
    let later_half = faulted_at + outage / 2;
    let ok_in_fault = load.log.ok_between(faulted_at, fault_end_at);
    let ok_in_later_half = load.log.ok_between(later_half, fault_end_at);
    let failed_in_fault = load.log.failed_total();

    match fault {
        Fault::KillFollower | Fault::KillLeader => cluster.start_node(target).await,
        Fault::PauseFollower => cluster.resume(target),
        Fault::IsolateFollower => cluster.heal(),
    }
    let healed_at = Instant::now();
    let catch_up = caught_up(&cluster, target).await;
    let catch_up_took = healed_at.elapsed();
    let ok_after_heal = load.log.ok_between(healed_at, Instant::now());
    let load_errors = load.log.last_errors();
    load.stop().await;

    // ---- the figures and the bounds --------------------------------------------------------
    let scale = outage.as_secs_f64() / baseline_len.as_secs_f64();
    let log_bound = LOG_BYTES_PER_30_SECS_MAX * outage.as_secs().div_ceil(30);
    let mut violations = Vec::new();
    let mut report = format!(
        "t35 {fault:?}: {} for {:.1} s (baseline window {:.1} s, clock ticks {} /s)\n",
        fault.describe(target),
        outage.as_secs_f64(),
        baseline_len.as_secs_f64(),
        lock_tests::proc_stats::clock_ticks_per_second(),
    );
    if let Some((leader, after)) = next_leader {
        let _ = writeln!(
            report,
            "  next leader: node {leader}, agreed after {:.2} s",
            after.as_secs_f64()
        );
    }
    let _ = writeln!(
        report,
        "  load: {ok_in_fault} ok during the fault, {ok_in_later_half} in its later half \
         (bound > 0); {failed_in_fault} failed in all; {ok_after_heal} ok after the end of \
         the fault; last errors {load_errors:?}"
    );
    if ok_in_later_half == 0 {
        violations.push(format!(
            "no load operation succeeded in the later half of the fault ({:.1} s)",
            (outage / 2).as_secs_f64()
        ));
    }
    for &id in &measured {
        let baseline = baseline_end[&id].since(&baseline_start[&id]);
        let during = fault_end[&id].since(&fault_start[&id]);
        let cpu_bound = baseline.proc.cpu.as_secs_f64() * scale
            + CPU_EXTRA_CORE_SHARE_MAX * outage.as_secs_f64();
        let cpu = during.proc.cpu.as_secs_f64();
        let _ = writeln!(
            report,
            "  node {id}{}: cpu baseline {:.2} s, fault {cpu:.2} s ({:.0} % of a core; bound \
             {cpu_bound:.2} s) | log baseline {:.1} KiB, fault {:.1} KiB (bound {:.0} KiB) | \
             rss {:.1} -> {:.1} MiB ({:+.1}; bound +{:.0}) | fds {} -> {} ({:+}; bound +{})",
            if id == target { " (faulted)" } else { "" },
            baseline.proc.cpu.as_secs_f64(),
            100.0 * cpu / outage.as_secs_f64(),
            baseline.log_bytes as f64 / KIB,
            during.log_bytes as f64 / KIB,
            log_bound as f64 / KIB,
            fault_start[&id].proc.rss_bytes as f64 / MIB,
            fault_end[&id].proc.rss_bytes as f64 / MIB,
            during.proc.rss_bytes as f64 / MIB,
            RSS_GROWTH_BYTES_MAX as f64 / MIB,
            fault_start[&id].proc.open_fds,
            fault_end[&id].proc.open_fds,
            during.proc.open_fds,
            FDS_GROWTH_MAX,
        );
        if cpu > cpu_bound {
            violations.push(format!(
                "node {id} used {cpu:.2} s of CPU in the fault, bound {cpu_bound:.2} s"
            ));
        }
        if during.log_bytes > log_bound {
            violations.push(format!(
                "node {id} logged {} bytes in the fault, bound {log_bound}",
                during.log_bytes
            ));
        }
        if during.proc.rss_bytes >= RSS_GROWTH_BYTES_MAX {
            violations.push(format!(
                "node {id}'s RSS grew by {:.1} MiB, bound {:.0}",
                during.proc.rss_bytes as f64 / MIB,
                RSS_GROWTH_BYTES_MAX as f64 / MIB
            ));
        }
        if during.proc.open_fds >= FDS_GROWTH_MAX {
            violations.push(format!(
                "node {id}'s open fds grew by {}, bound {FDS_GROWTH_MAX}",
                during.proc.open_fds
            ));
        }
    }
    match &catch_up {
        Ok(seen) => {
            let _ = writeln!(
                report,
                "  catch-up: {seen} {:.2} s after the fault ended (bound {:.0} s)",
                catch_up_took.as_secs_f64(),
                CATCH_UP_WAIT.as_secs_f64()
            );
        }
        Err(e) => {
            let _ = writeln!(report, "  catch-up: FAILED: {e}");
            violations.push(format!("node {target} did not catch up: {e}"));
        }
    }
    println!("{report}");
    assert!(
        violations.is_empty(),
        "{} bound(s) broken:\n  {}\n{report}",
        violations.len(),
        violations.join("\n  ")
    );
}

// ---- measuring a node -------------------------------------------------------------------------

/// One node's cost counters at one moment.
#[derive(Clone, Copy, Debug)]
struct NodeSample {
    proc: ProcStats,
    /// Bytes of its stdout and stderr logs together.
    log_bytes: u64,
}

/// What changed between two samples of one node.
#[derive(Clone, Copy, Debug)]
struct NodeGrowth {
    proc: ProcGrowth,
    log_bytes: u64,
}

impl NodeSample {
    fn since(&self, earlier: &NodeSample) -> NodeGrowth {
        NodeGrowth {
            proc: self.proc.growth_since(&earlier.proc),
            log_bytes: self.log_bytes.saturating_sub(earlier.log_bytes),
        }
    }
}

/// Samples every node in `ids`, which must be running.
///
/// # Panics
/// If a node has no process or its `/proc` entry or logs cannot be read.
fn sample_nodes(cluster: &Cluster, ids: &[u64]) -> BTreeMap<u64, NodeSample> {
    ids.iter()
        .map(|&id| {
            let pid = cluster
                .pid(id)
                .unwrap_or_else(|| panic!("node {id} has no process to sample"));
            let proc = ProcStats::sample(pid).unwrap_or_else(|e| panic!("node {id}: {e}"));
            let log_bytes = [cluster.stdout_path(id), cluster.log_path(id)]
                .iter()
                .map(|path| match std::fs::metadata(path) {
                    Ok(meta) => meta.len(),
                    Err(e) => panic!("node {id}: cannot stat {}: {e}", path.display()),
                })
                .sum();
            (id, NodeSample { proc, log_bytes })
        })
        .collect()
}

/// Waits until `target` has applied at least what the leader had applied when asked just
/// before it (the load keeps writing, so "at least the leader's index of a moment ago" is
/// what "caught up" can mean). Returns what it saw.
async fn caught_up(cluster: &Cluster, target: u64) -> Result<String, String> {
    let clients: Vec<(u64, NodeClient)> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.client(id)))
        .collect();
    poll_until(
        &format!("node {target} to apply what the leader has applied"),
        CATCH_UP_WAIT,
        || {
            let clients = clients.clone();
            async move {
                let mut leader = None;
                for (id, client) in clients.iter().filter(|(id, _)| *id != target) {
                    if let Ok(Ok(s)) =
                        tokio::time::timeout(STATUS_PROBE_TIMEOUT, client.status()).await
                        && s.role() == Role::Leader
                        && leader.is_none_or(|(_, term, _)| s.current_term > term)
                    {
                        leader = Some((*id, s.current_term, s.applied_index));
                    }
                }
                let (leader, _, leader_applied) =
                    leader.ok_or("no node other than the target says it is the leader")?;
                let client = clients
                    .iter()
                    .find_map(|(id, c)| (*id == target).then_some(c))
                    .ok_or("the target has no client")?;
                match tokio::time::timeout(STATUS_PROBE_TIMEOUT, client.status()).await {
                    Ok(Ok(s)) if s.applied_index >= leader_applied => Ok(format!(
                        "node {target} applied {} >= leader {leader}'s {leader_applied}",
                        s.applied_index
                    )),
                    Ok(Ok(s)) => Err(format!(
                        "node {target} applied {}, leader {leader} {leader_applied}",
                        s.applied_index
                    )),
                    Ok(Err(e)) => Err(format!("node {target}: Status failed: {e}")),
                    Err(_) => Err(format!("node {target}: no Status answer")),
                }
            }
        },
    )
    .await
    .map_err(|e| e.to_string())
}

// ---- the load ---------------------------------------------------------------------------------

/// What the load saw.
#[derive(Debug, Default)]
struct LoadLog {
    /// When each successful operation was answered.
    ok_at: Mutex<Vec<Instant>>,
    failed: AtomicU64,
    last_errors: Mutex<VecDeque<String>>,
}

impl LoadLog {
    fn ok(&self) {
        self.ok_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Instant::now());
    }

    fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.last_errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() == LOAD_ERRORS_KEPT {
            errors.pop_front();
        }
        errors.push_back(format!("{what}: {error}"));
    }

    fn ok_total(&self) -> u64 {
        let ok = self.ok_at.lock().unwrap_or_else(|p| p.into_inner()).len();
        u64::try_from(ok).unwrap_or(u64::MAX)
    }

    fn ok_between(&self, from: Instant, to: Instant) -> usize {
        self.ok_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|&&at| at >= from && at <= to)
            .count()
    }

    fn failed_total(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    fn last_errors(&self) -> Vec<String> {
        self.last_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// A light steady load in a background task: every [`LOAD_PERIOD`], heartbeat one session,
/// try-acquire the next of [`LOAD_KEYS`] and release it, through a leader-following client.
struct Load {
    log: Arc<LoadLog>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(client: ClusterClient) -> Self {
        let log = Arc::new(LoadLog::default());
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run_load(
            client.with_retry_for(LOAD_RETRY_FOR),
            stop.clone(),
            log.clone(),
        ));
        Self { log, stop, task }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        // One round is at most a few retried calls.
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the load stops")
            .expect("the load task did not panic");
    }
}

async fn run_load(client: ClusterClient, stop: Arc<AtomicBool>, log: Arc<LoadLog>) {
    let mut session: Option<Session> = None;
    let mut ticks = tokio::time::interval(LOAD_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for round in 0usize.. {
        ticks.tick().await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let open = match &session {
            Some(open) => open.clone(),
            None => match client.open_session("outage-load", LOAD_TTL).await {
                Ok(opened) => {
                    log.ok();
                    session = Some(opened.clone());
                    opened
                }
                Err(e) => {
                    log.failed("OpenSession", &e);
                    continue;
                }
            },
        };
        match client.heartbeat(&open.id).await {
            Ok(true) => log.ok(),
            Ok(false) => {
                // The session lapsed (e.g. the failover outlasted it): open another.
                log.failed("Heartbeat", &"session gone");
                session = None;
                continue;
            }
            Err(e) => {
                log.failed("Heartbeat", &e);
                continue;
            }
        }
        let key = LOAD_KEYS[round % LOAD_KEYS.len()];
        match client.try_acquire(&open.id, key, LOAD_TTL).await {
            // `None`: the key is still held by a grant of this load whose release had an
            // unknown outcome; an answer all the same, and its lease ends it.
            Ok(None) => log.ok(),
            Ok(Some(grant)) => {
                log.ok();
                match client.release(&open.id, key, grant.fencing_token).await {
                    Ok(_) => log.ok(),
                    Err(e) => log.failed("Release", &e),
                }
            }
            Err(e @ (LockError::Contention { .. } | LockError::NotLeader { .. })) => {
                log.failed("TryAcquire", &e);
            }
            Err(e) => {
                // Anything else means the session is no longer usable: start a new one.
                log.failed("TryAcquire", &e);
                session = None;
            }
        }
    }
}
