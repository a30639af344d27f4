//! One `lock-jepsen run`: start the cluster, run the workload and the nemeses for the given
//! time, heal everything, let the workload run a quiet tail, stop, check, report.
//!
//! Owns the run's phases, its header (what runs how, and why: network mode, clock, binary),
//! the progress line, the resource sampler's life and cleanup (nodes stopped, rules flushed,
//! work folder removed — also after an error or Ctrl-C). Must not judge (the checker does) and
//! must not choose faults (the nemeses do). Any failure of the harness itself returns an error
//! and no verdict.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lock_client::{ClientConfig, LockClient};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;
use tokio::sync::{Mutex, watch};

use crate::checker::{self, Analysis, CheckConfig, duration_ns};
use crate::cluster::{Cluster, ClusterConfig, find_libfaketime, node_addr};
use crate::history::{self, Recorder};
use crate::lazyfs::mounts::{self as lazyfs_mounts, Mounts};
use crate::lockd_bin;
use crate::nemesis::{self, Ctx, Kind};
use crate::net::{Firewall, NetMode};
use crate::report::{self, HISTORY_FILE, Results};
use crate::resources::{self, RESOURCES_FILE, Sample};
use crate::workload::{self, ClientPauses, FencedRegister, Shared, WorkloadConfig};

/// How often the progress line is printed.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long the nemeses get to heal what they hold once told to stop (a client pause may
/// still be waiting for its client, up to its reach timeout).
pub const NEMESIS_STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// Slack on top of a client's longest cycle (an acquire wait plus a long hold with its
/// renewals) when waiting for the clients to stop: the SDK's call budget (10 s) plus margin.
pub const CLIENT_STOP_SLACK: Duration = Duration::from_secs(15);

/// Everything `lock-jepsen run` is told.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunConfig {
    /// Number of nodes.
    pub nodes: u64,
    /// How long faults are injected.
    pub time: Duration,
    /// Workload clients.
    pub clients: u32,
    /// Keys.
    pub keys: u32,
    /// Enabled nemeses.
    pub nemeses: Vec<Kind>,
    /// The seed every random choice derives from.
    pub seed: u64,
    /// The report folder.
    pub out: PathBuf,
    /// The lockd binary.
    pub lockd: PathBuf,
    /// The grants' TTL.
    pub ttl: Duration,
    /// The acquires' longest wait.
    pub max_wait: Duration,
    /// Fault-free time after the last heal, before the clients stop.
    pub tail: Duration,
    /// The recovery bound the checker applies.
    pub recovery_bound: Duration,
    /// How links are cut: inside the harness's namespace (`netns`) or through its proxies.
    pub net: NetMode,
    /// Why that mode (see [`crate::net::plan`]).
    pub net_why: String,
    /// A nemesis left out and why, for the header (see [`nemesis::resolve`]).
    pub nemesis_note: Option<String>,
    /// How long an outage keeps its node out.
    pub outage_hold: Duration,
    /// Run the nodes `--insecure` (plaintext) instead of with the run's PKI.
    pub insecure: bool,
}

/// The highest node id a run prepares as a spare (for the membership, corrupt and power-cut
/// nemeses, which add members and rebuild refused ones under new ids): each node dials its
/// peers through at most `RAFT_DIAL_MAX` = 15 proxies (node/src/process/config.rs), so ids
/// 1..=16 in all. A 30-minute run of every nemesis rebuilt 5 nodes in its first 7 minutes;
/// with 8 ids the membership nemesis then found no spare for the rest of the run.
pub const NODE_ID_MAX: u64 = 16;

/// Log entries between snapshots when the corrupt nemesis runs: lockd's default (5000) is more
/// than a short run writes, and the nemesis damages snapshot files too. 500 is lockd's
/// minimum times five: a snapshot every few seconds of this workload.
pub const CORRUPT_SNAPSHOT_LOGS: u64 = 500;

/// Mode of the run's work folder (data directories, clock files, a copy of lockd): the node
/// uids must enter it, whatever the harness's umask.
const WORK_DIR_MODE: u32 = 0o755;

/// What a finished run hands back.
#[derive(Debug)]
pub struct RunOutcome {
    /// The results written to `results.json`.
    pub results: Results,
    /// Node processes that exited without being killed.
    pub crashes: usize,
}

