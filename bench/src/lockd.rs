//! lockd under test: starts a three-node cluster of real `lockd run` processes on free
//! loopback ports with data on disk, finds the leader, and drives it over the raw gRPC API of
//! `lock-proto` (sessions, Acquire, Release, HeartbeatBatch). Owns nothing of the workloads.
//!
//! The nodes serve TLS by default, as `lockd run` requires: a CA and certificates are minted
//! (lock-tls `mint`) into the data folder, the nodes require client certificates, and every
//! benchmark connection presents the `client` certificate. `--insecure` runs them plaintext,
//! so the cost of TLS is one flag between two runs of the same binary.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lock_client::pipeline::Pipeline;
use lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::heartbeat_batch_result::Outcome;
use lock_proto::v1::lock_service_client::LockServiceClient;
use lock_proto::v1::session_service_client::SessionServiceClient;
use lock_proto::v1::{
    AcquireRequest, AcquireResponse, CloseSessionRequest, HeartbeatBatchRequest,
    OpenSessionRequest, ReleaseRequest, ReleaseResponse, StatusRequest,
};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tonic::Status;
use tonic::transport::{Channel, ClientTlsConfig};

use crate::pki::BENCH_IDENTITY;
use crate::procs::{NodeProcess, free_ports};
use crate::system::{
    Connections, KEEPER_TASKS, KeeperCounters, Keepers, LockSystem, LockWorker, first_keepalive_due,
};

/// W5's hands on a running cluster's nodes (kill, restart, re-point at a new leader).
#[path = "scale/cluster_access.rs"]
mod cluster_access;

/// Nodes in the cluster.
const NODES: usize = 3;
/// How long the cluster gets to elect a leader that every node knows.
const LEADER_WAIT: Duration = Duration::from_secs(60);
/// Pause between two status polls while waiting for the leader.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Lease of a benchmark grant; far longer than any pair takes.
const GRANT_TTL_MS: u64 = 30_000;
/// How long a blocking acquire may wait server-side (W2 waits for at most 15 hand-offs).
const ACQUIRE_MAX_WAIT_MS: u64 = 60_000;
/// The server-side bound a pipelined call carries: the longest wait, with room to answer.
const CALL_TIMEOUT: Duration = Duration::from_millis(ACQUIRE_MAX_WAIT_MS + 10_000);
/// TTL of a worker's own session: longer than any run, so it needs no heartbeats.
const WORKER_SESSION_TTL_MS: u64 = 600_000;
/// Heartbeat batches in flight per keep-alive connection (W4): enough that a slow answer does
/// not hold back the batches due after it, bounded so a stalled server cannot pile up tasks.
const HEARTBEAT_BATCHES_IN_FLIGHT_MAX: usize = 64;
/// W4 keep-alives are sent the way the SDK (`lock-client`'s heartbeat schedule) sends them: a
/// session due within `period / KEEPALIVE_COALESCE_AHEAD_FRACTION` goes out with the sessions
/// due now, in one `HeartbeatBatch`. The SDK's value (`COALESCE_AHEAD_FRACTION`).
const KEEPALIVE_COALESCE_AHEAD_FRACTION: u32 = 4;
/// `OpenSession` calls each W4 keep-alive task has in flight while it opens its share.
const OPENS_IN_FLIGHT_PER_TASK: usize = 8;
/// Connect timeout for every channel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a plain-text HTTP/2 channel to `addr` (`host:port`), Nagle off.
pub async fn channel(addr: &str) -> Result<Channel> {
    channel_with(addr, None).await
}

/// The endpoint of `addr` (`host:port`) every lock-bench channel uses: Nagle off, a bounded
/// connect, TLS with `tls`, else plaintext.
pub fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<tonic::transport::Endpoint> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
        .with_context(|| format!("bad address {addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .with_context(|| format!("TLS config for {addr}"))?;
    }
    Ok(endpoint)
}

