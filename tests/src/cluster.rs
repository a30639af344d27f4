//! [`Cluster`]: a real multi-process lockd cluster on 127.0.0.1 for one test.
//!
//! Owns the node processes, their ports, data directories and log files (all in one temporary
//! directory), process control (kill, stop, restart, pause) and the readiness checks. It never
//! interprets lock semantics; tests do that through [`crate::NodeClient`] and
//! [`crate::ClusterClient`].
//!
//! No process outlives its `Cluster`: `Drop` SIGKILLs and reaps every node, and when the thread
//! is panicking (a failed assertion) it first prints the tail of every node's logs. If the test
//! process is killed outright (no `Drop`), a per-cluster watchdog kills the nodes. A node that
//! exited on its own (a crash) fails the test when the cluster drops.
//!
//! With [`ClusterConfig::proxied_links`], the cluster also owns a [`LinkNet`] that carries every
//! node-to-node Raft connection, for partitions ([`Cluster::isolate`], [`Cluster::heal`]).
//!
//! With [`ClusterConfig::tls`] (the default) it mints a [`TestPki`] in its directory, starts
//! the nodes with its certificates and the role map, and its clients connect over TLS as
//! `admin` ([`crate::pki::HARNESS_IDENTITY`]) unless a test asks for another identity
//! ([`Cluster::client_as`], [`Cluster::channel_as`]) or none ([`Cluster::channel_plain`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_proto::v1::{Role, StatusResponse};
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::dial::{Dial, strip_scheme};
use crate::links::LinkNet;
use crate::pki::{HARNESS_IDENTITY, TestPki, node_tls_args, roles_env};
use crate::process::{NodeProcess, NotReady};
use crate::wait::poll_until;
use crate::watchdog::Watchdog;
use crate::{ClusterClient, ClusterConfig, HarnessError, NodeClient, config, lockd_binary, ports};

/// Set this environment variable (to anything) to keep a cluster's temporary directory (data
/// and logs) after the test; its path is printed when the cluster drops.
pub const KEEP_DIR_ENV: &str = "LOCKD_TEST_KEEP_DIR";

/// How many times a cluster start is retried with fresh ports when a node finds its port taken
/// (another process grabbed it between the harness's probe and the node's bind).
const SPAWN_ATTEMPTS: usize = 4;

/// Log lines per file printed when a test fails.
const TAIL_LINES: usize = 60;

/// How long one `Status` probe may take while waiting for a leader; short, so one paused or
/// dying node does not stall the polling of the others.
const STATUS_PROBE_TIMEOUT: Duration = Duration::from_millis(800);

static CLUSTER_SEQ: AtomicU64 = AtomicU64::new(1);

/// A running test cluster of `lockd` processes.
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// let mut cluster = lock_tests::Cluster::start(3).await; // panics (with logs) if it cannot
/// let leader = cluster.leader().await;
/// let client = cluster.cluster_client();                // follows the leader
/// let session = client.open_session("me", Duration::from_secs(10)).await.unwrap();
/// let grant = client
///     .try_acquire(&session.id, "k", Duration::from_secs(10))
///     .await
///     .unwrap()
///     .expect("k is free");
/// cluster.kill(leader);                                  // SIGKILL
/// let new_leader = cluster.wait_for_leader(Duration::from_secs(10)).await.unwrap();
/// assert_ne!(new_leader, leader);
/// # let _ = grant;
/// # }
/// ```
#[derive(Debug)]
pub struct Cluster {
    name: String,
    binary: PathBuf,
    config: ClusterConfig,
    /// `None` only after `Drop` decided to keep the directory.
    dir: Option<TempDir>,
    dir_path: PathBuf,
    nodes: BTreeMap<u64, NodeProcess>,
    /// Kills the nodes if the test process dies without running `Drop`; `None` if it could
    /// not be started (then only `Drop` protects against orphans).
    watchdog: Option<Watchdog>,
    /// The proxies of every node-to-node link, if the config asked for them.
    links: Option<LinkNet>,
    /// Each node's metrics port, if the config asked for them (`ClusterConfig::metrics`).
    metrics_ports: BTreeMap<u64, u16>,
    /// The cluster's CA and certificates, with [`ClusterConfig::tls`].
    pki: Option<TestPki>,
    /// How the harness's own clients connect: TLS as `admin`, or plaintext.
    dial: Dial,
}

