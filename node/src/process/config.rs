//! A node's configuration: the `lockd run` flags, their `LOCKD_*` environment variables and the
//! TOML file, merged with precedence flag > env > file > default, then validated once at start
//! (`docs/NODE_CLI.md` is the contract: other engineers' harnesses start nodes with it).
//!
//! Owns parsing, merging and validating; every error names the field it is about. Does not open
//! the data dir or any socket (see `identity` and `server`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Deserialize;

/// Default heartbeat interval (ms): a leader's append-entries heartbeat.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 100;
/// Default lower bound of the randomized election timeout (ms).
pub const ELECTION_TIMEOUT_MIN_MS_DEFAULT: u64 = 400;
/// Default upper bound of the randomized election timeout (ms).
///
/// openraft also takes it as the leader's lease: a follower stands only once it has not heard
/// from the leader for this long *plus* its own random timeout, so a failover's election starts
/// 1.0–1.2 s after the leader's last message with these defaults (docs/NODE_CLI.md, "Raft
/// timings"). 800 ms made that 1.2–1.6 s, and a killed leader's first grant missed 1.5 s in
/// two failovers of five (docs/PERFORMANCE.md, session 20).
pub const ELECTION_TIMEOUT_MAX_MS_DEFAULT: u64 = 600;
/// Default extra time (ms) the reaper waits past a lease's deadline before proposing its expiry.
///
/// The leader's deadline already starts after the client's (the client starts its clock before
/// it sends), so this only covers the rate drift between the two monotonic clocks: 100 ms is
/// 10% of the shortest lease.
pub const SAFETY_MARGIN_MS_DEFAULT: u64 = 100;
/// Default number of log entries between snapshots.
pub const SNAPSHOT_LOGS_SINCE_LAST_DEFAULT: u64 = 5_000;
/// Default cluster name, written into each data dir's identity file.
pub const CLUSTER_NAME_DEFAULT: &str = "lockd";

/// Longest cluster name, in bytes: it goes into the identity file and status answers.
pub const CLUSTER_NAME_LEN_MAX: usize = 64;
/// Most voters a cluster may be configured with. Raft clusters beyond 7 voters gain no
/// availability and pay for every extra replica on every write.
pub const PEERS_MAX: usize = 7;
/// Most `raft_dial` overrides: one per other node id a test network may route (the members,
/// and the spare ids a fault-injection run adds and rebuilds members under over a long run:
/// `lock-jepsen` uses ids 1..=16). Bounded so a typo cannot make the node keep thousands.
pub const RAFT_DIAL_MAX: usize = 15;
/// Shortest heartbeat interval (ms): below this a 2-core machine spends its time on heartbeats.
pub const HEARTBEAT_INTERVAL_MS_MIN: u64 = 10;
/// Longest tolerated safety margin (ms): it must stay well inside the shortest lease.
pub const SAFETY_MARGIN_MS_MAX: u64 = 250;
/// Fewest log entries between snapshots: snapshotting more often than this rewrites the whole
/// state machine for a handful of entries.
pub const SNAPSHOT_LOGS_SINCE_LAST_MIN: u64 = 100;
/// Most async worker threads (`--worker-threads`): far above any core count a lock service
/// node uses; a larger number is a typo.
pub const WORKER_THREADS_MAX: usize = 256;

/// Worker threads for each of `nodes` nodes sharing this machine: the cores split between them,
/// at least one each. `lockd dev` and the benchmark start three nodes on one machine; with a
/// runtime of all cores each, the nodes' workers wake and steal across each other's cores, and
/// on the 2-core development machine one worker per node measured 12–30% more W1 throughput
/// and 12–15% less CPU per lock than two (issue 7).
pub fn colocated_worker_threads(nodes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (cores / nodes.max(1)).max(1)
}

const _: () = assert!(SAFETY_MARGIN_MS_MAX < lock_api::limits::TTL_MIN.as_millis() as u64 / 2);
const _: () =
    assert!(ELECTION_TIMEOUT_MAX_MS_DEFAULT < lock_api::limits::TTL_MIN.as_millis() as u64);
const _: () = assert!(HEARTBEAT_INTERVAL_MS_DEFAULT < ELECTION_TIMEOUT_MIN_MS_DEFAULT);

/// How the process writes its logs to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Which engine stores the Raft log of a fresh data dir (`--log-engine`). A data dir that
/// already holds a log keeps its engine, whatever this says (logged at start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogEngine {
    /// Append-only segment files (`<data>/raft/wal/`): one write and one fdatasync per
    /// flush group.
    #[default]
    Wal,
    /// A sled 0.34 database (`<data>/raft/log/`), the engine lockd started on.
    Sled,
}

impl From<LogEngine> for lock_raft_store::storage::EngineKind {
    fn from(engine: LogEngine) -> Self {
        match engine {
            LogEngine::Wal => Self::Wal,
            LogEngine::Sled => Self::Sled,
        }
    }
}

/// Where the lock table lives (`--backend`, issue 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In this cluster's replicated Raft state machine.
    #[default]
    Raft,
    /// In PostgreSQL (`pg_url`; cargo feature `pg`); the node holds no state.
    Pg,
    /// In etcd (`etcd_endpoints`; cargo feature `etcd`); the node holds no state.
    Etcd,
}

impl Backend {
    /// `true` for a backend whose lock table lives outside the node (pg, etcd).
    pub fn is_stateless(self) -> bool {
        self != Backend::Raft
    }
}

