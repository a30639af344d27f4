//! A harness for integration tests of lockd against real multi-process clusters, and (in
//! `tests/`) the node integration tests themselves.
//!
//! The harness starts `lockd` processes on free 127.0.0.1 ports with their data and logs in a
//! temporary directory, waits for them by polling (never by sleeping), kills, stops, restarts,
//! pauses and resumes them, and gives typed access to the gRPC API. It adds no lock semantics:
//! what a node answers is what a test sees.
//!
//! # Using it
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_tests::{Cluster, FencedRegister};
//!
//! # async fn example() {
//! let mut cluster = Cluster::start(3).await;           // 3 voters, an agreed leader
//! let leader = cluster.leader().await;                  // node id
//! let at_leader = cluster.client(leader);               // one node, raw answers
//! let session = at_leader.open_session("worker-1", Duration::from_secs(10)).await.unwrap();
//! let grant = at_leader
//!     .acquire(&session.id, "payout/42", Duration::from_secs(10), Duration::ZERO)
//!     .await
//!     .unwrap()
//!     .expect("granted");
//! let register = FencedRegister::new("payout/42");
//! register.write(grant.fencing_token, "paid").unwrap();
//!
//! let any = cluster.cluster_client();                   // follows the leader, retries
//! cluster.kill(leader);                                 // SIGKILL
//! let info = any.inspect_confirmed("payout/42").await.unwrap();
//! assert_eq!(info.map(|i| i.fencing_token), Some(grant.fencing_token));
//! # }
//! ```
//!
//! Run the tests with `cargo build -p lockd && cargo test -p lock-tests` (the binary is found
//! next to the test executable's `deps/` directory, or at `$LOCKD_BIN`). Set
//! `LOCKD_TEST_KEEP_DIR=1` to keep the data and logs of every cluster; on a failed assertion
//! the tail of every node's log is printed anyway.
//!
//! # Layout
//!
//! - [`cluster`]: [`Cluster`] — processes, ports, data dirs, logs, leader agreement, faults.
//! - [`config`]: [`ClusterConfig`] and the test timing constants.
//! - [`pki`]: [`TestPki`] — a cluster's throwaway CA and certificates (TLS is on by default:
//!   [`ClusterConfig::tls`]), and the nodes' TLS flags and role map.
//! - [`dial`]: [`Dial`] — how a harness client connects: TLS as an identity, or plaintext.
//! - [`client`]: [`NodeClient`] (one node, raw answers) and [`ClusterClient`] (follows the
//!   leader, idempotent retries), both returning `Result<_, LockError>`.
//! - [`fence`]: [`FencedRegister`], a resource that accepts a write iff its token is newer.
//! - [`wait`]: [`poll_until`], the bounded condition wait everything uses.
//! - [`log_lines`]: a line, and a field of it, in a node's log ([`Cluster::log_since`]).
//! - [`links`]: [`LinkNet`], proxies on node-to-node links, for partitions.
//! - [`metrics`]: a node's metrics endpoint: `/metrics` parsed with a Prometheus text-format
//!   parser, `/readyz`.
//! - [`stateless`]: [`StatelessNodes`] — `lockd run --backend pg|etcd` processes on one
//!   database, each behind a [`DbLink`] the test can cut.
//! - [`db_link`]: [`DbLink`], a forwarder between a node and its database that can be cut.
//! - [`proc_stats`]: [`ProcStats`], a process's CPU time, memory and descriptors from `/proc`.
//! - [`raw`]: junk for a node's port — raw TCP bytes, HTTP/1, non-protobuf gRPC bodies.
//! - [`binary`]: where the `lockd` binary is found.
//! - [`ports`]: free ports.
//! - [`mod@error`]: the harness's own error type, [`HarnessError`].
//! - `process` (private): one node process, its signals and log files.
//! - `watchdog` (private): kills a cluster's nodes if the test process is killed outright.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod binary;
pub mod client;
pub mod cluster;
pub mod config;
pub mod db_link;
pub mod dial;
pub mod error;
pub mod fence;
pub mod links;
pub mod log_lines;
pub mod metrics;
pub mod pki;
pub mod ports;
pub mod proc_stats;
mod process;
pub mod raw;
pub mod stateless;
pub mod wait;
mod watchdog;

pub use binary::{LOCKD_BIN_ENV, lockd_binary};
pub use client::{ClusterClient, NodeClient, Session, ms, next_request_id};
pub use cluster::{Cluster, KEEP_DIR_ENV};
pub use config::ClusterConfig;
pub use db_link::DbLink;
pub use dial::Dial;
pub use error::HarnessError;
pub use fence::{FencedRegister, FencedWrite};
pub use links::LinkNet;
pub use lock_api::LockError;
pub use lock_proto::v1::{Grant, LockInfo, LockOutcome, Role, StatusResponse};
pub use pki::TestPki;
pub use proc_stats::{ProcGrowth, ProcStats};
pub use stateless::{StatelessBackend, StatelessNodes};
pub use wait::poll_until;
