//! Cancel-on-drop for the Raft backend's waiting acquire.
//!
//! A waiting acquire whose caller went away (its future was dropped) is withdrawn by a
//! `CancelWait` proposal that also releases a grant that raced the cancellation (C2 §2.8:
//! interrupting `acquire` releases a grant already recorded). Owns that guard only; the
//! acquire disarms it on every path where the caller learns the outcome.

use lock_raft_store::Command;

use super::RaftBackend;
use crate::backend::abandoned::note_cancel;

/// Proposes `CancelWait { release_if_granted: true }` for its request when dropped armed.
pub(super) struct CancelOnDrop {
    pub(super) backend: RaftBackend,
    /// The caller of the acquire: the cancel is proposed as its, so it cannot withdraw another
    /// principal's waiter that happens to share the session id and request id.
    pub(super) caller: Option<String>,
    pub(super) session_id: String,
    pub(super) request_id: u64,
    pub(super) key: String,
    pub(super) armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let command = super::as_caller(
            self.caller.as_deref(),
            Command::CancelWait {
                session_id: std::mem::take(&mut self.session_id),
                request_id: self.request_id,
                key: std::mem::take(&mut self.key),
                release_if_granted: true,
            },
        );
        runtime.spawn(async move {
            let result = backend.propose(command).await;
            let now = backend.inner.clock.now();
            note_cancel(&backend.inner.cancel_failures, now, &result);
        });
    }
}
