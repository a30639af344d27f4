//! The rules of each client request on the Raft backend: the [`Backend`] implementation.
//!
//! Each operation validates its arguments (`lock_api::validate`) before anything is proposed,
//! then checks leadership, then either proposes a command and turns the state machine's answer
//! into the caller's (`rejection`), or changes a leader-local lease and confirms leadership
//! with a quorum round (renewals and heartbeats, D-lease). A waiting acquire waits for its
//! hand-off in the waiter registry (D-wait) under a cancel-on-drop guard (`cancel`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lock_api::{LockError, validate};
use lock_raft_store::{Command, Rejection, Response};
use tokio::sync::watch;

use super::cancel::{CancelOnDrop, cancel_wait};
use super::rejection::{rejected, unexpected};
use super::{RaftBackend, as_caller, grant};
use crate::backend::{AuditRecord, Backend, Grant, KeyState, NodeStatus, Revocation};
use crate::leader::leases::RenewCheck;
use crate::leader::waiters::WaitOutcome;

// The replicated audit log keeps as many revokes as every other backend (lock_api's bound):
// `ListRevocations` answers alike on all of them.
const _: () = assert!(lock_raft_store::limits::AUDIT_LOG_MAX == lock_api::limits::AUDIT_LOG_MAX);

/// The `Acquire` command of `caller`'s request, waiting up to `wait_ms` (0: a single try).
fn acquire_command(
    caller: Option<&str>,
    session_id: &str,
    request_id: u64,
    key: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> Command {
    as_caller(
        caller,
        Command::Acquire {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            ttl_ms,
            wait_ms,
        },
    )
}

fn ttl_ms(ttl_ms: u64) -> Result<u64, LockError> {
    validate::ttl(Duration::from_millis(ttl_ms))
}

impl RaftBackend {
    /// The keeper's renewal of `(key, token)`; one it refuses while the promote's reconcile
    /// walk runs is tried again once the state's grant is adopted (the walk may not have
    /// reached it yet: a snapshot install or a restart brings grants without events).
    fn renew_lease(&self, key: &str, token: u64, ttl: u64) -> RenewCheck {
        let keeper = &self.inner.keeper;
        match keeper.renew_grant(key, token, ttl) {
            RenewCheck::Lost if keeper.adopt_grant(&self.inner.reader, key, token) => {
                keeper.renew_grant(key, token, ttl)
            }
            check => check,
        }
    }

    /// [`RaftBackend::renew_lease`] for a session's heartbeat by `caller`, whose principal the
    /// keeper checks against the session's in the same lookup
    /// ([`LeaseKeeper::heartbeat_session`](crate::leader::LeaseKeeper::heartbeat_session)).
    fn heartbeat_lease(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<Option<u64>, LockError> {
        let answer = self.inner.keeper.heartbeat_session(caller, session_id);
        self.or_adopted(caller, session_id, answer)
    }

    /// The keeper's `answer` to a heartbeat of `session_id`, or, when it found no live lease
    /// while the promote's reconcile walk runs (the state may hold a session the keeper has
    /// not met yet), its answer once more after adopting the session from the state.
    fn or_adopted(
        &self,
        caller: Option<&str>,
        session_id: &str,
        answer: Result<Option<u64>, LockError>,
    ) -> Result<Option<u64>, LockError> {
        let keeper = &self.inner.keeper;
        match answer {
            Ok(None) if keeper.adopt_session(&self.inner.reader, session_id) => {
                keeper.heartbeat_session(caller, session_id)
            }
            answer => answer,
        }
    }

    /// Whether the applied state has `key` granted to a session other than `session_id`: an
    /// acquire of it by that session will queue (unless an entry in flight frees it first).
    fn held_by_another(&self, key: &str, session_id: &str) -> bool {
        self.inner.reader.read(|table| {
            table
                .grant(key)
                .is_some_and(|g| g.session_id() != session_id)
        })
    }

    /// The owner and session ids of grant `(key, token)` in the applied state, if it is still
    /// the grant.
    fn holder_of(&self, key: &str, token: u64) -> Option<(String, String)> {
        self.inner.reader.read(|table| {
            table
                .grant(key)
                .filter(|g| g.token == token)
                .map(|g| (g.owner_id().to_owned(), g.session_id().to_owned()))
        })
    }
}

impl Backend for RaftBackend {
    /// Opens a session for `owner_id` with a lease of `ttl_ms`; returns its id and TTL.
    async fn open_session(
        &self,
        caller: Option<&str>,
        owner_id: &str,
        ttl_ms_requested: u64,
    ) -> Result<(String, u64), LockError> {
        validate::owner_id(owner_id)?;
        if let Some(principal) = caller {
            validate::principal(principal)?;
        }
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leader_check()?;
        // 32 hex characters: within SESSION_ID_LEN_MAX, unguessable, picked here so every
        // replica records the same id.
        let session_id = uuid::Uuid::new_v4().simple().to_string();
        match self
            .propose(as_caller(
                caller,
                Command::OpenSession {
                    session_id,
                    owner_id: owner_id.to_owned(),
                    ttl_ms: ttl,
                },
            ))
            .await?
        {
            Response::SessionOpened { session_id, ttl_ms } => Ok((session_id, ttl_ms)),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("OpenSession", &other)),
        }
    }

    /// Restarts a session's lease (leader-local, leadership-confirmed). `Ok(None)` is terminal:
    /// the session is gone, lapsed or being expired.
    async fn keep_alive(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<Option<u64>, LockError> {
        validate::session_id(session_id)?;
        self.leases_ready()?;
        let ttl = self.heartbeat_lease(caller, session_id)?;
        // Both answers need the proof that this node still leads: a restarted lease because a
        // deposed leader cannot hand out a deadline its successor will not honour, and "gone"
        // because a deposed leader that has not yet heard of its successor still passes
        // `leases_ready` while its keeper lacks every session opened since (see
        // [`RaftBackend::confirm_leadership`]).
        self.confirm_leadership().await?;
        Ok(ttl)
    }

    /// [`Backend::keep_alive`] for many sessions at once (`SessionService.HeartbeatBatch`):
    /// one leader check, every lease restarted under one lock of the lease table, and ONE
    /// leadership-confirmation round for the whole batch instead of one per session. Each
    /// session's answer is what `keep_alive` gives it: `Ok(Some(ttl))` alive, `Ok(None)`
    /// terminal, `Err(InvalidArgument)` for a malformed id. The whole call fails as
    /// `keep_alive` does: `NotLeader`, or `Contention` while leases restart or when the round
    /// fails. The caller bounds the batch (the gRPC layer refuses one over
    /// `lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`), which bounds how long the lease
    /// table stays locked.
    async fn keep_alive_batch(
        &self,
        caller: Option<&str>,
        session_ids: &[String],
    ) -> Result<Vec<Result<Option<u64>, LockError>>, LockError> {
        self.leases_ready()?;
        // A malformed id and another principal's session are that entry's own refusal, and its
        // lease is left alone; the keeper checks each session's principal in the lookup that
        // restarts its lease.
        let beats = self.inner.keeper.heartbeat_sessions(
            caller,
            session_ids
                .iter()
                .map(|id| validate::session_id(id).map(|()| id.as_str())),
        );
        let answers: Vec<Result<Option<u64>, LockError>> = beats
            .into_iter()
            .zip(session_ids)
            .map(|(beat, id)| self.or_adopted(caller, id, beat))
            .collect();
        // As in `keep_alive`: the extensions above happened before the round, and every answer
        // (alive or gone) needs the proof that this node still leads; only a batch refused
        // entry by entry (malformed ids, other principals' sessions) needs none.
        if answers.iter().any(Result::is_ok) {
            self.confirm_leadership().await?;
        }
        Ok(answers)
    }

    /// Closes a session, releasing its grants; returns how many (0 if it was already gone).
    async fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<u32, LockError> {
        validate::session_id(session_id)?;
        self.leader_check()?;
        match self
            .propose(as_caller(
                caller,
                Command::CloseSession {
                    session_id: session_id.to_owned(),
                },
            ))
            .await?
        {
            Response::SessionClosed { locks_released } => Ok(locks_released),
            Response::Rejected(Rejection::UnknownSession { .. }) => Ok(0),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("CloseSession", &other)),
        }
    }

    /// The keys a session holds, read on the leader (empty for a session that is gone).
    async fn locks_of(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        self.leader_check()?;
        self.check_session_owner(caller, session_id)?;
        Ok(self.inner.reader.read(|table| table.locks_of(session_id)))
    }

    /// Single-shot acquire: `Ok(None)` if the key is held.
    async fn try_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms_requested: u64,
    ) -> Result<Option<Grant>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leader_check()?;
        match self
            .propose(acquire_command(caller, session_id, request_id, key, ttl, 0))
            .await?
        {
            Response::Granted(g) => Ok(Some(grant(g))),
            Response::NotGranted => Ok(None),
            Response::Rejected(r) => Err(rejected(r)),
            // The first attempt of this request (same session and request id) was a blocking
            // acquire that queued; this retry has no wait left (the SDK sends what remains of
            // `max_wait`). Its wait is over: withdraw the waiter, keeping a grant that raced.
            Response::Queued { .. } => {
                self.withdraw_wait(caller, session_id, request_id, key)
                    .await
            }
            other => Err(unexpected("Acquire", &other)),
        }
    }

    /// Acquires `key`, waiting server-side up to `max_wait_ms` (D-wait): `Ok(Some)` once
    /// granted, `Ok(None)` if `max_wait_ms` elapsed while the key was held. If the returned
    /// future is dropped while waiting (the client went away), the wait is cancelled and a
    /// grant that raced the cancellation is released.
    async fn acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms_requested: u64,
        max_wait_ms: u64,
    ) -> Result<Option<Grant>, LockError> {
        let max_wait_ms = validate::max_wait(Duration::from_millis(max_wait_ms))?;
        if max_wait_ms == 0 {
            return self
                .try_acquire(caller, session_id, request_id, key, ttl_ms_requested)
                .await;
        }
        validate::session_id(session_id)?;
        validate::key(key)?;
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leader_check()?;
        if caller.is_some() {
            // Registering below takes over the slot of a waiting acquire with the same session
            // and request id (a retry), so another principal must be refused before it, not
            // only at apply. Once the promote has applied, the applied state holds every
            // session whose id a client can know, and so its principal.
            self.leases_ready()?;
            self.check_session_owner(caller, session_id)?;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(max_wait_ms);
        // Registered before proposing, so a hand-off applied before our answer is not missed.
        let mut slot = self.inner.waiters.register(session_id, request_id);
        let mut guard = CancelOnDrop {
            caller: caller.map(str::to_owned),
            backend: self.clone(),
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            armed: true,
        };
        let command = acquire_command(caller, session_id, request_id, key, ttl, max_wait_ms);
        // Behind another session's grant, this acquire queues: its caller is answered by the
        // hand-off, so its entry may wait for the holder's release and share its commit.
        let answer = if self.held_by_another(key, session_id) {
            self.propose_deferrable(command).await
        } else {
            self.propose(command).await
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(err) => {
                // Unknown outcome: a retry with the same request id finds the waiter (or its
                // grant) again, so leave it in place for that retry.
                guard.armed = false;
                return Err(err);
            }
        };
        match answer {
            Response::Granted(g) => {
                guard.armed = false;
                Ok(Some(grant(g)))
            }
            Response::NotGranted => {
                guard.armed = false;
                Ok(None)
            }
            Response::Rejected(r) => {
                guard.armed = false;
                Err(rejected(r))
            }
            Response::Queued { .. } => {
                let waited = tokio::select! {
                    waited = tokio::time::timeout_at(deadline, slot.outcome()) => waited,
                    _ = self.stopping() => {
                        // The waiter stays queued in the replicated state: the client's retry
                        // (same request id) at the next leader finds it again.
                        guard.armed = false;
                        return Err(LockError::contention(
                            "this node is shutting down; retry the acquire with the same request id",
                        ));
                    }
                };
                match waited {
                    Ok(Some(WaitOutcome::Granted(g))) => {
                        guard.armed = false;
                        Ok(Some(grant(g)))
                    }
                    Ok(Some(WaitOutcome::Dropped)) => {
                        guard.armed = false;
                        Ok(None)
                    }
                    // max_wait elapsed (or a retry took over the slot): withdraw the waiter. A
                    // grant that raced the withdrawal is the caller's, so keep it.
                    Ok(None) | Err(_) => {
                        let withdrawn = self
                            .withdraw_wait(caller, session_id, request_id, key)
                            .await;
                        guard.armed = false;
                        withdrawn
                    }
                }
            }
            other => {
                guard.armed = false;
                Err(unexpected("Acquire", &other))
            }
        }
    }

    /// Withdraws a waiting acquire; a grant it already received is released. Returns whether a
    /// grant was released.
    async fn cancel_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        self.leader_check()?;
        match self
            .propose(cancel_wait(caller, session_id, request_id, key, true))
            .await?
        {
            Response::WaitCancelled { released, .. } => Ok(released),
            Response::Rejected(Rejection::UnknownSession { .. }) => Ok(false),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("CancelWait", &other)),
        }
    }

    /// Renews grant `(key, token)` for `ttl_ms` from now. `Ok(None)` means LOST NOW (terminal).
    ///
    /// Leader-local (D-lease): the lease keeper extends the live deadline, then a quorum round
    /// confirms leadership; nothing is written to the log, unless the lease length changes —
    /// then the new length is written (`Command::Renew`), so a later leader's promote restarts
    /// the lease with it.
    async fn renew(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
        ttl_ms_requested: u64,
    ) -> Result<Option<Grant>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leases_ready()?;
        // Before the lease is touched: a refused renewal must not extend anyone's lease.
        self.check_session_owner(caller, session_id)?;
        self.check_grant_owner(caller, key, token)?;
        let previous_ttl_ms = match self.renew_lease(key, token, ttl) {
            RenewCheck::Lost => {
                // "Lost" is terminal for the client, so only a node that still leads may say
                // it: a deposed leader that has not yet heard of its successor passes
                // `leases_ready`, and its keeper lacks every grant made since (seen in the
                // combined fault run: a renewal answered lost 0.3 s before its deadline).
                self.confirm_leadership().await?;
                return Ok(None);
            }
            RenewCheck::Extended {
                previous_ttl_ms, ..
            } => previous_ttl_ms,
        };
        let wall_now = self.inner.clock.wall_ms();
        self.confirm_leadership().await?;
        if previous_ttl_ms != ttl {
            // The holder's session as the state names it (the lease keeps no ids); a grant
            // gone meanwhile is answered `Lost` by the state machine, as before.
            let holder = self
                .holder_of(key, token)
                .map_or_else(|| session_id.to_owned(), |(_, session)| session);
            match self
                .propose(as_caller(
                    caller,
                    Command::Renew {
                        session_id: holder,
                        request_id,
                        key: key.to_owned(),
                        token,
                        ttl_ms: ttl,
                    },
                ))
                .await?
            {
                Response::Renewed(_) => {}
                Response::Lost => return Ok(None),
                Response::Rejected(Rejection::UnknownSession { .. }) => return Ok(None),
                Response::Rejected(r) => return Err(rejected(r)),
                other => return Err(unexpected("Renew", &other)),
            }
        }
        let Some((owner_id, session_id)) = self.holder_of(key, token) else {
            // Freed between the check and now (released, revoked, session ended).
            return Ok(None);
        };
        Ok(Some(Grant {
            key: key.to_owned(),
            owner_id,
            session_id,
            token,
            ttl_ms: ttl,
            expires_at_ms: wall_now + ttl,
        }))
    }

    /// Compare-and-delete of grant `(key, token)`. `Ok(false)` if it was already gone.
    async fn release(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        self.leader_check()?;
        match self
            .propose(as_caller(
                caller,
                Command::Release {
                    session_id: session_id.to_owned(),
                    request_id,
                    key: key.to_owned(),
                    token,
                },
            ))
            .await?
        {
            Response::Released { released } => Ok(released),
            // The session is gone, and its grants with it: informational, like C2's `false`.
            Response::Rejected(Rejection::UnknownSession { .. }) => Ok(false),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("Release", &other)),
        }
    }

    /// The current grant of `key`, read from this node's applied state (advisory, C2 `read`).
    /// With `leader_confirmed`, only a leader whose promote has applied answers, after a quorum
    /// round; before that it answers `Contention` (retry-safe).
    ///
    /// Why the promote and not only the round: the round (openraft `ensure_linearizable`) waits
    /// for the state machine to reach the leader's commit index, and a node restarted with its
    /// own committed vote resumes leading in the same term with the commit index it last
    /// stored, which may be behind entries it acknowledged (the committed id need not be
    /// durable). Its Promote entry commits after every entry in its log, so once it has applied
    /// the state machine holds every acknowledged grant. Without this a full restart let a
    /// confirmed inspect miss a grant (`t22_log_engines`, about half the runs).
    async fn inspect(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> Result<Option<KeyState>, LockError> {
        validate::key(key)?;
        if leader_confirmed {
            self.leases_ready()?;
            self.confirm_leadership().await?;
        }
        // A node installing a snapshot has let go of its applied state until the installed
        // one is in place: it sends the caller to the leader.
        let state = self
            .inner
            .reader
            .read_applied(|table| {
                table.grant(key).map(|g| KeyState {
                    key: g.key().to_owned(),
                    owner_id: g.owner_id().to_owned(),
                    session_id: g.session_id().to_owned(),
                    token: g.token,
                    acquired_at_ms: g.acquired_at_ms,
                    expires_at_ms: g.expires_at_ms,
                    waiter_count: table.waiter_count(key),
                })
            })
            .ok_or_else(|| self.not_leader())?;
        Ok(state.map(|mut state| {
            // On the promoted leader the live lease is the better expiry than the last one
            // logged (renewals are not logged).
            if self.leases_ready().is_ok()
                && let Some(lease) = self.inner.keeper.grant_lease(key)
                && lease.token == state.token
            {
                let left = lease
                    .deadline
                    .saturating_duration_since(self.inner.clock.now());
                state.expires_at_ms = self.inner.clock.wall_ms() + left.as_millis() as u64;
            }
            state
        }))
    }

    /// Break-glass revoke of `key`'s grant, advancing the token floor (FR-08, INV-04).
    ///
    /// `request_id` (non-zero) makes a retry answer the first outcome instead of revoking
    /// again — a second revoke would displace the *next* holder. The replicated state decides
    /// (the audit log remembers each revoke's id), so a retry is recognised at any leader,
    /// after a failover too, and two concurrent copies of one request revoke once.
    /// `request_id == 0` is never deduplicated.
    async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<Revocation, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        self.leader_check()?;
        let revocation = match self
            .propose(Command::ForceRevoke {
                key: key.to_owned(),
                operator: operator.to_owned(),
                reason: reason.to_owned(),
                request_id,
            })
            .await?
        {
            Response::Revoked(revocation) => revocation,
            Response::Rejected(r) => return Err(rejected(r)),
            other => return Err(unexpected("ForceRevoke", &other)),
        };
        Ok(Revocation {
            key: revocation.key,
            previous_owner_id: revocation.previous_owner_id,
            previous_token: revocation.previous_token,
            new_token_floor: revocation.new_token_floor,
        })
    }

    /// Reads the replicated audit log on the leader once leadership is confirmed and the
    /// promote applied (as a confirmed `inspect`, and for the same reason: a restarted leader's
    /// state machine may lag entries it acknowledged until its promote applies).
    async fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, LockError> {
        if let Some(key) = key {
            validate::key(key)?;
        }
        self.leases_ready()?;
        self.confirm_leadership().await?;
        Ok(self.inner.reader.read(|table| {
            // The log is in apply order, which is floor order (the table's invariants check
            // that floors only grow), so newest first is its reverse. At most
            // AUDIT_LOG_MAX references are collected to walk it backwards.
            let log: Vec<_> = table.revocations().collect();
            log.into_iter()
                .rev()
                .filter(|r| before_floor.is_none_or(|before| r.new_token_floor < before))
                .filter(|r| key.is_none_or(|key| r.key == key))
                .take(limit)
                .map(|r| AuditRecord {
                    key: r.key.clone(),
                    operator: r.operator.clone(),
                    reason: r.reason.clone(),
                    previous_owner_id: r.previous_owner_id.clone(),
                    previous_token: r.previous_token,
                    new_token_floor: r.new_token_floor,
                    revoked_at_ms: r.at_ms,
                    request_id: r.request_id,
                })
                .collect()
        }))
    }

    fn status(&self) -> NodeStatus {
        self.node_status()
    }

    async fn init(&self, members: BTreeMap<u64, String>) -> Result<(), LockError> {
        self.initialize(members).await
    }

    async fn add_learner(&self, node_id: u64, addr: String) -> Result<(), LockError> {
        self.learner(node_id, addr).await
    }

    async fn change_membership(
        &self,
        voters: BTreeSet<u64>,
        retain: bool,
    ) -> Result<(), LockError> {
        self.membership(voters, retain).await
    }

    fn serving(&self) -> watch::Receiver<bool> {
        self.inner.serving.clone()
    }

    fn stop_signal(&self) -> watch::Receiver<bool> {
        self.inner.stop.clone()
    }
}
