//! The replicated heart of lockd: the lock state machine every node applies from the Raft log,
//! and the durable openraft storage (log, vote, snapshots) it lives in.
//!
//! # Layout
//!
//! - [`command`]: what the log carries and what applying it answers. Types only.
//! - [`table`]: [`LockTable`], the pure state machine that applies commands.
//! - [`limits`]: the bounds the state machine puts on the replicated state.
//! - [`storage`]: the durable openraft storage: log and vote in a write-ahead log (or sled),
//!   snapshots as files.
//! - [`TypeConfig`]: the openraft type configuration of the lock cluster.

#![forbid(unsafe_code)]

pub mod command;
pub mod limits;
pub mod storage;
pub mod table;

pub use command::{Command, Event, FreeCause, Grant, Rejection, Request, Response, Revocation};
pub use storage::{ApplyObserver, LogStore, StateMachineStore, StateReader, StorageError};
pub use table::{InvariantViolation, LockTable, Session, Waiter};

/// A node's id in the cluster.
pub type NodeId = u64;

/// A node's address as Raft membership records it: `host:port` of the one port that serves the
/// client API, the admin API and Raft.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The openraft type configuration of the lock cluster.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);
