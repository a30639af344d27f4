//! `lock-jepsen`: the command line. `run` tests a real cluster under faults and writes its
//! report; `check` re-checks a recorded history and writes its report.
//!
//! `--net auto` (the default) picks the network by what the machine allows: as root with `ip`
//! and `iptables` installed, `run` creates a network namespace, re-executes itself inside it
//! and cuts links with iptables (`--net netns`), and deletes the namespace afterwards;
//! otherwise it runs on 127.0.0.1 and cuts links in the harness's own TCP proxies
//! (`--net proxy`). The run's header says which and why. See `lock_jepsen::net`.
//!
//! Exit codes: 0 every property passed; 1 a violation; 3 a property could not be decided
//! (unknown); 2 the harness failed (a malformed history, an unwritable folder) — a harness
//! failure is never reported as a verdict.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_jepsen::args::parse_duration;
use lock_jepsen::checker::{self, Analysis, CheckConfig, Status, duration_ns};
use lock_jepsen::cluster::find_libfaketime;
use lock_jepsen::nemesis::outage::OUTAGE_HOLD_DEFAULT;
use lock_jepsen::net::{NetArg, NetPlan};
use lock_jepsen::runner::{self, RunConfig};
use lock_jepsen::{history, lockd_bin, nemesis, net, report, resources};

/// Exit code when a property failed.
const EXIT_VIOLATION: u8 = 1;
/// Exit code when the harness itself failed.
const EXIT_HARNESS_FAILURE: u8 = 2;
/// Exit code when the verdict is unknown.
const EXIT_UNKNOWN: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "lock-jepsen",
    version,
    about = "Fault-injection tests for lockd"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs real lockd nodes under faults with a workload, then checks and reports.
    Run {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// How long faults are injected (a fault-free tail follows).
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        time: Duration,
        /// Workload clients.
        #[arg(long, default_value_t = 10)]
        clients: u32,
        /// Keys the clients contend on.
        #[arg(long, default_value_t = 4)]
        keys: u32,
        /// Comma-separated nemeses: partition, kill, pause, clock, client-pause, revoke,
        /// slow-net, flaky-net, membership, corrupt, power-cut, outage (or `none`). Default:
        /// all but membership, corrupt, power-cut and outage; clock only if libfaketime is
        /// installed, and in the namespace slow-net only if tc netem works (flaky-net falls back
        /// to iptables' packet model) (asked for by name without them, the run is a harness
        /// failure; power-cut needs
        /// FUSE, and lock-lazyfs beside lock-jepsen or in $LOCK_LAZYFS_BIN).
        #[arg(long)]
        nemesis: Option<String>,
        /// How long the outage nemesis keeps its node out (default 60s).
        #[arg(long, value_parser = parse_duration)]
        outage_hold: Option<Duration>,
        /// Seed of every random choice (faults, targets, keys, holds).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Report folder (history.jsonl, results.json, index.html, node logs).
        #[arg(long, default_value = "jepsen-out")]
        out: PathBuf,
        /// The lockd binary (default: $LOCKD_BIN, else next to this executable).
        #[arg(long)]
        lockd: Option<PathBuf>,
        /// Lease of each grant.
        #[arg(long, value_parser = parse_duration, default_value = "2s")]
        ttl: Duration,
        /// Longest wait of one acquire.
        #[arg(long, value_parser = parse_duration, default_value = "3s")]
        max_wait: Duration,
        /// Fault-free time after the last heal before the clients stop.
        #[arg(long, value_parser = parse_duration, default_value = "12s")]
        tail: Duration,
        /// How soon after the last heal every key must be granted again.
        #[arg(long, value_parser = parse_duration, default_value = "20s")]
        recovery_bound: Duration,
        /// How node-to-node links are cut: `netns` (a network namespace and iptables; root,
        /// iproute2 and iptables), `proxy` (nodes on 127.0.0.1, Raft traffic through the
        /// harness's TCP proxies; any user), or `auto` (netns as root when ip and iptables are
        /// installed, proxy otherwise).
        #[arg(long, value_enum, default_value = "auto")]
        net: NetArg,
        /// Run the nodes `--insecure` (plaintext). By default they serve TLS with a CA and
        /// certificates minted for the run, and every client presents a certificate.
        #[arg(long)]
        insecure: bool,
    },
    /// Re-checks an existing history and writes results.json and index.html.
    Check {
        /// The history (JSON Lines).
        #[arg(long)]
        history: PathBuf,
        /// Where to write the report (default: the history's folder).
        #[arg(long)]
        out: Option<PathBuf>,
        /// How soon after the last heal every key must be granted again.
        #[arg(long, value_parser = parse_duration, default_value = "20s")]
        recovery_bound: Duration,
        /// The nodes' resource samples (default: resources.jsonl beside the history, if any).
        #[arg(long)]
        resources: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lock-jepsen: harness failure (no verdict): starting tokio: {e}");
            return ExitCode::from(EXIT_HARNESS_FAILURE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Exit::Code(code)) => ExitCode::from(code),
        Ok(Exit::Verdict(Status::Pass)) => ExitCode::SUCCESS,
        Ok(Exit::Verdict(Status::Fail)) => ExitCode::from(EXIT_VIOLATION),
        Ok(Exit::Verdict(Status::Unknown)) => ExitCode::from(EXIT_UNKNOWN),
        Err(e) => {
            eprintln!("lock-jepsen: harness failure (no verdict): {e:#}");
            ExitCode::from(EXIT_HARNESS_FAILURE)
        }
    }
}

