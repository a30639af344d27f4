//! [`StatelessNodes`]: `lockd run --backend pg|etcd` processes on 127.0.0.1 that share one
//! database, for tests that must show what a client sees from the stateless backends.
//!
//! Owns the node processes (their ports, placeholder data dirs and logs, in one temporary
//! directory) and one [`DbLink`] per database address, through which every node reaches its
//! database, so a test can cut the nodes off it ([`StatelessNodes::cut_backend`]) and give it
//! back ([`StatelessNodes::heal_backend`]). Like [`crate::Cluster`] it interprets no lock
//! semantics, kills every node on `Drop` (printing the log tails when the test failed), and
//! fails the test if a node exited on its own.
//!
//! Like a [`crate::Cluster`], the nodes serve TLS by default with a [`TestPki`] minted in
//! their directory, and the harness's clients connect as `admin`;
//! [`StatelessNodes::start_with`] with `tls: false` starts them with `--insecure`.
//!
//! The databases come from the environment ([`PG_URL_ENV`], [`ETCD_ENDPOINTS_ENV`], which
//! `scripts/test-services.sh` prints); [`StatelessBackend::from_env`] fails, naming
//! `scripts/test`, when they are unset, so a test on these backends never passes untested.

use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitStatus;

use tempfile::TempDir;
use tonic::transport::Channel;

use crate::db_link::DbLink;
use crate::dial::Dial;
use crate::pki::{HARNESS_IDENTITY, TestPki, node_tls_args, roles_env};
use crate::process::{NodeProcess, NotReady};
use crate::watchdog::Watchdog;
use crate::{ClusterClient, HarnessError, NodeClient, config, lockd_binary, ports};

/// The PostgreSQL URL (`postgres://user@host:port/db`) the pg nodes use.
pub const PG_URL_ENV: &str = "LOCKD_TEST_PG_URL";

/// The etcd members (`http://host:port,…`) the etcd nodes use.
pub const ETCD_ENDPOINTS_ENV: &str = "LOCKD_TEST_ETCD_ENDPOINTS";

/// How many times a start is retried with fresh ports when a node finds its port taken.
const SPAWN_ATTEMPTS: usize = 4;

/// Log lines per file printed when a test fails.
const TAIL_LINES: usize = 60;

/// Which database the nodes serve from, with its address as the test environment gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatelessBackend {
    /// `--backend pg --pg-url <url>`.
    Pg {
        /// `postgres://user@host:port/db`.
        url: String,
    },
    /// `--backend etcd --etcd-endpoints <endpoints>`.
    Etcd {
        /// `http://host:port` of each member.
        endpoints: Vec<String>,
    },
}

impl StatelessBackend {
    /// The backend named `name` (`"pg"` or `"etcd"`) from its environment variable.
    ///
    /// # Panics
    /// If the name is neither, or the variable is unset or blank: the message names
    /// `scripts/test` and `scripts/test-services.sh`, so a run without the services fails
    /// instead of passing untested.
    pub fn from_env(name: &str) -> Self {
        match name {
            "pg" => Self::Pg {
                url: required_setting(PG_URL_ENV, "pg"),
            },
            "etcd" => Self::Etcd {
                endpoints: required_setting(ETCD_ENDPOINTS_ENV, "etcd")
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            },
            other => panic!("no stateless backend named {other:?} (pg, etcd)"),
        }
    }

    /// `pg` or `etcd`, as `--backend` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pg { .. } => "pg",
            Self::Etcd { .. } => "etcd",
        }
    }

    /// The database addresses a node connects to, one per proxy.
    fn upstreams(&self) -> Result<Vec<SocketAddr>, HarnessError> {
        match self {
            Self::Pg { url } => Ok(vec![resolve(&pg_url_parts(url)?.1)?]),
            Self::Etcd { endpoints } => endpoints
                .iter()
                .map(|e| resolve(e.trim_start_matches("http://").trim_end_matches('/')))
                .collect(),
        }
    }

    /// The `--backend …` arguments of a node that reaches the database at `links` instead.
    fn args(&self, links: &[DbLink]) -> Result<Vec<OsString>, HarnessError> {
        Ok(match self {
            Self::Pg { url } => {
                let (head, _, tail) = pg_url_parts(url)?;
                vec![
                    "--backend".into(),
                    "pg".into(),
                    "--pg-url".into(),
                    format!("{head}{}{tail}", links[0].addr()).into(),
                ]
            }
            Self::Etcd { .. } => vec![
                "--backend".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                links
                    .iter()
                    .map(|l| format!("http://{}", l.addr()))
                    .collect::<Vec<_>>()
                    .join(",")
                    .into(),
            ],
        })
    }
}