/// Runs the test and writes the report into `config.out`.
pub async fn run(config: RunConfig) -> anyhow::Result<RunOutcome> {
    std::fs::create_dir_all(&config.out)
        .with_context(|| format!("creating {}", config.out.display()))?;
    let work_dir = std::env::temp_dir().join(format!("lock-jepsen-{}", std::process::id()));
    if work_dir.exists() {
        std::fs::remove_dir_all(&work_dir)
            .with_context(|| format!("clearing {}", work_dir.display()))?;
    }
    let (cluster, firewall, setup) = match start(&config, &work_dir).await {
        Ok(started) => started,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&work_dir);
            return Err(e);
        }
    };
    let cluster = Arc::new(Mutex::new(cluster));
    let phases = run_phases(&config, &cluster, &firewall, setup.lazyfs.clone()).await;
    // Cleanup, whatever happened.
    let crashes = {
        let mut c = cluster.lock().await;
        c.stop().await;
        c.crashes()
    };
    if let Some(mounts) = &setup.lazyfs {
        mounts.stop().await;
    }
    let _ = firewall.heal().await;
    let _ = std::fs::remove_dir_all(&work_dir);
    let (recorder, samples) = phases?;
    recorder.finish()?;
    resources::write(&config.out.join(RESOURCES_FILE), &samples)?;

    let ops = history::read(&config.out.join(HISTORY_FILE))?;
    let check = CheckConfig {
        recovery_bound_ns: duration_ns(config.recovery_bound),
    };
    let analysis = Analysis::new(&ops)?.with_resources(samples);
    let verdict = checker::check_analysis(&analysis, &check);
    let run_json = json!({
        "nodes": config.nodes,
        "time_s": config.time.as_secs_f64(),
        "clients": config.clients,
        "keys": config.keys,
        "nemeses": config.nemeses,
        "seed": config.seed,
        "ttl_ms": config.ttl.as_millis() as u64,
        "max_wait_ms": config.max_wait.as_millis() as u64,
        "tail_s": config.tail.as_secs_f64(),
        "net": config.net.name(),
        "network": config.net.describe(),
        "net_why": config.net_why,
        "nemesis_note": config.nemesis_note,
        "outage_hold_s": config.outage_hold.as_secs_f64(),
        "spare_ids": setup.spare_ids,
        "net_faults": setup.net_faults,
        "lockd_extra_args": setup.extra_args,
        "libfaketime": setup.libfaketime.map(|p| p.display().to_string()),
        "lockd": setup.lockd.display().to_string(),
        "lockd_note": setup.lockd_note,
        "node_crashes": crashes,
        "data_dirs": if setup.lazyfs.is_some() { "lazyfs" } else { "plain" },
    });
    let results = report::results(&ops, &analysis, &verdict, &check, Some(run_json));
    report::write(&config.out, &analysis, &verdict, &results)?;
    Ok(RunOutcome {
        results,
        crashes: crashes.len(),
    })
}

/// What the run's start found and chose, for the header and `results.json`.
struct Setup {
    libfaketime: Option<PathBuf>,
    lockd: PathBuf,
    lockd_note: String,
    spare_ids: Vec<u64>,
    /// How links are degraded, if a link nemesis runs.
    net_faults: Option<&'static str>,
    extra_args: Vec<String>,
    /// The nodes' lazyfs mounts (with the power-cut nemesis).
    lazyfs: Option<Arc<Mounts>>,
}

