//! lockd, the server: gRPC services, Raft over tonic, leader-local leases and the reaper, and
//! `lockd dev`. The binary `lockd` is [`cli::main`].
//!
//! # Layout
//!
//! - [`config`]: flags, `LOCKD_*` env and TOML merged and validated; [`identity`]: the data
//!   dir's owner.
//! - [`clock`]: the injected wall and monotonic clocks; [`log_limit`]: a repeating failure
//!   logged as a change of state with a summary a minute.
//! - [`raft`]: the Raft transport over gRPC (client [`raft::network`], server
//!   [`raft::service`]).
//! - [`proposer`]: stamping and group commit of commands (D-time, D-batch).
//! - [`leases`]: lease deadlines, promote, reaper (D-lease); [`confirm`]: coalesced
//!   leadership confirmation for renewals and heartbeats; [`waiters`]: waiting acquires
//!   (D-wait).
//! - [`backend`]: the one seam the gRPC services are written over ([`backend::Backend`]), and
//!   its Raft implementation ([`backend::raft`]).
//! - [`store`]: the stateless backends' lock tables (PostgreSQL, etcd).
//! - [`grpc`]: the lock, session and admin services, their conversions and the serve loop.
//! - [`server`]: assembles a node, Raft or stateless (`--backend pg|etcd`, cargo features
//!   `pg`, `etcd`); [`dev`]: the three-node dev cluster; [`cli`]: the command line.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
pub mod cli;
pub mod clock;
pub mod config;
pub mod confirm;
pub mod dev;
pub mod grpc;
pub mod identity;
pub mod leases;
pub mod log_limit;
pub mod proposer;
pub mod raft;
pub mod server;
pub mod store;
pub mod waiters;