/// The value of `var`, or a panic that says how to provide it.
fn required_setting(var: &str, backend: &str) -> String {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{var} is unset, so the tests against the {backend} backend cannot run. Run the \
             tests with `scripts/test` (README's test command: it starts a private PostgreSQL \
             and etcd), or start them yourself with `eval \"$(scripts/test-services.sh start)\"` \
             before `cargo nextest run`"
        ),
    }
}

/// `(scheme://user@, host:port, /database…)` of a PostgreSQL URL.
fn pg_url_parts(url: &str) -> Result<(String, String, String), HarnessError> {
    let bad = || {
        HarnessError::new(format!(
            "{PG_URL_ENV}={url:?} is not of the form postgres://user@host:port/database"
        ))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (auth, rest) = rest.split_once('@').ok_or_else(bad)?;
    let (host_port, path) = rest.split_once('/').ok_or_else(bad)?;
    Ok((
        format!("{scheme}://{auth}@"),
        host_port.to_owned(),
        format!("/{path}"),
    ))
}

fn resolve(host_port: &str) -> Result<SocketAddr, HarnessError> {
    host_port
        .to_socket_addrs()
        .map_err(|e| HarnessError::new(format!("cannot resolve {host_port:?}: {e}")))?
        .next()
        .ok_or_else(|| HarnessError::new(format!("{host_port:?} resolves to no address")))
}

/// Stateless lockd nodes on one database, each reaching it through the harness's links.
///
/// ```no_run
/// # async fn example() {
/// use lock_tests::{StatelessBackend, StatelessNodes};
/// let nodes = StatelessNodes::start(StatelessBackend::from_env("pg"), 2).await;
/// let first = nodes.client(0);                      // node 1 of 2, raw answers
/// let any = nodes.cluster_client();                 // retries at the next node
/// nodes.cut_backend();                              // every node loses its database
/// nodes.heal_backend();
/// # let _ = (first, any);
/// # }
/// ```
#[derive(Debug)]
pub struct StatelessNodes {
    backend: StatelessBackend,
    binary: PathBuf,
    /// `None` only after `Drop` decided to keep the directory.
    dir: Option<TempDir>,
    dir_path: PathBuf,
    /// Node `i + 1` at index `i`.
    nodes: Vec<NodeProcess>,
    links: Vec<DbLink>,
    watchdog: Option<Watchdog>,
    /// The nodes' CA and certificates, when they serve TLS.
    pki: Option<TestPki>,
    /// How the harness's own clients connect: TLS as `admin`, or plaintext.
    dial: Dial,
}

impl StatelessNodes {
    /// Starts `n` nodes on `backend`, serving TLS, and waits for each one's ready line.
    ///
    /// # Panics
    /// If the binary is missing, the database address cannot be used, or a node does not start;
    /// the message carries every node's log tail.
    pub async fn start(backend: StatelessBackend, n: usize) -> Self {
        Self::start_with(backend, n, true).await
    }

    /// [`StatelessNodes::start`], serving TLS (as `lockd run` requires) or, with `tls: false`,
    /// plaintext (`--insecure`).
    ///
    /// # Panics
    /// As [`StatelessNodes::start`].
    pub async fn start_with(backend: StatelessBackend, n: usize, tls: bool) -> Self {
        match Self::try_start_with(backend, n, tls).await {
            Ok(nodes) => nodes,
            Err(e) => panic!("cannot start the stateless nodes: {e}"),
        }
    }

    /// [`StatelessNodes::start`], returning an error (with log tails) instead of panicking.
    pub async fn try_start(backend: StatelessBackend, n: usize) -> Result<Self, HarnessError> {
        Self::try_start_with(backend, n, true).await
    }

    /// [`StatelessNodes::start_with`], returning an error (with log tails) instead of
    /// panicking.
    pub async fn try_start_with(
        backend: StatelessBackend,
        n: usize,
        tls: bool,
    ) -> Result<Self, HarnessError> {
        if n == 0 {
            return Err(HarnessError::new("stateless nodes: n must be at least 1"));
        }
        let binary = lockd_binary()?;
        let mut links = Vec::new();
        for upstream in backend.upstreams()? {
            links.push(DbLink::start(upstream).await?);
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("lockd-{}-test-", backend.name()))
            .tempdir()
            .map_err(|e| HarnessError::new(format!("cannot create a temporary directory: {e}")))?;
        let watchdog = match Watchdog::spawn(dir.path()) {
            Ok(watchdog) => Some(watchdog),
            Err(e) => {
                eprintln!("lock-tests: {e}; nodes may outlive a killed test process");
                None
            }
        };
        let (pki, dial) = if tls {
            let ids = (1u64..).take(n);
            let pki = TestPki::for_cluster(&dir.path().join("pki"), ids)?;
            let dial = Dial::tls_as(&pki, HARNESS_IDENTITY);
            (Some(pki), dial)
        } else {
            (None, Dial::Plain)
        };
        let mut nodes = Self {
            backend,
            binary,
            dir_path: dir.path().to_owned(),
            dir: Some(dir),
            nodes: Vec::new(),
            links,
            watchdog,
            pki,
            dial,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = ports::free_ports(n)?;
            nodes.nodes = (1u64..)
                .zip(ports)
                .map(|(id, port)| NodeProcess::new(id, port, &nodes.dir_path))
                .collect();
            match nodes.spawn_all().await {
                Ok(()) => return Ok(nodes),
                Err((true, e)) if attempt < SPAWN_ATTEMPTS => {
                    eprintln!("lock-tests: {e}; retrying with other ports");
                    nodes.kill_all();
                }
                Err((_, e)) => {
                    return Err(HarnessError::new(format!("{e}\n{}", nodes.log_tails())));
                }
            }
        }
    }

    /// Spawns every node, then waits for every ready line. The error says whether a port
    /// conflict caused it (worth a retry with other ports).
    async fn spawn_all(&mut self) -> Result<(), (bool, HarnessError)> {
        let env: Vec<(String, String)> = match &self.pki {
            Some(_) => vec![roles_env(self.nodes.iter().map(|n| n.id), &[])],
            None => Vec::new(),
        };
        for i in 0..self.nodes.len() {
            let args = self.args(i).map_err(|e| (false, e))?;
            self.nodes[i]
                .spawn(&self.binary, &args, &env)
                .map_err(|e| (false, e))?;
        }
        self.sync_watchdog();
        for node in &mut self.nodes {
            match node.wait_ready(config::READY_TIMEOUT).await {
                Ok(()) => {}
                Err(NotReady::Exited {
                    status,
                    addr_in_use,
                }) => {
                    return Err((
                        addr_in_use,
                        HarnessError::new(format!(
                            "stateless node {} ({}) exited with {status} before its ready line",
                            node.id,
                            node.addr()
                        )),
                    ));
                }
                Err(NotReady::Timeout) => {
                    return Err((
                        false,
                        HarnessError::new(format!(
                            "stateless node {} ({}) printed no ready line within {:?}",
                            node.id,
                            node.addr(),
                            config::READY_TIMEOUT
                        )),
                    ));
                }
                Err(NotReady::Harness(e)) => return Err((false, e)),
            }
        }
        Ok(())
    }

    /// The `lockd run` arguments of the node at index `i`.
    fn args(&self, i: usize) -> Result<Vec<OsString>, HarnessError> {
        let node = &self.nodes[i];
        let mut args: Vec<OsString> = vec![
            "run".into(),
            "--node-id".into(),
            node.id.to_string().into(),
            "--listen".into(),
            node.addr().into(),
            // No --data-dir or --peers: a stateless node needs neither (docs/NODE_CLI.md).
        ];
        args.extend(self.backend.args(&self.links)?);
        match &self.pki {
            Some(pki) => args.extend(node_tls_args(pki, node.id, true)),
            None => args.push("--insecure".into()),
        }
        Ok(args)
    }

    fn sync_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            let pids: Vec<u32> = self.nodes.iter().filter_map(NodeProcess::pid).collect();
            if let Err(e) = watchdog.record(&pids) {
                eprintln!("lock-tests: {e}");
            }
        }
    }

    fn kill_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        self.sync_watchdog();
    }

    /// The backend the nodes serve from.
    pub fn backend(&self) -> &StatelessBackend {
        &self.backend
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes (never, after a successful start).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s (0-based) `host:port`.
    ///
    /// # Panics
    /// If there is no node `i`.
    pub fn addr(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    /// Every node's `host:port`, in order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProcess::addr).collect()
    }

    /// Node `i`'s (0-based) gRPC endpoint: `https://host:port` with TLS, else `http://…`.
    ///
    /// # Panics
    /// If there is no node `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.dial.endpoint(&self.nodes[i].addr())
    }

    /// Every node's endpoint, in order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.endpoint(i)).collect()
    }

    /// A client of node `i` (0-based) alone, as `admin` when the nodes serve TLS.
    ///
    /// # Panics
    /// If there is no node `i`.
    pub fn client(&self, i: usize) -> NodeClient {
        NodeClient::dial(&self.nodes[i].addr(), &self.dial)
    }

    /// A client over every node that retries `Contention` at the next one (every stateless node
    /// serves every call, so `NotLeader` never comes), as `admin` when the nodes serve TLS.
    pub fn cluster_client(&self) -> ClusterClient {
        ClusterClient::with_dial(self.nodes.iter().map(|n| (n.id, n.addr())), &self.dial)
    }

    /// A raw tonic channel to node `i`, as the harness's clients connect.
    ///
    /// # Panics
    /// If there is no node `i`.
    pub fn channel(&self, i: usize) -> Channel {
        self.dial.channel(&self.nodes[i].addr())
    }

    /// The nodes' CA and certificates.
    ///
    /// # Panics
    /// If the nodes were started without TLS.
    pub fn pki(&self) -> &TestPki {
        self.pki
            .as_ref()
            .unwrap_or_else(|| panic!("pki(): the stateless nodes were started with tls: false"))
    }

    /// A client of node `i` presenting `name`'s certificate.
    ///
    /// # Panics
    /// If there is no node `i`, the nodes run without TLS, or `name` has no certificate.
    pub fn client_as(&self, i: usize, name: &str) -> NodeClient {
        NodeClient::dial(&self.nodes[i].addr(), &Dial::tls_as(self.pki(), name))
    }

    /// A raw tonic channel to node `i` presenting `name`'s certificate.
    ///
    /// # Panics
    /// As [`StatelessNodes::client_as`].
    pub fn channel_as(&self, i: usize, name: &str) -> Channel {
        Dial::tls_as(self.pki(), name).channel(&self.nodes[i].addr())
    }

    /// A plaintext channel to node `i`, whatever the nodes serve.
    ///
    /// # Panics
    /// If there is no node `i`.
    pub fn channel_plain(&self, i: usize) -> Channel {
        Dial::Plain.channel(&self.nodes[i].addr())
    }

    /// The `(ca, cert, key)` files of `name`, for a `lock_client::TlsConfig`.
    ///
    /// # Panics
    /// As [`StatelessNodes::pki`], or if `name` has no certificate.
    pub fn sdk_tls(&self, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let pki = self.pki();
        let (cert, key) = pki.identity(name);
        (pki.ca(), cert, key)
    }

    /// Cuts every node off its database: open connections are closed, new ones closed at
    /// once, until [`StatelessNodes::heal_backend`].
    pub fn cut_backend(&self) {
        for link in &self.links {
            link.cut();
        }
    }

    /// Lets the nodes reach their database again.
    pub fn heal_backend(&self) {
        for link in &self.links {
            link.heal();
        }
    }

    /// Nodes that exited without the harness killing them, with their exit status (by node
    /// id, 1-based).
    pub fn crashed_nodes(&mut self) -> Vec<(u64, ExitStatus)> {
        for node in &mut self.nodes {
            node.is_running();
        }
        self.nodes
            .iter()
            .filter_map(|n| n.crashed().map(|status| (n.id, status)))
            .collect()
    }

    /// The last lines of every node's stdout and stderr.
    pub fn log_tails(&self) -> String {
        let mut out = format!(
            "==== logs of the {} nodes in {} ====\n",
            self.backend.name(),
            self.dir_path.display()
        );
        for node in &self.nodes {
            out.push_str(&node.log_tail(TAIL_LINES));
        }
        out
    }
}

impl Drop for StatelessNodes {
    fn drop(&mut self) {
        let crashed = self.crashed_nodes();
        let panicking = std::thread::panicking();
        if panicking || !crashed.is_empty() {
            eprintln!("{}", self.log_tails());
        }
        self.kill_all();
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.stop();
        }
        if std::env::var_os(crate::KEEP_DIR_ENV).is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("lock-tests: kept node directory {}", dir.keep().display());
        }
        if !panicking && !crashed.is_empty() {
            panic!("stateless node(s) exited on their own during the test: {crashed:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pg_url_splits_around_its_address() {
        let (head, addr, tail) =
            pg_url_parts("postgres://postgres@127.0.0.1:5432/postgres").expect("a valid URL");
        assert_eq!(head, "postgres://postgres@");
        assert_eq!(addr, "127.0.0.1:5432");
        assert_eq!(tail, "/postgres");
        assert!(pg_url_parts("postgres://127.0.0.1:5432/db").is_err());
    }
}