/// Prepares the work folder, the binary and the network, prints the header and starts the
/// cluster. The caller removes `work_dir` if this fails.
async fn start(
    config: &RunConfig,
    work_dir: &Path,
) -> anyhow::Result<(Cluster, Arc<Firewall>, Setup)> {
    let in_netns = config.net == NetMode::Netns;
    let libfaketime =
        if config.nemeses.contains(&Kind::Clock) {
            Some(find_libfaketime().with_context(|| {
                format!("--nemesis clock: {}", crate::cluster::LIBFAKETIME_MISSING)
            })?)
        } else {
            None
        };
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    std::fs::set_permissions(work_dir, std::fs::Permissions::from_mode(WORK_DIR_MODE))
        .with_context(|| format!("chmod {WORK_DIR_MODE:o} {}", work_dir.display()))?;
    let (lockd, lockd_note) = if in_netns {
        lockd_bin::for_node_uids(&config.lockd, work_dir)?
    } else {
        (config.lockd.clone(), "run in place".to_owned())
    };
    let spare_ids: Vec<u64> = if config.nemeses.iter().any(|k| k.needs_spares()) {
        if config.nodes >= NODE_ID_MAX {
            bail!(
                "--nemesis membership, corrupt and power-cut need spare node ids above --nodes, up to \
                 {NODE_ID_MAX}; use at most {} nodes",
                NODE_ID_MAX - 1
            );
        }
        (config.nodes + 1..=NODE_ID_MAX).collect()
    } else {
        Vec::new()
    };
    let extra_args: Vec<String> =
        if config.nemeses.contains(&Kind::Corrupt) || config.nemeses.contains(&Kind::PowerCut) {
            vec![
                "--snapshot-logs-since-last".to_owned(),
                CORRUPT_SNAPSHOT_LOGS.to_string(),
            ]
        } else {
            Vec::new()
        };
    let all_ids: Vec<u64> = (1..=config.nodes)
        .chain(spare_ids.iter().copied())
        .collect();
    let firewall = Arc::new(match config.net {
        NetMode::Netns => Firewall::iptables().await?,
        NetMode::Proxy => {
            let mut addrs = BTreeMap::new();
            for &id in &all_ids {
                addrs.insert(id, node_addr(false, id)?);
            }
            Firewall::proxy(&addrs).await?
        }
    });
    let net_faults = config
        .nemeses
        .iter()
        .any(|k| k.is_link_fault())
        .then(|| firewall.degrade_model());
    print_header(
        config,
        libfaketime.as_deref(),
        &lockd,
        &lockd_note,
        net_faults,
        &spare_ids,
    );
    let raft_dial = all_ids
        .iter()
        .filter_map(|&id| firewall.raft_dial(id).map(|dial| (id, dial)))
        .collect();
    // The power-cut nemesis's data dirs are lazyfs mounts, made where the cluster will look
    // for them (`<work_dir>/n<id>`) before any node starts.
    let lazyfs = if config.nemeses.contains(&Kind::PowerCut) {
        let binary = lazyfs_mounts::find_binary()?;
        Some(Arc::new(Mounts::start(&binary, work_dir, &all_ids).await?))
    } else {
        None
    };
    let cluster = Cluster::start(ClusterConfig {
        lockd: lockd.clone(),
        nodes: config.nodes,
        work_dir: work_dir.to_path_buf(),
        log_dir: config.out.join("nodes"),
        in_netns,
        raft_dial,
        libfaketime: libfaketime.clone(),
        spare_ids: spare_ids.clone(),
        extra_args: extra_args.clone(),
        tls: !config.insecure,
    })
    .await
    .context("starting the cluster");
    let cluster = match (cluster, &lazyfs) {
        (Ok(cluster), Some(mounts)) => {
            let elsewhere = all_ids
                .iter()
                .find(|&&id| cluster.data_dir(id) != mounts.mountpoint(id));
            if let Some(id) = elsewhere {
                mounts.stop().await;
                bail!("node {id}'s data dir is not its lazyfs mount");
            }
            cluster
        }
        (Ok(cluster), None) => cluster,
        (Err(e), mounts) => {
            if let Some(mounts) = mounts {
                mounts.stop().await;
            }
            return Err(e);
        }
    };
    Ok((
        cluster,
        firewall,
        Setup {
            libfaketime,
            lockd,
            lockd_note,
            spare_ids,
            net_faults,
            extra_args,
            lazyfs,
        },
    ))
}

