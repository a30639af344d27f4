//! [`ClusterConfig`]: how a test cluster is shaped and timed, with defaults tuned for tests on a
//! small shared machine.
//!
//! Owns the numbers only; starting processes is [`crate::Cluster`]'s job.

use std::collections::BTreeMap;
use std::time::Duration;

/// Raft heartbeat interval given to test nodes (`--heartbeat-interval-ms`).
///
/// Half again lockd's default (100 ms): openraft times a replication RPC out after one
/// heartbeat interval, and on two cores shared with compilers 100 ms appends time out often
/// enough to make leader-confirmed reads answer `Contention` and to cause spurious elections.
pub const HEARTBEAT_INTERVAL_MS: u64 = 150;

/// Lower bound of the randomized election timeout given to test nodes
/// (`--election-timeout-min-ms`): three heartbeats, so one late heartbeat never starts an
/// election.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 450;

/// Upper bound of the randomized election timeout (`--election-timeout-max-ms`). Twice the
/// minimum, so split votes are rare; below the shortest lease (`TTL_MIN`), which lockd requires
/// so that a failover does not routinely outlast every lease. Failover bounds in the tests are
/// multiples of it.
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 900;

/// How long one node may take from spawn to its `lockd ready` line. Generous because two cores
/// are shared with compilers: a cold start of a debug binary can take seconds there.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a fresh (or restarted) cluster may take to agree on a leader once every node is
/// ready: a handful of election rounds plus scheduling noise.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a node may take to exit after SIGTERM before the harness declares the graceful
/// shutdown broken (and SIGKILLs it).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

const _: () = assert!(ELECTION_TIMEOUT_MIN_MS >= 3 * HEARTBEAT_INTERVAL_MS);
const _: () = assert!(ELECTION_TIMEOUT_MIN_MS < ELECTION_TIMEOUT_MAX_MS);
const _: () = assert!((ELECTION_TIMEOUT_MAX_MS as u128) < lock_api::limits::TTL_MIN.as_millis());

/// The shape and timing of a test cluster. `ClusterConfig::default()` is three nodes with the
/// timing constants of this module; change fields for special cases.
///
/// ```
/// let config = lock_tests::ClusterConfig { nodes: 5, ..Default::default() };
/// assert_eq!(config.nodes, 5);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Number of voters, with ids `1..=nodes`. Node 1 bootstraps the cluster.
    pub nodes: usize,
    /// `--heartbeat-interval-ms` of every node.
    pub heartbeat_interval_ms: u64,
    /// `--election-timeout-min-ms` of every node.
    pub election_timeout_min_ms: u64,
    /// `--election-timeout-max-ms` of every node.
    pub election_timeout_max_ms: u64,
    /// Per node, from spawn to its ready line.
    pub ready_timeout: Duration,
    /// From every node ready to an agreed leader (also used by [`crate::Cluster::leader`]).
    pub leader_timeout: Duration,
    /// Extra arguments appended to every node's `lockd run` command line.
    pub extra_args: Vec<String>,
    /// Extra arguments for one node only (by node id), appended after `extra_args`; e.g.
    /// `--test-clock-offset-ms`.
    pub node_args: BTreeMap<u64, Vec<String>>,
    /// Extra environment variables of every node process (e.g. `RUST_LOG`). Inherited
    /// `LOCKD_*` variables are always removed, so only the harness configures the nodes.
    pub env: Vec<(String, String)>,
    /// Route every node-to-node Raft connection through a harness proxy ([`crate::links`]),
    /// so the test can partition nodes with [`crate::Cluster::isolate`] and heal them with
    /// [`crate::Cluster::heal`]. Off by default: the proxies cost a hop and a task per link.
    pub proxied_links: bool,
    /// Serve TLS (default `true`, as `lockd run` requires): the cluster mints a fresh PKI in
    /// its directory ([`crate::TestPki`]) and the nodes get `--tls-ca/--tls-cert/--tls-key`
    /// and the role map. `false` starts them with `--insecure` (plaintext, everything
    /// allowed).
    pub tls: bool,
    /// With TLS, start the nodes with `--require-client-cert` (default `true`, as `lockd dev`
    /// does): a client without a certificate is refused at the handshake. `false` lets a
    /// client in on a bearer token instead.
    pub require_client_cert: bool,
    /// With TLS, role mappings `(principal, role)` besides the standard ones (`node-<id>` =
    /// node, and `client`, `operator`, `admin` each the role of its name), e.g. for a
    /// principal minted with [`crate::TestPki::mint`]. The nodes get the map in `LOCKD_ROLES`
    /// ([`crate::pki::roles_env`]); a `--role` in `extra_args` would replace all of it.
    pub roles: Vec<(String, String)>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nodes: 3,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_MS,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS,
            ready_timeout: READY_TIMEOUT,
            leader_timeout: LEADER_TIMEOUT,
            extra_args: Vec::new(),
            node_args: BTreeMap::new(),
            env: Vec::new(),
            proxied_links: false,
            tls: true,
            require_client_cert: true,
            roles: Vec::new(),
        }
    }
}

impl ClusterConfig {
    /// The default configuration with `nodes` voters.
    pub fn with_nodes(nodes: usize) -> Self {
        Self {
            nodes,
            ..Self::default()
        }
    }

    /// The default configuration with `nodes` voters, plaintext (`--insecure`).
    pub fn insecure(nodes: usize) -> Self {
        Self {
            tls: false,
            ..Self::with_nodes(nodes)
        }
    }

    /// The configured maximum election timeout, as a [`Duration`].
    pub fn election_timeout_max(&self) -> Duration {
        Duration::from_millis(self.election_timeout_max_ms)
    }
}