/// How the process ends.
enum Exit {
    /// With the verdict's exit code.
    Verdict(Status),
    /// With the exit code of the run re-executed inside the namespace.
    Code(u8),
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Run {
            nodes,
            time,
            clients,
            keys,
            nemesis,
            seed,
            out,
            lockd,
            ttl,
            max_wait,
            tail,
            recovery_bound,
            net: net_arg,
            outage_hold,
            insecure,
        } => {
            let (nemeses, nemesis_note) =
                nemesis::resolve(nemesis.as_deref(), find_libfaketime().is_some())
                    .map_err(|e| anyhow::anyhow!(e))?;
            if nodes == 0 || clients == 0 || keys == 0 {
                anyhow::bail!("--nodes, --clients and --keys must be at least 1");
            }
            lock_api::validate::ttl(ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
            lock_api::validate::max_wait(max_wait)
                .map_err(|e| anyhow::anyhow!("--max-wait: {e}"))?;
            let lockd = lockd_bin::find(lockd.as_deref())?;
            let choice = net::plan(net_arg, net::Host::probe(), net::current_netns().is_some())?;
            let net_mode = match choice.plan {
                NetPlan::EnterNetns => {
                    let name = format!("lockjepsen-{}", std::process::id());
                    net::create_netns(&name).await?;
                    let code = net::reexec_in_netns(&name).await?;
                    return Ok(Exit::Code(
                        u8::try_from(code).unwrap_or(EXIT_HARNESS_FAILURE),
                    ));
                }
                NetPlan::Run(mode) => mode,
            };
            // In the namespace, latency on a link (slow-net) needs netem; asked for by name
            // without it the run fails (as the clock does without libfaketime), left to the
            // defaults it is left out and the header says so. flaky-net runs either way: without
            // netem its loss and duplication come from iptables alone.
            let mut nemeses = nemeses;
            let mut nemesis_note = nemesis_note;
            if net_mode == net::NetMode::Netns
                && nemeses.contains(&nemesis::Kind::SlowNet)
                && let Err(why) = net::netem_available().await
            {
                if nemesis.is_some() {
                    anyhow::bail!("--nemesis slow-net in --net netns: {why}");
                }
                nemeses.retain(|k| *k != nemesis::Kind::SlowNet);
                let note = format!(
                    "slow-net is left out and flaky-net uses iptables' packet model: {why}"
                );
                nemesis_note = Some(match nemesis_note {
                    Some(n) => format!("{n}; {note}"),
                    None => note,
                });
            }
            let config = RunConfig {
                nodes,
                time,
                clients,
                keys,
                nemeses,
                seed,
                out: out.clone(),
                lockd,
                ttl,
                max_wait,
                tail,
                recovery_bound,
                net: net_mode,
                net_why: choice.why,
                nemesis_note,
                outage_hold: outage_hold.unwrap_or(OUTAGE_HOLD_DEFAULT),
                insecure,
            };
            eprintln!("lock-jepsen: {}", serde_json::to_string(&config)?);
            let outcome = runner::run(config).await?;
            print_verdict(&outcome.results);
            eprintln!("report: {}", out.join(report::HTML_FILE).display());
            if outcome.crashes > 0 {
                println!(
                    "{} node process(es) exited unexpectedly: a finding",
                    outcome.crashes
                );
                return Ok(Exit::Verdict(Status::Fail));
            }
            Ok(Exit::Verdict(outcome.results.status))
        }
        Command::Check {
            history: path,
            out,
            recovery_bound,
            resources: resources_path,
        } => {
            let ops = history::read(&path)?;
            let config = CheckConfig {
                recovery_bound_ns: duration_ns(recovery_bound),
            };
            let history_dir = path
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            let beside = history_dir.join(resources::RESOURCES_FILE);
            let samples = match resources_path {
                Some(p) => resources::read(&p)?,
                None if beside.is_file() => resources::read(&beside)?,
                None => Vec::new(),
            };
            let analysis = Analysis::new(&ops)?.with_resources(samples);
            let verdict = checker::check_analysis(&analysis, &config);
            let results = report::results(&ops, &analysis, &verdict, &config, None);
            let dir = out.unwrap_or(history_dir);
            report::write(&dir, &analysis, &verdict, &results)?;
            print_verdict(&results);
            eprintln!("report: {}", dir.join(report::HTML_FILE).display());
            Ok(Exit::Verdict(verdict.status))
        }
    }
}

fn print_verdict(results: &report::Results) {
    for p in &results.properties {
        println!(
            "{:<16} {:<8} checked={:<7} excused={:<5} violations={}{}",
            p.name,
            format!("{:?}", p.status).to_lowercase(),
            p.checked,
            p.excused,
            p.violation_count,
            p.note
                .as_deref()
                .map(|n| format!("  ({n})"))
                .unwrap_or_default()
        );
        for v in p.violations.iter().take(5) {
            println!("    {}", v.message);
        }
    }
    println!(
        "verdict: {:?} — {} operations, {} faults installed, {} violations",
        results.status,
        results.stats.operations,
        results.stats.faults_installed(),
        results.violations
    );
}