impl Cluster {
    /// Starts `nodes` voters with the default timing and waits until they agree on a leader.
    ///
    /// # Panics
    /// If the binary is missing, a node does not start, or no leader is agreed within
    /// [`config::LEADER_TIMEOUT`]; the message carries every node's log tail.
    pub async fn start(nodes: usize) -> Self {
        Self::start_with(ClusterConfig::with_nodes(nodes)).await
    }

    /// [`Cluster::start`] with a custom configuration.
    ///
    /// # Panics
    /// As [`Cluster::start`].
    pub async fn start_with(config: ClusterConfig) -> Self {
        match Self::try_start(config).await {
            Ok(cluster) => cluster,
            Err(e) => panic!("cannot start the test cluster: {e}"),
        }
    }

    /// Starts a cluster, returning an error (with log tails) instead of panicking.
    pub async fn try_start(config: ClusterConfig) -> Result<Self, HarnessError> {
        if config.nodes == 0 {
            return Err(HarnessError::new("a cluster needs at least one node"));
        }
        let binary = lockd_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lockd-test-")
            .tempdir()
            .map_err(|e| HarnessError::new(format!("cannot create a temporary directory: {e}")))?;
        let name = format!(
            "lock-tests-{}-{}",
            std::process::id(),
            CLUSTER_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let watchdog = match Watchdog::spawn(dir.path()) {
            Ok(watchdog) => Some(watchdog),
            Err(e) => {
                eprintln!("lock-tests: {e}; nodes may outlive a killed test process");
                None
            }
        };
        // Bound before the nodes' ports are chosen, so the OS never hands a proxy's port to a
        // node; the proxies learn the nodes' addresses once the ports are known.
        let ids: Vec<u64> = (1u64..).take(config.nodes).collect();
        let links = if config.proxied_links {
            Some(LinkNet::start(&ids).await?)
        } else {
            None
        };
        let (pki, dial) = if config.tls {
            let pki = TestPki::for_cluster(&dir.path().join("pki"), ids.iter().copied())?;
            let dial = Dial::tls_as(&pki, HARNESS_IDENTITY);
            (Some(pki), dial)
        } else {
            (None, Dial::Plain)
        };
        let mut cluster = Self {
            name,
            binary,
            dir_path: dir.path().to_owned(),
            dir: Some(dir),
            config,
            nodes: BTreeMap::new(),
            watchdog,
            links,
            metrics_ports: BTreeMap::new(),
            pki,
            dial,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let n = cluster.config.nodes;
            // Metrics ports (issue 20) come from the same call, so they differ from the nodes'.
            let mut ports = ports::free_ports(if cluster.config.metrics { 2 * n } else { n })?;
            cluster.metrics_ports = (1u64..).zip(ports.split_off(n)).collect();
            cluster.nodes = (1u64..)
                .zip(ports)
                .map(|(id, port)| (id, NodeProcess::new(id, port, &cluster.dir_path)))
                .collect();
            if let Some(links) = &cluster.links {
                links.set_targets(cluster.nodes.values().map(|n| (n.id, n.addr())).collect());
            }
            match cluster.spawn_all_fresh().await {
                Ok(()) => break,
                Err((true, e)) if attempt < SPAWN_ATTEMPTS => {
                    eprintln!("lock-tests: {e}; retrying with other ports");
                    cluster.kill_all();
                    for node in cluster.nodes.values() {
                        // A fresh attempt must not find a half-initialised data dir.
                        let _ = std::fs::remove_dir_all(&node.data_dir);
                    }
                }
                Err((_, e)) => {
                    return Err(HarnessError::new(format!("{e}\n{}", cluster.log_tails())));
                }
            }
        }
        let timeout = cluster.config.leader_timeout;
        if let Err(e) = cluster.wait_for_leader(timeout).await {
            return Err(HarnessError::new(format!("{e}\n{}", cluster.log_tails())));
        }
        Ok(cluster)
    }

    /// Spawns every node of a fresh cluster and waits for all ready lines. The error says
    /// whether a port conflict caused it (worth a retry with other ports).
    async fn spawn_all_fresh(&mut self) -> Result<(), (bool, HarnessError)> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for &id in &ids {
            self.spawn_node(id).map_err(|e| (false, e))?;
        }
        for id in ids {
            self.wait_node_ready(id).await?;
        }
        Ok(())
    }