/// Opens an HTTP/2 channel to `addr` (`host:port`), Nagle off: TLS with `tls`, else plaintext.
pub async fn channel_with(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Channel> {
    endpoint(addr, tls)?
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// What a TLS cluster's start needs from its PKI.
struct NodeTls {
    /// Each node's `--tls-*` flags, by index.
    node_args: Vec<Vec<String>>,
    /// `LOCKD_ROLES` and its value (every node `node`, [`BENCH_IDENTITY`] `client`).
    roles_env: (String, String),
    /// Every benchmark connection's TLS config.
    client: ClientTlsConfig,
}

/// Mints a CA, the nodes' certificates (`node-1` … `node-3`) and [`BENCH_IDENTITY`]'s into
/// `dir`.
fn mint_pki(dir: &Path) -> Result<NodeTls> {
    let pki = crate::pki::BenchPki::mint(dir, "lock-bench lockd CA")?;
    let mut node_args = Vec::with_capacity(NODES);
    let mut roles = Vec::with_capacity(NODES + 1);
    for id in 1..=NODES {
        let principal = format!("node-{id}");
        let files = pki.issue(&principal)?;
        node_args.push(vec![
            "--tls-ca".to_owned(),
            pki.ca_file().display().to_string(),
            "--tls-cert".to_owned(),
            files.cert.display().to_string(),
            "--tls-key".to_owned(),
            files.key.display().to_string(),
            "--require-client-cert".to_owned(),
        ]);
        roles.push(format!("{principal}=node"));
    }
    roles.push(format!("{BENCH_IDENTITY}={BENCH_IDENTITY}"));
    Ok(NodeTls {
        node_args,
        roles_env: ("LOCKD_ROLES".to_owned(), roles.join(",")),
        client: pki.client(),
    })
}

/// How a lockd worker sends its lock calls (`--client`): the two client styles of the table.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ClientStyle {
    /// What a Go, Java or Python program written from `proto/` alone does: one unary
    /// `LockService.Acquire` / `Release` call each, with tonic's stubs generated from
    /// `proto/` (`lock-proto`) and nothing of the SDK, on the worker's own connection.
    Unary,
    /// On one `LockService.Pipeline` stream per worker (`lock_client::pipeline`), as the SDK
    /// sends every lock call.
    Pipeline,
}

impl ClientStyle {
    /// The style's name in tables, plots and messages.
    pub fn label(self) -> &'static str {
        match self {
            ClientStyle::Unary => "lockd, unary client",
            ClientStyle::Pipeline => "lockd, Pipeline stream",
        }
    }
}

/// A running three-node lockd cluster.
#[derive(Debug)]
pub struct LockdCluster {
    nodes: Vec<NodeProcess>,
    leader_addr: String,
    admin: AdminServiceClient<Channel>,
    /// How the workers created next send their lock calls ([`LockdCluster::set_client`]).
    calls: ClientStyle,
    /// The one connection (and pipeline) of every worker, with `Connections::Shared`.
    shared: Option<(Channel, Arc<Pipeline>)>,
    /// Every node's metrics endpoint (`--metrics-listen`), `host:port`.
    metrics: Vec<String>,
    /// Every connection's TLS config (`None`: the nodes run `--insecure`).
    tls: Option<ClientTlsConfig>,
}

