//! The lockd contract, translated from C2 (the original Java API and SPI) to Rust.
//!
//! This crate is what every caller, every backend and every transport share, so it encodes no
//! stack: it depends on `std` and nothing else (C2 §2.1, NFR-16; CI asserts it). Time is
//! [`std::time::Duration`], [`std::time::Instant`] (monotonic, process-local, authoritative for
//! deadlines) and [`std::time::SystemTime`] (wall clock, display only). Failures are
//! [`LockError`], never a wrapped driver error.
//!
//! # Layout
//!
//! - [`service`]: [`LockService`], the six-method caller contract (C2 §2.2).
//! - [`store`]: the backend SPI, [`LockStore`] and [`SessionRegistry`] (C2 §2.5);
//!   [`request_store`]: what every backend adds to it so one serving layer fits all
//!   ([`RequestStore`]: request ids, FIFO waiting, the session TTL).
//! - [`types`]: [`LockHandle`], [`LockInfo`], [`LockOutcome`] (C2 §2.3), [`RevocationRecord`].
//! - [`error`]: [`LockError`] and its retry rules (C2 §2.4).
//! - [`fence`]: the resource-side rule "accept iff presented > stored" and the header names (C2 §2.7).
//! - [`limits`]: every size and time bound, as named constants with their reasons.
//! - [`validate`]: the argument checks every implementation shares.
//!
//! # The one rule
//!
//! A lock grant is proved by its **fencing token**, not by holding a handle and not by a
//! deadline that has not passed yet. A process can pause for any length of time between checking
//! its deadline and performing a side effect; only a resource that rejects tokens not greater
//! than the last it accepted ([`fence::Fence`]) makes such a stale holder harmless.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod fence;
pub mod limits;
pub mod request_store;
pub mod service;
pub mod store;
pub mod types;
pub mod validate;

pub use error::{LockError, REVOKE_AS_SELF_ROLE, SESSION_OWNER_ROLE};
pub use fence::{
    Fence, HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY, HEADER_OWNER_ID, fence_accepts,
    parse_fencing_token,
};
pub use request_store::{Acquired, Cancelled, RequestStore};
pub use service::LockService;
pub use store::{LockStore, SessionRegistry};
pub use types::{LockHandle, LockInfo, LockOutcome, RevocationRecord};
