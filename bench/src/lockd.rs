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
use tonic::Status;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::procs::{NodeProcess, free_ports};
use crate::system::{
    Connections, KEEPER_TASKS, KeeperCounters, Keepers, LockSystem, LockWorker, keepalive_due,
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

/// The principal every benchmark connection presents: the `client` role covers sessions,
/// lock calls and `Status`.
const BENCH_IDENTITY: &str = "client";

/// What a TLS cluster's start needs from its PKI.
struct BenchPki {
    /// Each node's `--tls-*` flags, by index.
    node_args: Vec<Vec<String>>,
    /// `LOCKD_ROLES` and its value (every node `node`, [`BENCH_IDENTITY`] `client`).
    roles_env: (String, String),
    /// Every benchmark connection's TLS config.
    client: ClientTlsConfig,
}

/// Mints a CA, the nodes' certificates (`node-1` … `node-3`) and [`BENCH_IDENTITY`]'s into
/// `dir`.
fn mint_pki(dir: &Path) -> Result<BenchPki> {
    use lock_tls::mint::Authority;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = |name: &str| dir.join(name);
    let ca = Authority::new("lock-bench CA").context("minting the benchmark CA")?;
    ca.write(&path("ca.pem"), &path("ca-key.pem"))
        .context("writing the benchmark CA")?;
    let mut node_args = Vec::with_capacity(NODES);
    let mut roles = Vec::with_capacity(NODES + 1);
    for id in 1..=NODES {
        let principal = format!("node-{id}");
        let (cert, key) = (
            path(&format!("{principal}.pem")),
            path(&format!("{principal}-key.pem")),
        );
        ca.issue(&principal)
            .and_then(|leaf| leaf.write(&cert, &key))
            .with_context(|| format!("minting {principal}'s certificate"))?;
        node_args.push(vec![
            "--tls-ca".to_owned(),
            path("ca.pem").display().to_string(),
            "--tls-cert".to_owned(),
            cert.display().to_string(),
            "--tls-key".to_owned(),
            key.display().to_string(),
            "--require-client-cert".to_owned(),
        ]);
        roles.push(format!("{principal}=node"));
    }
    let client = ca
        .issue(BENCH_IDENTITY)
        .context("minting the benchmark client's certificate")?;
    roles.push(format!("{BENCH_IDENTITY}={BENCH_IDENTITY}"));
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
    Ok(BenchPki {
        node_args,
        roles_env: ("LOCKD_ROLES".to_owned(), roles.join(",")),
        client: tls,
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
        let (opened_tx, mut opened_rx) = mpsc::channel::<Result<()>>(KEEPER_TASKS);
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
                let opened = async {
                    let channel = channel_with(&addr, tls.as_ref()).await?;
                    let sessions = SessionServiceClient::new(channel);
                    // A few opens in flight at a time: one after the other, 1,000 sessions took
                    // 7.5 s to open on a loaded machine, and the first ones opened lapsed (3 s
                    // TTL with --quick) before the keep-alives began.
                    let mut ids = Vec::with_capacity(share);
                    let indices: Vec<usize> = (0..share).collect();
                    for chunk in indices.chunks(OPENS_IN_FLIGHT_PER_TASK) {
                        let mut opening = tokio::task::JoinSet::new();
                        for &i in chunk {
                            let mut sessions = sessions.clone();
                            let owner = format!("bench-keeper-{task}-{i}");
                            opening.spawn(async move {
                                let id = open_session(&mut sessions, &owner, ttl_ms).await;
                                (i, id)
                            });
                        }
                        let mut opened = opening.join_all().await;
                        opened.sort_by_key(|(i, _)| *i);
                        for (_, id) in opened {
                            ids.push(id?);
                        }
                    }
                    anyhow::Ok((sessions, ids))
                }
                .await;
                let (mut sessions, ids) = match opened {
                    Ok(v) => {
                        let _ = opened_tx.send(Ok(())).await;
                        v
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e)).await;
                        return;
                    }
                };
                if ids.is_empty() {
                    return;
                }
                let period = ttl / 3;
                let ahead = period / KEEPALIVE_COALESCE_AHEAD_FRACTION;
                let start = Instant::now();
                // Each session's next keep-alive, first spread evenly over one period as each
                // session's own timer would be. Per tick (the earliest due), every session due
                // within `ahead` goes out in HeartbeatBatch calls of at most the server's
                // limit, without waiting for earlier answers, and is next due one period
                // later: sessions sent together stay together, as in the SDK. The counters
                // count sessions kept alive, not calls.
                let mut due: Vec<Instant> = (0..ids.len())
                    .map(|i| keepalive_due(start, period, ids.len(), i as u64))
                    .collect();
                let in_flight = Arc::new(Semaphore::new(HEARTBEAT_BATCHES_IN_FLIGHT_MAX));
                'beat: loop {
                    let Some(tick) = due.iter().min().copied() else {
                        break 'beat;
                    };
                    tokio::select! {
                        _ = tokio::time::sleep_until(tick.into()) => {}
                        _ = stop.changed() => break 'beat,
                    }
                    let now = Instant::now();
                    let mut batch = Vec::new();
                    for (i, next) in due.iter_mut().enumerate() {
                        if *next <= now + ahead {
                            batch.push(ids[i].clone());
                            *next = now + period;
                        }
                    }
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
                // Stopped: once every batch in flight is answered (a batch answered after
                // its sessions closed would count as failed keep-alives), close the sessions,
                // so that the next W1 slice runs without them.
                let _all_answered = in_flight
                    .acquire_many(HEARTBEAT_BATCHES_IN_FLIGHT_MAX as u32)
                    .await;
                for session_id in ids {
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
        for _ in 0..KEEPER_TASKS {
            let opened = opened_rx
                .recv()
                .await
                .unwrap_or_else(|| Err(anyhow::anyhow!("a keep-alive task ended early")));
            if let Err(e) = opened {
                let _ = stop_tx.send(true);
                return Err(e.context("lockd: opening the W4 sessions"));
            }
        }
        Ok(Keepers::new(
            counters,
            stop_tx,
            tasks,
            count,
            started.elapsed().as_secs_f64(),
            ttl / 3,
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
