//! A stateless node (`lockd run --backend pg|etcd`): the lock table lives in PostgreSQL or etcd,
//! so the node holds no state, needs no Raft and no data dir, and any node serves any call.
//!
//! Owns the `lockd.v1` LockService, SessionService and AdminService over any
//! `LockStore + SessionRegistry`, a periodic `reap_expired` (safe on every node at once, C2
//! §2.5) and the serve loop. Decides no lock outcome itself: the backend does. Differences from
//! the Raft node, by construction: a waiting acquire polls `try_insert` every
//! [`ACQUIRE_POLL_INTERVAL`] (there is no replicated waiter queue, so `waiter_count` is 0);
//! request ids are not remembered (the backend has no idempotency table), so a retried acquire
//! whose first attempt was granted answers "held"; AdminService reports this node as the
//! leader and refuses membership changes.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use lock_api::{LockError, LockHandle, LockStore, SessionRegistry, validate};
use lock_proto::status_from_lock_error;
use lock_proto::v1;
use lock_proto::v1::admin_service_server::{AdminService, AdminServiceServer};
use lock_proto::v1::lock_service_server::{LockService, LockServiceServer};
use lock_proto::v1::session_service_server::{SessionService, SessionServiceServer};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::config::{Backend, Config};
use crate::grpc::CLIENT_MESSAGE_BYTES_MAX;
use crate::log_limit::{LogLimit, Note};
use crate::server::accepted_without_nagle;