/// Prints the run's header on stdout: what runs, and how and why — the network mode and the
/// reason it was chosen, the clock faking, the binary the nodes run.
fn print_header(
    config: &RunConfig,
    libfaketime: Option<&Path>,
    lockd: &Path,
    lockd_note: &str,
    net_faults: Option<&str>,
    spare_ids: &[u64],
) {
    let nemeses: Vec<&str> = config.nemeses.iter().map(|k| k.name()).collect();
    println!(
        "lock-jepsen run: {} nodes, {} clients, {} keys, nemeses [{}], {:?} of faults + {:?} \
         tail, seed {}",
        config.nodes,
        config.clients,
        config.keys,
        nemeses.join(","),
        config.time,
        config.tail,
        config.seed
    );
    println!(
        "network: {} — {} — {}",
        config.net.name(),
        config.net.describe(),
        config.net_why
    );
    if config.insecure {
        println!("tls:     off (--insecure: plaintext, nobody authenticated)");
    } else {
        println!(
            "tls:     on — a CA minted for the run; nodes require client certificates (workload \
             `client`, nemeses `admin`)"
        );
    }
    match libfaketime {
        Some(lib) => println!("clock:   faked per node through {}", lib.display()),
        None => println!("clock:   not faked (no clock nemesis)"),
    }
    if let Some(note) = &config.nemesis_note {
        println!("note:    {note}");
    }
    if let Some(model) = net_faults {
        println!("links:   slow-net/flaky-net through {model}");
    }
    if !spare_ids.is_empty() {
        let ids: Vec<String> = spare_ids.iter().map(u64::to_string).collect();
        println!(
            "members: spare node ids {} for added and rebuilt members",
            ids.join(",")
        );
    }
    if config.nemeses.contains(&Kind::PowerCut) {
        println!(
            "disks:   every data dir on a lock-lazyfs mount (writes kept in memory until \
             fsync); power-cut loses a seeded part of a killed node's unsynced pages"
        );
    }
    if config.nemeses.contains(&Kind::Corrupt) {
        println!(
            "storage: snapshots every {CORRUPT_SNAPSHOT_LOGS} log entries, so the corrupt \
             nemesis finds snapshot files to damage"
        );
    }
    if config.nemeses.contains(&Kind::Outage) {
        println!(
            "outage:  each holds its node out for {:?}",
            config.outage_hold
        );
    }
    println!("lockd:   {} — {lockd_note}", lockd.display());
}