/// The `lockd run` flags. Every flag also reads `LOCKD_<FLAG>`; every value may be absent here
/// and come from the TOML file or a default instead.
#[derive(Args, Clone, Debug, Default)]
pub struct RunArgs {
    /// This node's Raft id (non-zero, unique in the cluster, listed in --peers).
    #[arg(long, env = "LOCKD_NODE_ID")]
    pub node_id: Option<u64>,
    /// Address to listen on: one port serves the client API, admin, Raft, health and reflection.
    #[arg(long, env = "LOCKD_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory of this node's log, state machine and identity file.
    #[arg(long, env = "LOCKD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Every voter, this node included: `1=127.0.0.1:7101,2=127.0.0.1:7102,…`.
    #[arg(long, env = "LOCKD_PEERS", value_parser = parse_peers)]
    pub peers: Option<Peers>,
    /// Per-peer Raft dial overrides, `2=127.0.0.1:9002,3=127.0.0.1:9003`: Raft RPCs to peer
    /// ID connect to ADDR instead of the address in the replicated membership. The
    /// membership, and so the leader address clients are sent to, is unchanged. Meant for
    /// test harnesses that route node-to-node traffic through a proxy that can cut links.
    #[arg(long, env = "LOCKD_RAFT_DIAL", value_parser = parse_raft_dial)]
    pub raft_dial: Option<Peers>,
    /// Initialise the cluster with all peers as voters if this node's data is fresh.
    #[arg(long, env = "LOCKD_BOOTSTRAP", num_args = 0..=1, default_missing_value = "true")]
    pub bootstrap: Option<bool>,
    /// The cluster's name; a data dir written by another cluster is refused.
    #[arg(long, env = "LOCKD_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// Maps a principal to a role, repeatable: `--role admin=admin --role node-1=node`
    /// (env: `LOCKD_ROLES="p=r,p=r"`). Roles: client, operator (includes client), admin
    /// (includes operator), node (Raft traffic only). A principal not mapped has no role.
    #[arg(long = "role", env = "LOCKD_ROLES", value_delimiter = ',', value_parser = parse_role)]
    pub role: Option<Vec<(String, crate::auth::Role)>>,
    /// File of bearer tokens, one `<principal> sha256:<hex of the token's SHA-256>` a line;
    /// tokens are accepted over TLS only, in metadata `authorization: Bearer <token>`.
    #[arg(long, env = "LOCKD_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// TOML file with the same keys in snake_case (flags and env win over it).
    #[arg(long, env = "LOCKD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, env = "LOCKD_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Leader heartbeat interval in ms.
    #[arg(long, env = "LOCKD_HEARTBEAT_INTERVAL_MS")]
    pub heartbeat_interval_ms: Option<u64>,
    /// Lower bound of the randomized election timeout in ms.
    #[arg(long, env = "LOCKD_ELECTION_TIMEOUT_MIN_MS")]
    pub election_timeout_min_ms: Option<u64>,
    /// Upper bound of the randomized election timeout in ms.
    #[arg(long, env = "LOCKD_ELECTION_TIMEOUT_MAX_MS")]
    pub election_timeout_max_ms: Option<u64>,
    /// Extra ms the reaper waits past a lease's deadline before expiring it.
    #[arg(long, env = "LOCKD_SAFETY_MARGIN_MS")]
    pub safety_margin_ms: Option<u64>,
    /// Log entries between snapshots.
    #[arg(long, env = "LOCKD_SNAPSHOT_LOGS_SINCE_LAST")]
    pub snapshot_logs_since_last: Option<u64>,
    /// Engine for the Raft log of a fresh data dir (an existing one keeps its own).
    #[arg(long, env = "LOCKD_LOG_ENGINE", value_enum)]
    pub log_engine: Option<LogEngine>,
    /// Async worker threads [default: the number of cores]. Give nodes that share a machine a
    /// share of its cores each (`lockd dev` does).
    #[arg(long, env = "LOCKD_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Test-only: ms added to this node's stamp clock when it leads.
    #[arg(
        long,
        env = "LOCKD_TEST_CLOCK_OFFSET_MS",
        hide = true,
        allow_hyphen_values = true
    )]
    pub test_clock_offset_ms: Option<i64>,
    /// Test-only: a snapshot of at least this many bytes is decoded behind the node's start
    /// [default: 16 MiB], so a test can take that path with a small state.
    #[arg(long, env = "LOCKD_TEST_SNAPSHOT_BACKGROUND_FROM", hide = true)]
    pub test_snapshot_background_from: Option<u64>,
    /// Where the lock table lives: raft (default), pg or etcd. With pg or etcd the node holds
    /// no state and any node serves; data_dir and peers are then not needed (ignored, with a
    /// warning, if given).
    #[arg(long, env = "LOCKD_BACKEND", value_enum)]
    pub backend: Option<Backend>,
    /// PostgreSQL connection URL for `--backend pg` (`postgres://user@host:port/db`).
    #[arg(long, env = "LOCKD_PG_URL")]
    pub pg_url: Option<String>,
    /// etcd members for `--backend etcd`: `http://host:port,http://host:port,…`.
    #[arg(long, env = "LOCKD_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// PEM file of the CA that signs every node and client certificate: clients' and peers'
    /// certificates must chain to it (docs/SECURITY.md §1).
    #[arg(long, env = "LOCKD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate chain of this node, leaf first: served to clients and presented to
    /// peers when this node dials them, so it needs both the server and the client EKU.
    #[arg(long, env = "LOCKD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. The three files are re-read when they change on disk;
    /// new connections use the new ones.
    #[arg(long, env = "LOCKD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Refuse TLS handshakes without a client certificate (without it, a client may present
    /// none and authenticate with a bearer token instead).
    #[arg(long, env = "LOCKD_REQUIRE_CLIENT_CERT", num_args = 0..=1, default_missing_value = "true")]
    pub require_client_cert: Option<bool>,
    /// Serve plaintext: nobody is authenticated and every call is allowed. Required to run
    /// without the three TLS files; lockd warns at start.
    #[arg(long, env = "LOCKD_INSECURE", num_args = 0..=1, default_missing_value = "true")]
    pub insecure: Option<bool>,
    /// Serve Prometheus metrics, /healthz and /readyz over HTTP on this address
    /// (docs/METRICS.md) [default: off].
    #[arg(long, env = "LOCKD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

/// The voters of the cluster by node id, each with its `host:port`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peers(pub BTreeMap<u64, String>);

/// Parses `1=127.0.0.1:7101,2=127.0.0.1:7102`.
fn parse_peers(text: &str) -> Result<Peers, String> {
    parse_id_addrs(text, "peer")
}

/// Parses one `--role PRINCIPAL=ROLE`.
fn parse_role(text: &str) -> Result<(String, crate::auth::Role), String> {
    crate::auth::roles::parse_mapping(text)
}

/// Parses `--raft-dial`: `2=127.0.0.1:9002,3=127.0.0.1:9003`.
fn parse_raft_dial(text: &str) -> Result<Peers, String> {
    parse_id_addrs(text, "raft dial entry")
}

/// Parses `ID=HOST:PORT,…`; `what` names one entry in errors.
fn parse_id_addrs(text: &str, what: &str) -> Result<Peers, String> {
    let mut peers = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("{what} {item:?} is not of the form ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|e| format!("{what} {item:?}: node id {id:?} is not a number: {e}"))?;
        if peers.insert(id, addr.trim().to_owned()).is_some() {
            return Err(format!("{what} id {id} is listed twice"));
        }
    }
    Ok(Peers(peers))
}

/// One `[[peers]]` entry of the TOML file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    id: u64,
    addr: String,
}

/// The TOML file: the same keys as the flags, in snake_case.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    node_id: Option<u64>,
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    peers: Option<Vec<FilePeer>>,
    raft_dial: Option<Vec<FilePeer>>,
    bootstrap: Option<bool>,
    cluster_name: Option<String>,
    roles: Option<BTreeMap<String, String>>,
    tokens_file: Option<PathBuf>,
    log_format: Option<LogFormat>,
    heartbeat_interval_ms: Option<u64>,
    election_timeout_min_ms: Option<u64>,
    election_timeout_max_ms: Option<u64>,
    safety_margin_ms: Option<u64>,
    snapshot_logs_since_last: Option<u64>,
    log_engine: Option<LogEngine>,
    worker_threads: Option<usize>,
    test_clock_offset_ms: Option<i64>,
    backend: Option<Backend>,
    pg_url: Option<String>,
    etcd_endpoints: Option<Vec<String>>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    require_client_cert: Option<bool>,
    insecure: Option<bool>,
    metrics_listen: Option<SocketAddr>,
}

