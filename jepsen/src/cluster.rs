//! The cluster under test: real `lockd` processes, each with its own address (and, inside a
//! namespace, its own uid), data directory, log file, (optionally) faked wall clock and
//! (in proxy mode) `--raft-dial` pointing at its links' proxies.
//!
//! Owns the processes: spawning them (docs/NODE_CLI.md's command line), noticing their ready line,
//! SIGKILL / SIGSTOP / SIGCONT / SIGTERM, restarting a killed node on its data, setting a
//! node's wall-clock offset, asking nodes who leads, and noticing a node that exits when
//! nobody killed it (a crash is a finding, reported in the results). Must not decide when to
//! do any of this (the nemeses do) and must not touch the network rules ([`crate::net`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lock_proto::v1;
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::oneshot;

use crate::net;
use crate::pki::{ADMIN_IDENTITY, Pki};

/// The line a node prints on stdout once it serves (docs/NODE_CLI.md).
pub const READY_LINE_PREFIX: &str = "lockd ready";

/// How long a (re)started node may take to print its ready line: opening sled and replaying
/// the log of a few minutes' run takes well under a second; 30 s means it is stuck.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a node may take to exit after SIGTERM before it is killed.
pub const NODE_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one status probe may take: a running node on loopback answers in a millisecond;
/// a paused or cut-off one never does, and the nemesis must not wait on it.
pub const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// Port every node listens on (each on its own address inside the namespace).
pub const NETNS_PORT: u16 = 7101;

/// Ports outside a namespace: all nodes on 127.0.0.1, node n on
/// `BASE_PORT + PORT_STRIDE * slot + n` where `slot` comes from the harness's pid, so concurrent runs (parallel tests) rarely
/// collide; a collision fails the start with an error naming the node's log.
pub const BASE_PORT: u16 = 20000;

/// Ports per slot outside a namespace (see [`BASE_PORT`]): node ids 1..=`PORT_STRIDE - 1`, which
/// covers every id a run uses (`crate::runner::NODE_ID_MAX`).
const PORT_STRIDE: u16 = 20;

/// Number of port slots outside a namespace (see [`BASE_PORT`]). Every node port stays below
/// `EPHEMERAL_PORT_MIN`, so no ephemeral port — a proxy's listener, the source port of any
/// connection — can take a node's port before the node binds it or while it restarts.
const PORT_SLOTS: u32 = 600;

/// Start of Linux's default ephemeral port range (`net.ipv4.ip_local_port_range`).
const EPHEMERAL_PORT_MIN: u32 = 32768;

const _: () = assert!(BASE_PORT as u32 + PORT_STRIDE as u32 * PORT_SLOTS < EPHEMERAL_PORT_MIN);
const _: () = assert!(crate::runner::NODE_ID_MAX < PORT_STRIDE as u64);

/// Raft timings given to every node: lockd's defaults, spelled out so a run's report says
/// what it ran with.
pub const HEARTBEAT_INTERVAL_MS: u64 = 100;
/// See [`HEARTBEAT_INTERVAL_MS`].
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 400;
/// See [`HEARTBEAT_INTERVAL_MS`].
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 600;

/// Where libfaketime lives: Debian and Ubuntu (package `libfaketime`, per architecture), then
/// Fedora and Arch.
pub const LIBFAKETIME_PATHS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// What to install for the clock nemesis, in every message that finds libfaketime missing.
pub const LIBFAKETIME_MISSING: &str = "libfaketime is not installed (no libfaketime.so.1 in \
     its usual folders); install the libfaketime package (apt-get install libfaketime, or \
     faketime, which pulls it in)";

