//! Assembles one node and serves it until shutdown. A Raft node: identity check, storage, the
//! Raft node, the proposer, the lease tasks and the [`RaftBackend`]; a stateless node
//! (`--backend pg|etcd`): the store and the [`StatelessBackend`](crate::backend::stateless)
//! with its reaper. Either way the one serve loop of `grpc::serve` (a Raft node adds its
//! `RaftService` to it).
//!
//! Owns start-up order and shutdown order, nothing else: each piece's rules live in its own
//! module. The listener is passed in (bound by the caller, or bound here from the config), so
//! tests can serve on port 0.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_proto::v1::raft_service_server::RaftServiceServer;
use lock_raft_store::Raft;
use lock_raft_store::storage::{self, ApplyObserver, StorageObserver};
use lock_tls::client::ClientTls;
use lock_tls::server::ServerTls;
use openraft::BasicNode;
use tokio::net::TcpListener;

use crate::backend::raft::{RaftBackend, RaftBackendParts};
#[cfg(any(feature = "pg", feature = "etcd"))]
use crate::backend::stateless::StatelessBackend;
use crate::clock::{Clock, SystemClock};
use crate::grpc;
use crate::grpc::serve::Serve;
use crate::leader::leases::{LeaseKeeper, Observer, run_promoter, run_reaper};
use crate::leader::proposer::{BATCH_COMMANDS_MAX, ENTRIES_IN_FLIGHT_MAX, Proposer, RaftWriter};
use crate::log_limit::{LogLimit, Note};
use crate::metrics::Metrics;
use crate::metrics::apply::CountingObserver;
use crate::metrics::probe::NodeProbe;
use crate::metrics::proposer::MeteredWriter;
use crate::metrics::raft::{RaftProbe, count_leader_changes};
use crate::metrics::storage::{StorageDir, StorageTimings};
use crate::process::config::Config;
use crate::process::identity::{self, Identity, STORAGE_SUBDIR};
use crate::raft::network::{NetworkFactory, RAFT_MESSAGE_BYTES_MAX};
use crate::raft::service::RaftRpc;

/// How long the bootstrap node keeps retrying cluster initialisation.
const INIT_RETRY: Duration = Duration::from_millis(200);

/// Runs a node on `config` until `shutdown` resolves, then stops serving and stops Raft.
/// Binds `config.listen` unless `listener` is given. Prints `lockd ready node_id=N listen=ADDR`
/// to stdout once serving (the CLI contract).
pub async fn run(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve(config, listener, shutdown, None).await
}

/// Like [`run`], and also hands the node's [`RaftBackend`] to `store_tx` as soon as it is
/// built, so a test can drive the `LockStore` SPI of a real in-process node (the conformance
/// suite in `tests/`). The node still serves gRPC as usual.
pub async fn run_with_store(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store_tx: tokio::sync::oneshot::Sender<RaftBackend>,
) -> anyhow::Result<()> {
    serve(config, listener, shutdown, Some(store_tx)).await
}

/// This node's TLS, from `config.tls`: the server side of its port and the client side it dials
/// peers with, both following the files on disk. `None` with `--insecure`, after its warning.
fn node_tls(config: &Config) -> anyhow::Result<Option<(Arc<ServerTls>, Arc<ClientTls>)>> {
    let Some(tls) = &config.tls else {
        tracing::warn!(
            "--insecure: serving plaintext; nobody is authenticated and every call is allowed (docs/SECURITY.md)"
        );
        return Ok(None);
    };
    let server = ServerTls::load(tls.files.clone(), tls.client_certs())
        .context("cannot set up TLS (fields `tls_ca`, `tls_cert`, `tls_key`)")?;
    let client = ClientTls::reloading(tls.files.clone())
        .context("cannot set up TLS to peers (fields `tls_ca`, `tls_cert`, `tls_key`)")?;
    tracing::info!(
        files = %tls.files.describe(),
        require_client_cert = tls.require_client_cert,
        "TLS on the node's port and to its peers; the files are re-read when they change"
    );
    Ok(Some((Arc::new(server), Arc::new(client))))
}