/// A configuration error; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required field was given nowhere.
    #[error(
        "config field `{field}` is required (flag --{flag}, env LOCKD_{env}, or `{field}` in the TOML file)"
    )]
    Missing {
        /// The field's snake_case name.
        field: &'static str,
        /// The flag name.
        flag: &'static str,
        /// The environment variable suffix.
        env: &'static str,
    },
    /// A field had a value that breaks a rule.
    #[error("config field `{field}` is invalid: {reason}")]
    Invalid {
        /// The field's snake_case name.
        field: &'static str,
        /// Which rule, with the values involved.
        reason: String,
    },
    /// The TOML file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// A node's validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node's Raft id.
    pub node_id: u64,
    /// The address the server binds.
    pub listen: SocketAddr,
    /// Where the node keeps its data (required with backend raft; empty if not given for a
    /// stateless backend, which keeps none).
    pub data_dir: PathBuf,
    /// Every voter, this node included (required with backend raft; empty if not given for a
    /// stateless backend, which has no voters).
    pub peers: BTreeMap<u64, String>,
    /// Raft dial overrides: RPCs to peer id go to this `host:port` instead of the
    /// membership's address (empty: dial the membership's addresses).
    pub raft_dial: BTreeMap<u64, String>,
    /// Initialise the cluster if this node's data is fresh.
    pub bootstrap: bool,
    /// The cluster's name.
    pub cluster_name: String,
    /// Principal → role (`--role`, `LOCKD_ROLES`, `[roles]`; docs/SECURITY.md §2).
    pub roles: BTreeMap<String, crate::auth::Role>,
    /// The bearer tokens file, if any (read when the node starts serving).
    pub tokens_file: Option<PathBuf>,
    /// Log format.
    pub log_format: LogFormat,
    /// Leader heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// Election timeout lower bound.
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound.
    pub election_timeout_max_ms: u64,
    /// Reaper grace past a lease deadline.
    pub safety_margin_ms: u64,
    /// Log entries between snapshots.
    pub snapshot_logs_since_last: u64,
    /// Engine for the Raft log of a fresh data dir.
    pub log_engine: LogEngine,
    /// Async worker threads; `None` is one per core.
    pub worker_threads: Option<usize>,
    /// Test-only skew of the stamp clock.
    pub test_clock_offset_ms: i64,
    /// Test-only: the snapshot size from which the node's own snapshot is decoded behind its
    /// start; `None` is the store's default.
    pub test_snapshot_background_from: Option<u64>,
    /// Where the lock table lives.
    pub backend: Backend,
    /// PostgreSQL URL (`--backend pg`).
    pub pg_url: Option<String>,
    /// etcd members (`--backend etcd`).
    pub etcd_endpoints: Vec<String>,
    /// Where the metrics endpoint listens; `None` serves none (docs/NODE_CLI.md says why
    /// that is the default).
    pub metrics_listen: Option<SocketAddr>,
    /// TLS on the node's port and to its peers; `None` with `--insecure` (plaintext).
    pub tls: Option<TlsConfig>,
}

/// A node's TLS settings (docs/SECURITY.md §1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// The CA, this node's certificate chain and its key.
    pub files: lock_tls::TlsFiles,
    /// Whether a client must present a certificate.
    pub require_client_cert: bool,
}

impl TlsConfig {
    /// Whether handshakes require a client certificate, in lock-tls's words.
    pub fn client_certs(&self) -> lock_tls::server::ClientCerts {
        if self.require_client_cert {
            lock_tls::server::ClientCerts::Required
        } else {
            lock_tls::server::ClientCerts::Optional
        }
    }
}

impl Config {
    /// Merges `args` (flags and env, already merged by clap) over the TOML file they name (if
    /// any) over the defaults, then validates the result.
    pub fn load(args: &RunArgs) -> Result<Config, ConfigError> {
        let mut file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let file_tls = FileTls {
            ca: file.tls_ca.take(),
            cert: file.tls_cert.take(),
            key: file.tls_key.take(),
            require_client_cert: file.require_client_cert,
            insecure: file.insecure,
        };
        let file_peers = file_id_addrs(file.peers, "peers")?;
        let file_raft_dial = file_id_addrs(file.raft_dial, "raft_dial")?;
        let roles = match (&args.role, file.roles) {
            (Some(flags), _) => crate::auth::roles::role_map(flags.iter().cloned()),
            (None, Some(table)) => table
                .into_iter()
                .map(|(principal, role)| {
                    let role = role
                        .parse()
                        .map_err(|e| format!("principal {principal:?}: {e}"))?;
                    Ok((principal, role))
                })
                .collect::<Result<Vec<_>, String>>()
                .and_then(crate::auth::roles::role_map),
            (None, None) => Ok(BTreeMap::new()),
        }
        .map_err(|reason| invalid("roles", reason))?;
        let backend = args.backend.or(file.backend).unwrap_or_default();
        let data_dir = args.data_dir.clone().or(file.data_dir);
        let peers = args.peers.clone().map(|p| p.0).or(file_peers);
        // A stateless node keeps no data and has no voters: it does not ask for either.
        let (data_dir, peers) = if backend.is_stateless() {
            (data_dir.unwrap_or_default(), peers.unwrap_or_default())
        } else {
            (
                data_dir.ok_or(ConfigError::Missing {
                    field: "data_dir",
                    flag: "data-dir",
                    env: "DATA_DIR",
                })?,
                peers.ok_or(ConfigError::Missing {
                    field: "peers",
                    flag: "peers",
                    env: "PEERS",
                })?,
            )
        };
        let config = Config {
            node_id: args.node_id.or(file.node_id).ok_or(ConfigError::Missing {
                field: "node_id",
                flag: "node-id",
                env: "NODE_ID",
            })?,
            listen: args.listen.or(file.listen).ok_or(ConfigError::Missing {
                field: "listen",
                flag: "listen",
                env: "LISTEN",
            })?,
            data_dir,
            peers,
            raft_dial: args
                .raft_dial
                .clone()
                .map(|p| p.0)
                .or(file_raft_dial)
                .unwrap_or_default(),
            bootstrap: args.bootstrap.or(file.bootstrap).unwrap_or(false),
            cluster_name: args
                .cluster_name
                .clone()
                .or(file.cluster_name)
                .unwrap_or_else(|| CLUSTER_NAME_DEFAULT.to_owned()),
            roles,
            tokens_file: args.tokens_file.clone().or(file.tokens_file),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            heartbeat_interval_ms: args
                .heartbeat_interval_ms
                .or(file.heartbeat_interval_ms)
                .unwrap_or(HEARTBEAT_INTERVAL_MS_DEFAULT),
            election_timeout_min_ms: args
                .election_timeout_min_ms
                .or(file.election_timeout_min_ms)
                .unwrap_or(ELECTION_TIMEOUT_MIN_MS_DEFAULT),
            election_timeout_max_ms: args
                .election_timeout_max_ms
                .or(file.election_timeout_max_ms)
                .unwrap_or(ELECTION_TIMEOUT_MAX_MS_DEFAULT),
            safety_margin_ms: args
                .safety_margin_ms
                .or(file.safety_margin_ms)
                .unwrap_or(SAFETY_MARGIN_MS_DEFAULT),
            snapshot_logs_since_last: args
                .snapshot_logs_since_last
                .or(file.snapshot_logs_since_last)
                .unwrap_or(SNAPSHOT_LOGS_SINCE_LAST_DEFAULT),
            log_engine: args.log_engine.or(file.log_engine).unwrap_or_default(),
            worker_threads: args.worker_threads.or(file.worker_threads),
            test_clock_offset_ms: args
                .test_clock_offset_ms
                .or(file.test_clock_offset_ms)
                .unwrap_or(0),
            test_snapshot_background_from: args.test_snapshot_background_from,
            backend,
            pg_url: args.pg_url.clone().or(file.pg_url),
            etcd_endpoints: args
                .etcd_endpoints
                .clone()
                .or(file.etcd_endpoints)
                .unwrap_or_default(),
            tls: None,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
        };
        config.validate()?;
        // Last: it reads and parses files, which is pointless while another field is wrong.
        let tls = tls_config(args, file_tls)?;
        Ok(Config { tls, ..config })
    }