/// The first libfaketime found, if any.
pub fn find_libfaketime() -> Option<PathBuf> {
    LIBFAKETIME_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// How the cluster is laid out.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `lockd` binary.
    pub lockd: PathBuf,
    /// Number of nodes.
    pub nodes: u64,
    /// Folder for data directories and clock files (must be traversable by node uids).
    pub work_dir: PathBuf,
    /// Folder for node logs.
    pub log_dir: PathBuf,
    /// Inside a namespace: own addresses and uids per node.
    pub in_netns: bool,
    /// Per node, its `--raft-dial` value (proxy mode: its links' proxies); none for a node
    /// that dials its peers directly.
    pub raft_dial: BTreeMap<u64, String>,
    /// libfaketime to preload, for the clock nemesis.
    pub libfaketime: Option<PathBuf>,
    /// Ids of nodes prepared (address, folders, status channel) but not started: the
    /// membership and corrupt nemeses start them as new members ([`Cluster::start_new`]).
    pub spare_ids: Vec<u64>,
    /// Extra `lockd run` arguments for every node (e.g. a shorter snapshot interval).
    pub extra_args: Vec<String>,
    /// Serve TLS with a PKI minted for the run (`work_dir/pki`), as `lockd run` requires by
    /// default; `false` runs the nodes `--insecure` (plaintext).
    pub tls: bool,
}

/// How a (re)start that may fail went ([`Cluster::restart_or_refuse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartOutcome {
    /// The node printed its ready line.
    Ready,
    /// The node exited before it was ready; the end of its log, which should say why.
    Refused {
        /// How it exited.
        status: String,
        /// The last lines it logged (at most [`REFUSAL_LOG_TAIL_BYTES`]).
        log_tail: String,
    },
}

/// How much of a refusing node's log [`StartOutcome::Refused`] keeps.
pub const REFUSAL_LOG_TAIL_BYTES: u64 = 4 * 1024;

/// An unexpected exit of a node: a crash, a finding of the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Crash {
    /// The node.
    pub node: u64,
    /// How it exited.
    pub status: String,
    /// Seconds since the cluster started.
    pub after_s: f64,
}

#[derive(Debug)]
struct Process {
    pid: i32,
    /// Set before the harness signals the process to end, so its exit is not a crash.
    expected_exit: Arc<AtomicBool>,
    exited: Option<oneshot::Receiver<()>>,
}

#[derive(Debug)]
struct Node {
    addr: String,
    data_dir: PathBuf,
    clock_file: PathBuf,
    log: PathBuf,
    process: Option<Process>,
    paused: bool,
    starts: u32,
}

/// The running cluster.
#[derive(Debug)]
pub struct Cluster {
    config: ClusterConfig,
    peers: String,
    nodes: BTreeMap<u64, Node>,
    started: Instant,
    crashes: Arc<Mutex<Vec<Crash>>>,
    probe: StatusProbe,
    processes: Processes,
    /// The run's CA and certificates, with [`ClusterConfig::tls`].
    pki: Option<Arc<Pki>>,
}

/// Which process each node runs now, and where it logs; cheap to clone and readable without
/// the cluster's lock (a restart holds that lock until the node is ready, and the resource
/// sampler must not stall on it).
#[derive(Clone, Debug)]
pub struct Processes {
    pids: Arc<Mutex<BTreeMap<u64, i32>>>,
    /// Nodes that were ever started, with their log files (a spare joins at its first start).
    logs: Arc<Mutex<BTreeMap<u64, PathBuf>>>,
}

impl Processes {
    /// Every node ever started with its running process (none while it is down) and its log
    /// file.
    pub fn snapshot(&self) -> Vec<(u64, Option<i32>, PathBuf)> {
        let pids = self.pids.lock().unwrap_or_else(|p| p.into_inner());
        let logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        logs.iter()
            .map(|(id, log)| (*id, pids.get(id).copied(), log.clone()))
            .collect()
    }

    fn started(&self, id: u64, pid: i32, log: &Path) {
        self.logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert_with(|| log.to_path_buf());
        self.pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, pid);
    }

    /// Forgets node `id`'s process if it is still `pid` (a restart may already have put a
    /// new one in its place).
    fn exited(&self, id: u64, pid: i32) {
        let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner());
        if pids.get(&id) == Some(&pid) {
            pids.remove(&id);
        }
    }
}

/// Asks nodes for their Raft status; cheap to clone, usable without the cluster's lock.
#[derive(Clone, Debug)]
pub struct StatusProbe {
    channels: Vec<(u64, tonic::transport::Channel)>,
}

