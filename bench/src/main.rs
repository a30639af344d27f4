//! `lock-bench`: runs the same lock workloads against a three-node lockd cluster and a
//! three-node etcd cluster, one after the other in one invocation, and prints one table with
//! lockd/etcd ratios per row (issue 7). `--help` lists the flags.
//!
//! ```text
//! cargo build --release -p lockd
//! cargo run --release -p lock-bench -- --out bench-results/
//! ```
//!
//! # Layout
//!
//! - `procs`: free ports, binaries, node processes.
//! - `system`: the seam — what a workload needs from a lock system.
//! - `lockd`, `etcd`: the two systems (cluster start/stop, workers, keep-alive loads).
//! - `workload`: W1–W4, written once against the seam.
//! - `floors`: fdatasync and gRPC loopback round trip.
//! - `stats`: percentiles. `report`: rows, targets, markdown and JSON.
//! - `scraper`: a once-a-second scraper of every lockd node's `/metrics`, and W3/W1 with and
//!   without it (`--scrape-rounds`).

#![forbid(unsafe_code)]

mod etcd;
mod floors;
mod lockd;
mod procs;
mod report;
mod scale;
mod scraper;
mod stats;
mod system;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use serde::Serialize;

use crate::floors::Floors;
use crate::report::{Row, SystemResults};
use crate::system::LockSystem;
use crate::workload::{Keys, LoopSpec};

/// Name of the JSON report in `--out`.
pub const JSON_FILE: &str = "results.json";
/// Name of the markdown table in `--out`.
pub const MARKDOWN_FILE: &str = "results.md";
/// Default TTL of a W4 background session: keep-alives every 5 s, so 10,000 sessions send
/// 2,000 keep-alives/s.
const W4_SESSION_TTL_SECS_DEFAULT: u64 = 15;
/// W4 rounds of one slice without and one with the sessions: two, so that the order
/// alternates once (without, with, with, without).
const W4_ROUNDS_DEFAULT: usize = 2;
/// W4 session TTL in `--quick` mode: keep-alives every second, so the short run sees them.
const W4_SESSION_TTL_SECS_QUICK: u64 = 3;

/// A lock system the benchmark can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum SystemName {
    /// Three `lockd run` processes.
    Lockd,
    /// Three `etcd` (Debian etcd-server) processes.
    Etcd,
}

/// Benchmarks lockd against etcd on this machine (issue 7).
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "lock-bench", version)]
struct Args {
    /// Directory for results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Internal: serve the TCP echo of the cross-process round-trip floor (the tool starts a
    /// second copy of itself with this flag) and exit.
    #[arg(long, hide = true)]
    #[serde(skip)]
    tcp_echo: bool,
    /// Systems to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lockd,etcd")]
    systems: Vec<SystemName>,
    /// A few seconds per workload and 1,000 W4 sessions: proves the tool works, not speed.
    #[arg(long)]
    quick: bool,
    /// Unmeasured warm-up before each workload, in seconds.
    #[arg(long)]
    warmup_secs: Option<f64>,
    /// W1 measured window, in seconds.
    #[arg(long)]
    w1_secs: Option<f64>,
    /// W2 measured window, in seconds.
    #[arg(long)]
    w2_secs: Option<f64>,
    /// W3 measured window, in seconds.
    #[arg(long)]
    w3_secs: Option<f64>,
    /// W4 measured time with the sessions (and as much without them), in seconds, split over
    /// `--w4-rounds` rounds.
    #[arg(long)]
    w4_secs: Option<f64>,
    /// W4 rounds: each runs one W1 slice without and one with the sessions (opened before it,
    /// closed after), in alternating order (default 2).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=20))]
    w4_rounds: Option<u16>,
    /// W4 background sessions.
    #[arg(long)]
    w4_sessions: Option<usize>,
    /// W4 session TTL in seconds (default 15, 3 with --quick); each keeps alive every third
    /// of it.
    #[arg(long)]
    w4_session_ttl_secs: Option<u64>,
    /// Where the clusters' temporary data directories go; must be a real disk, not tmpfs.
    #[arg(long, env = "LOCK_BENCH_DATA_ROOT")]
    data_root: Option<PathBuf>,
    /// The lockd binary (default: $LOCKD_BIN, else lockd next to this executable).
    #[arg(long)]
    lockd_bin: Option<PathBuf>,
    /// How lockd workers send acquire and release: on one `Pipeline` stream per worker, as
    /// the SDK does, or as unary calls (the comparison behind bench/PERFORMANCE.md).
    #[arg(long, value_enum, default_value = "pipeline")]
    lockd_calls: lockd::LockdCalls,
    /// Whether the workers of W1–W3 each have their own connection to the leader or share one
    /// (for both systems alike).
    #[arg(long, value_enum, default_value = "per-worker")]
    connections: system::Connections,
    /// Worker threads of the benchmark's own async runtime, which runs every worker of both
    /// systems (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    client_threads: Option<u16>,
    /// The etcd binary (default: $ETCD_BIN, else /usr/bin/etcd).
    #[arg(long)]
    etcd_bin: Option<PathBuf>,
    /// Keep the data directories (and node logs) after the run.
    #[arg(long)]
    keep_data: bool,
    /// After lockd's workloads, run W3 and W1 this many rounds each without and with a
    /// scraper polling every node's /metrics once a second, in alternating order, and report
    /// the difference (issue 20). 0 (the default) skips it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=20))]
    scrape_rounds: u16,
    /// Run only the scrape comparison on lockd (needs --scrape-rounds): no etcd, W2 or W4.
    #[arg(long)]
    scrape_only: bool,
    /// Run the lockd nodes `--insecure` (plaintext). By default they serve TLS with a CA minted
    /// for the run and every connection presents a client certificate; running both ways
    /// measures what TLS costs (bench/PERFORMANCE.md).
    #[arg(long)]
    insecure: bool,
    /// W5 (`--w5` and its `--w5-*` flags): lockd at scale, instead of the table.
    #[command(flatten)]
    scale: scale::ScaleArgs,
}