    /// Checks every field and the relations between them; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.backend == Backend::Pg && self.pg_url.as_deref().is_none_or(str::is_empty) {
            return Err(invalid("pg_url", "is required with backend pg"));
        }
        if self.backend == Backend::Etcd && self.etcd_endpoints.is_empty() {
            return Err(invalid("etcd_endpoints", "is required with backend etcd"));
        }
        if self.node_id == 0 {
            return Err(invalid("node_id", "0 is not a node id; ids start at 1"));
        }
        if !self.backend.is_stateless() {
            self.validate_raft_node()?;
        }
        self.validate_common()
    }

    /// The settings only a Raft node uses: its voters, dial overrides and data dir.
    fn validate_raft_node(&self) -> Result<(), ConfigError> {
        if self.peers.is_empty() {
            return Err(invalid("peers", "lists no node"));
        }
        if self.peers.len() > PEERS_MAX {
            return Err(invalid(
                "peers",
                format!("lists {} nodes; the limit is {PEERS_MAX}", self.peers.len()),
            ));
        }
        if self.peers.contains_key(&0) {
            return Err(invalid(
                "peers",
                "node id 0 is not a node id; ids start at 1",
            ));
        }
        let mut seen = BTreeMap::new();
        for (id, addr) in &self.peers {
            check_host_port(addr).map_err(|reason| {
                invalid("peers", format!("node {id}'s address {addr:?} {reason}"))
            })?;
            if let Some(other) = seen.insert(addr.as_str(), *id) {
                return Err(invalid(
                    "peers",
                    format!("nodes {other} and {id} share the address {addr}"),
                ));
            }
        }
        if !self.peers.contains_key(&self.node_id) {
            return Err(invalid(
                "peers",
                format!(
                    "does not list this node (node_id {}); --peers must list every voter including this node",
                    self.node_id
                ),
            ));
        }
        self.validate_raft_dial()?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "is empty"));
        }
        Ok(())
    }

    /// The settings every node uses.
    fn validate_common(&self) -> Result<(), ConfigError> {
        if self.metrics_listen == Some(self.listen) {
            return Err(invalid(
                "metrics_listen",
                format!(
                    "{} is also `listen`; give the metrics endpoint its own port",
                    self.listen
                ),
            ));
        }
        let name = &self.cluster_name;
        if name.trim().is_empty()
            || name.len() > CLUSTER_NAME_LEN_MAX
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid(
                "cluster_name",
                format!("{name:?} must be 1..={CLUSTER_NAME_LEN_MAX} characters of [A-Za-z0-9._-]"),
            ));
        }
        if self.heartbeat_interval_ms < HEARTBEAT_INTERVAL_MS_MIN {
            return Err(invalid(
                "heartbeat_interval_ms",
                format!(
                    "{} ms is below the minimum of {HEARTBEAT_INTERVAL_MS_MIN} ms",
                    self.heartbeat_interval_ms
                ),
            ));
        }
        if self.heartbeat_interval_ms >= self.election_timeout_min_ms {
            return Err(invalid(
                "heartbeat_interval_ms",
                format!(
                    "{} ms must be below election_timeout_min_ms ({} ms), or followers time out between heartbeats",
                    self.heartbeat_interval_ms, self.election_timeout_min_ms
                ),
            ));
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return Err(invalid(
                "election_timeout_min_ms",
                format!(
                    "{} ms must be below election_timeout_max_ms ({} ms)",
                    self.election_timeout_min_ms, self.election_timeout_max_ms
                ),
            ));
        }
        // A lease shorter than an election timeout would routinely lapse on the client's side
        // while the cluster merely elects a new leader; the shortest lease must outlive one.
        let ttl_min_ms = lock_api::limits::TTL_MIN.as_millis() as u64;
        if self.election_timeout_max_ms >= ttl_min_ms {
            return Err(invalid(
                "election_timeout_max_ms",
                format!(
                    "{} ms must be below the shortest lease (TTL_MIN, {ttl_min_ms} ms)",
                    self.election_timeout_max_ms
                ),
            ));
        }
        if self.safety_margin_ms > SAFETY_MARGIN_MS_MAX {
            return Err(invalid(
                "safety_margin_ms",
                format!(
                    "{} ms is above the maximum of {SAFETY_MARGIN_MS_MAX} ms",
                    self.safety_margin_ms
                ),
            ));
        }
        if let Some(n) = self.worker_threads
            && !(1..=WORKER_THREADS_MAX).contains(&n)
        {
            return Err(invalid(
                "worker_threads",
                format!("{n} is outside 1..={WORKER_THREADS_MAX}"),
            ));
        }
        if self.snapshot_logs_since_last < SNAPSHOT_LOGS_SINCE_LAST_MIN {
            return Err(invalid(
                "snapshot_logs_since_last",
                format!(
                    "{} is below the minimum of {SNAPSHOT_LOGS_SINCE_LAST_MIN}",
                    self.snapshot_logs_since_last
                ),
            ));
        }
        self.raft_config()?;
        Ok(())
    }

    /// The settings given that this node's backend does not use (a stateless node keeps no
    /// data dir and has no voters, dial overrides or bootstrap); the node warns about each at
    /// start-up rather than refusing, so one config file can serve nodes of either kind.
    pub fn ignored_settings(&self) -> Vec<&'static str> {
        if !self.backend.is_stateless() {
            return Vec::new();
        }
        [
            ("data_dir", !self.data_dir.as_os_str().is_empty()),
            ("peers", !self.peers.is_empty()),
            ("raft_dial", !self.raft_dial.is_empty()),
            ("bootstrap", self.bootstrap),
        ]
        .into_iter()
        .filter_map(|(field, given)| given.then_some(field))
        .collect()
    }

    /// Whether this Raft node serves TLS to other members while no principal of its role map
    /// holds the `node` role. Only `node` may call the Raft service (docs/SECURITY.md §2), so
    /// such a node refuses every peer's votes and appends, and a cluster of them never elects a
    /// leader. The node warns at start-up rather than refusing: a one-member cluster needs no
    /// mapping, and the other members may be mapped by a later restart.
    pub fn peers_lack_the_node_role(&self) -> bool {
        !self.backend.is_stateless()
            && self.tls.is_some()
            && self.peers.keys().any(|&id| id != self.node_id)
            && !self
                .roles
                .values()
                .any(|&role| role == crate::auth::Role::Node)
    }

    /// `raft_dial`: at most [`RAFT_DIAL_MAX`] entries, non-zero ids, `HOST:PORT` addresses.
    /// An id need not be in `peers` (a member added later may be dialled through it too).
    fn validate_raft_dial(&self) -> Result<(), ConfigError> {
        if self.raft_dial.len() > RAFT_DIAL_MAX {
            return Err(invalid(
                "raft_dial",
                format!(
                    "lists {} overrides; the limit is {RAFT_DIAL_MAX}",
                    self.raft_dial.len()
                ),
            ));
        }
        if self.raft_dial.contains_key(&0) {
            return Err(invalid(
                "raft_dial",
                "node id 0 is not a node id; ids start at 1",
            ));
        }
        for (id, addr) in &self.raft_dial {
            check_host_port(addr).map_err(|reason| {
                invalid(
                    "raft_dial",
                    format!("node {id}'s dial address {addr:?} {reason}"),
                )
            })?;
        }
        Ok(())
    }

    /// This node's advertised `host:port` (its entry in `peers`).
    pub fn advertised_addr(&self) -> &str {
        self.peers
            .get(&self.node_id)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The openraft configuration, validated by openraft too.
    pub fn raft_config(&self) -> Result<openraft::Config, ConfigError> {
        let config = openraft::Config {
            cluster_name: self.cluster_name.clone(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            // Each node is asked at its own interval, so the nodes do not all build their
            // snapshots at one index (the store's policy then decides whether one is due).
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(
                lock_raft_store::storage::ask_interval(self.snapshot_logs_since_last, self.node_id),
            ),
            // Keep a tail of the log past the snapshot so a briefly lagging follower catches up
            // from the log instead of receiving the whole state machine.
            max_in_snapshot_log_to_keep: self.snapshot_logs_since_last / 2,
            purge_batch_size: 256,
            // Each entry may be a batch of up to `BATCH_MAX` commands; bounding entries per
            // append keeps one append message well under the Raft transport's message limit.
            max_payload_entries: RAFT_PAYLOAD_ENTRIES_MAX,
            enable_tick: true,
            enable_heartbeat: true,
            enable_elect: true,
            // A node that was partitioned away or restarted asks first whether it could win
            // before it raises its term, so rejoining never deposes a healthy leader.
            enable_pre_vote: Some(true),
            ..Default::default()
        };
        config.validate().map_err(|e| {
            invalid(
                "election_timeout_min_ms",
                format!("openraft rejects it: {e}"),
            )
        })
    }

    /// The heartbeat interval as a duration.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
}

/// Most log entries in one append-entries message (see [`Config::raft_config`]).
pub const RAFT_PAYLOAD_ENTRIES_MAX: u64 = 64;

fn check_host_port(addr: &str) -> Result<(), &'static str> {
    let (host, port) = addr.rsplit_once(':').ok_or("has no :PORT")?;
    if host.is_empty() {
        return Err("has no host");
    }
    if addr.contains("://") {
        return Err("must be HOST:PORT without a scheme");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("has no valid port (1..=65535)"),
        Ok(_) => Ok(()),
    }
}

