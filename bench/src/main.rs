//! `lock-bench`: runs the same lock workloads against a three-node lockd cluster and a
//! three-node etcd cluster, one after the other in one invocation, lockd's W1–W3 with both
//! client styles (plain unary calls and the `Pipeline` stream); prints one table with
//! lockd/etcd ratios per row (issues 7 and 23), writes it with every figure as JSON, and draws
//! the SVG plots of that JSON. `--help` lists the flags; `lock-bench plot` redraws the plots of
//! a results.json or of a W5 run's w5.json.
//!
//! ```text
//! cargo build --release -p lockd
//! cargo run --release -p lock-bench -- --out bench-results/
//! cargo run --release -p lock-bench -- plot --in bench-results/results.json --out plots/
//! ```
//!
//! # Layout
//!
//! - `procs`: free ports, binaries, node processes.
//! - `system`: the seam — what a workload needs from a lock system.
//! - `lockd`, `etcd`: the two systems (cluster start/stop, workers, keep-alive loads).
//! - `workload`: W1–W4, written once against the seam.
//! - `floors`: fdatasync and gRPC loopback round trip.
//! - `sweep`: W1 at a list of worker counts (`--sweep-workers`).
//! - `stats`: percentiles and histograms. `report`: rows, targets, markdown and JSON.
//! - `plot`: SVG line charts (the API any workload's plots use); `plot::figures`: the plots
//!   of a results.json; `plot::w5_figures`: W5's growth curves of a w5.json; `plot::redraw`:
//!   `lock-bench plot`.
//! - `scraper`: a once-a-second scraper of every lockd node's `/metrics`, and W3/W1 with and
//!   without it (`--scrape-rounds`).

#![forbid(unsafe_code)]

mod etcd;
mod floors;
mod lockd;
mod pki;
mod plot;
mod procs;
mod report;
mod scale;
mod scraper;
mod stats;
mod sweep;
mod system;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::floors::Floors;
use crate::lockd::ClientStyle;
use crate::report::{Row, SystemResults};
use crate::sweep::{SweepPlan, SweepSeries};
use crate::system::LockSystem;
use crate::workload::{Keys, LoopResult, LoopSpec};

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
    /// lockd's client styles, comma-separated; W1, W2 and W3 run once with each, the styles
    /// taking turns at going first. `unary`: one unary call per acquire and release on the
    /// worker's own connection, with stubs built from proto/ alone, as a Go, Java or Python
    /// program calls lockd; `pipeline`: the SDK's `Pipeline` stream. W4 and the scrape
    /// comparison run with the Pipeline stream (or the one style given).
    #[arg(
        long,
        alias = "lockd-calls",
        value_enum,
        value_delimiter = ',',
        default_value = "unary,pipeline"
    )]
    client: Vec<ClientStyle>,
    /// After W4, W1 at each of these worker counts (comma-separated), for each lockd client
    /// style and etcd, for the throughput-against-workers plot. Off by default;
    /// `--sweep-workers` alone runs 1,4,16,32.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    sweep_workers: Option<Vec<usize>>,
    /// Measured window of each sweep point, in seconds (default 5, 1 with --quick).
    #[arg(long)]
    sweep_secs: Option<f64>,
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
    /// Run both systems plaintext (the lockd nodes `--insecure`). By default the lockd nodes and
    /// the etcd members serve TLS alike — clients and peers, with a CA minted for the run — and
    /// every connection presents a client certificate; running both ways measures what TLS
    /// costs (bench/PERFORMANCE.md).
    #[arg(long)]
    insecure: bool,
    /// `plot`: only redraw the plots of an earlier run.
    #[command(subcommand)]
    #[serde(skip)]
    command: Option<Command>,
    /// W5 (`--w5` and its `--w5-*` flags): lockd at scale, instead of the table.
    #[command(flatten)]
    scale: scale::ScaleArgs,
}

