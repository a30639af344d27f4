//! A node's metrics (issue 20, docs/METRICS.md): the Prometheus families, who moves each one,
//! and the HTTP endpoint that serves them with `/healthz` and `/readyz`.
//!
//! # Layout
//!
//! - [`families`]: every family, its name, labels, HELP text and buckets, registered at start.
//! - [`apply`]: the applied-state counters, counted from the events of every applied batch.
//! - [`storage`]: log flush and snapshot build durations (raft-store's `StorageObserver`),
//!   and the sizes on disk.
//! - [`proposer`]: commands per proposed entry, around the leader's log writer.
//! - [`raft`]: term, role, commit/applied index, peers and leader changes from openraft's
//!   metrics; the readiness rule.
//! - [`grpc`]: the tower layer counting and timing every gRPC call, and the pipeline's meters.
//! - [`process`]: `process_*` from `/proc/self`.
//! - [`probe`]: what the endpoint reads from the node at each request, Raft or stateless.
//! - [`http`]: the endpoint.
//!
//! Nothing here changes what a node does: every hook observes and hands on. A node builds its
//! [`Metrics`] whether or not it serves them (`--metrics-listen`), so the hooks need no
//! "metrics off" branch; the cost of an unscraped family is its atomic updates.

pub mod apply;
pub mod families;
pub mod grpc;
pub mod http;
pub mod probe;
pub mod process;
pub mod proposer;
pub mod raft;
pub mod storage;

use std::sync::Arc;

use prometheus_client::registry::Registry;

use self::families::Families;

/// The `Content-Type` of a scrape: prometheus-client writes the OpenMetrics text format, which
/// Prometheus reads (and prefers) when told so.
pub const SCRAPE_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One node's families and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    families: Arc<Families>,
    registry: Registry,
    process: process::ProcessReader,
}

impl Metrics {
    /// Every family of a Raft node (`raft`) or of a stateless one, registered.
    pub fn new(raft: bool) -> Arc<Self> {
        let (families, registry) = Families::registered(raft);
        Arc::new(Self {
            families: Arc::new(families),
            registry,
            process: process::ProcessReader::default(),
        })
    }

    /// The families, for the hooks that move them.
    pub fn families(&self) -> &Arc<Families> {
        &self.families
    }

    /// Reads the process families from `/proc/self`. Blocking file reads.
    pub fn refresh_process(&self) {
        self.process.refresh(&self.families);
    }

    /// The scrape: every registered family in the text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug in a family.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        text
    }
}
