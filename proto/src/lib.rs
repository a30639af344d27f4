//! lockd's gRPC wire protocol, package `lockd.v1`, and the one mapping between
//! [`lock_api::LockError`] and [`tonic::Status`].
//!
//! The code in [`v1`] is generated at build time from the `.proto` files by
//! `protox` and `tonic-prost-build`; no `protoc` binary is involved. This
//! crate owns the wire format only: it holds no server logic, no client
//! retries and no Raft state.
//!
//! # Wire conventions
//!
//! - Durations are milliseconds, named `*_ms`; wall-clock instants are
//!   milliseconds since the Unix epoch, named `*_unix_ms`, and are for display
//!   only. A client's monotonic deadline never goes on the wire (C2 D3).
//! - Every mutating lock request carries `(session_id, request_id)`; a retry
//!   repeats the same pair (docs/DESIGN.md D-idempotency).
//! - "Not granted" and "lost" are normal answers (an absent `grant`); failures
//!   are a [`tonic::Status`] carrying a structured [`v1::ErrorDetail`].
//!
//! # Layout
//!
//! - `proto/lockd/v1/lock.proto` — `LockService`: acquire, renew, release,
//!   inspect, force-revoke, and the same calls many at a time on a `Pipeline`
//!   stream.
//! - `proto/lockd/v1/session.proto` — `SessionService`: open, heartbeat,
//!   batched heartbeat, close, locks-of.
//! - `proto/lockd/v1/admin.proto` — `AdminService`: status, membership, and
//!   the force-revoke audit log (`ListRevocations`).
//! - `proto/lockd/v1/raft.proto` — `RaftService`: node-to-node openraft
//!   transport, opaque postcard payloads.
//! - `proto/lockd/v1/error.proto` — `ErrorDetail` and its envelope.
//! - [`v1`] — the generated messages, clients (`v1::*_client`) and servers
//!   (`v1::*_server`).
//! - [`error`] — [`status_from_lock_error`] and [`lock_error_from_status`],
//!   and the per-answer form of the same mapping (`ErrorDetail`).
//! - [`codec`] — the protobuf codec of every service: a body that cannot be
//!   decoded is `INVALID_ARGUMENT` with an `ErrorDetail`, never `INTERNAL`.
//! - [`session`] — the limit of a `HeartbeatBatch`, shared by server and
//!   client.
//! - [`audit`] — the page-size bounds and the page token of
//!   `AdminService.ListRevocations`.
//! - [`pipeline`] — the limit of calls in flight on a `LockService.Pipeline`
//!   stream.
//! - [`FILE_DESCRIPTOR_SET`] — the compiled schema, for gRPC reflection.
//! - `proto/etcd/` and `etcd` (cargo feature `etcd` only) — the one copy of
//!   the subset of etcd's v3 API this workspace calls (lockd's etcd lock store,
//!   lock-bench), with etcd's packages and field numbers, as tonic clients.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod audit;
pub mod codec;
pub mod error;
pub mod pipeline;
pub mod session;

pub use error::{lock_error_from_status, status_from_lock_error};

/// The generated code of package `lockd.v1`: one Rust type per message, plus
/// a client module (`lock_service_client::LockServiceClient`, …) and a server
/// module (`lock_service_server::{LockService, LockServiceServer}`, …) per
/// service. The documentation of each item is the comment in its `.proto`
/// file.
#[allow(clippy::all, clippy::pedantic, clippy::nursery)]
pub mod v1 {
    tonic::include_proto!("lockd.v1");
}

/// The subset of etcd's v3 API that this workspace calls, generated from
/// `proto/etcd/` (cargo feature `etcd`): clients only. One module per etcd
/// package, so the gRPC paths (`/etcdserverpb.KV/Txn`, ...) and the encodings
/// are etcd's; everything neither lockd's etcd lock store nor lock-bench
/// calls is left out.
#[cfg(feature = "etcd")]
pub mod etcd {
    /// etcd's storage types (`mvccpb.KeyValue`, `mvccpb.Event`).
    #[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// etcd's server API: KV (range, transactions), leases, watches, maintenance status.
    #[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// etcd's v3lock service (server-side mutexes on leases).
    #[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }
}

/// The encoded `google.protobuf.FileDescriptorSet` of package `lockd.v1`,
/// with its imports and source comments, as compiled by `protox` in the build
/// script. Hand it to a gRPC reflection service (`tonic-reflection`'s
/// `register_encoded_file_descriptor_set`) so tools such as grpcurl can
/// discover the services.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/lockd_v1_descriptor.bin"));
