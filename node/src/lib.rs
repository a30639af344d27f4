//! lockd, the server: gRPC services, Raft over tonic, leader-local leases and the reaper, and
//! `lockd dev`. The binary `lockd` is [`process::cli::main`].
//!
//! # Layout
//!
//! The folder a file sits in says whose concern it is.
//!
//! - [`process`]: the process around a node — [`process::cli`] the command line,
//!   [`process::config`] flags, `LOCKD_*` env and TOML merged and validated,
//!   [`process::identity`] the data dir's owner, [`process::dev`] the three-node dev cluster.
//! - [`leader`]: the Raft leader's runtime — [`leader::proposer`] stamping and group commit
//!   (D-time, D-batch), [`leader::leases`] lease deadlines, promote and the reaper (D-lease),
//!   [`leader::confirm`] coalesced leadership confirmation, [`leader::waiters`] waiting
//!   acquires (D-wait). Every node runs it; it acts only where it leads.
//! - [`raft`]: the Raft transport over gRPC (client [`raft::network`]: dialing, unary calls,
//!   the append stream, snapshots, commit-only coalescing; server [`raft::service`]; per-peer
//!   backoff [`raft::peer_health`]).
//! - [`backend`]: the one seam the gRPC services are written over ([`backend::Backend`]), its
//!   Raft implementation ([`backend::raft`]) and the one over any `lock_api::RequestStore`
//!   ([`backend::stateless`]).
//! - [`store`]: the stateless backends' lock tables (PostgreSQL, etcd).
//! - [`grpc`]: the lock, session and admin services, their conversions and the serve loop.
//! - [`metrics`]: the Prometheus families, the hooks that move them, and the `/metrics`,
//!   `/healthz`, `/readyz` endpoint (`--metrics-listen`, docs/METRICS.md).
//! - [`server`]: assembles a node, Raft or stateless (`--backend pg|etcd`, cargo features
//!   `pg`, `etcd`), and serves it; [`stop`]: how a Raft node stops (a last snapshot when it
//!   saves the next start's replay, then openraft's shutdown).
//! - [`auth`]: the authorization layer on the serve loop — roles, bearer tokens, the method
//!   table, the decision and the tower layer that inserts the [`peer::Caller`].
//! - [`peer`]: who is at the other end of a connection (address, certificate principal).
//! - [`clock`]: the injected wall and monotonic clocks; [`log_limit`]: a repeating failure
//!   logged as a change of state with a summary a minute. At the root because every folder
//!   uses them.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod backend;
pub mod clock;
pub mod grpc;
pub mod leader;
pub mod log_limit;
pub mod metrics;
pub mod peer;
pub mod process;
pub mod raft;
pub mod server;
pub mod stop;
pub mod store;

// The paths tests, tools and the bench name (`lockd::config::Config`, `lockd::cli::main`) stay
// as they were before the process modules moved into their folder.
pub use process::{cli, config, dev, identity};
