//! Held syncs: while held, every fsync, fdatasync and directory fsync of the mount waits, so
//! the writes before it stay unsynced — the moment a power cut is most telling, with a sync
//! in flight that was never acknowledged. A hold ends when released (a cut or a flush
//! releases it) or at its deadline, so a harness that dies holding it cannot hang a node.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest hold asked for; a longer one is cut to it.
pub const HOLD_MAX: Duration = Duration::from_secs(30);

/// The syncs' gate.
#[derive(Debug, Default)]
pub struct SyncHold {
    until: Mutex<Option<Instant>>,
    changed: Condvar,
}

impl SyncHold {
    /// Holds every sync that starts from now on, for at most `for_` (and [`HOLD_MAX`]).
    pub fn hold(&self, for_: Duration) {
        let until = Instant::now() + for_.min(HOLD_MAX);
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    /// Lets held syncs go on.
    pub fn release(&self) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.changed.notify_all();
    }

    /// Whether syncs are held now.
    pub fn held(&self) -> bool {
        self.until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// Waits while syncs are held.
    pub fn wait(&self) {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(deadline) = *until {
            let now = Instant::now();
            if now >= deadline {
                *until = None;
                break;
            }
            until = self
                .changed
                .wait_timeout(until, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_held_sync_waits_for_the_release_and_a_hold_ends_by_itself() {
        let hold = Arc::new(SyncHold::default());
        hold.wait();
        hold.hold(Duration::from_secs(20));
        assert!(hold.held());
        let waiter = {
            let hold = Arc::clone(&hold);
            std::thread::spawn(move || {
                let started = Instant::now();
                hold.wait();
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the sync waits while held");
        hold.release();
        assert!(waiter.join().unwrap() < Duration::from_secs(20));
        hold.hold(Duration::from_millis(30));
        hold.wait();
        assert!(!hold.held());
    }
}
