//! W5 (issue 23): lockd at scale. `lock-bench --w5` starts a three-node lockd cluster the way
//! the comparison table does, then:
//!
//! 1. keeps nearly `SESSIONS_MAX` sessions alive at a third of their TTL and runs W1 with and
//!    without them over `--w5-many-rounds` rounds, each opening fresh sessions, W1 with them
//!    between two W1 slices without them (without, with, without, …, with, without), and
//!    reports W1's cost combined and per round, with the rounds' median (`many_sessions`);
//! 2. opens `--w5-sessions` sessions and fills `--w5-locks-per-session` locks on each through
//!    the `Pipeline` stream (`fill`), the sessions kept alive and the grants renewed as their
//!    TTLs need (`keepalive`);
//! 3. at checkpoints of 0, 10 %, 25 %, 50 % and 100 % of the fill (0, 100k, 250k, 500k and 1M
//!    held locks at the default size) measures every node's memory (`memory`), the idle CPU
//!    (`idle_cpu`), the nodes' Raft and snapshot figures, and W1 and W3 (`loads`), together
//!    with the fill's speed and refusals in the stretch before (`checkpoint`);
//! 4. stops a follower, forces a snapshot past it and times its catch-up (`catchup`);
//! 5. kills the leader with every lock held and times the first grant and every other call
//!    kind's return, then checks a sample of held keys kept holder and token (`failover`);
//!
//! watching every node's snapshot directory all along (`snapshots`), and writes `w5.json` and
//! `w5.md` into `--out` (`report`), then draws the checkpoints' growth curves from that
//! `w5.json` into `--out` as SVGs (`plot::w5_figures`). lockd only: etcd has no part in it.
//!
//! `cluster` and `router` are W5's view of the nodes and its clients; `held` the locks it
//! holds; `metrics` and `procfs` read a node's `/metrics` and `/proc`.

mod catchup;
mod checkpoint;
mod cluster;
mod failover;
mod fill;
mod held;
mod idle_cpu;
mod keepalive;
mod loads;
mod many_sessions;
mod memory;
mod metrics;
mod procfs;
mod report;
mod router;
mod snapshots;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lock_client::limits::{TTL_MAX, TTL_MIN};
use serde::Serialize;

use self::cluster::Cluster;
use self::report::{FillSummary, ScaleReport, Setup, SnapshotSummary};
use self::router::{Refusals, Router};
use crate::lockd::{ClientStyle, LockdCluster};
use crate::plot::figures::Outcome;
use crate::plot::w5_figures;
use crate::system::Connections;

/// Connections the fill's calls are spread over.
const FILL_CONNECTIONS: usize = 16;
/// The held fractions of the fill at which a checkpoint measures, in per mille.
const CHECKPOINTS_PER_MILLE: [usize; 5] = [0, 100, 250, 500, 1000];
/// Most fill sessions: W5 must leave room under `SESSIONS_MAX` for its other sessions.
const SESSIONS_MAX: usize = 10_000;
/// Lock slots of a fill session left for W5's probes (catch-up writes, failover grants).
const PROBE_SLOTS: usize = 24;
/// How long after the kill the failover waits for a new leader.
const LEADER_WAIT: Duration = Duration::from_secs(60);