/// How often a waiting acquire retries `try_insert` while the key is held.
pub const ACQUIRE_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How often each node runs `reap_expired` (expiry is already true before it runs: this only
/// frees storage and keeps `locks_of` scans short).
pub const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// Where in etcd the lock table lives; every node of one deployment uses the same prefix.
pub const ETCD_PREFIX: &str = "lockd/";

/// How long a graceful stop waits for in-flight calls.
const SERVE_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

fn status(err: LockError) -> Status {
    status_from_lock_error(&err)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn grant(h: LockHandle) -> v1::Grant {
    v1::Grant {
        key: h.key,
        owner_id: h.owner_id,
        session_id: h.session_id,
        fencing_token: h.fencing_token,
        ttl_ms: u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
        server_expiry_unix_ms: unix_ms(h.server_expiry),
    }
}

/// The client services of a stateless node over `store`.
#[derive(Clone, Debug)]
pub struct SpiApi<S> {
    store: S,
    node_id: u64,
    listen: String,
    cluster_name: String,
    /// Turns `true` when the node starts shutting down.
    stop: tokio::sync::watch::Receiver<bool>,
}

impl<S: LockStore + SessionRegistry> SpiApi<S> {
    /// `try_insert` on behalf of a session; the backends take the owner from the session, so
    /// the session id stands in for the (uncompared) owner argument.
    async fn try_once(
        &self,
        session_id: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.store
            .try_insert(key, session_id, session_id, ttl)
            .await
    }
}

#[tonic::async_trait]
impl<S> LockService for SpiApi<S>
where
    S: LockStore + SessionRegistry + Clone + std::fmt::Debug + 'static,
{
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let r = request.into_inner();
        let ttl = Duration::from_millis(r.ttl_ms);
        let max_wait = Duration::from_millis(
            validate::max_wait(Duration::from_millis(r.max_wait_ms)).map_err(status)?,
        );
        let deadline = Instant::now() + max_wait;
        loop {
            if let Some(h) = self
                .try_once(&r.session_id, &r.key, ttl)
                .await
                .map_err(status)?
            {
                return Ok(Response::new(v1::AcquireResponse {
                    grant: Some(grant(h)),
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Response::new(v1::AcquireResponse { grant: None }));
            }
            tokio::time::sleep(ACQUIRE_POLL_INTERVAL.min(deadline - now)).await;
        }
    }

    async fn try_acquire(
        &self,
        request: Request<v1::TryAcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let r = request.into_inner();
        let h = self
            .try_once(&r.session_id, &r.key, Duration::from_millis(r.ttl_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(v1::AcquireResponse {
            grant: h.map(grant),
        }))
    }

    /// A waiting acquire lives only in its own call here, so there is never a recorded wait
    /// or grant to cancel by request id.
    async fn cancel_acquire(
        &self,
        request: Request<v1::CancelAcquireRequest>,
    ) -> Result<Response<v1::CancelAcquireResponse>, Status> {
        let r = request.into_inner();
        validate::key(&r.key).map_err(status)?;
        validate::session_id(&r.session_id).map_err(status)?;
        Ok(Response::new(v1::CancelAcquireResponse {
            released_grant: false,
        }))
    }

    async fn renew(
        &self,
        request: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let r = request.into_inner();
        let h = self
            .store
            .extend(&r.key, r.fencing_token, Duration::from_millis(r.ttl_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(v1::RenewResponse {
            grant: h.map(grant),
        }))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let r = request.into_inner();
        let released = self
            .store
            .delete_if_owner(&r.key, r.fencing_token)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::ReleaseResponse { released }))
    }

    async fn inspect(
        &self,
        request: Request<v1::InspectRequest>,
    ) -> Result<Response<v1::InspectResponse>, Status> {
        let r = request.into_inner();
        let info = self.store.read(&r.key).await.map_err(status)?;
        Ok(Response::new(v1::InspectResponse {
            info: info.map(|i| v1::LockInfo {
                key: i.key,
                owner_id: i.owner_id,
                session_id: String::new(),
                fencing_token: i.fencing_token,
                acquired_at_unix_ms: unix_ms(i.acquired_at),
                expires_at_unix_ms: unix_ms(i.expires_at),
                waiter_count: i.waiter_count,
            }),
        }))
    }

    async fn force_revoke(
        &self,
        request: Request<v1::ForceRevokeRequest>,
    ) -> Result<Response<v1::ForceRevokeResponse>, Status> {
        let r = request.into_inner();
        let o = self
            .store
            .revoke(&r.key, &r.operator, &r.reason)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::ForceRevokeResponse {
            outcome: Some(v1::LockOutcome {
                key: o.key,
                revoked: o.revoked,
                previous_owner_id: o.previous_owner_id.unwrap_or_default(),
                previous_token: o.previous_token.unwrap_or(0),
                new_token_floor: o.new_token_floor,
            }),
        }))
    }

    type PipelineStream = crate::grpc::pipeline::PipelineAnswers;

    /// The pipeline runs each call through the unary methods above, exactly as on a Raft node.
    async fn pipeline(
        &self,
        request: Request<tonic::Streaming<v1::PipelineRequest>>,
    ) -> Result<Response<Self::PipelineStream>, Status> {
        Ok(Response::new(crate::grpc::pipeline::serve_pipeline(
            self.clone(),
            request.into_inner(),
            self.stop.clone(),
        )))
    }
}

#[tonic::async_trait]
impl<S> SessionService for SpiApi<S>
where
    S: LockStore + SessionRegistry + Clone + std::fmt::Debug + 'static,
{
    async fn open_session(
        &self,
        request: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::OpenSessionResponse>, Status> {
        let r = request.into_inner();
        let session_id = self
            .store
            .open_session(&r.owner_id, Duration::from_millis(r.ttl_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(v1::OpenSessionResponse {
            session_id,
            ttl_ms: r.ttl_ms,
        }))
    }

    /// The session keeps the TTL it was opened with; the answer leaves `ttl_ms` out (0).
    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let r = request.into_inner();
        let alive = self
            .store
            .heartbeat(&r.session_id, lock_api::limits::TTL_MIN)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::HeartbeatResponse { alive, ttl_ms: 0 }))
    }

    /// Each session is heartbeated on the backend as `heartbeat` would, concurrently (a batch is
    /// bounded by `HEARTBEAT_BATCH_SESSIONS_MAX`); a session's failure is its own result.
    async fn heartbeat_batch(
        &self,
        request: Request<v1::HeartbeatBatchRequest>,
    ) -> Result<Response<v1::HeartbeatBatchResponse>, Status> {
        let r = request.into_inner();
        lock_proto::session::check_heartbeat_batch_len(r.session_ids.len()).map_err(status)?;
        let beats = r
            .session_ids
            .iter()
            .map(|id| self.store.heartbeat(id, lock_api::limits::TTL_MIN));
        let results = futures::future::join_all(beats)
            .await
            .into_iter()
            .map(|answer| v1::HeartbeatBatchResult {
                outcome: Some(match answer {
                    Ok(alive) => {
                        v1::heartbeat_batch_result::Outcome::Heartbeat(v1::HeartbeatResponse {
                            alive,
                            ttl_ms: 0,
                        })
                    }
                    Err(err) => v1::heartbeat_batch_result::Outcome::Error(
                        lock_proto::error::error_detail_from_lock_error(&err),
                    ),
                }),
            })
            .collect();
        Ok(Response::new(v1::HeartbeatBatchResponse { results }))
    }

    async fn close_session(
        &self,
        request: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        let r = request.into_inner();
        let released = self
            .store
            .close_session(&r.session_id)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::CloseSessionResponse {
            locks_released: u32::try_from(released).unwrap_or(u32::MAX),
        }))
    }

    async fn locks_of(
        &self,
        request: Request<v1::LocksOfRequest>,
    ) -> Result<Response<v1::LocksOfResponse>, Status> {
        let r = request.into_inner();
        let keys = self.store.locks_of(&r.session_id).await.map_err(status)?;
        Ok(Response::new(v1::LocksOfResponse {
            keys: keys.into_iter().collect(),
        }))
    }
}

