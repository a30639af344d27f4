//! The stateless node's reaper: `reap_expired` on the store every
//! `RequestStore::reap_interval` (the store knows what a reap costs it).
//!
//! Expiry is already true before it runs (the store compares deadlines on every call); the
//! reaper frees storage, keeps `locks_of` scans short and, where the store hands a key on at
//! reap time, wakes the key's first waiter. It is safe on every node at once (C2 §2.5). A store
//! that is down fails every tick: that is said once, summarised once a minute, and its end
//! said once. Owns that loop only.

use std::time::{Duration, UNIX_EPOCH};

use lock_api::RequestStore;

use super::StatelessBackend;
use crate::log_limit::{LogLimit, Note};

impl<S: RequestStore + 'static> StatelessBackend<S> {
    /// Runs the reaper until the node starts shutting down.
    pub async fn run_reaper(self) {
        let mut tick = tokio::time::interval(self.inner.store.reap_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = LogLimit::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.stopping() => return,
            }
            let now = self.inner.clock.now();
            let wall = UNIX_EPOCH + Duration::from_millis(self.inner.clock.wall_ms());
            match self.inner.store.reap_expired(wall).await {
                Ok(n) => {
                    if let Some(ended) = failing.succeeded(now) {
                        tracing::info!(
                            failing_ms = ended.lasted.as_millis() as u64,
                            failed_ticks = ended.total,
                            "reap_expired works again"
                        );
                    }
                    if n > 0 {
                        tracing::debug!(reaped = n, "reaped expired grants");
                    }
                }
                Err(e) => match failing.failed(now, &e) {
                    None => {}
                    Some(Note::Began) => {
                        tracing::warn!(error = %e, "reap_expired failed; retrying every tick")
                    }
                    Some(Note::Summary(s)) => tracing::warn!(
                        failing_s = s.lasted.as_secs(),
                        failed_ticks = s.count,
                        last_error = %s.last_error,
                        "reap_expired still failing"
                    ),
                },
            }
        }
    }
}