async fn serve(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store_tx: Option<tokio::sync::oneshot::Sender<RaftBackend>>,
) -> anyhow::Result<()> {
    let tls = node_tls(&config)?;
    if config.backend.is_stateless() {
        // The lock table lives in PostgreSQL or etcd: no identity, storage or Raft here.
        #[cfg(any(feature = "pg", feature = "etcd"))]
        return serve_stateless(config, listener, tls.map(|(server, _)| server), shutdown).await;
        #[cfg(not(any(feature = "pg", feature = "etcd")))]
        anyhow::bail!(
            "backend {:?} needs lockd built with cargo feature `pg` or `etcd` (field `backend`)",
            config.backend
        );
    }
    let identity = Identity {
        cluster_name: config.cluster_name.clone(),
        node_id: config.node_id,
    };
    let fresh = identity::ensure(&config.data_dir, &identity)?;
    tracing::info!(
        node_id = config.node_id,
        data_dir = %config.data_dir.display(),
        fresh,
        "starting"
    );

    let clock: Arc<dyn Clock> = Arc::new(SystemClock::with_offset(config.test_clock_offset_ms));
    let keeper = Arc::new(LeaseKeeper::new(
        clock.clone(),
        Duration::from_millis(config.safety_margin_ms),
    ));
    let waiters = Arc::new(crate::leader::waiters::WaiterRegistry::default());
    let metrics = Metrics::new(true);
    // The applied-state counters see every applied batch first, then the lease keeper and
    // the waiters do (docs/METRICS.md).
    let observer: Arc<dyn ApplyObserver> = Arc::new(CountingObserver::new(
        metrics.families().clone(),
        Arc::new(Observer {
            keeper: keeper.clone(),
            waiters: waiters.clone(),
        }),
    ));
    let timings: Arc<dyn StorageObserver> =
        Arc::new(StorageTimings::new(metrics.families().clone()));
    let storage_dir = config.data_dir.join(STORAGE_SUBDIR);
    let (log_store, mut state_machine) = tokio::task::spawn_blocking({
        let dir = storage_dir.clone();
        let engine = config.log_engine.into();
        let background_from = config.test_snapshot_background_from;
        move || storage::open_observed(&dir, engine, Some(observer), Some(timings), background_from)
    })
    .await
    .context("storage open task failed")?
    .with_context(|| format!("cannot open storage in {}", storage_dir.display()))?;
    // openraft asks for a snapshot every `snapshot_logs_since_last` entries; the store builds
    // one only once the log since the last is large against it, staggered by this node's id.
    state_machine.set_snapshot_policy(storage::SnapshotPolicy::for_node(config.node_id));
    let reader = state_machine.reader();
    let inbox = state_machine.inbox();
    let stop_snapshot = state_machine.stop_snapshot();
    tracing::info!(engine = %log_store.engine_kind(), dir = %log_store.dir().display(), "raft log opened");

    let raft_config = Arc::new(config.raft_config()?);
    for (peer, addr) in &config.raft_dial {
        tracing::info!(
            peer,
            dial = %addr,
            membership = config.peers.get(peer).map_or("-", String::as_str),
            "raft dial override active: Raft RPCs to this peer connect to the dial address"
        );
    }
    let network = NetworkFactory::new(config.node_id)
        .with_dial_overrides(config.raft_dial.clone())
        .with_tls(tls.as_ref().map(|(_, client)| client.clone()));
    let raft = Raft::new(
        config.node_id,
        raft_config,
        network.clone(),
        log_store,
        state_machine,
    )
    .await
    .context("cannot start the Raft node")?;

    let proposer = Proposer::spawn(
        MeteredWriter::new(RaftWriter::new(raft.clone()), metrics.families().clone()),
        clock.clone(),
        ENTRIES_IN_FLIGHT_MAX,
        BATCH_COMMANDS_MAX,
    );
    tokio::spawn(run_promoter(
        raft.clone(),
        proposer.clone(),
        keeper.clone(),
        reader.clone(),
    ));
    tokio::spawn(run_reaper(raft.clone(), proposer.clone(), keeper.clone()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let reader_for_metrics = reader.clone();
    let stop_rx_for_metrics = stop_rx.clone();
    let backend = RaftBackend::new(RaftBackendParts {
        node_id: config.node_id,
        raft: raft.clone(),
        proposer,
        keeper,
        waiters,
        reader,
        clock,
        stop: stop_rx.clone(),
    });
    if let Some(tx) = store_tx {
        // A dropped receiver only means the caller stopped caring about the store.
        let _ = tx.send(backend.clone());
    }

    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (field `listen`)", config.listen))?,
    };

    if config.bootstrap {
        tokio::spawn(bootstrap(raft.clone(), config.peers.clone()));
    }
    tokio::spawn(count_leader_changes(
        raft.clone(),
        metrics.families().clone(),
    ));
    let metrics_endpoint = start_metrics(
        &config,
        metrics.clone(),
        NodeProbe::Raft {
            raft: RaftProbe::new(
                raft.clone(),
                config.node_id,
                Duration::from_millis(config.election_timeout_max_ms),
            ),
            reader: reader_for_metrics,
            storage: StorageDir::new(storage_dir.clone()),
        },
        stop_rx_for_metrics,
    )
    .await?;

    let raft_service =
        RaftServiceServer::new(RaftRpc::new(raft.clone(), inbox, stop_rx, network.hints()))
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
    // The listener is bound and the serve loop starts below: a peer that tries this node on
    // hearing from it is answered.
    tokio::spawn(say_hello(raft.clone(), network));
    if config.peers_lack_the_node_role() {
        tracing::warn!(
            "TLS is on and no principal has the node role: this node refuses every peer's Raft \
             call, so no leader can be elected; map each member's certificate principal with \
             --role PRINCIPAL=node (docs/SECURITY.md section 2)"
        );
    }
    let served = grpc::serve::serve(
        Serve {
            backend,
            node_id: config.node_id,
            cluster_name: config.cluster_name.clone(),
            listener,
            tls: tls.map(|(server, _)| server),
            stop: stop_tx,
            metrics,
            access: access(&config)?,
        },
        |router| router.add_service(raft_service),
        shutdown,
    )
    .await;
    if let Some(endpoint) = metrics_endpoint {
        endpoint.abort();
    }
    crate::stop::stop_raft(&raft, config.node_id, &stop_snapshot).await;
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// Tells each peer of the membership this node starts with that it is listening, so a leader
/// backing off from it while it was down reaches it now (`raft::network::hello`); a node with
/// no membership yet (before `bootstrap` or `init`) has nobody to tell. The membership is read
/// from the Raft core itself, which answers only once it has loaded the node's state (its
/// metrics may not have been published yet).
async fn say_hello(raft: Raft, network: NetworkFactory) {
    let peers: Vec<_> = match raft
        .with_raft_state(|state| {
            state
                .membership_state
                .effective()
                .membership()
                .nodes()
                .map(|(id, node)| (*id, node.clone()))
                .collect()
        })
        .await
    {
        Ok(peers) => peers,
        Err(fatal) => {
            tracing::debug!(%fatal, "raft stopped before this node said hello to its peers");
            return;
        }
    };
    network.say_hello(peers).await;
}

/// Who may call what on this node: the role map and the tokens file of `config`, enforced on
/// a TLS node; everything open on an `--insecure` one (`config.tls` is `None` exactly then).
fn access(config: &Config) -> anyhow::Result<crate::auth::Access> {
    let insecure = config.tls.is_none();
    if insecure && (!config.roles.is_empty() || config.tokens_file.is_some()) {
        tracing::warn!(
            "--insecure: the role map and the tokens file have no effect; every call is allowed"
        );
    }
    crate::auth::Access::for_node(insecure, &config.roles, config.tokens_file.as_deref())
        .map_err(|reason| anyhow::anyhow!("config field `tokens_file`: {reason}"))
}

/// Where in etcd the lock table lives; every node of one deployment uses the same prefix.
#[cfg(feature = "etcd")]
pub const ETCD_PREFIX: &str = "lockd/";

/// Runs a stateless node on `config.backend` (the lock table in PostgreSQL or etcd): the same
/// serve loop and services as a Raft node, over [`StatelessBackend`], with its reaper.
#[cfg(any(feature = "pg", feature = "etcd"))]
async fn serve_stateless(
    config: Config,
    listener: Option<TcpListener>,
    tls: Option<Arc<ServerTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    for field in config.ignored_settings() {
        tracing::warn!(
            field,
            backend = ?config.backend,
            "this setting is not used by a stateless node and is ignored"
        );
    }
    match config.backend {
        #[cfg(feature = "pg")]
        crate::process::config::Backend::Pg => {
            let url = config
                .pg_url
                .clone()
                .context("field `pg_url` is required")?;
            let store = crate::store::pg::PgLockStore::connect(&url)
                .await
                .context("cannot open the PostgreSQL backend")?;
            serve_store(store, config, listener, tls, shutdown).await
        }
        #[cfg(feature = "etcd")]
        crate::process::config::Backend::Etcd => {
            let store =
                crate::store::etcd::EtcdLockStore::connect(&config.etcd_endpoints, ETCD_PREFIX)
                    .await
                    .context("cannot open the etcd backend")?;
            serve_store(store, config, listener, tls, shutdown).await
        }
        other => anyhow::bail!(
            "backend {other:?} is not served by a stateless node in this build (cargo features `pg`, `etcd`)"
        ),
    }
}

#[cfg(any(feature = "pg", feature = "etcd"))]
async fn serve_store<S: lock_api::RequestStore + 'static>(
    store: S,
    config: Config,
    listener: Option<TcpListener>,
    tls: Option<Arc<ServerTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (field `listen`)", config.listen))?,
    };
    let local = listener.local_addr().context("listener has no address")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::with_offset(0));
    let backend = StatelessBackend::new(store, config.node_id, local.to_string(), clock, stop_rx);
    let reaper = tokio::spawn(backend.clone().run_reaper());
    let metrics = Metrics::new(false);
    let metrics_endpoint = start_metrics(
        &config,
        metrics.clone(),
        NodeProbe::Stateless {
            serving: crate::backend::Backend::serving(&backend),
        },
        crate::backend::Backend::stop_signal(&backend),
    )
    .await?;
    tracing::info!(node_id = config.node_id, backend = ?config.backend, "starting a stateless node");
    let served = grpc::serve::serve(
        Serve {
            backend,
            node_id: config.node_id,
            cluster_name: config.cluster_name.clone(),
            listener,
            tls,
            stop: stop_tx,
            metrics,
            access: access(&config)?,
        },
        |router| router,
        shutdown,
    )
    .await;
    if let Some(endpoint) = metrics_endpoint {
        endpoint.abort();
    }
    // The stop signal ended the reaper's loop; a reap still in flight is not waited for.
    reaper.abort();
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// Binds `config.metrics_listen`, if set, and serves the metrics endpoint there until `stop`
/// turns true. A port that cannot be bound fails the start, naming the field: an operator who
/// asked for metrics must not get a node that silently has none.
async fn start_metrics(
    config: &Config,
    metrics: Arc<Metrics>,
    probe: NodeProbe,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (field `metrics_listen`)"))?;
    let local = listener
        .local_addr()
        .context("metrics listener has no address")?;
    tracing::info!(%local, "serving metrics at http://{local}/metrics");
    let shutdown = async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    };
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = crate::metrics::http::serve(listener, metrics, probe, shutdown).await {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    })))
}

