//! Coalesced leadership confirmation for leader-local renewals and heartbeats (D-lease).
//!
//! Every renewal and heartbeat must be followed by a quorum round proving this node still
//! leads (openraft `ensure_linearizable`). Done one round per call, a fleet of sessions
//! heartbeating at once becomes a storm of heartbeat rounds: the keep-alive storm D-lease exists
//! to avoid, moved from the log to the network. [`Confirmer`] runs one round at a time and
//! answers every caller that joined **before** that round started with its result; callers
//! arriving during a round wait for the next one, because a round that started before a
//! caller's lease extension does not prove leadership after it (the read-index batching of
//! etcd and TiKV).
//!
//! Owns the batching only; what a round does is the injected function.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use lock_api::LockError;
use tokio::sync::oneshot;

/// One confirmation round.
pub type Round = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

/// Makes a confirmation round.
pub type RoundFn = Arc<dyn Fn() -> Round + Send + Sync>;

#[derive(Default)]
struct Queue {
    running: bool,
    waiting: Vec<oneshot::Sender<Result<(), LockError>>>,
}

/// Runs confirmation rounds one at a time for all callers queued before each round.
#[derive(Clone)]
pub struct Confirmer {
    round: RoundFn,
    queue: Arc<Mutex<Queue>>,
}

impl std::fmt::Debug for Confirmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirmer").finish_non_exhaustive()
    }
}

impl Confirmer {
    /// A confirmer running `round` for each batch of callers.
    pub fn new(round: RoundFn) -> Self {
        Self {
            round,
            queue: Arc::new(Mutex::new(Queue::default())),
        }
    }

    /// Resolves with the result of a round that started after this call.
    pub async fn confirm(&self) -> Result<(), LockError> {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.waiting.push(tx);
            !std::mem::replace(&mut queue.running, true)
        };
        if start_driver {
            tokio::spawn(drive(self.round.clone(), self.queue.clone()));
        }
        rx.await.unwrap_or_else(|_| {
            Err(LockError::contention(
                "leadership confirmation was abandoned (node stopping); retry",
            ))
        })
    }
}

/// Runs rounds while callers are queued; each round answers the callers queued before it.
async fn drive(round: RoundFn, queue: Arc<Mutex<Queue>>) {
    loop {
        let batch = {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.waiting.is_empty() {
                q.running = false;
                return;
            }
            std::mem::take(&mut q.waiting)
        };
        let result = round().await;
        for caller in batch {
            let _ = caller.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    #[tokio::test]
    async fn concurrent_callers_share_rounds_and_latecomers_get_a_later_round() {
        let rounds = Arc::new(AtomicUsize::new(0));
        // Each round waits for a permit, so the test decides when rounds end.
        let gate = Arc::new(Semaphore::new(0));
        let confirmer = Confirmer::new({
            let rounds = rounds.clone();
            let gate = gate.clone();
            Arc::new(move || {
                let rounds = rounds.clone();
                let gate = gate.clone();
                Box::pin(async move {
                    rounds.fetch_add(1, Ordering::SeqCst);
                    gate.acquire()
                        .await
                        .map(|p| p.forget())
                        .map_err(|_| LockError::contention("gate closed"))
                })
            })
        });
        let first = tokio::spawn({
            let c = confirmer.clone();
            async move { c.confirm().await }
        });
        while rounds.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // 50 callers arrive while round 1 is in flight: they must not ride on it.
        let later: Vec<_> = (0..50)
            .map(|_| {
                let c = confirmer.clone();
                tokio::spawn(async move { c.confirm().await })
            })
            .collect();
        while confirmer.queue.lock().unwrap().waiting.len() < 50 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), Ok(()));
        gate.add_permits(1);
        for task in later {
            assert_eq!(task.await.unwrap(), Ok(()));
        }
        assert_eq!(rounds.load(Ordering::SeqCst), 2, "51 callers, two rounds");
    }

    #[tokio::test]
    async fn a_failed_round_fails_its_callers_only() {
        let calls = Arc::new(AtomicUsize::new(0));
        let confirmer = Confirmer::new({
            let calls = calls.clone();
            Arc::new(move || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if n == 0 {
                        Err(LockError::contention("no quorum"))
                    } else {
                        Ok(())
                    }
                })
            })
        });
        assert!(confirmer.confirm().await.is_err());
        assert_eq!(confirmer.confirm().await, Ok(()));
    }
}