/// The `[[peers]]`-shaped list of the TOML file as a map; `field` names it in errors.
fn file_id_addrs(
    list: Option<Vec<FilePeer>>,
    field: &'static str,
) -> Result<Option<BTreeMap<u64, String>>, ConfigError> {
    let Some(list) = list else {
        return Ok(None);
    };
    let mut map = BTreeMap::new();
    for p in list {
        if map.insert(p.id, p.addr).is_some() {
            return Err(invalid(field, format!("node id {} is listed twice", p.id)));
        }
    }
    Ok(Some(map))
}

/// The TLS keys of the TOML file, taken out of it before the rest is merged.
struct FileTls {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    require_client_cert: Option<bool>,
    insecure: Option<bool>,
}

/// The three TLS file fields: (field, flag, env suffix).
const TLS_FILE_FIELDS: [(&str, &str, &str); 3] = [
    ("tls_ca", "tls-ca", "TLS_CA"),
    ("tls_cert", "tls-cert", "TLS_CERT"),
    ("tls_key", "tls-key", "TLS_KEY"),
];

/// The TLS settings of `args` over `file`: exactly one of {all three TLS files, `insecure`},
/// and with the files, each one read and parsed now so a bad path or file stops the start
/// naming its field.
fn tls_config(args: &RunArgs, file: FileTls) -> Result<Option<TlsConfig>, ConfigError> {
    let ca = args.tls_ca.clone().or(file.ca);
    let cert = args.tls_cert.clone().or(file.cert);
    let key = args.tls_key.clone().or(file.key);
    let insecure = args.insecure.or(file.insecure).unwrap_or(false);
    let require_client_cert = args
        .require_client_cert
        .or(file.require_client_cert)
        .unwrap_or(false);
    let given: Vec<&str> = [
        (TLS_FILE_FIELDS[0].0, &ca),
        (TLS_FILE_FIELDS[1].0, &cert),
        (TLS_FILE_FIELDS[2].0, &key),
    ]
    .into_iter()
    .filter_map(|(field, path)| path.is_some().then_some(field))
    .collect();
    if insecure {
        if !given.is_empty() {
            return Err(invalid(
                "insecure",
                format!(
                    "plaintext cannot be combined with {}; give the three TLS files or insecure, not both",
                    given.join(", ")
                ),
            ));
        }
        if require_client_cert {
            return Err(invalid(
                "require_client_cert",
                "needs TLS (tls_ca, tls_cert, tls_key); it cannot be combined with insecure",
            ));
        }
        return Ok(None);
    }
    let (Some(ca), Some(cert), Some(key)) = (ca, cert, key) else {
        if given.is_empty() {
            return Err(invalid(
                "tls_ca",
                "lockd does not serve plaintext by default: give tls_ca, tls_cert and tls_key \
                 (--tls-ca/--tls-cert/--tls-key, LOCKD_TLS_*), or insecure (--insecure) to serve \
                 plaintext with nobody authenticated",
            ));
        }
        let missing = TLS_FILE_FIELDS
            .into_iter()
            .find(|(field, _, _)| !given.contains(field))
            .unwrap_or(TLS_FILE_FIELDS[0]);
        return Err(ConfigError::Missing {
            field: missing.0,
            flag: missing.1,
            env: missing.2,
        });
    };
    let files = lock_tls::TlsFiles { ca, cert, key };
    check_tls_files(&files)?;
    Ok(Some(TlsConfig {
        files,
        require_client_cert,
    }))
}

