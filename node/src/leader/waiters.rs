//! The registry of `Acquire` calls waiting on this node for a hand-off (docs/DESIGN.md D-wait).
//!
//! Owns the slots `(session_id, request_id) → one-shot outcome`, filled from applied events: a
//! hand-off grant (`Event::Granted { handed_off: true }`) or a dropped waiter
//! (`Event::WaiterDropped`). A slot is registered *before* its acquire is proposed, so a
//! hand-off applied before the proposal's own answer arrives is not missed. Does not propose
//! anything and does not decide timeouts: the waiting call does (see `backend::raft`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lock_raft_store::{Event, Grant};
use tokio::sync::oneshot;

/// How a queued waiter's wait ended, as applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The key was handed off to this waiter.
    Granted(Grant),
    /// The waiter left the queue without a grant (cancelled, its deadline passed, its session
    /// ended).
    Dropped,
}

type SlotKey = (String, u64);

/// The waiting acquires of this node. Shared by the observer that fills slots and the calls
/// that wait on them.
#[derive(Debug, Default)]
pub struct WaiterRegistry {
    slots: Mutex<Slots>,
}

/// The slots, each with the generation of its registration, so a dropped slot that a retry
/// already replaced does not unregister the retry's slot.
#[derive(Debug, Default)]
struct Slots {
    next_generation: u64,
    by_key: HashMap<SlotKey, (u64, oneshot::Sender<WaitOutcome>)>,
}

/// A registered slot: await [`WaitSlot::outcome`]; dropping it unregisters the slot.
#[derive(Debug)]
pub struct WaitSlot {
    registry: Arc<WaiterRegistry>,
    key: SlotKey,
    generation: u64,
    rx: oneshot::Receiver<WaitOutcome>,
}

impl WaiterRegistry {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        // Inserts and removes only: a poisoned map is still consistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the slot of acquire `(session_id, request_id)`. A second registration of the
    /// same pair (a retried request) replaces the first, whose waiter then sees its slot closed.
    pub fn register(self: &Arc<Self>, session_id: &str, request_id: u64) -> WaitSlot {
        let (tx, rx) = oneshot::channel();
        let key = (session_id.to_owned(), request_id);
        let mut slots = self.lock();
        slots.next_generation += 1;
        let generation = slots.next_generation;
        slots.by_key.insert(key.clone(), (generation, tx));
        drop(slots);
        WaitSlot {
            registry: self.clone(),
            key,
            generation,
            rx,
        }
    }

    /// Fills the slots that applied events decide.
    pub fn on_events(&self, events: &[Event]) {
        let mut slots = self.lock();
        if slots.by_key.is_empty() {
            return;
        }
        for event in events {
            let (key, outcome) = match event {
                Event::Granted {
                    grant,
                    handed_off: true,
                    ..
                } => (
                    (grant.session_id.clone(), grant.request_id),
                    WaitOutcome::Granted(grant.clone()),
                ),
                Event::WaiterDropped {
                    session_id,
                    request_id,
                    ..
                } => ((session_id.clone(), *request_id), WaitOutcome::Dropped),
                _ => continue,
            };
            if let Some((_, tx)) = slots.by_key.remove(&key) {
                let _ = tx.send(outcome);
            }
        }
    }

    /// How many slots are registered.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Whether no slot is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WaitSlot {
    /// Waits for the slot to be filled. `None` if it never will be: the registry replaced it
    /// (a retry registered the same request).
    pub async fn outcome(&mut self) -> Option<WaitOutcome> {
        (&mut self.rx).await.ok()
    }

    /// The outcome if the slot is already filled.
    pub fn try_outcome(&mut self) -> Option<WaitOutcome> {
        self.rx.try_recv().ok()
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut slots = self.registry.lock();
        // Remove only our own registration: a retry may have replaced it with its own.
        if slots
            .by_key
            .get(&self.key)
            .is_some_and(|(generation, _)| *generation == self.generation)
        {
            slots.by_key.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(session: &str, request_id: u64) -> Grant {
        Grant {
            key: "k".into(),
            owner_id: "o".into(),
            session_id: session.into(),
            request_id,
            token: 3,
            ttl_ms: 1_000,
            acquired_at_ms: 0,
            expires_at_ms: 1_000,
        }
    }

    #[tokio::test]
    async fn a_hand_off_fills_the_matching_slot_only() {
        let registry = Arc::new(WaiterRegistry::default());
        let mut mine = registry.register("s", 1);
        let mut other = registry.register("s", 2);
        registry.on_events(&[
            Event::Granted {
                shared_key: "k".into(),
                grant: grant("s", 1),
                handed_off: false,
            },
            Event::Granted {
                shared_key: "k".into(),
                grant: grant("s", 1),
                handed_off: true,
            },
        ]);
        assert_eq!(
            mine.outcome().await,
            Some(WaitOutcome::Granted(grant("s", 1)))
        );
        assert_eq!(other.try_outcome(), None);
        registry.on_events(&[Event::WaiterDropped {
            session_id: "s".into(),
            request_id: 2,
            key: "k".into(),
        }]);
        assert_eq!(other.outcome().await, Some(WaitOutcome::Dropped));
        drop((mine, other));
        assert!(registry.is_empty());
    }

    #[test]
    fn a_replaced_slot_does_not_unregister_its_replacement() {
        let registry = Arc::new(WaiterRegistry::default());
        let first = registry.register("s", 1);
        let mut retry = registry.register("s", 1);
        drop(first);
        assert_eq!(registry.len(), 1);
        registry.on_events(&[Event::WaiterDropped {
            session_id: "s".into(),
            request_id: 1,
            key: "k".into(),
        }]);
        assert_eq!(retry.try_outcome(), Some(WaitOutcome::Dropped));
    }

    #[test]
    fn dropping_a_slot_unregisters_it() {
        let registry = Arc::new(WaiterRegistry::default());
        let slot = registry.register("s", 1);
        assert_eq!(registry.len(), 1);
        drop(slot);
        assert!(registry.is_empty());
    }
}