/// What lock-bench does instead of a run.
#[derive(Debug, Clone, Subcommand)]
enum Command {
    /// Draws the SVG plots of a results.json (throughput against workers when it has a worker
    /// sweep, W3 acquire latency CDFs when it has W3 histograms) or of a W5 run's w5.json (W1,
    /// W3, memory and idle CPU against locks held) into a directory; a run draws the same
    /// plots into its --out by itself.
    Plot {
        /// The results.json or w5.json of a run (told apart by its "tool").
        #[arg(long = "in")]
        input: PathBuf,
        /// Directory for the SVG files (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
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
    /// lockd's client styles (`--client`), in the order W3 runs them.
    clients: Vec<ClientStyle>,
    /// `--sweep-workers`, if asked for.
    sweep: Option<SweepPlan>,
    /// Both systems serve TLS, mutual between servers and from the client (false:
    /// `--insecure`, both plaintext).
    tls: bool,
}

impl Plan {
    fn from_args(args: &Args) -> Result<Self> {
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
        if args.client.is_empty() {
            bail!("--client: name at least one style (unary, pipeline)");
        }
        if let Some(twice) = args
            .client
            .iter()
            .enumerate()
            .find_map(|(i, c)| args.client[..i].contains(c).then_some(c))
        {
            bail!("--client: {twice:?} given twice");
        }
        let warmup_secs = args.warmup_secs.unwrap_or(warmup);
        let sweep_secs = args.sweep_secs.unwrap_or(if args.quick {
            sweep::SECS_QUICK
        } else {
            sweep::SECS_DEFAULT
        });
        let sweep = args
            .sweep_workers
            .as_deref()
            .map(|workers| SweepPlan::new(workers, sweep_secs, warmup_secs))
            .transpose()?;
        Ok(Self {
            warmup_secs,
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
            clients: args.client.clone(),
            sweep,
            tls: !args.insecure,
        })
    }

