//! The one serve loop of a node, whatever its backend: the client services over a
//! [`Backend`], health, reflection, message size limits, the ready line and a graceful drain,
//! on the connections `grpc::accept` hands it (TLS or plaintext, Nagle off, each with its
//! [`PeerIdentity`](crate::peer::PeerIdentity)).
//!
//! Owns the listener's lifetime and the order of a stop: the shutdown future turns the stop
//! signal on (waiting acquires stop waiting, pipelines read no new call), in-flight calls get
//! [`SERVE_DRAIN_TIMEOUT`] to finish, then the listener closes. A Raft node adds its
//! `RaftService` to the same router (`extra`); nothing here knows of Raft. Every service sits
//! behind the authorization layer (`auth`), the Raft service included.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_proto::v1::admin_service_server::AdminServiceServer;
use lock_proto::v1::lock_service_server::LockServiceServer;
use lock_proto::v1::session_service_server::SessionServiceServer;
use lock_tls::server::ServerTls;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::Router;

use super::CLIENT_MESSAGE_BYTES_MAX;
use super::accept;
use super::admin::AdminApi;
use super::lock::LockApi;
use super::session::SessionApi;
use crate::auth::{Access, AuthLayer};
use crate::backend::Backend;

/// The router of the serve loop: every service behind the one authorization layer
/// (`auth::layer`), so no method is reachable without its check.
pub type NodeRouter = Router<tower::layer::util::Stack<AuthLayer, tower::layer::util::Identity>>;

/// How long a graceful stop waits for in-flight calls before closing them.
pub const SERVE_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// The gRPC service names whose health follows the backend's serving watch ("" is the whole
/// server).
const HEALTH_SERVICES: [&str; 4] = [
    "",
    "lockd.v1.LockService",
    "lockd.v1.SessionService",
    "lockd.v1.AdminService",
];

/// What one node serves, and how it stops.
#[derive(Debug)]
pub struct Serve<B> {
    /// The lock table behind the client services.
    pub backend: B,
    /// This node's id (the ready line).
    pub node_id: u64,
    /// The cluster's name, answered by `AdminService.Status`.
    pub cluster_name: String,
    /// Where to serve.
    pub listener: TcpListener,
    /// TLS on the port (`None`: plaintext, `--insecure`).
    pub tls: Option<Arc<ServerTls>>,
    /// Turned `true` when the shutdown future resolves; the backend's
    /// [`Backend::stop_signal`] must be its receiver.
    pub stop: watch::Sender<bool>,
    /// Who may call what (`--insecure`: everyone, everything).
    pub access: Access,
}

/// Serves the lock, session, admin, health and reflection services (and whatever `extra`
/// adds) on `parts.listener` until `shutdown` resolves, then drains. Prints
/// `lockd ready node_id=N listen=ADDR` to stdout once serving (the CLI contract).
pub async fn serve<B: Backend + std::fmt::Debug>(
    parts: Serve<B>,
    extra: impl FnOnce(NodeRouter) -> NodeRouter,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Serve {
        backend,
        node_id,
        cluster_name,
        listener,
        tls,
        stop,
        access,
    } = parts;
    let local: SocketAddr = listener.local_addr().context("listener has no address")?;
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(backend.serving(), health));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lock_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build the reflection service")?;
    let router = tonic::transport::Server::builder()
        .layer(AuthLayer::new(access))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(
            LockServiceServer::new(LockApi::new(backend.clone()))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            SessionServiceServer::new(SessionApi::new(backend.clone()))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        )
        .add_service(
            AdminServiceServer::new(AdminApi::new(backend.clone(), cluster_name))
                .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
        );
    let router = extra(router);

    println!("lockd ready node_id={node_id} listen={local}");
    tracing::info!(node_id, %local, tls = tls.is_some(), "serving");
    let signal = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    let mut serve =
        tokio::spawn(router.serve_with_incoming_shutdown(accept::incoming(listener, tls), signal));
    let mut stopping = backend.stop_signal();
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
    served
        .context("the gRPC server task failed")?
        .context("the gRPC server failed")?;
    tracing::info!("stopped serving");
    Ok(())
}

/// Serving (health) while `serving` is `true`, not serving while it is `false`; ends when the
/// backend drops its side.
async fn report_health(
    mut serving: watch::Receiver<bool>,
    health: tonic_health::server::HealthReporter,
) {
    use tonic_health::ServingStatus;
    let mut last = None;
    loop {
        let status = if *serving.borrow_and_update() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            for name in HEALTH_SERVICES {
                health.set_service_status(name, status).await;
            }
            last = Some(status);
        }
        if serving.changed().await.is_err() {
            // The backend is gone (a Raft node that shut down): it serves no more.
            if last != Some(ServingStatus::NotServing) {
                for name in HEALTH_SERVICES {
                    health
                        .set_service_status(name, ServingStatus::NotServing)
                        .await;
                }
            }
            return;
        }
    }
}
