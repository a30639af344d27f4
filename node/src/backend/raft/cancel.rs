//! The end of a waiting acquire on the Raft backend that was not granted in time: the
//! withdrawal of a waiter whose wait is over, and cancel-on-drop.
//!
//! - A wait that ran out (or a retry arriving with no wait left) is withdrawn by a
//!   `CancelWait` that keeps a grant which raced it: the caller is still there to receive it.
//! - A waiting acquire whose caller went away (its future was dropped) is withdrawn by a
//!   `CancelWait` that also releases a grant that raced the cancellation (C2 §2.8:
//!   interrupting `acquire` releases a grant already recorded). The acquire disarms that guard
//!   on every path where the caller learns the outcome.

use lock_api::LockError;
use lock_raft_store::{Command, Response};

use super::rejection::{rejected, unexpected};
use super::{RaftBackend, as_caller, grant};
use crate::backend::Grant;
use crate::backend::abandoned::note_cancel;

impl RaftBackend {
    /// Withdraws the waiter of acquire `(session_id, request_id)` on `key` whose wait is over:
    /// the grant it received meanwhile, if any, is the caller's (`Ok(Some)`), else `Ok(None)`.
    pub(super) async fn withdraw_wait(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<Option<Grant>, LockError> {
        let cancelled = self
            .propose(cancel_wait(caller, session_id, request_id, key, false))
            .await?;
        match cancelled {
            Response::WaitCancelled { grant: g, .. } => Ok(g.map(grant)),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("CancelWait", &other)),
        }
    }
}

/// The `CancelWait` of acquire `(session_id, request_id)` on `key`, proposed as `caller`'s, so
/// it cannot withdraw another principal's waiter that shares the ids; `release_if_granted`
/// also releases a grant that raced it (the caller went away) instead of answering it.
pub(super) fn cancel_wait(
    caller: Option<&str>,
    session_id: &str,
    request_id: u64,
    key: &str,
    release_if_granted: bool,
) -> Command {
    as_caller(
        caller,
        Command::CancelWait {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            release_if_granted,
        },
    )
}

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
        let command = cancel_wait(
            self.caller.as_deref(),
            &self.session_id,
            self.request_id,
            &self.key,
            true,
        );
        runtime.spawn(async move {
            let result = backend.propose(command).await;
            let now = backend.inner.clock.now();
            note_cancel(&backend.inner.cancel_failures, now, &result);
        });
    }
}
