//! The metrics endpoint: `GET /metrics` (the scrape), `/healthz` (200 while the process
//! serves) and `/readyz` (200 when [`NodeProbe::ready`], else 503 with the reason), on its own
//! HTTP listener (`--metrics-listen`), apart from the gRPC port so that a scraper or a probe
//! never competes with client calls for a connection and never needs the client API's TLS.
//!
//! Owns the listener and the three routes; every answer comes from [`Metrics`] and
//! [`NodeProbe`].

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::probe::NodeProbe;
use super::{Metrics, SCRAPE_CONTENT_TYPE};

#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    probe: NodeProbe,
}

/// Serves the endpoint on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    probe: NodeProbe,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Endpoint { metrics, probe });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("the metrics endpoint failed")
}

async fn scrape(State(endpoint): State<Endpoint>) -> Response {
    // The refresh reads files (`/proc/self`, the storage directory): off the async workers.
    let encoded = tokio::task::spawn_blocking(move || {
        endpoint.probe.refresh(endpoint.metrics.families());
        endpoint.metrics.refresh_process();
        endpoint.metrics.encode()
    })
    .await;
    match encoded {
        Ok(text) => ([(header::CONTENT_TYPE, SCRAPE_CONTENT_TYPE)], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot collect the metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(endpoint): State<Endpoint>) -> Response {
    match endpoint.probe.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}
