//! The apply hook of the lease keeper and the waiter registry: every applied batch's events go
//! to both, on every node, so a node that becomes leader already knows every lease.
//!
//! Owns nothing but the two handles; never reads the clock or blocks the apply path beyond the
//! two in-memory updates.

use std::sync::Arc;

use lock_raft_store::Event;
use lock_raft_store::storage::ApplyObserver;

use super::LeaseKeeper;
use crate::leader::waiters::WaiterRegistry;

/// Feeds applied events to the lease keeper and the waiter registry.
#[derive(Debug)]
pub struct Observer {
    /// The lease keeper.
    pub keeper: Arc<LeaseKeeper>,
    /// The waiting acquires.
    pub waiters: Arc<WaiterRegistry>,
}

impl ApplyObserver for Observer {
    fn applied(&self, _log_index: u64, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        self.keeper.on_events(events);
        self.waiters.on_events(events);
    }
}