/// Initialises the cluster with every peer as a voter, once: only if this node's Raft state is
/// not initialised (fresh data). A node restarted on existing data has its membership in its
/// log and never re-initialises.
async fn bootstrap(raft: Raft, peers: BTreeMap<u64, String>) {
    let members: BTreeMap<u64, BasicNode> = peers
        .into_iter()
        .map(|(id, addr)| (id, BasicNode { addr }))
        .collect();
    // One line when bootstrapping starts failing, then one a minute, however often it retries.
    let mut failing = LogLimit::default();
    loop {
        match raft.is_initialized().await {
            Ok(true) => {
                tracing::info!("cluster already initialised; not bootstrapping again");
                return;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "raft stopped before bootstrap");
                return;
            }
        }
        match raft.initialize(members.clone()).await {
            Ok(()) => {
                tracing::info!(voters = ?members.keys().collect::<Vec<_>>(), "cluster initialised");
                return;
            }
            Err(openraft::error::RaftError::APIError(
                openraft::error::InitializeError::NotAllowed(e),
            )) => {
                tracing::info!(%e, "cluster already initialised");
                return;
            }
            Err(e) => {
                match failing.failed(tokio::time::Instant::now().into_std(), &e) {
                    None => {}
                    Some(Note::Began) => tracing::warn!(error = %e, "bootstrap failed; retrying"),
                    Some(Note::Summary(s)) => tracing::warn!(
                        failing_s = s.lasted.as_secs(),
                        failed_attempts = s.count,
                        last_error = %s.last_error,
                        "bootstrap still failing; retrying"
                    ),
                }
                tokio::time::sleep(INIT_RETRY).await;
            }
        }
    }
}
