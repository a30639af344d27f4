//! The session's calls to the server — acquire (and the cancellation of an abandoned one),
//! renew, release, close — each with the bookkeeping its answer requires.
//!
//! Owns the request side: a request id from the session's counter per call (a retry reuses
//! it, docs/DESIGN.md D-idempotency), the retry budget, the send instant every deadline counts
//! from (read from [`crate::clock`] before the first attempt), and the translation of an
//! answer into a state change (track, mark lost). Endpoint choice and retries are the router's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_api::{LockError, LockHandle, validate};
use lock_proto::v1;

use super::inner::SessionInner;
use crate::clock;
use crate::deadline::{check_margin, handle_from_grant};
use crate::router::Budget;

/// A renewed handle and the instant before its request was first sent.
type Renewed = (LockHandle, Instant);

impl SessionInner {
    /// One Renew RPC (with retries under one request id), no bookkeeping. The new handle's
    /// deadline counts from the instant before the first attempt was sent.
    async fn renew_rpc(
        &self,
        handle: &LockHandle,
        retry_until: Instant,
    ) -> Result<Option<Renewed>, LockError> {
        let ttl_ms = validate::ttl(handle.ttl)?;
        let request = v1::RenewRequest {
            session_id: self.session_id.clone(),
            request_id: self.next_request_id(),
            key: handle.key.clone(),
            fencing_token: handle.fencing_token,
            ttl_ms,
        };
        let budget = Budget {
            deadline: retry_until,
            attempt_timeout: self.router().config().attempt_timeout,
        };
        let sent_at = clock::now();
        let answer = self
            .router()
            .piped(
                "renew",
                budget,
                &request,
                |pipeline, request, timeout| async move { pipeline.renew(request, timeout).await },
            )
            .await;
        let grant = match answer {
            Ok(response) => response.grant,
            // The server's verdict that the grant is gone is the same answer as "no grant".
            Err(LockError::LockLost { .. }) => None,
            Err(err) => return Err(err),
        };
        match grant {
            None => Ok(None),
            Some(grant)
                if grant.fencing_token != handle.fencing_token || grant.key != handle.key =>
            {
                Err(LockError::contention(format!(
                    "renew of {:?} token {} was answered for {:?} token {}; not trusting it",
                    handle.key, handle.fencing_token, grant.key, grant.fencing_token
                )))
            }
            Some(grant) => {
                let margin = self.margin_for(handle.ttl);
                let renewed = handle_from_grant(grant, handle.ttl, sent_at, margin);
                Ok(Some((renewed, sent_at)))
            }
        }
    }

    /// `renew` with bookkeeping: refuses a handle known lost or past its deadline, retries
    /// transient failures only until the deadline, records the new deadline, and reports a loss.
    pub(crate) async fn renew_tracked(
        self: &Arc<Self>,
        handle: &LockHandle,
    ) -> Result<Option<LockHandle>, LockError> {
        let deadline = self.deadline_ahead(handle)?;
        let retry_until = deadline.min(clock::now() + self.router().config().call_timeout);
        match self.renew_rpc(handle, retry_until).await? {
            Some((renewed, sent_at)) => {
                self.track(&renewed, sent_at);
                Ok(Some(renewed))
            }
            None => {
                self.mark_lost(handle);
                Ok(None)
            }
        }
    }

    /// Acquires `key` for the session's owner: waits up to `max_wait` on the server, or makes
    /// one attempt (`TryAcquire`) when it is `None`.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        key: &str,
        ttl: Duration,
        max_wait: Option<Duration>,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        let ttl_ms = validate::ttl(ttl)?;
        let max_wait_ms = max_wait.map(validate::max_wait).transpose()?;
        let margin = self.margin_for(ttl);
        check_margin(ttl, margin)?;
        self.check_open()?;