impl StatusProbe {
    /// The node that claims leadership with the highest term, if any answers as leader.
    pub async fn leader(&self) -> Option<u64> {
        let asks = self.channels.iter().map(|(id, channel)| {
            let channel = channel.clone();
            let id = *id;
            async move {
                let mut client = v1::admin_service_client::AdminServiceClient::new(channel);
                let mut request = tonic::Request::new(v1::StatusRequest {});
                request.set_timeout(STATUS_TIMEOUT);
                let answer = tokio::time::timeout(STATUS_TIMEOUT, client.status(request)).await;
                match answer {
                    Ok(Ok(status)) => Some((id, status.into_inner())),
                    _ => None,
                }
            }
        });
        let answers = futures_join_all(asks).await;
        answers
            .into_iter()
            .flatten()
            .filter(|(_, s)| s.role == v1::Role::Leader as i32)
            .max_by_key(|(_, s)| s.current_term)
            .map(|(id, _)| id)
    }

    /// A channel to node `id`'s gRPC service.
    pub fn channel(&self, id: u64) -> Option<tonic::transport::Channel> {
        self.channels
            .iter()
            .find(|(n, _)| *n == id)
            .map(|(_, c)| c.clone())
    }

    /// Node `id`'s own status, if it answers within [`STATUS_TIMEOUT`].
    pub async fn status(&self, id: u64) -> Option<v1::StatusResponse> {
        let channel = self.channel(id)?;
        let mut client = v1::admin_service_client::AdminServiceClient::new(channel);
        let mut request = tonic::Request::new(v1::StatusRequest {});
        request.set_timeout(STATUS_TIMEOUT);
        match tokio::time::timeout(STATUS_TIMEOUT, client.status(request)).await {
            Ok(Ok(status)) => Some(status.into_inner()),
            _ => None,
        }
    }

    /// Whether every node in `ids` answers and all agree on one leader.
    pub async fn settled(&self, ids: &[u64]) -> bool {
        let mut leaders = Vec::new();
        for (_, channel) in self.channels.iter().filter(|(id, _)| ids.contains(id)) {
            let mut client = v1::admin_service_client::AdminServiceClient::new(channel.clone());
            let mut request = tonic::Request::new(v1::StatusRequest {});
            request.set_timeout(STATUS_TIMEOUT);
            match tokio::time::timeout(STATUS_TIMEOUT, client.status(request)).await {
                Ok(Ok(s)) => leaders.push(s.into_inner().leader_id),
                _ => return false,
            }
        }
        leaders
            .first()
            .is_some_and(|first| first.is_some() && leaders.iter().all(|l| l == first))
    }
}

/// Where node `id` listens: its own address inside a namespace, else its own port on
/// 127.0.0.1 (see [`BASE_PORT`]).
pub fn node_addr(in_netns: bool, id: u64) -> anyhow::Result<String> {
    if in_netns {
        return Ok(format!("{}:{NETNS_PORT}", net::node_ip(id)));
    }
    let slot = u16::try_from(std::process::id() % PORT_SLOTS).unwrap_or(0);
    let id = u16::try_from(id)
        .ok()
        .filter(|&id| id < PORT_STRIDE)
        .with_context(|| {
            format!(
                "node {id}: ids go up to {} outside a namespace",
                PORT_STRIDE - 1
            )
        })?;
    Ok(format!("127.0.0.1:{}", BASE_PORT + PORT_STRIDE * slot + id))
}

/// Awaits every future, concurrently, in order (a tiny `join_all`, to keep dependencies
/// light).
async fn futures_join_all<F, T>(futures: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        if let Ok(value) = handle.await {
            out.push(value);
        }
    }
    out
}