#[tonic::async_trait]
impl<S> AdminService for SpiApi<S>
where
    S: LockStore + SessionRegistry + Clone + std::fmt::Debug + 'static,
{
    /// Every stateless node serves every call, so each reports itself as the leader.
    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Ok(Response::new(v1::StatusResponse {
            node_id: self.node_id,
            role: v1::Role::Leader as i32,
            current_term: 0,
            leader_id: Some(self.node_id),
            leader_addr: self.listen.clone(),
            commit_index: 0,
            applied_index: 0,
            last_log_index: 0,
            members: vec![v1::Member {
                node_id: self.node_id,
                addr: self.listen.clone(),
                voter: true,
            }],
            cluster_id: self.cluster_name.clone(),
        }))
    }

    async fn init(
        &self,
        _request: Request<v1::InitRequest>,
    ) -> Result<Response<v1::InitResponse>, Status> {
        Err(no_membership(self.store.backend_id()))
    }

    async fn add_learner(
        &self,
        _request: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::AddLearnerResponse>, Status> {
        Err(no_membership(self.store.backend_id()))
    }

    async fn change_membership(
        &self,
        _request: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::ChangeMembershipResponse>, Status> {
        Err(no_membership(self.store.backend_id()))
    }
}

fn no_membership(backend: &str) -> Status {
    status(LockError::invalid(format!(
        "membership: a node on the {backend} backend has no Raft membership to change"
    )))
}

/// Runs a stateless node on `config.backend` until `shutdown` resolves. Prints the same
/// `lockd ready` line as a Raft node.
pub async fn run(
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    match config.backend {
        #[cfg(feature = "pg")]
        Backend::Pg => {
            let url = config
                .pg_url
                .clone()
                .context("field `pg_url` is required")?;
            let store = crate::store::pg::PgLockStore::connect(&url)
                .await
                .context("cannot open the PostgreSQL backend")?;
            serve(store, config, listener, shutdown).await
        }
        #[cfg(feature = "etcd")]
        Backend::Etcd => {
            let store =
                crate::store::etcd::EtcdLockStore::connect(&config.etcd_endpoints, ETCD_PREFIX)
                    .await
                    .context("cannot open the etcd backend")?;
            serve(store, config, listener, shutdown).await
        }
        other => anyhow::bail!(
            "backend {other:?} is not served by a stateless node in this build (cargo features `pg`, `etcd`)"
        ),
    }
}

async fn serve<S>(
    store: S,
    config: Config,
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    S: LockStore + SessionRegistry + Clone + std::fmt::Debug + 'static,
{
    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (field `listen`)", config.listen))?,
    };
    let local: SocketAddr = listener.local_addr().context("listener has no address")?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let api = SpiApi {
        store: store.clone(),
        node_id: config.node_id,
        listen: local.to_string(),
        cluster_name: config.cluster_name.clone(),
        stop: stop_rx.clone(),
    };
    let reaper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(REAP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A backend that is down fails every tick: say so once, then once a minute.
        let mut failing = LogLimit::default();
        loop {
            tick.tick().await;
            let now = tokio::time::Instant::now().into_std();
            match store.reap_expired(SystemTime::now()).await {
                Ok(n) => {
                    if let Some(ended) = failing.succeeded(now) {
                        tracing::info!(
                            failing_ms = ended.lasted.as_millis() as u64,
                            failed_ticks = ended.total,
                            "reap_expired works again"
                        );
                    }
                    if n > 0 {
                        tracing::debug!(reaped = n, "reaped expired grants");
                    }
                }
                Err(e) => match failing.failed(now, &e) {
                    None => {}
                    Some(Note::Began) => {
                        tracing::warn!(error = %e, "reap_expired failed; retrying every tick")
                    }
                    Some(Note::Summary(s)) => tracing::warn!(
                        failing_s = s.lasted.as_secs(),
                        failed_ticks = s.count,
                        last_error = %s.last_error,
                        "reap_expired still failing"
                    ),
                },
            }
        }
    });
    let (_health, health_service) = tonic_health::server::health_reporter();
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(
            LockServiceServer::new(api.clone())
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            SessionServiceServer::new(api.clone())
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            AdminServiceServer::new(api)
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        );
    println!("lockd ready node_id={} listen={local}", config.node_id);
    tracing::info!(node_id = config.node_id, %local, backend = ?config.backend, "serving (stateless)");
    let signal = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let mut serve =
        tokio::spawn(router.serve_with_incoming_shutdown(accepted_without_nagle(listener), signal));
    let served = tokio::select! {
        served = &mut serve => served,
        _ = stop_rx.wait_for(|stop| *stop) => {
            match tokio::time::timeout(SERVE_DRAIN_TIMEOUT, &mut serve).await {
                Ok(served) => served,
                Err(_) => {
                    serve.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    reaper.abort();
    served
        .context("the gRPC server task failed")?
        .context("the gRPC server failed")?;
    tracing::info!("stopped");
    Ok(())
}