        let request_id = self.next_request_id();
        // From here on, dropping this future (or failing with an unknown outcome) cancels the
        // server-side wait and releases a grant already recorded (C2 §2.8).
        let mut guard = AcquireGuard {
            inner: Arc::clone(self),
            key: key.to_owned(),
            request_id,
            token: None,
            armed: true,
        };
        let sent_at = clock::now();
        let wait = max_wait.unwrap_or(Duration::ZERO);
        let budget = self.router().budget(wait);
        let session_id = self.session_id.clone();
        let wait_until = sent_at + wait;
        let mut first_attempt = true;
        let answer = self
            .router()
            .call_piped("acquire", budget, |pipeline, timeout| {
                let session_id = session_id.clone();
                let key = key.to_owned();
                // A retry waits only for what is left of `max_wait`, so the whole call stays
                // within `max_wait` plus the retry budget (C2: never much longer than max_wait).
                let retry = !std::mem::replace(&mut first_attempt, false);
                let remaining_ms = max_wait_ms.map(|asked| {
                    let left = wait_until.saturating_duration_since(clock::now());
                    match retry {
                        true => asked.min(u64::try_from(left.as_millis()).unwrap_or(asked)),
                        false => asked,
                    }
                });
                async move {
                    match remaining_ms {
                        Some(max_wait_ms) => {
                            let request = v1::AcquireRequest {
                                session_id,
                                request_id,
                                key,
                                ttl_ms,
                                max_wait_ms,
                            };
                            pipeline.acquire(request, timeout).await
                        }
                        None => {
                            let request = v1::TryAcquireRequest {
                                session_id,
                                request_id,
                                key,
                                ttl_ms,
                            };
                            pipeline.try_acquire(request, timeout).await
                        }
                    }
                }
            })
            .await?;
        let Some(grant) = answer.into_inner().grant else {
            guard.armed = false;
            return Ok(None);
        };
        guard.token = Some(grant.fencing_token);
        let mut handle = handle_from_grant(grant, ttl, sent_at, margin);
        let mut handle_sent_at = sent_at;
        // A long wait may have eaten most of the lease as this process counts it (the deadline
        // counts from the send, the lease from the grant). Renewing now re-bases it on an
        // instant after the grant, instead of handing out a handle that is nearly expired.
        let now = clock::now();
        if handle.remaining_at(now) < handle.ttl / 2 {
            let retry_until = now + self.router().config().call_timeout;
            match self.renew_rpc(&handle, retry_until).await? {
                Some((renewed, renewed_sent_at)) => {
                    handle = renewed;
                    handle_sent_at = renewed_sent_at;
                }
                None => {
                    guard.armed = false;
                    return Err(LockError::contention(format!(
                        "the grant of {key:?} lapsed before it reached the caller; retry the acquire"
                    )));
                }
            }
        }
        self.track(&handle, handle_sent_at);
        guard.armed = false;
        Ok(Some(handle))
    }

    /// Cleans up after an acquire whose caller gave up: withdraws the waiter, releases a grant
    /// already recorded. Best effort, bounded by one call budget.
    async fn cancel_acquire(&self, key: String, request_id: u64, token: Option<u64>) {
        if let Some(token) = token {
            self.untrack(&key, token);
        }
        let request = v1::CancelAcquireRequest {
            session_id: self.session_id.clone(),
            request_id,
            key: key.clone(),
        };
        let cancelled = self
            .router()
            .piped(
                "cancel acquire",
                self.router().budget(Duration::ZERO),
                &request,
                |pipeline, request, timeout| async move {
                    pipeline.cancel_acquire(request, timeout).await
                },
            )
            .await;
        if let Err(err) = cancelled {
            tracing::warn!(%key, request_id, %err, "could not cancel an abandoned acquire");
        }
        if let Some(token) = token
            && let Err(err) = self.release_rpc(&key, token).await
        {
            tracing::warn!(%key, token, %err, "could not release an abandoned grant");
        }
    }

    pub(crate) async fn release_rpc(&self, key: &str, token: u64) -> Result<bool, LockError> {
        let request = v1::ReleaseRequest {
            session_id: self.session_id.clone(),
            request_id: self.next_request_id(),
            key: key.to_owned(),
            fencing_token: token,
        };
        let answer = self
            .router()
            .piped(
                "release",
                self.router().budget(Duration::ZERO),
                &request,
                |pipeline, request, timeout| async move { pipeline.release(request, timeout).await },
            )
            .await?;
        Ok(answer.released)
    }

    pub(crate) async fn release(&self, handle: &LockHandle) -> Result<bool, LockError> {
        self.check_own(handle)?;
        validate::key(&handle.key)?;
        validate::fencing_token(handle.fencing_token)?;
        self.untrack(&handle.key, handle.fencing_token);
        self.release_rpc(&handle.key, handle.fencing_token).await
    }

    /// Spawns the release of a dropped guard's grant.
    pub(crate) fn spawn_release(self: &Arc<Self>, handle: LockHandle) {
        let inner = Arc::clone(self);
        self.runtime.spawn(async move {
            if let Err(err) = inner.release(&handle).await {
                tracing::warn!(key = %handle.key, token = handle.fencing_token, %err,
                    "could not release the grant of a dropped guard");
            }
        });
    }

    /// Closes the session on the server (releasing all its grants).
    pub(super) async fn close_rpc(&self) -> Result<u32, LockError> {
        self.client.close_session(&self.session_id).await
    }
}

/// Cancels an acquire that did not complete (dropped, or failed with an unknown outcome).
struct AcquireGuard {
    inner: Arc<SessionInner>,
    key: String,
    request_id: u64,
    /// The grant's token, once the server's answer carried one.
    token: Option<u64>,
    armed: bool,
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = Arc::clone(&self.inner);
        let key = std::mem::take(&mut self.key);
        let (request_id, token) = (self.request_id, self.token);
        self.inner.runtime.spawn(async move {
            inner.cancel_acquire(key, request_id, token).await;
        });
    }
}