/// W5's flags (`lock-bench --w5 …`).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct ScaleArgs {
    /// Run W5, lockd at scale (issue 23), instead of the comparison table: writes w5.json,
    /// w5.md and the growth curves' SVGs into --out.
    #[arg(long)]
    pub w5: bool,
    /// W5: sessions that hold the locks.
    #[arg(long, default_value_t = 1_000)]
    pub w5_sessions: usize,
    /// W5: locks each session holds.
    #[arg(long, default_value_t = 1_000)]
    pub w5_locks_per_session: usize,
    /// W5: idle window at each checkpoint (CPU with no lock traffic), in seconds.
    #[arg(long, default_value_t = 20.0)]
    pub w5_idle_secs: f64,
    /// W5: W1 and W3 window at each checkpoint, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub w5_load_secs: f64,
    /// W5: TTL of the holding sessions, in seconds (heartbeats every third of it).
    #[arg(long, default_value_t = 60)]
    pub w5_session_ttl_secs: u64,
    /// W5: TTL of every held grant, in seconds (renewed once half of it has passed).
    #[arg(long, default_value_t = 3_600)]
    pub w5_grant_ttl_secs: u64,
    /// W5: sessions of the many-sessions step (default: as many as fit under SESSIONS_MAX);
    /// 0 skips it.
    #[arg(long)]
    pub w5_many_sessions: Option<usize>,
    /// W5: TTL of the many sessions, in seconds (keep-alives every third of it).
    #[arg(long, default_value_t = 15)]
    pub w5_many_sessions_ttl_secs: u64,
    /// W5: W1 time with the many sessions (and as much without), in seconds: one slice with
    /// them per round, and one without them before each round and after the last.
    #[arg(long, default_value_t = 20.0)]
    pub w5_many_sessions_secs: f64,
    /// W5: rounds of the many-sessions step, each opening fresh sessions and running W1 with
    /// them between two slices without them (at least 1).
    #[arg(long, default_value_t = 3)]
    pub w5_many_rounds: usize,
    /// W5: longest the whole fill may take, in seconds; a fill that has not reached its size
    /// by then stops where it got to (and the report says so), and the steps after it run at
    /// that size.
    #[arg(long, default_value_t = 900.0)]
    pub w5_fill_max_secs: f64,
    /// W5: held keys checked after the failover.
    #[arg(long, default_value_t = 1_000)]
    pub w5_sample: usize,
}

impl ScaleArgs {
    fn validate(&self) -> Result<()> {
        let locks_max = lock_raft_store::limits::LOCKS_PER_SESSION_MAX - PROBE_SLOTS;
        if self.w5_sessions == 0 || self.w5_sessions > SESSIONS_MAX {
            bail!(
                "--w5-sessions {}: must be 1..={SESSIONS_MAX}",
                self.w5_sessions
            );
        }
        if self.w5_locks_per_session == 0 || self.w5_locks_per_session > locks_max {
            bail!(
                "--w5-locks-per-session {}: must be 1..={locks_max} (LOCKS_PER_SESSION_MAX less \
                 {PROBE_SLOTS} slots for W5's probes)",
                self.w5_locks_per_session
            );
        }
        for (flag, secs) in [
            ("--w5-session-ttl-secs", self.w5_session_ttl_secs),
            ("--w5-grant-ttl-secs", self.w5_grant_ttl_secs),
            (
                "--w5-many-sessions-ttl-secs",
                self.w5_many_sessions_ttl_secs,
            ),
        ] {
            let ttl = Duration::from_secs(secs);
            if ttl < TTL_MIN || ttl > TTL_MAX {
                bail!("{flag} {secs}: outside the server's TTL limits {TTL_MIN:?}..={TTL_MAX:?}");
            }
        }
        for (flag, secs) in [
            ("--w5-idle-secs", self.w5_idle_secs),
            ("--w5-load-secs", self.w5_load_secs),
            ("--w5-many-sessions-secs", self.w5_many_sessions_secs),
            ("--w5-fill-max-secs", self.w5_fill_max_secs),
        ] {
            if !(0.1..=3_600.0).contains(&secs) {
                bail!("{flag} {secs}: must be 0.1..=3600 seconds");
            }
        }
        if self.w5_sample == 0 {
            bail!("--w5-sample must be at least 1");
        }
        if self.w5_many_rounds == 0 {
            bail!("--w5-many-rounds must be at least 1");
        }
        Ok(())
    }
}

/// What W5 takes from lock-bench's common flags.
#[derive(Debug)]
pub struct Common<'a> {
    /// `--out`.
    pub out: &'a Path,
    /// `--data-root` (else the temporary directory).
    pub data_root: Option<&'a Path>,
    /// `--lockd-bin`.
    pub lockd_bin: Option<&'a Path>,
    /// `--insecure`.
    pub insecure: bool,
    /// `--keep-data`.
    pub keep_data: bool,
}