impl Cluster {
    /// Prepares the nodes' folders and starts every node; node 1 bootstraps the cluster.
    /// Returns once every node printed its ready line and all agree on a leader.
    pub async fn start(config: ClusterConfig) -> anyhow::Result<Self> {
        if !config.lockd.is_file() {
            bail!(
                "lockd binary not found at {}; build it with `cargo build -p lockd` or pass --lockd",
                config.lockd.display()
            );
        }
        std::fs::create_dir_all(&config.work_dir)
            .with_context(|| format!("creating {}", config.work_dir.display()))?;
        std::fs::create_dir_all(&config.log_dir)
            .with_context(|| format!("creating {}", config.log_dir.display()))?;
        let mut nodes = BTreeMap::new();
        let mut peers = Vec::new();
        let mut channels = Vec::new();
        let all_ids: Vec<u64> = (1..=config.nodes)
            .chain(config.spare_ids.iter().copied())
            .collect();
        let pki = if config.tls {
            let node_uid: Option<fn(u64) -> u32> = config.in_netns.then_some(net::node_uid);
            let in_netns = config.in_netns;
            // Inside the namespace each node has its own address (127.0.0.1 is in every
            // certificate anyway).
            let node_ip = move |id: u64| -> Option<std::net::IpAddr> {
                in_netns.then(|| net::node_ip(id).parse().ok()).flatten()
            };
            Some(Arc::new(Pki::mint(
                &config.work_dir.join("pki"),
                &all_ids,
                node_ip,
                node_uid,
            )?))
        } else {
            None
        };
        let probe_tls = pki.as_ref().map(|p| p.tonic(ADMIN_IDENTITY)).transpose()?;
        for &id in &all_ids {
            let addr = node_addr(config.in_netns, id)?;
            let data_dir = config.work_dir.join(format!("n{id}"));
            std::fs::create_dir_all(&data_dir)
                .with_context(|| format!("creating {}", data_dir.display()))?;
            let clock_file = config.work_dir.join(format!("n{id}.faketime"));
            std::fs::write(&clock_file, "+0\n")
                .with_context(|| format!("writing {}", clock_file.display()))?;
            if config.in_netns {
                let uid = net::node_uid(id);
                std::os::unix::fs::chown(&data_dir, Some(uid), Some(uid))
                    .with_context(|| format!("chown {} to {uid}", data_dir.display()))?;
            }
            if id <= config.nodes {
                peers.push(format!("{id}={addr}"));
            }
            let scheme = if probe_tls.is_some() { "https" } else { "http" };
            let mut endpoint =
                tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
                    .context("building a status endpoint")?
                    .connect_timeout(STATUS_TIMEOUT);
            if let Some(tls) = &probe_tls {
                endpoint = endpoint
                    .tls_config(tls.clone())
                    .context("the status probe's TLS config")?;
            }
            let channel = endpoint.connect_lazy();
            channels.push((id, channel));
            nodes.insert(
                id,
                Node {
                    addr,
                    data_dir,
                    clock_file,
                    log: config.log_dir.join(format!("n{id}.log")),
                    process: None,
                    paused: false,
                    starts: 0,
                },
            );
        }
        let processes = Processes {
            pids: Arc::new(Mutex::new(BTreeMap::new())),
            logs: Arc::new(Mutex::new(BTreeMap::new())),
        };
        let mut cluster = Self {
            config,
            peers: peers.join(","),
            nodes,
            started: Instant::now(),
            crashes: Arc::new(Mutex::new(Vec::new())),
            probe: StatusProbe { channels },
            processes,
            pki,
        };
        let ids: Vec<u64> = (1..=cluster.config.nodes).collect();
        let mut ready = Vec::new();
        for id in &ids {
            ready.push(cluster.spawn(*id, false)?);
        }
        for (id, rx) in ids.iter().zip(ready) {
            cluster.await_ready(*id, rx).await?;
        }
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        while !cluster.probe.settled(&ids).await {
            if Instant::now() > deadline {
                bail!(
                    "the cluster did not agree on a leader within {NODE_READY_TIMEOUT:?}; see {}",
                    cluster.config.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(cluster)
    }

    /// The client addresses of the nodes the cluster started with.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(id, _)| **id <= self.config.nodes)
            .map(|(_, n)| n.addr.clone())
            .collect()
    }

    /// The SDK's TLS config presenting `name`'s certificate (`client` or `admin`, see
    /// [`crate::pki`]); `None` when the nodes run `--insecure`.
    pub fn client_tls(&self, name: &str) -> Option<lock_client::TlsConfig> {
        self.pki.as_ref().map(|pki| pki.sdk(name))
    }

    /// Ids of the nodes the cluster started with.
    pub fn ids(&self) -> Vec<u64> {
        (1..=self.config.nodes).collect()
    }

    /// Node `id`'s address (clients' and peers').
    pub fn addr(&self, id: u64) -> Option<&str> {
        self.nodes.get(&id).map(|n| n.addr.as_str())
    }

    /// Node `id`'s log file.
    pub fn log(&self, id: u64) -> Option<&Path> {
        self.nodes.get(&id).map(|n| n.log.as_path())
    }

    /// A status probe usable without holding the cluster.
    pub fn probe(&self) -> StatusProbe {
        self.probe.clone()
    }

    /// The nodes' processes and logs, readable without holding the cluster.
    pub fn processes(&self) -> Processes {
        self.processes.clone()
    }

    /// Node exits nobody asked for, so far.
    pub fn crashes(&self) -> Vec<Crash> {
        self.crashes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether links can be isolated per node (own uid and address).
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    fn node(&self, id: u64) -> anyhow::Result<&Node> {
        self.nodes.get(&id).with_context(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut Node> {
        self.nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))
    }

    /// Spawns node `id`'s process; the receiver fires when its ready line is printed. With
    /// `expect_exit`, an exit is not a crash until [`Cluster::restart_or_refuse`] saw it ready.
    fn spawn(&mut self, id: u64, expect_exit: bool) -> anyhow::Result<oneshot::Receiver<()>> {
        let lockd = self.config.lockd.clone();
        let in_netns = self.config.in_netns;
        let libfaketime = self.config.libfaketime.clone();
        let peers = self.peers.clone();
        let raft_dial = self.config.raft_dial.get(&id).cloned();
        let extra_args = self.config.extra_args.clone();
        let (tls_args, roles_env) = match &self.pki {
            Some(pki) => (pki.node_args(id), Some(pki.roles_env())),
            None => (vec!["--insecure".into()], None),
        };
        let initial = id <= self.config.nodes;
        let started = self.started;
        let crashes = Arc::clone(&self.crashes);
        let processes = self.processes.clone();
        let node = self.node_mut(id)?;
        if node.process.is_some() {
            bail!("node {id} is already running");
        }
        // `--peers` must list this node; a node added later is not among the initial ones.
        let peers = if initial {
            peers
        } else {
            format!("{peers},{id}={}", node.addr)
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("opening {}", node.log.display()))?;
        let mut command = Command::new(&lockd);
        command
            .arg("run")
            .args(["--node-id", &id.to_string()])
            .args(["--listen", &node.addr])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--peers", &peers])
            .args([
                "--heartbeat-interval-ms",
                &HEARTBEAT_INTERVAL_MS.to_string(),
            ])
            .args([
                "--election-timeout-min-ms",
                &ELECTION_TIMEOUT_MIN_MS.to_string(),
            ])
            .args([
                "--election-timeout-max-ms",
                &ELECTION_TIMEOUT_MAX_MS.to_string(),
            ])
            .args(&tls_args)
            .args(&extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                log.try_clone().context("duplicating the log file")?,
            ))
            .kill_on_drop(true);
        if id == 1 && node.starts == 0 {
            command.arg("--bootstrap");
        }
        if let Some(dial) = &raft_dial {
            command.args(["--raft-dial", dial]);
        }
        if let Some((name, value)) = &roles_env {
            command.env(name, value);
        }
        if let Some(lib) = &libfaketime {
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &node.clock_file)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if in_netns {
            command.uid(net::node_uid(id)).gid(net::node_uid(id));
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if in_netns && e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
                "starting node {id}: uid {} cannot execute {}: {e}; every folder above it must \
                 let others in (o+x) and the file must be o+x, and its file system must allow \
                 execution (not mounted noexec); put lockd in such a place and pass --lockd",
                net::node_uid(id),
                lockd.display()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("starting node {id} ({})", lockd.display()));
            }
        };
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .with_context(|| format!("node {id} has no pid"))?;
        node.starts += 1;
        let stdout = child.stdout.take().context("node stdout")?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let mut log_out = tokio::fs::File::from_std(log);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut ready_tx = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with(READY_LINE_PREFIX)
                    && let Some(tx) = ready_tx.take()
                {
                    let _ = tx.send(());
                }
                let _ = log_out
                    .write_all(format!("[stdout] {line}\n").as_bytes())
                    .await;
            }
        });
        let expected_exit = Arc::new(AtomicBool::new(expect_exit));
        let expected = Arc::clone(&expected_exit);
        let (exit_tx, exit_rx) = oneshot::channel();
        processes.started(id, pid, &node.log);
        tokio::spawn(async move {
            let status = child.wait().await;
            processes.exited(id, pid);
            if !expected.load(Ordering::SeqCst) {
                let status = match status {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("wait failed: {e}"),
                };
                eprintln!("lock-jepsen: node {id} exited unexpectedly: {status}");
                crashes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Crash {
                        node: id,
                        status,
                        after_s: started.elapsed().as_secs_f64(),
                    });
            }
            let _ = exit_tx.send(());
        });
        node.process = Some(Process {
            pid,
            expected_exit,
            exited: Some(exit_rx),
        });
        node.paused = false;
        Ok(ready_rx)
    }

    async fn await_ready(&self, id: u64, ready: oneshot::Receiver<()>) -> anyhow::Result<()> {
        let log = self.node(id)?.log.clone();
        match tokio::time::timeout(NODE_READY_TIMEOUT, ready).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => bail!(
                "node {id} exited before it was ready; see {}",
                log.display()
            ),
            Err(_) => bail!(
                "node {id} printed no ready line within {NODE_READY_TIMEOUT:?}; see {}",
                log.display()
            ),
        }
    }

    fn signal(&self, id: u64, signal: Signal) -> anyhow::Result<()> {
        let node = self.node(id)?;
        let process = node
            .process
            .as_ref()
            .with_context(|| format!("node {id} is not running"))?;
        let pid = Pid::from_raw(process.pid).context("a zero pid")?;
        kill_process(pid, signal).with_context(|| format!("signalling node {id} ({signal:?})"))
    }

    /// Whether node `id` has a live process.
    pub fn is_running(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.process.is_some())
    }

    /// Whether node `id` is stopped by SIGSTOP.
    pub fn is_paused(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.paused)
    }

    /// SIGKILLs node `id` and waits until it is gone.
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let Some(mut process) = node.process.take() else {
            bail!("node {id} is not running");
        };
        process.expected_exit.store(true, Ordering::SeqCst);
        let pid = Pid::from_raw(process.pid).context("a zero pid")?;
        kill_process(pid, Signal::KILL).with_context(|| format!("SIGKILL node {id}"))?;
        node.paused = false;
        self.processes.exited(id, process.pid);
        if let Some(exited) = process.exited.take() {
            let _ = tokio::time::timeout(NODE_STOP_TIMEOUT, exited).await;
        }
        Ok(())
    }

    /// Restarts a killed node on its data and waits for its ready line.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let ready = self.spawn(id, false)?;
        self.await_ready(id, ready).await
    }

    /// Starts spare node `id` for the first time: a fresh data dir, no `--bootstrap`; it
    /// serves once a leader adds it.
    pub async fn start_new(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node(id)?.starts > 0 {
            bail!("node {id} was started before; a new member needs a new id");
        }
        self.restart(id).await
    }

    /// Restarts a stopped node whose data may be damaged: it either gets ready, or exits
    /// before, which is then not a crash but the answer (with the end of its log).
    pub async fn restart_or_refuse(&mut self, id: u64) -> anyhow::Result<StartOutcome> {
        // Only what this start logs says why it refused (the log file spans every start).
        let log_from = std::fs::metadata(&self.node(id)?.log).map_or(0, |m| m.len());
        let ready = self.spawn(id, true)?;
        let outcome = match tokio::time::timeout(NODE_READY_TIMEOUT, ready).await {
            Ok(Ok(())) => StartOutcome::Ready,
            Ok(Err(_)) => {
                let node = self.node_mut(id)?;
                let mut status = "exited".to_owned();
                if let Some(mut process) = node.process.take() {
                    if let Some(exited) = process.exited.take() {
                        let _ = tokio::time::timeout(NODE_STOP_TIMEOUT, exited).await;
                    }
                    status = format!("exited before its ready line (pid {})", process.pid);
                }
                StartOutcome::Refused {
                    status,
                    log_tail: log_tail(&node.log, log_from, REFUSAL_LOG_TAIL_BYTES),
                }
            }
            Err(_) => bail!(
                "node {id} printed no ready line within {NODE_READY_TIMEOUT:?} and did not \
                 exit; see {}",
                self.node(id)?.log.display()
            ),
        };
        if outcome == StartOutcome::Ready
            && let Some(process) = &self.node(id)?.process
        {
            // From now on an exit is a crash again.
            process.expected_exit.store(false, Ordering::SeqCst);
        }
        Ok(outcome)
    }

    /// Deletes everything in stopped node `id`'s data directory (for a node that is never
    /// started again under this id). The directory itself stays: it may be a mount point
    /// (the power-cut nemesis's lazyfs), which cannot be removed.
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        let in_netns = self.config.in_netns;
        let node = self.node(id)?;
        if node.process.is_some() {
            bail!("node {id} is running; stop it before wiping its data");
        }
        let dir = node.data_dir.clone();
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", dir.display()))?
                .path();
            let removed = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("removing {}", path.display()))?;
        }
        if in_netns {
            let uid = net::node_uid(id);
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid))
                .with_context(|| format!("chown {} to {uid}", dir.display()))?;
        }
        Ok(())
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, Signal::STOP)?;
        self.node_mut(id)?.paused = true;
        Ok(())
    }

    /// SIGCONTs node `id`.
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, Signal::CONT)?;
        self.node_mut(id)?.paused = false;
        Ok(())
    }

    /// Sets node `id`'s wall-clock offset (libfaketime re-reads the file within a second;
    /// the monotonic clock is left alone).
    pub fn set_clock_offset(&self, id: u64, offset_s: i64) -> anyhow::Result<()> {
        if self.config.libfaketime.is_none() {
            bail!("{LIBFAKETIME_MISSING}");
        }
        let node = self.node(id)?;
        write_atomically(&node.clock_file, &format!("{offset_s:+}\n"))
    }

    /// Stops every node: SIGCONT (a paused node cannot exit), SIGTERM, then SIGKILL after
    /// [`NODE_STOP_TIMEOUT`].
    pub async fn stop(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in &ids {
            if let Some(node) = self.nodes.get(id)
                && let Some(process) = &node.process
            {
                process.expected_exit.store(true, Ordering::SeqCst);
                if let Some(pid) = Pid::from_raw(process.pid) {
                    let _ = kill_process(pid, Signal::CONT);
                    let _ = kill_process(pid, Signal::TERM);
                }
            }
        }
        for id in &ids {
            let Some(node) = self.nodes.get_mut(id) else {
                continue;
            };
            let Some(mut process) = node.process.take() else {
                continue;
            };
            let exited = process.exited.take();
            let done = match exited {
                Some(rx) => tokio::time::timeout(NODE_STOP_TIMEOUT, rx).await.is_ok(),
                None => true,
            };
            if !done && let Some(pid) = Pid::from_raw(process.pid) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }

    /// The data directory of node `id` (for the report).
    pub fn data_dir(&self, id: u64) -> Option<&Path> {
        self.nodes.get(&id).map(|n| n.data_dir.as_path())
    }
}

/// The last `bytes` of the file at `path` written after offset `since` (lossy UTF-8, from a
/// line start), or a note why not.
fn log_tail(path: &Path, since: u64, bytes: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return format!("({} cannot be read)", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(bytes).max(since.min(len));
    let mut text = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut text).is_err() {
        return format!("({} cannot be read)", path.display());
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    match (from > since, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_owned(),
        _ => text,
    }
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader (libfaketime)
/// never sees a half-written offset.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}