    /// The `lockd run` arguments of node `id`.
    fn args(&self, id: u64) -> Vec<OsString> {
        let node = &self.nodes[&id];
        let peers = self
            .nodes
            .values()
            .map(|n| format!("{}={}", n.id, n.addr()))
            .collect::<Vec<_>>()
            .join(",");
        let mut args: Vec<OsString> = vec![
            "run".into(),
            "--node-id".into(),
            id.to_string().into(),
            "--listen".into(),
            node.addr().into(),
            "--data-dir".into(),
            node.data_dir.clone().into(),
            "--peers".into(),
            peers.into(),
            "--cluster-name".into(),
            self.name.clone().into(),
            "--heartbeat-interval-ms".into(),
            self.config.heartbeat_interval_ms.to_string().into(),
            "--election-timeout-min-ms".into(),
            self.config.election_timeout_min_ms.to_string().into(),
            "--election-timeout-max-ms".into(),
            self.config.election_timeout_max_ms.to_string().into(),
        ];
        // Node 1 always carries --bootstrap, as an operator's unit file would: the contract is
        // that a node with existing data never re-initialises, which restarts exercise.
        if id == 1 {
            args.push("--bootstrap".into());
        }
        if let Some(links) = &self.links {
            args.push("--raft-dial".into());
            args.push(links.raft_dial(id).into());
        }
        if let Some(port) = self.metrics_ports.get(&id) {
            args.push("--metrics-listen".into());
            args.push(format!("127.0.0.1:{port}").into());
        }
        match &self.pki {
            Some(pki) => args.extend(node_tls_args(pki, id, self.config.require_client_cert)),
            None => args.push("--insecure".into()),
        }
        args.extend(self.config.extra_args.iter().map(OsString::from));
        if let Some(extra) = self.config.node_args.get(&id) {
            args.extend(extra.iter().map(OsString::from));
        }
        args
    }

    fn spawn_node(&mut self, id: u64) -> Result<(), HarnessError> {
        let args = self.args(id);
        let binary = self.binary.clone();
        let mut env = self.config.env.clone();
        if self.pki.is_some() {
            env.push(roles_env(self.nodes.keys().copied(), &self.config.roles));
        }
        let spawned = self.node_mut(id).spawn(&binary, &args, &env);
        self.sync_watchdog();
        spawned
    }