/// Runs W5 and writes its report into `common.out`.
pub async fn run(args: &ScaleArgs, common: Common<'_>) -> Result<()> {
    args.validate()?;
    let started = Instant::now();
    let lockd_bin = crate::procs::lockd_binary(common.lockd_bin)?;
    std::fs::create_dir_all(common.out)
        .with_context(|| format!("creating {}", common.out.display()))?;
    let data_root = common
        .data_root
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    let data = crate::procs::data_dir_in(&data_root, "lock-bench-w5-")?;
    let load_average_at_start = procfs::load_average();
    eprintln!(
        "lock-bench w5: starting three nodes ({})",
        lockd_bin.display()
    );
    let nodes_dir = data.path().join("lockd");
    let lockd = LockdCluster::start(
        &lockd_bin,
        &nodes_dir,
        ClientStyle::Pipeline,
        Connections::PerWorker,
        !common.insecure,
    )
    .await?;
    let mut cluster = Cluster::new(lockd, &nodes_dir).await?;
    let mut report = ScaleReport {
        tool: w5_figures::TOOL,
        format: w5_figures::FORMAT,
        setup: Setup {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            lockd_bin: lockd_bin.display().to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_average_at_start,
            load_average_at_end: String::new(),
            data_filesystem: crate::filesystem_of(&data_root),
            sessions: args.w5_sessions,
            locks_per_session: args.w5_locks_per_session,
            snapshot_logs_since_last: snapshot_logs_since_last(),
            run_secs: 0.0,
        },
        nodes_at_start: checkpoint::node_states(&cluster).await,
        many_sessions: None,
        fill: None,
        checkpoints: Vec::new(),
        catch_up: None,
        failover: None,
        keepalive: None,
        keepalive_refusals: Default::default(),
        snapshots: SnapshotSummary::new(Vec::new(), &[]),
        nodes_at_end: Vec::new(),
        errors: Vec::new(),
    };
    let watch = snapshots::SnapshotWatch::start(
        cluster
            .nodes
            .iter()
            .map(|n| (n.id, n.data_dir.clone()))
            .collect(),
    );
    let steps = steps(args, &mut cluster, &mut report, common.out).await;
    if let Err(e) = steps {
        report.errors.push(format!("{e:#}"));
    }
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    report.snapshots = SnapshotSummary::new(watch.stop().await, &ids);
    report.nodes_at_end = checkpoint::node_states(&cluster).await;
    let stopped = cluster.lockd.stop().await;
    report.setup.load_average_at_end = procfs::load_average();
    report.setup.run_secs = started.elapsed().as_secs_f64();
    let json = write_report(&report, common.out)?;
    println!("{}", report.markdown());
    let plotted = draw_plots(&json, common.out);
    if common.keep_data || !report.errors.is_empty() {
        eprintln!(
            "lock-bench w5: node data and logs kept in {}",
            data.keep().display()
        );
    }
    if !report.errors.is_empty() {
        bail!(
            "W5: {} step(s) failed: {}",
            report.errors.len(),
            report.errors.join("; ")
        );
    }
    // A node killed by the failover stops as an already-reaped process, so this is the others.
    stopped.context("stopping lockd")?;
    plotted
}

/// Draws W5's growth curves into `out` from the w5.json text `json` just written, exactly as
/// `lock-bench plot --in w5.json` would; a plot without its data is skipped with the reason.
fn draw_plots(json: &str, out: &Path) -> Result<()> {
    let drawn = w5_figures::W5Report::parse(json)
        .and_then(|report| w5_figures::write_all(&report, out))
        .context("drawing W5's plots");
    for outcome in drawn.as_deref().unwrap_or_default() {
        match outcome {
            Outcome::Written(path) => eprintln!("lock-bench w5: wrote {}", path.display()),
            Outcome::Skipped(file, why) => eprintln!("lock-bench w5: no {file}: {why}"),
        }
    }
    if let Err(e) = &drawn {
        eprintln!("lock-bench w5: {e:#}");
    }
    drawn.map(drop)
}

