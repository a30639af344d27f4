//! The client-facing gRPC face of a node, written once for every backend: the lock, session
//! and admin services, each a thin shell over a [`crate::backend::Backend`]; the one
//! conversion module (seam records → proto); the one serve loop (health, reflection,
//! limits, drain) and the connections it serves (`accept`: TLS, the peer's identity).
//!
//! Nothing here decides a lock outcome or builds an error status by hand.

pub mod accept;
pub mod admin;
pub mod convert;
pub mod lock;
pub mod pipeline;
pub mod revoke;
pub mod serve;
pub mod session;

#[cfg(test)]
mod audit_tests;

/// A backend's error as the status its call answers, through the one error map
/// (`lock_proto::error`); every service's `map_err`.
fn status(err: lock_api::LockError) -> tonic::Status {
    lock_proto::status_from_lock_error(&err)
}

/// Largest client API message, in bytes, either way. The largest request is a force-revoke
/// (key 256 B + operator 128 B + reason 1 KiB); the largest answer a `LocksOf` of
/// `LOCKS_PER_SESSION_MAX` keys of `KEY_LEN_MAX` bytes (256 KiB). 1 MiB covers both with room.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 1024 * 1024;

// A full page of the audit log fits with room (lock_proto::audit).
const _: () = assert!(CLIENT_MESSAGE_BYTES_MAX > 2 * lock_proto::audit::REVOCATIONS_PAGE_BYTES_MAX);

const _: () = assert!(
    CLIENT_MESSAGE_BYTES_MAX
        > lock_raft_store::limits::LOCKS_PER_SESSION_MAX * (lock_api::limits::KEY_LEN_MAX + 8)
);
