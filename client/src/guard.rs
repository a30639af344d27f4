//! [`LockGuard`]: releases a grant when it goes out of scope.
//!
//! Owns nothing but the handle and a reference to its session; the release itself is the
//! session's. It must not be mistaken for proof of holding the lock (see the type's doc).

use std::sync::Arc;

use lock_api::{LockError, LockHandle};

use crate::session::SessionInner;

/// Releases its grant when dropped (or explicitly with [`LockGuard::release`]). Obtained from
/// [`crate::LockClientSession::guard`].
///
/// # Warning
///
/// **Holding a guard does not prove you hold the lock.** The grant can expire, be revoked or
/// die with its session while the guard lives; the guard only promises to *try* to release it
/// at the end. Before each protected side effect, present the handle's
/// [`fencing_token`](LockHandle::fencing_token) to the resource — the token decides, not the
/// guard and not the deadline. Use [`crate::LockClientSession::check_still_held`] to stop doomed
/// work early.
///
/// The release on drop is spawned on the session's runtime and is best effort: nobody learns
/// whether it arrived. If it did not, the grant ends with its lease or its session.
#[derive(Debug)]
pub struct LockGuard {
    inner: Arc<SessionInner>,
    handle: Option<LockHandle>,
}

impl LockGuard {
    pub(crate) fn new(inner: Arc<SessionInner>, handle: LockHandle) -> Self {
        Self {
            inner,
            handle: Some(handle),
        }
    }

    /// The guarded handle, as it was when the guard was made (see
    /// [`crate::LockClientSession::latest`] for the renewed one).
    pub fn handle(&self) -> &LockHandle {
        self.handle
            .as_ref()
            .expect("a LockGuard's handle is only taken by release or drop, which consume it")
    }

    /// The grant's fencing token: pass it to every protected write.
    pub fn fencing_token(&self) -> u64 {
        self.handle().fencing_token
    }

    /// Releases the grant now and reports the answer of
    /// [`lock_api::LockService::release`]: `Ok(true)` released, `Ok(false)` already gone.
    pub async fn release(mut self) -> Result<bool, LockError> {
        let handle = self
            .handle
            .take()
            .expect("a LockGuard's handle is only taken by release or drop, which consume it");
        self.inner.release(&handle).await
    }

    /// Gives the handle back without releasing it; the grant then lives on as any other.
    pub fn into_handle(mut self) -> LockHandle {
        self.handle
            .take()
            .expect("a LockGuard's handle is only taken by release or drop, which consume it")
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.inner.spawn_release(handle);
        }
    }
}