/// `snapshot_logs_since_last` of the nodes: `LOCKD_SNAPSHOT_LOGS_SINCE_LAST` if this process
/// has it (the nodes inherit the environment), else lockd's default.
fn snapshot_logs_since_last() -> u64 {
    std::env::var("LOCKD_SNAPSHOT_LOGS_SINCE_LAST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(lockd::config::SNAPSHOT_LOGS_SINCE_LAST_DEFAULT)
}

/// Writes `report` as w5.json and w5.md into `out`; answers the JSON text.
fn write_report(report: &ScaleReport, out: &Path) -> Result<String> {
    let json = serde_json::to_string_pretty(report).context("encoding the W5 report")?;
    let (json_path, md_path) = (out.join(report::JSON_FILE), out.join(report::MARKDOWN_FILE));
    std::fs::write(&json_path, &json)
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(&md_path, report.markdown())
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(json)
}

/// W5's steps in order, each into `report` as it completes (and the report written after
/// each checkpoint, so a long run shows its figures early). A step that fails is noted and
/// the steps that do not need it still run.
async fn steps(
    args: &ScaleArgs,
    cluster: &mut Cluster,
    report: &mut ScaleReport,
    out: &Path,
) -> Result<()> {
    if args.w5_many_sessions != Some(0) {
        eprintln!("lock-bench w5: many sessions");
        match many_sessions::measure(
            cluster,
            args.w5_many_sessions,
            Duration::from_secs(args.w5_many_sessions_ttl_secs),
            args.w5_many_sessions_secs,
            args.w5_many_rounds,
        )
        .await
        {
            Ok(m) => report.many_sessions = Some(m),
            Err(e) => report.errors.push(format!("many sessions: {e:#}")),
        }
        // Whoever leads now leads the fill (a refusing leader may have lost its term).
        cluster.await_leader(None, LEADER_WAIT).await?;
        write_report(report, out)?;
    }

    let session_ttl = Duration::from_secs(args.w5_session_ttl_secs);
    let grant_ttl = Duration::from_secs(args.w5_grant_ttl_secs);
    let fill_refusals = Arc::new(Refusals::default());
    let routers = (0..FILL_CONNECTIONS)
        .map(|_| Router::new(cluster, fill_refusals.clone()).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    eprintln!("lock-bench w5: opening {} sessions", args.w5_sessions);
    let ids = fill::open_sessions(
        &routers,
        "w5-holder",
        args.w5_sessions,
        session_ttl.as_millis() as u64,
    )
    .await
    .context("opening the fill's sessions")?;
    let held = Arc::new(held::Held::new(
        ids,
        args.w5_locks_per_session,
        grant_ttl.as_millis() as u64,
    ));
    let keep_refusals = Arc::new(Refusals::default());
    let keepalive = keepalive::KeepAlive::start(
        Arc::new(Router::new(cluster, keep_refusals.clone())?),
        held.clone(),
        session_ttl,
        grant_ttl,
    );
    let outcome = fill_and_measure(args, cluster, report, out, &routers, &held).await;
    report.keepalive = Some(keepalive.stop().await);
    report.keepalive_refusals = keep_refusals.counts();
    outcome
}

/// The fill with its checkpoints, then the catch-up and the failover.
async fn fill_and_measure(
    args: &ScaleArgs,
    cluster: &mut Cluster,
    report: &mut ScaleReport,
    out: &Path,
    routers: &[Arc<Router>],
    held: &Arc<held::Held>,
) -> Result<()> {
    let before = checkpoint::node_states(cluster).await;
    let mut targets: Vec<usize> = CHECKPOINTS_PER_MILLE
        .iter()
        .map(|m| held.total() * m / 1000)
        .collect();
    targets.dedup();
    let (mut secs, mut failed) = (0.0, 0);
    let deadline = Instant::now() + Duration::from_secs_f64(args.w5_fill_max_secs);
    for target in targets {
        if held.filled() < target && Instant::now() > deadline {
            report.errors.push(format!(
                "fill: stopped at {} of {} locks after --w5-fill-max-secs {} s",
                held.filled(),
                held.total(),
                args.w5_fill_max_secs
            ));
            break;
        }
        let stretch = if target > held.filled() {
            eprintln!("lock-bench w5: filling to {target} locks");
            let stretch = fill::fill_to(routers, held, target, held.grant_ttl_ms, deadline).await?;
            eprintln!(
                "lock-bench w5: {} locks in {:.1} s ({:.0}/s), refusals {:?}",
                stretch.to - stretch.from,
                stretch.secs,
                stretch.locks_per_sec,
                stretch
                    .refusals
                    .iter()
                    .map(|(k, c)| (k, c.count))
                    .collect::<Vec<_>>()
            );
            secs += stretch.secs;
            failed += stretch.failed;
            Some(stretch)
        } else {
            None
        };
        eprintln!("lock-bench w5: checkpoint at {} held locks", held.filled());
        let checkpoint = checkpoint::measure(
            cluster,
            held.filled(),
            stretch,
            Duration::from_secs_f64(args.w5_idle_secs),
            args.w5_load_secs,
        )
        .await;
        report.checkpoints.push(checkpoint);
        write_report(report, out)?;
    }
    let after = checkpoint::node_states(cluster).await;
    let term = |n: &checkpoint::NodeState| n.metrics.as_ref().and_then(|m| m.term);
    let changes = |n: &checkpoint::NodeState| n.metrics.as_ref().and_then(|m| m.leader_changes);
    report.fill = Some(FillSummary {
        locks: held.filled(),
        secs,
        locks_per_sec: if secs > 0.0 {
            held.filled() as f64 / secs
        } else {
            0.0
        },
        refusals: routers[0].refusals.counts(),
        failed,
        terms: before
            .iter()
            .zip(&after)
            .map(|(b, a)| (b.node_id, term(b), term(a)))
            .collect(),
        leader_changes: before
            .iter()
            .zip(&after)
            .map(|(b, a)| {
                (
                    b.node_id,
                    changes(a).zip(changes(b)).map(|(a, b)| a.saturating_sub(b)),
                )
            })
            .collect(),
    });
    write_report(report, out)?;

    eprintln!("lock-bench w5: follower catch-up");
    cluster.await_leader(None, LEADER_WAIT).await?;
    let entries = snapshot_logs_since_last() * 3 / 2 + 100;
    match catchup::measure(cluster, &routers[0], held, entries).await {
        Ok(c) => report.catch_up = Some(c),
        Err(e) => report.errors.push(format!("catch-up: {e:#}")),
    }
    write_report(report, out)?;

    eprintln!("lock-bench w5: failover with {} locks held", held.filled());
    cluster.await_leader(None, LEADER_WAIT).await?;
    match failover::measure(cluster, held.clone(), args.w5_sample).await {
        Ok(f) => report.failover = Some(f),
        Err(e) => {
            report.errors.push(format!("failover: {e:#}"));
            // Re-point at whichever node leads now, for the report's last scrape.
            let _ = cluster.await_leader(None, LEADER_WAIT).await;
        }
    }
    write_report(report, out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// W5's flags alone, as lock-bench flattens them into its own.
    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        scale: ScaleArgs,
    }

    fn flags(args: &[&str]) -> ScaleArgs {
        Flags::try_parse_from(std::iter::once("lock-bench").chain(args.iter().copied()))
            .expect("the flags parse")
            .scale
    }

    #[test]
    fn the_many_sessions_step_runs_three_rounds_unless_told_and_at_least_one() {
        let default = flags(&[]);
        assert_eq!(default.w5_many_rounds, 3);
        default.validate().expect("the defaults are valid");
        let one = flags(&["--w5-many-rounds", "1"]);
        assert_eq!(one.w5_many_rounds, 1);
        one.validate().expect("one round is valid");
        let error = flags(&["--w5-many-rounds", "0"])
            .validate()
            .expect_err("no round");
        assert!(error.to_string().contains("--w5-many-rounds"), "{error}");
    }
}