    /// Tells the watchdog which node processes exist now.
    fn sync_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            let pids: Vec<u32> = self.nodes.values().filter_map(NodeProcess::pid).collect();
            if let Err(e) = watchdog.record(&pids) {
                eprintln!("lock-tests: {e}");
            }
        }
    }

    async fn wait_node_ready(&mut self, id: u64) -> Result<(), (bool, HarnessError)> {
        let timeout = self.config.ready_timeout;
        let node = self.node_mut(id);
        match node.wait_ready(timeout).await {
            Ok(()) => Ok(()),
            Err(NotReady::Exited {
                status,
                addr_in_use,
            }) => Err((
                addr_in_use,
                HarnessError::new(format!(
                    "node {id} ({}) exited with {status} before printing its ready line{}",
                    node.addr(),
                    if addr_in_use {
                        " (its port was taken)"
                    } else {
                        ""
                    }
                )),
            )),
            Err(NotReady::Timeout) => Err((
                false,
                HarnessError::new(format!(
                    "node {id} ({}) printed no ready line within {timeout:?}",
                    node.addr()
                )),
            )),
            Err(NotReady::Harness(e)) => Err((false, e)),
        }
    }

    fn node(&self, id: u64) -> &NodeProcess {
        self.nodes
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster (nodes: {:?})", self.ids()))
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProcess {
        let ids = self.ids();
        self.nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster (nodes: {ids:?})"))
    }

    // ---- identity and addresses -------------------------------------------------------

    /// The `--cluster-name` given to every node (unique per cluster).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The temporary directory holding every node's data dir and logs.
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// Every node id, ascending, whatever its state.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Ids of nodes whose process runs and is not paused.
    pub fn live_ids(&mut self) -> Vec<u64> {
        self.nodes
            .values_mut()
            .filter_map(|n| (n.is_running() && !n.is_paused()).then_some(n.id))
            .collect()
    }

    /// Whether node `id`'s process is running (paused counts as running).
    pub fn is_running(&mut self, id: u64) -> bool {
        self.node_mut(id).is_running()
    }

    /// Node `id`'s listen address, `127.0.0.1:port` — what `NotLeader` hints and `Status`
    /// members carry.
    pub fn addr(&self, id: u64) -> String {
        self.node(id).addr()
    }

    /// The metrics endpoint of node `id`, `http://127.0.0.1:PORT` (its `/metrics`, `/healthz`,
    /// `/readyz`; read them with [`crate::metrics`]).
    ///
    /// # Panics
    /// If the cluster was started without [`ClusterConfig::metrics`].
    pub fn metrics_url(&self, id: u64) -> String {
        let port = self.metrics_ports.get(&id).unwrap_or_else(|| {
            panic!("node {id} has no metrics endpoint (ClusterConfig::metrics is off)")
        });
        format!("http://127.0.0.1:{port}")
    }

    /// Node `id`'s gRPC endpoint: `https://127.0.0.1:port` with TLS, else
    /// `http://127.0.0.1:port`.
    pub fn endpoint(&self, id: u64) -> String {
        self.dial.endpoint(&self.node(id).addr())
    }

    /// Every node's endpoint, by ascending id.
    pub fn endpoints(&self) -> Vec<String> {
        self.ids().into_iter().map(|id| self.endpoint(id)).collect()
    }

    /// The id of the node listening on `addr` (`host:port`, with or without a scheme).
    pub fn id_of_addr(&self, addr: &str) -> Option<u64> {
        let addr = strip_scheme(addr);
        self.nodes.values().find(|n| n.addr() == addr).map(|n| n.id)
    }

    /// Node `id`'s stderr log (where lockd logs).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.node(id).stderr_path.clone()
    }

    /// Bytes in node `id`'s log so far: where [`Cluster::log_since`] starts to see only what
    /// the node logs from now on.
    pub fn log_len(&self, id: u64) -> u64 {
        std::fs::metadata(self.log_path(id)).map_or(0, |m| m.len())
    }

    /// The text node `id`'s log gained after byte `from` (all of it from 0; nothing if it
    /// cannot be read yet). Search it with [`crate::log_lines`].
    pub fn log_since(&self, id: u64, from: u64) -> String {
        let text = std::fs::read(self.log_path(id)).unwrap_or_default();
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// Node `id`'s stdout log (the ready line).
    pub fn stdout_path(&self, id: u64) -> PathBuf {
        self.node(id).stdout_path.clone()
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.node(id).data_dir.clone()
    }

    // ---- clients ------------------------------------------------------------------------

    /// A client of node `id` alone (answers exactly what that node says), as `admin` when
    /// the cluster serves TLS.
    pub fn client(&self, id: u64) -> NodeClient {
        NodeClient::dial(&self.node(id).addr(), &self.dial)
    }

    /// A leader-following client over every node (see [`ClusterClient`]), as `admin` when
    /// the cluster serves TLS.
    pub fn cluster_client(&self) -> ClusterClient {
        ClusterClient::with_dial(self.nodes.values().map(|n| (n.id, n.addr())), &self.dial)
    }

    /// A raw tonic channel to node `id`, as the harness's clients connect (`admin` over TLS).
    pub fn channel(&self, id: u64) -> Channel {
        self.dial.channel(&self.node(id).addr())
    }

    /// The cluster's CA and certificates.
    ///
    /// # Panics
    /// If the cluster was started without TLS.
    pub fn pki(&self) -> &TestPki {
        self.pki
            .as_ref()
            .unwrap_or_else(|| panic!("pki(): the cluster was started with tls: false"))
    }

    /// How the harness's own clients connect (TLS as `admin`, or plaintext).
    pub fn dial(&self) -> &Dial {
        &self.dial
    }

    /// How a client presenting `name`'s certificate connects.
    ///
    /// # Panics
    /// If the cluster was started without TLS, or `name` has no certificate.
    pub fn dial_as(&self, name: &str) -> Dial {
        Dial::tls_as(self.pki(), name)
    }

    /// A client of node `id` presenting `name`'s certificate (`client`, `operator`, `admin`,
    /// `node-<id>`, or one minted with [`TestPki::mint`]).
    ///
    /// # Panics
    /// As [`Cluster::dial_as`].
    pub fn client_as(&self, id: u64, name: &str) -> NodeClient {
        NodeClient::dial(&self.node(id).addr(), &self.dial_as(name))
    }

    /// A leader-following client presenting `name`'s certificate.
    ///
    /// # Panics
    /// As [`Cluster::dial_as`].
    pub fn cluster_client_as(&self, name: &str) -> ClusterClient {
        ClusterClient::with_dial(
            self.nodes.values().map(|n| (n.id, n.addr())),
            &self.dial_as(name),
        )
    }

    /// A raw tonic channel to node `id` presenting `name`'s certificate.
    ///
    /// # Panics
    /// As [`Cluster::dial_as`].
    pub fn channel_as(&self, id: u64, name: &str) -> Channel {
        self.dial_as(name).channel(&self.node(id).addr())
    }

    /// A plaintext channel to node `id` (`http://`), whatever the cluster serves: for the
    /// tests that a TLS node refuses it.
    pub fn channel_plain(&self, id: u64) -> Channel {
        Dial::Plain.channel(&self.node(id).addr())
    }

    /// The `(ca, cert, key)` files of `name`, for a `lock_client::TlsConfig` or lockctl's
    /// `LOCKD_CA`, `LOCKD_CERT`, `LOCKD_KEY`.
    ///
    /// # Panics
    /// As [`Cluster::dial_as`].
    pub fn sdk_tls(&self, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let pki = self.pki();
        let (cert, key) = pki.identity(name);
        (pki.ca(), cert, key)
    }

    /// A client of the current leader (waits for one, see [`Cluster::leader`]).
    pub async fn leader_client(&mut self) -> NodeClient {
        let leader = self.leader().await;
        self.client(leader)
    }

    // ---- leadership ---------------------------------------------------------------------

    /// Waits until every live node (running, not paused) answers `Status`, all name the same
    /// leader and know its address, and that leader is live and reports itself `Leader`. Returns its id, or an error
    /// listing each node's last view.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> Result<u64, HarnessError> {
        let live = self.live_ids();
        if live.is_empty() {
            return Err(HarnessError::new("no live node to ask for a leader"));
        }
        let clients: Vec<(u64, NodeClient)> =
            live.iter().map(|&id| (id, self.client(id))).collect();
        poll_until(
            &format!("nodes {live:?} to agree on a live leader"),
            timeout,
            || {
                let clients = clients.clone();
                async move { agreed_leader(&clients).await }
            },
        )
        .await
    }

    /// The agreed leader, waiting up to the configured `leader_timeout`.
    ///
    /// # Panics
    /// If there is none by then (the message lists every node's view).
    pub async fn leader(&mut self) -> u64 {
        let timeout = self.config.leader_timeout;
        match self.wait_for_leader(timeout).await {
            Ok(id) => id,
            Err(e) => panic!("{e}"),
        }
    }

    /// The live nodes other than the agreed leader.
    ///
    /// # Panics
    /// As [`Cluster::leader`].
    pub async fn followers(&mut self) -> Vec<u64> {
        let leader = self.leader().await;
        self.live_ids()
            .into_iter()
            .filter(|&id| id != leader)
            .collect()
    }

    /// Node `id`'s `Status`, answered by that node.
    pub async fn status(&self, id: u64) -> Result<StatusResponse, lock_api::LockError> {
        self.client(id).status().await
    }

    /// Waits until every live node has applied at least the leader's commit index as it was
    /// when this was called — after it, a follower read (`Inspect` without
    /// `leader_confirmed`) sees every write acknowledged before the call.
    pub async fn wait_caught_up(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let leader = self.wait_for_leader(timeout).await?;
        let target = self
            .status(leader)
            .await
            .map_err(|e| HarnessError::new(format!("Status of leader {leader}: {e}")))?
            .commit_index;
        let clients: Vec<(u64, NodeClient)> = self
            .live_ids()
            .into_iter()
            .map(|id| (id, self.client(id)))
            .collect();
        poll_until(
            &format!("every live node to apply index {target}"),
            timeout,
            || {
                let clients = clients.clone();
                async move {
                    let mut behind = Vec::new();
                    for (id, client) in &clients {
                        match client.status().await {
                            Ok(s) if s.applied_index >= target => {}
                            Ok(s) => behind.push(format!("node {id} applied {}", s.applied_index)),
                            Err(e) => behind.push(format!("node {id}: {e}")),
                        }
                    }
                    if behind.is_empty() {
                        Ok(())
                    } else {
                        Err(behind.join("; "))
                    }
                }
            },
        )
        .await
    }

    // ---- process control ----------------------------------------------------------------

    /// SIGKILLs node `id` and reaps it: a crash, no shutdown code runs.
    ///
    /// # Panics
    /// If the node is not running.
    pub fn kill(&mut self, id: u64) {
        assert!(self.is_running(id), "kill({id}): node {id} is not running");
        self.node_mut(id).kill();
        self.sync_watchdog();
    }

    /// SIGTERMs node `id` and waits for it to exit (a graceful shutdown); returns its exit
    /// status (lockd promises 0).
    ///
    /// # Panics
    /// If the node is not running, or does not exit within [`config::STOP_TIMEOUT`] (it is
    /// then SIGKILLed).
    pub async fn stop(&mut self, id: u64) -> ExitStatus {
        assert!(self.is_running(id), "stop({id}): node {id} is not running");
        let stopped = self.node_mut(id).terminate(config::STOP_TIMEOUT).await;
        self.sync_watchdog();
        match stopped {
            Ok(status) => status,
            Err(e) => panic!("{e}\n{}", self.node(id).log_tail(TAIL_LINES)),
        }
    }

    /// Starts node `id` again (it must be down) with the same port, data dir and arguments,
    /// and waits for its ready line. Does not wait for a leader.
    ///
    /// # Panics
    /// If the node is running or does not become ready (e.g. its port was taken meanwhile).
    pub async fn start_node(&mut self, id: u64) {
        assert!(
            !self.is_running(id),
            "start_node({id}): node {id} is still running"
        );
        let started = match self.spawn_node(id) {
            Ok(()) => self.wait_node_ready(id).await.map_err(|(_, e)| e),
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            panic!("{e}\n{}", self.node(id).log_tail(TAIL_LINES));
        }
    }

    /// Stops node `id` gracefully if it runs, then starts it again ([`Cluster::start_node`]).
    /// Returns the exit status of the stop, if there was one.
    pub async fn restart(&mut self, id: u64) -> Option<ExitStatus> {
        let status = if self.is_running(id) {
            Some(self.stop(id).await)
        } else {
            None
        };
        self.start_node(id).await;
        status
    }

    /// SIGTERMs every running node at once, then waits for each; returns `(id, exit status)`.
    ///
    /// # Panics
    /// As [`Cluster::stop`].
    pub async fn stop_all(&mut self) -> Vec<(u64, ExitStatus)> {
        let running: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|&id| self.is_running(id))
            .collect();
        for &id in &running {
            if let Err(e) = self.node_mut(id).signal(rustix::process::Signal::TERM) {
                panic!("{e}");
            }
        }
        let mut statuses = Vec::new();
        for id in running {
            // `terminate` re-sends SIGTERM, which a shutting-down node must tolerate, and
            // continues a paused node.
            let stopped = self.node_mut(id).terminate(config::STOP_TIMEOUT).await;
            self.sync_watchdog();
            match stopped {
                Ok(status) => statuses.push((id, status)),
                Err(e) => panic!("{e}\n{}", self.node(id).log_tail(TAIL_LINES)),
            }
        }
        statuses
    }

    /// Starts every node that is down, all at once (so a majority forms quickly), and waits for
    /// each ready line. Does not wait for a leader; call [`Cluster::wait_for_leader`].
    ///
    /// # Panics
    /// As [`Cluster::start_node`].
    pub async fn start_all(&mut self) {
        let down: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|&id| !self.is_running(id))
            .collect();
        for &id in &down {
            if let Err(e) = self.spawn_node(id) {
                panic!("{e}\n{}", self.log_tails());
            }
        }
        for id in down {
            if let Err((_, e)) = self.wait_node_ready(id).await {
                panic!("{e}\n{}", self.log_tails());
            }
        }
    }

    /// Restarts the whole cluster gracefully: SIGTERMs every node, asserts each exited 0,
    /// starts them all, and waits up to `leader_timeout` for a leader, which it returns.
    ///
    /// # Panics
    /// If a node exits with another status, as [`Cluster::stop_all`] and
    /// [`Cluster::start_all`], or if no leader is agreed within `leader_timeout`.
    pub async fn restart_all(&mut self, leader_timeout: Duration) -> u64 {
        for (id, status) in self.stop_all().await {
            assert!(
                status.success(),
                "node {id} exited with {status} after SIGTERM (expected 0)\n{}",
                self.node(id).log_tail(TAIL_LINES)
            );
        }
        self.start_all().await;
        match self.wait_for_leader(leader_timeout).await {
            Ok(leader) => leader,
            Err(e) => panic!("no leader after a full restart: {e}\n{}", self.log_tails()),
        }
    }

    /// SIGSTOPs node `id`: it freezes with its sockets open (a long GC pause, a hung VM).
    ///
    /// # Panics
    /// If the node is not running.
    pub fn pause(&mut self, id: u64) {
        assert!(self.is_running(id), "pause({id}): node {id} is not running");
        if let Err(e) = self.node_mut(id).pause() {
            panic!("{e}");
        }
    }

    /// SIGCONTs a node paused with [`Cluster::pause`].
    ///
    /// # Panics
    /// If the node is not running.
    pub fn resume(&mut self, id: u64) {
        assert!(
            self.is_running(id),
            "resume({id}): node {id} is not running"
        );
        if let Err(e) = self.node_mut(id).resume() {
            panic!("{e}");
        }
    }

    /// Cuts every Raft link between node `id` and the others, both ways, like a DROP rule:
    /// bytes stop and new connections hang (see [`crate::links`]). Clients still reach every
    /// node. The process keeps running; [`Cluster::heal`] ends the partition.
    ///
    /// # Panics
    /// If the cluster was not started with [`ClusterConfig::proxied_links`], or `id` is not
    /// one of its nodes.
    pub fn isolate(&mut self, id: u64) {
        self.link_net("isolate").isolate(id);
    }

    /// Heals every link cut by [`Cluster::isolate`].
    ///
    /// # Panics
    /// If the cluster was not started with [`ClusterConfig::proxied_links`].
    pub fn heal(&mut self) {
        self.link_net("heal").heal();
    }

    /// The links cut now, as ordered pairs `(from, to)`; empty without proxied links.
    pub fn cut_links(&self) -> Vec<(u64, u64)> {
        self.links
            .as_ref()
            .map(LinkNet::cut_links)
            .unwrap_or_default()
    }

    fn link_net(&self, what: &str) -> &LinkNet {
        self.links.as_ref().unwrap_or_else(|| {
            panic!("{what}: the cluster was started without ClusterConfig::proxied_links")
        })
    }

    /// Nodes whose process exited without the harness stopping or killing it (a crash),
    /// with their exit status. `Drop` fails the test if this is not empty.
    pub fn crashed_nodes(&mut self) -> Vec<(u64, ExitStatus)> {
        for node in self.nodes.values_mut() {
            node.is_running();
        }
        self.nodes
            .values()
            .filter_map(|n| n.crashed().map(|status| (n.id, status)))
            .collect()
    }

    /// Node `id`'s OS process id while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.node(id).pid()
    }

    fn kill_all(&mut self) {
        for node in self.nodes.values_mut() {
            node.kill();
        }
        self.sync_watchdog();
    }

    // ---- logs ---------------------------------------------------------------------------

    /// The last lines of every node's stdout and stderr, labelled by node.
    pub fn log_tails(&self) -> String {
        let mut out = format!(
            "==== logs of cluster {} in {} ====\n",
            self.name,
            self.dir_path.display()
        );
        for node in self.nodes.values() {
            out.push_str(&node.log_tail(TAIL_LINES));
        }
        out
    }

    /// Prints [`Cluster::log_tails`] to stderr (captured by the test runner, shown on failure).
    pub fn dump_logs(&self) {
        eprintln!("{}", self.log_tails());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let crashed = self.crashed_nodes();
        let panicking = std::thread::panicking();
        if panicking || !crashed.is_empty() {
            self.dump_logs();
        }
        self.kill_all();
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.stop();
        }
        if std::env::var_os(KEEP_DIR_ENV).is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "lock-tests: kept cluster directory {}",
                dir.keep().display()
            );
        }
        // A node that died on its own is a failure even if every assertion passed (a crash
        // on junk input, a panic in a background task); the logs are printed above.
        if !panicking && !crashed.is_empty() {
            panic!("node(s) exited on their own during the test: {crashed:?}");
        }
    }
}