impl LockdCluster {
    /// Starts three `lockd run` nodes with data under `data_dir` (node 1 bootstraps) and waits
    /// until every node knows the same leader. Its workers will send their calls as `calls`
    /// until [`LockdCluster::set_client`] says otherwise. With `tls` the nodes serve TLS with a
    /// PKI minted under `data_dir`, else `--insecure`.
    pub async fn start(
        bin: &Path,
        data_dir: &Path,
        calls: ClientStyle,
        connections: Connections,
        tls: bool,
    ) -> Result<Self> {
        let (node_tls, roles_env, tls) = if tls {
            let pki = mint_pki(&data_dir.join("pki"))?;
            (pki.node_args, vec![pki.roles_env], Some(pki.client))
        } else {
            (vec![vec!["--insecure".to_owned()]; NODES], Vec::new(), None)
        };
        // One call for the client and the metrics ports, so no port is handed out twice.
        let mut ports = free_ports(2 * NODES)?;
        let metrics: Vec<String> = ports
            .split_off(NODES)
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::with_capacity(NODES);
        for (i, addr) in addrs.iter().enumerate() {
            let id = i + 1;
            let dir = data_dir.join(format!("lockd-{id}"));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut args = vec![
                "run".to_owned(),
                "--node-id".to_owned(),
                id.to_string(),
                "--listen".to_owned(),
                addr.clone(),
                // Served whether or not this run scrapes: the families are kept either way,
                // and an idle listener costs nothing per call.
                "--metrics-listen".to_owned(),
                metrics[i].clone(),
                "--data-dir".to_owned(),
                dir.display().to_string(),
                "--peers".to_owned(),
                peers.clone(),
                "--log-format".to_owned(),
                "human".to_owned(),
                // Three nodes share the machine: each gets its share of the cores, as
                // `lockd dev` does (see lockd's `colocated_worker_threads`).
                "--worker-threads".to_owned(),
                lockd::config::colocated_worker_threads(NODES).to_string(),
            ];
            if id == 1 {
                args.push("--bootstrap".to_owned());
            }
            args.extend(node_tls[i].iter().cloned());
            nodes.push(NodeProcess::spawn_with_env(
                &format!("lockd-{id}"),
                bin,
                &args,
                &roles_env,
                data_dir,
            )?);
        }
        let deadline = Instant::now() + LEADER_WAIT;
        let leader_addr = loop {
            for node in &mut nodes {
                node.check_running()?;
            }
            if let Some(leader) = agreed_leader(&addrs, tls.as_ref()).await
                && serves_writes(&leader, tls.as_ref()).await
            {
                break leader;
            }
            if Instant::now() > deadline {
                bail!(
                    "lockd: no leader known to all {NODES} nodes and serving writes within \
                     {LEADER_WAIT:?}; see the node logs in {}",
                    data_dir.display()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        let admin = AdminServiceClient::new(channel_with(&leader_addr, tls.as_ref()).await?);
        let shared = match connections {
            Connections::Shared => {
                let channel = channel_with(&leader_addr, tls.as_ref()).await?;
                Some((channel.clone(), Arc::new(Pipeline::new(channel))))
            }
            Connections::PerWorker => None,
        };
        Ok(Self {
            nodes,
            leader_addr,
            admin,
            calls,
            shared,
            metrics,
            tls,
        })
    }

    /// Workers created from now on send their lock calls as `style`; workers already created
    /// keep theirs.
    pub fn set_client(&mut self, style: ClientStyle) {
        self.calls = style;
    }

    /// Every node's metrics endpoint, `host:port`.
    pub fn metrics_targets(&self) -> &[String] {
        &self.metrics
    }

    /// The leader's client address.
    pub fn leader_addr(&self) -> &str {
        &self.leader_addr
    }

    /// Stops every node (SIGTERM).
    pub async fn stop(self) -> Result<()> {
        let mut first_error = None;
        for node in self.nodes {
            if let Err(e) = node.stop().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The leader address if every node reports the same leader, else `None`.
async fn agreed_leader(addrs: &[String], tls: Option<&ClientTlsConfig>) -> Option<String> {
    let mut leader: Option<(u64, String)> = None;
    for addr in addrs {
        let mut admin = AdminServiceClient::new(channel_with(addr, tls).await.ok()?);
        let status = admin.status(StatusRequest {}).await.ok()?.into_inner();
        let id = status.leader_id?;
        if status.leader_addr.is_empty() {
            return None;
        }
        match &leader {
            None => leader = Some((id, status.leader_addr)),
            Some((known, _)) if *known != id => return None,
            Some(_) => {}
        }
    }
    leader.map(|(_, addr)| addr)
}

/// Whether the leader at `addr` serves writes: it opens and closes a session. A node every peer
/// names as leader may still refuse them for a moment (a new term's election right after the
/// cluster starts, or its promote not applied yet), and the workloads' workers do not retry.
async fn serves_writes(addr: &str, tls: Option<&ClientTlsConfig>) -> bool {
    let Ok(channel) = channel_with(addr, tls).await else {
        return false;
    };
    let mut sessions = SessionServiceClient::new(channel);
    let Ok(session_id) = open_session(&mut sessions, "bench-ready-probe", 5_000).await else {
        return false;
    };
    sessions
        .close_session(CloseSessionRequest { session_id })
        .await
        .is_ok()
}

/// Opens a session of `ttl_ms` for `owner` and answers its id.
async fn open_session(
    sessions: &mut SessionServiceClient<Channel>,
    owner: &str,
    ttl_ms: u64,
) -> Result<String> {
    let answer = sessions
        .open_session(OpenSessionRequest {
            owner_id: owner.to_owned(),
            ttl_ms,
        })
        .await
        .with_context(|| format!("OpenSession for {owner}"))?;
    Ok(answer.into_inner().session_id)
}

impl LockSystem for LockdCluster {
    type Worker = LockdWorker;

    async fn worker(&self, index: usize) -> Result<LockdWorker> {
        let channel = match &self.shared {
            Some((shared, _)) => shared.clone(),
            None => channel_with(&self.leader_addr, self.tls.as_ref()).await?,
        };
        let mut sessions = SessionServiceClient::new(channel.clone());
        let session_id = open_session(
            &mut sessions,
            &format!("bench-worker-{index}"),
            WORKER_SESSION_TTL_MS,
        )
        .await?;
        let lock = match self.calls {
            ClientStyle::Pipeline => Calls::Pipeline(match &self.shared {
                Some((_, pipeline)) => pipeline.clone(),
                None => Arc::new(Pipeline::new(channel)),
            }),
            ClientStyle::Unary => Calls::Unary(LockServiceClient::new(channel)),
        };
        Ok(LockdWorker {
            lock,
            session_id,
            next_request_id: 1,
            held: None,
        })
    }

    async fn start_keepers(&self, count: usize, ttl: Duration) -> Result<Keepers> {
        let started = Instant::now();
        let counters = Arc::new(KeeperCounters::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        // Each task reports once its share is open: the sum of its sessions' opens measured
        // from `started`, for the keep-alives' rate.
        let (opened_tx, mut opened_rx) = mpsc::channel::<Result<Duration>>(KEEPER_TASKS);
        let ttl_ms = ttl.as_millis() as u64;
        let mut tasks = Vec::with_capacity(KEEPER_TASKS);
        for task in 0..KEEPER_TASKS {
            let share = count / KEEPER_TASKS + usize::from(task < count % KEEPER_TASKS);
            let addr = self.leader_addr.clone();
            let tls = self.tls.clone();
            let counters = counters.clone();
            let opened_tx = opened_tx.clone();
            let mut stop = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                let sessions = match channel_with(&addr, tls.as_ref()).await {
                    Ok(channel) => SessionServiceClient::new(channel),
                    Err(e) => {
                        let _ = opened_tx.send(Err(e)).await;
                        return;
                    }
                };
                if share == 0 {
                    let _ = opened_tx.send(Ok(Duration::ZERO)).await;
                    return;
                }
                // The task opens its share and beats it at once: a session joins the beats as
                // soon as it is open, its first keep-alive due within one period of its open
                // (`BeatSchedule`). Opening 99,000 sessions took 11.5 s on a slowed machine,
                // and with every beat waiting for the whole share to open, the sessions opened
                // first lapsed (15 s TTL) before their first keep-alive. A few opens are in
                // flight at a time: one after the other, 1,000 sessions took 7.5 s to open on
                // a loaded machine.
                let open = |opening: &mut JoinSet<Result<(String, Instant)>>, i: usize| {
                    let mut sessions = sessions.clone();
                    let owner = format!("bench-keeper-{task}-{i}");
                    opening.spawn(async move {
                        // The instant the open was sent: the server starts the session's TTL
                        // after it, so a first keep-alive due from here is never late.
                        let sent = Instant::now();
                        let id = open_session(&mut sessions, &owner, ttl_ms).await?;
                        Ok((id, sent))
                    });
                };
                let mut opening = JoinSet::new();
                let mut unopened = 0..share;
                for i in unopened.by_ref().take(OPENS_IN_FLIGHT_PER_TASK) {
                    open(&mut opening, i);
                }
                let mut opens_since_start = Duration::ZERO;
                let period = ttl / 3;
                let ahead = period / KEEPALIVE_COALESCE_AHEAD_FRACTION;
                let start = Instant::now();
                let mut schedule = BeatSchedule::new(share, period);
                let in_flight = Arc::new(Semaphore::new(HEARTBEAT_BATCHES_IN_FLIGHT_MAX));
                'beat: loop {
                    let tick = schedule.next_due();
                    // No tick until a session is open: the branch is off, its sleep not polled.
                    let tick_sleep = tokio::time::sleep_until(tick.unwrap_or(start).into());
                    tokio::select! {
                        joined = opening.join_next(), if !opening.is_empty() => {
                            let opened = match joined {
                                Some(Ok(opened)) => opened,
                                Some(Err(e)) => Err(anyhow::anyhow!("an OpenSession task failed: {e}")),
                                None => continue 'beat,
                            };
                            match opened {
                                Ok((id, sent)) => {
                                    schedule.add(id, sent);
                                    opens_since_start += sent.saturating_duration_since(started);
                                    if let Some(i) = unopened.next() {
                                        open(&mut opening, i);
                                    } else if opening.is_empty() {
                                        let _ = opened_tx.send(Ok(opens_since_start)).await;
                                    }
                                }
                                Err(e) => {
                                    let _ = opened_tx.send(Err(e)).await;
                                    break 'beat;
                                }
                            }
                            continue 'beat;
                        }
                        _ = tick_sleep, if tick.is_some() => {}
                        _ = stop.changed() => break 'beat,
                    }
                    // Per tick (the earliest due), every session due within `ahead` goes out in
                    // HeartbeatBatch calls of at most the server's limit, without waiting for
                    // earlier answers. The counters count sessions kept alive, not calls.
                    let batch = schedule.take_due(Instant::now(), ahead);
                    for chunk in batch.chunks(HEARTBEAT_BATCH_SESSIONS_MAX) {
                        let Ok(permit) = in_flight.clone().acquire_owned().await else {
                            break 'beat;
                        };
                        let session_ids = chunk.to_vec();
                        let mut sessions = sessions.clone();
                        let counters = counters.clone();
                        tokio::spawn(async move {
                            let sent = session_ids.len() as u64;
                            let answer = sessions
                                .heartbeat_batch(HeartbeatBatchRequest { session_ids })
                                .await;
                            drop(permit);
                            count_batch(&counters, sent, answer, start);
                        });
                    }
                }
                // Stopped (or an open failed): opens still in flight are abandoned (a session
                // they open lapses by its TTL); once every batch in flight is answered (a
                // batch answered after its sessions closed would count as failed keep-alives),
                // close the sessions, so that the next W1 slice runs without them.
                opening.abort_all();
                let _all_answered = in_flight
                    .acquire_many(HEARTBEAT_BATCHES_IN_FLIGHT_MAX as u32)
                    .await;
                let mut sessions = sessions;
                for session_id in schedule.into_ids() {
                    let closed = sessions
                        .close_session(CloseSessionRequest { session_id })
                        .await;
                    if let Err(status) = closed {
                        counters.close_failed(format!("CloseSession: {status}"));
                    }
                }
            }));
        }
        // Each task reports once, after opening its share (the tasks keep their senders).
        drop(opened_tx);
        let mut opens_since_start = Duration::ZERO;
        for _ in 0..KEEPER_TASKS {
            let opened = opened_rx
                .recv()
                .await
                .unwrap_or_else(|| Err(anyhow::anyhow!("a keep-alive task ended early")));
            match opened {
                Ok(opens) => opens_since_start += opens,
                Err(e) => {
                    let _ = stop_tx.send(true);
                    return Err(e.context("lockd: opening the W4 sessions"));
                }
            }
        }
        // The keep-alives' rate runs from the sessions' mean open: each beats from its own.
        let beats_from = started
            + Duration::from_secs_f64(opens_since_start.as_secs_f64() / count.max(1) as f64);
        Ok(Keepers::new(
            counters,
            stop_tx,
            tasks,
            count,
            started.elapsed().as_secs_f64(),
            ttl / 3,
            beats_from,
        ))
    }

    fn cpu_seconds(&self) -> f64 {
        self.nodes.iter().filter_map(NodeProcess::cpu_seconds).sum()
    }

    async fn log_position(&self) -> Result<u64> {
        let status = self
            .admin
            .clone()
            .status(StatusRequest {})
            .await
            .context("lockd AdminService.Status")?;
        Ok(status.into_inner().commit_index)
    }
}

/// One W4 keep-alive task's sessions and when each is next due. A session joins as soon as it
/// is open, its first keep-alive due within one period of its open ([`first_keepalive_due`]),
/// so a task still opening its share already beats the sessions it opened first.
#[derive(Debug)]
struct BeatSchedule {
    /// The task's share of sessions, over which the first keep-alives are spread.
    share: usize,
    /// A third of the sessions' TTL.
    period: Duration,
    ids: Vec<String>,
    /// When each of `ids` is next due.
    due: Vec<Instant>,
    /// The earliest of `due`, kept so that adding a session scans nothing.
    next: Option<Instant>,
}

impl BeatSchedule {
    /// An empty schedule for a share of `share` sessions beaten every `period`.
    fn new(share: usize, period: Duration) -> Self {
        Self {
            share,
            period,
            ids: Vec::with_capacity(share),
            due: Vec::with_capacity(share),
            next: None,
        }
    }

    /// Adds session `id`, opened at `opened`, as the next of the share.
    fn add(&mut self, id: String, opened: Instant) {
        let due = first_keepalive_due(opened, self.period, self.share, self.ids.len());
        self.next = Some(self.next.map_or(due, |next| next.min(due)));
        self.ids.push(id);
        self.due.push(due);
    }

    /// When the earliest keep-alive is due; `None` before any session has opened.
    fn next_due(&self) -> Option<Instant> {
        self.next
    }

    /// Takes every session due by `now + ahead` and makes each next due one period after
    /// `now`: sessions sent together stay together, as in the SDK, and none goes out later
    /// than it is due, only up to `ahead` sooner.
    fn take_due(&mut self, now: Instant, ahead: Duration) -> Vec<String> {
        let mut batch = Vec::new();
        for (id, next) in self.ids.iter().zip(&mut self.due) {
            if *next <= now + ahead {
                batch.push(id.clone());
                *next = now + self.period;
            }
        }
        self.next = self.due.iter().min().copied();
        batch
    }

    /// Every session added, for closing them.
    fn into_ids(self) -> Vec<String> {
        self.ids
    }
}

/// Counts the answer to a `HeartbeatBatch` of `sent` sessions, per session: each result
/// answered alive is one keep-alive; each other result, or each session of a failed call, one
/// failure.
fn count_batch(
    counters: &KeeperCounters,
    sent: u64,
    answer: Result<tonic::Response<lock_proto::v1::HeartbeatBatchResponse>, tonic::Status>,
    start: Instant,
) {
    let results = match answer {
        Ok(answer) => answer.into_inner().results,
        Err(status) => {
            counters.fail(format!(
                "HeartbeatBatch of {sent} sessions: {}",
                lock_proto::lock_error_from_status(&status)
            ));
            counters.errors.fetch_add(sent - 1, Ordering::Relaxed);
            return;
        }
    };
    if results.len() as u64 != sent {
        counters.fail(format!(
            "HeartbeatBatch of {sent} sessions answered {} results",
            results.len()
        ));
        counters.errors.fetch_add(sent - 1, Ordering::Relaxed);
        return;
    }
    for result in results {
        match result.outcome {
            Some(Outcome::Heartbeat(h)) if h.alive => {
                counters.ok.fetch_add(1, Ordering::Relaxed);
            }
            Some(Outcome::Heartbeat(_)) => counters.fail(format!(
                "HeartbeatBatch answered alive=false (session lapsed) {:?} into the keep-alive \
                 load",
                start.elapsed()
            )),
            Some(Outcome::Error(detail)) => counters.fail(format!(
                "HeartbeatBatch: {}",
                lock_proto::error::lock_error_from_detail(detail)
            )),
            None => counters.fail("HeartbeatBatch answered a result without an outcome".into()),
        }
    }
}

/// A worker's way of sending lock calls (see [`ClientStyle`]).
#[derive(Debug)]
enum Calls {
    Pipeline(Arc<Pipeline>),
    Unary(LockServiceClient<Channel>),
}

impl Calls {
    async fn acquire(&mut self, request: AcquireRequest) -> Result<AcquireResponse, Status> {
        let answer = match self {
            Calls::Pipeline(p) => p.acquire(request, CALL_TIMEOUT).await,
            Calls::Unary(c) => c.acquire(request).await,
        };
        answer.map(tonic::Response::into_inner)
    }

    async fn release(&mut self, request: ReleaseRequest) -> Result<ReleaseResponse, Status> {
        let answer = match self {
            Calls::Pipeline(p) => p.release(request, CALL_TIMEOUT).await,
            Calls::Unary(c) => c.release(request).await,
        };
        answer.map(tonic::Response::into_inner)
    }
}

/// A lockd benchmark worker: one connection and one session.
#[derive(Debug)]
pub struct LockdWorker {
    lock: Calls,
    session_id: String,
    next_request_id: u64,
    held: Option<(String, u64)>,
}

impl LockdWorker {
    fn request_id(&mut self) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }
}

impl LockWorker for LockdWorker {
    async fn acquire(&mut self, key: &str) -> Result<u64> {
        let request = AcquireRequest {
            session_id: self.session_id.clone(),
            request_id: self.request_id(),
            key: key.to_owned(),
            ttl_ms: GRANT_TTL_MS,
            max_wait_ms: ACQUIRE_MAX_WAIT_MS,
        };
        let answer = self.lock.acquire(request).await.map_err(|s| {
            anyhow::anyhow!("Acquire {key}: {}", lock_proto::lock_error_from_status(&s))
        })?;
        let Some(grant) = answer.grant else {
            bail!("Acquire {key}: not granted within {ACQUIRE_MAX_WAIT_MS} ms");
        };
        self.held = Some((grant.key, grant.fencing_token));
        Ok(grant.fencing_token)
    }

    async fn release(&mut self) -> Result<()> {
        let Some((key, fencing_token)) = self.held.take() else {
            bail!("release without a held grant");
        };
        let request = ReleaseRequest {
            session_id: self.session_id.clone(),
            request_id: self.request_id(),
            key,
            fencing_token,
        };
        let answer =
            self.lock.release(request).await.map_err(|s| {
                anyhow::anyhow!("Release: {}", lock_proto::lock_error_from_status(&s))
            })?;
        if !answer.released {
            bail!("Release of token {fencing_token}: answered released=false (grant lost)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_session_opened_while_its_share_opens_is_beaten_within_one_period_of_its_open() {
        // One task's share of 99,000 sessions opened over 11.5 s, TTL 15 s, stepped through
        // as the task runs it: the next open or the next keep-alive, whichever comes first.
        let (t0, period) = (Instant::now(), Duration::from_secs(5));
        let ahead = period / KEEPALIVE_COALESCE_AHEAD_FRACTION;
        let share = 99_000 / KEEPER_TASKS;
        let open_every = Duration::from_secs_f64(11.5 / share as f64);
        let end = t0 + Duration::from_secs(30);
        let mut schedule = BeatSchedule::new(share, period);
        let (mut opened, mut beats) = (Vec::new(), HashMap::<String, Vec<Instant>>::new());
        let mut ticks = Vec::new();
        loop {
            let open_at = (opened.len() < share).then(|| t0 + open_every * opened.len() as u32);
            match (open_at, schedule.next_due()) {
                (Some(at), tick) if tick.is_none_or(|tick| at <= tick) => {
                    schedule.add(format!("s{}", opened.len()), at);
                    opened.push(at);
                }
                (_, Some(tick)) if tick < end => {
                    ticks.push(tick);
                    for id in schedule.take_due(tick, ahead) {
                        beats.entry(id).or_default().push(tick);
                    }
                }
                _ => break,
            }
        }
        assert_eq!(opened.len(), share);
        for (n, at) in opened.iter().enumerate() {
            let beats = &beats[&format!("s{n}")];
            assert!(beats[0] >= *at, "session {n} beaten before its open");
            assert!(
                beats[0] - *at <= period,
                "session {n}: first keep-alive {:?} after its open",
                beats[0] - *at
            );
            for pair in beats.windows(2) {
                let gap = pair[1] - pair[0];
                assert!(gap <= period, "session {n}: {gap:?} between keep-alives");
                assert!(
                    gap >= period - ahead,
                    "session {n}: {gap:?} between keep-alives"
                );
            }
            assert!(
                end - beats[beats.len() - 1] <= period,
                "session {n} stopped beating"
            );
        }
        // The small batches of the first period (a session is first due soon after its open)
        // merge later: once the share is open, a period has a batch per `ahead` at most.
        let last_period = ticks.iter().filter(|&&t| t >= end - period).count();
        assert!(
            last_period <= KEEPALIVE_COALESCE_AHEAD_FRACTION as usize + 1,
            "{last_period} batches in the last period, {} in all",
            ticks.len()
        );
    }

    #[test]
    fn sessions_due_together_go_out_together_and_stay_together() {
        let (t0, period) = (Instant::now(), Duration::from_secs(5));
        let ahead = period / KEEPALIVE_COALESCE_AHEAD_FRACTION;
        let mut schedule = BeatSchedule::new(4, period);
        assert_eq!(schedule.next_due(), None);
        for n in 0..4 {
            schedule.add(format!("s{n}"), t0);
        }
        // Due at 1.25, 2.5, 3.75 and 5 s: the first tick takes those within `ahead` of it.
        let first = schedule.next_due().expect("sessions added");
        assert_eq!(first, t0 + period / 4);
        assert_eq!(schedule.take_due(first, ahead), ["s0", "s1"]);
        assert_eq!(schedule.next_due(), Some(t0 + period * 3 / 4));
        let second = schedule.take_due(t0 + period * 3 / 4, ahead);
        assert_eq!(second, ["s2", "s3"]);
        // s0 and s1 are next due together, one period after they went out.
        assert_eq!(schedule.next_due(), Some(first + period));
        assert_eq!(schedule.take_due(first + period, ahead), ["s0", "s1"]);
        assert_eq!(schedule.into_ids(), ["s0", "s1", "s2", "s3"]);
    }
}