    /// The lockd client style W4 and the scrape comparison run with: the Pipeline stream when
    /// it runs, else the one style given.
    fn w4_client(&self) -> ClientStyle {
        if self.clients.contains(&ClientStyle::Pipeline) {
            ClientStyle::Pipeline
        } else {
            self.clients
                .first()
                .copied()
                .unwrap_or(ClientStyle::Pipeline)
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
    /// /proc/loadavg once every workload has run: with the start's, what the shared machine
    /// was doing meanwhile.
    load_average_at_end: String,
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
    /// The results format (`plot::figures::FORMAT`; files without it are format 1).
    format: u32,
    command: String,
    started_unix_ms: u64,
    finished_unix_ms: u64,
    machine: Machine,
    plan: Plan,
    floors: Floors,
    /// lockd with the Pipeline stream: W1–W4 (W4 too when it is the only style run).
    lockd: Option<SystemResults>,
    /// lockd with the unary client: W1–W3 (W4 too when it is the only style run).
    lockd_unary: Option<SystemResults>,
    etcd: Option<SystemResults>,
    /// `--sweep-workers`: W1 against workers, one series per lockd client style and etcd.
    sweep: Vec<SweepSeries>,
    /// `--scrape-rounds`: lockd's W3 and W1 with and without a metrics scraper.
    scrape: Option<scraper::ScrapeComparison>,
    rows: Vec<Row>,
    table_markdown: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Plot { input, out }) = &args.command {
        return match plot::redraw::plot_file(input, out) {
            Ok(written) => {
                for path in written {
                    eprintln!("lock-bench plot: wrote {}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lock-bench plot: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
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
    let plan = Plan::from_args(&args)?;
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
    let data = procs::data_dir_in(&data_root, "lock-bench-")?;
    let data_filesystem = filesystem_of(&data_root);
    if matches!(data_filesystem.as_str(), "tmpfs" | "ramfs") {
        eprintln!(
            "lock-bench: warning: {} is on {data_filesystem}; fsync costs nothing there, so the \
             figures are not comparable — pass --data-root on a real disk",
            data_root.display()
        );
    }
    let mut machine = Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: cpu_model(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        load_average_at_start: read_trimmed("/proc/loadavg"),
        load_average_at_end: String::new(),
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
    machine.load_average_at_end = read_trimmed("/proc/loadavg");
    let Measured {
        floors,
        lockd,
        lockd_unary,
        etcd,
        sweep,
        scrape,
    } = match outcome {
        Ok(v) => v,
        Err(e) => {
            let kept = data.keep();
            return Err(e.context(format!("node data and logs kept in {}", kept.display())));
        }
    };
    if args.keep_data {
        eprintln!("lock-bench: data kept in {}", data.keep().display());
    }

    let rows = report::rows(lockd.as_ref(), lockd_unary.as_ref(), etcd.as_ref());
    let headline = if lockd.is_some() || lockd_unary.is_some() {
        report::headline(lockd_unary.as_ref(), lockd.as_ref(), etcd.as_ref())
    } else {
        String::new()
    };
    let mut table = report::markdown(&headline, &rows, &floors);
    table.push_str(&report::transport_note(plan.tls));
    table.push_str(&report::load_note(
        machine.cpus,
        &machine.load_average_at_start,
        &machine.load_average_at_end,
    ));
    if let Some(scrape) = &scrape {
        table.push_str(&scraper::markdown(scrape));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("{table}");
    let report = Report {
        tool: "lock-bench",
        format: plot::figures::FORMAT,
        command,
        started_unix_ms,
        finished_unix_ms: unix_ms(),
        machine,
        plan,
        floors,
        lockd,
        lockd_unary,
        etcd,
        sweep,
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
    // The plots are drawn from the JSON just written, exactly as `lock-bench plot` would.
    let results = plot::figures::Results::parse(&json).context("reading back the report")?;
    for outcome in plot::figures::write_all(&results, &args.out)? {
        match outcome {
            plot::figures::Outcome::Written(path) => {
                eprintln!("lock-bench: wrote {}", path.display());
            }
            plot::figures::Outcome::Skipped(file, why) => {
                eprintln!("lock-bench: no {file}: {why}");
            }
        }
    }
    Ok(())
}

/// Everything [`measure_all`] measured.
struct Measured {
    floors: Floors,
    /// lockd with the Pipeline stream.
    lockd: Option<SystemResults>,
    /// lockd with the unary client.
    lockd_unary: Option<SystemResults>,
    etcd: Option<SystemResults>,
    sweep: Vec<SweepSeries>,
    scrape: Option<scraper::ScrapeComparison>,
}

async fn measure_all(
    args: &Args,
    plan: &Plan,
    data: &Path,
    lockd_bin: Option<PathBuf>,
    etcd_bin: Option<PathBuf>,
) -> Result<Measured> {
    eprintln!("lock-bench: floors (fdatasync, gRPC loopback)");
    let floors = floors::measure(data, plan.fdatasync_samples, plan.round_trip_samples).await?;
    let mut measured = Measured {
        floors,
        lockd: None,
        lockd_unary: None,
        etcd: None,
        sweep: Vec::new(),
        scrape: None,
    };
    for system in &args.systems {
        match system {
            SystemName::Lockd => {
                let Some(bin) = &lockd_bin else { continue };
                eprintln!(
                    "lock-bench: lockd: starting three nodes ({})",
                    bin.display()
                );
                let mut cluster = lockd::LockdCluster::start(
                    bin,
                    &data.join("lockd"),
                    plan.w4_client(),
                    args.connections,
                    plan.tls,
                )
                .await?;
                let addr = cluster.leader_addr().to_owned();
                let labels: Vec<&str> = plan.clients.iter().map(|c| c.label()).collect();
                let w4_on = plan
                    .clients
                    .iter()
                    .position(|c| *c == plan.w4_client())
                    .unwrap_or(0);
                let clients = plan.clients.clone();
                let results = if args.scrape_only {
                    Ok(None)
                } else {
                    workloads(&mut cluster, plan, &labels, w4_on, addr, |cluster, i| {
                        cluster.set_client(clients[i]);
                    })
                    .await
                    .map(Some)
                };
                cluster.set_client(plan.w4_client());
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
                if let Some((by_style, sweep)) = results? {
                    for (style, mut result) in plan.clients.iter().zip(by_style) {
                        result.client = Some(*style);
                        match style {
                            ClientStyle::Pipeline => measured.lockd = Some(result),
                            ClientStyle::Unary => measured.lockd_unary = Some(result),
                        }
                    }
                    measured.sweep.extend(sweep);
                }
                measured.scrape = compared.transpose()?;
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
                let mut cluster =
                    etcd::EtcdCluster::start(bin, &data.join("etcd"), args.connections, plan.tls)
                        .await?;
                let addr = cluster.leader_addr().to_owned();
                let results = workloads(&mut cluster, plan, &["etcd"], 0, addr, |_, _| {}).await;
                let stopped = cluster.stop().await;
                let (mut results, sweep) = results?;
                measured.etcd = results.pop();
                measured.sweep.extend(sweep);
                stopped.context("stopping etcd")?;
            }
        }
    }
    Ok(measured)
}

/// W3 (unloaded) first, then W2 and W1 on one running cluster, each once per variant (lockd's
/// client styles, etcd's one), the variants taking turns at going first; then W4 with variant
/// `w4_on` and the worker sweep (`--sweep-workers`), its points taking turns alike.
/// `labels` names the variants; `switch(system, i)` makes the workers created next those of
/// variant `i`. Answers one result per variant (W4 only in `w4_on`'s) and one sweep series
/// per variant.
async fn workloads<S: LockSystem>(
    system: &mut S,
    plan: &Plan,
    labels: &[&str],
    w4_on: usize,
    leader_addr: String,
    mut switch: impl FnMut(&mut S, usize),
) -> Result<(Vec<SystemResults>, Vec<SweepSeries>)> {
    let variants = labels.len();
    // Round r runs the variants forwards when r is even, backwards when odd.
    let order = |round: usize| -> Vec<usize> {
        if round.is_multiple_of(2) {
            (0..variants).collect()
        } else {
            (0..variants).rev().collect()
        }
    };
    let loops = [
        (
            "W3 one client",
            plan.spec("w3", 1, Keys::Fresh, plan.w3_secs),
        ),
        (
            "W2 hot key",
            plan.spec("w2", workload::W2_WORKERS, Keys::Hot, plan.w2_secs),
        ),
        ("W1 uncontended", plan.w1_spec()),
    ];
    let mut results: Vec<Vec<Option<LoopResult>>> = vec![vec![None; variants]; loops.len()];
    for (round, (what, spec)) in loops.iter().enumerate() {
        for i in order(round) {
            switch(system, i);
            eprintln!("lock-bench: {}: {what}", labels[i]);
            let result = workload::run_loop(system, spec).await?;
            results[round][i] = Some(result);
        }
    }
    let w1_spec = plan.w1_spec();
    switch(system, w4_on);
    eprintln!(
        "lock-bench: {}: W4 W1 with and without {} sessions, {} rounds",
        labels[w4_on], plan.w4_sessions, plan.w4_rounds
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
    let mut sweep: Vec<SweepSeries> = labels
        .iter()
        .map(|label| SweepSeries {
            label: (*label).to_owned(),
            points: Vec::new(),
        })
        .collect();
    if let Some(sweep_plan) = &plan.sweep {
        for (round, &workers) in sweep_plan.workers.iter().enumerate() {
            for i in order(round) {
                switch(system, i);
                eprintln!(
                    "lock-bench: {}: sweep, W1 with {workers} workers",
                    labels[i]
                );
                sweep[i]
                    .points
                    .push(sweep::point(system, sweep_plan, workers).await?);
            }
        }
    }
    let mut w4 = Some(w4);
    let [w3, w2, w1] = results
        .try_into()
        .map_err(|_| anyhow::anyhow!("three loops"))?;
    let by_variant = w3
        .into_iter()
        .zip(w2)
        .zip(w1)
        .enumerate()
        .map(|(i, ((w3, w2), w1))| {
            let missing = || anyhow::anyhow!("variant {} ran no loop", labels[i]);
            Ok(SystemResults {
                client: None,
                leader_addr: leader_addr.clone(),
                w1: w1.ok_or_else(missing)?,
                w2: w2.ok_or_else(missing)?,
                w3: w3.ok_or_else(missing)?.with_acquire_histogram(),
                w4: if i == w4_on { w4.take() } else { None },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let sweep = sweep.into_iter().filter(|s| !s.points.is_empty()).collect();
    Ok((by_variant, sweep))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Result<Plan> {
        let args = Args::try_parse_from(std::iter::once("lock-bench").chain(args.iter().copied()))?;
        Plan::from_args(&args)
    }

    #[test]
    fn both_client_styles_by_default_and_the_old_flag_still_picks_one() {
        let default = plan(&[]).expect("the defaults");
        assert_eq!(default.clients, [ClientStyle::Unary, ClientStyle::Pipeline]);
        assert_eq!(default.w4_client(), ClientStyle::Pipeline);
        assert!(default.sweep.is_none(), "no sweep unless asked for");
        let unary = plan(&["--lockd-calls", "unary"]).expect("the hidden alias");
        assert_eq!(unary.clients, [ClientStyle::Unary]);
        assert_eq!(unary.w4_client(), ClientStyle::Unary);
        let error = plan(&["--client", "pipeline,pipeline"]).expect_err("twice");
        assert!(error.to_string().contains("given twice"), "{error}");
    }

    #[test]
    fn sweep_workers_alone_runs_the_default_set() {
        let sweep = plan(&["--sweep-workers"]).expect("parses").sweep;
        assert_eq!(
            sweep.map(|s| s.workers),
            Some(sweep::DEFAULT_WORKERS.to_vec())
        );
        let quick = plan(&["--quick", "--sweep-workers", "2,8"]).expect("parses");
        let sweep = quick.sweep.expect("asked for");
        assert_eq!((sweep.workers, sweep.secs), (vec![2, 8], sweep::SECS_QUICK));
        assert!(plan(&["--sweep-workers", "0"]).is_err());
    }

    #[test]
    fn plot_is_a_subcommand_with_its_own_in_and_out() {
        let args = Args::try_parse_from(["lock-bench", "plot", "--in", "r.json", "--out", "p"])
            .expect("parses");
        let Some(Command::Plot { input, out }) = args.command else {
            panic!("not the plot subcommand: {:?}", args.command);
        };
        assert_eq!((input, out), (PathBuf::from("r.json"), PathBuf::from("p")));
    }
}
