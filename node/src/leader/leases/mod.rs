//! Leases (docs/DESIGN.md D-lease): the leader-local deadlines of every grant and session, the
//! promote that restarts them when a node becomes leader, and the reaper that applies expiry.
//!
//! Split by what each part owns:
//! - [`table`]: the lease records and their deadline index; pure data, takes `now`.
//! - [`shards`]: the table's map from key to record, split so that it grows in small steps.
//! - [`keeper`]: [`LeaseKeeper`], the node's shared table behind a lock, with the clock and
//!   the promoted term.
//! - [`observer`]: [`Observer`], feeding applied events to the keeper and the waiters.
//! - [`promoter`]: [`run_promoter`], which proposes `Command::Promote` on a new leader.
//! - [`reaper`]: [`run_reaper`] and [`reap_once`], which propose the expiry of lapsed leases.
//!
//! Nothing here writes a renewal or heartbeat to the log, and nothing here decides a lock
//! outcome: expiry is proposed as a command, conditional on the token, and the state machine
//! decides.

pub mod keeper;
pub mod observer;
pub mod promoter;
pub mod reaper;
pub mod shards;
pub mod table;

pub use keeper::LeaseKeeper;
pub use observer::Observer;
pub use promoter::run_promoter;
pub use reaper::{REAP_PER_TICK_MAX, REAP_TICK, reap_once, run_reaper};
pub use table::{GrantLease, Lapsed, LeaseTable, MATERIALISE_PER_CALL_MAX, RenewCheck};
