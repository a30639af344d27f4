//! The Rust SDK of lockd (C2 §2.6): finds the leader, retries what is safe to retry, keeps
//! sessions and locks alive, and tells the application — by an error it cannot ignore, or a
//! listener — when a lock is lost.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_api::LockService;
//! use lock_client::LockClient;
//!
//! # async fn run() -> Result<(), lock_api::LockError> {
//! let client = LockClient::connect(&["127.0.0.1:7101", "127.0.0.1:7102"]).await?;
//! let session = client.open_session("worker-7").await?;
//! session.on_lock_lost(|handle| eprintln!("lost {} (token {})", handle.key, handle.fencing_token));
//! if let Some(handle) = session
//!     .acquire("payout/2026-11-30", "worker-7", Duration::from_secs(30), Duration::from_secs(5))
//!     .await?
//! {
//!     session.check_still_held(&handle)?;
//!     // ... write to the resource, presenting handle.fencing_token ...
//!     session.release(&handle).await?;
//! }
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! # The one rule
//!
//! A handle, a guard and a deadline that has not passed do not prove that you hold the lock:
//! the process can pause between any check and the side effect. The **fencing token**,
//! presented to the resource and checked there (`lock_api::Fence`), is what makes a stale
//! holder harmless. [`LockClientSession::check_still_held`] only stops doomed work early.
//!
//! # Errors
//!
//! Every call answers [`lock_api::LockError`]. Transient trouble (a node down, a leader change,
//! a timeout) is retried inside the call within its budget and only then surfaces as
//! `Contention` or `NotLeader`; it is never reported as `LockLost` (docs/DESIGN.md D-errors).
//!
//! # Layout
//!
//! - [`client`]: [`LockClient`] — connect, open sessions, inspect, force-revoke, status, and
//!   the by-session-id calls of `lockctl`.
//! - [`session`]: [`LockClientSession`] — the `LockService` implementation, heartbeats,
//!   keep-alive, the deadline watchdog, lost-lock listeners, cancellation of dropped acquires.
//! - [`guard`]: [`LockGuard`] — release on drop.
//! - `heartbeat` (private): the heartbeat schedule of a client's sessions, coalesced into
//!   `HeartbeatBatch` calls.
//! - `router` (private): endpoints, leader discovery and the retry loop.
//! - [`pipeline`]: the lock calls to one node multiplexed on one `LockService.Pipeline`
//!   stream (unary against a node without it); the router keeps one per endpoint.
//! - [`backoff`]: bounded, jittered exponential backoff (FR-28).
//! - [`deadline`]: the client-deadline rule (FR-11).
//! - [`config`]: [`ClientConfig`] and its defaults, with reasons.
//! - `src/bin/lockctl.rs`: the command-line tool.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backoff;
pub mod client;
pub mod config;
pub mod deadline;
pub mod guard;
mod heartbeat;
pub mod pipeline;
mod router;
pub mod session;

pub use client::{ClusterMember, LockClient, NodeReport, NodeStatus, NodeView};
pub use config::{BackoffConfig, ClientConfig, SafetyMargin};
pub use guard::LockGuard;
pub use session::LockClientSession;
