//! The Raft transport between nodes over gRPC. [`network`] is the sending side openraft calls
//! (one file each for dialing, unary calls, the append stream, snapshot streaming, and the
//! commit-only coalescing of appends, the one piece of Raft protocol logic in the transport);
//! [`service`] receives peers' RPCs; [`peer_health`] paces attempts to a peer that cannot be
//! reached, by the policy in [`backoff`]. Payloads are postcard-encoded openraft types; the few
//! messages of lockd's own (an append stream's answer, a snapshot's header) are defined here,
//! where both sides see them.

pub mod backoff;
pub mod network;
pub mod peer_health;
pub mod service;

use lock_raft_store::{SnapshotMeta, TypeConfig, Vote};
use openraft::raft::StreamAppendResult;
use serde::{Deserialize, Serialize};

/// One answer on an `AppendStream`: openraft's result for the request it answers, or why the
/// follower's Raft could not take it (it stopped, or failed).
pub type StreamAnswer = Result<StreamAppendResult<TypeConfig>, String>;

/// Bytes of snapshot data per message of a `Snapshot` stream.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The first message of a `Snapshot` stream: whose snapshot it is and how long.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The sending leader's vote.
    pub vote: Vote,
    /// What the snapshot covers.
    pub meta: SnapshotMeta,
    /// The snapshot data's length in bytes: the chunks that follow add up to exactly this.
    pub len: u64,
}