/// The workload and nemesis phases; returns the recorder and the nodes' resource samples once
/// every client stopped.
async fn run_phases(
    config: &RunConfig,
    cluster: &Arc<Mutex<Cluster>>,
    firewall: &Arc<Firewall>,
    lazyfs: Option<Arc<Mounts>>,
) -> anyhow::Result<(Arc<Recorder>, Vec<Sample>)> {
    let (endpoints, probe, nodes, processes, spares, workload_tls, admin_tls) = {
        let c = cluster.lock().await;
        (
            c.endpoints(),
            c.probe(),
            c.ids(),
            c.processes(),
            c.config().spare_ids.clone(),
            c.client_tls(crate::pki::WORKLOAD_IDENTITY),
            c.client_tls(crate::pki::ADMIN_IDENTITY),
        )
    };
    let recorder = Arc::new(Recorder::create(
        &config.out.join(HISTORY_FILE),
        Instant::now(),
    )?);
    let (sampler_stop, sampler_stop_rx) = watch::channel(false);
    let sampler = tokio::spawn(resources::sample_until(
        processes,
        Arc::clone(&recorder),
        sampler_stop_rx,
    ));
    let shared = Arc::new(Shared {
        recorder: Arc::clone(&recorder),
        register: FencedRegister::default(),
        pauses: ClientPauses::default(),
        stop: AtomicBool::new(false),
        granted: AtomicU64::new(0),
    });
    let workload = WorkloadConfig {
        clients: config.clients,
        keys: config.keys,
        ttl: config.ttl,
        max_wait: config.max_wait,
        long_hold_fraction: 0.15,
        seed: config.seed,
        tls: workload_tls,
    };
    let mut clients = Vec::new();
    for process in 0..config.clients {
        clients.push(tokio::spawn(workload::client(
            process,
            endpoints.clone(),
            workload.clone(),
            Arc::clone(&shared),
        )));
    }
    let lock_client = LockClient::connect_with(
        &endpoints,
        ClientConfig {
            jitter_seed: Some(config.seed),
            // The nemeses force-revoke and change the membership: admin.
            tls: admin_tls,
            ..ClientConfig::default()
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("connecting the nemesis client: {e}"))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        recorder: Arc::clone(&recorder),
        cluster: Arc::clone(cluster),
        probe: probe.clone(),
        firewall: Arc::clone(firewall),
        shared: Arc::clone(&shared),
        lock_client,
        stop: stop_rx,
        members: std::sync::Mutex::new(nodes),
        spares: std::sync::Mutex::new(spares),
        grown: AtomicBool::new(false),
        clients: config.clients,
        keys: config.keys,
        ttl: config.ttl,
        outage_hold: config.outage_hold,
        active: std::sync::Mutex::new(Vec::new()),
        lazyfs,
    });
    let seed_for =
        |salt: u64| StdRng::seed_from_u64(config.seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let node_kinds: Vec<Kind> = config
        .nemeses
        .iter()
        .copied()
        .filter(|k| k.is_node_fault())
        .collect();
    let mut nemeses = vec![tokio::spawn(nemesis::run_node_faults(
        Arc::clone(&ctx),
        node_kinds,
        seed_for(1),
    ))];
    if config.nemeses.contains(&Kind::Clock) {
        nemeses.push(tokio::spawn(nemesis::clock::run(
            Arc::clone(&ctx),
            seed_for(2),
        )));
    }
    if config.nemeses.contains(&Kind::ClientPause) {
        nemeses.push(tokio::spawn(nemesis::client_pause::run(
            Arc::clone(&ctx),
            seed_for(3),
        )));
    }
    if config.nemeses.contains(&Kind::Revoke) {
        nemeses.push(tokio::spawn(nemesis::revoke::run(
            Arc::clone(&ctx),
            seed_for(4),
        )));
    }
    let link_kinds: Vec<Kind> = config
        .nemeses
        .iter()
        .copied()
        .filter(|k| k.is_link_fault())
        .collect();
    if !link_kinds.is_empty() {
        nemeses.push(tokio::spawn(nemesis::link_faults::run(
            Arc::clone(&ctx),
            link_kinds,
            seed_for(5),
        )));
    }

    let interrupted = progress_until(Instant::now() + config.time, "faults", &ctx, &probe).await;
    // Stop faults: each nemesis heals what it holds.
    let _ = stop_tx.send(true);
    let mut nemesis_error = None;
    for task in nemeses {
        match tokio::time::timeout(NEMESIS_STOP_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => nemesis_error = Some(e),
            Ok(Err(e)) => nemesis_error = Some(anyhow::anyhow!("a nemesis task panicked: {e}")),
            Err(_) => {
                nemesis_error = Some(anyhow::anyhow!(
                    "a nemesis did not stop within {NEMESIS_STOP_TIMEOUT:?}"
                ))
            }
        }
    }
    if let Some(e) = nemesis_error {
        shared.stop.store(true, Ordering::SeqCst);
        return Err(e.context("a nemesis failed; the run has no verdict"));
    }
    if interrupted {
        shared.stop.store(true, Ordering::SeqCst);
        bail!("interrupted (Ctrl-C); the run has no verdict");
    }
    // The quiet tail, for the recovery property.
    if progress_until(Instant::now() + config.tail, "tail", &ctx, &probe).await {
        shared.stop.store(true, Ordering::SeqCst);
        bail!("interrupted (Ctrl-C); the run has no verdict");
    }
    shared.stop.store(true, Ordering::SeqCst);
    let client_stop_timeout = config.max_wait + config.ttl * 4 + CLIENT_STOP_SLACK;
    for task in clients {
        if tokio::time::timeout(client_stop_timeout, task)
            .await
            .is_err()
        {
            // Its operation in flight stays without a completion: the checker reads it as
            // an unknown outcome, which is what it is.
            eprintln!("lock-jepsen: a client did not stop within {client_stop_timeout:?}");
        }
    }
    let _ = sampler_stop.send(true);
    let samples = sampler
        .await
        .map_err(|e| anyhow::anyhow!("the resource sampler panicked: {e}"))?;
    eprintln!(
        "lock-jepsen: done: {} history lines, {} grants, {} resource samples",
        recorder.count(),
        shared.granted.load(Ordering::Relaxed),
        samples.len()
    );
    Ok((recorder, samples))
}

/// Prints a progress line every [`PROGRESS_EVERY`] until `until`; `true` if interrupted by
/// Ctrl-C.
async fn progress_until(
    until: Instant,
    phase: &str,
    ctx: &Ctx,
    probe: &crate::cluster::StatusProbe,
) -> bool {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(left.min(PROGRESS_EVERY)) => {}
            _ = tokio::signal::ctrl_c() => return true,
        }
        let leader = probe.leader().await;
        eprintln!(
            "[{:>6.1}s {phase:<6}] history lines {:>7}  grants {:>6}  leader {:<4}  faults {}",
            ctx.recorder.now_ns() as f64 / 1e9,
            ctx.recorder.count(),
            ctx.shared.granted.load(Ordering::Relaxed),
            leader.map_or("none".to_owned(), |l| format!("n{l}")),
            ctx.active()
        );
    }
}
