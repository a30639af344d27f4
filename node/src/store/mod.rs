//! The lock store backends behind `lock_api::LockStore` + `lock_api::SessionRegistry`.
//!
//! - [`raft`]: the store over this node's Raft cluster (the default and only one built now);
//!   other backends (PostgreSQL, etcd) plug in behind the same traits.
//! - `pg` (feature `pg`): the lock table in PostgreSQL; `etcd` (feature `etcd`): in etcd.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "pg")]
pub mod pg;
pub mod raft;
