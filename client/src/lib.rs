//! The Rust SDK of lockd (C2 §2.6): finds the leader, retries what is safe to retry, keeps
//! sessions and locks alive, and tells the application — by an error it cannot ignore, or a
//! listener — when a lock is lost.
//!
//! One dependency is enough: this crate re-exports what a caller needs from `lock-api` — the
//! [`LockHandle`], [`LockInfo`], [`LockOutcome`] and [`LockError`] types, the [`LockService`]
//! trait, the resource-side [`Fence`] with the fencing header names ([`HEADER_FENCING_TOKEN`],
//! …), and the [`limits`] (TTL and wait bounds, key lengths).
//!
//! # A first program
//!
//! `Cargo.toml` (the crate is not on crates.io; point `path` at this repository's `client/`
//! folder, or use `git = "…"`):
//!
//! ```toml
//! [dependencies]
//! lock-client = { path = "../lockd/client" }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! `src/main.rs`, against the cluster `cargo run -p lockd -- dev` starts (127.0.0.1:7101–7103),
//! with the `export LOCKD_CA=… LOCKD_CERT=… LOCKD_KEY=…` lines it prints set (the cluster serves
//! TLS and requires a client certificate; [`LockClient::connect`] reads those variables, and
//! [`LockClient::connect_with`] takes a [`ClientConfig`] whose `tls` is a [`TlsConfig`]):
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use lock_client::{LockClient, LockError};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), LockError> {
//!     // Any nodes of the cluster will do: the client finds the leader.
//!     let client = LockClient::connect(&["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]).await?;
//!     // A session is one owner; it heartbeats in the background, and its locks die with it.
//!     let session = client.open_session("worker-7").await?;
//!     session.on_lock_lost(|handle| eprintln!("lost {} (token {})", handle.key, handle.fencing_token));
//!
//!     let (ttl, max_wait) = (Duration::from_secs(30), Duration::from_secs(5));
//!     match session.acquire("payout/2026-11-30", ttl, max_wait).await? {
//!         Some(handle) => {
//!             // Stops doomed work early; the fencing token is what protects the resource.
//!             session.check_still_held(&handle)?;
//!             println!("holding {} with fencing token {}", handle.key, handle.fencing_token);
//!             // ... write to the resource, presenting handle.fencing_token ...
//!             session.release(&handle).await?;
//!         }
//!         // Someone else holds it: not an error, and not a reason to spin.
//!         None => println!("payout/2026-11-30 is held by someone else; not proceeding"),
//!     }
//!     session.close().await?; // releases whatever the session still holds
//!     Ok(())
//! }
//! ```
//!
//! The same program, taking its endpoints from the command line or `LOCKD_ENDPOINTS`, is
//! `examples/first_program.rs` (`cargo run -p lock-client --example first_program`); the
//! integration tests run it against a real three-node cluster.
//!
//! # The one rule
//!
//! A handle, a guard and a deadline that has not passed do not prove that you hold the lock:
//! the process can pause between any check and the side effect. The **fencing token**,
//! presented to the resource and checked there ([`Fence`]), is what makes a stale
//! holder harmless. [`LockClientSession::check_still_held`] only stops doomed work early.
//!
//! # Errors
//!
//! Every call answers [`LockError`]. Transient trouble (a node down, a leader change,
//! a timeout) is retried inside the call within its budget and only then surfaces as
//! `Contention` or `NotLeader`; it is never reported as `LockLost` (docs/DESIGN.md D-errors).
//!
//! # Layout
//!
//! - [`client`]: [`LockClient`] — connect, open sessions, inspect, force-revoke, status, and
//!   the by-session-id calls of `lockctl`.
//! - [`session`]: [`LockClientSession`] — acquire, renew and release for the session's owner
//!   (and the [`LockService`] implementation), heartbeats, keep-alive, the deadline watchdog,
//!   lost-lock listeners, cancellation of dropped acquires. Inside: the session's state as
//!   plain data, the shared inner value, the server calls, and the keep-alive and watchdog
//!   tasks, one private module each.
//! - `clock` (private): the SDK's one clock, Tokio's, so tests with paused time drive every
//!   deadline and timer.
//! - [`guard`]: [`LockGuard`] — release on drop.
//! - `heartbeat` (private): the heartbeat schedule of a client's sessions, coalesced into
//!   `HeartbeatBatch` calls.
//! - `router` (private): endpoints, leader discovery and the retry loop.
//! - [`pipeline`]: the lock calls to one node multiplexed on one `LockService.Pipeline`
//!   stream (unary against a node without it); the router keeps one per endpoint.
//! - [`backoff`]: bounded, jittered exponential backoff (FR-28).
//! - [`deadline`]: the client-deadline rule (FR-11).
//! - [`events`]: `session_lost`, `lease_expired`, `fenced_out` as `tracing` events and
//!   counters through the `metrics` facade; [`events::admit`], a fence check that reports.
//! - [`config`]: [`ClientConfig`] and its defaults, with reasons.
//! - [`tls`]: [`TlsConfig`] — the CA and client certificate, from the caller or `LOCKD_CA`,
//!   `LOCKD_CERT`, `LOCKD_KEY`.
//! - `transport` (private): one node's channel, plaintext or TLS, with the bearer token on
//!   every request.
//! - `src/bin/lockctl/`: the command-line tool.
//! - Re-exported from `lock-api`: [`LockHandle`], [`LockInfo`], [`LockOutcome`],
//!   [`RevocationRecord`],
//!   [`LockError`], [`LockService`], [`Fence`], [`fence_accepts`], [`parse_fencing_token`],
//!   the header names and [`limits`].

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backoff;
pub mod client;
mod clock;
pub mod config;
pub mod deadline;
pub mod events;
pub mod guard;
mod heartbeat;
pub mod pipeline;
mod router;
pub mod session;
pub mod tls;
mod transport;

pub use client::{ClusterMember, LockClient, NodeReport, NodeStatus, NodeView, RevocationPage};
pub use config::{BackoffConfig, ClientConfig, SafetyMargin};
pub use guard::LockGuard;
pub use session::LockClientSession;
pub use tls::TlsConfig;

// What a caller needs from the contract crate, so that `lock-client` is the one dependency
// of a program. Inlined, so that these pages document them without `lock-api`'s.
#[doc(inline)]
pub use lock_api::limits;
#[doc(inline)]
pub use lock_api::{
    Fence, HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY, HEADER_OWNER_ID, LockError, LockHandle,
    LockInfo, LockOutcome, LockService, RevocationRecord, fence_accepts, parse_fencing_token,
};