/// Reads and parses the three files as the node will: the CA as trust anchors, the chain with
/// a principal on its leaf, the key, and the key matching the certificate.
fn check_tls_files(files: &lock_tls::TlsFiles) -> Result<(), ConfigError> {
    let field_of = |err: &lock_tls::TlsError| match err {
        lock_tls::TlsError::Read { path, .. } | lock_tls::TlsError::Content { path, .. }
            if *path == files.ca =>
        {
            "tls_ca"
        }
        lock_tls::TlsError::Read { path, .. } | lock_tls::TlsError::Content { path, .. }
            if *path == files.key =>
        {
            "tls_key"
        }
        _ => "tls_cert",
    };
    let failed = |err: lock_tls::TlsError| invalid(field_of(&err), err.to_string());
    lock_tls::pem::load_roots(&files.ca).map_err(failed)?;
    let chain = lock_tls::pem::load_certs(&files.cert).map_err(failed)?;
    if let Some(leaf) = chain.first() {
        lock_tls::principal_of(leaf).map_err(|reason| {
            invalid(
                "tls_cert",
                format!(
                    "{}: {reason} (peers need it as this node's principal)",
                    files.cert.display()
                ),
            )
        })?;
    }
    lock_tls::pem::load_key(&files.key).map_err(failed)?;
    lock_tls::server::server_config(files, lock_tls::server::ClientCerts::Required)
        .map_err(failed)?;
    Ok(())
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        reason: format!("cannot read it: {e}"),
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        reason: format!("not valid lockd TOML: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RunArgs {
        RunArgs {
            node_id: Some(1),
            listen: Some("127.0.0.1:7101".parse().unwrap()),
            data_dir: Some("/tmp/x".into()),
            peers: Some(parse_peers("1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103").unwrap()),
            insecure: Some(true),
            ..RunArgs::default()
        }
    }

    fn field_of(err: ConfigError) -> &'static str {
        match err {
            ConfigError::Invalid { field, .. } | ConfigError::Missing { field, .. } => field,
            ConfigError::File { .. } => "<file>",
        }
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let c = Config::load(&args()).unwrap();
        assert_eq!(c.heartbeat_interval_ms, 100);
        assert_eq!(c.election_timeout_min_ms, 400);
        assert_eq!(c.election_timeout_max_ms, 600);
        assert_eq!(c.cluster_name, "lockd");
        assert!(!c.bootstrap);
        assert_eq!(c.advertised_addr(), "127.0.0.1:7101");
    }

    #[test]
    fn worker_threads_default_to_the_cores_and_are_bounded() {
        assert_eq!(Config::load(&args()).unwrap().worker_threads, None);
        let mut a = args();
        a.worker_threads = Some(1);
        assert_eq!(Config::load(&a).unwrap().worker_threads, Some(1));
        for bad in [0, WORKER_THREADS_MAX + 1] {
            let mut a = args();
            a.worker_threads = Some(bad);
            assert_eq!(field_of(Config::load(&a).unwrap_err()), "worker_threads");
        }
        assert!(colocated_worker_threads(3) >= 1);
        assert!(colocated_worker_threads(0) >= 1);
    }

    #[test]
    fn missing_fields_are_named() {
        let mut a = args();
        a.node_id = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "node_id");
        let mut a = args();
        a.peers = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "peers");
    }

    fn stateless(backend: Backend) -> RunArgs {
        RunArgs {
            node_id: Some(4),
            listen: Some("127.0.0.1:7104".parse().unwrap()),
            backend: Some(backend),
            pg_url: Some("postgres://u@127.0.0.1:5432/db".into()),
            etcd_endpoints: Some(vec!["http://127.0.0.1:2379".into()]),
            insecure: Some(true),
            ..RunArgs::default()
        }
    }

    #[test]
    fn a_stateless_node_needs_no_data_dir_and_no_peers() {
        for backend in [Backend::Pg, Backend::Etcd] {
            let c = Config::load(&stateless(backend)).unwrap();
            assert!(c.data_dir.as_os_str().is_empty());
            assert!(c.peers.is_empty());
            assert!(
                c.ignored_settings().is_empty(),
                "{:?}",
                c.ignored_settings()
            );
        }
    }

    #[test]
    fn a_stateless_node_names_the_settings_it_ignores() {
        let mut a = stateless(Backend::Pg);
        a.data_dir = Some("/tmp/x".into());
        a.peers = Some(parse_peers("4=127.0.0.1:7104").unwrap());
        let c = Config::load(&a).unwrap();
        assert_eq!(c.ignored_settings(), vec!["data_dir", "peers"]);
        // Even a peers list that would be refused on a Raft node is only ignored.
        a.peers = Some(parse_peers("1=127.0.0.1:7101").unwrap());
        assert!(Config::load(&a).is_ok());
    }

    #[test]
    fn a_raft_node_still_needs_both() {
        let mut a = args();
        a.data_dir = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "data_dir");
        assert!(Config::load(&args()).unwrap().ignored_settings().is_empty());
    }

    #[test]
    fn relations_between_timeouts_are_checked() {
        let mut a = args();
        a.heartbeat_interval_ms = Some(400);
        assert_eq!(
            field_of(Config::load(&a).unwrap_err()),
            "heartbeat_interval_ms"
        );
        let mut a = args();
        a.election_timeout_min_ms = Some(800);
        assert_eq!(
            field_of(Config::load(&a).unwrap_err()),
            "election_timeout_min_ms"
        );
        let mut a = args();
        a.election_timeout_max_ms = Some(1_000);
        assert_eq!(
            field_of(Config::load(&a).unwrap_err()),
            "election_timeout_max_ms"
        );
        let mut a = args();
        a.safety_margin_ms = Some(SAFETY_MARGIN_MS_MAX + 1);
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "safety_margin_ms");
    }

    #[test]
    fn peers_must_include_this_node_and_be_well_formed() {
        let mut a = args();
        a.node_id = Some(4);
        let err = Config::load(&a).unwrap_err();
        assert!(err.to_string().contains("node_id 4"), "{err}");
        assert_eq!(field_of(err), "peers");
        assert!(parse_peers("1=a:1,1=b:2").is_err());
        assert!(parse_peers("x=a:1").is_err());
        let mut a = args();
        a.peers = Some(parse_peers("1=127.0.0.1:7101,2=127.0.0.1:7101").unwrap());
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "peers");
        let mut a = args();
        a.peers = Some(parse_peers("1=127.0.0.1").unwrap());
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "peers");
    }

    #[test]
    fn raft_dial_parses_and_is_validated() {
        let c = Config::load(&args()).unwrap();
        assert!(c.raft_dial.is_empty(), "no override unless asked");

        let mut a = args();
        a.raft_dial = Some(parse_raft_dial("2=127.0.0.1:9002, 3=127.0.0.1:9003").unwrap());
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.raft_dial.get(&2).map(String::as_str),
            Some("127.0.0.1:9002")
        );
        assert_eq!(
            c.raft_dial.get(&3).map(String::as_str),
            Some("127.0.0.1:9003")
        );
        assert_eq!(c.peers.get(&2).map(String::as_str), Some("127.0.0.1:7102"));

        let err = parse_raft_dial("2=a:1,2=b:2").unwrap_err();
        assert!(
            err.contains("raft dial entry id 2 is listed twice"),
            "{err}"
        );
        assert!(parse_raft_dial("x=a:1").is_err());
        assert!(parse_raft_dial("127.0.0.1:9002").is_err());

        for bad in [
            "0=127.0.0.1:9000",
            "2=127.0.0.1",
            "2=127.0.0.1:0",
            "2=http://127.0.0.1:9002",
            "2=:9002",
        ] {
            let mut a = args();
            a.raft_dial = Some(parse_raft_dial(bad).unwrap());
            let err = Config::load(&a).unwrap_err();
            assert!(err.to_string().contains("raft_dial"), "{bad}: {err}");
            assert_eq!(field_of(err), "raft_dial", "{bad}");
        }

        let too_many = (1..=RAFT_DIAL_MAX as u64 + 1)
            .map(|id| format!("{id}=127.0.0.1:{}", 9000 + id))
            .collect::<Vec<_>>()
            .join(",");
        let mut a = args();
        a.raft_dial = Some(parse_raft_dial(&too_many).unwrap());
        let err = Config::load(&a).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        assert_eq!(field_of(err), "raft_dial");
    }

    #[test]
    fn raft_dial_comes_from_the_file_below_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockd.toml");
        std::fs::write(
            &path,
            r#"
raft_dial = [{ id = 2, addr = "127.0.0.1:9002" }, { id = 3, addr = "127.0.0.1:9003" }]
"#,
        )
        .unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        let c = Config::load(&a).unwrap();
        assert_eq!(c.raft_dial.len(), 2);
        assert_eq!(
            c.raft_dial.get(&3).map(String::as_str),
            Some("127.0.0.1:9003")
        );

        a.raft_dial = Some(parse_raft_dial("2=127.0.0.1:9999").unwrap());
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.raft_dial.into_iter().collect::<Vec<_>>(),
            vec![(2, "127.0.0.1:9999".to_owned())],
            "the flag replaces the file's list"
        );

        std::fs::write(
            &path,
            r#"raft_dial = [{ id = 2, addr = "a:1" }, { id = 2, addr = "b:2" }]"#,
        )
        .unwrap();
        a.raft_dial = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "raft_dial");
    }

    #[test]
    fn cluster_name_is_checked() {
        let mut a = args();
        a.cluster_name = Some("bad name".into());
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "cluster_name");
    }

    #[test]
    fn the_metrics_endpoint_is_off_unless_given_and_needs_its_own_port() {
        assert_eq!(Config::load(&args()).unwrap().metrics_listen, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockd.toml");
        std::fs::write(&path, "metrics_listen = \"127.0.0.1:7111\"\n").unwrap();
        let mut a = args();
        a.config = Some(path);
        assert_eq!(
            Config::load(&a).unwrap().metrics_listen,
            Some("127.0.0.1:7111".parse().unwrap())
        );
        a.metrics_listen = Some("127.0.0.1:7121".parse().unwrap());
        assert_eq!(
            Config::load(&a).unwrap().metrics_listen,
            Some("127.0.0.1:7121".parse().unwrap()),
            "the flag wins over the file"
        );
        a.metrics_listen = a.listen;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "metrics_listen");
    }

    #[test]
    fn the_file_is_below_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockd.toml");
        std::fs::write(
            &path,
            r#"
node_id = 2
listen = "127.0.0.1:7102"
data_dir = "/tmp/n2"
cluster_name = "filecluster"
heartbeat_interval_ms = 50
peers = [{ id = 1, addr = "127.0.0.1:7101" }, { id = 2, addr = "127.0.0.1:7102" }]
"#,
        )
        .unwrap();
        let a = RunArgs {
            config: Some(path.clone()),
            heartbeat_interval_ms: Some(60),
            insecure: Some(true),
            ..RunArgs::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.cluster_name, "filecluster");
        assert_eq!(c.heartbeat_interval_ms, 60, "the flag wins over the file");
        assert_eq!(c.peers.len(), 2);

        std::fs::write(&path, "node_idd = 1\n").unwrap();
        let err = Config::load(&a).unwrap_err();
        assert!(err.to_string().contains("node_idd"), "{err}");
    }

    #[test]
    fn roles_come_from_flags_over_the_file_and_bad_ones_name_the_field() {
        use crate::auth::Role;
        use clap::Parser;

        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let parsed = Cli::try_parse_from([
            "lockd",
            "--role",
            "admin=admin",
            "--role",
            "node-1=node,client=client",
            "--tokens-file",
            "/etc/lockd/tokens",
        ])
        .expect("the flags parse");
        let mut a = args();
        a.role = parsed.run.role;
        a.tokens_file = parsed.run.tokens_file;
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.roles,
            BTreeMap::from([
                ("admin".to_owned(), Role::Admin),
                ("client".to_owned(), Role::Client),
                ("node-1".to_owned(), Role::Node),
            ])
        );
        assert_eq!(c.tokens_file, Some(PathBuf::from("/etc/lockd/tokens")));
        assert!(Cli::try_parse_from(["lockd", "--role", "alice=root"]).is_err());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockd.toml");
        std::fs::write(&path, "[roles]\n\"spiffe://x/op\" = \"operator\"\n").unwrap();
        let mut a = args();
        a.config = Some(path.clone());
        let c = Config::load(&a).unwrap();
        assert_eq!(c.roles.get("spiffe://x/op"), Some(&Role::Operator));
        a.role = Some(vec![("admin".to_owned(), Role::Admin)]);
        assert_eq!(
            Config::load(&a).unwrap().roles.len(),
            1,
            "the flags replace the file's map"
        );

        std::fs::write(&path, "[roles]\nalice = \"root\"\n").unwrap();
        let mut a = args();
        a.config = Some(path);
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "roles");
        let mut a = args();
        a.role = Some(vec![("a".into(), Role::Client), ("a".into(), Role::Admin)]);
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "roles");
    }

    /// A CA, a node certificate and its key minted into `dir`.
    fn tls_files(dir: &Path) -> lock_tls::TlsFiles {
        let ca = lock_tls::mint::Authority::new("config test ca").unwrap();
        let files = lock_tls::TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("node.pem"),
            key: dir.join("node-key.pem"),
        };
        ca.write(&files.ca, &dir.join("ca-key.pem")).unwrap();
        ca.issue("node-1")
            .unwrap()
            .write(&files.cert, &files.key)
            .unwrap();
        files
    }

    fn tls_args(files: &lock_tls::TlsFiles) -> RunArgs {
        let mut a = args();
        a.insecure = None;
        a.tls_ca = Some(files.ca.clone());
        a.tls_cert = Some(files.cert.clone());
        a.tls_key = Some(files.key.clone());
        a
    }

    #[test]
    fn a_tls_node_with_peers_and_no_node_role_is_flagged() {
        use crate::auth::Role;
        let dir = tempfile::tempdir().unwrap();
        let files = tls_files(dir.path());
        let load = |a: &RunArgs| Config::load(a).unwrap().peers_lack_the_node_role();
        // TLS, two other members, a role map without `node`: every peer would be refused.
        let mut a = tls_args(&files);
        a.role = Some(vec![("admin".into(), Role::Admin)]);
        assert!(load(&a));
        assert!(load(&tls_args(&files)), "no role map at all");
        // Any principal mapped to `node` clears it.
        a.role = Some(vec![("node-2".into(), Role::Node)]);
        assert!(!load(&a));
        // Plaintext (everything is allowed) and a one-member cluster need no mapping.
        assert!(!load(&args()));
        let mut a = tls_args(&files);
        a.peers = Some(parse_peers("1=127.0.0.1:7101").unwrap());
        assert!(!load(&a));
    }

    /// The TOML example of docs/NODE_CLI.md: every key known, the optional ones after the
    /// first table would be swallowed by it, and it maps each member to `node`.
    #[test]
    fn the_node_cli_toml_example_parses_and_maps_every_member() {
        let doc = include_str!("../../../docs/NODE_CLI.md");
        let start = doc.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let block = &doc[start..];
        let block = &block[..block.find("```").expect("the block ends")];
        let file: FileConfig = toml::from_str(block).expect("the example is lockd TOML");
        let roles = file.roles.expect("the example maps roles");
        for peer in file.peers.expect("the example lists peers") {
            let mapped = roles
                .iter()
                .any(|(p, r)| r == "node" && p.ends_with(&format!("-{}", peer.id)));
            assert!(mapped, "member {} has no principal mapped to node", peer.id);
        }
        assert!(
            file.heartbeat_interval_ms.is_some(),
            "the optional keys stay top-level"
        );
    }

    #[test]
    fn plaintext_needs_insecure_and_insecure_excludes_the_tls_files() {
        let mut a = args();
        a.insecure = None;
        let err = Config::load(&a).unwrap_err();
        assert!(err.to_string().contains("insecure"), "{err}");
        assert_eq!(field_of(err), "tls_ca");
        assert_eq!(Config::load(&args()).unwrap().tls, None);

        let dir = tempfile::tempdir().unwrap();
        let files = tls_files(dir.path());
        let mut a = tls_args(&files);
        a.insecure = Some(true);
        let err = Config::load(&a).unwrap_err();
        assert!(
            err.to_string().contains("tls_ca, tls_cert, tls_key"),
            "{err}"
        );
        assert_eq!(field_of(err), "insecure");

        let mut a = args();
        a.require_client_cert = Some(true);
        assert_eq!(
            field_of(Config::load(&a).unwrap_err()),
            "require_client_cert"
        );
    }

    #[test]
    fn the_three_tls_files_are_required_together_and_parsed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let files = tls_files(dir.path());
        let mut a = tls_args(&files);
        a.require_client_cert = Some(true);
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.tls,
            Some(TlsConfig {
                files: files.clone(),
                require_client_cert: true
            })
        );

        let mut a = tls_args(&files);
        a.tls_key = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "tls_key");
        let mut a = tls_args(&files);
        a.tls_ca = None;
        assert_eq!(field_of(Config::load(&a).unwrap_err()), "tls_ca");

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "junk").unwrap();
        for (field, set) in [
            (
                "tls_ca",
                (|a: &mut RunArgs, p: PathBuf| a.tls_ca = Some(p)) as fn(&mut RunArgs, PathBuf),
            ),
            ("tls_cert", |a, p| a.tls_cert = Some(p)),
            ("tls_key", |a, p| a.tls_key = Some(p)),
        ] {
            for bad in [junk.clone(), dir.path().join("missing.pem")] {
                let mut a = tls_args(&files);
                set(&mut a, bad.clone());
                let err = Config::load(&a).unwrap_err();
                let name = bad.file_name().unwrap().to_string_lossy().into_owned();
                assert!(err.to_string().contains(&name), "{field}: {err}");
                assert_eq!(field_of(err), field, "{bad:?}");
            }
        }

        // A key of another certificate: the pair is refused, naming both files.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let other = tls_files(&other);
        let mut a = tls_args(&files);
        a.tls_key = Some(other.key);
        let err = Config::load(&a).unwrap_err().to_string();
        assert!(
            err.contains("node-key.pem") && err.contains("node.pem"),
            "{err}"
        );
    }

    #[test]
    fn tls_settings_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = tls_files(dir.path());
        let path = dir.path().join("lockd.toml");
        std::fs::write(
            &path,
            format!(
                "tls_ca = {:?}\ntls_cert = {:?}\ntls_key = {:?}\nrequire_client_cert = true\n",
                files.ca, files.cert, files.key
            ),
        )
        .unwrap();
        let mut a = args();
        a.insecure = None;
        a.config = Some(path.clone());
        let tls = Config::load(&a).unwrap().tls.unwrap();
        assert_eq!(tls.files, files);
        assert!(tls.require_client_cert);

        std::fs::write(&path, "insecure = true\n").unwrap();
        assert_eq!(Config::load(&a).unwrap().tls, None);
    }
}
