//! C2's SPI (`lock_api::LockStore` + `lock_api::SessionRegistry`) over the Raft backend.
//!
//! A node serves its clients through [`Backend`]; this adapter exists so that the SPI
//! conformance suite (tests/tests/t60_conformance_raft.rs, through `server::run_with_store`)
//! drives the very same requests. The SPI's calls carry no request id: each gets a fresh one
//! from a per-process counter. Owns that adaptation and the grant → `LockHandle` view only.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_api::{
    LockError, LockHandle, LockInfo, LockOutcome, LockStore, SessionRegistry, validate,
};

use super::RaftBackend;
use crate::backend::{Backend, Grant};
use crate::leader::leases::{REAP_PER_TICK_MAX, reap_once};

fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl RaftBackend {
    /// A fresh request id for calls that carry none.
    pub fn next_request_id(&self) -> u64 {
        self.inner.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    fn handle_of(&self, grant: Grant, started: std::time::Instant) -> LockHandle {
        let ttl = Duration::from_millis(grant.ttl_ms);
        LockHandle {
            key: grant.key,
            owner_id: grant.owner_id,
            session_id: grant.session_id,
            fencing_token: grant.token,
            ttl,
            client_deadline: started + ttl,
            server_expiry: system_time(grant.expires_at_ms),
        }
    }
}

impl LockStore for RaftBackend {
    /// `owner_id` must be valid but is not compared: the grant carries its session's owner.
    async fn try_insert(
        &self,
        key: &str,
        owner_id: &str,
        session_id: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::owner_id(owner_id)?;
        let started = std::time::Instant::now();
        let ttl_ms = validate::ttl(ttl)?;
        let grant = self
            .try_acquire(None, session_id, self.next_request_id(), key, ttl_ms)
            .await?;
        Ok(grant.map(|g| self.handle_of(g, started)))
    }

    async fn extend(
        &self,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        let started = std::time::Instant::now();
        let ttl_ms = validate::ttl(ttl)?;
        self.leases_ready()?;
        // The key's holder as the state names it; `renew` judges the token.
        let holder = self
            .inner
            .reader
            .read(|table| table.grant(key).map(|g| g.session_id().to_owned()));
        let Some(holder) = holder else {
            validate::key(key)?;
            // A negative verdict from local state only where this node still leads (as in
            // `Backend::renew`).
            self.confirm_leadership().await?;
            return Ok(None);
        };
        let grant = self
            .renew(
                None,
                &holder,
                self.next_request_id(),
                key,
                fencing_token,
                ttl_ms,
            )
            .await?;
        Ok(grant.map(|g| self.handle_of(g, started)))
    }

    async fn delete_if_owner(&self, key: &str, fencing_token: u64) -> Result<bool, LockError> {
        validate::key(key)?;
        validate::fencing_token(fencing_token)?;
        self.leader_check()?;
        // The key's holder as the state names it; `renew` judges the token.
        let holder = self
            .inner
            .reader
            .read(|table| table.grant(key).map(|g| g.session_id().to_owned()));
        let Some(session_id) = holder else {
            self.confirm_leadership().await?;
            return Ok(false);
        };
        self.release(
            None,
            &session_id,
            self.next_request_id(),
            key,
            fencing_token,
        )
        .await
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        Ok(self.inspect(key, false).await?.map(|state| LockInfo {
            key: state.key,
            owner_id: state.owner_id,
            session_id: state.session_id,
            fencing_token: state.token,
            acquired_at: system_time(state.acquired_at_ms),
            expires_at: system_time(state.expires_at_ms),
            waiter_count: state.waiter_count,
        }))
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        let r = self
            .force_revoke(key, operator, reason, self.next_request_id())
            .await?;
        Ok(LockOutcome {
            key: r.key,
            revoked: r.previous_token.is_some(),
            previous_owner_id: r.previous_owner_id,
            previous_token: r.previous_token,
            new_token_floor: r.new_token_floor,
        })
    }

    /// Runs one reaper pass now on the leader. `now` is not used: expiry follows the leader's
    /// monotonic lease deadlines (D-lease), never a caller's wall clock.
    async fn reap_expired(&self, _now: SystemTime) -> Result<usize, LockError> {
        self.leases_ready()?;
        Ok(reap_once(&self.inner.proposer, &self.inner.keeper, REAP_PER_TICK_MAX).await)
    }

    fn backend_id(&self) -> &'static str {
        "raft"
    }
}

impl SessionRegistry for RaftBackend {
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        let ttl_ms = validate::ttl(ttl)?;
        Ok(Backend::open_session(self, None, owner_id, ttl_ms).await?.0)
    }

    /// The session's TTL was fixed when it was opened; `ttl` must be valid but does not change
    /// it (the wire protocol's heartbeat carries none).
    async fn heartbeat(&self, session_id: &str, ttl: Duration) -> Result<bool, LockError> {
        validate::ttl(ttl)?;
        Ok(self.keep_alive(None, session_id).await?.is_some())
    }

    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        Ok(Backend::close_session(self, None, session_id).await? as usize)
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        Backend::locks_of(self, None, session_id).await
    }
}
