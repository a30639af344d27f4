//! The stateless backends' lock tables: C2's `lock_api::LockStore` + `SessionRegistry` and
//! the `lock_api::RequestStore` extension, each over an external store that every node of a
//! deployment shares. The node serves them through `backend::stateless`; the Raft cluster's
//! own table is `backend::raft`.
//!
//! - `pg` (feature `pg`): the lock table in PostgreSQL; `etcd` (feature `etcd`): in etcd.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "pg")]
pub mod pg;