/// Durations and sizes after applying `--quick` and the per-workload flags.
#[derive(Debug, Clone, Serialize)]
struct Plan {
    warmup_secs: f64,
    w1_secs: f64,
    w2_secs: f64,
    w3_secs: f64,
    w4_secs: f64,
    w4_rounds: usize,
    w4_sessions: usize,
    w4_session_ttl_secs: u64,
    fdatasync_samples: usize,
    round_trip_samples: usize,
    /// `--client-threads`; `None` is one per CPU.
    client_threads: Option<u16>,
}

impl Plan {
    fn from_args(args: &Args) -> Self {
        let (warmup, w1, w2, w3, w4, sessions, fsyncs, trips) = if args.quick {
            (0.5, 2.0, 2.0, 2.0, 2.0, 1_000, 50, 300)
        } else {
            (
                2.0,
                20.0,
                15.0,
                10.0,
                20.0,
                workload::W4_SESSIONS,
                500,
                3_000,
            )
        };
        Self {
            warmup_secs: args.warmup_secs.unwrap_or(warmup),
            w1_secs: args.w1_secs.unwrap_or(w1),
            w2_secs: args.w2_secs.unwrap_or(w2),
            w3_secs: args.w3_secs.unwrap_or(w3),
            w4_secs: args.w4_secs.unwrap_or(w4),
            w4_rounds: args.w4_rounds.map_or(W4_ROUNDS_DEFAULT, usize::from),
            w4_sessions: args.w4_sessions.unwrap_or(sessions),
            w4_session_ttl_secs: args.w4_session_ttl_secs.unwrap_or(if args.quick {
                W4_SESSION_TTL_SECS_QUICK
            } else {
                W4_SESSION_TTL_SECS_DEFAULT
            }),
            fdatasync_samples: fsyncs,
            round_trip_samples: trips,
            client_threads: args.client_threads,
        }
    }

    /// W1: uncontended, many workers on random keys.
    fn w1_spec(&self) -> LoopSpec {
        self.spec(
            "w1",
            workload::W1_WORKERS,
            Keys::Random {
                count: workload::W1_KEYS,
            },
            self.w1_secs,
        )
    }

    fn spec(&self, name: &'static str, workers: usize, keys: Keys, secs: f64) -> LoopSpec {
        LoopSpec {
            name,
            workers,
            keys,
            warmup: Duration::from_secs_f64(self.warmup_secs),
            measure: Duration::from_secs_f64(secs),
        }
    }
}

/// Where and on what the benchmark ran.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    kernel: String,
    load_average_at_start: String,
    data_root: String,
    data_filesystem: String,
    lockd_bin: Option<String>,
    etcd_bin: Option<String>,
    etcd_version: Option<String>,
}

