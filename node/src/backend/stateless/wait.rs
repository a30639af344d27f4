//! A waiting acquire on a stateless backend: queued in the store, woken by the store's
//! hand-off, bounded by the caller's `max_wait`, and withdrawn when the caller goes away.
//!
//! The request is queued with `acquire_request`; if it waits, this node waits for
//! `wait_for_grant` until the deadline or the node's stop. At the deadline the request is
//! withdrawn with `cancel_request(release_if_granted = false)`, since a grant that raced the
//! deadline is the caller's. A cancel-on-drop guard withdraws it with
//! `release_if_granted = true` when the caller's future is dropped (C2 §2.8), on a task of its
//! own, logging failures as the Raft backend does. Owns that orchestration only.

use std::time::Duration;

use lock_api::{Acquired, LockError, RequestStore};

use super::{StatelessBackend, grant};
use crate::backend::Grant;
use crate::backend::abandoned::note_cancel;

impl<S: RequestStore + 'static> StatelessBackend<S> {
    /// Acquires `key` for request `(session_id, request_id)` (arguments already validated),
    /// waiting up to `max_wait` in the store's queue.
    pub(super) async fn wait_for(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let store = &self.inner.store;
        let deadline = tokio::time::Instant::now() + max_wait;
        // Armed before the request reaches the store: a caller that goes away while the
        // request is on its way still has it withdrawn.
        let mut guard = CancelOnDrop {
            backend: self.clone(),
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            armed: true,
        };
        let acquired = match store
            .acquire_request(session_id, request_id, key, ttl, max_wait)
            .await
        {
            Ok(acquired) => acquired,
            Err(err) => {
                // Unknown outcome: a retry with the same request id finds the waiter (or its
                // grant) again, so leave it in place for that retry.
                guard.armed = false;
                return Err(err);
            }
        };
        let waited = match acquired {
            Acquired::Granted(h) => {
                guard.armed = false;
                return Ok(Some(grant(h)));
            }
            Acquired::NotGranted => {
                guard.armed = false;
                return Ok(None);
            }
            Acquired::Queued => tokio::select! {
                waited = tokio::time::timeout_at(
                    deadline,
                    store.wait_for_grant(session_id, request_id, key),
                ) => waited,
                _ = self.stopping() => {
                    // The request stays queued in the store: the client's retry (same request
                    // id) at another node finds it again.
                    guard.armed = false;
                    return Err(LockError::contention(
                        "this node is shutting down; retry the acquire with the same request id",
                    ));
                }
            },
        };
        match waited {
            Ok(answer) => {
                // Granted, or out of the queue without a grant (its deadline in the store
                // passed, or its session ended); an error leaves the request for a retry.
                guard.armed = false;
                Ok(answer?.map(grant))
            }
            Err(_elapsed) => {
                // max_wait elapsed: withdraw the request. A grant that raced the withdrawal is
                // the caller's, so keep it. If the withdrawal fails, the guard (still armed)
                // withdraws it again, releasing any grant, since the caller hears an error.
                let cancelled = store
                    .cancel_request(session_id, request_id, key, false)
                    .await?;
                guard.armed = false;
                Ok(cancelled.grant.map(grant))
            }
        }
    }
}

/// Withdraws its request with `cancel_request(release_if_granted = true)` when dropped armed.
struct CancelOnDrop<S: RequestStore + 'static> {
    backend: StatelessBackend<S>,
    session_id: String,
    request_id: u64,
    key: String,
    armed: bool,
}

impl<S: RequestStore + 'static> Drop for CancelOnDrop<S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let session_id = std::mem::take(&mut self.session_id);
        let key = std::mem::take(&mut self.key);
        let request_id = self.request_id;
        runtime.spawn(async move {
            let result = backend
                .inner
                .store
                .cancel_request(&session_id, request_id, &key, true)
                .await;
            let now = backend.inner.clock.now();
            note_cancel(&backend.inner.cancel_failures, now, &result);
        });
    }
}
