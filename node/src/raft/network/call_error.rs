//! Why one Raft call to a peer failed ([`CallError`]), whether that counts against the peer's
//! reachability, and how it is phrased as openraft's error kinds (`Timeout`, `Unreachable`,
//! `Network`), in one place for every kind of call.
//!
//! Must not look inside a Raft message: it classifies transport outcomes (a gRPC status, a
//! deadline, a payload that does not decode, the peer's Raft refusing the request as a whole).

use std::fmt;
use std::time::Duration;

use lock_raft_store::NodeId;
use openraft::error::{NetworkError, RPCError, Timeout, Unreachable};
use openraft::network::RPCTypes;

use super::{PeerClient, RpcError};
use crate::raft::peer_health::NotYet;

/// Why one call failed, before it is phrased as an openraft error.
#[derive(Debug)]
pub(super) enum CallError {
    Timeout(Duration),
    Unreachable(tonic::Status),
    BadAddress(String),
    Network(tonic::Status),
    Decode(String),
    /// The peer's Raft could not take the request at all (it stopped, or hit a fatal error).
    Remote(String),
    /// Not attempted: the peer is unreachable and not yet due for another attempt.
    NotYet(NotYet),
}

impl CallError {
    /// Whether this failure says the peer cannot be reached, and so pushes its next attempt
    /// away (`PeerHealth::failed`). A timeout does only where `timeout_counts`: on a
    /// stream, whose deadline is seconds, it means the peer is cut off; on a heartbeat or a
    /// vote, whose deadline is one interval, a busy machine alone can cause it, and a peer
    /// put into backoff for that would flap in the log.
    pub(super) fn counts_against_peer(&self, timeout_counts: bool) -> bool {
        match self {
            CallError::Timeout(_) => timeout_counts,
            CallError::NotYet(_) => false,
            CallError::Unreachable(_)
            | CallError::BadAddress(_)
            | CallError::Network(_)
            | CallError::Decode(_)
            | CallError::Remote(_) => true,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Timeout(ttl) => write!(f, "no answer within {ttl:?}"),
            CallError::Unreachable(status) | CallError::Network(status) => {
                f.write_str(&status_text(status))
            }
            CallError::BadAddress(msg) | CallError::Decode(msg) | CallError::Remote(msg) => {
                f.write_str(msg)
            }
            CallError::NotYet(not_yet) => write!(
                f,
                "peer unreachable; next attempt in {} ms",
                not_yet.retry_in.as_millis()
            ),
        }
    }
}

/// A status's message and the chain of errors under it, each once: for a refused connection,
/// `transport error: tcp connect error: Connection refused (os error 111)`.
fn status_text(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let part = err.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = err.source();
    }
    text
}

/// A plain error to wrap into openraft's `NetworkError` / `Unreachable`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

/// A failed gRPC call's status as a [`CallError`]: `Unavailable` is a peer that cannot be
/// reached, anything else a network failure.
pub(super) fn classify(status: tonic::Status) -> CallError {
    match status.code() {
        tonic::Code::Unavailable => CallError::Unreachable(status),
        _ => CallError::Network(status),
    }
}

/// `err`, from node `self_id` to `target`, as openraft's error. A peer whose Raft has stopped
/// is as good as unreachable: openraft backs off and retries.
pub(super) fn rpc_error(
    self_id: NodeId,
    target: NodeId,
    kind: RPCTypes,
    err: CallError,
) -> RpcError {
    match err {
        CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
            action: kind,
            id: self_id,
            target,
            timeout,
        }),
        CallError::Unreachable(status) => RPCError::Unreachable(Unreachable::new(&status)),
        CallError::BadAddress(msg) | CallError::Remote(msg) => {
            RPCError::Unreachable(Unreachable::new(&TransportError(msg)))
        }
        err @ CallError::NotYet(_) => {
            RPCError::Unreachable(Unreachable::new(&TransportError(err.to_string())))
        }
        CallError::Network(status) => RPCError::Network(NetworkError::new(&status)),
        CallError::Decode(msg) => RPCError::Network(NetworkError::new(&TransportError(msg))),
    }
}

impl PeerClient {
    /// `err`, on a call of `kind` to this peer, as openraft's error.
    pub(super) fn error(&self, kind: RPCTypes, err: CallError) -> RpcError {
        rpc_error(self.self_id, self.target, kind, err)
    }
}
