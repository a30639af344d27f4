//! The replicated heart of lockd: the lock state machine every node applies from the Raft log,
//! and the durable openraft storage (log, vote, snapshots) it lives in.
//!
//! # Layout
//!
//! - [`command`]: what the log carries and what applying it answers. Types only.
//! - [`table`]: [`LockTable`], the pure state machine that applies commands.
//! - [`limits`]: the bounds the state machine puts on the replicated state, as this release's
//!   constants; `apply` enforces the copy the table carries ([`ApplyLimits`]).
//! - [`storage`]: the durable openraft storage: log and vote in a write-ahead log (or sled),
//!   snapshots as files.
//! - [`TypeConfig`]: the openraft type configuration of the lock cluster, and [`responder`]:
//!   the responder its client writes are answered through.

#![forbid(unsafe_code)]

pub mod command;
pub mod limits;
pub mod responder;
pub mod storage;
pub mod table;

pub use command::{Command, Event, FreeCause, Grant, Rejection, Request, Response, Revocation};
pub use responder::CallbackResponder;
pub use storage::{
    ApplyObserver, LogStore, StateMachineStore, StateReader, StorageError, StorageObserver,
};
pub use table::{
    ApplyLimits, HeldGrant, InvalidLimits, InvariantViolation, LockSet, LockTable, Session, Waiter,
};

/// A node's id in the cluster.
pub type NodeId = u64;

/// A node's address as Raft membership records it: `host:port` of the one port that serves the
/// client API, the admin API and Raft.
pub type Node = openraft::BasicNode;

/// The openraft type configuration of the lock cluster.
///
/// Terms are `u64` and leader ids are openraft's "advanced" ones (term and node id, several
/// candidates per term), as in openraft 0.9, so that log ids, votes and memberships keep the
/// byte encoding lockd wrote before (`tests/encoding.rs`). Written out rather than through
/// `openraft::declare_raft_types!`, which cannot set the responder: client writes are answered
/// through a [`CallbackResponder`], on the applying task. Every other type is the macro's
/// default for these choices.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Request;
    type R = Response;
    type NodeId = NodeId;
    type Node = Node;
    type Term = u64;
    type LeaderId = LeaderId;
    type Vote = Vote;
    type Payload = EntryPayload;
    type Entry = Entry;
    type Responder<T>
        = CallbackResponder<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = openraft::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// A leader's id: its term and node. Several candidates may stand in one term.
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, NodeId>;
/// The leader id a log entry records (with advanced leader ids, the leader id itself).
pub type CommittedLeaderId = LeaderId;
/// A log entry's position: its leader and index.
pub type LogId = openraft::LogId<CommittedLeaderId>;
/// A persisted vote.
pub type Vote = openraft::impls::Vote<LeaderId>;
/// What a log entry carries.
pub type EntryPayload = openraft::EntryPayload<Request, NodeId, Node>;
/// A Raft log entry.
pub type Entry = openraft::Entry<CommittedLeaderId, EntryPayload>;
/// A cluster membership (voters and learners with their addresses).
pub type Membership = openraft::Membership<NodeId, Node>;
/// A membership and the log id of the entry that set it.
pub type StoredMembership = openraft::StoredMembership<CommittedLeaderId, NodeId, Node>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<CommittedLeaderId, NodeId, Node>;
/// A snapshot: its meta and the encoded lock table.
pub type Snapshot = openraft::Snapshot<CommittedLeaderId, NodeId, Node, SnapshotData>;
/// The data of a snapshot as the state machine and the transport hand it over
/// ([`storage::SnapshotData`]: a range of a snapshot file, never whole in memory).
pub use storage::SnapshotData;

/// A lock cluster node's openraft handle, over the lock state machine.
pub type Raft = openraft::Raft<TypeConfig, storage::StateMachineStore>;