/// One round of leader agreement over `clients`: `Ok(leader)` if all answered, all name the
/// same leader, and that leader is among them and reports itself `Leader`; otherwise every
/// node's view, for the timeout message.
async fn agreed_leader(clients: &[(u64, NodeClient)]) -> Result<u64, String> {
    let mut views = Vec::new();
    for (id, client) in clients {
        let answer = tokio::time::timeout(STATUS_PROBE_TIMEOUT, client.status()).await;
        views.push((*id, answer));
    }
    let describe = |views: &[(u64, Result<Result<StatusResponse, lock_api::LockError>, _>)]| {
        views
            .iter()
            .map(|(id, view)| match view {
                Ok(Ok(s)) => format!(
                    "node {id}: role={:?} term={} leader={:?} at {:?} commit={} applied={}",
                    s.role(),
                    s.current_term,
                    s.leader_id,
                    s.leader_addr,
                    s.commit_index,
                    s.applied_index
                ),
                Ok(Err(e)) => format!("node {id}: Status failed: {e}"),
                Err(_) => format!("node {id}: no Status answer within {STATUS_PROBE_TIMEOUT:?}"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut leader = None;
    for (_, view) in &views {
        match view {
            // Naming the leader is not enough: a follower can learn the leader's id (from a
            // heartbeat) before the membership entry that holds its address, and until then it
            // cannot send a client there.
            Ok(Ok(StatusResponse {
                leader_id: Some(l),
                leader_addr,
                ..
            })) if !leader_addr.is_empty() && (leader.is_none() || leader == Some(*l)) => {
                leader = Some(*l)
            }
            _ => return Err(describe(&views)),
        }
    }
    let leader = leader.ok_or_else(|| describe(&views))?;
    let leader_says_leader = views
        .iter()
        .any(|(id, view)| *id == leader && matches!(view, Ok(Ok(s)) if s.role() == Role::Leader));
    if leader_says_leader {
        Ok(leader)
    } else {
        Err(describe(&views))
    }
}