/// The JSON report.
#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    command: String,
    started_unix_ms: u64,
    finished_unix_ms: u64,
    machine: Machine,
    plan: Plan,
    floors: Floors,
    lockd: Option<SystemResults>,
    etcd: Option<SystemResults>,
    /// `--scrape-rounds`: lockd's W3 and W1 with and without a metrics scraper.
    scrape: Option<scraper::ScrapeComparison>,
    rows: Vec<Row>,
    table_markdown: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.tcp_echo {
        return match floors::serve_tcp_echo() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lock-bench --tcp-echo: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match client_runtime(args.client_threads.map(usize::from)) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lock-bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // On SIGINT/SIGTERM the run is dropped, which kills every node it started (kill_on_drop)
    // and removes their data; exiting straight from the signal would orphan them.
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run(args) => outcome,
            signal = interrupted() => Err(signal),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime the workers run on: `threads` worker threads, or one per CPU (tokio's default)
/// when `None`. The same for lockd and etcd, so it moves both systems' client cost alike.
fn client_runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads);
    }
    builder
        .enable_all()
        .build()
        .context("building the client runtime")
}

/// Completes with an error naming the signal when SIGINT or SIGTERM arrives.
async fn interrupted() -> anyhow::Error {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers the default action applies; never complete.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => anyhow::anyhow!("interrupted (SIGINT); nodes stopped"),
        _ = term.recv() => anyhow::anyhow!("terminated (SIGTERM); nodes stopped"),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn run(args: Args) -> Result<()> {
    if args.scale.w5 {
        let (out, data_root, bin) = (
            &args.out,
            args.data_root.as_deref(),
            args.lockd_bin.as_deref(),
        );
        let common = scale::Common {
            out,
            data_root,
            lockd_bin: bin,
            insecure: args.insecure,
            keep_data: args.keep_data,
        };
        return scale::run(&args.scale, common).await;
    }
    let started_unix_ms = unix_ms();
    let plan = Plan::from_args(&args);
    if args.scrape_only && args.scrape_rounds == 0 {
        anyhow::bail!("--scrape-only needs --scrape-rounds N (N > 0)");
    }
    // Resolve everything that can be missing before starting anything.
    let lockd_bin = args
        .systems
        .contains(&SystemName::Lockd)
        .then(|| procs::lockd_binary(args.lockd_bin.as_deref()))
        .transpose()?;
    let etcd_bin = args
        .systems
        .contains(&SystemName::Etcd)
        .then(|| procs::etcd_binary(args.etcd_bin.as_deref()))
        .transpose()?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let data_root = args.data_root.clone().unwrap_or_else(std::env::temp_dir);
    let data_filesystem = filesystem_of(&data_root);
    if matches!(data_filesystem.as_str(), "tmpfs" | "ramfs") {
        eprintln!(
            "lock-bench: warning: {} is on {data_filesystem}; fsync costs nothing there, so the \
             figures are not comparable — pass --data-root on a real disk",
            data_root.display()
        );
    }
    let data = tempfile::Builder::new()
        .prefix("lock-bench-")
        .tempdir_in(&data_root)
        .with_context(|| format!("creating a data directory in {}", data_root.display()))?;
    let machine = Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: cpu_model(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        load_average_at_start: read_trimmed("/proc/loadavg"),
        data_root: data_root.display().to_string(),
        data_filesystem,
        lockd_bin: lockd_bin.as_ref().map(|p| p.display().to_string()),
        etcd_bin: etcd_bin.as_ref().map(|p| p.display().to_string()),
        etcd_version: match &etcd_bin {
            Some(bin) => etcd_version(bin).await,
            None => None,
        },
    };

    let outcome = measure_all(&args, &plan, data.path(), lockd_bin, etcd_bin).await;
    let (floors, lockd, etcd, scrape) = match outcome {
        Ok(v) => v,
        Err(e) => {
            let kept = data.keep();
            return Err(e.context(format!("node data and logs kept in {}", kept.display())));
        }
    };
    if args.keep_data {
        eprintln!("lock-bench: data kept in {}", data.keep().display());
    }

    let rows = report::rows(lockd.as_ref(), etcd.as_ref());
    let mut table = report::markdown(&rows, &floors);
    if let Some(scrape) = &scrape {
        table.push_str(&scraper::markdown(scrape));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("{table}");
    let report = Report {
        tool: "lock-bench",
        command,
        started_unix_ms,
        finished_unix_ms: unix_ms(),
        machine,
        plan,
        floors,
        lockd,
        etcd,
        scrape,
        rows,
        table_markdown: table.clone(),
    };
    let json = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
    write(&args.out.join(JSON_FILE), json.as_bytes())?;
    write(&args.out.join(MARKDOWN_FILE), table.as_bytes())?;
    eprintln!(
        "lock-bench: wrote {} and {}",
        args.out.join(JSON_FILE).display(),
        args.out.join(MARKDOWN_FILE).display()
    );
    Ok(())
}

type Measured = (
    Floors,
    Option<SystemResults>,
    Option<SystemResults>,
    Option<scraper::ScrapeComparison>,
);

async fn measure_all(
    args: &Args,
    plan: &Plan,
    data: &Path,
    lockd_bin: Option<PathBuf>,
    etcd_bin: Option<PathBuf>,
) -> Result<Measured> {
    eprintln!("lock-bench: floors (fdatasync, gRPC loopback)");
    let floors = floors::measure(data, plan.fdatasync_samples, plan.round_trip_samples).await?;
    let (mut lockd, mut etcd, mut scrape) = (None, None, None);
    for system in &args.systems {
        match system {
            SystemName::Lockd => {
                let Some(bin) = &lockd_bin else { continue };
                eprintln!(
                    "lock-bench: lockd: starting three nodes ({})",
                    bin.display()
                );
                let cluster = lockd::LockdCluster::start(
                    bin,
                    &data.join("lockd"),
                    args.lockd_calls,
                    args.connections,
                    !args.insecure,
                )
                .await?;
                let addr = cluster.leader_addr().to_owned();
                let results = if args.scrape_only {
                    Ok(None)
                } else {
                    workloads(&cluster, plan, "lockd", addr).await.map(Some)
                };
                let compared = match (&results, args.scrape_rounds) {
                    (Ok(_), rounds) if rounds > 0 => Some(
                        scraper::run(
                            &cluster,
                            &plan.spec("w3", 1, Keys::Fresh, plan.w3_secs),
                            &plan.w1_spec(),
                            cluster.metrics_targets(),
                            usize::from(rounds),
                        )
                        .await,
                    ),
                    _ => None,
                };
                let stopped = cluster.stop().await;
                lockd = results?;
                scrape = compared.transpose()?;
                stopped.context("stopping lockd")?;
            }
            SystemName::Etcd => {
                let Some(bin) = &etcd_bin else { continue };
                if args.scrape_only {
                    continue;
                }
                eprintln!(
                    "lock-bench: etcd: starting three members ({})",
                    bin.display()
                );
                let cluster =
                    etcd::EtcdCluster::start(bin, &data.join("etcd"), args.connections).await?;
                let addr = cluster.leader_addr().to_owned();
                let results = workloads(&cluster, plan, "etcd", addr).await;
                let stopped = cluster.stop().await;
                etcd = Some(results?);
                stopped.context("stopping etcd")?;
            }
        }
    }
    Ok((floors, lockd, etcd, scrape))
}

/// W3 (unloaded) first, then W2, W1 and W4 on one running cluster.
async fn workloads<S: LockSystem>(
    system: &S,
    plan: &Plan,
    name: &str,
    leader_addr: String,
) -> Result<SystemResults> {
    eprintln!("lock-bench: {name}: W3 one client");
    let w3 = workload::run_loop(system, &plan.spec("w3", 1, Keys::Fresh, plan.w3_secs)).await?;
    eprintln!("lock-bench: {name}: W2 hot key");
    let w2 = workload::run_loop(
        system,
        &plan.spec("w2", workload::W2_WORKERS, Keys::Hot, plan.w2_secs),
    )
    .await?;
    let w1_spec = plan.w1_spec();
    eprintln!("lock-bench: {name}: W1 uncontended");
    let w1 = workload::run_loop(system, &w1_spec).await?;
    eprintln!(
        "lock-bench: {name}: W4 W1 with and without {} sessions, {} rounds",
        plan.w4_sessions, plan.w4_rounds
    );
    let w4_spec = LoopSpec {
        name: "w4",
        measure: Duration::from_secs_f64(plan.w4_secs),
        ..w1_spec
    };
    let w4 = workload::run_sessions(
        system,
        plan.w4_sessions,
        Duration::from_secs(plan.w4_session_ttl_secs),
        &w4_spec,
        plan.w4_rounds,
    )
    .await?;
    Ok(SystemResults {
        leader_addr,
        w1,
        w2,
        w3,
        w4,
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    read_trimmed("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default()
}

/// The filesystem type of the mount holding `path`, from /proc/mounts ("unknown" if not found).
fn filesystem_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = read_trimmed("/proc/mounts");
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, mount, fs) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount)
                .then(|| (mount.len(), fs.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "unknown".to_owned(), |(_, fs)| fs)
}

async fn etcd_version(bin: &Path) -> Option<String> {
    let output = tokio::process::Command::new(bin)
        .arg("--version")
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}
