//! The Raft leader's runtime: the tasks and registries a node runs so that, where it leads, it
//! can stamp and commit commands, keep lease deadlines, confirm its leadership and hand keys to
//! waiters. Every node runs them (each checks leadership itself); none speaks gRPC.

pub mod confirm;
pub mod leases;
pub mod proposer;
pub mod waiters;
