//! Assembles one node: identity check, storage, the Raft node, the proposer, the lease tasks,
//! the store and every gRPC service on one listener, then serves until shutdown.
//!
//! Owns start-up order and shutdown order, nothing else: each piece's rules live in its own
//! module. The listener is passed in (bound by the caller, or bound here from the config), so
//! tests can serve on port 0.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_proto::v1::admin_service_server::AdminServiceServer;
use lock_proto::v1::lock_service_server::LockServiceServer;
use lock_proto::v1::raft_service_server::RaftServiceServer;
use lock_proto::v1::session_service_server::SessionServiceServer;
use lock_raft_store::Raft;
use lock_raft_store::storage::{self, ApplyObserver};
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use tokio::net::TcpListener;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::grpc::CLIENT_MESSAGE_BYTES_MAX;
use crate::grpc::admin::AdminApi;
use crate::grpc::lock::LockApi;
use crate::grpc::session::SessionApi;
use crate::identity::{self, Identity, STORAGE_SUBDIR};
use crate::leases::{LeaseKeeper, Observer, run_promoter, run_reaper};
use crate::log_limit::{LogLimit, Note};
use crate::proposer::{BATCH_COMMANDS_MAX, ENTRIES_IN_FLIGHT_MAX, Proposer, RaftWriter};
use crate::raft::network::{NetworkFactory, RAFT_MESSAGE_BYTES_MAX};
use crate::raft::service::RaftRpc;
use crate::store::raft::{RaftLockStore, RaftLockStoreParts};

/// How long a shutdown waits for Raft to stop before giving up on it.
const RAFT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a graceful stop waits for in-flight calls before closing them.
const SERVE_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the bootstrap node keeps retrying cluster initialisation.
const INIT_RETRY: Duration = Duration::from_millis(200);

/// The connections `listener` accepts, with Nagle's algorithm off.
///
/// `Server::tcp_nodelay` applies only to listeners tonic binds itself, not to the streams handed
/// to `serve_with_incoming`. With Nagle on, a follower answering pipelined appends held each
/// answer while an earlier one was unacknowledged, and the leader's delayed ACK made that about
/// 40 ms: lock-bench saw one commit in twenty stall that long (W3 p99 44 ms against 3.6 ms)
/// and W2 fall by half, until this.
pub(crate) fn accepted_without_nagle(
    listener: TcpListener,
) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

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

/// Like [`run`], and also hands the node's [`RaftLockStore`] to `store_tx` as soon as it is
/// built, so a test can drive the `LockStore` SPI of a real in-process node (the conformance
/// suite in `tests/`). The node still serves gRPC as usual.
pub async fn run_with_store(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store_tx: tokio::sync::oneshot::Sender<RaftLockStore>,
) -> anyhow::Result<()> {
    serve(config, listener, shutdown, Some(store_tx)).await
}

async fn serve(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store_tx: Option<tokio::sync::oneshot::Sender<RaftLockStore>>,
) -> anyhow::Result<()> {
    if config.backend != crate::config::Backend::Raft {
        // The lock table lives in PostgreSQL or etcd: no identity, storage or Raft here.
        #[cfg(any(feature = "pg", feature = "etcd"))]
        return crate::stateless::run(config, listener, shutdown).await;
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
    let waiters = Arc::new(crate::waiters::WaiterRegistry::default());
    let observer: Arc<dyn ApplyObserver> = Arc::new(Observer {
        keeper: keeper.clone(),
        waiters: waiters.clone(),
    });
    let storage_dir = config.data_dir.join(STORAGE_SUBDIR);
    let (log_store, state_machine) = tokio::task::spawn_blocking({
        let dir = storage_dir.clone();
        let engine = config.log_engine.into();
        move || storage::open_with(&dir, engine, Some(observer))
    })
    .await
    .context("storage open task failed")?
    .with_context(|| format!("cannot open storage in {}", storage_dir.display()))?;
    let reader = state_machine.reader();
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
    let raft = Raft::new(
        config.node_id,
        raft_config,
        NetworkFactory::new(config.node_id).with_dial_overrides(config.raft_dial.clone()),
        log_store,
        state_machine,
    )
    .await
    .context("cannot start the Raft node")?;

    let proposer = Proposer::spawn(
        RaftWriter::new(raft.clone()),
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
    let store = RaftLockStore::new(RaftLockStoreParts {
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
        let _ = tx.send(store.clone());
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(raft.clone(), health));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lock_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build the reflection service")?;

    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (field `listen`)", config.listen))?,
    };
    let local: SocketAddr = listener.local_addr().context("listener has no address")?;

    if config.bootstrap {
        tokio::spawn(bootstrap(raft.clone(), config.peers.clone()));
    }

    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(
            LockServiceServer::new(LockApi::new(store.clone()))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            SessionServiceServer::new(SessionApi::new(store.clone()))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            AdminServiceServer::new(AdminApi::new(store.clone(), config.cluster_name.clone()))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            RaftServiceServer::new(RaftRpc::new(raft.clone(), store.stop_signal()))
                .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX),
        );

    println!("lockd ready node_id={} listen={local}", config.node_id);
    tracing::info!(node_id = config.node_id, %local, "serving");
    let signal = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let mut serve =
        tokio::spawn(router.serve_with_incoming_shutdown(accepted_without_nagle(listener), signal));
    let mut stopping = stop_rx;
    let served = tokio::select! {
        served = &mut serve => served,
        _ = stopping.wait_for(|stop| *stop) => {
            // Graceful: in-flight calls finish (waiting acquires give up at once, proposals are
            // bounded), but a drain never holds the process longer than SERVE_DRAIN_TIMEOUT.
            match tokio::time::timeout(SERVE_DRAIN_TIMEOUT, &mut serve).await {
                Ok(served) => served,
                Err(_) => {
                    tracing::warn!("calls still in flight after {SERVE_DRAIN_TIMEOUT:?}; closing them");
                    serve.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    tracing::info!("stopped serving; stopping raft");
    match tokio::time::timeout(RAFT_SHUTDOWN_TIMEOUT, raft.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown failed"),
        Err(_) => tracing::warn!("raft did not stop within {RAFT_SHUTDOWN_TIMEOUT:?}"),
    }
    served
        .context("the gRPC server task failed")?
        .context("the gRPC server failed")?;
    tracing::info!("stopped");
    Ok(())
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

/// Serving (health) once the node knows a leader; not serving while it knows none.
async fn report_health(raft: Raft, health: tonic_health::server::HealthReporter) {
    use tonic_health::ServingStatus;
    // The server metrics change only with the vote, the state, the leader or the membership,
    // not with every entry as the full metrics do.
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        let (has_leader, shutting_down) = {
            let m = metrics.borrow_and_update();
            (
                m.current_leader.is_some(),
                m.state == openraft::ServerState::Shutdown,
            )
        };
        let status = if has_leader && !shutting_down {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            for name in [
                "",
                "lockd.v1.LockService",
                "lockd.v1.SessionService",
                "lockd.v1.AdminService",
            ] {
                health.set_service_status(name, status).await;
            }
            last = Some(status);
        }
        if shutting_down || metrics.changed().await.is_err() {
            return;
        }
    }
}
